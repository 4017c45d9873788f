"""ONNX → IR: elementwise math, comparisons, activations, Cast, Clip and Where.

In: an ONNX node's operands (`OVal`s). Out: IR values, or known values when the operands are shape
values (Note [Known values]): Shape arithmetic such as `Div(Gather(Shape(x), 2), 4)` folds into sympy
dims here instead of running at run time. Activations the IR has no op for are composed from IR ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import sympy

from bladepack.dtypes import DType
from bladepack.ir import OpKind, TensorType, Tri
from bladepack.ir.ops import ClampAttrs, ConstantAttrs, GeluAttrs, LeakyReluAttrs
from bladepack.onnx_import.context import (
    OnnxCtx,
    OVal,
    Unsupported,
    arg,
    converts,
    dtype_of,
    known,
    need,
    simplify_dim,
)

K = OpKind


# --------------------------------------------------------------------------- folding shape values


def fold_symbolic(fn: Callable[..., Any], dtype: DType, *vals: OVal) -> OVal | None:
    """Apply `fn` element by element when every operand is known and one holds symbolic entries; None
    when an operand is a run-time tensor or `fn` cannot decide an entry (it returns None)."""
    if any(v.data is None for v in vals) or not any(v.is_symbolic for v in vals):
        return None
    arrays = np.broadcast_arrays(*[np.asarray(v.data).astype(object) for v in vals])
    out = np.empty(arrays[0].shape, dtype=object)
    for idx in np.ndindex(out.shape):
        r = fn(*[a[idx] for a in arrays])
        if r is None:
            return None
        out[idx] = r
    return known(out, dtype)


def _int_div(a: Any, b: Any, env: Any, needs: list[Any]) -> Any:
    """ONNX's integer Div (truncating) of shape values. Note [Truncating division of shape values]:
    truncation and floor agree for a non-negative dividend over a positive divisor, and are ceiling
    and truncation for a negative one; a dividend whose range holds both signs (a conv's output size
    computed from an input dim whose declared range starts too low: `(h - 1) // 4 - 7`) is folded as
    a floor division with the condition that it is not negative appended to `needs`, checked at every
    call, so such a shape is refused, never computed differently from the model."""
    if isinstance(a, (int, np.integer)) and isinstance(b, (int, np.integer)):
        q = abs(int(a)) // abs(int(b)) if b != 0 else 0
        return -q if (a < 0) != (b < 0) else q
    (lo_a, hi_a), lo_b = env.bounds(a), env.bounds(b)[0]
    if lo_b <= 0:
        return None
    if hi_a < 0:
        return sympy.ceiling(sympy.sympify(a) / b)
    if lo_a < 0:
        needs.append(sympy.sympify(a) >= 0)
    return sympy.floor(sympy.sympify(a) / b)


def _decide(t: Tri) -> bool | None:
    return True if t is Tri.YES else False if t is Tri.NO else None


def _compare(op: str, a: Any, b: Any, ctx: OnnxCtx) -> bool | None:
    env = ctx.env
    if op == "Equal":
        return _decide(env.prove_eq(a, b))
    if op in ("Less", "Greater"):
        lo, hi = (a, b) if op == "Less" else (b, a)
        return _decide(env.prove_le(sympy.sympify(lo) + 1, hi))
    lo, hi = (a, b) if op == "LessOrEqual" else (b, a)
    return _decide(env.prove_le(lo, hi))


def _sym_max(a: Any, b: Any, ctx: OnnxCtx, want_max: bool) -> Any:
    le = ctx.env.prove_le(a, b)
    if le is Tri.YES:
        return b if want_max else a
    ge = ctx.env.prove_le(b, a)
    if ge is Tri.YES:
        return a if want_max else b
    return sympy.Max(a, b) if want_max else sympy.Min(a, b)


# --------------------------------------------------------------------------- emission helpers


def binary(ctx: OnnxCtx, op: OpKind, a: OVal, b: OVal, out_dtype: DType, operand_dtype: DType) -> OVal:
    x = ctx.cast(ctx.tensor(a), operand_dtype)
    y = ctx.cast(ctx.tensor(b), operand_dtype)
    shape = ctx.broadcast_shapes(a.type.shape, b.type.shape)
    return ctx.out(op, (x, y), TensorType(out_dtype, shape))


def unary(ctx: OnnxCtx, op: OpKind, x: OVal, attrs: Any = None) -> OVal:
    return ctx.out(op, (ctx.tensor(x),), x.type, attrs)


def scalar(ctx: OnnxCtx, value: float | int | bool, dtype: DType) -> OVal:
    return OVal(TensorType(dtype, ()), ctx.const(value, dtype))


def _same_type(a: OVal, b: OVal, op: str) -> DType:
    if a.type.dtype is not b.type.dtype:
        raise Unsupported(f"{op} of {a.type.dtype.value} and {b.type.dtype.value} (ONNX requires one type)")
    return a.type.dtype


_ARITH = {"Add": K.ADD, "Sub": K.SUB, "Mul": K.MUL, "Div": K.DIV}
# how shape values (integers) fold; Div truncates like ONNX's integer division
_SYM_ARITH: dict[str, Callable[[Any, Any, Any, list[Any]], Any]] = {
    "Add": lambda a, b, env, needs: a + b,
    "Sub": lambda a, b, env, needs: a - b,
    "Mul": lambda a, b, env, needs: a * b,
    "Div": _int_div,
}


def _arith(op_type: str) -> Any:
    def convert(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
        a, b = need(ins, 0), need(ins, 1)
        dt = _same_type(a, b, op_type)
        fold, needs = _SYM_ARITH[op_type], list[Any]()
        folded = None if dt.is_floating else fold_symbolic(lambda x, y: fold(x, y, ctx.env, needs), dt, a, b)
        if folded is not None:
            for cond in needs:
                ctx.assume(cond, f"the dividend of an integer {op_type} of shape values is {cond.lhs}, not negative")
            return [folded]
        return [binary(ctx, _ARITH[op_type], a, b, dt, dt)]

    return convert


for _name in _ARITH:
    converts(_name)(_arith(_name))


@converts("Pow")
def _pow(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    a, b = need(ins, 0), need(ins, 1)
    if b.numeric is not None and b.numeric.size == 1 and a.type.dtype.is_floating:
        e = float(b.numeric.ravel()[0])
        if e == 2.0:  # x * x: what the kernels do best, and exactly what pow(x, 2) computes
            x = ctx.tensor(a)
            return [ctx.out(K.MUL, (x, x), TensorType(a.type.dtype, ctx.broadcast_shapes(a.type.shape, b.type.shape)))]
        if e == 1.0:
            return [a]
        if e == 0.5:
            return [unary(ctx, K.SQRT, a)]
    if not a.type.dtype.is_floating and b.type.dtype.is_floating:
        # an integer base to a real power: computed in double and truncated to the base's type, as
        # ONNX Runtime (std::pow) and onnx's reference (numpy) do; the exponent is never truncated first
        real = binary(ctx, K.POW, a, b, DType.FLOAT64, DType.FLOAT64)
        return [ctx.out(K.CAST, (ctx.tensor(real),), TensorType(a.type.dtype, real.type.shape))]
    return [binary(ctx, K.POW, a, b, a.type.dtype, a.type.dtype)]


@converts("Mod")
def _mod(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    """fmod=1: C's remainder (FMOD). fmod=0: Python's, with the divisor's sign: FMOD, then add the
    divisor where the remainder is non-zero and its sign differs from the divisor's."""
    a, b = need(ins, 0), need(ins, 1)
    dt = _same_type(a, b, "Mod")
    fmod = int(ctx.attr("fmod", 0))
    if not dt.is_floating and not fmod:
        folded = fold_symbolic(lambda x, y: sympy.Mod(x, y), dt, a, b)
        if folded is not None:
            return [folded]
    r = binary(ctx, K.FMOD, a, b, dt, dt)
    if fmod:
        return [r]
    t, rv, y = r.type, ctx.tensor(r), ctx.tensor(b)
    b_t = TensorType(DType.BOOL, t.shape)
    zero = ctx.const(0, dt)
    y_neg = ctx.emit(K.LT, (y, zero), TensorType(DType.BOOL, b.type.shape))
    differ = ctx.emit(K.NE, (ctx.emit(K.LT, (rv, zero), b_t), y_neg), b_t)
    fix = ctx.emit(K.LOGICAL_AND, (ctx.emit(K.NE, (rv, zero), b_t), differ), b_t)
    return [ctx.out(K.WHERE, (fix, ctx.emit(K.ADD, (rv, y), t), rv), t)]


