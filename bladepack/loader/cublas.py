"""cuBLAS through ctypes: the GEMMs of CUDA artifacts (until CUTLASS kernels serve them).

In: the GEMM launch records of a native CUDA plan (GemmCall's ints: three batch dims with strides, m,
n, k, transposes, leading dims; row-major operands, as the CPU executor's `bpk::gemm_batched`). Out:
`Cublas.gemm` — `cublasGemmStridedBatchedEx` over the innermost batch dim (the outer two loop on the
host), float16 / bfloat16 / float32 computing in float32 and float64 in float64, on the caller's stream.

The library: BLADEPACK_CUBLAS=path wins; else libcublas.so.* from the nvidia-cublas wheels next to this
Python (torch's CUDA builds bring them); else the system's (ctypes.util / CUDA_HOME / /usr/local/cuda).
Row-major C = A.B is computed as column-major C^T = B^T.A^T, so no copies are made.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from bladepack.loader.cuda_driver import CudaError, CudaUnavailable
from bladepack.loader.gemm_args import GemmArgs
from bladepack.options import LoaderOptions

_TYPES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 14}  # cudaDataType
_COMPUTE_32F, _COMPUTE_64F = 68, 70  # cublasComputeType_t
_OP_N, _OP_T = 0, 1
_GEMM_DEFAULT = -1
_INT_MAX = 2**31 - 1


def library_candidates(stem: str, chosen: str | None, cuda_home: str | None) -> Iterator[str]:
    """Where `stem` (libcublas, libcublasLt) is looked for: `chosen` alone when set; else the nvidia
    wheels next to this Python, the system's, then `cuda_home`/lib64 and /usr/local/cuda/lib64."""
    if chosen:
        yield chosen
        return
    for root in sys.path:
        for lib in sorted(glob.glob(os.path.join(root, "nvidia", "cu*", "lib", f"{stem}.so*"))):
            yield lib
        for lib in sorted(glob.glob(os.path.join(root, "nvidia", "cublas", "lib", f"{stem}.so*"))):
            yield lib
    found = ctypes.util.find_library(stem[3:])
    if found:
        yield found
    for home in (cuda_home, "/usr/local/cuda"):
        if home:
            yield from sorted(glob.glob(str(Path(home) / "lib64" / f"{stem}.so*")))


def open_library(stem: str, chosen: str | None, cuda_home: str | None, what: str, knob: str) -> tuple[ctypes.CDLL, str]:
    """The first of `library_candidates` that loads, and its path; CudaUnavailable naming what was
    tried otherwise (`what`: the sentence's subject, `knob`: the variable that names the library)."""
    tried = []
    for path in library_candidates(stem, chosen, cuda_home):
        tried.append(path)
        try:
            return ctypes.CDLL(path), path
        except OSError:
            continue
    raise CudaUnavailable(
        f"this artifact runs its GEMMs with {what}, and no {stem} was found "
        f"(tried: {', '.join(tried) or 'nothing'}); install nvidia-cublas or set {knob}=path"
    )


def check_status(status: int, call: str) -> None:
    """A cublasStatus_t (cuBLAS's and cuBLASLt's) that is not success, as a CudaError naming the call."""
    if status != 0:
        raise CudaError(f"{call} failed: cublasStatus_t {status}")


class Cublas:
    """One cuBLAS handle on the current device's primary context. Its stream is set per call, so a call
    sets it and enqueues under one lock (ctypes releases the GIL: two threads' calls on different
    streams could otherwise interleave, one thread's GEMM landing on the other's stream, out of order
    with its own kernels — the C++ runtime's Cublas takes the same lock)."""

    def __init__(self, options: LoaderOptions) -> None:
        """`options.cublas` names the library (else the nvidia wheels', the system's, `cuda_home`/lib64)."""
        lib, self.path = open_library("libcublas", options.cublas, options.cuda_home, "cuBLAS", "BLADEPACK_CUBLAS")
        self._lib = lib
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        lib.cublasSetStream_v2.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        lib.cublasDestroy_v2.argtypes = [ctypes.c_void_p]
        i, ll, p = ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p
        lib.cublasGemmStridedBatchedEx.argtypes = [
            *(p, i, i, i, i, i, p),
            *(p, i, i, ll),
            *(p, i, i, ll),
            p,
            *(p, i, i, ll),
            *(i, i, i),
        ]
        handle = ctypes.c_void_p()
        check_status(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        self._handle = handle
        self._lock = threading.Lock()
        self._stream: int | None = None  # the handle's stream, set last (under the lock)
        self._one32, self._zero32 = ctypes.c_float(1.0), ctypes.c_float(0.0)
        self._one64, self._zero64 = ctypes.c_double(1.0), ctypes.c_double(0.0)

    def close(self) -> None:
        if self._handle:
            self._lib.cublasDestroy_v2(self._handle)
            self._handle = ctypes.c_void_p()

    def gemm(self, dtype: str, a: int, b: int, c: int, args: GemmArgs, stream: int) -> None:
        """C = A.B for one GEMM launch record (A, B, C: the operand views' device addresses)."""
        if max(args.m, args.n, args.k, args.lda, args.ldb, args.ldc, args.batch) > _INT_MAX:
            raise CudaError(f"GEMM {args.m}x{args.n}x{args.k} exceeds cuBLAS's 32-bit sizes")
        if not args.steps:
            return
        with self._lock:
            if stream != self._stream:
                self._stream = None  # (unknown until the call succeeds)
                check_status(self._lib.cublasSetStream_v2(self._handle, ctypes.c_void_p(stream)), "cublasSetStream")
                self._stream = stream
            self._enqueue(dtype, a, b, c, args)

    def _enqueue(self, dtype: str, a: int, b: int, c: int, args: GemmArgs) -> None:
        t = _TYPES[dtype]
        wide = dtype == "float64"
        one, zero = (self._one64, self._zero64) if wide else (self._one32, self._zero32)
        for da, db, dc, _ in args.steps:
            # column-major C^T (n x m) = op(B)^T . op(A)^T
            check_status(
                self._lib.cublasGemmStridedBatchedEx(
                    self._handle,
                    _OP_T if args.tb else _OP_N,
                    _OP_T if args.ta else _OP_N,
                    args.n,
                    args.m,
                    args.k,
                    ctypes.byref(one),
                    b + db,
                    t,
                    args.ldb,
                    args.stride_b,
                    a + da,
                    t,
                    args.lda,
                    args.stride_a,
                    ctypes.byref(zero),
                    c + dc,
                    t,
                    args.ldc,
                    args.stride_c,
                    args.batch,
                    _COMPUTE_64F if wide else _COMPUTE_32F,
                    _GEMM_DEFAULT,
                ),
                "cublasGemmStridedBatchedEx",
            )
