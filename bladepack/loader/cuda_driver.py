"""The CUDA driver API through cuda-python's `cuda.bindings.driver` only (no runtime API, no torch).

In: a device ordinal, kernel images (a cubin per architecture and PTX), launch geometry and argument
values. Out: `Device` (name, compute capability, SM count) holding the device's retained primary
context (the one torch and every runtime-API user share, so device pointers pass between them),
`Module` / `Function`, `DeviceBuffer`, and launches whose arguments travel in one packed buffer
(`CU_LAUNCH_PARAM_BUFFER_POINTER`) laid out by `pack_args` as the kernel's C parameter list is.

Errors: `CudaUnavailable` when cuda-python, the driver or the device is missing (the message says
which and what to do), `CudaError` naming the driver call and its CUresult for anything else.

Note [Kernel images]: a cubin runs on devices of its major architecture whose minor version is at
least its own (sm_80 runs on 8.6 and 8.9, never on 9.0); arch-specific cubins (`sm_90a`) run only on
their exact architecture; PTX is compiled by the driver for any device at least as new as its
virtual architecture. `choose_image` takes the newest cubin that runs, else the newest PTX that does.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from bladepack.errors import BladepackError

_Image = TypeVar("_Image")


class CudaUnavailable(BladepackError, RuntimeError):
    """No CUDA here: cuda-python, the driver or the requested device is missing."""


class CudaError(BladepackError, RuntimeError):
    """A CUDA driver call failed."""


def _bindings() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        raise CudaUnavailable(
            "cuda-python is not installed (pip install 'bladepack[cuda]'); it is needed for device='cuda'"
        ) from None
    return driver


def _check(drv: Any, result: Any, call: str) -> Any:
    """The values after a call's CUresult, or CudaError naming the call and the result."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise CudaError(f"{call} failed: {_error_name(drv, err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _error_name(drv: Any, err: Any) -> str:
    try:
        name_err, name = drv.cuGetErrorName(err)
        _, text = drv.cuGetErrorString(err)
        if name_err == drv.CUresult.CUDA_SUCCESS:
            return f"{name.decode()} ({text.decode()})"
    except Exception:  # an unknown code: fall back to the enum's own text
        pass
    return str(err)


def _init(drv: Any) -> None:
    try:
        result = drv.cuInit(0)
    except Exception as e:  # cuda.pathfinder raises its own DynamicLibNotFoundError without a driver
        if type(e).__name__ == "DynamicLibNotFoundError":
            raise CudaUnavailable(
                "no CUDA driver found (libcuda.so.1 could not be loaded); device='cuda' needs an NVIDIA driver"
            ) from None
        raise
    err = result[0]
    if err == drv.CUresult.CUDA_ERROR_NO_DEVICE:
        raise CudaUnavailable("the CUDA driver found no device")
    _check(drv, result, "cuInit")


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


