"""cuBLASLt through ctypes: the GEMMs of CUDA artifacts optimized with gemm_library="cublaslt".

In: the `cublaslt` launch records of a native CUDA plan (a GEMM record's ints as loader/gemm_args.py
reads them, an optional epilogue with its source operand), the device. Out: `CublasLt.prepare` (the
descriptors of one record at one signature) and `CublasLt.launch` (`cublasLtMatmul` on the caller's
stream, each host-loop step of the batch dims the library does not run itself).

Note [cuBLASLt GEMMs]: a row-major D = act(A.B + C) is the column-major D^T = act(op(B)^T . op(A)^T +
C^T), so cuBLASLt's A is our B and its B our A, with no copies, as in loader/cublas.py. The epilogue
(Note [GEMM epilogue] in passes/gemm_epilogue.py) maps onto cuBLASLt's:
- a bias row of N elements is CUBLASLT_MATMUL_DESC_BIAS_POINTER (cuBLASLt's bias has one element per
  row of its column-major D, which are our columns), batch stride 0, with EPILOGUE_BIAS, RELU_BIAS or
  GELU_BIAS;
- a residual is C with beta 1 (its own leading dim and batch stride), with EPILOGUE_DEFAULT, RELU or
  GELU: cuBLASLt computes act(alpha.A.B + beta.C + bias) in its float32 scale type, then rounds once;
- GELU is cuBLASLt's tanh form, so only `gelu(approximate="tanh")` is fused (the exact GELU and SiLU stay
  in kernels).
float16 / bfloat16 / float32 compute in float32 (CUBLAS_COMPUTE_32F: no TF32), float64 in float64.
The algorithm is cuBLASLt's heuristic's first answer for the record's shape and the operands'
alignment (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*: the heuristic otherwise assumes 256-byte aligned
operands), asked once per (shape, alignment) and kept with the descriptors (a cache of PLANS_MAX shapes,
emptied when full: a prepared signature keeps its own, and descriptors are destroyed with the last
holder); a call reads its operand addresses' alignment and asks again only for an alignment it has not
seen. Each stream has one
workspace of WORKSPACE bytes, allocated at its first cuBLASLt call and never moved (a CUDA graph that
captured a call keeps addressing it). cuBLASLt handles are thread-safe and take the stream per call;
the bias pointer is an attribute of the matmul descriptor, which records of one shape share, so a
bias GEMM sets it and enqueues under its descriptor's lock (the C++ runtime's does the same).

The library: BLADEPACK_CUBLASLT=path wins; else libcublasLt.so.* as loader/cublas.py finds libcublas.
The enum values and structure layouts below are cublasLt.h's (CUDA 12 and 13 ABI).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any

from bladepack.errors import BpkFormatError
from bladepack.loader.cublas import check_status, open_library
from bladepack.loader.cuda_driver import CudaError, Device, StreamBuffers
from bladepack.loader.gemm_args import GemmArgs
from bladepack.options import LoaderOptions

_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}  # cudaDataType
_COMPUTE_32F, _COMPUTE_64F = 68, 70  # cublasComputeType_t
_R_32F, _R_64F = 0, 1  # scale types
_OP_N, _OP_T = 0, 1
# cublasLtMatmulDescAttributes_t
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER, _DESC_BIAS_BATCH_STRIDE = 3, 4, 7, 8, 10
# cublasLtMatrixLayoutAttribute_t
_LAYOUT_BATCH_COUNT, _LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
# cublasLtMatmulPreferenceAttributes_t: workspace, then the minimum alignments of A, B, C, D
_PREF_MAX_WORKSPACE_BYTES = 1
_PREF_MIN_ALIGNMENT = (5, 6, 7, 8)
# cublasLtEpilogue_t: DEFAULT 1, RELU 2, BIAS 4, RELU_BIAS 6 (RELU | BIAS), GELU 32, GELU_BIAS 36
_DEFAULT, _BIAS = 1, 4
_ACTIVATION_CODES = {"none": 0, "relu": 2, "gelu_tanh": 32}
SOURCES = ("none", "bias", "residual")
ACTIVATIONS = tuple(_ACTIVATION_CODES)
WORKSPACE = 32 << 20  # bytes per stream (what torch gives cuBLASLt on Hopper)
_ALGO_BYTES = 64  # cublasLtMatmulAlgo_t: uint64_t data[8]
_INT_MAX = 2**31 - 1
_MAX_ALIGN = 256
PLANS_MAX = 1024  # distinct shapes whose descriptors the cache keeps (it is emptied beyond)


class _HeuristicResult(ctypes.Structure):  # cublasLtMatmulHeuristicResult_t
    _fields_ = [
        ("algo", ctypes.c_uint64 * 8),
        ("workspaceSize", ctypes.c_size_t),
        ("state", ctypes.c_int),
        ("wavesCount", ctypes.c_float),
        ("reserved", ctypes.c_int * 4),
    ]


def epilogue_code(source: str, activation: str) -> int:
    """cublasLtEpilogue_t of an epilogue (Note [cuBLASLt GEMMs]); a residual source is C, not a code."""
    return (_ACTIVATION_CODES[activation] | (_BIAS if source == "bias" else 0)) or _DEFAULT


def alignment(address: int) -> int:
    """The largest power of two up to 256 that divides `address` (256 for 0)."""
    return min(address & -address, _MAX_ALIGN) if address else _MAX_ALIGN


@dataclass
class LtLaunch:
    """One `cublaslt` record at one signature: its descriptors (made once per distinct shape and
    epilogue, shared by every record that has them) and the host loop's byte offsets."""

    plan: _LtPlan
    steps: tuple[tuple[int, int, int, int], ...]
    step_bits: int  # every step offset OR-ed: with the addresses, the operands' alignment


