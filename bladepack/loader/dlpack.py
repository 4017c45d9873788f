"""DLPack exchange with ctypes alone: tensors in from any framework, device buffers out to any framework.

In (import): an object with `__dlpack__` / `__dlpack_device__` (a torch tensor, a numpy array, a CuPy
or JAX array). Out: `Imported`, a view (data pointer, device, dtype name, shape, element strides)
that keeps the producer's memory alive until `close()` calls the producer's deleter. The versioned
protocol (DLPack 1.x) is asked for first; a producer that only speaks the legacy one is read too.

In (export): a pointer, device, dtype and shape, and the Python object that owns the memory. Out:
`Exported`, an object with `__dlpack__` / `__dlpack_device__` (DLPack 1.x capsules, legacy ones for a
consumer that asks for no version), so `torch.from_dlpack(x)` or
`numpy.from_dlpack(x)` takes the memory without a copy; the owner stays alive until the consumer's
deleter runs (or the capsule is dropped unconsumed).

Note [DLPack ownership]: an exported tensor's `manager_ctx` holds a strong reference to a small
keeper object (Py_IncRef); the keeper owns the ctypes structures and the memory's owner. The deleter
(one module-level C callback, no registry) drops that reference; the capsule's destructor calls the
deleter only when nobody consumed the capsule (its name is still the unused one), as the protocol says.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13

# (type code, bits) -> dtype name; codes: 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
_DTYPES = {
    (2, 32): "float32",
    (2, 64): "float64",
    (2, 16): "float16",
    (4, 16): "bfloat16",
    (0, 64): "int64",
    (0, 32): "int32",
    (0, 16): "int16",
    (0, 8): "int8",
    (1, 8): "uint8",
    (6, 8): "bool",
}
_CODES = {name: code for code, name in _DTYPES.items()}


class DLPackError(ValueError):
    pass


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _Managed(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Managed))
_Managed._fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    pass


_DELETER_V = ctypes.CFUNCTYPE(None, ctypes.POINTER(_ManagedVersioned))
_ManagedVersioned._fields_ = [
    ("version", _Version),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER_V),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", _Tensor),
]
_FLAG_READ_ONLY = 1

_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_api.Py_IncRef.argtypes = [ctypes.py_object]
_api.Py_DecRef.argtypes = [ctypes.py_object]

_VERSIONED, _LEGACY = b"dltensor_versioned", b"dltensor"
_USED_VERSIONED, _USED_LEGACY = b"used_dltensor_versioned", b"used_dltensor"


# -- import


@dataclass(frozen=True)
class TensorView:
    ptr: int  # the first element (byte_offset applied)
    device: tuple[int, int]  # (DLPack device type, ordinal)
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    readonly: bool

    @property
    def contiguous(self) -> bool:
        expect = 1
        for size, stride in zip(reversed(self.shape), reversed(self.strides)):
            if size != 1 and stride != expect:
                return False
            expect *= size
        return True


class Imported:
    """A tensor taken through DLPack; `close()` (or leaving a `with` block) hands it back."""

    def __init__(self, capsule: Any, managed: Any, view: TensorView) -> None:
        self._capsule = capsule  # renamed "used_*": its destructor no longer calls the deleter
        self._managed = managed
        self.view = view

    def close(self) -> None:
        managed, self._managed = self._managed, None
        if managed is not None and managed.contents.deleter:
            managed.contents.deleter(managed)

    def __enter__(self) -> Imported:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def import_tensor(obj: Any, stream: int | None = None) -> Imported:
    """Take `obj` through DLPack. `stream` is the consumer's CUDA stream for device tensors (the
    producer orders its work before it); CPU tensors take None."""
    if not hasattr(obj, "__dlpack__"):
        raise DLPackError(f"{type(obj).__name__} does not support DLPack (__dlpack__)")
    device_type, _ = obj.__dlpack_device__()
    kwargs: dict[str, Any] = {} if int(device_type) == KDL_CPU or stream is None else {"stream": stream}
    try:
        capsule = obj.__dlpack__(max_version=(1, 0), **kwargs)
    except TypeError:  # a producer without the versioned protocol
        capsule = obj.__dlpack__(**kwargs)
    versioned = bool(_api.PyCapsule_IsValid(capsule, _VERSIONED))
    name = _VERSIONED if versioned else _LEGACY
    if not versioned and not _api.PyCapsule_IsValid(capsule, _LEGACY):
        raise DLPackError("__dlpack__ returned something that is not a DLPack capsule")
    addr = _api.PyCapsule_GetPointer(capsule, name)
    managed: Any = ctypes.cast(addr, ctypes.POINTER(_ManagedVersioned if versioned else _Managed))
    _api.PyCapsule_SetName(capsule, _USED_VERSIONED if versioned else _USED_LEGACY)
    t = managed.contents.dl_tensor
    dtype = _DTYPES.get((t.dtype.code, t.dtype.bits))
    if dtype is None or t.dtype.lanes != 1:
        if managed.contents.deleter:  # taken: hand it back before refusing it
            managed.contents.deleter(managed)
        raise DLPackError(
            f"DLPack dtype (code {t.dtype.code}, {t.dtype.bits} bits, {t.dtype.lanes} lanes) is not one of {sorted(_CODES)}"
        )
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) for i in range(t.ndim))
    else:  # NULL strides: compact row-major
        acc, rev = 1, []
        for size in reversed(shape):
            rev.append(acc)
            acc *= size
        strides = tuple(reversed(rev))
    readonly = versioned and bool(managed.contents.flags & _FLAG_READ_ONLY)
    ptr = int(t.data or 0) + int(t.byte_offset)
    device = (int(t.device.device_type), int(t.device.device_id))
    return Imported(capsule, managed, TensorView(ptr, device, dtype, shape, strides, readonly))


# -- export


class _Keeper:
    """What an exported tensor's manager_ctx keeps alive: the ctypes structures and the memory's owner."""

    def __init__(self, owner: Any, shape: tuple[int, ...], versioned: bool) -> None:
        self.owner = owner
        self.shape = (ctypes.c_int64 * max(len(shape), 1))(*shape)
        self.managed: _ManagedVersioned | _Managed = _ManagedVersioned() if versioned else _Managed()


def _delete(managed: Any) -> None:
    ctx = managed.contents.manager_ctx
    if ctx:
        managed.contents.manager_ctx = None
        _api.Py_DecRef(ctypes.cast(ctx, ctypes.py_object).value)


def _drop_capsule(capsule: int) -> None:
    obj = ctypes.cast(capsule, ctypes.py_object)
    if _api.PyCapsule_IsValid(obj, _VERSIONED):  # never consumed: the producer cleans up
        managed = ctypes.cast(_api.PyCapsule_GetPointer(obj, _VERSIONED), ctypes.POINTER(_ManagedVersioned))
        _delete(managed)


def _drop_legacy_capsule(capsule: int) -> None:
    """A legacy capsule's destructor: frees only an unconsumed one. A consumer renames what it takes —
    to "used_dltensor", or, as Triton's Python-backend stub does, to another name — and calls the
    deleter itself, so any name but the unused one means "not ours to free"."""
    obj = ctypes.cast(capsule, ctypes.py_object)
    if _api.PyCapsule_IsValid(obj, _LEGACY):
        _delete(ctypes.cast(_api.PyCapsule_GetPointer(obj, _LEGACY), ctypes.POINTER(_Managed)))


# the C entry points of the callbacks (module constants: C holds their addresses)
_DELETE_C: Any = _DELETER_V(_delete)
_DELETE_LEGACY_C: Any = _DELETER(_delete)
_DROP_CAPSULE_C: Any = _CAPSULE_DESTRUCTOR(_drop_capsule)
_DROP_LEGACY_CAPSULE_C: Any = _CAPSULE_DESTRUCTOR(_drop_legacy_capsule)


class Exported:
    """Memory at `ptr` (owned by `owner`) offered through DLPack, C-contiguous."""

    def __init__(self, ptr: int, device: tuple[int, int], dtype: str, shape: tuple[int, ...], owner: Any) -> None:
        if dtype not in _CODES:
            raise DLPackError(f"dtype {dtype!r} has no DLPack code; known: {sorted(_CODES)}")
        self.ptr, self.device, self.dtype, self.shape, self.owner = ptr, device, dtype, shape, owner

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(
        self, *, stream: Any = None, max_version: tuple[int, int] | None = None, dl_device: Any = None, copy: Any = None
    ) -> Any:
        """A DLPack 1.0 capsule, or a legacy (0.x) one for a consumer that gives no `max_version` (or
        one below 1.0). `stream` is accepted and not waited on: the exporter hands out memory whose
        writes are complete (host memory, or device memory after the producing stream synchronized)."""
        if copy:
            raise BufferError("bladepack exports without copying (copy=True is not supported)")
        versioned = max_version is not None and max_version[0] >= 1
        keeper = _Keeper(self.owner, self.shape, versioned)
        m = keeper.managed
        if isinstance(m, _ManagedVersioned):
            m.version.major, m.version.minor = 1, 0
            m.flags = 0
        code, bits = _CODES[self.dtype]
        t = m.dl_tensor
        t.data = self.ptr
        t.device.device_type, t.device.device_id = self.device
        t.ndim = len(self.shape)
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
        t.shape = ctypes.cast(keeper.shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = None  # compact row-major
        t.byte_offset = 0
        _api.Py_IncRef(keeper)  # Note [DLPack ownership]: released by _delete
        m.manager_ctx = id(keeper)
        if isinstance(m, _ManagedVersioned):
            m.deleter = _DELETE_C
            return _api.PyCapsule_New(ctypes.addressof(m), _VERSIONED, _DROP_CAPSULE_C)
        m.deleter = _DELETE_LEGACY_C
        return _api.PyCapsule_New(ctypes.addressof(m), _LEGACY, _DROP_LEGACY_CAPSULE_C)
