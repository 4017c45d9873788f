"""CUTLASS GEMMs of a CUDA plan: load their kernels and packer, build Params, launch.

In: the manifest's `native_cuda.gemm_kernels` (one fatbin section per kernel) and `gemm_packer` (the
host library of Note [GEMM packer] in codegen/cutlass_emitter.py), the device. Out: `CutlassGemms`,
whose `launch` runs one `cutlass` launch record: the dispatch entry the shape program chose (or the
SIMT fallback when an operand address is not aligned to the entry's vector width), the Params built by
the packer for this call's pointers, and the kernel launched with the Params as its one parameter.

Batch dims: the kernel's own batch (CUTLASS batched mode) is the innermost batch dim of the launch
record, or the middle one when the innermost is 1; a leading batch dim loops on the host. Serial
split-K slices share one semaphore buffer per stream (CUTLASS leaves it zeroed after every launch).
"""

from __future__ import annotations

import ctypes
import platform
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bladepack.artifact.format import BpkFile
from bladepack.errors import BpkFormatError
from bladepack.loader.cuda_driver import CudaError, CudaUnavailable, Device, DeviceBuffer, Function

PARAMS_CAPACITY = 4096
_ITEMSIZE = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8}
_INT_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class CutlassLaunch:
    dtype: str
    kernel: int  # the chosen dispatch entry's kernel
    split: int
    align_bytes: int
    fallback: int  # the last entry's kernel (any alignment)
    ptrs: tuple[tuple[int, int], ...]  # (slot, byte offset) of A, B, D
    ints: tuple[int, ...]  # GemmCall.ints()


