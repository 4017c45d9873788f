"""Weights packed for the generated kernels, and back.

Convolutions: a weight in torch's layout [C_out, C_in / groups, KH, KW] ("oihw") becomes the
`Conv2dAttrs.weight_layout` a kernel reads — "ihwo" ([C_in / groups, KH, KW, C_out]: passes/
direct_conv.py, passes/channels_last.py) or "blocks" ([ceil(C_out / B) * KH, KW, C_in, B], B =
min(C_out, CHANNEL_BLOCK), the last block zero-padded) or "tap_panels" (the same in blocks of PANEL:
[ceil(C_out / 16) * KH, KW, C_in, 16], Note [Weight panels] in codegen/cpu_conv_wide.py) or "winograd"
(a 3x3 weight's Winograd transform G g G^T, 4 x 4 per input and output channel, packed as "blocks"
packs a 4x4 weight: Note [Winograd convolutions] in codegen/cpu_conv_winograd.py) or "hwio_winograd" (a
3x3 weight of at most CHANNEL_BLOCK output channels kept both ways, [9 + 16, 1, C_in, C_out]: the filter
[3, 3, C_in, C_out], then its transform [4, 4, C_in, C_out]: Note [Winograd at few channels] in
codegen/cpu_conv_winograd.py); `unpack` turns a packed weight back (the reference executor reads
"blocks", "tap_panels", "winograd" and "hwio_winograd" through it; "winograd" back only to within
rounding, so `EXACT_LAYOUTS` leaves it out). Linear layers: `unpack_linear` rebuilds a weight ([N, K] as nn.Linear holds it, or [K, N]) from
the copies passes/dense_layers.py and passes/pack_linear.py store — "dense" ([K, 1, 1, N]), "panels"
(pieces of K, each [ceil(N / 16), K_i, 1, 16], the last panel zero-padded) or "kn" ([K, N]). Note
[Derived source weights] (artifact/writer.py) stores a packed weight once and rebuilds the source
program's copy through these.
"""

from __future__ import annotations

import numpy as np

from bladepack.opset.attrs import CHANNEL_BLOCK, PANEL

PACKED_LAYOUTS = ("ihwo", "blocks", "tap_panels", "winograd", "hwio_winograd")
EXACT_LAYOUTS = (
    "ihwo",
    "blocks",
    "tap_panels",
    "hwio_winograd",
)  # unpack gives the weight's bytes back (Note [Derived source weights])
LINEAR_LAYOUTS = ("dense", "kn", "panels")

# Winograd's F(2x2, 3x3) weight transform (Lavin and Gray, "Fast Algorithms for Convolutional Neural
# Networks", 2016): U = G g G^T for a 3x3 filter g; G_LEFT_INVERSE G = I takes U back to g.
WINOGRAD_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])
WINOGRAD_G_LEFT_INVERSE = np.array([[1.0, 0.0, 0.0, 0.0], [-1.0, 2.0, 0.0, -1.0], [0.0, 0.0, 0.0, 1.0]])


def winograd_filters(w: np.ndarray) -> np.ndarray:
    """G g G^T of each 3x3 filter of `w` [C_out, C_in, 3, 3]: [C_out, C_in, 4, 4] in w's dtype, computed
    in float64 (each value rounded once)."""
    u = np.einsum("ik,ockl,jl->ocij", WINOGRAD_G, np.asarray(w, np.float64), WINOGRAD_G)
    return np.asarray(u.astype(w.dtype))


