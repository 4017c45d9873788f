"""aten → IR: reductions, normalizations, matmul, pooling and attention (convolutions: ops_conv.py).

In: an FX node's args. Out: IR values. Composite ops that the IR does not keep whole are decomposed
here: scaled_dot_product_attention into matmul / softmax / masking, inference batch norm into a
per-channel scale and shift (folded into new weights when its statistics are weights).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import sympy

from bladepack.dtypes import DType
from bladepack.export.context import Ctx, Unsupported, Value, arg, converts, norm_axis
from bladepack.export.ops_conv import pair, weight_name
from bladepack.export.ops_layout import permute, reshape
from bladepack.ir import OpKind, TensorType, Tri
from bladepack.ir.broadcast import broadcast_shapes
from bladepack.ir.ops import (
    MAX_TOPK,
    ArangeAttrs,
    ArgReduceAttrs,
    AxisAttrs,
    MatmulAttrs,
    NormAttrs,
    Pool2dAttrs,
    ReduceAttrs,
    SafeSoftmaxAttrs,
    SliceAttrs,
    SortAttrs,
    TopkAttrs,
)
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify
from bladepack.ir.windows import window_count

K = OpKind


# --------------------------------------------------------------------------- reductions


def reduce_axes(dims: Any, rank: int) -> tuple[int, ...]:
    """A reduction's `dim` argument as sorted axes; None or empty means every axis."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({norm_axis(int(d), rank) for d in dims}))


