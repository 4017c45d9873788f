"""Core ATen ops that are compositions of IR ops: flip, roll, diagonal, reflection and replication
pads, slice / select scatter, fill / copy, any, var / std, vector norms (F.normalize), elu and the
functional group norm.

Index tensors built here (a reversed `arange`, a diagonal's positions) are always inside their axis,
so the TAKE / INDEX they feed never reports an index error. Where a composition holds only for some
arguments (slice_scatter with a step, a symbolic roll of a symbolic size), the rest is refused by name.
"""

from __future__ import annotations

from typing import Any

import sympy

from bladepack.dtypes import DType
from bladepack.export.context import Ctx, Unsupported, Value, arg, converts, norm_axis
from bladepack.export.ops_layout import concat_along, edge_pad, permute, reshape, reverse, slice_axis, with_dim
from bladepack.export.ops_nn import batch_norm, check_pool_lengths, grouped_norm, reduce_axes
from bladepack.ir import TensorType
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify
from bladepack.opset import OpKind
from bladepack.opset.attrs import (
    ArangeAttrs,
    ClampAttrs,
    ConstantAttrs,
    IndexAttrs,
    Pool2dAttrs,
    ReduceAttrs,
)

K = OpKind


# --------------------------------------------------------------------------- layout


@converts("aten.flip.default")
def _flip(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    rank = ctx.t(x).rank
    for d in arg(args, kwargs, 1, "dims", []):
        x = reverse(ctx, x, norm_axis(int(d), rank))
    return x


def _rolled(ctx: Ctx, x: Value, axis: int, shift: int) -> Value:
    """x rolled by `shift` along `axis`: the last `shift mod n` entries first."""
    n = ctx.t(x).shape[axis]
    k: IRDim = shift % n if isinstance(n, int) else sympy.Mod(shift, n)
    if k == 0:
        return x
    cut = simplify(n - k)
    tail = slice_axis(ctx, x, axis, cut, 1, k)
    head = slice_axis(ctx, x, axis, 0, 1, cut)
    return concat_along(ctx, [tail, head], axis)


@converts("aten.roll.default")
def _roll(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    t = ctx.t(x)
    shifts = arg(args, kwargs, 1, "shifts")
    dims = list(arg(args, kwargs, 2, "dims", []) or [])
    shifts = [shifts] if isinstance(shifts, int) else list(shifts)
    if not all(isinstance(s, int) for s in shifts):
        raise Unsupported("roll by a symbolic shift")
    if not dims:  # rolls the flattened tensor
        if len(shifts) != 1:
            raise Unsupported("roll without dims takes one shift")
        flat = reshape(ctx, x, (t.numel(),))
        return reshape(ctx, _rolled(ctx, flat, 0, shifts[0]), t.shape)
    for s, d in zip(shifts, dims):
        x = _rolled(ctx, x, norm_axis(int(d), t.rank), s)
    return x


@converts("aten.diagonal.default")
def _diagonal(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """The diagonal's positions (i + max(0, -offset), i + max(0, offset)) on dims dim1, dim2 moved last."""
    x = ctx.v(args[0])
    t = ctx.t(x)
    offset = int(arg(args, kwargs, 1, "offset", 0))
    d1 = norm_axis(int(arg(args, kwargs, 2, "dim1", 0)), t.rank)
    d2 = norm_axis(int(arg(args, kwargs, 3, "dim2", 1)), t.rank)
    if d1 == d2:
        raise Unsupported("diagonal of a dim with itself")
    out = ctx.out_type()
    length = out.shape[-1]
    rest = [a for a in range(t.rank) if a not in (d1, d2)]
    moved = permute(ctx, x, (*rest, d1, d2))
    rows = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (length,)), ArangeAttrs(max(0, -offset), 1))
    cols = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (length,)), ArangeAttrs(max(0, offset), 1))
    return ctx.emit(K.INDEX, (moved, rows, cols), out, IndexAttrs((t.rank - 2, t.rank - 1)))


