"""How far each CPU kernel family runs from the machine's FMA peak, per ISA library level.

In: this CPU. Out: a markdown table (printed; bench/results/peak_<cpu>.{md,json}): the measured
float32 FMA peak per ISA level (AVX2 at x86-64-v3, AVX-512 at x86-64-v4) and thread count, then each
kernel family's GFLOP/s and its fraction of that level's peak at the same thread count:
- dense layers (Linear + ReLU on constant weights: the generated dense kernels, Note [Dense layers];
  over 512 KB on column panels, Note [Dense weight panels]) at 64 to 1024 rows;
- channels-last 3x3 convolutions (Conv2d + ReLU, the generated direct convolution) at 64 and 256
  channels, and the same by Winograd's F(2x2, 3x3) (Note [Winograd convolutions], what optimize
  builds for them by default), counted in the direct convolution's FLOPs: 4 of its 9 multiply-adds
  per output are done, so its figure may pass the peak;
- dense layers whose K is split into pieces (Note [Dense K pieces]: 8192 -> 512);
- GEMMs that are not dense layers: a weight another op reads too (a language model's head tied to its
  embedding table: BLAS or the small-M kernel) and an activation x activation batched matmul
  (attention's shape);
- a MobileNet inverted residual (16 -> 64 channels 1x1, 3x3 depthwise, 64 -> 16 1x1 with the residual,
  each with a batch norm and activation) on a channels-last map: each of its three convolution kernels
  timed on its own by the loader's per-launch profile (short K and depthwise work, where the FMA peak is
  not the only limit).
The peak is a loop of independent FMA chains (enough to cover the FMA latency on both FMA pipes,
several registers' worth per chain set), built with the level's -march and run on 1 and on every
allowed core at once; a family's figure is whole calls of the loaded artifact (launch cost included),
the best of several blocks. The ISA level is the kernel library built and loaded (an AVX-512 machine
runs the x86-64-v3 library too, so both levels' figures come from one machine).

    python -m bench.peak [--isas x86-64-v3,x86-64-v4] [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from bench.cpp_runtime import machine
from bench.dense_layers import _Layer
from bladepack.codegen.toolchain import X86_LEVELS, find_compiler, host_level
from samples.zoo import InvertedResidual

RESULTS = Path(__file__).resolve().parent / "results"

# Per level: the vector type, its float lanes, the FMA intrinsic and the chains (independent
# accumulators: FMA latency 4 x 2 pipes = 8 at least; 12 of AVX2's 16 registers, 24 of AVX-512's 32).
_PEAK_KERNELS = {
    "x86-64-v3": ("__m256", 8, "_mm256_fmadd_ps", "_mm256_set1_ps", 12),
    "x86-64-v4": ("__m512", 16, "_mm512_fmadd_ps", "_mm512_set1_ps", 24),
}

_PEAK_SOURCE = """
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <thread>
#include <vector>
#include <chrono>

// Runs `iters` rounds of CHAINS independent FMAs on `threads` threads; returns the seconds taken and
// writes a sum so the compiler keeps the work.
static float run_one(int64_t iters, float seed) {
  VEC acc[CHAINS];
  for (int j = 0; j < CHAINS; ++j) acc[j] = SET1(seed + j);
  const VEC a = SET1(0.999999f), b = SET1(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 64
    for (int j = 0; j < CHAINS; ++j) acc[j] = FMA(acc[j], a, b);
  }
  float out[LANES], s = 0;
  for (int j = 0; j < CHAINS; ++j) {
    memcpy(out, &acc[j], sizeof(out));
    s += out[0];
  }
  return s;
}

