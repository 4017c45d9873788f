"""CUDA C++ for CUTLASS GEMM instances: one device translation unit per kernel, one host packer.

In: `GemmInstance`s — a config (library_ops/cutlass_configs.py) with the operand layouts of the GEMM
that uses it and its epilogue activation. Out: the kernel source (an `extern "C" __global__` entry
named after the instance, so the loader finds it with cuModuleGetFunction) and the packer source.

Note [GEMM packer]: a CUTLASS kernel takes one `Params` struct that only CUTLASS's host code can build
(it precomputes iterator strides, the tiled grid, the swizzle). The packer is a small host library,
built with nvcc from the same headers and template arguments, exporting per instance

    int bpk_pack_<instance>(const int64_t* in, const uint64_t* ptrs, const double* scalars, int32_t sms,
                            void* params, int64_t capacity, int64_t* geometry)

in = {M, N, K, batch count or split-K slices, lda, ldb, ldc, ldd, batch strides of A, B, C, D (elements),
batched (1) or serial split-K (0)}; ptrs = {A, B, C, D, split-K semaphores}; scalars = {alpha, beta}.
It writes the Params bytes and geometry = {grid x, y, z, block threads, dynamic shared memory bytes,
Params bytes, semaphore bytes} and returns 0, or 1 when CUTLASS cannot run the problem (alignment),
2 when `capacity` is too small. It needs neither libcuda nor libcudart, so the loader calls it through
ctypes (the C++ runtime through dlsym) and launches the cubin's kernel with the Params as its single
parameter. D = act(alpha * A.B + beta * C); C may be D's bias row (ldc 0) or a residual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bladepack.dtypes import DType
from bladepack.library_ops.cutlass_configs import GemmConfig

ACTIVATIONS = {
    "none": "cutlass::epilogue::thread::LinearCombination",
    "relu": "cutlass::epilogue::thread::LinearCombinationRelu",
    "gelu": "cutlass::epilogue::thread::LinearCombinationGELU",
    "silu": "cutlass::epilogue::thread::LinearCombinationSilu",
}
_ELEMENT = {
    DType.FLOAT16: "cutlass::half_t",
    DType.BFLOAT16: "cutlass::bfloat16_t",
    DType.FLOAT32: "float",
    DType.FLOAT64: "double",
}
_MATH = {
    "tensorop": ("cutlass::arch::OpClassTensorOp", "cutlass::arch::OpMultiplyAdd"),
    "tensorop_3xtf32": ("cutlass::arch::OpClassTensorOp", "cutlass::arch::OpMultiplyAddFastF32"),
    "simt": ("cutlass::arch::OpClassSimt", "cutlass::arch::OpMultiplyAdd"),
}
SWIZZLE = 4  # threadblock rasterization: groups of 4 tile columns share B tiles in L2

_HEADERS = """#include <cstdint>
#include <cstring>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/epilogue/thread/linear_combination_relu.h>
#include <cutlass/epilogue/thread/linear_combination_gelu.h>
#include <cutlass/epilogue/thread/linear_combination_silu.h>
"""


@dataclass(frozen=True)
class GemmInstance:
    config: GemmConfig
    ta: bool  # A is stored [K, M] (column-major M x K)
    tb: bool  # B is stored [N, K]
    activation: str = "none"

    @property
    def name(self) -> str:
        return f"bpk_gemm_{self.config.name}_{'t' if self.ta else 'n'}{'t' if self.tb else 'n'}_{self.activation}"


def _types(inst: GemmInstance) -> str:
    """`namespace <name>_t { using Kernel = ...; }`: the CUTLASS kernel type of an instance."""
    cfg = inst.config
    el = _ELEMENT[cfg.dtype]
    acc = _ELEMENT[cfg.accumulator]
    op_class, operator = _MATH[cfg.math]
    row, col = "cutlass::layout::RowMajor", "cutlass::layout::ColumnMajor"
    shape = "cutlass::gemm::GemmShape<{}, {}, {}>"
    epilogue = f"{ACTIVATIONS[inst.activation]}<{el}, {cfg.align}, {acc}, {acc}>"
    return "\n".join(
        [
            f"namespace {inst.name}_t {{",
            "using Gemm = cutlass::gemm::device::GemmUniversal<",
            f"    {el}, {col if inst.ta else row}, {el}, {col if inst.tb else row}, {el}, {row}, {acc},",
            f"    {op_class}, cutlass::arch::Sm80,",
            f"    {shape.format(*cfg.tile)}, {shape.format(*cfg.warp)}, {shape.format(*cfg.inst)},",
            f"    {epilogue},",
            f"    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{SWIZZLE}>, {cfg.stages},",
            f"    {cfg.align}, {cfg.align}, {operator}>;",
            "using Kernel = Gemm::GemmKernel;",
            "}",
        ]
    )


def kernel_source(inst: GemmInstance) -> str:
    """The device translation unit of one instance."""
    n = inst.name
    return "\n".join(
        [
            _HEADERS,
            _types(inst),
            f'extern "C" __global__ void __launch_bounds__({n}_t::Kernel::kThreadCount, 1) {n}({n}_t::Kernel::Params params) {{',
            "  extern __shared__ int bpk_smem[];",
            f"  {n}_t::Kernel::invoke(params, *reinterpret_cast<{n}_t::Kernel::SharedStorage*>(bpk_smem));",
            "}",
            "",
        ]
    )


def _pack_function(inst: GemmInstance) -> str:
    n = inst.name
    acc = _ELEMENT[inst.config.accumulator]
    return f"""
extern "C" int bpk_pack_{n}(const int64_t* in, const uint64_t* ptrs, const double* scalars, int32_t sms,
                           void* out, int64_t capacity, int64_t* geometry) {{
  using K = {n}_t::Kernel;
  const {acc} alpha = {acc}(scalars[0]), beta = {acc}(scalars[1]);
  typename K::EpilogueOutputOp::Params epilogue(alpha, beta);
  typename K::Arguments args(
      in[12] ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm,
      cutlass::gemm::GemmCoord(int(in[0]), int(in[1]), int(in[2])), int(in[3]), epilogue,
      reinterpret_cast<const void*>(uintptr_t(ptrs[0])), reinterpret_cast<const void*>(uintptr_t(ptrs[1])),
      reinterpret_cast<const void*>(uintptr_t(ptrs[2])), reinterpret_cast<void*>(uintptr_t(ptrs[3])),
      in[8], in[9], in[10], in[11], in[4], in[5], in[6], in[7]);
  if (K::can_implement(args) != cutlass::Status::kSuccess) return 1;
  typename K::Params params(args, sms, 1);
  params.semaphore = reinterpret_cast<int*>(uintptr_t(ptrs[4]));
  if (int64_t(sizeof(params)) > capacity) return 2;
  std::memcpy(out, &params, sizeof(params));
  const dim3 grid = params.get_grid_dims();
  geometry[0] = grid.x;
  geometry[1] = grid.y;
  geometry[2] = grid.z;
  geometry[3] = K::kThreadCount;
  geometry[4] = int64_t(sizeof(typename K::SharedStorage));
  geometry[5] = int64_t(sizeof(params));
  geometry[6] = int64_t(params.get_workspace_size());
  return 0;
}}
"""


def packer_source(instances: Sequence[GemmInstance]) -> str:
    """The host translation unit with the pack function of every instance (Note [GEMM packer])."""
    parts = [_HEADERS]
    for inst in instances:
        parts.append(_types(inst))
        parts.append(_pack_function(inst))
    return "\n".join(parts)
