"""Tensors in and out of the loader without importing torch.

In: numpy arrays or any object with `__dlpack__` (torch tensors). Out: numpy views of the same
memory, and, for callers who passed torch tensors, torch tensors made with the `torch` module the
caller already imported (found in `sys.modules`; never imported here).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from bladepack.errors import InputError


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "__dlpack__")


def resolve_views(x: Any, name: str) -> Any:
    """A torch tensor whose memory holds its values: the negative and conjugate bits (lazy views such as
    `z.conj().imag` or `torch._neg_view`, which DLPack exports as their raw memory) applied, gradients
    detached; a meta tensor (no memory) is an InputError. Anything else is returned as it is."""
    if not is_torch_tensor(x):
        return x
    if getattr(x, "is_meta", False):
        raise InputError(f"input '{name}' is a meta tensor (shape only, no data); pass a tensor with values")
    if getattr(x, "requires_grad", False):
        x = x.detach()
    if x.is_neg() or x.is_conj():
        x = x.resolve_conj().resolve_neg()
    return x


# Note [bfloat16 on the host]: numpy has no bfloat16, so the CPU loader holds bfloat16 tensors as
# their uint16 bit patterns. Inputs may be torch bfloat16 tensors, numpy arrays of an extension
# bfloat16 dtype (ml_dtypes, as JAX uses) or uint16 arrays of bit patterns; outputs come back as torch
# bfloat16 tensors when an input was a torch tensor, in the extension dtype when an input had it, and
# as uint16 bit patterns otherwise.
BFLOAT16_BITS = np.dtype(np.uint16)


def is_bfloat16(x: Any) -> bool:
    return str(getattr(x, "dtype", "")) in ("torch.bfloat16", "bfloat16")


def to_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x.view(BFLOAT16_BITS) if x.dtype.name == "bfloat16" else x
    if hasattr(x, "__dlpack__"):
        x = resolve_views(x, name)
        if hasattr(x, "__dlpack_device__"):
            try:
                dev_type, _ = x.__dlpack_device__()
            except (ValueError, TypeError, RuntimeError, BufferError) as e:
                raise InputError(f"input '{name}' could not be read through DLPack: {e}") from None
            if int(dev_type) != 1:  # kDLCPU
                raise InputError(
                    f"input '{name}' lives on a device (DLPack device type {int(dev_type)}); "
                    "this module runs on the CPU: pass CPU tensors or load with device='cuda'"
                )
        if is_torch_tensor(x) and is_bfloat16(x):  # Note [bfloat16 on the host]
            torch = sys.modules["torch"]
            return to_numpy(x.view(torch.int16), name).view(BFLOAT16_BITS)
        try:
            return np.from_dlpack(x)
        except (BufferError, TypeError, RuntimeError, ValueError) as e:
            raise InputError(f"input '{name}' could not be read through DLPack: {e}") from None
    if isinstance(x, (list, tuple, int, float, bool)):
        return np.asarray(x)
    raise InputError(f"input '{name}' is a {type(x).__name__}; pass a numpy array or a tensor supporting DLPack")


def export_array(a: np.ndarray) -> np.ndarray:
    """A C-contiguous, writable, owned array (safe to hand out and to export through DLPack)."""
    if a.flags.c_contiguous and a.flags.writeable and a.flags.owndata:
        return a
    return np.array(a, order="C", copy=True)


def to_torch(a: np.ndarray, bfloat16: bool = False) -> Any:
    """`a` as a torch tensor sharing its memory; `bfloat16`: `a` holds bfloat16 bit patterns."""
    torch = sys.modules.get("torch")
    if torch is None:  # the caller passed torch tensors, so torch is loaded; be defensive anyway
        return a
    if bfloat16:
        return torch.from_dlpack(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_dlpack(a)
