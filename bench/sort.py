"""CPU benchmark of sorting (Note [Sort kernel]): `torch.sort` of short lines and of a vocabulary's
length (top-p sampling sorts the logits), bladepack against PyTorch eager and ONNX Runtime.

In: the shapes below. Out: a markdown table of median latencies and ratios (peer time / bladepack
time: above 1, bladepack is faster), printed, and bench/results/sort.{json,md}. Every runner measures in
this one process, interleaved per shape (Note [Rounds] in bench/cpu_samples.py); results are checked
equal to eager's before timing.

    python -m bench.sort [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import bladepack
from bench.cpp_runtime import machine
from bench.cpu_samples import Runner, geomean, measure, onnx_peers

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = ((256, 8), (256, 24), (256, 64), (64, 100), (16, 1024), (1, 32000), (8, 32000))  # (rows, line length)


class _Sort(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v, i = torch.sort(x, dim=-1, descending=True, stable=True)
        return v, i


class _SortForOnnx(nn.Module):
    """The same sort for torch's TorchScript ONNX exporter (which refuses `stable`; ONNX's TopK keeps
    ties in input order anyway)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        v, i = torch.sort(x, dim=-1, descending=True)
        return v, i


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeat", type=int, default=20)
    a = p.parse_args()
    torch.set_num_threads(2)
    rows_out: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    model = _Sort().eval()
    with tempfile.TemporaryDirectory() as tmp:
        for rows, n in SHAPES:
            x = torch.round(torch.randn(rows, n) * 64)  # ties, as logits rounded to a few bits have
            samples = [(x,)]  # a constant axis: each shape its own artifact
            ours = bladepack.load(bladepack.optimize(model, samples).to_bytes())
            runners: dict[str, Runner] = {"bladepack": lambda args, m=ours: m(*args)}
            runners["eager"] = lambda args: model(*args)
            path = Path(tmp) / f"sort_{rows}_{n}.onnx"
            torch.onnx.export(_SortForOnnx(), (x,), str(path), dynamo=False, input_names=["x"], opset_version=17)
            onnx_peers(["ort"], path, runners, errors)
            want = model(x)
            for g, w in zip(runners["bladepack"]((x,)), want, strict=True):
                assert np.array_equal(np.asarray(g), w.numpy()), f"bladepack differs from eager at {rows} x {n}"
            row = measure(runners, (x,), a.repeat, errors, f"{rows} x {n}")
            row["shape"] = [rows, n]
            rows_out.append(row)
            print(row, flush=True)
    peers = [p for p in rows_out[0] if p not in ("bladepack", "shape")]
    lines = [
        "# Sorting on the CPU (`python -m bench.sort`)",
        "",
        f"{machine()}, 2 threads (the artifact's library for this CPU); torch.sort(descending, stable) along the last "
        "axis, µs per call; in brackets peer time / bladepack time.",
        "",
        "| rows x length | bladepack µs | " + " | ".join(f"{p} µs (x)" for p in peers) + " |",
        "|---|---|" + "---|" * len(peers),
    ]
    for r in rows_out:
        b = r["bladepack"]
        cells = [f"{r[p]:.1f} ({r[p] / b:.2f}x)" if r.get(p) else "-" for p in peers]
        lines.append(f"| {r['shape'][0]} x {r['shape'][1]} | {b:.1f} | " + " | ".join(cells) + " |")
    for p in peers:
        ratios = [r[p] / r["bladepack"] for r in rows_out if r.get(p)]
        lines.append(f"\ngeomean {p} / bladepack: {geomean(ratios):.2f}x")
    for k, v in errors.items():
        lines.append(f"\n{k}: {v}")
    text = "\n".join(lines) + "\n"
    print(text)
    (RESULTS / "sort.md").write_text(text)
    (RESULTS / "sort.json").write_text(json.dumps(rows_out, indent=1) + "\n")


if __name__ == "__main__":
    main()
