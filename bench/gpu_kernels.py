"""GPU benchmark: bandwidth-bound kernels against a device-to-device copy of the bytes they move.

Issue 41's first acceptance line: kernel-only time of a fused elementwise kernel and of the row kernels
(layer norm, softmax, RMS norm; Note [Rows in registers] and Note [Row moments] in
codegen/cuda_emitter.py) at >= 64 MB, as a fraction of a device-to-device copy of the same bytes, beside
torch's own kernel for the op; and rows for this wave's other kernel work against a baseline: an
elementwise kernel over a dynamic inner dim (Note [Narrow index division]), permutes through shared-memory
tiles (Note [Transpose tiles]), column reductions with few
outputs (Note [Split reductions]) and with fewer than 32 (Note [Grid reductions]), a sort (Note [Block sort]) and an attention block whose heads the attention merges back itself (Note [Attention stores]). Kernel time comes from the profiler (CUPTI: the GPU time of the kernels
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
from dataclasses import dataclass
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


class ColumnSum(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(0)


class Total(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


class SequenceMean(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(1)


class ToChannelsLast(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2.0).permute(0, 2, 3, 1).contiguous()


class Transpose(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2.0).t().contiguous()


class Sort(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sort(x, dim=-1, stable=True)


class AttentionBlock(torch.nn.Module):
    """After a fused QKV projection: heads split by views, causal sdpa, heads merged back, projected."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(512, 512)

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        b, s, _ = qkv.shape
        q, k, v = (t.view(b, s, 8, 64).transpose(1, 2) for t in qkv.split(512, dim=-1))
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, s, 512))


@dataclass(frozen=True)
class Case:
    """A benchmark row: the model, each input's shape here and the name of each dynamic axis ("" for
    static), the dtype, and the bytes the kernel moves per input byte (0: not bandwidth-bound, no copy
    fraction)."""

    name: str
    model: Callable[[], torch.nn.Module]
    shape: tuple[int, ...]
    dims: tuple[str, ...]
    inputs: int = 1
    dtype: str = "float32"
    moved: int = 2


def _rows(width: int, itemsize: int = 4) -> tuple[int, int]:
    return BYTES // (width * itemsize), width