extern "C" double bpk_peak(int64_t iters, int threads, float* sink) {
  std::vector<std::thread> pool;
  std::vector<float> sums(threads);
  auto t0 = std::chrono::steady_clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { sums[t] = run_one(iters, 1.0f + t); });
  for (auto& th : pool) th.join();
  auto t1 = std::chrono::steady_clock::now();
  for (float s : sums) *sink += s;
  return std::chrono::duration<double>(t1 - t0).count();
}
"""


def peak_gflops(isa: str, threads: int, quick: bool = False) -> float:
    """The float32 FMA peak of this CPU at `isa` on `threads` threads, GFLOP/s (best of 5)."""
    vec, lanes, fma, set1, chains = _PEAK_KERNELS[isa]
    level = next(lv for lv in X86_LEVELS if lv.name == isa)
    cxx = find_compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found")
    with tempfile.TemporaryDirectory() as d:
        src, lib = Path(d) / "peak.cc", Path(d) / "peak.so"
        src.write_text(
            f"#define VEC {vec}\n#define LANES {lanes}\n#define FMA {fma}\n#define SET1 {set1}\n"
            f"#define CHAINS {chains}\n" + _PEAK_SOURCE
        )
        subprocess.run(
            [cxx, "-O2", *level.flags, "-shared", "-fPIC", "-pthread", str(src), "-o", str(lib)],
            check=True,
            capture_output=True,
        )
        so = ctypes.CDLL(str(lib))
        so.bpk_peak.restype = ctypes.c_double
        so.bpk_peak.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_float)]
        sink = ctypes.c_float(0)
        iters = 2_000_000 if quick else 20_000_000
        so.bpk_peak(iters // 10, threads, ctypes.byref(sink))  # warm (clocks up)
        best = min(so.bpk_peak(iters, threads, ctypes.byref(sink)) for _ in range(5))
    return threads * iters * chains * lanes * 2 / best / 1e9


class _Conv(torch.nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


class _Tied(torch.nn.Module):
    """A head sharing its [8000, 512] weight with an embedding lookup: the product stays a GEMM."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(8000, 512)

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x @ self.emb.weight.T, self.emb(ids)


class _Inverted(torch.nn.Module):
    """MobileNetV2's inverted residual at 16 channels, expansion 4 (samples/zoo.py's, as the zoo's
    MobileNet has it), after a stem that makes the chain channels-last."""

    def __init__(self) -> None:
        super().__init__()
        n = torch.nn
        self.stem = n.Sequential(n.Conv2d(3, 16, 3, padding=1), n.BatchNorm2d(16), n.Hardswish())
        self.block = InvertedResidual(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.stem(x))


INVERTED_CONVS = ("stem", "1x1 expansion", "3x3 depthwise", "1x1 projection")  # _Inverted's, in order


def _conv_launch_us(m: Any, x: np.ndarray, quick: bool) -> dict[str, float]:
    """Per convolution kernel of `_Inverted` (INVERTED_CONVS, in launch order; the block's three share
    one source line), the best over rounds of its per-launch median wall time (µs) in the profile. Each
    round starts after a pause (the worker threads of the BLAS GEMMs measured before spin a while, and
    took a core from these kernels: the x86-64-v3 rows measured 26-65% of the peak where a run alone
    measured 40-85%) and repeats the call for at least 0.1 s."""
    best = {name: float("inf") for name in INVERTED_CONVS}
    t = time.perf_counter()
    m(x)
    repeat = max(20, int(0.1 / max(time.perf_counter() - t, 1e-6)))
    for _ in range(2 if quick else 5):
        time.sleep(0.2)
        convs = [row for row in m.profile(x, repeat=repeat) if row["what"].endswith(" conv")]
        if len(convs) != len(INVERTED_CONVS):
            raise RuntimeError(f"expected {len(INVERTED_CONVS)} convolution kernels, found {convs}")
        for name, row in zip(INVERTED_CONVS, convs):
            best[name] = min(best[name], row["us"])
    return best