def _variadic(op: OpKind, sym: Callable[[Any, Any, OnnxCtx], Any] | None, mean: bool = False) -> Any:
    def convert(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
        vals = [v for v in ins if v is not None]
        if not vals:
            raise Unsupported("no inputs")
        acc = vals[0]
        dt = acc.type.dtype
        for v in vals[1:]:
            _same_type(acc, v, op.value)
            folded = fold_symbolic(lambda a, b: sym(a, b, ctx), dt, acc, v) if sym and not dt.is_floating else None
            acc = folded if folded is not None else binary(ctx, op, acc, v, dt, dt)
        if mean and len(vals) > 1:
            acc = binary(ctx, K.DIV, acc, scalar(ctx, len(vals), dt), dt, dt)
        return [acc]

    return convert


converts("Max")(_variadic(K.MAXIMUM, lambda a, b, c: _sym_max(a, b, c, True)))
converts("Min")(_variadic(K.MINIMUM, lambda a, b, c: _sym_max(a, b, c, False)))
converts("Sum")(_variadic(K.ADD, lambda a, b, c: a + b))
converts("Mean")(_variadic(K.ADD, None, mean=True))

_COMPARE = {"Equal": K.EQ, "Less": K.LT, "Greater": K.GT, "LessOrEqual": K.LE, "GreaterOrEqual": K.GE}
_RELATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "Equal": sympy.Eq,
    "Less": sympy.Lt,
    "Greater": sympy.Gt,
    "LessOrEqual": sympy.Le,
    "GreaterOrEqual": sympy.Ge,
}


