"""Profiling-based GEMM selection: time the candidate CUTLASS configs on the GPU present at optimize time.

In: a `GemmCall`, the options `select` weighs (config, split-K slices) and bindings of the shape
symbols. Out: microseconds per (binding, option) — `select` then chooses configs and dispatch
intervals from these instead of the cost model's estimates (Note [GEMM cost model]).

Note [GEMM profiling]: with BLADEPACK_GEMM_TUNING=auto (the default) a CUDA plan's CUTLASS GEMMs are
profiled when optimize runs where a CUDA device answers, "profile" requires one, "model" never
profiles. Candidates are built exactly like the packaged kernels (same emitter, same nvcc cache, with
the "none" epilogue: every config pays the same for an activation) and launched through the loader's
own path (packer Params, driver launch, split-K semaphores) on scratch operands as large as the
largest binding needs; each (binding, option) runs once to warm up, then `repeat` times between two
CUDA events, and the mean counts. An option CUTLASS refuses for a shape counts as never fastest. Times
are kept per (dtype, layout, option, concrete problem), so GEMMs repeated across layers, and lowering
retries, are timed once. The Hopper table (Note [GEMM config space]) is profiled only on a GPU of
compute capability 9.0, where its sm_90a candidates run; elsewhere the cost model chooses it. The GPU that profiled is recorded with each GEMM (`tuned_on`), since its SM
count and clocks shaped the choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import sympy

from bladepack.codegen.cuda_toolchain import find_nvcc
from bladepack.library_ops.cpu_gemm import GemmCall
from bladepack.library_ops.cutlass.configs import GemmConfig
from bladepack.library_ops.cutlass.emitter import GemmInstance
from bladepack.library_ops.cutlass.select import Option
from bladepack.library_ops.cutlass.toolchain import build_gemms
from bladepack.loader.cuda_driver import CudaError, Device, DeviceBuffer
from bladepack.loader.cutlass_gemm import CutlassGemms, CutlassLaunch
from bladepack.loader.gemm_args import GemmArgs, gemm_args
from bladepack.options import CompileOptions, LoaderOptions

REPEAT = 5


def _span(rows: int, cols: int, ld: int, g: GemmArgs, stride: int, step_bytes: int, itemsize: int) -> int:
    """Bytes an operand view covers: its last host-loop step, last library batch, last row and column."""
    if rows == 0 or cols == 0:
        return 0
    return step_bytes + ((g.batch - 1) * stride + (rows - 1) * ld + cols) * itemsize


class GemmProfiler:
    """`select`'s `measure` on one device; kernels and scratch buffers are kept across GEMMs."""

    def __init__(self, device: Device, options: CompileOptions, repeat: int = REPEAT) -> None:
        """`options`: where the candidates are built (cache, nvcc, CUTLASS headers, nvcc jobs)."""
        self.device, self.options, self.repeat = device, options, repeat
        self._kernels: dict[tuple[tuple[GemmConfig, ...], bool, bool], CutlassGemms] = {}
        self._scratch: list[DeviceBuffer | None] = [None, None, None]
        self._times: dict[tuple[Option, bool, bool, tuple[int, ...]], float] = {}  # the option fixes the dtype

    def close(self) -> None:
        """Free the scratch buffers, unload the candidates and release the device."""
        for buf in self._scratch:
            if buf is not None:
                buf.free()
        self._scratch = [None, None, None]
        for gemms in self._kernels.values():
            gemms.close()
        self._kernels.clear()
        self.device.close()

    def _gemms(self, configs: tuple[GemmConfig, ...], ta: bool, tb: bool) -> CutlassGemms:
        key = (configs, ta, tb)
        if key not in self._kernels:
            instances = [GemmInstance(c, ta, tb) for c in configs]
            o = self.options
            nvcc = find_nvcc(o.nvcc, o.cuda_home)
            images, packer = build_gemms(instances, o.cache_dir, nvcc, o.nvcc_jobs, o.cutlass_path)
            kernels = [(i.name, images[i.name], i.arch) for i in instances]
            loader = LoaderOptions(cache_dir=o.cache_dir, hopper_gemms=o.hopper_gemms)
            self._kernels[key] = CutlassGemms(self.device, packer, kernels, "the GEMM profiler", loader)
        return self._kernels[key]

    def _buffer(self, k: int, nbytes: int) -> int:
        buf = self._scratch[k]
        if buf is None or buf.nbytes < nbytes:
            if buf is not None:
                buf.free()
            buf = self._scratch[k] = self.device.alloc(max(nbytes, 256))
            buf.copy_from_host(bytes(buf.nbytes))  # zeros: no denormals or NaNs to slow anything down
        return buf.ptr

    def __call__(
        self, call: GemmCall, options: Sequence[Option], bindings: Sequence[Mapping[sympy.Symbol, int]]
    ) -> list[list[float]]:
        configs = tuple(dict.fromkeys(o.config for o in options))
        itemsize = call.dtype.itemsize
        times = []
        for b in bindings:
            ints = tuple(int(sympy.sympify(e).subs(b)) for e in call.ints())
            keys = [(o, call.ta, call.tb, ints) for o in options]
            if all(k in self._times for k in keys):
                times.append([self._times[k] for k in keys])
                continue
            gemms = self._gemms(configs, call.ta, call.tb)
            g = gemm_args(ints, itemsize)
            last = g.steps[-1] if g.steps else (0, 0, 0, 0)
            a_rows, a_cols = (g.k, g.m) if g.ta else (g.m, g.k)
            b_rows, b_cols = (g.n, g.k) if g.tb else (g.k, g.n)
            a = self._buffer(0, _span(a_rows, a_cols, g.lda, g, g.stride_a, last[0], itemsize))
            bb = self._buffer(1, _span(b_rows, b_cols, g.ldb, g, g.stride_b, last[1], itemsize))
            d = self._buffer(2, _span(g.m, g.n, g.ldc, g, g.stride_c, last[2], itemsize))
            row = []
            for o in options:
                entry = {"kernel": configs.index(o.config), "split": o.split, "pred": 0, "align": o.config.align}
                launch = gemms.prepare({"dtype": call.dtype.value, "entries": [entry]}, [1], ((0, 0),) * 3, ints)
                try:
                    gemms.launch(launch, a, bb, d, None, 0)  # warm-up (and CUTLASS's own checks)

                    def timed(launch: CutlassLaunch = launch) -> None:
                        for _ in range(self.repeat):
                            gemms.launch(launch, a, bb, d, None, 0)

                    row.append(self.device.elapsed_ms(timed) * 1000.0 / self.repeat)
                except CudaError:
                    row.append(math.inf)  # CUTLASS cannot run this option at this shape
            self._times.update(zip(keys, row))
            times.append(row)
        return times