class _Bmm(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b


def _loaded(
    model: torch.nn.Module, samples: list[tuple[torch.Tensor, ...]], dims: Any, isa: str, winograd: bool = True
) -> Any:
    options = bladepack.CompileOptions.from_env(cpu_isas=isa, quiet=True, winograd=winograd)
    art = bladepack.optimize(model.eval(), samples, dims, reference_cases=False, options=options)
    return bladepack.load(art.to_bytes(), options=bladepack.LoaderOptions.from_env(cpu_isa=isa))


def _best_call_s(fn: Callable[[], Any], quick: bool) -> float:
    """The best block median of whole calls, blocks of at least 0.1 s (Note [Rounds] in bench/README.md)."""
    for _ in range(3):
        fn()
    t = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t, 1e-6)
    per_block = max(5, int(0.1 / one))
    best = float("inf")
    for _ in range(2 if quick else 5):
        ts = []
        for _ in range(per_block):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        best = min(best, statistics.median(ts))
    return best


def families(isa: str, quick: bool) -> list[dict[str, Any]]:
    """Each kernel family's whole-call GFLOP/s at this ISA level (every allowed core)."""
    rows: list[dict[str, Any]] = []
    r = bladepack.Dim("rows", 1, 4096)
    for k, n in ((256, 256), (512, 256), (256, 1024), (1024, 1024), (768, 3072), (8192, 512)):
        m = _loaded(_Layer(k, n), [(torch.randn(2, k),), (torch.randn(5, k),)], {"x": {0: r}}, isa)
        family = "dense layer" if k * n * 4 <= 512 * 1024 else "dense layer, panels"
        family += ", K pieces" if k > 4096 else ""
        for rows_ in (16, 64, 255, 1024) if k * n >= 1 << 20 else (64, 255, 1024):
            x = np.random.default_rng(0).standard_normal((rows_, k), dtype=np.float32)
            s = _best_call_s(lambda m=m, x=x: m.run([x]), quick)
            rows.append({"family": family, "shape": f"{rows_} x {k} -> {n}", "gflops": 2 * rows_ * k * n / s / 1e9})
    side = bladepack.Dim("side", 8, 64)
    for winograd in (False, True):
        family = "3x3 convolution, Winograd (direct FLOPs)" if winograd else "3x3 convolution"
        for c in (64, 256):
            samples = [(torch.randn(1, c, 16, 16),), (torch.randn(1, c, 20, 20),)]
            conv = _loaded(_Conv(c), samples, {"x": {2: side, 3: side}}, isa, winograd)
            for hw in (28, 56):
                x = np.random.default_rng(0).standard_normal((1, c, hw, hw), dtype=np.float32)
                s = _best_call_s(lambda m=conv, x=x: m.run([x]), quick)
                flops = 2 * hw * hw * c * c * 9
                rows.append({"family": family, "shape": f"{c} ch, {hw} x {hw}", "gflops": flops / s / 1e9})
    ids = bladepack.Dim("ids", 1, 64)
    tied = _loaded(
        _Tied(),
        [(torch.randn(2, 512), torch.tensor([1, 2])), (torch.randn(5, 512), torch.tensor([3]))],
        ({0: r}, {0: ids}),
        isa,
    )
    for rows_ in (16, 256):
        x = np.random.default_rng(0).standard_normal((rows_, 512), dtype=np.float32)
        one = np.array([7], dtype=np.int64)
        s = _best_call_s(lambda x=x: tied.run([x, one]), quick)
        rows.append(
            {
                "family": "GEMM, tied head weight",
                "shape": f"{rows_} x 512 -> 8000",
                "gflops": 2 * rows_ * 512 * 8000 / s / 1e9,
            }
        )
    t = bladepack.Dim("t", 1, 512)
    bmm = _loaded(
        _Bmm(),
        [(torch.randn(4, 9, 64), torch.randn(4, 64, 9)), (torch.randn(4, 17, 64), torch.randn(4, 64, 17))],
        ({1: t}, {2: t}),
        isa,
    )
    for n in (128, 512):
        a = np.random.default_rng(0).standard_normal((4, n, 64), dtype=np.float32)
        b = np.random.default_rng(1).standard_normal((4, 64, n), dtype=np.float32)
        s = _best_call_s(lambda a=a, b=b: bmm.run([a, b]), quick)
        rows.append(
            {"family": "activation GEMM", "shape": f"4 x {n} x 64 x {n}", "gflops": 2 * 4 * n * 64 * n / s / 1e9}
        )
    side = bladepack.Dim("side", 8, 128)
    batch = bladepack.Dim("batch", 1, 16)
    inverted = _loaded(
        _Inverted(),
        [(torch.randn(2, 3, 16, 16),), (torch.randn(1, 3, 20, 24),)],
        {"x": {0: batch, 2: side, 3: side}},
        isa,
    )
    macs = {"1x1 expansion": 16 * 64, "3x3 depthwise": 64 * 9, "1x1 projection": 64 * 16}  # per pixel
    for n, hw in ((1, 56), (8, 48)):
        x = np.random.default_rng(0).standard_normal((n, 3, hw, hw), dtype=np.float32)
        us = _conv_launch_us(inverted, x, quick)
        for name, per_pixel in macs.items():
            rows.append(
                {
                    "family": f"inverted residual, {name} (launch)",
                    "shape": f"{n} x 64 ch, {hw} x {hw}",
                    "gflops": 2 * n * hw * hw * per_pixel / us[name] / 1e3,
                }
            )
    return rows


