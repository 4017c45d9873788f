"""CPU benchmark: bladepack against PyTorch eager, torch.compile(dynamic=True), AOTInductor, ONNX Runtime and
OpenVINO.

In: the samples (samples/registry.py) at a spread of shapes. Out: a markdown table of median latencies
and speedups (printed), bench/results/cpu_samples.json and bench/results/cpu_samples.png. Every
runner measures in this one process, interleaved per shape: three rounds with the peers' order rotated,
each a block of at least `--repeat` calls and 0.1 s after a 50 ms pause (the previous runtime's spinning
threads go to sleep); a peer's figure is its best block median (Note [Rounds]).

    python -m bench.cpu_samples [--samples encoder,llama,cnn,mlp] [--repeat 20]
                                [--peers eager,compile,aoti,ort,openvino]

ONNX Runtime and OpenVINO run the same .onnx file (torch's TorchScript exporter, every dim dynamic);
OpenVINO with its CPU plugin, the latency hint and float32 inference precision, both with the threads
torch uses. Note [Peer precision]: on a CPU with AVX512_BF16 or AMX, OpenVINO's default inference
precision is bfloat16 (errors ~1e-2 where every other runner is within ~1e-5 of eager); every runner
here is asked for float32, and each sample's table records every runner's largest error against eager so
a runner that computes in a lower precision shows.

A peer that cannot build a sample (an exporter or compiler failure) is reported with its error, not
silently dropped.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from bench.machine import describe, title
from samples.registry import SAMPLES

RESULTS = Path(__file__).resolve().parent / "results"
Runner = Callable[[tuple[torch.Tensor, ...]], Any]
ROUNDS = 3


BLOCK_SECONDS = 0.1  # Note [Rounds]: a block runs at least `repeat` calls and at least this long


def _median_us(fn: Callable[[], Any], repeat: int) -> float:
    time.sleep(0.05)  # let the previous runner's spinning worker threads go to sleep
    for _ in range(3):
        fn()
    ts: list[float] = []
    start = time.perf_counter()
    while len(ts) < repeat or time.perf_counter() - start < BLOCK_SECONDS:
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def measure(runners: dict[str, Runner], x: Any, repeat: int, errors: dict[str, str], where: str) -> dict[str, Any]:
    """Each runner's latency (µs) on `x`, None for one that failed (its error goes into `errors`).

    Note [Rounds]: ROUNDS rounds, the runners' order rotated each round; a runner's figure is its best
    block median, so a burst of machine noise costs a round, not the comparison. A block is at least
    `repeat` calls and at least BLOCK_SECONDS of them, the same rule for every runner: a 20 µs call gets
    a median of thousands of calls, not of 20 (which a few milliseconds of noise could move), while a
    20 ms call still runs its `repeat`."""
    row: dict[str, Any] = {}
    order = list(runners)
    for rnd in range(ROUNDS):
        for peer in order[rnd % len(order) :] + order[: rnd % len(order)]:
            if peer in row and row[peer] is None:
                continue
            try:
                t = _median_us(lambda fn=runners[peer]: fn(x), repeat)
                row[peer] = min(t, row.get(peer) or t)
            except Exception as e:
                row[peer] = None
                errors.setdefault(peer, f"{where}: {type(e).__name__}: {str(e)[:200]}")
    return row


def flat_outputs(y: Any) -> list[np.ndarray]:
    """A runner's result as a list of float64 arrays: a tensor, an array, a sequence of them, or a
    mapping of them (ONNX Runtime returns a list, OpenVINO a mapping, bladepack and torch tensors)."""
    if isinstance(y, torch.Tensor):
        return [y.detach().to(torch.float64).numpy()]
    if isinstance(y, np.ndarray):
        return [y.astype(np.float64)]
    if hasattr(y, "values") and callable(y.values):
        return [a for v in y.values() for a in flat_outputs(v)]
    if isinstance(y, (list, tuple)):
        return [a for v in y for a in flat_outputs(v)]
    return [np.asarray(y, dtype=np.float64)]


def max_errors(
    runners: dict[str, Runner], x: Any, errors: dict[str, str], reference: Runner | None = None
) -> dict[str, float]:
    """Each runner's largest |output - eager| / (1 + max |eager|) on `x` (Note [Peer precision]); the
    reference is eager float32 (`reference`, else the "eager" runner)."""
    ref_fn = reference or runners.get("eager")
    ref = flat_outputs(ref_fn(x)) if ref_fn is not None else None
    out: dict[str, float] = {}
    if ref is None:
        return out
    for peer, fn in runners.items():
        if peer == "eager" or peer in errors:
            continue
        try:
            got = flat_outputs(fn(x))
        except Exception:
            continue  # measure() reports the failure
        if len(got) != len(ref) or any(g.shape != r.shape for g, r in zip(got, ref)):
            errors.setdefault(peer, f"{len(got)} outputs of other shapes than eager's")
            continue
        out[peer] = max(float(np.abs(g - r).max() / (1 + np.abs(r).max())) for g, r in zip(got, ref))
    return out


def build_peers(
    name: str, peers: list[str], model: torch.nn.Module, samples: list[tuple[torch.Tensor, ...]]
) -> tuple[dict[str, Runner], dict[str, str], str]:
    """The runners (bladepack first), the peers' build errors, and what runs bladepack's kernels."""
    runners: dict[str, Runner] = {}
    errors: dict[str, str] = {}
    sample = SAMPLES[name]
    art = bladepack.optimize(model, samples, sample.dynamic_shapes)
    loaded = bladepack.load(art.to_bytes())
    runners["bladepack"] = lambda x: loaded(*x)
    torch_peers(peers, model, samples, runners, errors)
    if "aoti" in peers:
        try:
            ep = torch.export.export(model, samples[-1], dynamic_shapes=_aoti_dims(sample, samples[-1]))
            pkg = Path(tempfile.mkdtemp()) / f"{name}.pt2"
            torch._inductor.aoti_compile_and_package(ep, package_path=str(pkg))
            aoti = torch._inductor.aoti_load_package(str(pkg))
            runners["aoti"] = lambda x: aoti(*x)
        except Exception as e:
            errors["aoti"] = f"{type(e).__name__}: {e}"[:300]
    if "ort" in peers or "openvino" in peers:
        path = Path(tempfile.mkdtemp()) / f"{name}.onnx"
        try:
            names = [f"in{k}" for k in range(len(samples[-1]))]
            axes = {n: {d: f"{n}_d{d}" for d in range(t.dim())} for n, t in zip(names, samples[-1])}
            torch.onnx.export(model, samples[-1], str(path), input_names=names, dynamic_axes=axes, dynamo=False)
        except Exception as e:
            errors["onnx export"] = f"{type(e).__name__}: {e}"[:300]
        else:
            onnx_peers(peers, path, runners, errors)
    return runners, errors, loaded.executor


def onnx_peers(peers: list[str], path: Path, runners: dict[str, Runner], errors: dict[str, str]) -> None:
    """ONNX Runtime ("ort") and OpenVINO ("openvino", CPU plugin, latency hint) on one .onnx file, each
    with torch's thread count, where `peers` asks for them; a failure goes into `errors`."""
    threads = torch.get_num_threads()
    if "ort" in peers:
        try:
            import onnxruntime as ort

            so = ort.SessionOptions()
            so.intra_op_num_threads = threads
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            ort_names = [i.name for i in sess.get_inputs()]
            runners["onnxruntime"] = lambda x: sess.run(None, {n: t.numpy() for n, t in zip(ort_names, x)})
        except Exception as e:
            errors["onnxruntime"] = f"{type(e).__name__}: {e}"[:300]
    if "openvino" in peers:
        try:
            import openvino as ov

            config = {
                "PERFORMANCE_HINT": "LATENCY",
                "INFERENCE_NUM_THREADS": threads,
                "INFERENCE_PRECISION_HINT": "f32",
            }
            request = ov.Core().compile_model(str(path), "CPU", config).create_infer_request()
            runners["openvino"] = lambda x: request.infer([np.ascontiguousarray(t.numpy()) for t in x])
        except Exception as e:
            errors["openvino"] = f"{type(e).__name__}: {e}"[:300]


