"""GPU benchmark: the fused CUDA attention kernel (Note [Online softmax on CUDA]) against torch's SDPA.

Needs a CUDA GPU (H100 / H200). In: two artifacts per dtype built on this machine (nothing travels):
causal prefill over [batch, heads, seq, 128] and grouped-query decoding (one new row, 32 query heads
over 8 KV heads) against a cache. Out: per shape the time of a call (CUDA events around back-to-back
calls, so launch gaps hide behind the GPU's queue as they would in a model), SDPA's with its default
backend choice and with the flash backend where it takes the dtype (float16 / bfloat16; float32 gets
the memory-efficient one), the ratios (SDPA / bladepack: above 1 is faster here), and the error of
each against a float64 SDPA: bench/results/gpu_attention_<device>.{md,json}. Decoding at batch 1 and 4
splits the cache over blocks (Note [Split keys]); the runner "unsplit" is the same decode artifact built
with the split off (one block per query row, the kernel before it), so `vs_unsplit` is the split's
gain; prefill in float16 / bfloat16 runs on tensor cores (Note [Tensor-core attention]) and the runner
"cuda_cores" is it built without them, so `vs cuda_cores` is theirs. Every runner is measured in this one process, three rounds with the order rotated; a runner's
figure is its best round.

    python -m bench.gpu_attention [--dtypes float16,float32] [--repeat 20] [--quick]
    python -m bench.gpu_attention --dry-run    # no GPU: build the artifacts and print their kernels
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import bladepack
from bench.cuda_samples import _time_us, save_results
from bladepack import Dim

ROUNDS = 3
HEAD = 128
PREFILL = [(b, 16, s) for b, s in [(1, 512), (4, 512), (2, 1024), (1, 2048), (1, 4096)]]  # (batch, heads, seq)
DECODE = [(b, kv) for b in (1, 4, 16) for kv in (1024, 4096)]  # (batch, cache positions)
HEADS, KV_HEADS = 32, 8


class Prefill(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Decode(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def artifact(kind: str, dtype: torch.dtype, targets: tuple[str, ...], new: bool = True) -> Any:
    """The benchmark's artifact; `new=False` builds it without Note [Split keys] (decode) or Note
    [Tensor-core attention] (prefill): the baselines of both."""
    if not new:
        from unittest import mock

        from bladepack.backends import cuda
        from bladepack.library_ops import cuda_attention

        off = mock.patch.object(cuda, "key_split", lambda att, ctx: None)
        if kind == "prefill":
            off = mock.patch.object(cuda_attention, "mma_plan", lambda att, ctx: None)
        with off:
            return artifact(kind, dtype, targets)
    batch = Dim("batch", max=64)
    if kind == "prefill":
        seq = Dim("seq", max=8192)
        dims = {"q": {0: batch, 2: seq}, "k": {0: batch, 2: seq}, "v": {0: batch, 2: seq}}
        x = tuple(torch.randn(2, 4, 9, HEAD, dtype=dtype) for _ in range(3))
        return bladepack.optimize(Prefill(), x, dynamic_shapes=dims, targets=targets)
    past = Dim("past", max=8192)
    dims = {"q": {0: batch}, "k": {0: batch, 2: past}, "v": {0: batch, 2: past}}
    q = torch.randn(2, HEADS, 1, HEAD, dtype=dtype)
    kv = tuple(torch.randn(2, KV_HEADS, 9, HEAD, dtype=dtype) for _ in range(2))
    return bladepack.optimize(Decode(), (q, *kv), dynamic_shapes=dims, targets=targets)


def _sdpa(model: torch.nn.Module, backend: Any) -> Callable[..., torch.Tensor]:
    from torch.nn.attention import sdpa_kernel

    def run(*args: torch.Tensor) -> torch.Tensor:
        if backend is None:
            return model(*args)
        with sdpa_kernel(backend):
            return model(*args)

    return run


def measure(dtypes: list[torch.dtype], repeat: int, quick: bool) -> list[dict[str, Any]]:
    from torch.nn.attention import SDPBackend

    rows: list[dict[str, Any]] = []
    for dtype in dtypes:
        for kind, model, shapes in (("prefill", Prefill(), PREFILL), ("decode", Decode(), DECODE)):
            m = bladepack.load(artifact(kind, dtype, ("cuda",)).to_bytes(), device="cuda")
            tuned = SDPBackend.FLASH_ATTENTION if dtype != torch.float32 else SDPBackend.EFFICIENT_ATTENTION
            runners: dict[str, Callable[..., Any]] = {
                "bladepack": m,
                "sdpa": _sdpa(model, None),
                f"sdpa_{tuned.name.lower()}": _sdpa(model, tuned),
            }
            if kind == "decode" or dtype != torch.float32:
                base = bladepack.load(artifact(kind, dtype, ("cuda",), False).to_bytes(), device="cuda")
                runners["unsplit" if kind == "decode" else "cuda_cores"] = base
            for shape in shapes[:2] if quick else shapes:
                g = torch.Generator(device="cuda").manual_seed(0)
                if kind == "prefill":
                    b, h, s = shape
                    args = tuple(torch.randn(b, h, s, HEAD, generator=g, device="cuda", dtype=dtype) for _ in range(3))
                    flops = 4 * b * h * s * s * HEAD / 2  # causal: half the scores
                else:
                    b, s = shape
                    q = torch.randn(b, HEADS, 1, HEAD, generator=g, device="cuda", dtype=dtype)
                    kv = tuple(torch.randn(b, KV_HEADS, s, HEAD, generator=g, device="cuda", dtype=dtype) for _ in "kv")
                    args = (q, *kv)
                    flops = 4 * b * HEADS * s * HEAD
                bytes_read = sum(a.numel() * a.element_size() for a in args)
                with torch.no_grad():
                    ref = model(*(a.double() for a in args))
                row: dict[str, Any] = {"kind": kind, "dtype": str(dtype)[6:], "shape": list(shape)}
                for name, fn in runners.items():
                    try:
                        out = fn(*args)
                        row[f"{name}_err"] = float((out.double() - ref).abs().max() / (1 + ref.abs().max()))
                    except Exception as e:  # a backend that refuses the shape or dtype
                        row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
                best: dict[str, float] = {}
                for r in range(ROUNDS):
                    order = list(runners)[r:] + list(runners)[:r]
                    for name in order:
                        if f"{name}_error" in row:
                            continue
                        fn = runners[name]
                        t = _time_us(lambda fn=fn: fn(*args), repeat, calls=10)
                        best[name] = min(best.get(name, math.inf), t)
                for name, t in best.items():
                    row[f"{name}_us"] = t
                ours = best.get("bladepack")
                if ours:
                    row["tflops"] = flops / ours / 1e6
                    row["gbps"] = bytes_read / ours / 1e3
                    for name, t in best.items():
                        if name != "bladepack":
                            row[f"vs_{name}"] = t / ours
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def report(rows: list[dict[str, Any]], device: str) -> str:
    lines = [
        f"# Fused attention on {device}",
        "",
        "`python -m bench.gpu_attention`: µs per call (back-to-back calls, best of three rounds), SDPA's time",
        "over bladepack's (above 1: bladepack faster), error against float64 SDPA. Baseline: the same",
        "artifact without the key split (decode) or without tensor cores (float16 / bfloat16 prefill).",
        "",
        "| kind | dtype | shape | bladepack µs | TFLOP/s | GB/s | vs sdpa | vs tuned sdpa | vs baseline | error | sdpa error |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        tuned = next((k for k in r if k.startswith("vs_sdpa_")), "")
        lines.append(
            f"| {r['kind']} | {r['dtype']} | {'x'.join(map(str, r['shape']))} | {r.get('bladepack_us', 0):.1f} | "
            f"{r.get('tflops', 0):.1f} | {r.get('gbps', 0):.0f} | {r.get('vs_sdpa', 0):.2f}x | {r.get(tuned, 0):.2f}x "
            f"({tuned[8:]}) | {r.get('vs_unsplit', r.get('vs_cuda_cores', math.nan)):.2f}x | "
            f"{r.get('bladepack_err', math.nan):.1e} | "
            f"{r.get('sdpa_err', math.nan):.1e} |"
        )
    for kind in ("prefill", "decode"):
        for peer in ("vs_sdpa", "vs_sdpa_flash_attention", "vs_unsplit", "vs_cuda_cores"):
            vals = [r[peer] for r in rows if r["kind"] == kind and peer in r]
            if vals:
                geo = math.exp(sum(math.log(v) for v in vals) / len(vals))
                lines.append(f"\n{kind}, {peer[3:]}: geomean {geo:.2f}x over {len(vals)} shapes")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="two shapes per kind")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: build the artifacts, print their CUDA kernels")
    a = ap.parse_args()
    dtypes = [getattr(torch, d) for d in a.dtypes.split(",")]
    if a.dry_run:
        for dtype in dtypes:
            for kind in ("prefill", "decode"):
                for new in (True, False):
                    art = artifact(kind, dtype, ("cuda:sm_90",), new)
                    kernels = [(k.kind, [v.name for v in k.variants]) for k in art.plan.kernels if k.target == "cuda"]
                    print(kind if new else f"{kind} (baseline)", str(dtype)[6:], kernels)
        return 0
    if not torch.cuda.is_available():
        print("bench.gpu_attention needs a CUDA device (--dry-run builds the artifacts without one)")
        return 2
    device = torch.cuda.get_device_name()
    rows = measure(dtypes, a.repeat, a.quick)
    text = report(rows, device)
    save_results("gpu_attention", device, text, rows)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
