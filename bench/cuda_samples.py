"""GPU benchmark: bladepack's CUDA plan against eager, torch.compile(dynamic=True) and AOTInductor.

Needs a CUDA GPU (H100 / H200 here). In: the samples at a spread of shapes, float32 and float16. Out: a
markdown table of median latencies (CUDA events around each call, after warm-up), speedups, the
relative error against eager, and two bandwidth rows (a large fused elementwise kernel and a large row
reduction against a device-to-device copy of the same bytes): bench/results/cuda_samples_<device>.{md,json}.
Every runner is measured in this one process, interleaved per shape, three rounds with the order rotated;
a runner's figure is its best round (as bench/cpu_samples.py, Note [Rounds]).

    python -m bench.cuda_samples [--samples encoder,llama] [--dtypes float32,float16] [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import bladepack
from samples.registry import SAMPLES

RESULTS = Path(__file__).resolve().parent / "results"
ROUNDS = 3
Runner = Callable[[tuple[torch.Tensor, ...]], Any]


def _time_us(fn: Callable[[], Any], repeat: int, calls: int = 1) -> float:
    """Median µs per call over `repeat` timings (CUDA events) of `calls` back-to-back calls."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return statistics.median(times)


def save_results(name: str, device: str, text: str, rows: list[dict[str, Any]]) -> None:
    """bench/results/<name>_<device>.md (the report) and .json (the rows, the device, torch's version)."""
    stem = RESULTS / f"{name}_{device.replace(' ', '_')}"
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(
        json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=1)
    )


def _runners(name: str, dtype: torch.dtype, peers: list[str], errors: dict[str, str]) -> tuple[dict[str, Runner], Any]:
    s = SAMPLES[name]
    model = s.build().eval()
    samples = s.export_samples()
    runners: dict[str, Runner] = {}
    art = bladepack.optimize(
        model, samples, s.dynamic_shapes, targets=("cuda",), dtype=None if dtype == torch.float32 else str(dtype)[6:]
    )
    with tempfile.TemporaryDirectory() as d:
        art.save(Path(d) / "m.bpk")
        loaded = bladepack.load(Path(d) / "m.bpk", device="cuda")
    runners["bladepack"] = lambda x: loaded(*x)
    gpu_model = model.to("cuda", dtype)
    runners["eager"] = lambda x: gpu_model(*x)
    if "compile" in peers:
        try:
            compiled = torch.compile(gpu_model, dynamic=True)
            runners["compile"] = lambda x: compiled(*x)
        except Exception as e:  # reported, not dropped
            errors["compile"] = f"{type(e).__name__}: {e}"
    if "aoti" in peers:
        try:
            cast = [tuple(a.to("cuda", dtype) if a.is_floating_point() else a.cuda() for a in x) for x in samples]
            ep = torch.export.export(gpu_model, cast[0], dynamic_shapes=s.dynamic_shapes)
            pkg = torch._inductor.aoti_compile_and_package(ep)
            aoti = torch._inductor.aoti_load_package(pkg)
            runners["aoti"] = lambda x: aoti(*x)
        except Exception as e:
            errors["aoti"] = f"{type(e).__name__}: {str(e)[:300]}"
    return runners, model


def _rel(out: Any, ref: Any) -> float:
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    worst = 0.0
    for o, r in zip(outs, refs):
        if not r.is_floating_point():
            worst = max(worst, 0.0 if torch.equal(o, r) else math.inf)
            continue
        scale = r.double().abs().max().item() or 1.0
        worst = max(worst, (o.double() - r.double()).abs().max().item() / scale)
    return worst