def _reduce(op: OpKind, dims_index: int | None) -> Any:
    def convert(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
        out = ctx.out_type()
        x = ctx.cast(ctx.v(args[0]), out.dtype)
        rank = ctx.t(x).rank
        dims = None if dims_index is None else arg(args, kwargs, dims_index, "dim")
        keepdim = bool(arg(args, kwargs, 2, "keepdim", False)) if dims_index is not None else False
        if rank == 0:
            return x
        return ctx.emit(op, (x,), out, ReduceAttrs(reduce_axes(dims, rank), keepdim))

    return convert


for _name, _op in (("sum", K.SUM), ("mean", K.MEAN), ("prod", K.PROD)):
    converts(f"aten.{_name}.default")(_reduce(_op, None))
converts("aten.sum.dim_IntList")(_reduce(K.SUM, 1))
converts("aten.mean.dim")(_reduce(K.MEAN, 1))
converts("aten.prod.dim_int")(_reduce(K.PROD, 1))
converts("aten.amax.default")(_reduce(K.AMAX, 1))
converts("aten.amin.default")(_reduce(K.AMIN, 1))
converts("aten.max.default")(_reduce(K.AMAX, None))
converts("aten.min.default")(_reduce(K.AMIN, None))


def _arg_reduce(ctx: Ctx, op: OpKind, x: Value, dim: Any, keepdim: bool, out: TensorType) -> Value:
    t = ctx.t(x)
    if dim is None:
        flat = reshape(ctx, x, (t.numel(),))
        return ctx.emit(op, (flat,), out, ArgReduceAttrs(0, False))
    return ctx.emit(op, (x,), out, ArgReduceAttrs(norm_axis(dim, t.rank), keepdim))


@converts("aten.argmax.default", "aten.argmin.default")
def _argmax(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    op = K.ARGMAX if "argmax" in str(ctx.node.target) else K.ARGMIN
    dim, keepdim = arg(args, kwargs, 1, "dim"), bool(arg(args, kwargs, 2, "keepdim", False))
    if dim is None and keepdim:
        raise Unsupported("argmax/argmin over all dims with keepdim=True")
    return _arg_reduce(ctx, op, ctx.v(args[0]), dim, keepdim, ctx.out_type())


@converts("aten.max.dim", "aten.min.dim")
def _max_dim(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, Value]:
    assert ctx.node is not None
    is_max = "max" in str(ctx.node.target)
    x = ctx.v(args[0])
    axis = norm_axis(args[1], ctx.t(x).rank)
    keepdim = bool(arg(args, kwargs, 2, "keepdim", False))
    values = ctx.emit(K.AMAX if is_max else K.AMIN, (x,), ctx.out_type(0), ReduceAttrs((axis,), keepdim))
    idx = ctx.emit(K.ARGMAX if is_max else K.ARGMIN, (x,), ctx.out_type(1), ArgReduceAttrs(axis, keepdim))
    return values, idx


@converts("aten.topk.default")
def _topk(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, Value]:
    x = ctx.v(args[0])
    t = ctx.t(x)
    k = ctx.s(args[1])
    axis = norm_axis(int(arg(args, kwargs, 2, "dim", -1)), t.rank)
    largest = bool(arg(args, kwargs, 3, "largest", True))
    """The positions (a TOPK anchor kernel for a constant k up to MAX_TOPK, else the first k of a SORT:
    Note [Sort kernel]), then the values gathered from them; both sorted, best first, whatever `sorted`
    asked (torch leaves the order of an unsorted topk unspecified)."""
    if isinstance(k, int) and k < 0:
        raise Unsupported(f"topk with k={k}: k must be at least 0")
    d = ctx.t(x).shape[axis]
    if isinstance(d, int) and isinstance(k, int) and k > d:
        raise Unsupported(f"topk with k={k} larger than the axis ({d})")
    if not (isinstance(d, int) and isinstance(k, int)):
        ctx.assume(sympy.Ge(d, k), f"{ctx.loc}: topk needs at least k={k} elements along axis {axis}")
    vt, it = ctx.out_type(0), ctx.out_type(1)
    if isinstance(k, int) and k <= MAX_TOPK:
        idx = ctx.emit(K.TOPK, (x,), TensorType(DType.INT64, it.shape), TopkAttrs(axis, k, largest))
    else:
        order = ctx.emit(K.SORT, (x,), TensorType(DType.INT64, t.shape), SortAttrs(axis, largest))
        idx = ctx.emit(K.SLICE, (order,), TensorType(DType.INT64, it.shape), SliceAttrs(axis, 0, 1))
    return ctx.emit(K.GATHER, (x, idx), vt, AxisAttrs(axis)), idx


@converts("aten.sort.default", "aten.sort.stable")
def _sort(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, Value]:
    """The positions by a SORT along an axis of any length (Note [Sort kernel]: torch's stable order,
    which an unstable torch.sort also gives here), the values gathered from the input at them."""
    x = ctx.v(args[0])
    if str(ctx.node.target if ctx.node is not None else "").endswith("stable"):  # (x, *, stable, dim, descending)
        axis, descending = arg((), kwargs, 0, "dim", -1), arg((), kwargs, 0, "descending", False)
    else:
        axis, descending = arg(args, kwargs, 1, "dim", -1), arg(args, kwargs, 2, "descending", False)
    values, it = ctx.out_type(0), ctx.out_type(1)
    return _sorted(ctx, x, int(axis), bool(descending), values, it)


@converts("aten.argsort.default", "aten.argsort.stable")
def _argsort(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    if str(ctx.node.target if ctx.node is not None else "").endswith("stable"):
        axis, descending = arg((), kwargs, 0, "dim", -1), arg((), kwargs, 0, "descending", False)
    else:
        axis, descending = arg(args, kwargs, 1, "dim", -1), arg(args, kwargs, 2, "descending", False)
    t = ctx.t(x)
    return _sorted(ctx, x, int(axis), bool(descending), TensorType(t.dtype, t.shape), ctx.out_type())[1]


def _sorted(ctx: Ctx, x: Value, axis_arg: int, descending: bool, vt: TensorType, it: TensorType) -> tuple[Value, Value]:
    t = ctx.t(x)
    axis = norm_axis(axis_arg, t.rank)
    n = t.shape[axis] if t.rank else 1
    if t.rank == 0 or n == 1:
        zeros = ctx.emit(K.MUL, (ctx.cast(x, DType.INT64), ctx.const(0, DType.INT64)), it)
        return x, zeros
    idx = ctx.emit(K.SORT, (x,), TensorType(DType.INT64, it.shape), SortAttrs(axis, descending))
    return ctx.emit(K.GATHER, (x, idx), vt, AxisAttrs(axis)), idx


@converts("aten.cumsum.default")
def _cumsum(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    x = ctx.cast(ctx.v(args[0]), out.dtype)
    return ctx.emit(K.CUMSUM, (x,), out, AxisAttrs(norm_axis(args[1], max(out.rank, 1))))


@converts("aten._softmax.default", "aten.softmax.int", "aten._log_softmax.default", "aten.log_softmax.int")
def _softmax(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    op = K.LOG_SOFTMAX if "log_softmax" in str(ctx.node.target) else K.SOFTMAX
    out = ctx.out_type()
    x = ctx.cast(ctx.v(args[0]), out.dtype)
    return ctx.emit(op, (x,), out, AxisAttrs(norm_axis(args[1], max(out.rank, 1))))


def _norm(ctx: Ctx, op: OpKind, x: Any, shape: Any, w: Any, b: Any, eps: float, out: TensorType) -> Value:
    inputs = [ctx.v(x)]
    if w is not None:
        inputs.append(ctx.v(w))
    if b is not None:
        inputs.append(ctx.v(b))
    attrs = NormAttrs(len(shape), float(eps), w is not None, b is not None)
    return ctx.emit(op, inputs, out, attrs)


@converts("aten.layer_norm.default")
def _layer_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    w, b = arg(args, kwargs, 2, "weight"), arg(args, kwargs, 3, "bias")
    eps = arg(args, kwargs, 4, "eps", 1e-5)
    return _norm(ctx, K.LAYER_NORM, args[0], args[1], w, b, eps, ctx.out_type())


@converts("aten.native_layer_norm.default")
def _native_layer_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, None, None]:
    y = _norm(ctx, K.LAYER_NORM, args[0], args[1], args[2], args[3], args[4], ctx.out_type(0))
    return y, None, None


@converts("aten.rms_norm.default")
def _rms_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    eps = arg(args, kwargs, 3, "eps")
    if eps is None:
        eps = float(np.finfo(out.dtype.to_numpy() if out.dtype is not DType.BFLOAT16 else np.float32).eps)
    return _norm(ctx, K.RMS_NORM, args[0], args[1], arg(args, kwargs, 2, "weight"), None, eps, out)


# --------------------------------------------------------------------------- matmul


def matmul(ctx: Ctx, a: Value, b: Value, transpose_b: bool = False) -> Value:
    ta, tb = ctx.t(a), ctx.t(b)
    n = tb.shape[-2] if transpose_b else tb.shape[-1]
    shape = broadcast_shapes(ta.shape[:-2], tb.shape[:-2]) + (ta.shape[-2], n)
    return ctx.emit(K.MATMUL, (a, b), TensorType(ta.dtype, shape), MatmulAttrs(transpose_b))


@converts("aten.matmul.default", "aten.mm.default", "aten.bmm.default")
def _matmul(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    a, b = ctx.cast(ctx.v(args[0]), out.dtype), ctx.cast(ctx.v(args[1]), out.dtype)
    ta, tb = ctx.t(a), ctx.t(b)
    if ta.rank == 1:
        a = reshape(ctx, a, (1, ta.shape[0]))
    if tb.rank == 1:
        b = reshape(ctx, b, (tb.shape[0], 1))
    return reshape(ctx, matmul(ctx, a, b), out.shape)


def _scaled(ctx: Ctx, v: Value, factor: Any) -> Value:
    if factor == 1:
        return v
    t = ctx.t(v)
    return ctx.emit(K.MUL, (v, ctx.const(factor, t.dtype)), t)


@converts("aten.linear.default")
def _linear(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    x, w = ctx.v(args[0]), ctx.v(args[1])
    bias = arg(args, kwargs, 2, "bias")
    if ctx.t(w).rank != 2:
        raise Unsupported("linear with a weight that is not 2-D")
    tx = ctx.t(x)
    x2 = x if tx.rank >= 2 else reshape(ctx, x, (1, tx.shape[0]))
    y = matmul(ctx, x2, w, transpose_b=True)
    if bias is not None:
        y = ctx.emit(K.ADD, (y, ctx.v(bias)), ctx.t(y))
    return reshape(ctx, y, out.shape)


@converts("aten.addmm.default", "aten.baddbmm.default")
def _addmm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    beta, alpha = arg(args, kwargs, 3, "beta", 1), arg(args, kwargs, 4, "alpha", 1)
    y = _scaled(ctx, matmul(ctx, ctx.v(args[1]), ctx.v(args[2])), alpha)
    if beta == 0:
        return y
    return ctx.emit(K.ADD, (y, _scaled(ctx, ctx.v(args[0]), beta)), out)


# --------------------------------------------------------------------------- pooling


def batch_norm(ctx: Ctx, x: Any, w: Any, b: Any, mean: Any, var: Any, eps: float, out: TensorType) -> Value:
    xv = ctx.v(x)
    c = ctx.t(xv).shape[1]
    if not isinstance(c, int):
        raise Unsupported("batch norm over a dynamic channel dim")
    names = [None if a is None else weight_name(ctx, ctx.v(a)) for a in (w, b, mean, var)]
    if mean is None or var is None or any(n is None for n, a in zip(names, (w, b, mean, var)) if a is not None):
        raise Unsupported("batch norm whose statistics are not weights (training mode?)")
    data = [None if n is None else ctx.weight_data[n].astype(np.float64) for n in names]
    wd = data[0] if data[0] is not None else np.ones(c)
    bd = data[1] if data[1] is not None else np.zeros(c)
    scale = wd / np.sqrt(data[3] + eps)  # type: ignore[operator]
    shift = bd - data[2] * scale  # type: ignore[operator]
    bshape = (c,) + (1,) * (ctx.t(xv).rank - 2)
    base = names[2]
    vals = []
    for suffix, arr in (("scale", scale), ("shift", shift)):
        name = f"{base}:{suffix}"
        ctx.weight_data[name] = arr.astype(out.dtype.to_numpy()).reshape(bshape)
        vals.append(ctx.b.add_weight(name, TensorType(out.dtype, bshape)))
    y = ctx.emit(K.MUL, (ctx.cast(xv, out.dtype), vals[0]), out)
    return ctx.emit(K.ADD, (y, vals[1]), out)


@converts("aten._native_batch_norm_legit_no_training.default")
def _bn_no_training(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, None, None]:
    x, w, b, mean, var, _momentum, eps = args[:7]
    return batch_norm(ctx, x, w, b, mean, var, eps, ctx.out_type(0)), None, None


@converts("aten.batch_norm.default")
def _bn(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, w, b, mean, var, training, _momentum, eps = args[:8]
    if training:
        raise Unsupported("batch norm in training mode (call model.eval())")
    return batch_norm(ctx, x, w, b, mean, var, eps, ctx.out_type())


@converts("aten.group_norm.default")
def _group_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, groups = ctx.v(args[0]), int(args[1])
    w, b = arg(args, kwargs, 2, "weight"), arg(args, kwargs, 3, "bias")
    return grouped_norm(ctx, x, groups, w, b, float(arg(args, kwargs, 4, "eps", 1e-5)), ctx.out_type())


@converts("aten.instance_norm.default")
def _instance_norm(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, w, b, mean, var, use_input_stats, _momentum, eps = args[:8]
    if not use_input_stats:  # track_running_stats in eval: batch norm's inference form
        return batch_norm(ctx, x, w, b, mean, var, eps, ctx.out_type())
    xv = ctx.v(x)
    c = ctx.t(xv).shape[1]
    if not isinstance(c, int):
        raise Unsupported("instance norm over a dynamic channel dim")
    return grouped_norm(ctx, xv, c, w, b, float(eps), ctx.out_type())


def grouped_norm(ctx: Ctx, xv: Value, groups: int, w: Any, b: Any, eps: float, out: TensorType) -> Value:
    """Group norm (instance norm: one group per channel): each [C / groups, *spatial] block of a
    sample normalized as one layer-norm row, then the per-channel scale and shift."""
    t = ctx.t(xv)
    n, c, rest = t.shape[0], t.shape[1], t.shape[2:]
    if not isinstance(c, int) or c % groups:
        raise Unsupported(f"group norm of {c} channels in {groups} groups")
    row: IRDim = c // groups
    for d in rest:
        row = simplify(row * d)
    rows = reshape(ctx, ctx.cast(xv, out.dtype), (n, groups, row))
    normed = ctx.emit(K.LAYER_NORM, (rows,), TensorType(out.dtype, (n, groups, row)), NormAttrs(1, eps, False, False))
    y = reshape(ctx, normed, out.shape)
    per_channel = (c,) + (1,) * len(rest)
    if w is not None:
        y = ctx.emit(K.MUL, (y, reshape(ctx, ctx.cast(ctx.v(w), out.dtype), per_channel)), out)
    if b is not None:
        y = ctx.emit(K.ADD, (y, reshape(ctx, ctx.cast(ctx.v(b), out.dtype), per_channel)), out)
    return y


def _pool_attrs(args: tuple[Any, ...], kwargs: dict[str, Any], with_dilation: bool) -> Pool2dAttrs:
    kernel = pair(args[1], "kernel_size")
    stride_arg = arg(args, kwargs, 2, "stride", [])
    stride = kernel if not stride_arg else pair(stride_arg, "stride")
    padding = pair(arg(args, kwargs, 3, "padding", 0), "padding")
    if with_dilation:
        dilation = pair(arg(args, kwargs, 4, "dilation", 1), "dilation")
        ceil_mode = bool(arg(args, kwargs, 5, "ceil_mode", False))
        return Pool2dAttrs(kernel, stride, padding, dilation, ceil_mode)
    ceil_mode = bool(arg(args, kwargs, 4, "ceil_mode", False))
    include = bool(arg(args, kwargs, 5, "count_include_pad", True))
    if arg(args, kwargs, 6, "divisor_override") is not None:
        raise Unsupported("avg_pool2d with divisor_override")
    return Pool2dAttrs(kernel, stride, padding, (1, 1), ceil_mode, include)


def check_pool_lengths(ctx: Ctx, what: str, ins: tuple[IRDim, ...], outs: tuple[IRDim, ...], a: Pool2dAttrs) -> None:
    """Note [Exported pool lengths]: with ceil_mode, torch.export may record a pool's output length as
    one branch of torch's rule, the one the samples took (a stride-2 pool exported at odd lengths
    records ceil(n / 2) and guards the parity, which the declared range cannot say). An artifact built
    on that length would compute a wrong shape at the other lengths. Each pooled axis whose recorded
    length is not provably torch's rule becomes a shape constraint, checked at every call: an input
    where they differ is refused with this message instead of answered wrongly."""
    for axis, (n, out) in enumerate(zip(ins, outs, strict=True)):
        pad = a.padding[axis]
        want = window_count(n, a.kernel[axis], a.stride[axis], a.dilation[axis], pad, pad, a.ceil_mode)
        if ctx.env.prove_eq(out, want) is Tri.YES:
            continue
        ctx.assume(
            sympy.Eq(out, want),
            f"{ctx.loc}: {what}'s output length along pooled axis {axis} was exported as {out} for an input "
            f"length of {n}, which holds only for some lengths (torch's rule: {want}); torch.export "
            "specialized it to the samples' lengths, and the artifact accepts the lengths where the two agree",
        )


def _pool2d(ctx: Ctx, kind: OpKind, x: Value, out: TensorType, a: Pool2dAttrs) -> Value:
    if a.ceil_mode:
        check_pool_lengths(
            ctx, str(ctx.node.target if ctx.node is not None else kind.value), ctx.t(x).shape[-2:], out.shape[-2:], a
        )
    return ctx.emit(kind, (x,), out, a)


@converts("aten.max_pool2d.default")
def _max_pool(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return _pool2d(ctx, K.MAX_POOL2D, ctx.v(args[0]), ctx.out_type(), _pool_attrs(args, kwargs, True))


@converts("aten.max_pool2d_with_indices.default")
def _max_pool_idx(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, None]:
    return _pool2d(ctx, K.MAX_POOL2D, ctx.v(args[0]), ctx.out_type(0), _pool_attrs(args, kwargs, True)), None


@converts("aten.avg_pool2d.default")
def _avg_pool(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return _pool2d(ctx, K.AVG_POOL2D, ctx.v(args[0]), ctx.out_type(), _pool_attrs(args, kwargs, False))


@converts(
    "aten.adaptive_avg_pool2d.default",
    "aten._adaptive_avg_pool2d.default",
    "aten.adaptive_avg_pool3d.default",
    "aten._adaptive_avg_pool3d.default",
)
def _adaptive_avg_pool(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """Adaptive average pooling whose every pooled axis keeps its size or becomes 1: the mean over the
    axes that become 1 (an adaptive bin spans the whole axis)."""
    x = ctx.v(args[0])
    out = ctx.out_type()
    t = ctx.t(x)
    nd = 3 if "3d" in str(ctx.node.target if ctx.node is not None else "") else 2
    axes = []
    for ax in range(t.rank - nd, t.rank):
        if out.shape[ax] == 1 and t.shape[ax] != 1:
            axes.append(ax)
        elif out.shape[ax] != t.shape[ax]:
            raise Unsupported(
                f"adaptive_avg_pool{nd}d from {list(t.shape[-nd:])} to {list(out.shape[-nd:])} (each pooled axis "
                "must become 1 or keep its size)"
            )
    return ctx.emit(K.MEAN, (x,), out, ReduceAttrs(tuple(axes), True)) if axes else x


def _triple(v: Any, name: str) -> tuple[int, int, int]:
    v = [v] if isinstance(v, int) else list(v)
    if len(v) == 1:
        v = v * 3
    if len(v) != 3 or not all(isinstance(x, int) for x in v):
        raise Unsupported(f"{name}={v!r} (3-D pooling takes one or three ints)")
    return (v[0], v[1], v[2])


def _pool3d(ctx: Ctx, kind: OpKind, args: tuple[Any, ...], kwargs: dict[str, Any], out: TensorType) -> Value:
    """Note [Separable 3-D pooling]: a max or average over a [kd, kh, kw] box is the max or average over
    the depth window of the [kh, kw] pools of each depth slice, and everything torch varies per axis
    (output sizes with ceil_mode, padding, an average's divisor: the product of each axis's window
    length, padded or not) is the same per axis. So the 2-D pool runs over [N * C, D, H, W] (depths as
    channels), then a [kd, 1] pool over [N * C, 1, D, Ho * Wo]."""
    x = ctx.v(args[0])
    t = ctx.t(x)
    if t.rank not in (4, 5):
        raise Unsupported(f"3-D pooling of a rank-{t.rank} tensor (rank 4 or 5)")
    kernel = _triple(args[1], "kernel_size")
    stride_arg = arg(args, kwargs, 2, "stride", [])
    stride = kernel if not stride_arg else _triple(stride_arg, "stride")
    padding = _triple(arg(args, kwargs, 3, "padding", 0), "padding")
    if kind == K.MAX_POOL2D:
        dilation = _triple(arg(args, kwargs, 4, "dilation", 1), "dilation")
        ceil_mode, include = bool(arg(args, kwargs, 5, "ceil_mode", False)), True
    else:
        dilation = (1, 1, 1)
        ceil_mode = bool(arg(args, kwargs, 4, "ceil_mode", False))
        include = bool(arg(args, kwargs, 5, "count_include_pad", True))
        if arg(args, kwargs, 6, "divisor_override") is not None:
            raise Unsupported("avg_pool3d with divisor_override")
    planes: IRDim = 1
    for d in t.shape[:-3]:
        planes = simplify(planes * d)
    depth, (od, oh, ow) = t.shape[-3], out.shape[-3:]
    hw = Pool2dAttrs(
        (kernel[1], kernel[2]),
        (stride[1], stride[2]),
        (padding[1], padding[2]),
        (dilation[1], dilation[2]),
        ceil_mode,
        include,
    )
    slices = _pool2d(
        ctx, kind, reshape(ctx, x, (planes, depth, *t.shape[-2:])), TensorType(out.dtype, (planes, depth, oh, ow)), hw
    )
    d = Pool2dAttrs((kernel[0], 1), (stride[0], 1), (padding[0], 0), (dilation[0], 1), ceil_mode, include)
    flat = simplify(oh * ow)
    pooled = _pool2d(
        ctx, kind, reshape(ctx, slices, (planes, 1, depth, flat)), TensorType(out.dtype, (planes, 1, od, flat)), d
    )
    return reshape(ctx, pooled, out.shape)


@converts("aten.max_pool3d_with_indices.default", "aten.max_pool3d.default")
def _max_pool3d(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value | tuple[Value, None]:
    if "with_indices" in str(ctx.node.target if ctx.node is not None else ""):
        return _pool3d(ctx, K.MAX_POOL2D, args, kwargs, ctx.out_type(0)), None
    return _pool3d(ctx, K.MAX_POOL2D, args, kwargs, ctx.out_type())


@converts("aten.avg_pool3d.default")
def _avg_pool3d(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return _pool3d(ctx, K.AVG_POOL2D, args, kwargs, ctx.out_type())


# --------------------------------------------------------------------------- attention


@converts("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    q, k, v = (ctx.cast(ctx.v(a), out.dtype) for a in args[:3])
    mask = arg(args, kwargs, 3, "attn_mask")
    if arg(args, kwargs, 4, "dropout_p", 0.0):
        raise Unsupported("scaled_dot_product_attention with dropout_p > 0")
    causal = bool(arg(args, kwargs, 5, "is_causal", False))
    scale = arg(args, kwargs, 6, "scale")
    if arg(args, kwargs, 7, "enable_gqa", False):
        k, v = (_repeat_heads(ctx, t, ctx.t(q).shape[-3]) for t in (k, v))
    tq = ctx.t(q)
    if scale is None:
        e = tq.shape[-1]
        if not isinstance(e, int):
            raise Unsupported("attention with a symbolic head dim and no explicit scale")
        scale = 1.0 / math.sqrt(e)
    scores = _scaled(ctx, matmul(ctx, q, k, transpose_b=True), scale)
    st = ctx.t(scores)
    if causal:
        rows, cols = st.shape[-2], st.shape[-1]
        i = reshape(ctx, ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (rows,)), ArangeAttrs(0, 1)), (rows, 1))
        j = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (cols,)), ArangeAttrs(0, 1))
        keep = ctx.emit(K.LE, (j, i), TensorType(DType.BOOL, (rows, cols)))
        scores = ctx.emit(K.WHERE, (keep, scores, ctx.const(-math.inf, st.dtype)), st)
    if mask is not None:
        m = ctx.v(mask)
        shape = broadcast_shapes(ctx.t(m).shape, st.shape)
        st = TensorType(st.dtype, shape)
        if ctx.t(m).dtype is DType.BOOL:
            scores = ctx.emit(K.WHERE, (m, scores, ctx.const(-math.inf, st.dtype)), st)
        else:
            scores = ctx.emit(K.ADD, (scores, ctx.cast(m, st.dtype)), st)
    # a fully masked row gives 0, as torch's attention does (Note [Safe softmax] in codegen/emitter.py)
    probs = ctx.emit(K.SOFTMAX, (scores,), st, SafeSoftmaxAttrs(st.rank - 1))
    return reshape(ctx, matmul(ctx, probs, v), out.shape)


def _repeat_heads(ctx: Ctx, x: Value, heads: IRDim) -> Value:
    t = ctx.t(x)
    kv = t.shape[-3]
    if kv == heads:
        return x
    rep = sympy.simplify(sympy.sympify(heads) / kv)
    if not rep.is_Integer:
        raise Unsupported("grouped-query attention whose head counts do not divide")
    lead, s, e = t.shape[:-3], t.shape[-2], t.shape[-1]
    y = reshape(ctx, x, (*lead, kv, 1, s, e))
    y = ctx.emit(K.EXPAND, (y,), TensorType(t.dtype, (*lead, kv, int(rep), s, e)))
    return reshape(ctx, y, (*lead, heads, s, e))


__all__ = ["matmul", "permute"]