CASES: list[Case] = [
    Case("gelu(1.5x + y)", Elementwise, _rows(4096), ("rows", ""), inputs=2, moved=3),
    # Note [Narrow index division]: a dynamic inner dim (seq) splits each thread's position at run time
    Case(
        "gelu(1.5x + y) [batch, seq, 1024]",
        Elementwise,
        (64, BYTES // (64 * 1024 * 4), 1024),
        ("b", "s", ""),
        2,
        moved=3,
    ),
    Case("layer_norm 768", lambda: LayerNorm(768), _rows(768), ("rows", "")),
    Case("layer_norm 1024", lambda: LayerNorm(1024), _rows(1024), ("rows", "")),
    Case("layer_norm 4096", lambda: LayerNorm(4096), _rows(4096), ("rows", "")),
    Case("layer_norm 8192", lambda: LayerNorm(8192), _rows(8192), ("rows", "")),
    Case("layer_norm 4096 float16", lambda: LayerNorm(4096), _rows(4096, 2), ("rows", ""), dtype="float16"),
    Case("softmax 1024", Softmax, _rows(1024), ("rows", "")),
    Case("softmax 4096", Softmax, _rows(4096), ("rows", "")),
    Case("rms_norm 4096", lambda: RmsNorm(4096), _rows(4096), ("rows", "")),
    # Note [Split reductions]: few outputs over long reductions, against the baseline's thread per output
    Case("mean over a sequence [1, s, 768]", SequenceMean, (1, BYTES // (768 * 4), 768), ("b", "s", ""), moved=1),
    Case("column sum [rows, 1024]", ColumnSum, _rows(1024), ("rows", ""), moved=1),
    Case("column sum [rows, 16]", ColumnSum, _rows(16), ("rows", ""), moved=1),
    # Note [Grid reductions]: an output's reduction over several blocks, against the baseline's one block
    Case("sum of all [rows, 1024]", Total, _rows(1024), ("rows", ""), moved=1),
    # Note [Transpose tiles]: permutes through shared-memory tiles, against the baseline's strided reads
    Case(
        "permute NCHW -> NHWC [n, 64, 56, 56]",
        ToChannelsLast,
        (BYTES // (64 * 56 * 56 * 4), 64, 56, 56),
        ("n", "", "", ""),
    ),
    Case("transpose [rows, 1024]", Transpose, _rows(1024), ("rows", "")),
    # Note [Block sort]: against the baseline's heapsort per thread
    Case("sort rows of 2048", Sort, (8192, 2048), ("rows", ""), moved=0),
    # Note [Attention stores]: the whole block's kernels (attention, projection; the baseline's copy)
    Case("attention block float16", AttentionBlock, (8, 1024, 1536), ("b", "s", ""), dtype="float16", moved=0),
]


def _stem(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name).strip("_")


def build(case: Case) -> Any:
    torch.manual_seed(0)
    model = case.model().eval()
    sample = tuple(torch.randn(*(2 if d else n for d, n in zip(case.dims, case.shape))) for _ in range(case.inputs))
    axes = {k: bladepack.Dim(d, min=1, max=1 << 20) for k, d in enumerate(case.dims) if d}
    half = None if case.dtype == "float32" else case.dtype
    return bladepack.optimize(model, [sample], tuple(axes for _ in sample), targets=("cuda",), dtype=half)


def save(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        art = build(case)
        art.save(directory / f"{_stem(case.name)}.bpk")
        kernels = [v.name for k in art.plan.kernels if k.target == "cuda" for v in k.variants]
        print(f"{case.name}: {', '.join(kernels)}")


def _kernel_us(fn: Callable[[], Any], repeat: int) -> float:
    """GPU time of the kernels one call of `fn` launches (the profiler's CUDA kernel events, summed),
    averaged over `repeat` calls profiled together."""
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
    for case in CASES:
        tdt = getattr(torch, case.dtype)
        xs = tuple(torch.randn(*case.shape, device="cuda").to(tdt) for _ in range(case.inputs))
        if artifacts is None:
            ours = bladepack.load(build(case).to_bytes(), device="cuda")
        else:
            ours = bladepack.load(artifacts / f"{_stem(case.name)}.bpk", device="cuda")
        torch.manual_seed(0)
        eager = case.model().eval().to("cuda", tdt)
        nbytes = case.moved * math.prod(case.shape) * tdt.itemsize * case.inputs
        shape = " x ".join(map(str, case.shape))
        row: dict[str, Any] = {"kernel": case.name, "shape": shape, "dtype": case.dtype, "bytes": nbytes}
        with torch.no_grad():
            row["ours_us"] = _kernel_us(lambda: ours(*xs), repeat)
            row["torch_us"] = _kernel_us(lambda: eager(*xs), repeat)
            out, ref = ours(*xs), eager(*xs)
            outs, refs = (out, ref) if isinstance(ref, tuple) else ((out,), (ref,))
            row["max_err"] = max(float((o.double() - r.double()).abs().max()) for o, r in zip(outs, refs))
            if baseline is not None:
                base = bladepack.load(baseline / f"{_stem(case.name)}.bpk", device="cuda")
                row["baseline_us"] = _kernel_us(lambda: base(*xs), repeat)
        if nbytes:
            row["copy_us"] = _copy_us(nbytes, repeat)
        rows.append(row)
        print(_line(row), flush=True)
        torch.cuda.empty_cache()
    return rows


def _line(r: dict[str, Any]) -> str:
    base = f" {r['baseline_us'] / r['ours_us']:.2f}x |" if "baseline_us" in r else " - |"
    if "copy_us" in r:
        gbps = f"{r['bytes'] / r['ours_us'] / 1e3:.0f}"
        fractions = f"{r['copy_us'] / r['ours_us']:.2f} | {r['copy_us'] / r['torch_us']:.2f}"
    else:
        gbps, fractions = "-", "- | -"
    return (
        f"| {r['kernel']} | {r['shape']} | {r['ours_us']:.1f} | {gbps} | {fractions} | "
        f"{r['torch_us'] / r['ours_us']:.2f}x |{base} {r['max_err']:.2g} |"
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
    bandwidth = [r for r in rows if "copy_us" in r]
    geo = math.exp(sum(math.log(r["copy_us"] / r["ours_us"]) for r in bandwidth) / max(len(bandwidth), 1))
    lines = [
        f"# Bandwidth-bound kernels on {device}",
        "",
        "Kernel-only GPU time per call (profiler: every kernel a call launches), bandwidth rows 256 MiB an",
        "input. `of copy`: a device-to-device copy of the same bytes' time over the kernels' (1.00 = the copy",
        "limit). `vs torch` / `vs baseline`: torch's kernels' / the baseline artifacts' time over ours.",
        "",
        "| kernel | shape | ours µs | GB/s | ours of copy | torch of copy | vs torch | vs baseline | max err vs torch |",
        "|---|---|---|---|---|---|---|---|---|",
        *(_line(r) for r in rows),
        "",
        f"Geomean fraction of copy over the bandwidth rows: {geo:.2f}.",
    ]
    text = "\n".join(lines) + "\n"
    save_results("gpu_kernels", device, text, rows)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