def torch_peers(
    peers: list[str],
    model: torch.nn.Module,
    samples: list[tuple[torch.Tensor, ...]],
    runners: dict[str, Runner],
    errors: dict[str, str],
) -> None:
    """Eager and torch.compile(dynamic=True) (warmed on the samples), where `peers` asks for them."""
    if "eager" in peers:
        runners["eager"] = lambda x: model(*x)
    if "compile" in peers:
        try:
            compiled = torch.compile(model, dynamic=True)
            for s in samples:
                compiled(*s)
            runners["torch.compile"] = lambda x: compiled(*x)
        except Exception as e:
            errors["torch.compile"] = f"{type(e).__name__}: {e}"[:300]


def _aoti_dims(sample: Any, args: tuple[torch.Tensor, ...]) -> Any:
    """torch.export dims for the sample's dynamic dims: `Dim.DYNAMIC`, so torch derives each dim's range
    itself (a bounded `Dim` fails export on these samples with guard errors). Shapes outside the range
    torch derived (e.g. width 1 for the CNN) are then reported as AOTInductor failures at those shapes."""
    from torch.export import Dim

    spec = sample.dynamic_shapes
    if spec is None:
        return None

    def conv(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: conv(d) for k, d in v.items()}
        if isinstance(v, (list, tuple)):
            return type(v)(conv(d) for d in v)
        if isinstance(v, bladepack.Dim):
            return Dim.DYNAMIC
        return v

    del args
    return conv(spec)


