"""A stand-in for torch's CUDA tensors, to drive the loader's torch path on the fake driver.

The loader never imports torch: it recognizes a torch tensor by its type's module and uses the `torch`
module the caller imported (`sys.modules["torch"]`). In a process without a GPU (the fake driver of
tests/cuda_harness.py, where device memory is host memory), `install()` puts this module's `torch` in
`sys.modules`, so a call with `torch.cuda_tensor(array)` takes exactly the branch a real torch CUDA
tensor takes: its data pointer, shape, dtype, device and the current stream read through the same
attributes and `torch._C` functions, its outputs made by `torch.empty(..., device="cuda:N")`.

What it cannot stand in for: torch's own per-call cost (a real `torch.empty` on the caching allocator
costs a few µs) and stream semantics (the fake driver runs everything at once).
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np


class dtype:
    __module__ = "torch"

    def __init__(self, name: str, numpy_dtype: Any) -> None:
        self.name, self.numpy = name, np.dtype(numpy_dtype)
        self.itemsize = self.numpy.itemsize

    def __repr__(self) -> str:
        return f"torch.{self.name}"


DTYPES = {
    n: dtype(n, t)
    for n, t in (
        ("float32", np.float32),
        ("float64", np.float64),
        ("float16", np.float16),
        ("bfloat16", np.uint16),  # bit patterns: the fake never computes on them
        ("int64", np.int64),
        ("int32", np.int32),
        ("int16", np.int16),
        ("int8", np.int8),
        ("uint8", np.uint8),
        ("bool", np.bool_),
    )
}


class Size(tuple):  # type: ignore[type-arg]
    __module__ = "torch"


class device:
    __module__ = "torch"

    def __init__(self, spec: str) -> None:
        kind, _, index = spec.partition(":")
        self.type, self.index = kind, int(index or 0)


class Tensor:
    """A CUDA tensor of device `index` over `host` (host memory is device memory under the fake)."""

    __module__ = "torch"

    def __init__(self, host: np.ndarray, dt: dtype, index: int = 0) -> None:
        self._host, self.dtype, self._index = host, dt, index
        self.requires_grad = False
        self.is_meta = False
        self.is_cuda = True
        self.shape = Size(host.shape)
        # what the loader's replay calls per input, as C-level callables (torch's are C functions): the
        # stand-in adds next to nothing to a per-call time measured through it
        self.data_ptr = int(host.__array_interface__["data"][0]).__int__
        self.get_device = index.__int__
        self.is_contiguous = bool(host.flags.c_contiguous).__bool__
        self.is_neg = self.is_conj = False.__bool__

    @property
    def device(self) -> device:
        return device(f"cuda:{self._index}")

    def contiguous(self) -> Tensor:
        return self if self.is_contiguous() else Tensor(np.ascontiguousarray(self._host), self.dtype, self._index)

    def detach(self) -> Tensor:
        return self

    def numpy(self) -> np.ndarray:
        """The values (a copy: what `.cpu().numpy()` gives)."""
        return self._host.copy()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self._index)

    def __dlpack__(self, *, stream: Any = None, max_version: Any = None, **_: Any) -> Any:
        from bladepack.loader.dlpack import Exported

        if not self.is_contiguous():
            raise BufferError("the fake exports contiguous tensors only")
        return Exported(self.data_ptr(), (2, self._index), self.dtype.name, self._host.shape, self).__dlpack__(
            max_version=max_version
        )


def _module(stream: int) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__dict__.update(DTYPES)
    torch.Tensor = Tensor  # type: ignore[attr-defined]
    torch.Size = Size  # type: ignore[attr-defined]
    torch.dtype = dtype  # type: ignore[attr-defined]
    torch.device = device  # type: ignore[attr-defined]

    def empty(shape: Any, *, dtype: dtype, device: Any) -> Tensor:
        if isinstance(device, str):
            device = torch.device(device)
        if device.type != "cuda":
            raise ValueError("the fake torch makes CUDA tensors only")
        return Tensor(np.empty(shape, dtype.numpy), dtype, device.index)

    class _Stream:
        def __init__(self, ptr: int) -> None:
            self.cuda_stream = ptr

    cuda = types.ModuleType("torch.cuda")
    cuda.current_stream = lambda index=None: _Stream(stream)  # type: ignore[attr-defined]
    c = types.ModuleType("torch._C")
    c._cuda_getCurrentRawStream = lambda index: stream  # type: ignore[attr-defined]
    torch.cuda = cuda  # type: ignore[attr-defined]
    torch._C = c  # type: ignore[attr-defined]
    torch.empty = empty  # type: ignore[attr-defined]
    torch.cuda_tensor = lambda a, index=0: Tensor(  # type: ignore[attr-defined]
        np.array(a, copy=True), DTYPES[np.asarray(a).dtype.name], index
    )
    return torch


def install(stream: int = 0) -> types.ModuleType:
    """Make `import torch` (and the loader's `sys.modules["torch"]`) this stand-in; `stream`: the value
    of torch's current stream (0: the legacy default stream, torch's default)."""
    torch = _module(stream)
    sys.modules["torch"] = torch
    sys.modules["torch.cuda"] = torch.cuda
    sys.modules["torch._C"] = torch._C
    return torch