def _edge_pad(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any], mode: str) -> Value:
    return edge_pad(ctx, ctx.v(args[0]), list(arg(args, kwargs, 1, "padding")), mode)


for _n in (1, 2, 3):
    converts(f"aten.reflection_pad{_n}d.default")(lambda ctx, a, kw: _edge_pad(ctx, a, kw, "reflect"))
    converts(f"aten.replication_pad{_n}d.default")(lambda ctx, a, kw: _edge_pad(ctx, a, kw, "replicate"))


def _scatter_slice(ctx: Ctx, x: Value, src: Value, axis: int, start: IRDim, end: IRDim) -> Value:
    t = ctx.t(x)
    src = ctx.cast(src, t.dtype)
    n = t.shape[axis]
    parts = [slice_axis(ctx, x, axis, 0, 1, start), src, slice_axis(ctx, x, axis, end, 1, simplify(n - end))]
    return concat_along(ctx, parts, axis)


def _bound(ctx: Ctx, v: Any, n: IRDim, default: IRDim) -> IRDim:
    """A slice bound as Python reads it: None is `default`, a negative one counts from the end, and it
    is clamped to [0, n]."""
    if v is None:
        return default
    s = ctx.s(v)
    if isinstance(s, int) and s < 0:
        s = simplify(n + s)
    if isinstance(s, int) and isinstance(n, int):
        return max(0, min(s, n))
    return simplify(sympy.Max(0, sympy.Min(s, n)))


