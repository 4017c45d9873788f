"""GPU benchmark: bandwidth-bound kernels against a device-to-device copy of the bytes they move.

Issue 41's first acceptance line: kernel-only time of a fused elementwise kernel and of the row kernels
(layer norm, softmax, RMS norm; Note [Rows in registers] and Note [Row moments] in
codegen/cuda_emitter.py) at >= 64 MB, as a fraction of a device-to-device copy of the same bytes, beside
torch's own kernel for the op. Kernel time comes from the profiler (CUPTI: the GPU time of the kernels
one call launches, summed; the loader's host time does not count), copy time from CUDA events around
back-to-back copies. Each model is built with a dynamic row count and a static row length, as a real
model's hidden size is.

    python -m bench.gpu_kernels [--repeat 20]                 # on a GPU
    python -m bench.gpu_kernels --save DIR                    # no GPU: build and save the artifacts
    python -m bench.gpu_kernels --artifacts DIR --baseline BASE   # artifacts saved before (here and by
                                                              # another checkout: PYTHONPATH=<it>)

`--baseline` adds each kernel's time in the baseline artifacts and the ratio (baseline / ours: above 1
is faster now). Results: bench/results/gpu_kernels_<device>.{md,json}.
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import bladepack

MiB = 1 << 20
BYTES = 256 * MiB  # each input; the issue asks for >= 64 MB moved


class Elementwise(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x * 1.5 + y)


class LayerNorm(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x)


class Softmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, -1)


class RmsNorm(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(width) + 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


# (name, model, row length, dtype, inputs, bytes moved per input byte)
CASES: list[tuple[str, Callable[[], torch.nn.Module], int, str, int, int]] = [
    ("gelu(1.5x + y)", Elementwise, 4096, "float32", 2, 3),
    ("layer_norm 768", lambda: LayerNorm(768), 768, "float32", 1, 2),
    ("layer_norm 1024", lambda: LayerNorm(1024), 1024, "float32", 1, 2),
    ("layer_norm 4096", lambda: LayerNorm(4096), 4096, "float32", 1, 2),
    ("layer_norm 8192", lambda: LayerNorm(8192), 8192, "float32", 1, 2),
    ("layer_norm 4096 float16", lambda: LayerNorm(4096), 4096, "float16", 1, 2),
    ("softmax 1024", Softmax, 1024, "float32", 1, 2),
    ("softmax 4096", Softmax, 4096, "float32", 1, 2),
    ("rms_norm 4096", lambda: RmsNorm(4096), 4096, "float32", 1, 2),
]


def _stem(name: str) -> str:
    return name.replace(" ", "_").replace("(", "").replace(")", "").replace(".", "").replace("+", "p")


def build(name: str, factory: Callable[[], torch.nn.Module], width: int, dtype: str, inputs: int) -> Any:
    torch.manual_seed(0)
    model = factory().eval()
    rows = bladepack.Dim("rows", min=1, max=1 << 20)
    sample = tuple(torch.randn(8, width) for _ in range(inputs))
    half = None if dtype == "float32" else dtype
    return bladepack.optimize(model, [sample], tuple({0: rows} for _ in sample), targets=("cuda",), dtype=half)


def save(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, factory, width, dtype, inputs, _ in CASES:
        art = build(name, factory, width, dtype, inputs)
        art.save(directory / f"{_stem(name)}.bpk")
        kernels = [v.name for k in art.plan.kernels if k.target == "cuda" for v in k.variants]
        print(f"{name}: {', '.join(kernels)}")


def _kernel_us(fn: Callable[[], Any], repeat: int) -> float:
    """GPU time of the kernels one call of `fn` launches (the profiler's CUDA kernel events, summed),
    median over `repeat` calls profiled together (so: total / repeat)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for evt in prof.events():
        kind = str(getattr(evt, "device_type", ""))
        if "CUDA" not in kind or "memcpy" in evt.name.lower() or "memset" in evt.name.lower():
            continue
        total += float(getattr(evt, "device_time", 0.0) or getattr(evt, "cuda_time", 0.0))
    return total / repeat


def _copy_us(nbytes: int, repeat: int) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def run(artifacts: Path | None, baseline: Path | None, repeat: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name, factory, width, dtype, inputs, moved in CASES:
        tdt = getattr(torch, dtype)
        n = BYTES // (width * tdt.itemsize)
        xs = tuple(torch.randn(n, width, device="cuda").to(tdt) for _ in range(inputs))
        if artifacts is None:
            ours = bladepack.load(build(name, factory, width, dtype, inputs).to_bytes(), device="cuda")
        else:
            ours = bladepack.load(artifacts / f"{_stem(name)}.bpk", device="cuda")
        torch.manual_seed(0)
        eager = factory().eval().to("cuda", tdt)
        nbytes = moved * BYTES
        row: dict[str, Any] = {"kernel": name, "rows": n, "width": width, "dtype": dtype, "bytes": nbytes}
        with torch.no_grad():
            row["ours_us"] = _kernel_us(lambda: ours(*xs), repeat)
            row["torch_us"] = _kernel_us(lambda: eager(*xs), repeat)
            out, ref = ours(*xs), eager(*xs)
            row["max_err"] = float((out.double() - ref.double()).abs().max())
            if baseline is not None:
                base = bladepack.load(baseline / f"{_stem(name)}.bpk", device="cuda")
                row["baseline_us"] = _kernel_us(lambda: base(*xs), repeat)
        row["copy_us"] = _copy_us(nbytes, repeat)
        rows.append(row)
        print(_line(row), flush=True)
        torch.cuda.empty_cache()
    return rows


def _line(r: dict[str, Any]) -> str:
    base = f" {r['baseline_us'] / r['ours_us']:.2f}x |" if "baseline_us" in r else " - |"
    return (
        f"| {r['kernel']} | {r['rows']} x {r['width']} | {r['ours_us']:.1f} | {r['bytes'] / r['ours_us'] / 1e3:.0f} | "
        f"{r['copy_us'] / r['ours_us']:.2f} | {r['copy_us'] / r['torch_us']:.2f} | {r['torch_us'] / r['ours_us']:.2f}x |"
        f"{base} {r['max_err']:.2g} |"
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--save", type=Path, help="no GPU: build the artifacts and save them here")
    ap.add_argument("--artifacts", type=Path, help="artifacts saved by --save (else built here)")
    ap.add_argument("--baseline", type=Path, help="another checkout's artifacts (--save), timed beside ours")
    a = ap.parse_args()
    if a.save is not None:
        save(a.save)
        return 0
    if not torch.cuda.is_available():
        print("bench.gpu_kernels needs a CUDA device (--save builds the artifacts without one)")
        return 2
    from bench.cuda_samples import save_results

    device = torch.cuda.get_device_name()
    rows = run(a.artifacts, a.baseline, a.repeat)
    geo = math.exp(sum(math.log(r["copy_us"] / r["ours_us"]) for r in rows) / len(rows))
    lines = [
        f"# Bandwidth-bound kernels on {device}",
        "",
        "Kernel-only GPU time per call (profiler), each input 256 MiB. `of copy`: a device-to-device copy",
        "of the same bytes' time over the kernel's (1.00 = the copy limit). `vs baseline`: the baseline",
        "artifacts' kernel time over ours.",
        "",
        "| kernel | shape | ours µs | GB/s | ours of copy | torch of copy | vs torch | vs baseline | max err vs torch |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_line(r) for r in rows),
        "",
        f"Geomean fraction of copy: {geo:.2f}.",
    ]
    text = "\n".join(lines) + "\n"
    save_results("gpu_kernels", device, text, rows)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
