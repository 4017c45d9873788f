"""CPU benchmark of the ONNX front end: one .onnx file per sample, run by bladepack, ONNX Runtime and OpenVINO.

In: the samples, each exported once to ONNX with its dynamic axes (torch's TorchScript exporter, opset
17). Out: a markdown table (printed) and bench/results/onnx_samples.{json,md}: per shape the median
latency of bladepack built from that .onnx file, of ONNX Runtime and OpenVINO (CPU plugin, latency
hint, float32 precision: Note [Peer precision] in bench/cpu_samples.py) on the same file, and of bladepack built from the torch module (the two bladepack artifacts should be the same kernels), with geomean
ratios. Measured like bench.cpu_samples: in one process, rotated rounds, best block median.

    python -m bench.onnx_samples [--samples encoder,llama,cnn,mlp] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

import bladepack
from bench.cpu_samples import RESULTS, Runner, geomean, max_errors, measure, onnx_peers
from bench.machine import describe, title
from samples.onnx_export import export_onnx, sample_axes
from samples.registry import SAMPLES


def build(name: str) -> tuple[torch.nn.Module, dict[str, Runner], dict[str, int], str]:
    """The model, its runners, the fused kernel counts of both front ends' plans, and what runs them."""
    s = SAMPLES[name]
    torch.manual_seed(0)
    model = s.build()
    samples = s.export_samples()
    path = Path(tempfile.mkdtemp()) / f"{name}.onnx"
    path.write_bytes(export_onnx(model, samples[0], sample_axes(s.dynamic_shapes), "torchscript"))
    from_onnx = bladepack.optimize(path, dynamic_shapes=s.dynamic_shapes)
    from_torch = bladepack.optimize(model, samples, s.dynamic_shapes)
    m_onnx, m_torch = bladepack.load(from_onnx.to_bytes()), bladepack.load(from_torch.to_bytes())
    runners: dict[str, Runner] = {"bladepack (onnx)": lambda x: m_onnx(*[t.numpy() for t in x])}
    errors: dict[str, str] = {}
    onnx_peers(["ort", "openvino"], path, runners, errors)
    if errors:  # both engines must read the file: a failure is a finding to look at
        raise RuntimeError(f"{name}: {errors}")
    runners["bladepack (torch)"] = lambda x: m_torch(*[t.numpy() for t in x])
    kernels = {"bladepack (onnx)": len(from_onnx.plan.kernels), "bladepack (torch)": len(from_torch.plan.kernels)}
    return model, runners, kernels, m_onnx.executor


def run(names: list[str], repeat: int) -> dict[str, Any]:
    report: dict[str, Any] = {
        "machine": describe(threads=torch.get_num_threads()),
        "samples": {},
    }
    for name in names:
        s = SAMPLES[name]
        model, runners, kernels, report["machine"]["bladepack"] = build(name)
        g = torch.Generator().manual_seed(1)
        rows, errors = [], {}
        with torch.no_grad():
            for dims in s.test_cases():
                x = s.make_inputs(g, **dims)
                err = max_errors(runners, x, errors, reference=lambda x: model(*x))
                rows.append({"dims": dims, **measure(runners, x, repeat, errors, f"at {dims}"), "max_error": err})
        if errors:  # every runner here must work at every shape; a failure is a bug to look at
            raise RuntimeError(f"{name}: {errors}")
        report["samples"][name] = {"rows": rows, "kernels": kernels}
    return report


def markdown(report: dict[str, Any]) -> str:
    out = [f"machine: {title(report['machine'])}"]
    for name, data in report["samples"].items():
        rows = data["rows"]
        out += [
            f"\n### {name} (fused kernels: {data['kernels']})\n",
            "| dims | bladepack (onnx) µs | onnxruntime µs (x) | openvino µs (x) | bladepack (torch) µs (x) |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            b = r["bladepack (onnx)"]
            cells = " | ".join(
                f"{r[p]:.0f} ({r[p] / b:.2f}x)" for p in ("onnxruntime", "openvino", "bladepack (torch)")
            )
            out.append(f"| {r['dims']} | {b:.0f} | {cells} |")
        vs = {p: geomean([r[p] / r["bladepack (onnx)"] for r in rows]) for p in ("onnxruntime", "openvino")}
        vs_torch = geomean([r["bladepack (torch)"] / r["bladepack (onnx)"] for r in rows])
        data["geomean"] = {
            "vs onnxruntime": vs["onnxruntime"],
            "vs openvino": vs["openvino"],
            "vs bladepack (torch)": vs_torch,
        }
        worst = {p: max(r["max_error"].get(p, 0.0) for r in rows) for p in rows[0]["max_error"]}
        data["max_error"] = worst
        out.append(
            "\nlargest error vs eager, |y - eager| / (1 + max |eager|): "
            + ", ".join(f"{p} {v:.1e}" for p, v in worst.items())
        )
        out.append(
            f"\ngeomean: bladepack from the .onnx is {vs['onnxruntime']:.2f}x ONNX Runtime's speed and "
            f"{vs['openvino']:.2f}x OpenVINO's on the same file; {vs_torch:.2f}x bladepack's from the torch module"
        )
    return "\n".join(out) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", default="encoder,llama,cnn,mlp")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    report = run(args.samples.split(","), args.repeat)
    text = markdown(report)
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    blas = os.environ.get("OPENBLAS_CORETYPE", "not set")
    head = (
        "# bladepack from ONNX vs ONNX Runtime and OpenVINO (CPU)\n\n`python -m bench.onnx_samples`; numpy's "
        f"OpenBLAS with OPENBLAS_CORETYPE={blas} (ONNX Runtime and OpenVINO use their own GEMMs, unaffected).\n\n"
    )
    (RESULTS / "onnx_samples.md").write_text(head + text)
    (RESULTS / "onnx_samples.json").write_text(json.dumps(report, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
