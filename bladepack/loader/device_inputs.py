"""Device tensors of any framework read without DLPack capsules, and device results handed back.

In: a call's inputs. Out, per kind of tensor, what the CUDA executor's replay needs (Note [Framework
replay] in cuda_module.py): the shape key, each input's device address, and the stream the work must
run on — or None when an input is not of that kind, dtype, device or layout (the call then takes the
full path, which explains what was wrong).
- torch tensors (`TorchKind`): `data_ptr()`, `shape`, `dtype`, `get_device()`, `is_contiguous()` read
  directly (a few C calls each, no capsule), the stream from `torch._C._cuda_getCurrentRawStream`
  (the raw `cudaStream_t` torch's own generated code asks for), outputs from `torch.empty` (the caching
  allocator). The `torch` module is the one the caller imported; nothing here imports it.
- `__cuda_array_interface__` objects (CuPy, Numba, `cai_view`): version 3's `data`, `shape`,
  `typestr`, `strides` and `stream`; the work runs on the producer's stream, so no synchronization
  is needed in either direction.
- DLPack producers keep going through `dlpack.import_tensor` (one capsule per input per call).

Device results of non-torch calls are `DeviceTensor`s carved out of pooled device memory (`OutputPool`):
no allocation and no synchronization per call at a repeated signature. A `DeviceTensor` remembers the
stream that wrote it and orders a consumer after that stream when it is taken (`__dlpack__(stream=)`,
or `__cuda_array_interface__`'s `stream` for CAI consumers).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bladepack.loader.cuda_driver import SMALLEST_CLASS, Device, DeviceBuffer, _check, size_class
from bladepack.loader.dlpack import Exported

Key = tuple[tuple[int, ...], ...]

# numpy's typestr of each dtype name the signature may hold (bfloat16 has none: no CAI producer has it)
_TYPESTR = {
    d: np.dtype(d).str for d in ("float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool")
}
_BY_TYPESTR = {s: d for d, s in _TYPESTR.items()}


def cai_stream(value: Any) -> int:
    """The driver stream handle of a CAI `stream` entry (version 3): None (no order needed) and 1
    (the legacy default stream) run on the legacy default stream, 0; 2 is the per-thread default stream."""
    if value is None or value == 1:
        return 0
    return int(value)


class CaiView:
    """What the executor reads of a `__cuda_array_interface__` input."""

    __slots__ = ("dtype", "ptr", "shape", "stream")

    def __init__(self, ptr: int, shape: tuple[int, ...], dtype: str, stream: int) -> None:
        self.ptr, self.shape, self.dtype, self.stream = ptr, shape, dtype, stream


def cai_view(cai: dict[str, Any], name: str) -> CaiView:
    """The input `name` described by its interface dict; ValueError naming what is unsupported."""
    shape = tuple(int(d) for d in cai["shape"])
    dtype = _BY_TYPESTR.get(str(cai["typestr"]).replace("=", "<"))
    if dtype is None:
        raise ValueError(
            f"input '{name}' has __cuda_array_interface__ typestr {cai['typestr']!r}; known: {sorted(_BY_TYPESTR)}"
        )
    strides = cai.get("strides")
    if strides is not None:
        expect = np.dtype(dtype).itemsize
        for size, stride in zip(reversed(shape), reversed(tuple(strides))):
            if size != 1 and stride != expect:
                raise ValueError(
                    f"input '{name}' is not contiguous (strides {tuple(strides)}); pass a contiguous array"
                )
            expect *= size
    if cai.get("mask") is not None:
        raise ValueError(f"input '{name}' is a masked array; pass one without a mask")
    return CaiView(int(cai["data"][0] or 0), shape, dtype, cai_stream(cai.get("stream")))


class TorchKind:
    """The torch module the caller uses, as the replay reads it: the tensor type, each input's and
    output's dtype object, this module's device, the current-stream query and `torch.empty`."""

    def __init__(self, torch: Any, inputs: Sequence[str], outputs: Sequence[str], ordinal: int) -> None:
        self.tensor = torch.Tensor
        self.inputs = tuple(getattr(torch, d) for d in inputs)
        self.outputs = tuple(getattr(torch, d) for d in outputs)
        self.device = torch.device(f"cuda:{ordinal}")
        self.ordinal = ordinal
        self.empty: Callable[..., Any] = torch.empty
        raw = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)
        self.stream: Callable[[int], int] = (
            raw if raw is not None else (lambda index: int(torch.cuda.current_stream(index).cuda_stream))
        )

    def read(self, inputs: Sequence[Any]) -> tuple[Key, list[int]] | None:
        """(shape key, data pointers) when every input is a contiguous torch tensor of its dtype on this
        device without a lazy negation / conjugation, else None."""
        shapes, ptrs = [], []
        tensor, ordinal = self.tensor, self.ordinal
        for x, dt in zip(inputs, self.inputs):
            if (
                type(x) is not tensor
                or x.dtype is not dt
                or x.get_device() != ordinal
                or not x.is_contiguous()
                or x.is_neg()
                or x.is_conj()
            ):
                return None
            shapes.append(x.shape)
            ptrs.append(x.data_ptr())
        return tuple(shapes), ptrs


def read_cai(inputs: Sequence[Any], typestrs: Sequence[str | None]) -> tuple[Key, list[int], int] | None:
    """(shape key, data pointers, the producer's stream) when every input has a version 3 interface of
    its dtype, compact, all on one stream; else None."""
    shapes, ptrs = [], []
    stream: Any = ()
    for x, want in zip(inputs, typestrs):
        cai = getattr(x, "__cuda_array_interface__", None)
        if cai is None or want is None or cai.get("typestr") != want or cai.get("mask") is not None:
            return None
        strides = cai.get("strides")
        if strides is not None and strides != _compact(cai["shape"], np.dtype(want).itemsize):
            return None
        s = cai.get("stream")
        if stream != () and s != stream:
            return None
        stream = s
        shapes.append(tuple(cai["shape"]))
        ptrs.append(int(cai["data"][0] or 0))
    return tuple(shapes), ptrs, cai_stream(stream if stream != () else None)


def _compact(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    out, acc = [], itemsize
    for size in reversed(tuple(shape)):
        out.append(acc)
        acc *= int(size)
    return tuple(reversed(out))


def typestr(dtype: str) -> str | None:
    return _TYPESTR.get(dtype)


class _Pooled:
    """A pooled device buffer lent to one call's results; back to the pool when they are all gone."""

    __slots__ = ("buffer", "pool")

    def __init__(self, buffer: DeviceBuffer, pool: OutputPool) -> None:
        self.buffer, self.pool = buffer, pool

    @property
    def ptr(self) -> int:
        return self.buffer.ptr

    def __del__(self) -> None:
        self.pool.give_back(self.buffer)


class OutputPool:
    """Device buffers for non-torch results, reused by size class (Note [Device size classes], from
    64 KiB; at most `keep` idle per class and `limit` idle in all, the longest idle freed first: a
    decode loop's results grow every call, and a buffer kept per exact size was never reused)."""

    def __init__(self, device: Device, keep: int = 8, limit: int = 32) -> None:
        self._device, self._keep, self._limit = device, keep, limit
        self._idle: dict[int, list[DeviceBuffer]] = {}
        self._order: deque[DeviceBuffer] = deque()  # every idle buffer, the longest idle first
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> _Pooled:
        nbytes = size_class(max(nbytes, SMALLEST_CLASS))
        with self._lock:
            idle = self._idle.get(nbytes)
            buf = idle.pop() if idle else None
            if buf is not None:
                self._order.remove(buf)
        return _Pooled(buf if buf is not None else self._device.alloc(nbytes), self)

    def give_back(self, buf: DeviceBuffer) -> None:
        with self._lock:
            idle = self._idle.setdefault(buf.nbytes, [])
            if len(idle) >= self._keep:
                spare: DeviceBuffer | None = buf
            else:
                idle.append(buf)
                self._order.append(buf)
                spare = None
                if len(self._order) > self._limit:
                    spare = self._order.popleft()
                    self._idle[spare.nbytes].remove(spare)
        if spare is not None:
            spare.free()

    def free(self) -> None:
        with self._lock:
            for bufs in self._idle.values():
                for b in bufs:
                    b.free()
            self._idle.clear()
            self._order.clear()


class DeviceTensor(Exported):
    """A result in device memory owned by bladepack, written on `stream`; take it with
    `torch.from_dlpack`, `cupy.from_dlpack` or `cupy.asarray` (its `__cuda_array_interface__`)."""

    def __init__(
        self,
        ptr: int,
        device: tuple[int, int],
        dtype: str,
        shape: tuple[int, ...],
        owner: Any,
        stream: int,
        cuda: Device,
    ) -> None:
        # Exported's fields set directly: the dtype came from the artifact's signature (made per result
        # of a replayed call, so kept to plain stores)
        self.ptr, self.device, self.dtype, self.shape, self.owner = ptr, device, dtype, shape, owner
        self.stream, self._cuda = stream, cuda

    def __dlpack__(
        self, *, stream: Any = None, max_version: tuple[int, int] | None = None, dl_device: Any = None, copy: Any = None
    ) -> Any:
        """The capsule, with the consumer's `stream` (the array API's convention: None or 1 the legacy
        default stream, 2 the per-thread one, -1 no ordering) ordered after the stream that wrote it."""
        if stream != -1:
            self._order(0 if stream is None or stream == 1 else int(stream))
        return super().__dlpack__(max_version=max_version, copy=copy)

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        want = typestr(self.dtype)
        if want is None:
            raise AttributeError(f"a {self.dtype} result has no __cuda_array_interface__ typestr; use __dlpack__")
        return {
            "shape": self.shape,
            "typestr": want,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": self.stream if self.stream else 1,
        }

    def _order(self, consumer: int) -> None:
        if consumer == self.stream:
            return
        drv = self._cuda._drv
        event = _check(drv, drv.cuEventCreate(2), "cuEventCreate")  # CU_EVENT_DISABLE_TIMING
        try:
            _check(drv, drv.cuEventRecord(event, drv.CUstream(self.stream)), "cuEventRecord")
            _check(drv, drv.cuStreamWaitEvent(drv.CUstream(consumer), event, 0), "cuStreamWaitEvent")
        finally:
            drv.cuEventDestroy(event)


__all__ = ["CaiView", "DeviceTensor", "OutputPool", "TorchKind", "cai_view", "read_cai", "typestr"]
