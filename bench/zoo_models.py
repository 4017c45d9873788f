"""CPU benchmark of the model zoo (samples/zoo.py): bladepack (torch.export front end) against PyTorch
eager, torch.compile(dynamic=True), ONNX Runtime and OpenVINO, the latter two on the same TorchScript
ONNX export with the zoo's dynamic axes.

In: the zoo models at their `bench` sizes. Out: a markdown table of median latencies and ratios
(peer time / bladepack time: above 1, bladepack is faster), printed, and bench/results/zoo_models.{json,md}.
Every runner measures in this one process, interleaved per shape, as bench.cpu_samples does (Note
[Rounds] there). A peer that cannot build a model is reported with its error.

    python -m bench.zoo_models [--models bert,vit] [--peers eager,compile,ort,openvino] [--repeat 20]
                               [--isa x86-64-v3]

`--isa` loads that CPU kernel library of each artifact (`LoaderOptions(cpu_isa=...)`): an AVX-512
machine runs the x86-64-v3 (AVX2) library an AVX2-only machine would load; the results record it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

import bladepack
from bench.cpu_samples import Runner, geomean, measure, onnx_peers, torch_peers
from bench.machine import describe, title
from samples.zoo import ZOO, ZooModel

RESULTS = Path(__file__).resolve().parent / "results"
TITLES = {"eager": "eager", "compile": "torch.compile", "ort": "onnxruntime", "openvino": "openvino"}


def _onnx(z: ZooModel, model: torch.nn.Module, sample: tuple[torch.Tensor, ...]) -> Path:
    path = Path(tempfile.mkdtemp()) / "model.onnx"
    axes = {n: {a: d[0] for a, d in z.dims.get(n, {}).items()} for n in z.names}
    torch.onnx.export(
        model, sample, str(path), input_names=list(z.names), output_names=["out"], dynamic_axes=axes, dynamo=False
    )
    return path


def build(
    name: str, peers: list[str], isa: str | None = None
) -> tuple[ZooModel, dict[str, Runner], dict[str, str], str]:
    """The model, its runners (bladepack first), the peers' build errors, and what runs bladepack's kernels."""
    z = ZOO[name]
    torch.manual_seed(0)
    model = z.build()
    g = torch.Generator().manual_seed(1)
    samples = [z.make(g, s) for s in z.samples]
    artifact = bladepack.optimize(model, samples, dynamic_shapes=z.dynamic_shapes())
    loaded = bladepack.load(artifact.to_bytes(), options=bladepack.LoaderOptions(cpu_isa=isa))
    runners: dict[str, Runner] = {"bladepack": lambda x: loaded(*x)}
    errors: dict[str, str] = {}
    torch_peers(peers, model, samples, runners, errors)
    path: Path | None = None
    if "ort" in peers or "openvino" in peers:
        try:
            path = _onnx(z, model, samples[0])
        except Exception as e:
            errors["onnx export"] = f"{type(e).__name__}: {e}"[:300]
    if path is not None:
        onnx_peers(peers, path, runners, errors)
    return z, runners, errors, loaded.executor


def run(names: list[str], peers: list[str], repeat: int, isa: str | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {
        "machine": describe(threads=torch.get_num_threads()),
        "torch": torch.__version__,
        "models": {},
    }
    for name in names:
        with torch.no_grad():
            z, runners, errors, report["machine"]["bladepack"] = build(name, peers, isa)
            g = torch.Generator().manual_seed(2)
            rows = []
            for size in z.bench:
                x = z.make(g, size)
                rows.append({"size": list(size), **measure(runners, x, repeat, errors, f"at {size}")})
        report["models"][name] = {"rows": rows, "errors": errors, "peers": list(runners)}
        print(f"{name}: done", flush=True)
    return report


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# Model zoo on CPU ({title(m)}; torch {report['torch']})",
        "",
        "Median latency per call; (x) is the peer's time over bladepack's: above 1, bladepack is faster.",
    ]
    summary: dict[str, list[float]] = {}
    for name, r in report["models"].items():
        peers = [p for p in r["peers"] if p != "bladepack"]
        lines += ["", f"### {name}", "", "| size | bladepack µs | " + " | ".join(f"{p} µs (x)" for p in peers) + " |"]
        lines.append("|---" * (2 + len(peers)) + "|")
        for row in r["rows"]:
            bp = row.get("bladepack")
            cells = [str(tuple(row["size"])), f"{bp:.0f}" if bp else "failed"]
            for p in peers:
                t = row.get(p)
                if t and bp:
                    cells.append(f"{t:.0f} ({t / bp:.2f}x)")
                    summary.setdefault(p, []).append(t / bp)
                else:
                    cells.append("failed")
            lines.append("| " + " | ".join(cells) + " |")
        for peer, err in r["errors"].items():
            lines.append(f"\n{peer}: {err}")
    lines += ["", "## Geomean ratio over every model and size", ""]
    lines += [f"- vs {p}: {geomean(v):.2f}x ({len(v)} points)" for p, v in summary.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(ZOO))
    ap.add_argument("--peers", default="eager,compile,ort,openvino")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--isa", default=None, help="the CPU kernel library to load (default: the best this CPU runs)")
    ap.add_argument("--out", default=str(RESULTS / "zoo_models"))
    a = ap.parse_args()
    report = run(a.models.split(","), a.peers.split(","), a.repeat, a.isa)
    text = markdown(report)
    print(text)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
    out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