class CutlassGemms:
    def __init__(self, bpk: BpkFile, plan: dict[str, Any], device: Device) -> None:
        from bladepack.loader.native_cpu import _open_library

        machine = platform.machine().lower()
        if machine not in ("x86_64", "amd64") or platform.system() != "Linux":
            raise CudaUnavailable(
                f"{bpk.source}: its CUTLASS GEMM packer is built for x86_64 Linux; this machine is "
                f"{platform.system()} {platform.machine()} (optimize with gemm_library='cublas' for it)"
            )
        self.device = device
        self.rows = list(plan["gemm_kernels"])
        self._lib = _open_library(bpk.section(plan["gemm_packer"]["section"]))
        self.pack: list[Any] = []
        self.functions: list[Function] = []
        self._modules = []
        for row in self.rows:
            try:
                fn = getattr(self._lib, f"bpk_pack_{row['name']}")
            except AttributeError as e:
                raise BpkFormatError(f"{bpk.source}: the GEMM packer has no entry for {row['name']}") from e
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
            self.pack.append(fn)
            module = device.load_module(bytes(bpk.section(row["section"])))
            self._modules.append(module)
            self.functions.append(module.function(row["name"]))
        self._local = threading.local()
        self._workspaces: dict[int, DeviceBuffer] = {}
        self._lock = threading.Lock()

    def prepare(
        self, lr: dict[str, Any], regs: Sequence[int], ptrs: tuple[tuple[int, int], ...], ints: tuple[int, ...]
    ) -> CutlassLaunch:
        entries = lr["entries"]
        chosen = next((e for e in entries if regs[e["pred"]]), None)
        if chosen is None or not entries:
            raise BpkFormatError("a CUTLASS GEMM launch has no dispatch entry for this shape (corrupt plan)")
        return CutlassLaunch(
            lr["dtype"],
            int(chosen["kernel"]),
            int(chosen["split"]),
            int(chosen["align"]) * _ITEMSIZE[lr["dtype"]],
            int(entries[-1]["kernel"]),
            ptrs,
            ints,
        )

    def _buffers(self) -> tuple[Any, Any, Any, Any, Any]:
        loc = self._local
        if not hasattr(loc, "params"):
            loc.params = (ctypes.c_uint8 * PARAMS_CAPACITY)()
            loc.geometry = (ctypes.c_int64 * 7)()
            loc.ints = (ctypes.c_int64 * 13)()
            loc.ptrs = (ctypes.c_uint64 * 5)()
            loc.scalars = (ctypes.c_double * 2)(1.0, 0.0)
        return loc.params, loc.geometry, loc.ints, loc.ptrs, loc.scalars

    def _workspace(self, nbytes: int, stream: int) -> int:
        with self._lock:
            buf = self._workspaces.get(stream)
            if buf is None or buf.nbytes < nbytes:
                if buf is not None:
                    self.device.synchronize(stream)
                    buf.free()
                buf = self._workspaces[stream] = self.device.alloc(max(nbytes, 256))
                buf.copy_from_host(bytes(buf.nbytes))
            return buf.ptr

    def launch(self, launch: CutlassLaunch, a: int, b: int, d: int, stream: int) -> None:
        """D = A.B for one launch record (A, B, D: device addresses of the operand views)."""
        ints = launch.ints
        batch, sa, sb, sc = list(ints[0:3]), list(ints[3:6]), list(ints[6:9]), list(ints[9:12])
        m, n, k, _ta, _tb, lda, ldb, ldc = ints[12:20]
        if batch[2] == 1:  # the middle batch dim as the kernel's batch
            batch = [batch[0], 1, batch[1]]
            sa, sb, sc = ([s[0], 0, s[1]] for s in (sa, sb, sc))
        if m == 0 or n == 0 or min(batch) == 0:
            return
        if max(m, n, k, batch[2]) > _INT_MAX:
            raise CudaError(f"GEMM {m}x{n}x{k} (batch {batch[2]}) exceeds CUTLASS's 32-bit problem sizes")
        kernel = launch.kernel
        if (a | b | d) % launch.align_bytes:
            kernel = launch.fallback  # an operand address is not aligned to the vector width
        size = _ITEMSIZE[launch.dtype]
        params, geometry, cin, cptrs, scalars = self._buffers()
        batched = batch[2] > 1
        split = 1 if batched else launch.split
        cin[:] = [m, n, k, batch[2] if batched else split, lda, ldb, ldc, ldc, sa[2], sb[2], sc[2], sc[2], int(batched)]
        sms = self.device.info.sm_count
        for b0 in range(batch[0]):
            for b1 in range(batch[1]):
                pa = a + (b0 * sa[0] + b1 * sa[1]) * size
                pb = b + (b0 * sb[0] + b1 * sb[1]) * size
                pd = d + (b0 * sc[0] + b1 * sc[1]) * size
                cptrs[:] = [pa, pb, pd, pd, self._workspace(0, stream) if split > 1 else 0]
                rc = self.pack[kernel](cin, cptrs, scalars, sms, params, PARAMS_CAPACITY, geometry)
                if rc == 1 and kernel != launch.fallback:  # CUTLASS refused the shape: the SIMT fallback runs any
                    kernel = launch.fallback
                    rc = self.pack[kernel](cin, cptrs, scalars, sms, params, PARAMS_CAPACITY, geometry)
                if rc == 0 and split > 1 and geometry[6] > 0:
                    cptrs[4] = self._workspace(int(geometry[6]), stream)
                    rc = self.pack[kernel](cin, cptrs, scalars, sms, params, PARAMS_CAPACITY, geometry)
                if rc != 0:
                    name = self.rows[kernel]["name"]
                    why = "cannot run this problem" if rc == 1 else "Params do not fit"
                    raise CudaError(f"CUTLASS GEMM {name}: {why} (M={m} N={n} K={k}, lda={lda} ldb={ldb} ldc={ldc})")
                self.functions[kernel].launch_packed(
                    (int(geometry[0]), int(geometry[1]), int(geometry[2])),
                    (int(geometry[3]), 1, 1),
                    ctypes.addressof(params),
                    int(geometry[5]),
                    int(geometry[4]),
                    stream,
                )

    def close(self) -> None:
        for buf in self._workspaces.values():
            buf.free()
        self._workspaces.clear()
