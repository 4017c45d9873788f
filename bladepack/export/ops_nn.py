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
from bladepack.ir import OpKind, TensorType
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
    TopkAttrs,
)
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify

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
    """The positions (a TOPK anchor kernel), then the values gathered from them; both sorted, best
    first, whatever `sorted` asked (torch leaves the order of an unsorted topk unspecified)."""
    if not isinstance(k, int):
        raise Unsupported(f"topk with a symbolic k ({k}): k must be a constant")
    if not 0 <= k <= MAX_TOPK:
        raise Unsupported(f"topk with k={k} (0 to {MAX_TOPK})")
    d = ctx.t(x).shape[axis]
    if isinstance(d, int) and k > d:
        raise Unsupported(f"topk with k={k} larger than the axis ({d})")
    if not isinstance(d, int):
        ctx.assume(sympy.Ge(d, k), f"{ctx.loc}: topk needs at least k={k} elements along axis {axis}")
    vt, it = ctx.out_type(0), ctx.out_type(1)
    idx = ctx.emit(K.TOPK, (x,), TensorType(DType.INT64, it.shape), TopkAttrs(axis, k, largest))
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


@converts("aten.max_pool2d.default")
def _max_pool(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return ctx.emit(K.MAX_POOL2D, (ctx.v(args[0]),), attrs=_pool_attrs(args, kwargs, True))


@converts("aten.max_pool2d_with_indices.default")
def _max_pool_idx(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Value, None]:
    return ctx.emit(K.MAX_POOL2D, (ctx.v(args[0]),), ctx.out_type(0), _pool_attrs(args, kwargs, True)), None


@converts("aten.avg_pool2d.default")
def _avg_pool(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return ctx.emit(K.AVG_POOL2D, (ctx.v(args[0]),), attrs=_pool_attrs(args, kwargs, False))


@converts("aten.adaptive_avg_pool2d.default", "aten._adaptive_avg_pool2d.default")
def _adaptive_avg_pool(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x = ctx.v(args[0])
    size = tuple(args[1]) if not isinstance(args[1], int) else (args[1], args[1])
    out = ctx.out_type()
    if size == (1, 1):
        return ctx.emit(K.MEAN, (x,), out, ReduceAttrs((ctx.t(x).rank - 2, ctx.t(x).rank - 1), True))
    if ctx.t(x).shape[-2:] == out.shape[-2:]:
        return x
    raise Unsupported(f"adaptive_avg_pool2d to {size} (only (1, 1) or the identity)")


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
