"""aten → IR: reshapes, permutations, slicing, concatenation and indexing.

In: an FX node's args. Out: IR values. Views become RESHAPE / PERMUTE / SLICE / EXPAND whose result
shapes come from the exported graph's symbolic metadata (Note [Shapes come from types]).
"""

from __future__ import annotations

from typing import Any

import sympy

from bladepack.dtypes import DType
from bladepack.export.context import Ctx, Unsupported, Value, arg, converts, norm_axis
from bladepack.ir import OpKind, TensorType
from bladepack.ir.ops import ArangeAttrs, AxisAttrs, IndexAttrs, PadAttrs, PermuteAttrs, SliceAttrs, SymInt, TakeAttrs
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify

K = OpKind


@converts(
    "aten.view.default",
    "aten.reshape.default",
    "aten._unsafe_view.default",
    "aten.flatten.using_ints",
    "aten.unflatten.int",
    "aten.squeeze.dim",
    "aten.squeeze.dims",
    "aten.squeeze.default",
    "aten.unsqueeze.default",
    "aten.view_as.default",
    "aten.reshape_as.default",
)
def _reshape(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    out = ctx.out_type()
    if out.shape == ctx.t(x).shape:
        return x
    return ctx.emit(K.RESHAPE, (x,), out)


def reshape(ctx: Ctx, x: Value, shape: tuple[IRDim, ...]) -> Value:
    t = ctx.t(x)
    if t.shape == tuple(shape):
        return x
    return ctx.emit(K.RESHAPE, (x,), TensorType(t.dtype, shape))


@converts("aten.expand.default", "aten.expand_as.default", "aten.broadcast_to.default")
def _expand(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    out = ctx.out_type()
    if out.shape == ctx.t(x).shape:
        return x
    return ctx.emit(K.EXPAND, (x,), out)


def permute(ctx: Ctx, x: Value, perm: tuple[int, ...]) -> Value:
    if perm == tuple(range(len(perm))):
        return x
    t = ctx.t(x)
    return ctx.emit(K.PERMUTE, (x,), TensorType(t.dtype, tuple(t.shape[p] for p in perm)), PermuteAttrs(perm))


@converts("aten.permute.default")
def _permute(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    rank = ctx.t(x).rank
    return permute(ctx, x, tuple(norm_axis(int(p), rank) for p in args[1]))


@converts("aten.transpose.int", "aten.t.default", "aten.numpy_T.default")
def _transpose(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    rank = ctx.t(x).rank
    perm = list(range(rank))
    if len(args) >= 3:
        a, b = norm_axis(args[1], rank), norm_axis(args[2], rank)
    else:
        a, b = 0, rank - 1
    if rank >= 2:
        perm[a], perm[b] = perm[b], perm[a]
    return permute(ctx, x, tuple(perm))


def _norm_start(start: SymInt, size: IRDim) -> SymInt:
    if isinstance(start, int) and start < 0:
        s = size + start
        return int(s) if isinstance(s, int) or getattr(s, "is_Integer", False) else s
    return start


def slice_axis(ctx: Ctx, x: Value, axis: int, start: SymInt, step: int, length: IRDim) -> Value:
    t = ctx.t(x)
    if start == 0 and step == 1 and length == t.shape[axis]:
        return x
    shape = list(t.shape)
    shape[axis] = length
    return ctx.emit(K.SLICE, (x,), TensorType(t.dtype, tuple(shape)), SliceAttrs(axis, start, step))


@converts("aten.slice.Tensor")
def _slice(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    t = ctx.t(x)
    axis = norm_axis(arg(args, kwargs, 1, "dim", 0), t.rank)
    start = arg(args, kwargs, 2, "start", None)
    step = arg(args, kwargs, 4, "step", 1)
    if not isinstance(step, int) or step < 1:
        raise Unsupported(f"slice step {step!r}")
    length = ctx.out_type().shape[axis]
    if start is None:
        s: SymInt = 0
    else:
        s = _norm_start(ctx.s(start), t.shape[axis])
        # Clamp the start as Python slicing does, so an over-long start yields an empty slice safely.
        if not isinstance(s, int):
            s = sympy.Max(0, sympy.Min(s, t.shape[axis]))
    return slice_axis(ctx, x, axis, s, step, length)


@converts("aten.diff.default")
def _diff(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """x[1:] - x[:-1] along `dim`, `n` times, after `prepend` / `append` (torch.diff)."""
    x = ctx.v(args[0])
    n = arg(args, kwargs, 1, "n", 1)
    axis = norm_axis(arg(args, kwargs, 2, "dim", -1), ctx.t(x).rank)
    ends = [arg(args, kwargs, k, key) for k, key in ((3, "prepend"), (4, "append"))]
    if any(e is not None for e in ends):
        parts = [ctx.v(ends[0])] if ends[0] is not None else []
        parts += [x] + ([ctx.v(ends[1])] if ends[1] is not None else [])
        length = sum((ctx.t(p).shape[axis] for p in parts[1:]), ctx.t(parts[0]).shape[axis])
        shape = list(ctx.t(x).shape)
        shape[axis] = simplify(length)
        x = ctx.emit(K.CONCAT, tuple(parts), TensorType(ctx.t(x).dtype, tuple(shape)), AxisAttrs(axis))
    out_dtype = ctx.out_type().dtype
    for _ in range(n):
        t = ctx.t(x)
        length = simplify(t.shape[axis] - 1)
        hi, lo = slice_axis(ctx, x, axis, 1, 1, length), slice_axis(ctx, x, axis, 0, 1, length)
        shape = list(t.shape)
        shape[axis] = length
        op = K.NE if t.dtype is DType.BOOL else K.SUB  # torch.diff of booleans is their xor
        x = ctx.emit(op, (hi, lo), TensorType(t.dtype, tuple(shape)))
    return x if ctx.t(x).dtype is out_dtype else ctx.cast(x, out_dtype)


@converts("aten.narrow.default")
def _narrow(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    t = ctx.t(x)
    axis = norm_axis(args[1], t.rank)
    return slice_axis(ctx, x, axis, _norm_start(ctx.s(args[2]), t.shape[axis]), 1, ctx.s(args[3]))


@converts("aten.select.int")
def _select(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    t = ctx.t(x)
    axis = norm_axis(args[1], t.rank)
    start = _norm_start(ctx.s(args[2]), t.shape[axis])
    y = slice_axis(ctx, x, axis, start, 1, 1)
    return reshape(ctx, y, ctx.out_type().shape)


@converts("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.unbind.int")
def _split(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, ...]:
    assert ctx.node is not None
    x = ctx.v(args[0])
    t = ctx.t(x)
    name = str(ctx.node.target)
    axis = norm_axis(arg(args, kwargs, 1 if "unbind" in name else 2, "dim", 0), t.rank)
    outs = [ctx.type_of_val(v) for v in ctx.node.meta["val"]]
    results, start = [], sympy.Integer(0)
    for o in outs:
        length = 1 if "unbind" in name else o.shape[axis]
        s = int(start) if getattr(start, "is_Integer", False) else start
        y = slice_axis(ctx, x, axis, s, 1, length)
        results.append(reshape(ctx, y, o.shape))
        start = start + length
    return tuple(results)


@converts("aten.cat.default", "aten.concat.default", "aten.concatenate.default")
def _cat(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    axis = norm_axis(arg(args, kwargs, 1, "dim", 0), out.rank)
    parts = [ctx.cast(ctx.v(a), out.dtype) for a in args[0]]
    parts = [p for p in parts if not (ctx.t(p).rank == 1 and ctx.t(p).shape[0] == 0 and out.rank > 1)]
    if len(parts) == 1:
        return parts[0]
    return ctx.emit(K.CONCAT, parts, out, AxisAttrs(axis))


@converts("aten.stack.default")
def _stack(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    axis = norm_axis(arg(args, kwargs, 1, "dim", 0), out.rank)
    parts = []
    for a in args[0]:
        v = ctx.cast(ctx.v(a), out.dtype)
        s = list(ctx.t(v).shape)
        s.insert(axis, 1)
        parts.append(reshape(ctx, v, tuple(s)))
    return parts[0] if len(parts) == 1 else ctx.emit(K.CONCAT, parts, out, AxisAttrs(axis))


@converts("aten.repeat.default")
def _repeat(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    reps = ctx.dims(args[1])
    t = ctx.t(x)
    shape = (1,) * (len(reps) - t.rank) + t.shape
    inter = tuple(d for s in shape for d in (1, s))
    expanded = tuple(d for r, s in zip(reps, shape) for d in (r, s))
    y = reshape(ctx, x, inter)
    y = ctx.emit(K.EXPAND, (y,), TensorType(t.dtype, expanded))
    return reshape(ctx, y, ctx.out_type().shape)


@converts("aten.repeat_interleave.self_int")
def _repeat_interleave(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """x.repeat_interleave(r, dim) with r a number (constant or a size): each element r times in a row
    along `dim`, as an expand of a new axis after it (dim None: of the flattened x)."""
    x = ctx.v(args[0])
    r = ctx.s(arg(args, kwargs, 1, "repeats"))
    dim = arg(args, kwargs, 2, "dim", None)
    t = ctx.t(x)
    if dim is None:
        t = TensorType(t.dtype, (t.numel(),))
        x, dim = reshape(ctx, x, t.shape), 0
    axis = norm_axis(dim, t.rank)
    y = reshape(ctx, x, (*t.shape[: axis + 1], 1, *t.shape[axis + 1 :]))
    y = ctx.emit(K.EXPAND, (y,), TensorType(t.dtype, (*t.shape[: axis + 1], r, *t.shape[axis + 1 :])))
    return reshape(ctx, y, ctx.out_type().shape)


@converts("aten.index_select.default")
def _index_select(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    axis = norm_axis(args[1], ctx.t(x).rank)
    index = ctx.cast(ctx.v(args[2]), DType.INT64)
    return ctx.emit(K.TAKE, (x, index), attrs=TakeAttrs(axis))  # Note [Negative indices]: wrap=False


@converts("aten.embedding.default")
def _embedding(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return ctx.emit(K.TAKE, (ctx.v(args[0]), ctx.cast(ctx.v(args[1]), DType.INT64)), attrs=TakeAttrs(0))


@converts("aten.gather.default")
def _gather(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    axis = norm_axis(args[1], ctx.t(x).rank)
    return ctx.emit(K.GATHER, (x, ctx.cast(ctx.v(args[2]), DType.INT64)), attrs=TakeAttrs(axis))


@converts("aten.index.Tensor")
def _index(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    axes, idx = [], []
    for axis, a in enumerate(args[1]):
        if a is None:
            continue
        v = ctx.v(a)
        if ctx.t(v).dtype is DType.BOOL:
            raise Unsupported("boolean-mask indexing (data-dependent output shape)")
        axes.append(axis)
        idx.append(ctx.cast(v, DType.INT64))
    if not axes:
        return x
    return ctx.emit(K.INDEX, (x, *idx), attrs=IndexAttrs(tuple(axes)))


@converts("aten.constant_pad_nd.default", "aten.pad.default")
def _pad(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    mode = arg(args, kwargs, 2, "mode", "constant") if "aten.pad" in str(ctx.node.target) else "constant"
    x = ctx.v(args[0])
    if mode != "constant":
        return edge_pad(ctx, x, list(args[1]), mode)
    rank = ctx.t(x).rank
    flat = ctx.dims(args[1])
    value = arg(args, kwargs, 3 if "aten.pad" in str(ctx.node.target) else 2, "value", 0.0) or 0.0
    pads: list[tuple[SymInt, SymInt]] = [(0, 0)] * rank
    for i in range(len(flat) // 2):
        pads[rank - 1 - i] = (flat[2 * i], flat[2 * i + 1])
    for lo, hi in pads:
        for p in (lo, hi):
            if isinstance(p, int) and p < 0:
                raise Unsupported("negative padding (cropping)")
    return ctx.emit(K.PAD, (x,), attrs=PadAttrs(tuple(pads), float(value)))


def with_dim(t: TensorType, axis: int, size: IRDim) -> TensorType:
    shape = list(t.shape)
    shape[axis] = size
    return TensorType(t.dtype, tuple(shape))


def concat_along(ctx: Ctx, parts: list[Value], axis: int) -> Value:
    parts = [p for p in parts if ctx.t(p).shape[axis] != 0]
    if len(parts) == 1:
        return parts[0]
    t = ctx.t(parts[0])
    size: IRDim = 0
    for p in parts:
        size = simplify(size + ctx.t(p).shape[axis])
    return ctx.emit(K.CONCAT, tuple(parts), with_dim(t, axis, size), AxisAttrs(axis))


def reverse(ctx: Ctx, x: Value, axis: int) -> Value:
    """x read backwards along `axis`: a TAKE at positions n-1, n-2, .., 0."""
    t = ctx.t(x)
    n = t.shape[axis]
    if n == 1 or n == 0:
        return x
    start = n - 1 if isinstance(n, int) else simplify(n - 1)
    index = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (n,)), ArangeAttrs(start, -1))
    return ctx.emit(K.TAKE, (x, index), t, TakeAttrs(axis))


def edge_pad(ctx: Ctx, x: Value, pads: list[Any], mode: str) -> Value:
    """Reflection (the entries next to the edge, mirrored), replication (the edge repeated) or circular
    (the other end's entries) padding of the last len(pads) / 2 dims, innermost first as torch lists
    them."""
    if not all(isinstance(p, int) and p >= 0 for p in pads):
        raise Unsupported(f"{mode} padding {pads} (constant, non-negative only)")
    rank = ctx.t(x).rank
    for k in range(len(pads) // 2):
        axis = rank - 1 - k
        lo, hi = pads[2 * k], pads[2 * k + 1]
        if lo == hi == 0:
            continue
        t = ctx.t(x)
        n = t.shape[axis]
        if mode in ("reflect", "circular"):
            need = max(lo, hi) + (1 if mode == "reflect" else 0)  # reflection skips the edge entry
            if isinstance(n, int) and n < need:
                raise Unsupported(f"{mode} padding {max(lo, hi)} on a dim of size {n}")
            if not isinstance(n, int):
                ctx.assume(sympy.Ge(n, need), f"{mode} padding {max(lo, hi)} needs a dim of at least {need}")
        if mode == "reflect":
            left = reverse(ctx, slice_axis(ctx, x, axis, 1, 1, lo), axis) if lo else None
            right = reverse(ctx, slice_axis(ctx, x, axis, simplify(n - 1 - hi), 1, hi), axis) if hi else None
        elif mode == "circular":
            left = slice_axis(ctx, x, axis, simplify(n - lo), 1, lo) if lo else None
            right = slice_axis(ctx, x, axis, 0, 1, hi) if hi else None
        elif mode == "replicate":
            left = ctx.emit(K.EXPAND, (slice_axis(ctx, x, axis, 0, 1, 1),), with_dim(t, axis, lo)) if lo else None
            last = slice_axis(ctx, x, axis, simplify(n - 1), 1, 1)
            right = ctx.emit(K.EXPAND, (last,), with_dim(t, axis, hi)) if hi else None
        else:
            raise Unsupported(f"pad mode {mode!r}")
        x = concat_along(ctx, [p for p in (left, x, right) if p is not None], axis)
    return x


def _tri(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any], upper: bool) -> Value:
    """triu / tril as where(j - i >= k, x, 0) (or <= k), built from ARANGE and comparisons."""
    x = ctx.v(args[0])
    t = ctx.t(x)
    k = ctx.s(arg(args, kwargs, 1, "diagonal", 0))
    rows, cols = t.shape[-2], t.shape[-1]
    i = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (rows,)), ArangeAttrs(0, 1))
    i = reshape(ctx, i, (rows, 1))
    j = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (cols,)), ArangeAttrs(0, 1))
    diff = ctx.emit(K.SUB, (j, i), TensorType(DType.INT64, (rows, cols)))
    if not isinstance(k, int):
        raise Unsupported("triu/tril with a symbolic diagonal")
    kk = ctx.const(k, DType.INT64)
    keep = ctx.emit(K.GE if upper else K.LE, (diff, kk), TensorType(DType.BOOL, (rows, cols)))
    return ctx.emit(K.WHERE, (keep, x, ctx.const(0, t.dtype)), ctx.out_type())


converts("aten.triu.default")(lambda ctx, a, kw: _tri(ctx, a, kw, True))
converts("aten.tril.default")(lambda ctx, a, kw: _tri(ctx, a, kw, False))