class _LtPlan:
    """The descriptors of one shape and epilogue, destroyed when nothing holds them any more (the plan
    cache, or a prepared signature's launches)."""

    def __init__(self, lib: Any, source: str, wide: bool) -> None:
        self._lib = lib
        self.desc = 0
        self.layouts: list[int] = []  # cuBLASLt's A (our B), B (our A), C, D
        self.source, self.wide = source, wide
        self.algos: dict[int, Any] = {}  # operand alignment -> the heuristic's algorithm (its bytes)
        self.lock = threading.Lock()  # a bias GEMM's pointer attribute

    def __del__(self) -> None:
        for layout in self.layouts:
            self._lib.cublasLtMatrixLayoutDestroy(layout)
        if self.desc:
            self._lib.cublasLtMatmulDescDestroy(self.desc)


class CublasLt:
    """One cuBLASLt handle, the descriptors of every prepared shape and each stream's workspace."""

    def __init__(self, device: Device, options: LoaderOptions) -> None:
        """`options.cublaslt` names the library (else the nvidia wheels', the system's, `cuda_home`/lib64)."""
        lib, self.path = open_library(
            "libcublasLt", options.cublaslt, options.cuda_home, "cuBLASLt", "BLADEPACK_CUBLASLT"
        )
        self._lib = lib
        p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
        signatures: dict[str, list[Any]] = {
            "cublasLtCreate": [ctypes.POINTER(p)],
            "cublasLtDestroy": [p],
            "cublasLtMatmulDescCreate": [ctypes.POINTER(p), i, i],
            "cublasLtMatmulDescSetAttribute": [p, i, p, sz],
            "cublasLtMatmulDescDestroy": [p],
            "cublasLtMatrixLayoutCreate": [ctypes.POINTER(p), i, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
            "cublasLtMatrixLayoutSetAttribute": [p, i, p, sz],
            "cublasLtMatrixLayoutDestroy": [p],
            "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(p)],
            "cublasLtMatmulPreferenceSetAttribute": [p, i, p, sz],
            "cublasLtMatmulPreferenceDestroy": [p],
            "cublasLtMatmulAlgoGetHeuristic": [
                p,
                p,
                p,
                p,
                p,
                p,
                p,
                i,
                ctypes.POINTER(_HeuristicResult),
                ctypes.POINTER(i),
            ],
            "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, p, p, sz, p],
        }
        missing = [name for name in signatures if not hasattr(lib, name)]
        if missing:
            raise CudaError(f"{self.path} lacks {', '.join(missing)} (not a cuBLASLt library)")
        for name, args in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        handle = ctypes.c_void_p()
        check_status(lib.cublasLtCreate(ctypes.byref(handle)), "cublasLtCreate")
        self._handle = handle
        self._matmul = lib.cublasLtMatmul
        self._plans: dict[tuple[Any, ...], _LtPlan] = {}
        self._plans_lock = threading.Lock()
        self._workspaces = StreamBuffers(device, WORKSPACE)
        self._one32, self._zero32 = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._one64, self._zero64 = ctypes.c_double(1.0), ctypes.c_double(0.0)

    def close(self) -> None:
        """Drop the plan cache (descriptors go with the last prepared signature holding them), destroy the
        handle, free the workspaces (the streams must be idle)."""
        self._plans.clear()
        self._workspaces.free()
        if self._handle:
            self._lib.cublasLtDestroy(self._handle)
            self._handle = ctypes.c_void_p()

    # -- per signature
    def prepare(self, lr: dict[str, Any], args: GemmArgs) -> LtLaunch:
        """The launch of record `lr` (`dtype`, `epilogue`, `ptrs`) with its ints resolved to `args`."""
        epilogue = lr.get("epilogue") or {"source": "none", "activation": "none"}
        source, activation = epilogue.get("source"), epilogue.get("activation")
        if source not in SOURCES or activation not in ACTIVATIONS:
            raise BpkFormatError(f"a cuBLASLt GEMM has epilogue {epilogue!r} (corrupt plan)")
        if (source != "none") != (len(lr["ptrs"]) == 4):
            raise BpkFormatError("a cuBLASLt GEMM's operands do not match its epilogue source (corrupt plan)")
        g = args
        if max(g.m, g.n, g.k, g.batch) > _INT_MAX:
            raise CudaError(f"GEMM {g.m}x{g.n}x{g.k} (batch {g.batch}) exceeds cuBLASLt's 32-bit sizes")
        key = (lr["dtype"], source, activation, *g[:-1])
        plan = self._plans.get(key)
        if plan is None:
            with self._plans_lock:
                plan = self._plans.get(key)
                if plan is None:
                    if len(self._plans) >= PLANS_MAX:  # a bound across shapes; prepared signatures keep theirs
                        self._plans.clear()
                    plan = self._plans[key] = self._plan(lr["dtype"], source, activation, g)
        bits = 0
        for step in g.steps:
            for offset in step:
                bits |= offset
        return LtLaunch(plan, g.steps, bits)

    def _plan(self, dtype: str, source: str, activation: str, g: GemmArgs) -> _LtPlan:
        lib = self._lib
        wide = dtype == "float64"
        plan = _LtPlan(lib, source, wide)  # (what a failing call below leaves is destroyed with it)
        desc = ctypes.c_void_p()
        check_status(
            lib.cublasLtMatmulDescCreate(
                ctypes.byref(desc), _COMPUTE_64F if wide else _COMPUTE_32F, _R_64F if wide else _R_32F
            ),
            "cublasLtMatmulDescCreate",
        )
        plan.desc = desc.value or 0

        def attr(name: int, value: Any) -> None:
            check_status(
                lib.cublasLtMatmulDescSetAttribute(desc, name, ctypes.byref(value), ctypes.sizeof(value)),
                "cublasLtMatmulDescSetAttribute",
            )

        attr(_DESC_TRANSA, ctypes.c_int32(_OP_T if g.tb else _OP_N))
        attr(_DESC_TRANSB, ctypes.c_int32(_OP_T if g.ta else _OP_N))
        attr(_DESC_EPILOGUE, ctypes.c_uint32(epilogue_code(source, activation)))
        if source == "bias":
            attr(_DESC_BIAS_BATCH_STRIDE, ctypes.c_int64(0))
        t = _TYPES[dtype]
        shapes = (
            ((g.k, g.n) if g.tb else (g.n, g.k), g.ldb, g.stride_b),  # cuBLASLt's A: our B, as stored
            ((g.m, g.k) if g.ta else (g.k, g.m), g.lda, g.stride_a),  # its B: our A
            ((g.n, g.m), g.ld_src, g.stride_src) if source == "residual" else ((g.n, g.m), g.ldc, g.stride_c),
            ((g.n, g.m), g.ldc, g.stride_c),
        )
        for (rows, cols), ld, stride in shapes:
            layout = ctypes.c_void_p()
            check_status(
                lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), t, rows, cols, ld),
                "cublasLtMatrixLayoutCreate",
            )
            plan.layouts.append(layout.value or 0)
            for name, value in (
                (_LAYOUT_BATCH_COUNT, ctypes.c_int32(g.batch)),
                (_LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(stride)),
            ):
                check_status(
                    lib.cublasLtMatrixLayoutSetAttribute(layout, name, ctypes.byref(value), ctypes.sizeof(value)),
                    "cublasLtMatrixLayoutSetAttribute",
                )
        return plan

    def _algo(self, plan: _LtPlan, align: int) -> Any:
        """cuBLASLt's heuristic's first algorithm for `plan` with operands aligned to `align` bytes."""
        got = plan.algos.get(align)
        if got is not None:
            return got
        lib = self._lib
        pref = ctypes.c_void_p()
        check_status(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        try:
            settings: list[tuple[int, Any]] = [(_PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(WORKSPACE))]
            settings += [(name, ctypes.c_uint32(align)) for name in _PREF_MIN_ALIGNMENT]
            for name, value in settings:
                check_status(
                    lib.cublasLtMatmulPreferenceSetAttribute(pref, name, ctypes.byref(value), ctypes.sizeof(value)),
                    "cublasLtMatmulPreferenceSetAttribute",
                )
            result = _HeuristicResult()
            count = ctypes.c_int(0)
            a, b, c, d = plan.layouts
            status = lib.cublasLtMatmulAlgoGetHeuristic(
                self._handle, plan.desc, a, b, c, d, pref, 1, ctypes.byref(result), ctypes.byref(count)
            )
        finally:
            lib.cublasLtMatmulPreferenceDestroy(pref)
        if status != 0 or count.value < 1 or result.state != 0:
            raise CudaError(
                f"cuBLASLt has no algorithm for this GEMM (epilogue {plan.source}, operands aligned to {align} "
                f"bytes): cublasLtMatmulAlgoGetHeuristic returned status {status}, {count.value} results"
            )
        if result.workspaceSize > WORKSPACE:
            raise CudaError(f"cuBLASLt asked for {result.workspaceSize} bytes of workspace; it was offered {WORKSPACE}")
        algo = plan.algos[align] = (ctypes.c_uint8 * _ALGO_BYTES).from_buffer_copy(bytes(result.algo))
        return algo

    # -- per call
    def launch(
        self,
        launch: LtLaunch,
        a: int,
        b: int,
        d: int,
        src: int | None,
        stream: int,
        workspace_stream: int | None = None,
    ) -> None:
        """D = act(A.B [+ C]) (A, B, D, C: the operand views' device addresses; C None without an
        epilogue source); the workspace is `workspace_stream`'s (default `stream`)."""
        if not launch.steps:
            return
        plan = launch.plan
        algo = self._algo(plan, alignment(a | b | d | (src or 0) | launch.step_bits))
        workspace = self._workspaces.get(WORKSPACE, stream if workspace_stream is None else workspace_stream)
        one, zero = (self._one64, self._zero64) if plan.wide else (self._one32, self._zero32)
        residual = plan.source == "residual"
        beta = one if residual else zero
        a_lt, b_lt, c_lt, d_lt = plan.layouts
        for da, db, dd, dc in launch.steps:
            c_ptr = src + dc if residual and src is not None else d + dd
            args = (self._handle, plan.desc, ctypes.byref(one), b + db, a_lt, a + da, b_lt, ctypes.byref(beta))
            rest = (c_ptr, c_lt, d + dd, d_lt, algo, workspace, WORKSPACE, stream)
            if plan.source != "bias" or src is None:
                check_status(self._matmul(*args, *rest), "cublasLtMatmul")
                continue
            bias = ctypes.c_uint64(src + dc)
            with plan.lock:
                check_status(
                    self._lib.cublasLtMatmulDescSetAttribute(plan.desc, _DESC_BIAS_POINTER, ctypes.byref(bias), 8),
                    "cublasLtMatmulDescSetAttribute",
                )
                check_status(self._matmul(*args, *rest), "cublasLtMatmul")
