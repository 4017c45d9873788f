"""CUDA C++ for CUTLASS GEMM instances: one device translation unit per kernel, one host packer.

In: `GemmInstance`s — a config (library_ops/cutlass/configs.py) with the operand layouts of the GEMM
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
parameter. D = act(alpha * A.B + beta * C); C may be D's bias row (ldc 0) or a residual. geometry
has three more words for sm90 instances' thread-block cluster (1, 1, 1 otherwise), and the return code
3 says a TMA descriptor could not be encoded.

Note [Hopper GEMMs]: an sm90 instance is a CUTLASS 3.x `GemmUniversal` assembled by the collective
builders (TMA warp-specialized mainloop with the config's tile, cluster and schedule; TMA
warp-specialized epilogue with an epilogue-visitor fusion) and compiled for sm_90a alone. Its
epilogue is fixed at compile time, so the instance names its source: "none" (no C is read),
"residual" (C in D's layout, beta 1) or "bias" (a per-column bias vector, `LinCombPerColBiasEltAct`,
C not read; TMA cannot describe a stride-0 row). Its Params embed TMA descriptors for A, B, C and D,
which only the driver's `cuTensorMapEncodeTiled` encodes: the packer defines that symbol itself
(CUTLASS calls it directly under CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL) and forwards it to the
function the loader hands `bpk_set_tensor_map_encoder` (found with cuGetProcAddress), so the packer
still links no CUDA library; the descriptors depend on the addresses, so every launch packs anew
(microseconds). The grid is persistent (at most one CTA per SM, a multiple of the cluster), computed
from the SM count the loader passes; a cluster of more than one CTA is launched with cuLaunchKernelEx.
Unbatched problems get the matrix size as their batch stride (TMA takes no zero stride); a batched
one with a zero batch stride (a broadcast operand) is refused (1), and so is serial split-K.

On an NVIDIA H200 (2026-11-26, driver 580.159.04, nvcc 13.0.88, CUTLASS 4.2.0) every sm90 instance
faulted at its first launch ("illegal instruction" or "unspecified launch failure"; compute-sanitizer:
the producer's first mbarrier arrive before its first TMA load). The cause, found on an H100 with
scripts/hopper_probe.py, was the launch: the loaders passed the Params as a packed parameter buffer
(CU_LAUNCH_PARAM_BUFFER_POINTER), and a `__grid_constant__` parameter must go through kernelParams.
The probe ran each step in its own process on one ping-pong (cluster 1) and one cooperative (cluster
2) config: CUTLASS's own adapter ran; CUTLASS's device_kernel ran with the packer's Params; our cubin
ran with CUTLASS's Params through kernelParams and faulted through the buffer. The loaders now launch
sm_90a kernels through kernelParams (Note [Grid-constant parameters] in loader/cuda_driver.py). With
that, on the H100, every sm90 float16 config, the first bfloat16 one and the [K, N] B layout matched
torch at M 1 to 16384 (bench/cutlass_gemm.py's check_each_config, through the Python loader).

Not yet measured on a GPU: the sm90 instances with an epilogue source (bias, residual) or activation,
the C++ runtime's launch of them (checked only on the fake driver, call for call against the Python
loader), and their speed against the sm80 configs and cuBLAS: tests/test_cutlass_hopper.py's
test_hopper_gemms_on_a_real_gpu and bench/cutlass_gemm.py under the switch measure them, and
scripts/gpu_checks.sh runs both. Until then the sm_90a image is built
only when a target names it (`cuda:sm_90a`, BLADEPACK_CUDA_ARCHES), and the loaders dispatch
`entries_sm90` only with BLADEPACK_HOPPER_GEMMS=1 (else the sm80 table runs on 9.0 as on any other GPU,
and the profiler does not time sm90 candidates).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bladepack.dtypes import DType
from bladepack.library_ops.cutlass.configs import GemmConfig

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
_HOPPER_ACTIVATIONS = {
    "none": "cutlass::epilogue::thread::Identity",
    "relu": "cutlass::epilogue::thread::ReLu",
    "gelu": "cutlass::epilogue::thread::GELU",
    "silu": "cutlass::epilogue::thread::SiLu",
}
_HOPPER_SCHEDULES = {
    "cooperative": (
        "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
        "cutlass::epilogue::TmaWarpSpecializedCooperative",
    ),
    "pingpong": ("cutlass::gemm::KernelTmaWarpSpecializedPingpong", "cutlass::epilogue::TmaWarpSpecialized"),
}

_HEADERS = """#include <cstdint>
#include <cstring>
#include <cutlass/cutlass.h>
#include <cutlass/gemm/device/gemm_universal.h>
#include <cutlass/epilogue/thread/linear_combination.h>
#include <cutlass/epilogue/thread/linear_combination_relu.h>
#include <cutlass/epilogue/thread/linear_combination_gelu.h>
#include <cutlass/epilogue/thread/linear_combination_silu.h>
"""
_HOPPER_HEADERS = """#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>
#include <cutlass/epilogue/thread/activation.h>
"""
# Note [Hopper GEMMs]: the packer's own cuTensorMapEncodeTiled, forwarding to the driver's
_TMA_SHIM = """#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1
#include <cuda.h>
typedef CUresult (*bpk_encode_fn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static bpk_encode_fn bpk_encode = nullptr;
static thread_local int bpk_encode_failed = 0;
extern "C" void bpk_set_tensor_map_encoder(void* fn) { bpk_encode = reinterpret_cast<bpk_encode_fn>(fn); }
extern "C" CUresult CUDAAPI cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank,
    void* address, const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
    const cuuint32_t* element_strides, CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle,
    CUtensorMapL2promotion l2, CUtensorMapFloatOOBfill fill) {
  const CUresult r = bpk_encode ? bpk_encode(map, type, rank, address, dims, strides, box, element_strides,
                                             interleave, swizzle, l2, fill)
                                : CUDA_ERROR_NOT_INITIALIZED;
  if (r != CUDA_SUCCESS) bpk_encode_failed = 1;
  return r;
}
"""
_STRIDE_HELPER = """// a (rows x cols x batch) CuTe stride: `ld` on the dynamic one of the first two modes; an unbatched
// problem's batch stride is the matrix size (TMA takes no zero stride)
template <class S>
S bpk_stride(int64_t ld, int64_t batch, int64_t extent0, int64_t extent1, bool batched) {
  S s{};
  int64_t outer;
  if constexpr (cute::is_static_v<cute::remove_cvref_t<decltype(cute::get<0>(s))>>) {
    cute::get<1>(s) = ld;
    outer = extent1;
  } else {
    cute::get<0>(s) = ld;
    outer = extent0;
  }
  cute::get<2>(s) = batched ? batch : ld * outer;
  return s;
}
"""


@dataclass(frozen=True)
class GemmInstance:
    config: GemmConfig
    ta: bool  # A is stored [K, M] (column-major M x K)
    tb: bool  # B is stored [N, K]
    activation: str = "none"
    source: str = "none"  # sm90 only (Note [Hopper GEMMs]); an sm80 kernel takes any C at run time

    @property
    def name(self) -> str:
        base = f"bpk_gemm_{self.config.name}_{'t' if self.ta else 'n'}{'t' if self.tb else 'n'}_{self.activation}"
        return f"{base}_{self.source}" if self.hopper else base

    @property
    def hopper(self) -> bool:
        return self.config.arch == "sm90"

    @property
    def arch(self) -> str:
        """The kernel image's arch as the manifest names it: "sm_80" (sm_80 / sm_90 cubins and PTX, any
        GPU) or "sm_90a" (compute capability 9.0 only)."""
        return "sm_90a" if self.hopper else "sm_80"


def _hopper_types(inst: GemmInstance) -> str:
    """Note [Hopper GEMMs]: the CUTLASS 3.x kernel type of an sm90 instance."""
    cfg = inst.config
    el = _ELEMENT[cfg.dtype]
    row, col = "cutlass::layout::RowMajor", "cutlass::layout::ColumnMajor"
    c_el = el if inst.source == "residual" else "void"
    act = _HOPPER_ACTIVATIONS[inst.activation]
    if inst.source == "bias":
        fusion = f"cutlass::epilogue::fusion::LinCombPerColBiasEltAct<{act}, {el}, float, {el}, {c_el}, float>"
    else:
        fusion = f"cutlass::epilogue::fusion::LinCombEltAct<{act}, {el}, float, {c_el}, float>"
    mainloop_schedule, epilogue_schedule = _HOPPER_SCHEDULES[cfg.schedule]
    tile = "cute::Shape<cute::_{}, cute::_{}, cute::_{}>".format(*cfg.tile)
    cluster = "cute::Shape<cute::_{}, cute::_{}, cute::_{}>".format(*cfg.cluster)
    a = cfg.align
    return "\n".join(
        [
            f"namespace {inst.name}_t {{",
            f"using Element = {el};",
            f"using Tile = {tile};",
            f"using Cluster = {cluster};",
            "using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<",
            "    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Tile, Cluster,",
            "    cutlass::epilogue::collective::EpilogueTileAuto, float, float,",
            f"    {c_el}, {row}, {a}, {el}, {row}, {a}, {epilogue_schedule},",
            f"    {fusion}>::CollectiveOp;",
            "using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<",
            "    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp,",
            f"    {el}, {col if inst.ta else row}, {a}, {el}, {col if inst.tb else row}, {a}, float, Tile, Cluster,",
            "    cutlass::gemm::collective::StageCountAutoCarveout<",
            "        static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,",
            f"    {mainloop_schedule}>::CollectiveOp;",
            "using Kernel = cutlass::gemm::kernel::GemmUniversal<cute::Shape<int, int, int, int>, Mainloop, Epilogue>;",
            "}",
        ]
    )


def _types(inst: GemmInstance) -> str:
    """`namespace <name>_t { using Kernel = ...; }`: the CUTLASS kernel type of an instance."""
    if inst.hopper:
        return _hopper_types(inst)
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
    if inst.hopper:  # Params hold TMA descriptors: they must stay in parameter space (__grid_constant__)
        return "\n".join(
            [
                _HEADERS + _HOPPER_HEADERS,
                _types(inst),
                f'extern "C" __global__ void __launch_bounds__({n}_t::Kernel::MaxThreadsPerBlock, '
                f"{n}_t::Kernel::MinBlocksPerMultiprocessor)",
                f"{n}(CUTLASS_GRID_CONSTANT {n}_t::Kernel::Params const params) {{",
                "  extern __shared__ char bpk_smem[];",
                f"  {n}_t::Kernel op;",
                "  op(params, bpk_smem);",
                "}",
                "",
            ]
        )
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
  geometry[7] = geometry[8] = geometry[9] = 1;
  return 0;
}}
"""