def packed_shape(layout: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The packed weight's shape for a weight of torch's `shape` [C_out, C_in / groups, KH, KW]."""
    oc, cg, kh, kw = shape
    if layout == "ihwo":
        return (cg, kh, kw, oc)
    if layout == "blocks":
        blk = min(oc, CHANNEL_BLOCK)
        return (-(-oc // blk) * kh, kw, cg, blk)
    if layout == "tap_panels":
        return (-(-oc // PANEL) * kh, kw, cg, PANEL)
    if layout == "winograd":
        return packed_shape("blocks", (oc, cg, 4, 4))
    if layout == "hwio_winograd":
        return (kh * kw + 16, 1, cg, oc)
    raise ValueError(f"conv2d weight_layout {layout!r}: packed layouts are {', '.join(PACKED_LAYOUTS)}")


def pack(layout: str, w: np.ndarray) -> np.ndarray:
    """`w` [C_out, C_in / groups, KH, KW] in `layout`, contiguous."""
    if layout == "winograd":
        if tuple(w.shape[2:]) != (3, 3):
            raise ValueError(f"the winograd layout packs 3x3 filters, not {w.shape[2]}x{w.shape[3]}")
        return pack("blocks", winograd_filters(w))
    if layout == "hwio_winograd":
        if tuple(w.shape[2:]) != (3, 3) or w.shape[0] > CHANNEL_BLOCK:
            raise ValueError(f"the hwio_winograd layout packs 3x3 filters of at most {CHANNEL_BLOCK} outputs")
        both = (np.asarray(w).transpose(2, 3, 1, 0), winograd_filters(w).transpose(2, 3, 1, 0))
        return np.ascontiguousarray(np.concatenate([u.reshape(-1, 1, *u.shape[2:]) for u in both]))
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
    if layout == "winograd":
        u = unpack("blocks", packed, c_out)
        g = np.einsum("ik,ockl,jl->ocij", WINOGRAD_G_LEFT_INVERSE, u.astype(np.float64), WINOGRAD_G_LEFT_INVERSE)
        return np.asarray(g.astype(packed.dtype))
    if layout == "hwio_winograd":  # the filter itself, the first 9 of the 25
        return np.ascontiguousarray(packed[:9, 0].reshape(3, 3, *packed.shape[2:]).transpose(3, 2, 0, 1))
    if layout not in ("blocks", "tap_panels"):
        raise ValueError(f"conv2d weight_layout {layout!r}: packed layouts are {', '.join(PACKED_LAYOUTS)}")
    kb, kw, cg, blk = packed.shape
    nblk = -(-c_out // blk)
    kh = kb // nblk
    w = packed.reshape(nblk, kh, kw, cg, blk).transpose(0, 4, 3, 1, 2).reshape(nblk * blk, cg, kh, kw)
    return np.ascontiguousarray(w[:c_out])


def unpack_linear(layout: str, pieces: list[np.ndarray], shape: tuple[int, ...], transposed: bool) -> np.ndarray:
    """The 2-D weight of `shape` whose [K, N] matrix (its transpose when `transposed`) was stored as
    the flat `pieces` in `layout`; raises ValueError where their sizes do not fit."""
    if len(shape) != 2:
        raise ValueError(f"a linear layer's weight has 2 dims, not {len(shape)}")
    k, n = (shape[1], shape[0]) if transposed else (shape[0], shape[1])
    if layout in ("dense", "kn"):
        if len(pieces) != 1 or pieces[0].size != k * n:
            raise ValueError(f"a {layout} copy of a [{k}, {n}] matrix holds {k * n} values")
        kn = pieces[0].reshape(k, n)
    elif layout == "panels":
        count = -(-n // PANEL)
        rows = []
        for piece in pieces:
            if piece.size % (count * PANEL):
                raise ValueError(f"a panel piece of {piece.size} values for {n} columns")
            ki = piece.size // (count * PANEL)
            rows.append(piece.reshape(count, ki, PANEL).transpose(1, 0, 2).reshape(ki, count * PANEL)[:, :n])
        kn = np.concatenate(rows, axis=0) if rows else np.zeros((0, n), pieces[0].dtype if pieces else np.float32)
        if kn.shape[0] != k:
            raise ValueError(f"panel pieces of {kn.shape[0]} rows for a K of {k}")
    else:
        raise ValueError(f"linear weight layout {layout!r}: packed layouts are {', '.join(LINEAR_LAYOUTS)}")
    return np.ascontiguousarray(kn.T if transposed else kn)