def run(names: list[str], peers: list[str], repeat: int) -> dict[str, Any]:
    torch.manual_seed(0)
    report: dict[str, Any] = {
        "machine": describe(threads=torch.get_num_threads()),
        "torch": torch.__version__,
        "samples": {},
    }
    for name in names:
        s = SAMPLES[name]
        model = s.build()
        samples = s.export_samples()
        with torch.no_grad():
            runners, errors, report["machine"]["bladepack"] = build_peers(name, peers, model, samples)
            g = torch.Generator().manual_seed(1)
            rows = []
            for dims in s.test_cases():
                x = s.make_inputs(g, **dims)
                err = max_errors(runners, x, errors)
                rows.append({"dims": dims, **measure(runners, x, repeat, errors, f"at {dims}"), "max_error": err})
        report["samples"][name] = {"rows": rows, "errors": errors, "peers": list(runners)}
    return report


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def markdown(report: dict[str, Any]) -> str:
    out = [f"Machine: {title(report['machine'])}; torch {report.get('torch', '?')}."]
    for name, data in report["samples"].items():
        peers = [p for p in data["peers"] if p != "bladepack"]
        out.append(f"\n### {name}\n")
        out.append("| dims | bladepack µs | " + " | ".join(f"{p} µs (x)" for p in peers) + " |")
        out.append("|---|---|" + "---|" * len(peers))
        for r in data["rows"]:
            b = r["bladepack"]
            cells = []
            for p in peers:
                v = r.get(p)
                cells.append("n/a" if v is None else f"{v:.0f} ({v / b:.2f}x)")
            out.append(f"| {r['dims']} | {b:.0f} | " + " | ".join(cells) + " |")
        gm = {p: geomean([r[p] / r["bladepack"] for r in data["rows"] if r.get(p)]) for p in peers}
        best = [
            min(r[p] for p in peers if r.get(p)) / r["bladepack"] for r in data["rows"] if any(r.get(p) for p in peers)
        ]
        out.append("")
        out.append(
            "geomean speedup: "
            + ", ".join(f"vs {p} {v:.2f}x" for p, v in gm.items())
            + f"; vs best peer per shape {geomean(best):.2f}x"
        )
        worst = {p: max((r.get("max_error", {}).get(p, 0.0) for r in data["rows"]), default=0.0) for p in data["peers"]}
        out.append(
            "\nlargest error vs eager, |y - eager| / (1 + max |eager|): "
            + ", ".join(f"{p} {v:.1e}" for p, v in worst.items() if p != "eager")
        )
        data["geomean"] = gm
        data["geomean_vs_best"] = geomean(best)
        data["max_error"] = worst
        for p, e in data["errors"].items():
            out.append(f"\n{p} unavailable: {e}")
    return "\n".join(out) + "\n"


def chart(report: dict[str, Any], path: Path) -> None:
    try:  # the chart is optional: matplotlib is not among the dev dependencies
        import matplotlib
    except ImportError:
        print("no chart: matplotlib is not installed")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["samples"])
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 4), squeeze=False)
    for ax, name in zip(axes[0], names):
        data = report["samples"][name]
        labels = [",".join(str(v) for v in r["dims"].values()) for r in data["rows"]]
        for p in data["peers"]:
            if p == "bladepack":
                continue
            ys = [(r[p] / r["bladepack"]) if r.get(p) else np.nan for r in data["rows"]]
            ax.plot(range(len(ys)), ys, marker="o", label=p)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_title(f"{name}: peer time / bladepack time")
        ax.set_xticks(range(len(labels)), labels, rotation=60, fontsize=7)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", default="encoder,llama,cnn,mlp")
    ap.add_argument("--peers", default="eager,compile,aoti,ort,openvino")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--out", default=str(RESULTS / "cpu_samples"))
    a = ap.parse_args()
    try:
        report = run(a.samples.split(","), a.peers.split(","), a.repeat)
    except Exception:
        traceback.print_exc()
        raise
    text = markdown(report)
    print(text)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    out.with_suffix(".md").write_text(text)
    chart(report, out.with_suffix(".png"))


if __name__ == "__main__":
    main()