def _blas_core() -> str:
    """numpy's OpenBLAS and the kernels it chose (OPENBLAS_CORETYPE in the environment forces them)."""
    from bladepack.loader.native_cpu import find_blas

    found = find_blas()
    if found is None:
        return "none"
    lib = ctypes.CDLL(found.source)
    for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            core = (fn() or b"?").decode()
            forced = os.environ.get("OPENBLAS_CORETYPE")
            return f"OpenBLAS, {core} kernels" + (f" (OPENBLAS_CORETYPE={forced} in the environment)" if forced else "")
    return Path(found.source).name


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", name.split(",")[0]).strip("_")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--isas", default=None, help="comma-separated ISA levels (default: x86-64-v3 and this CPU's)")
    ap.add_argument("--quick", action="store_true", help="shorter runs (a smoke test)")
    a = ap.parse_args()
    host = host_level(list(X86_LEVELS))
    names = [lv.name for lv in X86_LEVELS]
    top = names.index(host.name) if host else -1
    isas = a.isas.split(",") if a.isas else [lv for lv in ("x86-64-v3", "x86-64-v4") if names.index(lv) <= top]
    threads = len(os.sched_getaffinity(0))
    blas = _blas_core()
    result: dict[str, Any] = {"machine": machine(), "threads": threads, "blas": blas, "levels": {}}
    lines = [
        "# Kernel families against the FMA peak (`python -m bench.peak`)",
        "",
        f"Machine: {result['machine']}; float32; whole calls of the loaded artifact on {threads} threads; "
        f"BLAS: {blas}.",
        "",
    ]
    for isa in isas:
        peak1, peak_all = peak_gflops(isa, 1, a.quick), peak_gflops(isa, threads, a.quick)
        rows = families(isa, a.quick)
        for r in rows:
            r["of_peak"] = r["gflops"] / peak_all
        result["levels"][isa] = {"peak_1_thread": peak1, f"peak_{threads}_threads": peak_all, "families": rows}
        lines += [
            f"## {isa}",
            "",
            f"FMA peak: {peak1:.0f} GFLOP/s on 1 thread, {peak_all:.0f} on {threads}.",
            "",
            "| family | shape | GFLOP/s | of peak |",
            "|---|---|---:|---:|",
            *(f"| {r['family']} | {r['shape']} | {r['gflops']:.1f} | {r['of_peak']:.0%} |" for r in rows),
            "",
        ]
        print("\n".join(lines[-(len(rows) + 6) :]), flush=True)
    if not a.quick:
        RESULTS.mkdir(exist_ok=True)
        stem = f"peak_{_slug(result['machine'])}"
        (RESULTS / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
        (RESULTS / f"{stem}.md").write_text("\n".join(lines))


if __name__ == "__main__":
    main()
