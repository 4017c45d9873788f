"""aten → IR: elementwise, comparison, logical and generator ops.

In: an FX node's args. Out: IR values, with explicit CASTs so that every IR arithmetic op computes
in its result dtype and every comparison compares operands of one dtype (torch's type promotion is
resolved here, once, from the exported graph's metadata).
"""

from __future__ import annotations

from typing import Any

import torch

from bladepack.dtypes import DType
from bladepack.export.context import (
    DTYPE_TO_TORCH,
    Ctx,
    Unsupported,
    Value,
    arg,
    converts,
    dtype_of,
)
from bladepack.ir import OpKind, TensorType
from bladepack.ir.ops import ArangeAttrs, ClampAttrs, ConstantAttrs, GeluAttrs, LeakyReluAttrs

K = OpKind

_UNARY = {
    "neg": K.NEG,
    "abs": K.ABS,
    "exp": K.EXP,
    "log": K.LOG,
    "sqrt": K.SQRT,
    "rsqrt": K.RSQRT,
    "reciprocal": K.RECIPROCAL,
    "tanh": K.TANH,
    "sigmoid": K.SIGMOID,
    "relu": K.RELU,
    "silu": K.SILU,
    "erf": K.ERF,
    "sin": K.SIN,
    "cos": K.COS,
    "floor": K.FLOOR,
    "bitwise_not": K.BITWISE_NOT,
    "sign": K.SIGN,
    "sgn": K.SIGN,  # real tensors: the same as sign
    "ceil": K.CEIL,
    "trunc": K.TRUNC,
    "fix": K.TRUNC,
    "round": K.ROUND,
    "log1p": K.LOG1P,
    "expm1": K.EXPM1,
    "log2": K.LOG2,
    "log10": K.LOG10,
    "tan": K.TAN,
    "asin": K.ASIN,
    "acos": K.ACOS,
    "atan": K.ATAN,
    "sinh": K.SINH,
    "cosh": K.COSH,
    "asinh": K.ASINH,
    "acosh": K.ACOSH,
    "atanh": K.ATANH,
}


