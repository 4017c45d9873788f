"""The CUDA executor: runs an artifact's native CUDA plan through the driver API (cuda-python only).

In: the manifest's `native_cuda` plan (launch records in the CPU plan's format; kernel variants carry
grid / block / shared-memory registers), the artifact (cubin / PTX sections), the raw weight sections
and a device ordinal. Out: `NativeCuda` — the image for this GPU (Note [Kernel images] in
cuda_driver.py) loaded into the device's primary context (the one torch uses), the weights on the
device, and the run of a signature's `CudaPrepared` (made by cuda_prepare.py): every launch's function,
geometry and its parameter words (Note [CUDA kernel ABI] in codegen/cuda_emitter.py) with the pointer
words left as (slot, byte offset) to be filled per call in one vectorized step.

Per call (`run`): pointer words = slot base + offset (slots: 0 the device arena, then inputs, outputs,
weights — Note [Slots] in lowering/lower_native.py); kernels launch on the caller's stream; GEMMs go
to cuBLAS, cuBLASLt (with their epilogues: Note [cuBLASLt GEMMs] in cublaslt.py) or CUTLASS on that
stream; a reference step (an op without a CUDA kernel) synchronizes, copies its
operands to the host, runs the numpy reference and copies the result back. Kernels that can report
an error (data-dependent indices) write the stream's status words, which every call copies to
page-locked host memory at its end (Note [Device errors] in cuda_module.py); `strict` resets them per
call and makes the call wait for them instead.

Nothing is compiled at load or run time: the artifact carries cubins for sm_80 / 86 / 89 / 90 and
PTX (compute_90) that the driver compiles for newer GPUs.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from bladepack.artifact.format import BpkFile
from bladepack.errors import BpkFormatError
from bladepack.loader.cublaslt import CublasLt, LtLaunch
from bladepack.loader.cuda_driver import (
    SMALLEST_CLASS,
    CudaError,
    Device,
    DeviceBuffer,
    StreamBuffers,
    _check,
    choose_image,
)
from bladepack.loader.cutlass_gemm import CutlassGemms, CutlassLaunch
from bladepack.loader.gemm_args import GemmArgs
from bladepack.loader.launch_words import KernelParams
from bladepack.options import LoaderOptions

ABI_VERSION = 1
KERNEL_SHIFT = 24  # Note [CUDA error codes] in codegen/cuda_loops.py
_ALIGN = 256  # weights and arena buffers start on 256-byte boundaries


class KernelLaunch(NamedTuple):  # (tuples: a new signature makes one per launch)
    fn: int  # index into NativeCuda.functions
    grid: int
    block: int
    smem: int
    start: int  # first parameter word
    words: int  # parameter words
    kernel: int  # kernel row (for messages)
    row: int  # its launch record (Note [Launch records] in launch_words.py): the kernel launches before it


class GemmLaunch(NamedTuple):
    dtype: str
    ptrs: tuple[tuple[int, int], ...]  # (slot, byte offset) of A, B, C
    args: GemmArgs


class CublasLtCall(NamedTuple):
    ptrs: tuple[tuple[int, int], ...]  # (slot, byte offset) of A, B, D and the epilogue source if any
    launch: LtLaunch


@dataclass(frozen=True)
class RefLaunch:
    node: int


Launch = KernelLaunch | GemmLaunch | CublasLtCall | CutlassLaunch | RefLaunch


@dataclass(frozen=True)
class CudaPrepared:
    launches: tuple[Launch, ...]
    words: np.ndarray  # uint64 parameter words of every kernel launch, pointers zero
    ptr_pos: np.ndarray  # positions of the pointer words
    ptr_slot: np.ndarray  # their slots
    ptr_off: np.ndarray  # their byte offsets (uint64)
    arena_bytes: int
    buffers: dict[int, tuple[int, tuple[int, ...], str]]  # arena value -> (byte offset, shape, dtype)
    # per launch, its data conditions (slot, byte offset, expected): Note [Guarded launches]
    when: tuple[tuple[tuple[int, int, bool], ...], ...] = ()
    no_graph: str = ""  # why this signature is never captured into a CUDA graph ("" when it may be)
    # Note [Launch records] (launch_words.py): the kernel launches' `extra` rows and the sizes they point at
    records: tuple[np.ndarray, np.ndarray] = (np.zeros((0, 5), dtype=np.uint64), np.zeros(0, dtype=np.uint64))


class NativeCuda:
    def __init__(
        self,
        bpk: BpkFile,
        plan: dict[str, Any],
        kernels: Sequence[dict[str, Any]],
        ordinal: int,
        n_slots: int,
        options: LoaderOptions,
    ) -> None:
        """`kernels`: the manifest's kernel rows of target "cuda", in order (launches index them);
        `n_slots`: the plan's slots (arena, inputs, outputs, weights); slot `n_slots` holds the call's
        status words; `options`: where cuBLAS is found, the CUTLASS kernels' settings."""
        if plan.get("abi") != ABI_VERSION:
            raise BpkFormatError(f"{bpk.source}: native CUDA plan ABI {plan.get('abi')} is not {ABI_VERSION}")
        self.plan = plan
        self.kernels = list(kernels)
        self.device = Device(ordinal)
        self._drv = self.device._drv
        sections = {row["arch"]: row["section"] for row in plan["images"]}
        self.image, section = choose_image(sections, self.device.info.compute_capability)
        data = bpk.section_copy(section)  # Note [Hash what runs]: only the image this GPU runs
        self.module = self.device.load_module(data)
        names: dict[int, str] = {}
        for k in self.kernels:
            for v in k["variants"]:
                names[int(v["fn"])] = v["name"]
        if sorted(names) != list(range(len(names))):
            raise BpkFormatError(f"{bpk.source}: the CUDA kernel table is not numbered 0..{len(names) - 1}")
        self.functions = [self.module.function(names[i]) for i in range(len(names))]
        self.weight_ptrs: list[int] = []
        self._weights: DeviceBuffer | None = None
        # the status words of each stream's calls (a pointer word of every kernel launch, filled per call
        # from the extra slot `status_slot`: calls on different streams never share them)
        self._status = StreamBuffers(self.device, 64, zeroed=True)
        self.status_slot = n_slots
        self.checks_errors = any(k.get("errors") for k in self.kernels)
        # Note [Device errors]: each stream's status words copied into page-locked host memory after
        # every call (never reset by a call), read by the host without waiting; `strict` waits instead
        self.strict = options.cuda_strict_errors
        self._mirrors: dict[int, tuple[int, np.ndarray]] = {}  # status address -> (pinned address, view)
        self._mirror_lock = threading.Lock()
        self._arenas = StreamBuffers(self.device, SMALLEST_CLASS)  # Note [Device size classes]
        self.null_stream = self._drv.CUstream(0)  # the legacy default stream, made once
        self._cublas: Any = None
        if any(lr["op"] == "gemm" for lr in plan["launches"]):
            from bladepack.loader.cublas import Cublas

            self._cublas = Cublas(options)
        self._cutlass = CutlassGemms.from_artifact(bpk, plan, self.device, options) if "gemm_kernels" in plan else None
        lt = any(lr["op"] == "cublaslt" for lr in plan["launches"])
        self._cublaslt = CublasLt(self.device, options) if lt else None
        self._params: KernelParams | None = None  # Note [Launch word template], at the first signature

    @property
    def arch(self) -> str:
        return self.device.info.arch

    def upload_weights(self, sections: Sequence[memoryview]) -> None:
        """The weights (raw bytes, manifest order) into one device buffer."""
        offsets, total = [], 0
        for s in sections:
            offsets.append(total)
            total += (s.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        buf = self.device.alloc(max(total, 1))
        staging = bytearray(max(total, 1))
        for off, s in zip(offsets, sections):
            staging[off : off + s.nbytes] = s.cast("B")
        buf.copy_from_host(bytes(staging))
        self._weights = buf
        self.weight_ptrs = [buf.ptr + off for off in offsets]

    # -- per shape signature (Note [Compiled CUDA preparation] in cuda_prepare.py)
    @property
    def params(self) -> KernelParams:
        """The kernels' parameter word template (Note [Launch word template]), laid out at the first
        signature, after the plan checks."""
        if self._params is None:
            self._params = KernelParams(self.plan["launches"], self.status_slot)
        return self._params

    @property
    def cutlass(self) -> CutlassGemms | None:
        return self._cutlass

    @property
    def cublaslt(self) -> CublasLt | None:
        return self._cublaslt

    # -- per call
    def arena(self, nbytes: int, stream: int) -> int:
        """The device arena of `stream` (grown to `nbytes`): calls on one stream run in order."""
        return self._arenas.get(nbytes, stream)

    def run(
        self,
        prep: CudaPrepared,
        slots: np.ndarray,
        stream: int,
        reference: Callable[[int], None],
        workspace_stream: int | None = None,
    ) -> None:
        """Enqueue every launch on `stream` (`slots`: uint64 base addresses); `reference(node)` runs a
        reference step (the stream has been synchronized). Raises ExecutionError-ready CudaError.
        `workspace_stream`: whose split-K semaphores CUTLASS and workspace cuBLASLt use (a graph capture's
        caller stream)."""
        drv = self._drv
        words = prep.words.copy()
        if prep.ptr_pos.size:
            words[prep.ptr_pos] = slots[prep.ptr_slot] + prep.ptr_off
        records = prep.records[0].copy()  # Note [Launch records] in launch_words.py
        records[:, 1] += np.uint64(words.ctypes.data)
        at = records.ctypes.data
        handle = drv.CUstream(stream)
        launch_kernel, functions = drv.cuLaunchKernel, self.functions
        status = int(slots[self.status_slot]) if self.checks_errors else 0
        if status and self.strict:
            _check(drv, drv.cuMemsetD8Async(status, 0, 32, drv.CUstream(stream)), "cuMemsetD8Async")
        last: tuple[tuple[int, int, bool], ...] = ()
        wanted = True
        for k, launch in enumerate(prep.launches):
            if prep.when and prep.when[k] != last:  # a run of launches under new data conditions
                last = prep.when[k]
                wanted = self._holds(last, slots, stream)
            if not wanted:
                continue
            if isinstance(launch, KernelLaunch):
                fn = functions[launch.fn]
                if launch.smem > 48 * 1024:
                    fn.prepare_shared(launch.smem)
                g, b, smem = launch.grid, launch.block, launch.smem
                result = launch_kernel(fn.handle, g, 1, 1, b, 1, 1, smem, handle, 0, at + 40 * launch.row)
                if result[0]:  # (CUresult is an int enum: non-zero is an error)
                    _check(drv, result, f"cuLaunchKernel({fn.name})")
            elif isinstance(launch, GemmLaunch):
                (sa, oa), (sb, ob), (sc, oc) = launch.ptrs
                a, b, c = int(slots[sa]) + oa, int(slots[sb]) + ob, int(slots[sc]) + oc
                self._cublas.gemm(launch.dtype, a, b, c, launch.args, stream)
            elif isinstance(launch, CublasLtCall):
                assert self._cublaslt is not None
                addr = [int(slots[s]) + o for s, o in launch.ptrs]  # A, B, D and the epilogue source if any
                self._cublaslt.launch(
                    launch.launch,
                    addr[0],
                    addr[1],
                    addr[2],
                    addr[3] if len(addr) > 3 else None,
                    stream,
                    workspace_stream,
                )
            elif isinstance(launch, CutlassLaunch):
                assert self._cutlass is not None
                addr = [int(slots[s]) + o for s, o in launch.ptrs]  # A, B, D and the epilogue source if any
                self._cutlass.launch(
                    launch, addr[0], addr[1], addr[2], addr[3] if len(addr) > 3 else None, stream, workspace_stream
                )
            else:
                self.device.synchronize(stream)
                reference(launch.node)
        if status and not self.strict:  # Note [Device errors]: the words to the host, in stream order
            host = self.mirror(status)[0]
            _check(drv, drv.cuMemcpyDtoHAsync(host, status, 24, drv.CUstream(stream)), "cuMemcpyDtoHAsync")

    def _holds(self, when: tuple[tuple[int, int, bool], ...], slots: np.ndarray, stream: int) -> bool:
        """Note [Branch predicates] (ir/guards.py): each predicate byte read once the launches before it
        have run (a synchronisation with the stream), outermost first, stopping at the first that fails."""
        byte = np.zeros(1, dtype=np.uint8)
        for slot, off, taken in when:
            self.to_host(int(slots[slot]) + off, byte, stream)
            self.device.synchronize(stream)
            if bool(byte[0]) != taken:
                return False
        return True

    def status(self, stream: int) -> int:
        """The device address of `stream`'s status words (the value of slot `status_slot`)."""
        return self._status.get(64, stream)

    def read_status(self, stream: int) -> tuple[int, int, int]:
        """(code, value, size) of the first error `stream`'s calls reported (code 0: none), after
        waiting for the stream; strict: the last call's (each call resets the words)."""
        self.device.synchronize(stream)
        if not self.strict:
            words = self.mirror(self.status(stream))[1]
            return int(words[0]), int(words[1]), int(words[2])
        raw = np.zeros(3, dtype=np.int64)
        self.to_host(self.status(stream), raw, stream)
        self.device.synchronize(stream)
        return int(raw[0]), int(raw[1]), int(raw[2])

    def mirror(self, status: int) -> tuple[int, np.ndarray]:
        """Note [Device errors]: the page-locked host copy of the status words at device address
        `status`: (its address, an int64[3] view the host reads without a driver call)."""
        got = self._mirrors.get(status)
        if got is None:
            with self._mirror_lock:
                got = self._mirrors.get(status)
                if got is None:
                    drv = self._drv
                    ptr = int(_check(drv, drv.cuMemHostAlloc(64, 0), "cuMemHostAlloc(64)"))
                    ctypes.memset(ptr, 0, 64)
                    view = np.ctypeslib.as_array((ctypes.c_int64 * 3).from_address(ptr))
                    got = self._mirrors[status] = (ptr, view)
        return got

    def clear_status(self, stream: int) -> None:
        """After an error was reported: the stream idle, its status words and their host copy zero."""
        drv = self._drv
        status = self.status(stream)
        self.device.synchronize(stream)
        _check(drv, drv.cuMemsetD8Async(status, 0, 32, drv.CUstream(stream)), "cuMemsetD8Async")
        self.device.synchronize(stream)
        if not self.strict:
            self.mirror(status)[1][:] = 0

    def free_mirrors(self) -> None:
        """The page-locked copies freed (the streams must be idle)."""
        with self._mirror_lock:
            for ptr, _ in self._mirrors.values():
                self._drv.cuMemFreeHost(ptr)
            self._mirrors.clear()

    # -- host <-> device copies
    def to_device(self, host: np.ndarray, dst: int, stream: int) -> None:
        drv = self._drv
        n = host.nbytes
        if n:
            _check(drv, drv.cuMemcpyHtoDAsync(dst, host.ctypes.data, n, drv.CUstream(stream)), "cuMemcpyHtoDAsync")

    def to_host(self, src: int, host: np.ndarray, stream: int) -> None:
        drv = self._drv
        n = host.nbytes
        if n:
            _check(drv, drv.cuMemcpyDtoHAsync(host.ctypes.data, src, n, drv.CUstream(stream)), "cuMemcpyDtoHAsync")

    def copy(self, src: int, dst: int, nbytes: int, stream: int) -> None:
        """Device-to-device copy of `nbytes` on `stream`."""
        drv = self._drv
        if nbytes:
            _check(drv, drv.cuMemcpyDtoDAsync(dst, src, nbytes, drv.CUstream(stream)), "cuMemcpyDtoDAsync")

    def alloc(self, nbytes: int) -> DeviceBuffer:
        return self.device.alloc(nbytes)

    def synchronize(self, stream: int) -> None:
        self.device.synchronize(stream)


def graph_obstacle(launches: Sequence[Launch], when: Sequence[tuple[tuple[int, int, bool], ...]]) -> str:
    """Why a prepared signature cannot be one CUDA graph (Note [CUDA graphs] in loader/cuda_graphs.py):
    a step that synchronizes with the host — a reference step, or a run-time branch whose predicate is
    read on the host. "" when nothing stops it."""
    for k, launch in enumerate(launches):
        if isinstance(launch, RefLaunch):
            return f"step %{launch.node} runs on the host (no CUDA kernel)"
        if k < len(when) and when[k]:
            return "a run-time branch reads its predicate on the host"
    return ""


__all__ = ["CublasLtCall", "CudaError", "CudaPrepared", "NativeCuda", "graph_obstacle"]
