"""GPU benchmark and check: cuBLASLt GEMMs with fused epilogues against cuBLAS GEMMs and torch.

Needs a CUDA GPU. For a transformer feed-forward block (bias + tanh GELU on the way up, bias + residual
on the way down, bias + ReLU on a third layer: every cuBLASLt epilogue form; Note [cuBLASLt GEMMs]) at
two widths in float16, bfloat16 and float32, two artifacts per block — gemm_library="cublaslt" (one
cublasLtMatmul per layer, its epilogue fused) and gemm_library="cublas" (the GEMM, then a kernel for
the epilogue) — and torch eager as the third, all in this one process. Over M from 1 to 8192 (odd values
included) it checks every result against a float64 reference (no further than torch in the same dtype,
within 2x) and times each call (CUDA events, median). Out: bench/results/cublaslt_gemm_<device>.{md,json}
with per-M ratios and geomeans.

    python -m bench.cublaslt_gemm [--repeat 20] [--widths 1024,4096]
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

import bladepack
from bench.cuda_samples import _time_us, save_results

SWEEP = (1, 7, 64, 127, 512, 1000, 2048, 8192)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LIBRARIES = ("cublaslt", "cublas")


class FeedForward(torch.nn.Module):
    """x + down(gelu_tanh(up(x))), then relu(out(.)): bias + GELU, bias + residual, bias + ReLU."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.up, self.down, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d), torch.nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))
        return torch.relu(self.out(h))


def _load(model: FeedForward, d: int, dtype: torch.dtype, library: str) -> Any:
    m = torch.export.Dim("m", min=1, max=max(SWEEP))
    art = bladepack.optimize(
        model,
        [(torch.randn(5, d),)],
        ({0: m},),
        targets=("cuda",),
        dtype=None if dtype == torch.float32 else str(dtype)[6:],
        gemm_library=library,
        reference_cases=False,
    )
    with tempfile.TemporaryDirectory() as tmp:
        art.save(Path(tmp) / "f.bpk")
        return bladepack.load(Path(tmp) / "f.bpk", device="cuda")


def _error(out: torch.Tensor, ref64: torch.Tensor) -> float:
    return float((out.double() - ref64).abs().max() / ref64.abs().max().clamp_min(1e-30))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--widths", default="1024,4096")
    args = ap.parse_args()
    device = torch.cuda.get_device_name()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    for d in (int(w) for w in args.widths.split(",")):
        for dtype in DTYPES:
            torch.manual_seed(0)
            model = FeedForward(d).eval()
            loaded = {lib: _load(model, d, dtype, lib) for lib in LIBRARIES}
            eager = FeedForward(d).eval().to("cuda", dtype)
            eager.load_state_dict(model.state_dict())
            ref = FeedForward(d).eval().to("cuda", torch.float64)
            ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
            eager.requires_grad_(False), ref.requires_grad_(False)
            for mv in SWEEP:
                x = torch.randn(mv, d, device="cuda", dtype=dtype)
                ref64 = ref(x.double())
                theirs = _error(eager(x), ref64)
                row: dict[str, Any] = {"d": d, "dtype": str(dtype)[6:], "m": mv}
                for lib, mod in loaded.items():
                    out = mod(x)
                    ours = _error(out[0] if isinstance(out, tuple) else out, ref64)
                    if not ours <= 2 * theirs + 1e-3:
                        failures.append(f"{lib} {row['dtype']} d={d} M={mv}: error {ours:.3g}, torch {theirs:.3g}")
                    row[f"{lib}_us"] = _time_us(lambda x=x, mod=mod: mod(x), args.repeat)
                row["eager_us"] = _time_us(lambda x=x: eager(x), args.repeat)
                row["vs_cublas"] = row["cublas_us"] / row["cublaslt_us"]
                row["vs_eager"] = row["eager_us"] / row["cublaslt_us"]
                row["tflops"] = 2 * mv * d * d * 9 / row["cublaslt_us"] / 1e6
                rows.append(row)
                print(
                    f"{row['dtype']} d={d} M={mv}: cuBLASLt {row['cublaslt_us']:.1f} us, "
                    f"x{row['vs_cublas']:.2f} vs cuBLAS GEMMs, x{row['vs_eager']:.2f} vs eager",
                    flush=True,
                )

    def geo(key: str) -> float:
        return math.exp(statistics.fmean(math.log(r[key]) for r in rows))

    lines = [
        f"# cuBLASLt GEMMs with fused epilogues on {device}",
        "",
        f"torch {torch.__version__}; a feed-forward block (bias + tanh GELU, bias + residual, bias + ReLU); "
        f"{len(failures)} results off (listed below)",
        "",
        f"geomean vs the cuBLAS plan {geo('vs_cublas'):.2f}x, vs torch eager {geo('vs_eager'):.2f}x",
        "",
        "| dtype | d | M | cuBLASLt us | cuBLAS plan us | eager us | vs cuBLAS plan | vs eager | TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['d']} | {r['m']} | {r['cublaslt_us']:.1f} | {r['cublas_us']:.1f} | "
            f"{r['eager_us']:.1f} | {r['vs_cublas']:.2f} | {r['vs_eager']:.2f} | {r['tflops']:.1f} |"
        )
    lines += [f"- {f}" for f in failures]
    save_results("cublaslt_gemm", device, "\n".join(lines) + "\n", rows)
    print("\n".join(lines[:5]))
    if failures:
        raise SystemExit(f"{len(failures)} results differ from the reference beyond torch's own error")


if __name__ == "__main__":
    main()
