"""Convolution weights packed for the generated kernels, and back.

In: a weight in torch's layout [C_out, C_in / groups, KH, KW] ("oihw"). Out: the same numbers in a
`Conv2dAttrs.weight_layout` a kernel reads — "ihwo" ([C_in / groups, KH, KW, C_out]: passes/
direct_conv.py, passes/channels_last.py) or "blocks" ([ceil(C_out / B) * KH, KW, C_in, B], B =
min(C_out, CHANNEL_BLOCK), the last block zero-padded: Note [Wide convolutions] in codegen/
cpu_conv_wide.py) — and from a packed weight back to torch's layout: the reference executor reads
"blocks" through it, and Note [Derived source weights] (artifact/writer.py) stores a packed weight
once, the source program's copy rebuilt from it.
"""

from __future__ import annotations

import numpy as np

from bladepack.opset.attrs import CHANNEL_BLOCK

PACKED_LAYOUTS = ("ihwo", "blocks")


def packed_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The packed weight's shape for a weight of torch's `shape` [C_out, C_in / groups, KH, KW]."""
    oc, cg, kh, kw = shape
    if layout == "ihwo":
        return (cg, kh, kw, oc)
    if layout == "blocks":
        blk = min(oc, CHANNEL_BLOCK)
        return (-(-oc // blk) * kh, kw, cg, blk)
    raise ValueError(f"conv2d weight_layout {layout!r}: packed layouts are {', '.join(PACKED_LAYOUTS)}")


def pack(layout: str, w: np.ndarray) -> np.ndarray:
    """`w` [C_out, C_in / groups, KH, KW] in `layout`, contiguous."""
    oc, cg, kh, kw = w.shape
    ihwo = np.asarray(w).transpose(1, 2, 3, 0)
    if layout == "ihwo":
        return np.ascontiguousarray(ihwo)
    shape = packed_shape(layout, w.shape)
    blk = shape[3]
    nblk = shape[0] // kh
    padded = np.zeros((cg, kh, kw, nblk * blk), ihwo.dtype)
    padded[..., :oc] = ihwo
    return np.ascontiguousarray(padded.reshape(cg, kh, kw, nblk, blk).transpose(3, 1, 2, 0, 4)).reshape(shape)


def unpack(layout: str, packed: np.ndarray, c_out: int) -> np.ndarray:
    """The weight [C_out, C_in / groups, KH, KW] that `pack(layout, ...)` turned into `packed`."""
    if layout == "ihwo":
        return np.ascontiguousarray(packed.transpose(3, 0, 1, 2))
    if layout != "blocks":
        raise ValueError(f"conv2d weight_layout {layout!r}: packed layouts are {', '.join(PACKED_LAYOUTS)}")
    kb, kw, cg, blk = packed.shape
    nblk = -(-c_out // blk)
    kh = kb // nblk
    w = packed.reshape(nblk, kh, kw, cg, blk).transpose(0, 4, 3, 1, 2).reshape(nblk * blk, cg, kh, kw)
    return np.ascontiguousarray(w[:c_out])