def bandwidth(repeat: int) -> list[dict[str, Any]]:
    """Large fused kernels against a device-to-device copy of the bytes they move."""
    rows = []

    class Ew(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(x * 1.5 + y)

    class Norm(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.layer_norm(x, x.shape[-1:])

    n = torch.export.Dim("n", min=1, max=1 << 22)
    for label, model, args, moved in (
        ("gelu(1.5x + y), 64M float32", Ew(), (torch.randn(16384, 4096), torch.randn(16384, 4096)), 3),
        ("layer_norm rows of 4096, 64M float32", Norm(), (torch.randn(16384, 4096),), 2),
    ):
        dyn = tuple({0: n} for _ in args)
        art = bladepack.optimize(model, [tuple(a[:8] for a in args)], dyn, targets=("cuda",))
        m = bladepack.load(art.to_bytes(), device="cuda")
        xs = tuple(a.cuda() for a in args)
        nbytes = moved * xs[0].numel() * 4
        src, dst = (
            torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda"),
            torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda"),
        )
        ours = _time_us(lambda: m(*xs), repeat)
        copy = _time_us(lambda: dst.copy_(src), repeat)  # reads and writes nbytes in total
        rows.append({"kernel": label, "us": ours, "copy_us": copy, "gbps": nbytes / ours / 1e3, "of_copy": copy / ours})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", default="mlp,encoder,llama,cnn")
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--peers", default="eager,compile,aoti")
    ap.add_argument("--repeat", type=int, default=50)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench.cuda_samples needs a CUDA GPU")
        return 2
    device = torch.cuda.get_device_name()
    peers = a.peers.split(",")
    table: list[dict[str, Any]] = []
    errors: dict[str, dict[str, str]] = {}
    for name in a.samples.split(","):
        for dt_name in a.dtypes.split(","):
            dt = getattr(torch, dt_name)
            errs: dict[str, str] = {}
            try:
                runners, _ = _runners(name, dt, peers, errs)
            except Exception:
                errors[f"{name}/{dt_name}"] = {"bladepack": traceback.format_exc(limit=3)}
                continue
            errors[f"{name}/{dt_name}"] = errs
            g = torch.Generator().manual_seed(0)
            for dims in SAMPLES[name].test_cases():
                x = tuple(
                    t.to("cuda", dt) if t.is_floating_point() else t.cuda()
                    for t in SAMPLES[name].make_inputs(g, **dims)
                )
                with torch.no_grad():
                    ref = runners["eager"](x)
                    row: dict[str, Any] = {"sample": name, "dtype": dt_name, "dims": dims}
                    best: dict[str, float] = {}
                    order = list(runners)
                    for rnd in range(ROUNDS):
                        for peer in order[rnd % len(order) :] + order[: rnd % len(order)]:
                            try:
                                t = _time_us(lambda p=peer: runners[p](x), a.repeat)
                            except Exception as e:
                                errs[peer] = f"{type(e).__name__}: {str(e)[:200]}"
                                continue
                            best[peer] = min(best.get(peer, math.inf), t)
                    row.update({f"{p}_us": v for p, v in best.items()})
                    try:
                        row["rel_err"] = _rel(runners["bladepack"](x), ref)
                    except Exception as e:  # reported per shape, the other shapes still run
                        errs[f"bladepack {dims}"] = f"{type(e).__name__}: {str(e)[:200]}"
                        row["rel_err"] = math.nan
                    table.append(row)
    bw = bandwidth(a.repeat)
    geo: dict[str, float] = {}
    for peer in ("eager", "compile", "aoti"):
        ratios = [r[f"{peer}_us"] / r["bladepack_us"] for r in table if f"{peer}_us" in r and "bladepack_us" in r]
        if ratios:
            geo[peer] = math.exp(sum(map(math.log, ratios)) / len(ratios))
    tag = device.replace(" ", "_")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"cuda_samples_{tag}.json").write_text(
        json.dumps({"device": device, "rows": table, "bandwidth": bw, "geomean": geo, "errors": errors}, indent=1)
    )
    lines = [
        f"# CUDA samples on {device}",
        "",
        "| sample | dtype | dims | bladepack µs | eager | compile | aoti | rel err |",
    ]
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in table:
        cells = [
            f"{r[f'{p}_us'] / r['bladepack_us']:.2f}x" if f"{p}_us" in r and "bladepack_us" in r else "-"
            for p in ("eager", "compile", "aoti")
        ]
        lines.append(
            f"| {r['sample']} | {r['dtype']} | {r['dims']} | {r.get('bladepack_us', math.nan):.1f} | "
            + " | ".join(cells)
            + f" | {r['rel_err']:.2g} |"
        )
    lines += ["", "Speedup = peer latency / bladepack latency (higher is better). Geomean: " + str(geo), ""]
    lines += ["| kernel | µs | GB/s | fraction of copy bandwidth |", "|---|---|---|---|"]
    lines += [f"| {b['kernel']} | {b['us']:.1f} | {b['gbps']:.0f} | {b['of_copy']:.2f} |" for b in bw]
    lines += ["", "Peer errors: " + json.dumps(errors)]
    (RESULTS / f"cuda_samples_{tag}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