def _comparison(op_type: str) -> Any:
    def convert(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
        a, b = need(ins, 0), need(ins, 1)
        dt = _same_type(a, b, op_type)
        folded = fold_symbolic(lambda x, y: _compare(op_type, x, y, ctx), DType.BOOL, a, b)
        if folded is not None:
            return [folded]
        if (
            a.data is not None
            and b.data is not None
            and (a.is_symbolic or b.is_symbolic)
            and a.data.size == b.data.size == 1
        ):
            # an open comparison of two shape values: the shape program computes it (Note [Branch
            # predicates] in ir/guards.py), so an If on it is a branch chosen per shape signature
            x, y = (sympy.sympify(np.asarray(v.data).ravel()[0]) for v in (a, b))
            rel = _RELATIONS[op_type](x, y)
            shape = ctx.broadcast_shapes(a.type.shape, b.type.shape)
            return [ctx.out(K.FULL, (), TensorType(DType.BOOL, shape), ConstantAttrs(rel))]
        return [binary(ctx, _COMPARE[op_type], a, b, DType.BOOL, dt)]

    return convert


for _name in _COMPARE:
    converts(_name)(_comparison(_name))

_LOGICAL = {"And": K.LOGICAL_AND, "Or": K.LOGICAL_OR, "Xor": K.NE}
_BITWISE = {"BitwiseAnd": K.BITWISE_AND, "BitwiseOr": K.BITWISE_OR, "BitwiseXor": K.BITWISE_XOR}


def _logical(op: OpKind) -> Any:
    def convert(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
        a, b = need(ins, 0), need(ins, 1)
        dt = _same_type(a, b, op.value)
        return [binary(ctx, op, a, b, dt, dt)]

    return convert


for _name, _op in {**_LOGICAL, **_BITWISE}.items():
    converts(_name)(_logical(_op))


@converts("Where")
def _where(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    c, a, b = need(ins, 0), need(ins, 1), need(ins, 2)
    dt = _same_type(a, b, "Where")
    if c.numeric is not None and a.data is not None and b.data is not None:
        folded = fold_symbolic(lambda k, x, y: x if k else y, dt, c, a, b)
        if folded is not None:
            return [folded]
    shape = ctx.broadcast_shapes(c.type.shape, a.type.shape, b.type.shape)
    cond = ctx.cast(ctx.tensor(c), DType.BOOL)
    return [ctx.out(K.WHERE, (cond, ctx.tensor(a), ctx.tensor(b)), TensorType(dt, shape))]


# --------------------------------------------------------------------------- unary


_UNARY = {
    "Relu": K.RELU,
    "Sigmoid": K.SIGMOID,
    "Tanh": K.TANH,
    "Exp": K.EXP,
    "Log": K.LOG,
    "Sqrt": K.SQRT,
    "Reciprocal": K.RECIPROCAL,
    "Floor": K.FLOOR,
    "Sin": K.SIN,
    "Cos": K.COS,
    "Erf": K.ERF,
    "Not": K.LOGICAL_NOT,
    "BitwiseNot": K.BITWISE_NOT,
    "Ceil": K.CEIL,
    "Round": K.ROUND,  # half to even
    "Tan": K.TAN,
    "Asin": K.ASIN,
    "Acos": K.ACOS,
    "Atan": K.ATAN,
    "Sinh": K.SINH,
    "Cosh": K.COSH,
    "Asinh": K.ASINH,
    "Acosh": K.ACOSH,
    "Atanh": K.ATANH,
}
_FLOAT_ONLY = {
    "Sigmoid",
    "Tanh",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Floor",
    "Sin",
    "Cos",
    "Erf",
    "Ceil",
    "Round",
    "Tan",
    "Asin",
    "Acos",
    "Atan",
    "Sinh",
    "Cosh",
    "Asinh",
    "Acosh",
    "Atanh",
}


def _unary(op_type: str) -> Any:
    def convert(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
        x = need(ins, 0)
        if op_type in _FLOAT_ONLY and not x.type.dtype.is_floating:
            raise Unsupported(f"{op_type} of {x.type.dtype.value} (ONNX defines it for floating types)")
        return [unary(ctx, _UNARY[op_type], x)]

    return convert


for _name in _UNARY:
    converts(_name)(_unary(_name))


@converts("Neg", "Abs")
def _neg_abs(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x = need(ins, 0)
    neg = ctx.node.op_type == "Neg"
    folded = fold_symbolic(lambda a: -a if neg else sympy.Abs(a), x.type.dtype, x)
    if folded is not None:
        return [folded]
    return [unary(ctx, K.NEG if neg else K.ABS, x)]


@converts("Identity", "Dropout")
def _identity(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x = need(ins, 0)
    if ctx.node.op_type == "Dropout":
        training, ratio = arg(ins, 2), arg(ins, 1)
        training_on = training is not None and (training.numeric is None or bool(training.numeric.ravel()[0]))
        zero_ratio = ratio is not None and ratio.numeric is not None and float(ratio.numeric.ravel()[0]) == 0.0
        if training_on and not zero_ratio:  # training mode drops at random, unless the ratio is a constant 0
            raise Unsupported("random dropout (training mode with a ratio other than a constant 0)")
        mask = None  # all true, made only when the model reads it
        if len(ctx.node.output) > 1 and ctx.node.output[1]:
            mask = ctx.out(K.FULL, (), TensorType(DType.BOOL, x.type.shape), ConstantAttrs(True))
        return [x, mask]
    return [x]


@converts("Sign")
def _sign(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    t, v = x.type, ctx.tensor(x)
    b = TensorType(DType.BOOL, t.shape)
    zero, one, minus = ctx.const(0, t.dtype), ctx.const(1, t.dtype), ctx.const(-1, t.dtype)
    pos = ctx.emit(K.GT, (v, zero), b)
    neg = ctx.emit(K.LT, (v, zero), b)
    inner = ctx.emit(K.WHERE, (neg, minus, ctx.emit(K.WHERE, (ctx.emit(K.EQ, (v, v), b), zero, v), t)), t)
    return [ctx.out(K.WHERE, (pos, one, inner), t)]


@converts("IsNaN")
def _isnan(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    v = ctx.tensor(x)
    return [ctx.out(K.NE, (v, v), TensorType(DType.BOOL, x.type.shape))]


@converts("IsInf")
def _isinf(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    v, b = ctx.tensor(x), TensorType(DType.BOOL, x.type.shape)
    pos, neg = int(ctx.attr("detect_positive", 1)), int(ctx.attr("detect_negative", 1))
    checks = []
    if pos:
        checks.append(ctx.emit(K.EQ, (v, ctx.const(float("inf"), x.type.dtype)), b))
    if neg:
        checks.append(ctx.emit(K.EQ, (v, ctx.const(float("-inf"), x.type.dtype)), b))
    if not checks:
        return [OVal(b, ctx.emit(K.FULL, (), b, ConstantAttrs(False)))]
    return [OVal(b, checks[0] if len(checks) == 1 else ctx.emit(K.LOGICAL_OR, tuple(checks), b))]


@converts("LeakyRelu")
def _leaky_relu(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    return [unary(ctx, K.LEAKY_RELU, need(ins, 0), LeakyReluAttrs(float(ctx.attr("alpha", 0.01))))]


@converts("Gelu")
def _gelu(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    approx = ctx.text("approximate", "none")
    if approx not in ("none", "tanh"):
        raise Unsupported(f"approximate={approx!r}")
    return [unary(ctx, K.GELU, need(ins, 0), GeluAttrs(approx))]


def _affine(ctx: OnnxCtx, v: int, t: TensorType, alpha: float, beta: float) -> int:
    y = ctx.emit(K.MUL, (v, ctx.const(alpha, t.dtype)), t) if alpha != 1.0 else v
    return ctx.emit(K.ADD, (y, ctx.const(beta, t.dtype)), t) if beta != 0.0 else y


@converts("HardSigmoid", "HardSwish")
def _hard_sigmoid(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x = need(ins, 0)
    swish = ctx.node.op_type == "HardSwish"
    alpha = 1.0 / 6.0 if swish else float(ctx.attr("alpha", 0.2))
    beta = 0.5 if swish else float(ctx.attr("beta", 0.5))
    t, v = x.type, ctx.tensor(x)
    h = ctx.emit(K.CLAMP, (_affine(ctx, v, t, alpha, beta),), t, ClampAttrs(0.0, 1.0))
    return [ctx.out(K.MUL, (v, h), t) if swish else OVal(t, h)]


def _exp_branch(ctx: OnnxCtx, x: OVal, alpha: float, scale: float, celu: bool = False) -> OVal:
    """scale * (x if x > 0 else alpha * (exp(x / alpha) - 1)) for Celu, else alpha * (exp(x) - 1)."""
    t, v = x.type, ctx.tensor(x)
    b = TensorType(DType.BOOL, t.shape)
    arg_ = ctx.emit(K.MUL, (v, ctx.const(1.0 / alpha, t.dtype)), t) if celu else v
    e = ctx.emit(K.SUB, (ctx.emit(K.EXP, (arg_,), t), ctx.const(1.0, t.dtype)), t)
    e = ctx.emit(K.MUL, (e, ctx.const(alpha, t.dtype)), t)
    y = ctx.emit(K.WHERE, (ctx.emit(K.GT, (v, ctx.const(0.0, t.dtype)), b), v, e), t)
    return OVal(t, ctx.emit(K.MUL, (y, ctx.const(scale, t.dtype)), t) if scale != 1.0 else y)


@converts("Elu")
def _elu(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    return [_exp_branch(ctx, need(ins, 0), float(ctx.attr("alpha", 1.0)), 1.0)]


@converts("Selu")
def _selu(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    alpha = float(ctx.attr("alpha", 1.67326319217681884765625))
    gamma = float(ctx.attr("gamma", 1.05070102214813232421875))
    return [_exp_branch(ctx, need(ins, 0), alpha, gamma)]


@converts("Celu")
def _celu(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    return [_exp_branch(ctx, need(ins, 0), float(ctx.attr("alpha", 1.0)), 1.0, celu=True)]


def _softplus(ctx: OnnxCtx, v: int, t: TensorType) -> int:
    """log(1 + exp(x)), computed as max(x, 0) + log(1 + exp(-|x|)) so large inputs do not overflow."""
    relu = ctx.emit(K.RELU, (v,), t)
    na = ctx.emit(K.NEG, (ctx.emit(K.ABS, (v,), t),), t)
    tail = ctx.emit(K.LOG, (ctx.emit(K.ADD, (ctx.emit(K.EXP, (na,), t), ctx.const(1.0, t.dtype)), t),), t)
    return ctx.emit(K.ADD, (relu, tail), t)


@converts("Softplus")
def _softplus_op(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    return [OVal(x.type, _softplus(ctx, ctx.tensor(x), x.type))]


@converts("Mish")
def _mish(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    t, v = x.type, ctx.tensor(x)
    return [ctx.out(K.MUL, (v, ctx.emit(K.TANH, (_softplus(ctx, v, t),), t)), t)]


@converts("Softsign")
def _softsign(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    t, v = x.type, ctx.tensor(x)
    d = ctx.emit(K.ADD, (ctx.emit(K.ABS, (v,), t), ctx.const(1.0, t.dtype)), t)
    return [ctx.out(K.DIV, (v, d), t)]


@converts("ThresholdedRelu")
def _thresholded_relu(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    t, v = x.type, ctx.tensor(x)
    gt = ctx.emit(K.GT, (v, ctx.const(float(ctx.attr("alpha", 1.0)), t.dtype)), TensorType(DType.BOOL, t.shape))
    return [ctx.out(K.WHERE, (gt, v, ctx.const(0.0, t.dtype)), t)]


@converts("PRelu")
def _prelu(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x, slope = need(ins, 0), need(ins, 1)
    dt = _same_type(x, slope, "PRelu")
    shape = ctx.broadcast_shapes(x.type.shape, slope.type.shape)
    t = TensorType(dt, shape)
    v, s = ctx.tensor(x), ctx.tensor(slope)
    neg = ctx.emit(K.LT, (v, ctx.const(0, dt)), TensorType(DType.BOOL, x.type.shape))
    return [ctx.out(K.WHERE, (neg, ctx.emit(K.MUL, (v, s), t), v), t)]


@converts("Clip")
def _clip(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    lo, hi = arg(ins, 1), arg(ins, 2)
    dt = x.type.dtype
    if all(b is None or (b.numeric is not None and b.numeric.size == 1) for b in (lo, hi)) and dt.is_floating:
        mn = None if lo is None else float(lo.numeric.ravel()[0])  # type: ignore[union-attr]
        mx = None if hi is None else float(hi.numeric.ravel()[0])  # type: ignore[union-attr]
        if mn is None and mx is None:
            return [x]
        return [unary(ctx, K.CLAMP, x, ClampAttrs(mn, mx))]
    y = x
    if lo is not None:
        y = binary(ctx, K.MAXIMUM, y, lo, dt, dt)
    if hi is not None:
        y = binary(ctx, K.MINIMUM, y, hi, dt, dt)
    return [y]


@converts("Cast", "CastLike")
def _cast(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x = need(ins, 0)
    dt = need(ins, 1).type.dtype if ctx.node.op_type == "CastLike" else dtype_of(int(ctx.attr("to")))
    if x.type.dtype is dt:
        return [x]
    if x.is_symbolic and not dt.is_floating and dt is not DType.BOOL:
        return [known(np.vectorize(simplify_dim, otypes=[object])(x.data), dt)]
    return [ctx.out(K.CAST, (ctx.tensor(x),), TensorType(dt, x.type.shape))]
