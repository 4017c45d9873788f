"""The CPU backend: generated C++ kernels in one shared library per x86-64 ISA level, BLAS GEMMs.

In: kernel specs of the fusion plan; the lowered plan's translation unit. Out: C++ kernels (codegen/
cpu_emitter.py, the fused attention's variants from library_ops/cpu_attention.py) and the compiled
libraries the artifact carries (codegen/toolchain.py), cached by content.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from bladepack.backends.base import Backend, Built, Sources, Variant
from bladepack.codegen.cpu_emitter import emit_kernel
from bladepack.codegen.cpu_library import library_source
from bladepack.codegen.kernel import EmittedKernel, KernelContext
from bladepack.codegen.toolchain import build_libraries, compiler_version, find_compiler
from bladepack.dtypes import DType
from bladepack.ir import Node
from bladepack.ir.fusion_plan import Attention, KernelSpec
from bladepack.ir.views import View
from bladepack.library_ops.cpu_attention import attention_variants
from bladepack.library_ops.cutlass.select import GemmPolicy
from bladepack.options import CompileOptions
from bladepack.progress import Progress
from bladepack.target import Capabilities, Target

log = logging.getLogger("bladepack")

DTYPES = frozenset(
    {
        DType.FLOAT32,
        DType.FLOAT64,
        DType.FLOAT16,
        DType.BFLOAT16,
        DType.INT64,
        DType.INT32,
        DType.INT16,
        DType.INT8,
        DType.UINT8,
        DType.BOOL,
    }
)
GEMM_DTYPES = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)


class CpuBackend(Backend):
    # 16-bit floats stored 16-bit, computed in float registers (Note [16-bit floats on CPU] in
    # codegen/cpu_runtime.h); their GEMMs widen to float32 BLAS (Note [16-bit GEMMs] in codegen/cpu_gemm.h)
    caps = Capabilities(
        kind="cpu",
        title="CPU",
        dtypes=DTYPES,
        gemm_dtypes=GEMM_DTYPES,
        gemm_title="BLAS",
        conv_epilogues=True,
        attention_dtypes=frozenset({DType.FLOAT32, DType.FLOAT64}),
        attention_head_max=1 << 30,  # head dims are compile-time array sizes: no limit of their own
        conv_input_views=True,
        host_arena=True,
        operand_programs=False,  # the library checks its own (Note [Kernel operand checks])
        layout_passes=frozenset({"winograd_conv", "channels_last", "dense_layers", "pack_linear"}),
    )
    source_suffix = "cc"

    def gemm_library(self, policy: GemmPolicy) -> str:
        return "blas"

    def emit(
        self,
        spec: KernelSpec,
        ctx: KernelContext,
        index: int,
        conv: tuple[Node, View] | None,
        attention: Attention | None,
    ) -> EmittedKernel:
        return emit_kernel(spec, ctx, conv, None if attention is None else attention_variants(attention, ctx))

    def variants(self, kernel: Any) -> Sequence[Variant]:
        return [Variant(name, pred) for name, pred in kernel.variants]

    def source(self, kernels: Sequence[Any], gemm_dtypes: Collection[str]) -> str:
        return library_source(kernels, gemm_dtypes)

    def build(
        self, sources: Sources, target: Target, options: CompileOptions, progress: Progress, notes: list[str]
    ) -> Built:
        """One kernel library per ISA level; without a compiler, a warning and the reference executor
        (the artifact still runs everywhere, only slower)."""
        if not sources.unit or not options.native:
            return Built()
        cxx = find_compiler(options.cxx)
        if cxx is None:
            msg = "no C++ compiler found (set CXX or install g++): the artifact runs on the reference executor"
            log.warning("bladepack: %s", msg)
            notes.append(msg)
            return Built()
        libs = build_libraries(sources.unit, options.cache_dir, cxx, options.cpu_isas, progress.done)
        libraries = [(lib.isa.name, lib.isa.requires, lib.data) for lib in libs]
        return Built({"cpu_libraries": libraries}, {"cxx": compiler_version(cxx)} if libraries else {})
