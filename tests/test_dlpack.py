"""DLPack exchange (bladepack/loader/dlpack.py) with numpy and torch on CPU: views, ownership, dtypes."""

from __future__ import annotations

import ctypes
import gc
import weakref

import numpy as np
import pytest
import torch

from bladepack.loader.dlpack import DLPackError, Exported, _Managed, import_tensor


def test_import_numpy_views() -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    with import_tensor(a) as imp:
        v = imp.view
        assert (v.ptr, v.device, v.dtype, v.shape, v.strides) == (a.ctypes.data, (1, 0), "float32", (4, 6), (6, 1))
        assert v.contiguous and not v.readonly
    s = a[1:, ::2]
    with import_tensor(s) as imp:
        assert imp.view.ptr == s.ctypes.data and imp.view.strides == (6, 2) and not imp.view.contiguous
    r = np.arange(3)
    r.flags.writeable = False
    with import_tensor(r) as imp:
        assert imp.view.readonly and imp.view.dtype == "int64"


def test_import_torch_dtypes_and_offsets() -> None:
    t = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)
    with import_tensor(t) as imp:
        assert imp.view.dtype == "bfloat16" and imp.view.ptr == t.data_ptr()
    u = torch.arange(10, dtype=torch.int32)[3:]
    with import_tensor(u) as imp:
        assert imp.view.ptr == u.data_ptr() and imp.view.shape == (7,)
    b = torch.zeros(2, 2, dtype=torch.bool).t()
    with import_tensor(b) as imp:
        assert imp.view.dtype == "bool" and imp.view.strides == (1, 2) and not imp.view.contiguous
    with import_tensor(torch.tensor(3.0, dtype=torch.float16)) as imp:
        assert imp.view.shape == () and imp.view.contiguous


def test_import_keeps_the_producer_alive_until_closed() -> None:
    x = np.arange(10.0)
    ref = weakref.ref(x)
    imp = import_tensor(x)
    del x
    gc.collect()
    assert ref() is not None
    imp.close()
    gc.collect()
    assert ref() is None
    imp.close()  # twice is harmless


def test_import_refuses_what_it_cannot_read() -> None:
    with pytest.raises(DLPackError, match=r"complex|code 5"):
        import_tensor(np.zeros(2, np.complex64))
    with pytest.raises(DLPackError, match="does not support DLPack"):
        import_tensor([1, 2])


class Owner:
    def __init__(self, data: np.ndarray) -> None:
        self.data = data


def test_export_to_numpy_and_torch_without_copies() -> None:
    owner = Owner(np.arange(12, dtype=np.float32))
    ref = weakref.ref(owner)
    e = Exported(owner.data.ctypes.data, (1, 0), "float32", (3, 4), owner)
    y = np.from_dlpack(e)
    t = torch.from_dlpack(e)
    assert np.shares_memory(y, owner.data) and y.shape == (3, 4) and (y == np.arange(12).reshape(3, 4)).all()
    assert t.data_ptr() == owner.data.ctypes.data and t.dtype == torch.float32
    t[0, 0] = 42.0
    assert y[0, 0] == 42.0
    del owner, e
    gc.collect()
    assert ref() is not None  # the consumers keep it
    del y, t
    gc.collect()
    assert ref() is None


def test_export_capsule_dropped_unconsumed_releases_the_owner() -> None:
    owner = Owner(np.zeros(4, np.int64))
    ref = weakref.ref(owner)
    e = Exported(owner.data.ctypes.data, (1, 0), "int64", (4,), owner)
    cap = e.__dlpack__(max_version=(1, 0))
    del owner, e
    gc.collect()
    assert ref() is not None
    del cap
    gc.collect()
    assert ref() is None


def test_export_legacy_capsules() -> None:
    """A consumer that asks for no version gets a legacy capsule: numpy reads it, an unconsumed one
    releases the owner when dropped, and one a consumer renamed to a non-standard name (Triton's
    Python-backend stub uses "used_dlpack") is left to that consumer's call of the deleter."""
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    owner = Owner(data)
    ref = weakref.ref(owner)

    class Legacy:  # numpy asks for a versioned capsule first; a legacy-only producer refuses
        def __init__(self, e: Exported) -> None:
            self.e = e

        def __dlpack__(self, stream: object = None) -> object:
            return self.e.__dlpack__()

        def __dlpack_device__(self) -> tuple[int, int]:
            return self.e.__dlpack_device__()

    got = np.from_dlpack(Legacy(Exported(data.ctypes.data, (1, 0), "float32", (2, 3), owner)))
    np.testing.assert_array_equal(got, data)
    del owner, data
    gc.collect()
    assert ref() is not None  # numpy's array holds it
    del got
    gc.collect()
    assert ref() is None

    owner = Owner(np.zeros(4, np.int64))
    ref = weakref.ref(owner)
    cap = Exported(owner.data.ctypes.data, (1, 0), "int64", (4,), owner).__dlpack__()
    del owner
    del cap
    gc.collect()
    assert ref() is None

    owner = Owner(np.zeros(4, np.int64))
    ref = weakref.ref(owner)
    cap = Exported(owner.data.ctypes.data, (1, 0), "int64", (4,), owner).__dlpack__()
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    managed = ctypes.cast(api.PyCapsule_GetPointer(cap, b"dltensor"), ctypes.POINTER(_Managed))
    api.PyCapsule_SetName(cap, b"used_dlpack")
    del owner, cap
    gc.collect()
    assert ref() is not None  # the consumer owns it now
    managed.contents.deleter(managed)
    gc.collect()
    assert ref() is None


def test_export_errors() -> None:
    with pytest.raises(DLPackError, match="dtype 'complex64' has no DLPack code"):
        Exported(0, (1, 0), "complex64", (1,), None)
    e = Exported(0, (1, 0), "float32", (0,), None)
    with pytest.raises(BufferError, match="copy=True"):
        e.__dlpack__(max_version=(1, 0), copy=True)
