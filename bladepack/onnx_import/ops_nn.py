"""ONNX → IR: matrix products, convolution, pooling, normalizations, softmax, reductions and scans.

In: an ONNX node's operands. Out: IR values. 1-D convolutions and pools run as 2-D ones over a unit
height; asymmetric or SAME padding becomes an explicit PAD (with symbolic amounts when the input is
dynamic); inference BatchNormalization with constant statistics folds into one scale and shift.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

from bladepack.dtypes import DType
from bladepack.ir import OpKind, TensorType, Tri
from bladepack.ir.ops import (
    MAX_TOPK,
    ArgReduceAttrs,
    AxisAttrs,
    Conv2dAttrs,
    MatmulAttrs,
    NormAttrs,
    PadAttrs,
    Pool2dAttrs,
    ReduceAttrs,
    SliceAttrs,
    SortAttrs,
    TopkAttrs,
)
from bladepack.ir.types import IRDim
from bladepack.ir.windows import window_count
from bladepack.onnx_import.context import (
    OnnxCtx,
    OVal,
    Unsupported,
    arg,
    converts,
    known,
    need,
    norm_axis,
    simplify_dim,
)
from bladepack.onnx_import.ops_elementwise import binary, scalar
from bladepack.onnx_import.ops_layout import permute

K = OpKind


def _float_input(x: OVal, op: str) -> None:
    if not x.type.dtype.is_floating:
        raise Unsupported(f"{op} of {x.type.dtype.value}")


# --------------------------------------------------------------------------- matrix products


def _matmul_ir(ctx: OnnxCtx, a: OVal, b: OVal, transpose_b: bool = False) -> OVal:
    ta, tb = a.type, b.type
    k_b = tb.shape[-1] if transpose_b else tb.shape[-2]
    n = tb.shape[-2] if transpose_b else tb.shape[-1]
    if ctx.eq(ta.shape[-1], k_b) is Tri.NO:
        raise Unsupported(f"matrix product of {list(ta.shape)} and {list(tb.shape)} (contracting dims differ)")
    batch = ctx.broadcast_shapes(ta.shape[:-2], tb.shape[:-2])
    t = TensorType(ta.dtype, (*batch, ta.shape[-2], n))
    return ctx.out(K.MATMUL, (ctx.tensor(a), ctx.tensor(b)), t, MatmulAttrs(transpose_b))


def _reshaped(ctx: OnnxCtx, x: OVal, shape: tuple[IRDim, ...]) -> OVal:
    if x.numeric is not None:
        return known(x.numeric.reshape([int(d) for d in shape]), x.type.dtype)
    return OVal(TensorType(x.type.dtype, shape), ctx.reshape(ctx.tensor(x), shape))


@converts("MatMul")
def _matmul(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    a, b = need(ins, 0), need(ins, 1)
    if a.type.dtype is not b.type.dtype or not a.type.dtype.is_floating:
        raise Unsupported(f"MatMul of {a.type.dtype.value} and {b.type.dtype.value} (floating types of one kind)")
    a2 = _reshaped(ctx, a, (1, a.type.shape[0])) if a.type.rank == 1 else a
    b2 = _reshaped(ctx, b, (b.type.shape[0], 1)) if b.type.rank == 1 else b
    y = _matmul_ir(ctx, a2, b2)
    shape = list(y.type.shape)
    if b.type.rank == 1:
        shape.pop(-1)
    if a.type.rank == 1:
        shape.pop(-2 if b.type.rank != 1 else -1)
    return [_reshaped(ctx, y, tuple(shape)) if len(shape) != y.type.rank else y]


@converts("Gemm")
def _gemm(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    a, b, c = need(ins, 0), need(ins, 1), arg(ins, 2)
    _float_input(a, "Gemm")
    if a.type.rank != 2 or b.type.rank != 2:
        raise Unsupported("Gemm of operands that are not 2-D")
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if int(ctx.attr("transA", 0)):
        a = permute(ctx, a, (1, 0))
    y = _matmul_ir(ctx, a, b, transpose_b=bool(int(ctx.attr("transB", 0))))
    dt = y.type.dtype
    if alpha != 1.0:
        y = binary(ctx, K.MUL, y, scalar(ctx, alpha, dt), dt, dt)
    if c is not None and beta != 0.0:
        if beta != 1.0:
            c = binary(ctx, K.MUL, c, scalar(ctx, beta, dt), dt, dt)
        out = binary(ctx, K.ADD, y, c, dt, dt)
        if out.type.shape != y.type.shape:
            raise Unsupported(f"Gemm bias of shape {list(c.type.shape)} for a result {list(y.type.shape)}")
        y = out
    return [y]


# --------------------------------------------------------------------------- convolution and pooling


def _spatial(ctx: OnnxCtx, x: OVal, op: str, most: int = 2) -> int:
    n = x.type.rank - 2
    if not 1 <= n <= most:
        raise Unsupported(f"{op} over {n} spatial dims (1-D{' to 3-D' if most == 3 else ' and 2-D'} are supported)")
    return n


def _to_2d(ctx: OnnxCtx, x: OVal) -> OVal:
    """[N, C, L] → [N, C, 1, L]."""
    s = x.type.shape
    return _reshaped(ctx, x, (s[0], s[1], 1, s[2]))


def _window_params(ctx: OnnxCtx, n: int, kernel: list[int]) -> tuple[list[int], list[int], list[IRDim]]:
    strides = ctx.ints("strides") or [1] * n
    dil = ctx.ints("dilations") or [1] * n
    pads: list[IRDim] = list(ctx.ints("pads") or [0] * (2 * n))
    if len(strides) != n or len(dil) != n or len(pads) != 2 * n or len(kernel) != n:
        raise Unsupported("strides, dilations, pads or kernel_shape of the wrong length")
    return strides, dil, pads


def _auto_pads(
    ctx: OnnxCtx, sizes: tuple[IRDim, ...], kernel: list[int], strides: list[int], dil: list[int], pads: list[IRDim]
) -> list[IRDim]:
    mode = ctx.text("auto_pad", "NOTSET")
    n = len(kernel)
    if mode in ("NOTSET", ""):
        return pads
    if mode == "VALID":
        return [0] * (2 * n)
    if mode not in ("SAME_UPPER", "SAME_LOWER"):
        raise Unsupported(f"auto_pad={mode}")
    lo: list[IRDim] = []
    hi: list[IRDim] = []
    for d, k, s, dl in zip(sizes, kernel, strides, dil):
        out = sympy.ceiling(sympy.sympify(d) / s)
        total = sympy.Max((out - 1) * s + (k - 1) * dl + 1 - d, 0)
        small = simplify_dim(sympy.floor(total / 2))
        big = simplify_dim(total - small)
        lo.append(small if mode == "SAME_UPPER" else big)
        hi.append(big if mode == "SAME_UPPER" else small)
    return lo + hi


def _explicit_pad(ctx: OnnxCtx, x: OVal, lo: list[IRDim], hi: list[IRDim], value: float) -> OVal:
    rank = x.type.rank
    n = len(lo)
    pads = tuple([(0, 0)] * (rank - n) + list(zip(lo, hi)))
    shape = tuple(simplify_dim(sympy.sympify(d) + p[0] + p[1]) for d, p in zip(x.type.shape, pads))
    return ctx.out(K.PAD, (ctx.tensor(x),), TensorType(x.type.dtype, shape), PadAttrs(pads, value))


@converts("Conv")
def _conv(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x, w, b = need(ins, 0), need(ins, 1), arg(ins, 2)
    _float_input(x, "Conv")
    n = _spatial(ctx, x, "Conv")
    kernel = ctx.ints("kernel_shape") or [int(d) for d in w.type.shape[2:]]
    if not all(isinstance(d, int) for d in w.type.shape):
        raise Unsupported("a convolution weight with dynamic dims")
    strides, dil, pads = _window_params(ctx, n, kernel)
    pads = _auto_pads(ctx, x.type.shape[2:], kernel, strides, dil, pads)
    lo, hi = pads[:n], pads[n:]
    if n == 1:
        x, w = _to_2d(ctx, x), _to_2d(ctx, w)
        kernel, strides, dil, lo, hi = [1, *kernel], [1, *strides], [1, *dil], [0, *lo], [0, *hi]
    if lo != hi or not all(isinstance(p, int) for p in lo):  # asymmetric or symbolic: an explicit PAD
        x = _explicit_pad(ctx, x, lo, hi, 0.0)
        lo = hi = [0, 0]
    group = int(ctx.attr("group", 1))
    c_in = x.type.shape[1]
    if isinstance(c_in, int) and c_in != w.type.shape[1] * group:
        raise Unsupported(f"{c_in} input channels for a weight of {w.type.shape[1]} per group x {group} groups")
    sizes = [window_count(d, k, s, dl, p, p) for d, k, s, dl, p in zip(x.type.shape[2:], kernel, strides, dil, lo)]
    t = TensorType(x.type.dtype, (x.type.shape[0], w.type.shape[0], *sizes))
    inputs = [ctx.tensor(x), ctx.tensor(w)] + ([ctx.tensor(b)] if b is not None else [])
    attrs = Conv2dAttrs((strides[0], strides[1]), (int(lo[0]), int(lo[1])), (dil[0], dil[1]), group, b is not None)
    y = ctx.out(K.CONV2D, inputs, t, attrs)
    if n == 1:
        y = _reshaped(ctx, y, (t.shape[0], t.shape[1], t.shape[3]))
    return [y]


def _pool(ctx: OnnxCtx, ins: list[OVal | None], op: OpKind) -> OVal:
    x = need(ins, 0)
    _float_input(x, op.value)
    n = _spatial(ctx, x, op.value, most=3)
    kernel = ctx.ints("kernel_shape")
    if kernel is None:
        raise Unsupported("a pool without kernel_shape")
    strides, dil, pads = _window_params(ctx, n, kernel)
    pads = _auto_pads(ctx, x.type.shape[2:], kernel, strides, dil, pads)
    ceil = bool(int(ctx.attr("ceil_mode", 0)))
    include = bool(int(ctx.attr("count_include_pad", 0)))
    lo, hi = pads[:n], pads[n:]
    if n == 1:
        x = _to_2d(ctx, x)
        kernel, strides, dil, lo, hi = [1, *kernel], [1, *strides], [1, *dil], [0, *lo], [0, *hi]
    if op is K.AVG_POOL2D and any(d != 1 for d in dil):
        raise Unsupported("AveragePool with dilations")
    if lo != hi or not all(isinstance(p, int) for p in lo):
        if op is K.AVG_POOL2D and not include:
            raise Unsupported("AveragePool with asymmetric padding and count_include_pad=0")
        if ceil:
            raise Unsupported("ceil_mode with asymmetric padding")
        x = _explicit_pad(ctx, x, lo, hi, float("-inf") if op is K.MAX_POOL2D else 0.0)
        lo = hi = [0] * len(lo)
    if op is K.MAX_POOL2D and any(int(p) * 2 > k for p, k in zip(lo, kernel)):  # pads over half a window: explicit
        x = _explicit_pad(ctx, x, lo, hi, float("-inf"))
        lo = hi = [0] * len(lo)
    sizes = [
        window_count(d, k, s, dl, p, p, ceil) for d, k, s, dl, p in zip(x.type.shape[2:], kernel, strides, dil, lo)
    ]
    t = TensorType(x.type.dtype, (x.type.shape[0], x.type.shape[1], *sizes))
    if n == 3:  # Note [Separable 3-D pooling] (export/ops_nn.py): each depth slice's 2-D pool, then along the depths
        planes = simplify_dim(sympy.sympify(t.shape[0]) * t.shape[1])
        depth, h, w = x.type.shape[2:]
        hw = Pool2dAttrs(
            (kernel[1], kernel[2]), (strides[1], strides[2]), (int(lo[1]), int(lo[2])), (dil[1], dil[2]), ceil, include
        )
        slices = ctx.out(
            op,
            (ctx.tensor(_reshaped(ctx, x, (planes, depth, h, w))),),
            TensorType(t.dtype, (planes, depth, *sizes[1:])),
            hw,
        )
        flat = simplify_dim(sympy.sympify(sizes[1]) * sizes[2])
        along = Pool2dAttrs((kernel[0], 1), (strides[0], 1), (int(lo[0]), 0), (dil[0], 1), ceil, include)
        pooled = ctx.out(
            op,
            (ctx.tensor(_reshaped(ctx, slices, (planes, 1, depth, flat))),),
            TensorType(t.dtype, (planes, 1, sizes[0], flat)),
            along,
        )
        return _reshaped(ctx, pooled, t.shape)
    attrs = Pool2dAttrs(
        (kernel[0], kernel[1]), (strides[0], strides[1]), (int(lo[0]), int(lo[1])), (dil[0], dil[1]), ceil, include
    )
    y = ctx.out(op, (ctx.tensor(x),), t, attrs)
    if n == 1:
        y = _reshaped(ctx, y, (t.shape[0], t.shape[1], t.shape[3]))
    return y


@converts("MaxPool")
def _max_pool(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    if int(ctx.attr("storage_order", 0)):
        raise Unsupported("storage_order=1")
    return [_pool(ctx, ins, K.MAX_POOL2D), None]


@converts("AveragePool")
def _avg_pool(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    return [_pool(ctx, ins, K.AVG_POOL2D)]


def _reduce_ir(ctx: OnnxCtx, op: OpKind, x: OVal, axes: tuple[int, ...], keepdims: bool) -> OVal:
    shape = tuple((1 if keepdims else None) if k in axes else d for k, d in enumerate(x.type.shape))
    t = TensorType(x.type.dtype, tuple(d for d in shape if d is not None))
    return ctx.out(op, (ctx.tensor(x),), t, ReduceAttrs(axes, keepdims))


@converts("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x = need(ins, 0)
    op = K.MEAN if ctx.node.op_type == "GlobalAveragePool" else K.AMAX
    return [_reduce_ir(ctx, op, x, tuple(range(2, x.type.rank)), True)]


# --------------------------------------------------------------------------- normalizations, softmax


def _channel_param(ctx: OnnxCtx, v: OVal, rank: int) -> OVal:
    c = v.type.shape[0]
    return _reshaped(ctx, v, (c,) + (1,) * (rank - 2))


@converts("BatchNormalization")
def _batch_norm(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x, scale, bias, mean, var = (need(ins, k) for k in range(5))
    _float_input(x, "BatchNormalization")
    if int(ctx.attr("training_mode", 0)):
        raise Unsupported("training_mode=1")
    eps = float(ctx.attr("epsilon", 1e-5))
    dt, rank = x.type.dtype, x.type.rank
    stats = [scale.numeric, bias.numeric, mean.numeric, var.numeric]
    if all(s is not None for s in stats):
        sc, bs, mu, vr = (np.asarray(s, dtype=np.float64) for s in stats)
        mul = sc / np.sqrt(vr + eps)
        add = bs - mu * mul
        m = _channel_param(ctx, known(mul.astype(dt.to_numpy()), dt), rank)
        a = _channel_param(ctx, known(add.astype(dt.to_numpy()), dt), rank)
        return [binary(ctx, K.ADD, binary(ctx, K.MUL, x, m, dt, dt), a, dt, dt)]
    p = [_channel_param(ctx, v, rank) for v in (scale, bias, mean, var)]
    inv = binary(ctx, K.ADD, p[3], scalar(ctx, eps, dt), dt, dt)
    inv = OVal(inv.type, ctx.emit(K.RSQRT, (ctx.tensor(inv),), inv.type))
    y = binary(ctx, K.MUL, binary(ctx, K.SUB, x, p[2], dt, dt), binary(ctx, K.MUL, inv, p[0], dt, dt), dt, dt)
    return [binary(ctx, K.ADD, y, p[1], dt, dt)]


@converts("LayerNormalization")
def _layer_norm(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x, w, b = need(ins, 0), arg(ins, 1), arg(ins, 2)
    _float_input(x, "LayerNormalization")
    rank, dt = x.type.rank, x.type.dtype
    axis = norm_axis(int(ctx.attr("axis", -1)), rank)
    eps = float(ctx.attr("epsilon", 1e-5))
    tail = x.type.shape[axis:]
    params = [v for v in (w, b) if v is not None]
    fits = all(v.type.shape == tail for v in params)
    inputs = [ctx.tensor(x)] + ([ctx.tensor(v) for v in params] if fits else [])
    attrs = NormAttrs(rank - axis, eps, w is not None and fits, b is not None and fits)
    y = ctx.out(K.LAYER_NORM, inputs, x.type, attrs)
    if not fits:
        if w is not None:
            y = binary(ctx, K.MUL, y, w, dt, dt)
        if b is not None:
            y = binary(ctx, K.ADD, y, b, dt, dt)
    outs: list[OVal | None] = [y]
    if any(o for o in ctx.node.output[1:]):
        axes = tuple(range(axis, rank))
        mean = _reduce_ir(ctx, K.MEAN, x, axes, True)
        centered = binary(ctx, K.SUB, x, mean, dt, dt)
        sq = binary(ctx, K.MUL, centered, centered, dt, dt)
        var = _reduce_ir(ctx, K.MEAN, sq, axes, True)
        v = binary(ctx, K.ADD, var, scalar(ctx, eps, dt), dt, dt)
        outs += [mean, OVal(v.type, ctx.emit(K.RSQRT, (ctx.tensor(v),), v.type))]
    return outs


@converts("Softmax", "LogSoftmax")
def _softmax(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x = need(ins, 0)
    _float_input(x, ctx.node.op_type)
    op = K.SOFTMAX if ctx.node.op_type == "Softmax" else K.LOG_SOFTMAX
    axis = norm_axis(int(ctx.attr("axis", -1)), x.type.rank)
    return [ctx.out(op, (ctx.tensor(x),), x.type, AxisAttrs(axis))]


# --------------------------------------------------------------------------- reductions


def _reduce_axes(ctx: OnnxCtx, ins: list[OVal | None], rank: int) -> tuple[int, ...] | None:
    """The reduced axes (sorted), or None for "reduce nothing" (noop_with_empty_axes)."""
    assert ctx.node is not None
    v = arg(ins, 1)
    axes = ctx.const_int_list(v, "axes") if v is not None else ctx.ints("axes")
    if not axes:
        if int(ctx.attr("noop_with_empty_axes", 0)):
            return None
        return tuple(range(rank))
    return tuple(sorted({norm_axis(a, rank) for a in axes}))


_REDUCE = {
    "ReduceSum": K.SUM,
    "ReduceMean": K.MEAN,
    "ReduceMax": K.AMAX,
    "ReduceMin": K.AMIN,
    "ReduceProd": K.PROD,
}


def _reduction(op_type: str) -> Any:
    def convert(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
        x = need(ins, 0)
        axes = _reduce_axes(ctx, ins, x.type.rank)
        keep = bool(int(ctx.attr("keepdims", 1)))
        if axes is None or x.type.rank == 0:
            return [x]
        if any(isinstance(x.type.shape[a], int) and x.type.shape[a] == 0 for a in axes):
            raise Unsupported("a reduction over an empty axis")
        dt = x.type.dtype
        if op_type in _REDUCE:
            if op_type == "ReduceMean" and not dt.is_floating:
                raise Unsupported(f"ReduceMean of {dt.value}")
            return [_reduce_ir(ctx, _REDUCE[op_type], x, axes, keep)]
        _float_input(x, op_type)
        v = ctx.tensor(x)
        if op_type in ("ReduceSumSquare", "ReduceL2"):
            src = ctx.out(K.MUL, (v, v), x.type)
        elif op_type == "ReduceL1":
            src = ctx.out(K.ABS, (v,), x.type)
        elif op_type == "ReduceLogSumExp":
            m = _reduce_ir(ctx, K.AMAX, x, axes, True)
            e = binary(ctx, K.SUB, x, m, dt, dt)
            s = _reduce_ir(ctx, K.SUM, OVal(e.type, ctx.emit(K.EXP, (ctx.tensor(e),), e.type)), axes, True)
            y = binary(ctx, K.ADD, OVal(s.type, ctx.emit(K.LOG, (ctx.tensor(s),), s.type)), m, dt, dt)
            return [y if keep else _reshaped(ctx, y, tuple(d for k, d in enumerate(y.type.shape) if k not in axes))]
        else:
            src = x
        r = _reduce_ir(ctx, K.SUM, src, axes, keep)
        if op_type == "ReduceL2":
            r = ctx.out(K.SQRT, (ctx.tensor(r),), r.type)
        elif op_type == "ReduceLogSum":
            r = ctx.out(K.LOG, (ctx.tensor(r),), r.type)
        return [r]

    return convert


for _name in [*_REDUCE, "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp"]:
    converts(_name)(_reduction(_name))


def _reverse(ctx: OnnxCtx, x: OVal, axis: int) -> OVal:
    d = x.type.shape[axis]
    return ctx.out(K.SLICE, (ctx.tensor(x),), x.type, SliceAttrs(axis, simplify_dim(sympy.sympify(d) - 1), -1))


@converts("ArgMax", "ArgMin")
def _arg_reduce(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x = need(ins, 0)
    rank = x.type.rank
    axis = norm_axis(int(ctx.attr("axis", 0)), rank)
    keep = bool(int(ctx.attr("keepdims", 1)))
    last = bool(int(ctx.attr("select_last_index", 0)))
    op = K.ARGMAX if ctx.node.op_type == "ArgMax" else K.ARGMIN
    src = _reverse(ctx, x, axis) if last else x
    shape = tuple((1 if keep else None) if k == axis else d for k, d in enumerate(x.type.shape))
    t = TensorType(DType.INT64, tuple(d for d in shape if d is not None))
    y = ctx.out(op, (ctx.tensor(src),), t, ArgReduceAttrs(axis, keep))
    if last:  # index in the reversed axis → index in the original
        last_index = simplify_dim(sympy.sympify(x.type.shape[axis]) - 1)
        top = OVal(TensorType(DType.INT64, ()), ctx.const(last_index, DType.INT64))
        y = binary(ctx, K.SUB, top, y, DType.INT64, DType.INT64)
    return [y]


@converts("CumSum")
def _cumsum(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    rank = x.type.rank
    axis = norm_axis(int(ctx.const_int_list(need(ins, 1), "axis")[0]), rank)
    exclusive, reverse = int(ctx.attr("exclusive", 0)), int(ctx.attr("reverse", 0))
    y = _reverse(ctx, x, axis) if reverse else x
    if exclusive:  # shift by one along the axis: pad a zero in front, drop the last element
        d = x.type.shape[axis]
        pads = tuple((1, 0) if k == axis else (0, 0) for k in range(rank))
        grown = list(x.type.shape)
        grown[axis] = simplify_dim(sympy.sympify(d) + 1)
        p = ctx.emit(K.PAD, (ctx.tensor(y),), TensorType(x.type.dtype, tuple(grown)), PadAttrs(pads, 0.0))
        y = ctx.out(K.SLICE, (p,), x.type, SliceAttrs(axis, 0, 1))
    y = ctx.out(K.CUMSUM, (ctx.tensor(y),), x.type, AxisAttrs(axis))
    return [_reverse(ctx, y, axis) if reverse else y]


@converts("TopK")
def _topk(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    """Indices by a TOPK anchor kernel (a constant K up to MAX_TOPK) or the first K of a SORT (Note
    [Sort kernel]: a K from the input's shape, as exporters write torch.sort, or a long one), values
    gathered from them; sorted best first, ties in input order (sorted=0 leaves the order unspecified,
    so sorted is as good as any)."""
    x = need(ins, 0)
    rank = x.type.rank
    (k,) = ctx.const_ints(need(ins, 1), "K")
    if isinstance(k, int) and k < 0:
        raise Unsupported(f"TopK with K={k}: K must be at least 0")
    axis = norm_axis(int(ctx.attr("axis", -1)), rank)
    d = x.type.shape[axis]
    if isinstance(d, int) and isinstance(k, int) and k > d:
        raise Unsupported(f"TopK with K={k} larger than the axis ({d})")
    if not (isinstance(d, int) and isinstance(k, int)) and sympy.sympify(d) != sympy.sympify(k):
        ctx.assume(sympy.Ge(d, k), f"{ctx.loc}: TopK needs at least K={k} elements along axis {axis}")
    shape = list(x.type.shape)
    shape[axis] = k
    largest = bool(int(ctx.attr("largest", 1)))
    index = TensorType(DType.INT64, tuple(shape))
    if isinstance(k, int) and k <= MAX_TOPK:
        idx = ctx.out(K.TOPK, (ctx.tensor(x),), index, TopkAttrs(axis, k, largest))
    else:
        order = ctx.emit(K.SORT, (ctx.tensor(x),), TensorType(DType.INT64, x.type.shape), SortAttrs(axis, largest))
        idx = ctx.out(K.SLICE, (order,), index, SliceAttrs(axis, 0, 1))
    vals = ctx.out(K.GATHER, (ctx.tensor(x), ctx.tensor(idx)), TensorType(x.type.dtype, tuple(shape)), AxisAttrs(axis))
    return [vals, idx]


@converts("InstanceNormalization", "GroupNormalization")
def _group_norm(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    """Each [C / groups, *spatial] block of a sample normalized as one layer-norm row, then the
    per-channel scale and bias (InstanceNormalization: one group per channel). GroupNormalization's
    opset-18 form gives the scale and bias per group; opset 21 per channel."""
    assert ctx.node is not None
    x, scale, bias = need(ins, 0), need(ins, 1), need(ins, 2)
    _float_input(x, ctx.node.op_type)
    dt, rank = x.type.dtype, x.type.rank
    n, c, rest = x.type.shape[0], x.type.shape[1], x.type.shape[2:]
    if not isinstance(c, int):
        raise Unsupported(f"{ctx.node.op_type} over a dynamic channel dim")
    groups = c if ctx.node.op_type == "InstanceNormalization" else int(ctx.attr("num_groups"))
    if groups <= 0 or c % groups:
        raise Unsupported(f"{c} channels in {groups} groups")
    eps = float(ctx.attr("epsilon", 1e-5))
    row: IRDim = c // groups
    for d in rest:
        row = simplify_dim(sympy.sympify(row) * d)
    rows = ctx.reshape(ctx.tensor(x), (n, groups, row))
    normed = ctx.emit(K.LAYER_NORM, (rows,), TensorType(dt, (n, groups, row)), NormAttrs(1, eps, False, False))
    y = OVal(x.type, ctx.reshape(normed, x.type.shape))
    per_group = scale.type.shape == (groups,) and groups != c
    for v, op in ((scale, K.MUL), (bias, K.ADD)):
        if per_group:  # opset 18: one value per group, each channel takes its group's
            v = OVal(TensorType(v.type.dtype, (groups, 1)), ctx.reshape(ctx.tensor(v), (groups, 1)))
            grown = TensorType(v.type.dtype, (groups, c // groups))
            v = OVal(grown, ctx.emit(K.EXPAND, (ctx.tensor(v),), grown))
            v = OVal(TensorType(v.type.dtype, (c,)), ctx.reshape(ctx.tensor(v), (c,)))
        y = binary(ctx, op, y, _channel_param(ctx, v, rank), dt, dt)
    return [y]


@converts("ConvTranspose")
def _conv_transpose(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    """The stride-1 convolution of the zero-stuffed, padded input with the kernel flipped and its
    channels swapped per group (Note [Transposed convolution] in export/ops_nn.py)."""
    x, w, b = need(ins, 0), need(ins, 1), arg(ins, 2)
    _float_input(x, "ConvTranspose")
    n = _spatial(ctx, x, "ConvTranspose")
    if w.numeric is None:
        raise Unsupported("ConvTranspose with a computed weight (only an initializer can be flipped at optimize time)")
    if ctx.ints("output_shape"):
        raise Unsupported("ConvTranspose with output_shape (give pads and output_padding)")
    mode = ctx.text("auto_pad", "NOTSET")
    if mode not in ("NOTSET", "", "VALID"):
        raise Unsupported(f"ConvTranspose with auto_pad={mode}")
    wt = np.asarray(w.numeric)
    kernel = [int(d) for d in wt.shape[2:]]
    strides, dil, pads = _window_params(ctx, n, kernel)
    out_pad = ctx.ints("output_padding") or [0] * n
    if mode == "VALID":
        pads = [0] * (2 * n)
    if not all(isinstance(p, int) for p in pads):
        raise Unsupported("ConvTranspose with symbolic pads")
    g = int(ctx.attr("group", 1))
    if n == 1:
        x = _to_2d(ctx, x)
        wt = wt[:, :, None, :]
        kernel, strides, dil, out_pad = [1, *kernel], [1, *strides], [1, *dil], [0, *out_pad]
        pads = [0, pads[0], 0, pads[1]]
    cin, cout_g = wt.shape[0], wt.shape[1]
    if cin % g or (isinstance(x.type.shape[1], int) and x.type.shape[1] != cin):
        raise Unsupported(f"ConvTranspose of {x.type.shape[1]} channels with a weight for {cin} in {g} groups")
    flipped = wt.reshape(g, cin // g, cout_g, *kernel).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
    wconv = known(np.ascontiguousarray(flipped.reshape(g * cout_g, cin // g, *kernel)), x.type.dtype)
    lo = [dil[a] * (kernel[a] - 1) - int(pads[a]) for a in range(2)]
    hi = [lo[a] - int(pads[a + 2]) + int(pads[a]) + out_pad[a] - (strides[a] - 1) for a in range(2)]
    if min(lo) < 0 or min(hi) < 0:
        raise Unsupported(
            f"ConvTranspose with pads {pads} beyond dilation * (kernel - 1) or output_padding below stride - 1"
        )
    nb, c, h, wd = x.type.shape
    if strides != [1, 1]:  # zeros between pixels: [N, C, H, 1, W, 1] padded to [N, C, H, sh, W, sw]
        x6 = _reshaped(ctx, x, (nb, c, h, 1, wd, 1))
        x6 = _explicit_pad(ctx, x6, [0, 0, 0, 0], [0, strides[0] - 1, 0, strides[1] - 1], 0.0)
        h, wd = simplify_dim(sympy.sympify(h) * strides[0]), simplify_dim(sympy.sympify(wd) * strides[1])
        x = _reshaped(ctx, x6, (nb, c, h, wd))
    x = _explicit_pad(ctx, x, lo, hi, 0.0)
    sizes = [window_count(d, k, 1, dl, 0, 0) for d, k, dl in zip(x.type.shape[2:], kernel, dil)]
    t = TensorType(x.type.dtype, (nb, g * cout_g, *sizes))
    inputs = [ctx.tensor(x), ctx.tensor(wconv)] + ([ctx.tensor(b)] if b is not None else [])
    y = ctx.out(K.CONV2D, inputs, t, Conv2dAttrs((1, 1), (0, 0), (dil[0], dil[1]), g, b is not None))
    if n == 1:
        y = _reshaped(ctx, y, (t.shape[0], t.shape[1], t.shape[3]))
    return [y]