class Device:
    """One device and its retained primary context (made current on the calling thread by `activate`)."""

    def __init__(self, ordinal: int = 0) -> None:
        drv = _bindings()
        _init(drv)
        count = _check(drv, drv.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= ordinal < count:
            raise CudaUnavailable(f"cuda:{ordinal} requested; this machine has {count} CUDA device(s)")
        self._drv = drv
        self._dev = _check(drv, drv.cuDeviceGet(ordinal), "cuDeviceGet")
        attr = drv.CUdevice_attribute
        major = self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
        minor = self._attribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
        sms = self._attribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        raw = _check(drv, drv.cuDeviceGetName(256, self._dev), "cuDeviceGetName")
        name = bytes(raw).split(b"\0", 1)[0].decode(errors="replace")
        self.info = DeviceInfo(ordinal, name, (major, minor), sms)
        self._ctx: Any = _check(drv, drv.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        self.activate()

    def _attribute(self, which: Any) -> int:
        return int(_check(self._drv, self._drv.cuDeviceGetAttribute(which, self._dev), "cuDeviceGetAttribute"))

    def activate(self) -> None:
        _check(self._drv, self._drv.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")

    def close(self) -> None:
        if self._ctx is not None:
            _check(self._drv, self._drv.cuDevicePrimaryCtxRelease(self._dev), "cuDevicePrimaryCtxRelease")
            self._ctx = None

    def entry_point(self, symbol: str) -> int:
        """The address of a driver function (cuGetProcAddress, CUDA 12.0 ABI), for native code that
        calls the driver without linking it (Note [Hopper GEMMs] in library_ops/cutlass/emitter.py)."""
        drv = self._drv
        flags = drv.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
        found = _check(drv, drv.cuGetProcAddress(symbol.encode(), 12000, flags), f"cuGetProcAddress({symbol})")
        address = int(found[0] if isinstance(found, tuple) else found)
        if address == 0:
            raise CudaUnavailable(f"the CUDA driver has no {symbol} (it needs CUDA 12.0 or newer)")
        return address

    def load_module(self, image: bytes) -> Module:
        return Module(self._drv, image)

    def alloc(self, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(self._drv, nbytes)

    def synchronize(self, stream: int = 0) -> None:
        _check(self._drv, self._drv.cuStreamSynchronize(self._drv.CUstream(stream)), "cuStreamSynchronize")

    def elapsed_ms(self, run: Callable[[], None], stream: int = 0) -> float:
        """Milliseconds between CUDA events recorded on `stream` before and after what `run` enqueues."""
        drv = self._drv
        events = [_check(drv, drv.cuEventCreate(0), "cuEventCreate") for _ in range(2)]
        try:
            _check(drv, drv.cuEventRecord(events[0], drv.CUstream(stream)), "cuEventRecord")
            run()
            _check(drv, drv.cuEventRecord(events[1], drv.CUstream(stream)), "cuEventRecord")
            _check(drv, drv.cuEventSynchronize(events[1]), "cuEventSynchronize")
            return float(_check(drv, drv.cuEventElapsedTime(events[0], events[1]), "cuEventElapsedTime"))
        finally:
            for e in events:
                drv.cuEventDestroy(e)


class Module:
    """A loaded cubin / fatbin / PTX image and the functions looked up in it."""

    def __init__(self, drv: Any, image: bytes) -> None:
        self._drv = drv
        if not image.startswith(b"\x7fELF") and not image.endswith(b"\0"):
            image = image + b"\0"  # PTX text must be NUL-terminated
        self._mod: Any = _check(drv, drv.cuModuleLoadData(image), "cuModuleLoadData")
        self._functions: dict[str, Function] = {}

    def function(self, name: str) -> Function:
        fn = self._functions.get(name)
        if fn is None:
            handle = _check(self._drv, self._drv.cuModuleGetFunction(self._mod, name.encode()), "cuModuleGetFunction")
            fn = self._functions[name] = Function(self._drv, name, handle)
        return fn

    def unload(self) -> None:
        if self._mod is not None:
            _check(self._drv, self._drv.cuModuleUnload(self._mod), "cuModuleUnload")
            self._mod = None


BUFFER_POINTER, BUFFER_SIZE, BUFFER_END = 1, 2, 0  # CU_LAUNCH_PARAM_*

# Note [Grid-constant parameters]: generated kernels and the sm80 CUTLASS GEMMs take their parameters as
# one packed buffer (`extra`, CU_LAUNCH_PARAM_BUFFER_POINTER). A kernel whose parameter is declared
# `__grid_constant__` — the Hopper GEMMs, whose Params hold TMA descriptors that the kernel reads from
# parameter space by address — launches through `kernelParams` instead. Measured on an NVIDIA H100
# (2026-11-26, driver 580.159.04, scripts/hopper_probe.py): the same sm_90a kernel with the same Params
# faulted ("illegal instruction", or "unspecified launch failure") when launched through the buffer,
# and matched torch when launched through kernelParams, as CUTLASS's own launch does.


class Function:
    def __init__(self, drv: Any, name: str, handle: Any) -> None:
        self._drv = drv
        self.name = name
        self.handle = handle
        self._smem_optin = 0

    def prepare_shared(self, shared_bytes: int) -> None:
        """Raise the function's dynamic shared-memory limit above the default 48 KiB (once per size)."""
        if shared_bytes > 48 * 1024 and shared_bytes > self._smem_optin:
            drv = self._drv
            attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            _check(drv, drv.cuFuncSetAttribute(self.handle, attr, shared_bytes), "cuFuncSetAttribute")
            self._smem_optin = shared_bytes

    def launch(
        self,
        grid: Sequence[int],
        block: Sequence[int],
        args: bytes,
        shared_bytes: int = 0,
        stream: int = 0,
    ) -> None:
        """Launch with the packed argument bytes (`pack_args`); above 48 KiB of dynamic shared memory
        the function's limit is raised first (once per size)."""
        buf = ctypes.create_string_buffer(args, max(len(args), 1))
        gx, gy, gz = (list(grid) + [1, 1])[:3]
        bx, by, bz = (list(block) + [1, 1])[:3]
        self.launch_packed((gx, gy, gz), (bx, by, bz), ctypes.addressof(buf), len(args), shared_bytes, stream)

    def launch_packed(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        address: int,
        nbytes: int,
        shared_bytes: int,
        stream: int,
        cluster: tuple[int, int, int] = (1, 1, 1),
    ) -> None:
        """Launch with `nbytes` of packed parameters at `address` (CU_LAUNCH_PARAM_BUFFER_POINTER); the
        driver copies them at launch, so the memory may be reused on return. A thread-block `cluster` of
        more than one CTA launches through cuLaunchKernelEx."""
        size = ctypes.c_size_t(nbytes)
        extra = (ctypes.c_void_p * 5)(BUFFER_POINTER, address, BUFFER_SIZE, ctypes.addressof(size), BUFFER_END)
        self._launch(grid, block, 0, ctypes.addressof(extra), shared_bytes, stream, cluster)

    def launch_grid_constant(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        address: int,
        shared_bytes: int,
        stream: int,
        cluster: tuple[int, int, int] = (1, 1, 1),
    ) -> None:
        """Launch a kernel whose one parameter is a `__grid_constant__` struct at `address`, through
        kernelParams (Note [Grid-constant parameters])."""
        argv = (ctypes.c_void_p * 1)(address)
        self._launch(grid, block, ctypes.addressof(argv), 0, shared_bytes, stream, cluster)

    def _launch(
        self,
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        kernel_params: int,
        extra: int,
        shared_bytes: int,
        stream: int,
        cluster: tuple[int, int, int],
    ) -> None:
        drv = self._drv
        self.prepare_shared(shared_bytes)
        if cluster != (1, 1, 1):
            config = drv.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = grid
            config.blockDimX, config.blockDimY, config.blockDimZ = block
            config.sharedMemBytes = shared_bytes
            config.hStream = drv.CUstream(stream)
            attr = drv.CUlaunchAttribute()
            attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
            config.attrs = [attr]
            config.numAttrs = 1
            _check(
                drv,
                drv.cuLaunchKernelEx(config, self.handle, kernel_params, extra),
                f"cuLaunchKernelEx({self.name}, cluster {cluster})",
            )
            return
        _check(
            drv,
            drv.cuLaunchKernel(self.handle, *grid, *block, shared_bytes, drv.CUstream(stream), kernel_params, extra),
            f"cuLaunchKernel({self.name})",
        )


class DeviceBuffer:
    """`nbytes` of device memory (freed by `free` or when collected)."""

    def __init__(self, drv: Any, nbytes: int) -> None:
        self._drv = drv
        self.nbytes = nbytes
        self.ptr: int = int(_check(drv, drv.cuMemAlloc(max(nbytes, 1)), f"cuMemAlloc({nbytes})"))

    def copy_from_host(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes > self.nbytes:
            raise ValueError(f"{view.nbytes} bytes do not fit in a {self.nbytes}-byte device buffer")
        src = (ctypes.c_char * view.nbytes).from_buffer_copy(view)
        _check(self._drv, self._drv.cuMemcpyHtoD(self.ptr, src, view.nbytes), "cuMemcpyHtoD")

    def copy_to_host(self, nbytes: int | None = None) -> bytes:
        n = self.nbytes if nbytes is None else nbytes
        dst = ctypes.create_string_buffer(max(n, 1))
        _check(self._drv, self._drv.cuMemcpyDtoH(dst, self.ptr, n), "cuMemcpyDtoH")
        return dst.raw[:n]

    def free(self) -> None:
        if self.ptr:
            _check(self._drv, self._drv.cuMemFree(self.ptr), "cuMemFree")
            self.ptr = 0

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown or a lost context: nothing to free into
            self.free()


SMALLEST_CLASS = 1 << 16


def size_class(nbytes: int) -> int:
    """Note [Device size classes]: memory sized by a dim that grows call by call (a decode loop's arena,
    graph buffer and pooled results) was allocated at exactly the size asked, so every call of a
    growing walk replaced it — a wait for the stream, a free and an allocation per call. Requests are
    rounded up to 256 bytes and, from 64 KiB, to one of eight steps per power of two (at most 12.5%
    more), as the C++ runtime sizes its arenas and outputs (Note [Output blocks]); a walk then
    reallocates only when it passes a class."""
    n = (max(nbytes, 1) + 255) // 256 * 256
    if n >= SMALLEST_CLASS:
        step = (1 << (n.bit_length() - 1)) // 8
        n = (n + step - 1) // step * step
    return n


class StreamBuffers:
    """One device buffer per stream, grown on demand (at least `minimum` bytes, then by size class:
    Note [Device size classes]; zero-filled when allocated if `zeroed`). Calls on one stream run in
    order, so its buffer is free for each call. With `keep`, a buffer outgrown stays allocated until
    `free` (CUDA graphs captured earlier may still address it: the split-K semaphores)."""

    def __init__(self, device: Device, minimum: int, zeroed: bool = False, keep: bool = False) -> None:
        self._device, self._minimum, self._zeroed, self._keep = device, minimum, zeroed, keep
        self._buffers: dict[int, DeviceBuffer] = {}
        self._retired: list[DeviceBuffer] = []
        self._lock = threading.Lock()

    def get(self, nbytes: int, stream: int) -> int:
        with self._lock:
            buf = self._buffers.get(stream)
            if buf is None or buf.nbytes < nbytes:
                if buf is not None and self._keep:
                    self._retired.append(buf)
                elif buf is not None:
                    self._device.synchronize(stream)
                    buf.free()
                buf = self._buffers[stream] = self._device.alloc(size_class(max(nbytes, self._minimum)))
                if self._zeroed:
                    buf.copy_from_host(bytes(buf.nbytes))
            return buf.ptr

    def free(self) -> None:
        """Free every stream's buffer, and those outgrown (the streams must be idle)."""
        with self._lock:
            for buf in [*self._buffers.values(), *self._retired]:
                buf.free()
            self._buffers.clear()
            self._retired.clear()


# -- argument packing and image choice (pure; tested without a driver)

_FORMATS = {"ptr": "Q", "i64": "q", "u64": "Q", "i32": "i", "u32": "I", "f32": "f", "f64": "d"}


def pack_args(args: Sequence[tuple[str, int | float]]) -> bytes:
    """Kernel arguments laid out as the C parameter list: each at its natural alignment, little-endian."""
    out = bytearray()
    for kind, value in args:
        fmt = _FORMATS.get(kind)
        if fmt is None:
            raise ValueError(f"unknown argument kind {kind!r}; known: {sorted(_FORMATS)}")
        size = struct.calcsize(fmt)
        out += b"\0" * (-len(out) % size)
        out += struct.pack("<" + fmt, value)
    return bytes(out)


_IMAGE = re.compile(r"^(sm|compute)_(\d+)(\d)(a?)$")


def choose_image(images: Mapping[str, _Image], cc: tuple[int, int]) -> tuple[str, _Image]:
    """Note [Kernel images]: `images` maps "sm_80" / "sm_90a" (cubins) and "compute_90" (PTX) to the
    image (its bytes, or whatever names them: only the keys are read)."""
    major, minor = cc
    cubins, ptx = [], []
    for key in images:
        m = _IMAGE.match(key)
        if m is None:
            raise ValueError(f"kernel image name {key!r} is not sm_XY[a] or compute_XY")
        kind, maj, mi, specific = m.group(1), int(m.group(2)), int(m.group(3)), bool(m.group(4))
        if kind == "sm":
            if (maj, mi) == (major, minor) or (not specific and maj == major and mi <= minor):
                cubins.append(((maj, mi, specific), key))
        elif (maj, mi) <= (major, minor):
            ptx.append(((maj, mi), key))
    if cubins:
        key = max(cubins)[1]
    elif ptx:
        key = max(ptx)[1]
    else:
        have = ", ".join(sorted(images)) or "none"
        raise CudaUnavailable(f"no kernel image runs on sm_{major}{minor}: the artifact has {have}")
    return key, images[key]