@converts("aten.slice_scatter.default")
def _slice_scatter(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, src = ctx.v(args[0]), ctx.v(args[1])
    t = ctx.t(x)
    axis = norm_axis(int(arg(args, kwargs, 2, "dim", 0)), t.rank)
    if arg(args, kwargs, 5, "step", 1) != 1:
        raise Unsupported("slice_scatter with a step (only step 1)")
    n = t.shape[axis]
    start = _bound(ctx, arg(args, kwargs, 3, "start"), n, 0)
    end = _bound(ctx, arg(args, kwargs, 4, "end"), n, n)
    return _scatter_slice(ctx, x, src, axis, start, end)


@converts("aten.select_scatter.default")
def _select_scatter(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, src = ctx.v(args[0]), ctx.v(args[1])
    t = ctx.t(x)
    axis = norm_axis(int(args[2]), t.rank)
    index = ctx.s(args[3])
    n = t.shape[axis]
    if isinstance(index, int) and index < 0:
        index = simplify(n + index)
    src = reshape(ctx, src, with_dim(t, axis, 1).shape)
    return _scatter_slice(ctx, x, src, axis, index, simplify(index + 1))


@converts("aten.fill.Scalar", "aten.fill.Tensor")
def _fill(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    value = args[1] if len(args) > 1 else kwargs.get("value", kwargs.get("fill_value"))
    if isinstance(value, (bool, int, float)):
        return ctx.emit(K.FULL, (), out, ConstantAttrs(value))
    v = ctx.cast(ctx.v(value), out.dtype)
    return ctx.emit(K.EXPAND, (reshape(ctx, v, (1,) * out.rank) if out.rank else v,), out)


@converts("aten.copy.default")
def _copy(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """copy(x, src): src in x's dtype, broadcast to x's shape (x's values are not read)."""
    out = ctx.out_type()
    src = ctx.cast(ctx.v(args[1]), out.dtype)
    if ctx.t(src).shape == out.shape:
        return src
    t = ctx.t(src)
    lead = (1,) * (out.rank - t.rank)
    return ctx.emit(K.EXPAND, (reshape(ctx, src, (*lead, *t.shape)) if lead else src,), out)


# --------------------------------------------------------------------------- reductions


@converts("aten.any.default", "aten.any.dim", "aten.any.dims")
def _any(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """any = a count of the nonzero entries above 0 (an empty reduction is False, as in torch)."""
    x = ctx.v(args[0])
    t = ctx.t(x)
    out = ctx.out_type()
    dims = None if len(args) < 2 and "dim" not in kwargs else arg(args, kwargs, 1, "dim")
    keepdim = bool(arg(args, kwargs, 2, "keepdim", False))
    nonzero = ctx.emit(K.NE, (x, ctx.const(0, t.dtype)), TensorType(DType.BOOL, t.shape))
    if t.rank == 0:
        return nonzero
    count = ctx.emit(
        K.SUM,
        (ctx.cast(nonzero, DType.INT64),),
        TensorType(DType.INT64, out.shape),
        ReduceAttrs(reduce_axes(dims, t.rank), keepdim),
    )
    return ctx.emit(K.GT, (count, ctx.const(0, DType.INT64)), out)


def _count(ctx: Ctx, t: TensorType, axes: tuple[int, ...]) -> IRDim:
    n: IRDim = 1
    for a in axes:
        n = simplify(n * t.shape[a])
    return n


def variance(ctx: Ctx, x: Value, axes: tuple[int, ...], correction: float, keepdim: bool, out: TensorType) -> Value:
    """sum((x - mean)^2) / (N - correction) over `axes`, N their element count (a run-time value when
    the dims are symbolic)."""
    t = ctx.t(x)
    kept = TensorType(out.dtype, tuple(1 if a in axes else d for a, d in enumerate(t.shape)))
    mean = ctx.emit(K.MEAN, (x,), kept, ReduceAttrs(axes, True))
    d = ctx.emit(K.SUB, (x, mean), t)
    sq = ctx.emit(K.MUL, (d, d), t)
    total = ctx.emit(K.SUM, (sq,), out, ReduceAttrs(axes, keepdim))
    n = _count(ctx, t, axes)
    if isinstance(n, int):
        return ctx.emit(K.DIV, (total, ctx.const(float(n - correction), out.dtype)), out)
    if float(correction).is_integer():
        count = ctx.emit(K.FULL, (), TensorType(DType.INT64, ()), ConstantAttrs(simplify(n - int(correction))))
        return ctx.emit(K.DIV, (total, ctx.cast(count, out.dtype)), out)
    count = ctx.emit(K.FULL, (), TensorType(DType.INT64, ()), ConstantAttrs(n))
    denom = ctx.emit(
        K.SUB, (ctx.cast(count, out.dtype), ctx.const(float(correction), out.dtype)), TensorType(out.dtype, ())
    )
    return ctx.emit(K.DIV, (total, denom), out)


def _var_args(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, tuple[int, ...], float, bool]:
    assert ctx.node is not None
    x = ctx.v(args[0])
    if not DType(ctx.t(x).dtype).is_floating:
        raise Unsupported("var / std of an integer tensor")
    rank = ctx.t(x).rank
    dims = arg(args, kwargs, 1, "dim")
    if str(ctx.node.target).endswith(".dim"):  # var.dim(x, dim, unbiased, keepdim)
        unbiased = arg(args, kwargs, 2, "unbiased", True)
        correction: float = 1.0 if unbiased else 0.0
    else:  # .correction(x, dim, *, correction, keepdim)
        c = kwargs.get("correction", args[2] if len(args) > 2 else None)
        correction = 1.0 if c is None else float(c)
    keepdim = bool(kwargs.get("keepdim", args[3] if len(args) > 3 else False))
    return x, reduce_axes(dims, rank), correction, keepdim


@converts("aten.var.correction", "aten.var.dim")
def _var(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, axes, correction, keepdim = _var_args(ctx, args, kwargs)
    return variance(ctx, x, axes, correction, keepdim, ctx.out_type())


@converts("aten.std.correction", "aten.std.dim")
def _std(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, axes, correction, keepdim = _var_args(ctx, args, kwargs)
    out = ctx.out_type()
    return ctx.emit(K.SQRT, (variance(ctx, x, axes, correction, keepdim, out),), out)


@converts("aten.linalg_vector_norm.default")
def _vector_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """The p-norm over `dim`: sqrt(sum x^2) for 2 (F.normalize's), sum |x| for 1, max / min |x| for
    +-inf, the nonzero count for 0, (sum |x|^p)^(1/p) otherwise."""
    out = ctx.out_type()
    x = ctx.cast(ctx.v(args[0]), out.dtype)
    t = ctx.t(x)
    p = float(arg(args, kwargs, 1, "ord", 2))
    axes = reduce_axes(arg(args, kwargs, 2, "dim"), t.rank)
    keepdim = bool(arg(args, kwargs, 3, "keepdim", False))
    if t.rank == 0:
        return ctx.emit(K.ABS, (x,), out)
    reduce = ReduceAttrs(axes, keepdim)
    a = ctx.emit(K.ABS, (x,), t)
    if p == float("inf") or p == float("-inf"):
        return ctx.emit(K.AMAX if p > 0 else K.AMIN, (a,), out, reduce)
    if p == 0:
        nz = ctx.cast(ctx.emit(K.NE, (x, ctx.const(0, t.dtype)), TensorType(DType.BOOL, t.shape)), t.dtype)
        return ctx.emit(K.SUM, (nz,), out, reduce)
    if p == 1:
        return ctx.emit(K.SUM, (a,), out, reduce)
    if p == 2:
        sq = ctx.emit(K.MUL, (x, x), t)
        return ctx.emit(K.SQRT, (ctx.emit(K.SUM, (sq,), out, reduce),), out)
    powered = ctx.emit(K.POW, (a, ctx.const(p, t.dtype)), t)
    total = ctx.emit(K.SUM, (powered,), out, reduce)
    return ctx.emit(K.POW, (total, ctx.const(1.0 / p, t.dtype)), out)


# --------------------------------------------------------------------------- activations, norms


def _elu_of(ctx: Ctx, x: Value, alpha: float, scale: float, input_scale: float) -> Value:
    """scale * (x if x > 0 else alpha * expm1(input_scale * x))."""
    out = ctx.out_type()
    xs = x if input_scale == 1.0 else ctx.emit(K.MUL, (x, ctx.const(input_scale, out.dtype)), out)
    neg = ctx.emit(K.MUL, (ctx.emit(K.EXPM1, (xs,), out), ctx.const(alpha, out.dtype)), out)
    positive = ctx.emit(K.GT, (x, ctx.const(0, out.dtype)), TensorType(DType.BOOL, out.shape))
    y = ctx.emit(K.WHERE, (positive, x, neg), out)
    return y if scale == 1.0 else ctx.emit(K.MUL, (y, ctx.const(scale, out.dtype)), out)


@converts("aten.elu.default")
def _elu(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    alpha = float(arg(args, kwargs, 1, "alpha", 1.0))
    scale = float(arg(args, kwargs, 2, "scale", 1.0))
    return _elu_of(ctx, ctx.v(args[0]), alpha, scale, float(arg(args, kwargs, 3, "input_scale", 1.0)))


# SELU's constants, as torch writes them (aten/src/ATen/native/Activation.cpp)
_SELU_ALPHA = 1.6732632423543772848170429916717
_SELU_SCALE = 1.0507009873554804934193349852946


@converts("aten.selu.default")
def _selu(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return _elu_of(ctx, ctx.v(args[0]), _SELU_ALPHA, _SELU_SCALE, 1.0)


@converts("aten.celu.default")
def _celu(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """max(0, x) + min(0, alpha * expm1(x / alpha))."""
    out = ctx.out_type()
    x = ctx.v(args[0])
    alpha = float(arg(args, kwargs, 1, "alpha", 1.0))
    inner = ctx.emit(K.MUL, (x, ctx.const(1.0 / alpha, out.dtype)), out)
    neg = ctx.emit(K.MUL, (ctx.emit(K.EXPM1, (inner,), out), ctx.const(alpha, out.dtype)), out)
    return ctx.emit(
        K.ADD,
        (
            ctx.emit(K.CLAMP, (x,), out, ClampAttrs(0.0, None)),
            ctx.emit(K.CLAMP, (neg,), out, ClampAttrs(None, 0.0)),
        ),
        out,
    )


@converts("aten.native_group_norm.default")
def _native_group_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, None, None]:
    """The functional group norm torch decomposes to: its result (the mean and rstd are not served)."""
    x, w, b = ctx.v(args[0]), args[1], args[2]
    groups, eps = int(args[6]), float(args[7])
    out = ctx.out_type(0)
    return grouped_norm(ctx, x, groups, w, b, eps, out), None, None


@converts("aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit.default")
def _bn_batch_stats(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, None, None]:
    """Batch norm over the batch's own statistics (`track_running_stats=False`, or training mode):
    each channel normalized by its mean and biased variance over every other dim. The running
    statistics a training-mode call would also update are not kept (an artifact has no state)."""
    assert ctx.node is not None
    with_stats = str(ctx.node.target).endswith(".default")
    x = ctx.v(args[0])
    w, b = args[1], args[2]
    training = args[5] if with_stats else args[3]
    eps = float(args[7] if with_stats else args[5])
    out = ctx.out_type(0)
    if with_stats and not training:
        return batch_norm(ctx, args[0], w, b, args[3], args[4], eps, out), None, None
    t = ctx.t(x)
    axes = tuple(a for a in range(t.rank) if a != 1)
    kept = TensorType(out.dtype, tuple(1 if a in axes else d for a, d in enumerate(t.shape)))
    xf = ctx.cast(x, out.dtype)
    mean = ctx.emit(K.MEAN, (xf,), kept, ReduceAttrs(axes, True))
    var = variance(ctx, xf, axes, 0.0, True, kept)
    inv = ctx.emit(K.RSQRT, (ctx.emit(K.ADD, (var, ctx.const(eps, out.dtype)), kept),), kept)
    y = ctx.emit(K.MUL, (ctx.emit(K.SUB, (xf, mean), out), inv), out)
    channel = (t.shape[1],) + (1,) * (t.rank - 2)
    if w is not None:
        y = ctx.emit(K.MUL, (y, reshape(ctx, ctx.cast(ctx.v(w), out.dtype), channel)), out)
    if b is not None:
        y = ctx.emit(K.ADD, (y, reshape(ctx, ctx.cast(ctx.v(b), out.dtype), channel)), out)
    return y, None, None


@converts("aten.native_dropout.default")
def _native_dropout(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, None]:
    if args[2]:
        raise Unsupported("dropout in training mode (call model.eval())")
    return ctx.v(args[0]), None


@converts("aten._cdist_forward.default", "aten.cdist.default")
def _cdist(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    a, b = ctx.cast(ctx.v(args[0]), out.dtype), ctx.cast(ctx.v(args[1]), out.dtype)
    return pairwise_distance(ctx, a, b, float(arg(args, kwargs, 2, "p", 2.0)), out)


def pairwise_distance(ctx: Ctx, a: Value, b: Value, p: float, out: TensorType) -> Value:
    """The p-norm of every row pair, |x1[.., i, :] - x2[.., j, :]|_p, from the broadcast difference
    (torch's direct form; its matrix-product form for p = 2 on many rows rounds differently, within
    float32's error of this one)."""
    ta, tb = ctx.t(a), ctx.t(b)
    lead = out.shape[:-2]
    m = ta.shape[-1]
    pa = (*lead, ta.shape[-2], 1, m)
    pb = (*lead, 1, tb.shape[-2], m)
    a = ctx.emit(K.EXPAND, (a,), TensorType(out.dtype, (*lead, *ta.shape[-2:]))) if ta.shape[:-2] != lead else a
    b = ctx.emit(K.EXPAND, (b,), TensorType(out.dtype, (*lead, *tb.shape[-2:]))) if tb.shape[:-2] != lead else b
    full = TensorType(out.dtype, (*out.shape, m))
    diff = ctx.emit(K.SUB, (reshape(ctx, a, pa), reshape(ctx, b, pb)), full)
    d = diff
    reduce = ReduceAttrs((len(full.shape) - 1,), False)
    if p == 2:
        sq = ctx.emit(K.SUM, (ctx.emit(K.MUL, (d, d), full),), out, reduce)
        return ctx.emit(K.SQRT, (sq,), out)
    mag = ctx.emit(K.ABS, (d,), full)
    if p == float("inf"):
        return ctx.emit(K.AMAX, (mag,), out, reduce)
    if p == 0:
        nz = ctx.cast(ctx.emit(K.NE, (d, ctx.const(0, out.dtype)), TensorType(DType.BOOL, full.shape)), out.dtype)
        return ctx.emit(K.SUM, (nz,), out, reduce)
    if p == 1:
        return ctx.emit(K.SUM, (mag,), out, reduce)
    total = ctx.emit(K.SUM, (ctx.emit(K.POW, (mag, ctx.const(p, out.dtype)), full),), out, reduce)
    return ctx.emit(K.POW, (total, ctx.const(1.0 / p, out.dtype)), out)


def _one(v: Any, name: str) -> int:
    v = v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v
    if not isinstance(v, int):
        raise Unsupported(f"1-D pooling {name} {v!r}")
    return v


def _pool1d(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any], kind: OpKind) -> Value:
    """The 2-D pool over a height-1 image: [.., C, L] as [.., C, 1, L]. avg_pool1d's arguments are
    (kernel, stride, padding, ceil_mode, count_include_pad), max_pool1d's (kernel, stride, padding,
    dilation, ceil_mode)."""
    x = ctx.v(args[0])
    t = ctx.t(x)
    out = ctx.out_type()
    kernel = _one(args[1], "kernel_size")
    stride_arg = arg(args, kwargs, 2, "stride", [])
    stride = kernel if not stride_arg else _one(stride_arg, "stride")
    padding = _one(arg(args, kwargs, 3, "padding", 0), "padding")
    if kind is K.MAX_POOL2D:
        dilation = _one(arg(args, kwargs, 4, "dilation", 1), "dilation")
        ceil_mode = bool(arg(args, kwargs, 5, "ceil_mode", False))
        attrs = Pool2dAttrs((1, kernel), (1, stride), (0, padding), (1, dilation), ceil_mode)
    else:
        ceil_mode = bool(arg(args, kwargs, 4, "ceil_mode", False))
        include = bool(arg(args, kwargs, 5, "count_include_pad", True))
        attrs = Pool2dAttrs((1, kernel), (1, stride), (0, padding), (1, 1), ceil_mode, include)
    batch = (1,) * (t.rank == 2)  # an unbatched [C, L] is one image
    image = reshape(ctx, x, (*batch, *t.shape[:-1], 1, t.shape[-1]))
    if ceil_mode:
        check_pool_lengths(ctx, f"{kind.value[:3]}_pool1d", (1, t.shape[-1]), (1, out.shape[-1]), attrs)
    pooled = ctx.emit(kind, (image,), TensorType(out.dtype, (*batch, *out.shape[:-1], 1, out.shape[-1])), attrs)
    return reshape(ctx, pooled, out.shape)


@converts("aten.avg_pool1d.default")
def _avg_pool1d(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return _pool1d(ctx, args, kwargs, K.AVG_POOL2D)


@converts("aten.max_pool1d.default")
def _max_pool1d(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return _pool1d(ctx, args, kwargs, K.MAX_POOL2D)


@converts("aten.adaptive_avg_pool1d.default")
def _adaptive_avg_pool1d(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    size = _one(args[1], "output_size")
    out = ctx.out_type()
    if size == 1:
        return ctx.emit(K.MEAN, (x,), out, ReduceAttrs((ctx.t(x).rank - 1,), True))
    if ctx.t(x).shape[-1] == out.shape[-1]:
        return x
    raise Unsupported(f"adaptive_avg_pool1d to {size} (only 1 or the identity)")
