"""Core ATen ops built from the IR's gathers, scans and scatters: masked_scatter, embedding_bag,
col2im (`F.fold`) and pdist.

In: the FX node's arguments. Out: the IR values.

Note [Indexed compositions]: none of these needs a kernel of its own.
- masked_scatter: the k-th selected element of x takes source's k-th element (row-major); k is the
  running count of the mask (a CUMSUM) minus one, read through a TAKE of the flattened source, so a
  source shorter than the selection is an IndexRangeError, as torch raises.
- embedding_bag: the rows are a TAKE of the weight; each index's bag is the number of offsets at or
  before its position, minus one (a compare against every offset and a SUM); the bags are a SCATTER
  sum (mean: over the count of rows, empty bags 0) or amax over rows kept by padding_idx (empty bags
  0, as torch gives); per_sample_weights scale the rows of a sum.
- col2im: every patch element's place in the padded output is known at optimize time, so the
  columns are one SCATTER sum along the flattened spatial axis at a constant index, then the
  padding is sliced off.
- pdist: the pairwise distances of the rows (cdist's composition) read at the constant positions of
  the upper triangle, for a constant number of rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

from bladepack.dtypes import DType
from bladepack.export.context import Ctx, Unsupported, Value, arg, converts
from bladepack.export.ops_core import pairwise_distance
from bladepack.export.ops_layout import reshape
from bladepack.export.ops_scatter import scatter
from bladepack.ir import TensorType
from bladepack.opset import OpKind
from bladepack.opset.attrs import ArangeAttrs, AxisAttrs, ConstantAttrs, ReduceAttrs, SliceAttrs, TakeAttrs

K = OpKind


def _constant_index(ctx: Ctx, name: str, data: np.ndarray) -> Value:
    key = f"{name}:{len(ctx.weight_data)}"
    ctx.weight_data[key] = np.ascontiguousarray(data.astype(np.int64))
    return ctx.b.add_weight(key, TensorType(DType.INT64, tuple(int(d) for d in data.shape)))


@converts("aten.masked_scatter.default")
def _masked_scatter(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    x, mask, source = ctx.cast(ctx.v(args[0]), out.dtype), ctx.v(args[1]), ctx.cast(ctx.v(args[2]), out.dtype)
    mt = ctx.t(mask)
    if mt.rank < out.rank:
        mask = reshape(ctx, mask, (1,) * (out.rank - mt.rank) + mt.shape)
    if ctx.t(mask).shape != out.shape:
        mask = ctx.emit(K.EXPAND, (mask,), TensorType(DType.BOOL, out.shape))
    n = out.numel()
    flat = reshape(ctx, mask, (n,))
    count = ctx.emit(K.CUMSUM, (ctx.cast(flat, DType.INT64),), TensorType(DType.INT64, (n,)), AxisAttrs(0))
    k = ctx.emit(K.SUB, (count, ctx.const(1, DType.INT64)), TensorType(DType.INT64, (n,)))
    k = ctx.emit(K.WHERE, (flat, k, ctx.const(0, DType.INT64)), TensorType(DType.INT64, (n,)))
    src = reshape(ctx, source, (ctx.t(source).numel(),))
    picked = ctx.emit(K.TAKE, (src, k), TensorType(out.dtype, (n,)), TakeAttrs(0, False))
    return ctx.emit(K.WHERE, (mask, reshape(ctx, picked, out.shape), x), out)


@converts(
    "aten._embedding_bag.default",
    "aten._embedding_bag_forward_only.default",
    "aten.embedding_bag.default",
    "aten.embedding_bag.padding_idx",
)
def _embedding_bag(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, None, None, None]:
    weight, indices, offsets = ctx.v(args[0]), ctx.v(args[1]), ctx.v(args[2])
    mode = int(arg(args, kwargs, 4, "mode", 0))
    psw = arg(args, kwargs, 6, "per_sample_weights")
    last = bool(arg(args, kwargs, 7, "include_last_offset", False))
    padding = arg(args, kwargs, 8, "padding_idx", -1)
    padding = -1 if padding is None else int(padding)
    wt, it, ot = ctx.t(weight), ctx.t(indices), ctx.t(offsets)
    if it.rank != 1 or ot.rank != 1 or wt.rank != 2:
        raise Unsupported(f"embedding_bag of {it.rank}-D indices and {ot.rank}-D offsets (1-D each)")
    if mode not in (0, 1, 2):
        raise Unsupported(f"embedding_bag mode {mode} (0 sum, 1 mean, 2 max)")
    dt, dim = wt.dtype, wt.shape[1]
    length = it.shape[0]
    bags = sympy.sympify(ot.shape[0]) - 1 if last else ot.shape[0]
    bags = int(bags) if isinstance(bags, sympy.Integer) else bags
    if last and not isinstance(ot.shape[0], int):
        ctx.assume(sympy.Ge(ot.shape[0], 1), f"{ctx.loc}: embedding_bag with include_last_offset needs an offset")
    idx = ctx.cast(indices, DType.INT64)
    rows = ctx.emit(K.TAKE, (weight, idx), TensorType(dt, (length, dim)), TakeAttrs(0, False))
    starts = ctx.cast(offsets, DType.INT64)
    if last:
        starts = ctx.emit(K.SLICE, (starts,), TensorType(DType.INT64, (bags,)), SliceAttrs(0, 0, 1))
    pos = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (length,)), ArangeAttrs(0, 1))
    began = ctx.emit(
        K.GE,
        (reshape(ctx, pos, (length, 1)), reshape(ctx, starts, (1, bags))),
        TensorType(DType.BOOL, (length, bags)),
    )
    count = ctx.emit(
        K.SUM, (ctx.cast(began, DType.INT64),), TensorType(DType.INT64, (length,)), ReduceAttrs((1,), False)
    )
    bag = ctx.emit(K.SUB, (count, ctx.const(1, DType.INT64)), TensorType(DType.INT64, (length,)))
    keep = None
    if padding >= 0:
        keep = ctx.emit(K.NE, (idx, ctx.const(padding, DType.INT64)), TensorType(DType.BOOL, (length,)))
    if psw is not None:
        if mode != 0:
            raise Unsupported("embedding_bag per_sample_weights with a mode other than sum")
        scale = reshape(ctx, ctx.cast(ctx.v(psw), dt), (length, 1))
        rows = ctx.emit(K.MUL, (rows, scale), TensorType(dt, (length, dim)))
    wide = TensorType(DType.INT64, (length, dim))
    at = ctx.emit(K.EXPAND, (reshape(ctx, bag, (length, 1)),), wide)
    out = TensorType(dt, (bags, dim))
    zeros = ctx.emit(K.FULL, (), out, ConstantAttrs(dt.scalar(0.0)))
    if keep is not None:
        kept = reshape(ctx, keep, (length, 1))
        fill = -np.inf if mode == 2 and dt.is_floating else 0.0
        rows = ctx.emit(K.WHERE, (kept, rows, ctx.const(fill, dt)), TensorType(dt, (length, dim)))
    if mode == 0:
        return scatter(ctx, zeros, 0, at, rows, "sum", True), None, None, None
    ones = (
        ctx.cast(keep, dt)
        if keep is not None
        else ctx.emit(K.FULL, (), TensorType(dt, (length,)), ConstantAttrs(dt.scalar(1.0)))
    )
    per_bag = TensorType(dt, (bags,))
    counted = scatter(ctx, ctx.emit(K.FULL, (), per_bag, ConstantAttrs(dt.scalar(0.0))), 0, bag, ones, "sum", True)
    empty = reshape(ctx, ctx.emit(K.EQ, (counted, ctx.const(0, dt)), TensorType(DType.BOOL, (bags,))), (bags, 1))
    if mode == 1:
        if not dt.is_floating:
            raise Unsupported(f"embedding_bag mean of {dt.value}")
        total = scatter(ctx, zeros, 0, at, rows, "sum", True)
        mean = ctx.emit(K.DIV, (total, reshape(ctx, counted, (bags, 1))), out)
        return ctx.emit(K.WHERE, (empty, zeros, mean), out), None, None, None
    top = scatter(ctx, zeros, 0, at, rows, "amax", False)
    return ctx.emit(K.WHERE, (empty, zeros, top), out), None, None, None


def _ints(v: Any, n: int, what: str) -> list[int]:
    vals = [int(x) for x in v] if isinstance(v, (list, tuple)) else [int(v)] * n
    if len(vals) != n:
        raise Unsupported(f"col2im {what} {v!r} ({n} values)")
    return vals


@converts("aten.col2im.default")
def _col2im(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    out = ctx.out_type()
    (oh, ow), (kh, kw) = _ints(args[1], 2, "output_size"), _ints(args[2], 2, "kernel_size")
    (dh, dw), (ph, pw), (sh, sw) = (
        _ints(a, 2, w) for a, w in ((args[3], "dilation"), (args[4], "padding"), (args[5], "stride"))
    )
    t = ctx.t(x)
    batched = t.rank == 3
    if not batched:
        x = reshape(ctx, x, (1, *t.shape))
    n, ck, blocks = ctx.t(x).shape
    bh = (oh + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    bw = (ow + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if not isinstance(ck, int) or ck % (kh * kw) or blocks != bh * bw:
        raise Unsupported(
            f"col2im of {t} into {oh}x{ow} with a {kh}x{kw} kernel (expected [N, C*{kh * kw}, {bh * bw}])"
        )
    c = ck // (kh * kw)
    hp, wp = oh + 2 * ph, ow + 2 * pw
    ki, kj, y, z = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(bh), np.arange(bw), indexing="ij")
    where = ((ki * dh + y * sh) * wp + (kj * dw + z * sw)).reshape(-1)  # per column entry, its output pixel
    cols = kh * kw * bh * bw
    src = reshape(ctx, x, (n, c, cols))
    index = ctx.emit(
        K.EXPAND,
        (reshape(ctx, _constant_index(ctx, "col2im", where), (1, 1, cols)),),
        TensorType(DType.INT64, (n, c, cols)),
    )
    flat = TensorType(out.dtype, (n, c, hp * wp))
    total = scatter(
        ctx,
        ctx.emit(K.FULL, (), flat, ConstantAttrs(out.dtype.scalar(0.0))),
        2,
        index,
        ctx.cast(src, out.dtype),
        "sum",
        True,
    )
    img = reshape(ctx, total, (n, c, hp, wp))
    if ph:
        img = ctx.emit(K.SLICE, (img,), TensorType(out.dtype, (n, c, oh, wp)), SliceAttrs(2, ph, 1))
    if pw:
        img = ctx.emit(K.SLICE, (img,), TensorType(out.dtype, (n, c, oh, ow)), SliceAttrs(3, pw, 1))
    return img if batched else reshape(ctx, img, out.shape)


@converts("aten._pdist_forward.default", "aten.pdist.default")
def _pdist(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    x = ctx.cast(ctx.v(args[0]), out.dtype)
    p = float(arg(args, kwargs, 1, "p", 2.0))
    rows = ctx.t(x).shape[0]
    if not isinstance(rows, int):
        raise Unsupported(f"pdist over a dynamic number of rows ({rows}): the pairs' positions need a constant count")
    full = pairwise_distance(ctx, x, x, p, TensorType(out.dtype, (rows, rows)))
    i, j = np.triu_indices(rows, 1)
    pairs = _constant_index(ctx, "pdist", i * rows + j)
    return ctx.emit(K.TAKE, (reshape(ctx, full, (rows * rows,)), pairs), out, TakeAttrs(0, False))