def _unary(op: OpKind) -> Any:
    def convert(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
        out = ctx.out_type()
        return ctx.emit(op, (ctx.cast(ctx.v(args[0]), out.dtype),), out)

    return convert


for _name, _op in _UNARY.items():
    converts(f"aten.{_name}.default")(_unary(_op))


@converts("aten.round.decimals")
def _round_decimals(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    decimals = arg(args, kwargs, 1, "decimals", 0)
    if decimals != 0:
        raise Unsupported(f"round with decimals={decimals} (decimals=0 is supported)")
    return _unary(K.ROUND)(ctx, args[:1], {})  # type: ignore[no-any-return]


@converts("aten.isnan.default", "aten.isinf.default", "aten.isfinite.default")
def _float_class(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """isnan(x) = x != x; isinf(x) = |x| == inf; isfinite(x) = |x| < inf (false for NaN). Integer and
    bool tensors are never NaN or infinite."""
    assert ctx.node is not None
    x, out, which = ctx.v(args[0]), ctx.out_type(), str(ctx.node.target).split(".")[1]
    t = ctx.t(x)
    if not t.dtype.is_floating:
        return ctx.emit(K.FULL, (), out, ConstantAttrs(which == "isfinite"))
    if which == "isnan":
        return ctx.emit(K.NE, (x, x), out)
    size = ctx.emit(K.ABS, (x,), t)
    return ctx.emit(K.EQ if which == "isinf" else K.LT, (size, ctx.const(float("inf"), t.dtype)), out)


@converts("aten.nan_to_num.default")
def _nan_to_num(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """NaN, +inf and -inf replaced (by 0, the dtype's largest and lowest finite values unless given), as
    three wheres; integer and bool tensors pass through."""
    x, out = ctx.v(args[0]), ctx.out_type()
    if not out.dtype.is_floating:
        return x
    info = torch.finfo(DTYPE_TO_TORCH[out.dtype])
    nan, posinf, neginf = (arg(args, kwargs, k, name, None) for k, name in ((1, "nan"), (2, "posinf"), (3, "neginf")))
    flag = TensorType(DType.BOOL, out.shape)
    inf = ctx.const(float("inf"), out.dtype)
    y = ctx.emit(K.WHERE, (ctx.emit(K.NE, (x, x), flag), ctx.const(0.0 if nan is None else nan, out.dtype), x), out)
    top = float(info.max) if posinf is None else posinf
    y = ctx.emit(K.WHERE, (ctx.emit(K.EQ, (x, inf), flag), ctx.const(top, out.dtype), y), out)
    low = float(info.min) if neginf is None else neginf
    neg = ctx.emit(K.EQ, (x, ctx.emit(K.NEG, (inf,), ctx.t(inf))), flag)
    return ctx.emit(K.WHERE, (neg, ctx.const(low, out.dtype), y), out)


@converts("aten.softplus.default")
def _softplus(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """torch's softplus: x where beta * x > threshold, else log1p(exp(beta * x)) / beta."""
    beta, threshold = arg(args, kwargs, 1, "beta", 1.0), arg(args, kwargs, 2, "threshold", 20.0)
    if not all(isinstance(v, (int, float)) for v in (beta, threshold)):
        raise Unsupported("softplus with tensor beta or threshold")
    out = ctx.out_type()
    x = ctx.cast(ctx.v(args[0]), out.dtype)
    bx = x if beta == 1 else ctx.emit(K.MUL, (x, ctx.const(beta, out.dtype)), out)
    soft = ctx.emit(K.LOG1P, (ctx.emit(K.EXP, (bx,), out),), out)
    if beta != 1:
        soft = ctx.emit(K.DIV, (soft, ctx.const(beta, out.dtype)), out)
    big = ctx.emit(K.GT, (bx, ctx.const(threshold, out.dtype)), TensorType(DType.BOOL, out.shape))
    return ctx.emit(K.WHERE, (big, x, soft), out)


@converts("aten.logical_not.default")
def _logical_not(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return ctx.emit(K.LOGICAL_NOT, (ctx.cast(ctx.v(args[0]), DType.BOOL),))


@converts("aten.gelu.default")
def _gelu(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    approx = arg(args, kwargs, 1, "approximate", "none")
    if approx not in ("none", "tanh"):
        raise Unsupported(f"gelu approximate={approx!r}")
    return ctx.emit(K.GELU, (ctx.v(args[0]),), attrs=GeluAttrs(approx))


@converts("aten.leaky_relu.default")
def _leaky_relu(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    return ctx.emit(
        K.LEAKY_RELU, (ctx.v(args[0]),), attrs=LeakyReluAttrs(float(arg(args, kwargs, 1, "negative_slope", 0.01)))
    )


def _clamp_attrs(lo: Any, hi: Any) -> ClampAttrs:
    for b in (lo, hi):
        if b is not None and not isinstance(b, (int, float)):
            raise Unsupported("clamp with tensor bounds given as scalars")
    return ClampAttrs(None if lo is None else float(lo), None if hi is None else float(hi))


@converts(
    "aten.clamp.default",
    "aten.hardtanh.default",
    "aten.relu6.default",
    "aten.clamp_min.default",
    "aten.clamp_max.default",
)
def _clamp(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    target = str(ctx.node.target)
    if target == "aten.clamp_min.default":
        lo, hi = args[1], None
    elif target == "aten.clamp_max.default":
        lo, hi = None, args[1]
    elif target == "aten.hardtanh.default":
        lo, hi = arg(args, kwargs, 1, "min_val", -1.0), arg(args, kwargs, 2, "max_val", 1.0)
    elif target == "aten.relu6.default":  # MobileNet's activation (torch 2.11 keeps it; later ones may not)
        lo, hi = 0.0, 6.0
    else:
        lo, hi = arg(args, kwargs, 1, "min"), arg(args, kwargs, 2, "max")
    out = ctx.out_type()
    return ctx.emit(K.CLAMP, (ctx.cast(ctx.v(args[0]), out.dtype),), out, _clamp_attrs(lo, hi))


@converts("aten.hardsigmoid.default", "aten.hardswish.default")
def _hard_activation(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """hardsigmoid(x) = clamp(x + 3, 0, 6) / 6 and hardswish(x) = x * clamp(x + 3, 0, 6) / 6, in
    torch's order of operations (MobileNetV3's activations)."""
    assert ctx.node is not None
    out = ctx.out_type()
    x = ctx.cast(ctx.v(args[0]), out.dtype)
    gate = ctx.emit(K.CLAMP, (ctx.emit(K.ADD, (x, ctx.const(3.0, out.dtype)), out),), out, ClampAttrs(0.0, 6.0))
    if str(ctx.node.target) == "aten.hardswish.default":
        gate = ctx.emit(K.MUL, (x, gate), out)
    return ctx.emit(K.DIV, (gate, ctx.const(6.0, out.dtype)), out)


@converts("aten.clamp.Tensor")
def _clamp_tensor(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    x = ctx.cast(ctx.v(args[0]), out.dtype)
    lo, hi = arg(args, kwargs, 1, "min"), arg(args, kwargs, 2, "max")
    if lo is not None:
        x = ctx.emit(K.MAXIMUM, (x, ctx.operand(lo, out.dtype)), out)
    if hi is not None:
        x = ctx.emit(K.MINIMUM, (x, ctx.operand(hi, out.dtype)), out)
    return x


# --------------------------------------------------------------------------- binary


def _probe(ctx: Ctx, a: Any) -> Any:
    """A stand-in for torch.result_type: a tiny tensor of the operand's dtype and rank, or the scalar."""
    if isinstance(a, torch.fx.Node):
        t = ctx.t(ctx.v(a))
        return torch.empty([1] * t.rank, dtype=DTYPE_TO_TORCH[t.dtype])
    return a


def compute_dtype(ctx: Ctx, a: Any, b: Any) -> DType:
    return dtype_of(torch.result_type(_probe(ctx, a), _probe(ctx, b)))


_ARITH = {
    "add": K.ADD,
    "sub": K.SUB,
    "mul": K.MUL,
    "div": K.DIV,
    "fmod": K.FMOD,
    "remainder": K.REMAINDER,
    "atan2": K.ATAN2,
    "maximum": K.MAXIMUM,
    "minimum": K.MINIMUM,
}


def _arith(op: OpKind) -> Any:
    def convert(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
        out = ctx.out_type()
        a, b = args[0], args[1]
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        y = ctx.operand(b, out.dtype)
        if alpha != 1:
            y = ctx.emit(K.MUL, (y, ctx.const(alpha, out.dtype)), TensorType(out.dtype, ctx.t(y).shape))
        return ctx.emit(op, (ctx.operand(a, out.dtype), y), out)

    return convert


for _name in ("add", "sub", "mul", "div", "fmod", "remainder"):
    converts(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_arith(_ARITH[_name]))
converts("aten.atan2.default")(_arith(K.ATAN2))
for _name in ("maximum", "minimum"):  # torch.max(a, b) / torch.min(a, b) are the same ops (T5's position buckets)
    converts(f"aten.{_name}.default", f"aten.{_name[:3]}.other")(_arith(_ARITH[_name]))


@converts("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    result: Value = _arith(K.SUB)(ctx, (args[1], args[0], *args[2:]), kwargs)
    return result


@converts("aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.floor_divide.default")
def _div_mode(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    mode = "floor" if "floor_divide" in str(ctx.node.target) else arg(args, kwargs, 2, "rounding_mode")
    out = ctx.out_type()
    if mode is None:
        return ctx.emit(K.DIV, (ctx.operand(args[0], out.dtype), ctx.operand(args[1], out.dtype)), out)
    if mode != "floor" or not out.dtype.is_floating:
        raise Unsupported(f"div with rounding_mode={mode!r} on {out.dtype.value}")
    q = ctx.emit(K.DIV, (ctx.operand(args[0], out.dtype), ctx.operand(args[1], out.dtype)), out)
    return ctx.emit(K.FLOOR, (q,), out)


@converts("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    base, exponent = args[0], args[1]
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        x = ctx.operand(base, out.dtype)
        if exponent == 1:
            return x
        if exponent == 2:
            return ctx.emit(K.MUL, (x, x), out)
        if exponent == 0.5:
            return ctx.emit(K.SQRT, (x,), out)
        if exponent == -0.5:
            return ctx.emit(K.RSQRT, (x,), out)
        if exponent == -1:
            return ctx.emit(K.RECIPROCAL, (x,), out)
    return ctx.emit(K.POW, (ctx.operand(base, out.dtype), ctx.operand(exponent, out.dtype)), out)


@converts("aten.square.default")
def _square(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """x * x (NemotronH's squared-ReLU MLP)."""
    out = ctx.out_type()
    x = ctx.operand(args[0], out.dtype)
    return ctx.emit(K.MUL, (x, x), out)


_CMP = {"eq": K.EQ, "ne": K.NE, "lt": K.LT, "le": K.LE, "gt": K.GT, "ge": K.GE}


def _compare(op: OpKind) -> Any:
    def convert(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
        dt = compute_dtype(ctx, args[0], args[1])
        return ctx.emit(op, (ctx.operand(args[0], dt), ctx.operand(args[1], dt)))

    return convert


for _name, _op in _CMP.items():
    converts(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_compare(_op))


def _logical(op: OpKind) -> Any:
    def convert(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
        return ctx.emit(op, (ctx.operand(args[0], DType.BOOL), ctx.operand(args[1], DType.BOOL)))

    return convert


converts("aten.logical_and.default")(_logical(K.LOGICAL_AND))
converts("aten.logical_or.default")(_logical(K.LOGICAL_OR))
converts("aten.logical_xor.default")(_logical(K.LOGICAL_XOR))

_BITWISE = {
    "bitwise_and": K.BITWISE_AND,
    "bitwise_or": K.BITWISE_OR,
    "bitwise_xor": K.BITWISE_XOR,
    "__and__": K.BITWISE_AND,
    "__or__": K.BITWISE_OR,
    "__xor__": K.BITWISE_XOR,
}


def _bitwise(op: OpKind) -> Any:
    def convert(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
        out = ctx.out_type()
        if out.dtype.is_floating:
            raise Unsupported("bitwise ops on floating tensors")
        return ctx.emit(op, (ctx.operand(args[0], out.dtype), ctx.operand(args[1], out.dtype)), out)

    return convert


for _name, _op in _BITWISE.items():
    converts(f"aten.{_name}.Tensor", f"aten.{_name}.Scalar")(_bitwise(_op))


@converts("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    cond = ctx.cast(ctx.v(args[0]), DType.BOOL)
    return ctx.emit(K.WHERE, (cond, ctx.operand(args[1], out.dtype), ctx.operand(args[2], out.dtype)), out)


@converts("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    out = ctx.out_type()
    mask = ctx.cast(ctx.v(args[1]), DType.BOOL)
    return ctx.emit(K.WHERE, (mask, ctx.operand(args[2], out.dtype), ctx.v(args[0])), out)


# --------------------------------------------------------------------------- generators and copies


@converts(
    "aten.full.default",
    "aten.zeros.default",
    "aten.ones.default",
    "aten.new_ones.default",
    "aten.new_zeros.default",
    "aten.new_full.default",
    "aten.zeros_like.default",
    "aten.ones_like.default",
    "aten.full_like.default",
    "aten.scalar_tensor.default",
    "aten.empty.memory_format",
    "aten.new_empty.default",
    "aten.empty_like.default",
    "aten.empty_strided.default",
)
def _full(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    name = str(ctx.node.target).split(".")[1]
    value: Any
    if name in ("ones", "new_ones", "ones_like"):
        value = 1
    elif name in ("zeros", "new_zeros", "zeros_like", "empty", "new_empty", "empty_like", "empty_strided"):
        value = 0
    elif name == "scalar_tensor":
        value = args[0]
    elif name == "full":
        value = arg(args, kwargs, 1, "fill_value")
    else:  # new_full, full_like
        value = arg(args, kwargs, 2 if name == "new_full" else 1, "fill_value")
    out = ctx.out_type()
    if isinstance(value, torch.fx.Node) and value in ctx.syms and not out.dtype.is_floating:
        # a size as the value (torch.full((1,), x.shape[0])): a shape-program constant, broadcast
        scalar = ctx.operand(value, out.dtype)
        if not out.rank:
            return scalar
        return ctx.emit(K.EXPAND, (ctx.emit(K.RESHAPE, (scalar,), TensorType(out.dtype, (1,) * out.rank)),), out)
    if not isinstance(value, (bool, int, float)):
        raise Unsupported(f"{name} with a non-constant fill value")
    value = bool(value) if out.dtype is DType.BOOL else (float(value) if out.dtype.is_floating else int(value))
    return ctx.emit(K.FULL, (), out, ConstantAttrs(value))


@converts("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    overload = str(ctx.node.target).split(".")[-1]
    start: Any = 0 if overload == "default" else args[0]
    step: Any = arg(args, kwargs, 2, "step", 1) if overload == "start_step" else 1

    def num(a: Any) -> Any:
        return a if isinstance(a, float) else ctx.s(a)

    return ctx.emit(K.ARANGE, (), attrs=ArangeAttrs(num(start), num(step)))


@converts(
    "aten._to_copy.default",
    "aten.to.dtype",
    "aten.to.dtype_layout",
    "aten.to.device",
    "aten.to.other",
    "aten.type_as.default",
    "aten.clone.default",
    "aten.contiguous.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.detach_.default",
    "aten.lift_fresh_copy.default",
    "aten.dropout.default",
    "aten.feature_dropout.default",
    "aten.alpha_dropout.default",
)
def _copy_or_cast(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    if "dropout" in str(ctx.node.target) and arg(args, kwargs, 2, "train", False):
        raise Unsupported("dropout in training mode (call model.eval())")
    return ctx.cast(ctx.v(args[0]), ctx.out_type().dtype)
