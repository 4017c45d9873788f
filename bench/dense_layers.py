"""Linear layers on the CPU: the generated dense kernels (Note [Dense layers]) against BLAS GEMMs.

In: a Linear(K, N) + ReLU model per weight shape. Out: a markdown table of the BLAS plan's time / the
dense plan's time per weight shape (K x N) and row count M (printed; `--out FILE` also writes it).
Both plans come from the same model, one with BLADEPACK_DENSE_LAYERS=0 (numpy's OpenBLAS, the bias and
ReLU in a loop kernel), and run in this one process, alternating blocks of calls; a plan's figure is
its best block median (whole calls, so the epilogue kernel and the launches count).

    python -m bench.dense_layers [--out bench/results/dense_layers.md] [--shapes 64x256,256x256] [--isa x86-64-v3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack

# the samples' layers and a spread up to MAX_WEIGHT_BYTES (512 KB); larger weights read column panels
# (Note [Dense weight panels]: bench/results/dense_layers_large.md has BERT-base's and others)
SHAPES = [(64, 256), (256, 256), (256, 10), (256, 64), (128, 128), (64, 172), (172, 64), (256, 512), (512, 256)]
ROWS = [1, 2, 3, 4, 8, 16, 17, 64, 255, 1024, 4096]
BLOCKS = 5


class _Layer(torch.nn.Module):
    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(k, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _build(model: torch.nn.Module, k: int, dense: bool, isa: str | None = None) -> Any:
    """The model's plan with or without dense kernels; `isa`: built and loaded for that CPU library
    level only (x86-64-v3: the AVX2 kernels, which an AVX-512 machine runs too)."""
    samples = [(torch.randn(2, k),), (torch.randn(5, k),)]
    extra = {"cpu_isas": isa} if isa else {}
    options = bladepack.CompileOptions.from_env(dense_layers=dense, **extra)
    art = bladepack.optimize(model, samples, {"x": {0: bladepack.Dim("rows", 1, max(ROWS))}}, options=options)
    return bladepack.load(art.to_bytes(), options=bladepack.LoaderOptions.from_env(cpu_isa=isa) if isa else None)


def _median_us(fn: Callable[[], Any], n: int) -> float:
    for _ in range(3):
        fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


def measure(k: int, n: int, rows: list[int], isa: str | None = None) -> dict[int, tuple[float, float]]:
    """(BLAS plan µs, dense plan µs) per row count, results checked against each other."""
    torch.manual_seed(0)
    model = _Layer(k, n).eval()
    blas, dense = _build(model, k, False, isa), _build(model, k, True, isa)
    out: dict[int, tuple[float, float]] = {}
    for m in rows:
        x = np.random.default_rng(m).standard_normal((m, k), dtype=np.float32)
        a, b = np.asarray(blas(x)), np.asarray(dense(x))
        err = float(np.abs(a - b).max() / (1 + np.abs(a).max()))
        assert err < 1e-5, (k, n, m, err)
        reps = max(5, min(200, int(20000 / max(1.0, _median_us(lambda: blas(x), 3)))))
        best = [float("inf"), float("inf")]
        for _ in range(BLOCKS):
            best[0] = min(best[0], _median_us(lambda: blas(x), reps))
            best[1] = min(best[1], _median_us(lambda: dense(x), reps))
        out[m] = (best[0], best[1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)))
    ap.add_argument("--isa", default=None, help="one CPU library level (x86-64-v3: AVX2), built and loaded")
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",")]
    rows = [int(v) for v in a.rows.split(",")]
    lines = [
        f"BLAS plan time / dense plan time (Linear + ReLU, whole calls, {torch.get_num_threads()} threads; "
        "> 1: the dense kernel is faster)",
        "",
        "| K x N | " + " | ".join(f"M={m}" for m in rows) + " |",
        "|---|" + "---|" * len(rows),
    ]
    print("\n".join(lines), flush=True)
    gflops = ["", "Dense plan GFLOP/s (2 M K N / whole-call time)", "", lines[2], lines[3]]
    for k, n in shapes:
        res = measure(k, n, rows, a.isa)
        line = f"| {k}x{n} | " + " | ".join(f"{res[m][0] / res[m][1]:.2f}" for m in rows) + " |"
        lines.append(line)
        gflops.append(f"| {k}x{n} | " + " | ".join(f"{2 * m * k * n / res[m][1] / 1e3:.1f}" for m in rows) + " |")
        print(line, "  µs (blas/dense):", {m: (round(b), round(d)) for m, (b, d) in res.items()}, flush=True)
    lines += gflops
    print("\n".join(gflops))
    if a.out:
        Path(a.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
