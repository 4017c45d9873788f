"""The CUDA backend: generated CUDA kernels as cubins per architecture and PTX; cuBLAS, cuBLASLt or CUTLASS GEMMs.

In: kernel specs of the fusion plan; the lowered plan's translation unit and CUTLASS instances. Out:
CUDA C kernels (codegen/cuda_emitter.py) with their launch geometry, the images nvcc builds
(codegen/cuda_toolchain.py) and the CUTLASS GEMM kernels with their Params packer
(library_ops/cutlass/toolchain.py), all cached by content; no GPU is needed. Where a GPU answers,
CUTLASS configs are chosen by profiling on it (Note [GEMM profiling] in library_ops/cutlass/profile.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from typing import Any

from bladepack.backends.base import Backend, Built, Sources, Variant
from bladepack.backends.cpu import DTYPES, GEMM_DTYPES
from bladepack.codegen.cuda_emitter import CudaKernel, emit_cuda_kernel
from bladepack.codegen.cuda_grid_reduce import grid_root, grid_split
from bladepack.codegen.cuda_toolchain import build_images, cuda_source, find_nvcc, hopper_gemms, nvcc_version
from bladepack.codegen.kernel import KernelContext
from bladepack.dtypes import DType
from bladepack.ir import Node
from bladepack.ir.fusion_plan import CUBLASLT_FORMS, CUTLASS_ACTIVATIONS, Attention, EpilogueForms, KernelSpec
from bladepack.ir.types import TensorType
from bladepack.ir.views import View
from bladepack.library_ops.cuda_attention import HEAD_MAX as ATTENTION_HEAD_MAX
from bladepack.library_ops.cuda_attention import attention_plans, combine_plans, key_split
from bladepack.library_ops.cutlass.configs import VERIFIED_DTYPES
from bladepack.library_ops.cutlass.select import GemmPolicy
from bladepack.options import CompileOptions
from bladepack.progress import Progress
from bladepack.target import Capabilities, Target

# Note [Online softmax on CUDA]: float32 / float64, and the 16-bit floats accumulated in float32
ATTENTION_DTYPES = frozenset({DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16})


class CudaBackend(Backend):
    caps = Capabilities(
        kind="cuda",
        title="CUDA",
        dtypes=DTYPES,
        gemm_dtypes=GEMM_DTYPES,
        gemm_title="cuBLAS",
        conv_epilogues=False,  # the direct kernel stores plainly
        attention_dtypes=ATTENTION_DTYPES,
        attention_head_max=ATTENTION_HEAD_MAX,
        conv_input_views=False,
        host_arena=False,
        operand_programs=True,
    )
    source_suffix = "cu"

    def gemm_epilogues(self, policy: GemmPolicy) -> EpilogueForms | None:
        if policy.library == "cutlass":
            return EpilogueForms(policy.dtypes, CUTLASS_ACTIVATIONS)
        return CUBLASLT_FORMS if policy.library == "cublaslt" else None

    def gemm_policy(
        self, policy: GemmPolicy, target: Target, options: CompileOptions, notes: list[str]
    ) -> tuple[GemmPolicy, Any]:
        """With CUTLASS: the Hopper table when the images asked for include sm_90a, the dtypes CUTLASS
        serves, and a profiler on the CUDA device present here (returned too: the caller closes it),
        else the cost model."""
        if policy.library != "cutlass":
            return policy, None
        hopper = hopper_gemms(target.cuda_images, options.cuda_arches)
        dtypes = VERIFIED_DTYPES | ({DType.FLOAT32, DType.FLOAT64} if options.cutlass_unverified else set())
        policy = dataclasses.replace(policy, hopper=hopper, dtypes=frozenset(dtypes))
        if options.gemm_tuning == "model":
            return policy, None
        from bladepack.loader.cuda_driver import CudaUnavailable, Device

        try:
            device = Device(0)
        except CudaUnavailable as e:
            if options.gemm_tuning == "profile":
                raise CudaUnavailable(f"BLADEPACK_GEMM_TUNING=profile needs a CUDA device here: {e}") from e
            return policy, None
        from bladepack.library_ops.cutlass.profile import GemmProfiler

        profiler = GemmProfiler(device, options)
        notes.append(f"CUTLASS configs chosen by profiling on {device.info.name} ({device.info.arch})")
        on_hopper = hopper and device.info.compute_capability == (9, 0) and options.hopper_gemms
        policy = dataclasses.replace(policy, measure=profiler, tuned_on=device.info.name, measure_hopper=on_hopper)
        return policy, profiler

    def emit(
        self,
        spec: KernelSpec,
        ctx: KernelContext,
        index: int,
        conv: tuple[Node, View] | None,
        attention: Attention | None,
    ) -> CudaKernel:
        if attention is None:
            return emit_cuda_kernel(spec, ctx, index, conv)
        if spec.kind == "attention_combine":
            return emit_cuda_kernel(spec, ctx, index, library=combine_plans(attention, ctx, spec.reads[0]))
        workspace = spec.roots[1] if len(spec.roots) > 1 else None
        return emit_cuda_kernel(spec, ctx, index, library=attention_plans(attention, ctx, workspace))

    def split_attention(self, att: Attention, ctx: KernelContext) -> tuple[TensorType, Any] | None:
        split = key_split(att, ctx)
        return None if split is None else (split.workspace, split.when)

    def split_reduction(self, spec: KernelSpec, ctx: KernelContext) -> tuple[TensorType, Any] | None:
        n = grid_root(spec, ctx)
        split = None if n is None else grid_split(n, ctx)
        return None if split is None else (split.workspace, split.when)

    def variants(self, kernel: Any) -> Sequence[Variant]:
        return [Variant(v.name, v.pred, v.grid, v.block, v.smem) for v in kernel.variants]

    def source(self, kernels: Sequence[Any], gemm_dtypes: Collection[str]) -> str:
        return cuda_source(kernels)

    def build(
        self, sources: Sources, target: Target, options: CompileOptions, progress: Progress, notes: list[str]
    ) -> Built:
        """Cubins and PTX for the kernels, then the CUTLASS GEMMs and their packer."""
        built = Built()
        if not sources.unit:
            return built
        nvcc = find_nvcc(options.nvcc, options.cuda_home)
        images = build_images(
            sources.unit, options.cache_dir, nvcc, target.cuda_images, options.nvcc_jobs, options.cuda_arches
        )
        progress.done(f"CUDA kernels: {', '.join(sorted(images))}")
        built.fields["cuda_images"] = images
        if images:
            built.producer["nvcc"] = nvcc_version(nvcc)
        if sources.gemm_instances:
            from bladepack.library_ops.cutlass.toolchain import build_gemms

            gemm_images, packer = build_gemms(
                sources.gemm_instances, options.cache_dir, nvcc, options.nvcc_jobs, options.cutlass_path
            )
            progress.done(f"CUTLASS GEMMs: {len(gemm_images)} kernels")
            built.fields.update(gemm_images=gemm_images, gemm_packer=packer)
        return built