def _hopper_pack_function(inst: GemmInstance) -> str:
    """Note [Hopper GEMMs]: Arguments from the packer's words, Params through CUTLASS (TMA descriptors)."""
    n = inst.name
    ptr = "reinterpret_cast<E{}*>(uintptr_t(ptrs[{}]))"
    lines = [
        f'extern "C" int bpk_pack_{n}(const int64_t* in, const uint64_t* ptrs, const double* scalars, int32_t sms,',
        "                           void* out, int64_t capacity, int64_t* geometry) {",
        f"  using K = {n}_t::Kernel;",
        f"  using E = {n}_t::Element;",
        "  const bool batched = in[12] != 0;",
        "  if (!batched && in[3] > 1) return 1;  // serial split-K: the sm80 kernels run it",
        "  if (batched && (in[8] == 0 || in[9] == 0 || in[11] == 0)) return 1;  // a broadcast operand",
        "  const int64_t m = in[0], n = in[1], k = in[2];",
        f"  const int64_t align = {inst.config.align};  // TMA: 16-byte strides (the dispatch predicates ensure it)",
        f"  if ((in[4] | in[5] | in[7] | {'in[6]' if inst.source == 'residual' else '0'}) % align) return 1;",
        "  if (batched && (in[8] | in[9] | in[10] | in[11]) % align) return 1;",
        "  if (!bpk_encode) return 3;  // the loader has not handed over the driver's encoder",
        "  typename K::Arguments args{};",
        "  args.mode = batched ? cutlass::gemm::GemmUniversalMode::kBatched : cutlass::gemm::GemmUniversalMode::kGemm;",
        "  args.problem_shape = {int(m), int(n), int(k), batched ? int(in[3]) : 1};",
        f"  args.mainloop.ptr_A = {ptr.format(' const', 0)};",
        "  args.mainloop.dA = bpk_stride<typename K::StrideA>(in[4], in[8], m, k, batched);",
        f"  args.mainloop.ptr_B = {ptr.format(' const', 1)};",
        "  args.mainloop.dB = bpk_stride<typename K::StrideB>(in[5], in[9], n, k, batched);",
        "  args.epilogue.thread.alpha = float(scalars[0]);",
    ]
    if inst.source == "residual":
        lines += [
            "  args.epilogue.thread.beta = float(scalars[1]);",
            f"  args.epilogue.ptr_C = {ptr.format(' const', 2)};",
            "  if (batched && in[10] == 0) return 1;",
            "  args.epilogue.dC = bpk_stride<typename K::StrideC>(in[6], in[10], m, n, batched);",
        ]
    elif inst.source == "bias":
        lines.append(f"  args.epilogue.thread.bias_ptr = {ptr.format(' const', 2)};")
    lines += [
        f"  args.epilogue.ptr_D = {ptr.format('', 3)};",
        "  args.epilogue.dD = bpk_stride<typename K::StrideD>(in[7], in[11], m, n, batched);",
        "  args.hw_info.device_id = 0;",
        "  args.hw_info.sm_count = sms;",
        "  if (!K::can_implement(args) || K::get_workspace_size(args) != 0) return 1;",
        "  bpk_encode_failed = 0;",
        "  typename K::Params params = K::to_underlying_arguments(args, nullptr);",
        "  if (bpk_encode_failed) return 3;",
        "  if (int64_t(sizeof(params)) > capacity) return 2;",
        "  std::memcpy(out, &params, sizeof(params));",
        "  const dim3 grid = K::get_grid_shape(params);",
        "  geometry[0] = grid.x;",
        "  geometry[1] = grid.y;",
        "  geometry[2] = grid.z;",
        "  geometry[3] = K::MaxThreadsPerBlock;",
        "  geometry[4] = K::SharedStorageSize;",
        "  geometry[5] = int64_t(sizeof(params));",
        "  geometry[6] = 0;",
        f"  geometry[7] = {inst.config.cluster[0]};",
        f"  geometry[8] = {inst.config.cluster[1]};",
        f"  geometry[9] = {inst.config.cluster[2]};",
        "  return 0;",
        "}",
        "",
    ]
    return "\n".join(lines)


def packer_source(instances: Sequence[GemmInstance]) -> str:
    """The host translation unit with the pack function of every instance (Note [GEMM packer])."""
    hopper = any(i.hopper for i in instances)
    parts = [_TMA_SHIM, _HEADERS, _HOPPER_HEADERS, _STRIDE_HELPER] if hopper else [_HEADERS]
    for inst in instances:
        parts.append(_types(inst))
        parts.append(_hopper_pack_function(inst) if inst.hopper else _pack_function(inst))
    return "\n".join(parts)
