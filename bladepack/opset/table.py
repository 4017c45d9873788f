"""The op table: what every IR op is, in one place (loader-safe: numpy only).

In: nothing. Out: `OpKind` (the closed op vocabulary), `OpClass` (the fusion lattice elementwise <
broadcast < injective < reduction < library < opaque) and `OP_INFO`, one `OpInfo` per op: its class,
attribute type and arity; its cost inside a fused kernel (`Cost`); how it treats a batch-like dim
(`Batch`, Note [Batch-like dims] in ir/batch_dims.py); and for elementwise ops its scalar C expression
(`CSpelling`, rendered by codegen/c_render.py for both the CPU and CUDA emitters over the helpers of
codegen/scalar_ops.h) and its numpy reference (what loader/reference.py computes).

Note [Adding an elementwise op]: a row in `OpKind` and in `OP_INFO` (class, arity, cost, batch rule,
C spelling, numpy reference), a scalar helper in codegen/scalar_ops.h when C has no spelling for it,
the front ends' name mappings (export/ops_elementwise.py, onnx_import/ops_elementwise.py), and
`python scripts/generate.py` for the C++ runtime's list of plan ops (cpp_runtime/src/plan_ops.h).
Nothing else names an elementwise op; docs/architecture.md "Adding an op" says the same.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Any

import numpy as np

from bladepack.opset.attrs import (
    ArangeAttrs,
    ArgReduceAttrs,
    AxisAttrs,
    ClampAttrs,
    ConstantAttrs,
    Conv2dAttrs,
    GeluAttrs,
    IndexAttrs,
    LeakyReluAttrs,
    MatmulAttrs,
    NoAttrs,
    NormAttrs,
    PadAttrs,
    PermuteAttrs,
    Pool2dAttrs,
    RecurrentAttrs,
    ReduceAttrs,
    ScatterAttrs,
    SelectiveScanAttrs,
    SliceAttrs,
    SortAttrs,
    TopkAttrs,
)


class OpClass(IntEnum):
    """The op-class lattice used by fusion; a larger value is less fusible."""

    ELEMENTWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    LIBRARY = 4
    OPAQUE = 5


class OpKind(str, Enum):
    # elementwise, unary
    NEG = "neg"
    ABS = "abs"
    EXP = "exp"
    LOG = "log"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIPROCAL = "reciprocal"
    TANH = "tanh"
    SIGMOID = "sigmoid"
    RELU = "relu"
    GELU = "gelu"
    SILU = "silu"
    ERF = "erf"
    SIN = "sin"
    COS = "cos"
    FLOOR = "floor"
    LEAKY_RELU = "leaky_relu"
    CLAMP = "clamp"
    CAST = "cast"
    LOGICAL_NOT = "logical_not"
    BITWISE_NOT = "bitwise_not"
    SIGN = "sign"
    CEIL = "ceil"
    TRUNC = "trunc"
    ROUND = "round"
    LOG1P = "log1p"
    EXPM1 = "expm1"
    LOG2 = "log2"
    LOG10 = "log10"
    TAN = "tan"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    SINH = "sinh"
    COSH = "cosh"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    # elementwise, binary and ternary (numpy / torch broadcasting)
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    POW = "pow"
    MAXIMUM = "maximum"
    MINIMUM = "minimum"
    FMOD = "fmod"
    EQ = "eq"
    NE = "ne"
    LT = "lt"
    LE = "le"
    GT = "gt"
    GE = "ge"
    LOGICAL_AND = "logical_and"
    LOGICAL_OR = "logical_or"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    LOGICAL_XOR = "logical_xor"
    ATAN2 = "atan2"
    REMAINDER = "remainder"
    WHERE = "where"
    # generators
    CONSTANT = "constant"
    FULL = "full"
    ARANGE = "arange"
    # injective (layout and indexing)
    RESHAPE = "reshape"
    EXPAND = "expand"
    PERMUTE = "permute"
    SLICE = "slice"
    CONCAT = "concat"
    TAKE = "take"
    GATHER = "gather"
    INDEX = "index"
    PAD = "pad"
    # reductions and scans
    SUM = "sum"
    MEAN = "mean"
    AMAX = "amax"
    AMIN = "amin"
    PROD = "prod"
    ARGMAX = "argmax"
    ARGMIN = "argmin"
    CUMSUM = "cumsum"
    TOPK = "topk"
    SORT = "sort"
    SCATTER = "scatter"
    RECURRENT = "recurrent"
    SELECTIVE_SCAN = "selective_scan"
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    # library ops (compute-intensive)
    MATMUL = "matmul"
    CONV2D = "conv2d"
    MAX_POOL2D = "max_pool2d"
    AVG_POOL2D = "avg_pool2d"


class Cost(Enum):
    """What an op costs inside a fused kernel. `recompute`: Note [Materialize or recompute] in
    passes/fusion.py may compute a value built from it again in each kernel that uses it; `weight`: its
    share of a kernel's work estimate (codegen/kernel.kernel_cost, the threads' chunk size)."""

    CHEAP = "cheap"  # a few arithmetic instructions
    LOOKUP = "lookup"  # a load through a computed index: cheap to compute, costly to repeat
    LIBM = "libm"  # a libm call the work estimate does not weigh yet (sin, cos)
    HEAVY = "heavy"  # exp, log, tanh, erf, pow and what builds on them

    @property
    def recompute(self) -> bool:
        return self is Cost.CHEAP

    @property
    def weight(self) -> int:
        return 8 if self is Cost.HEAVY else 1


class Batch(Enum):
    """How an op treats a batch-like dim (Note [Batch-like dims] in ir/batch_dims.py)."""

    ALIGNED = "aligned"  # elementwise: the operands' batch axes align from the right
    REDUCE = "reduce"  # reduces over `axes`: fails when they include the batch axis
    ARG_REDUCE = "arg_reduce"  # reduces over `axis` to positions
    ALONG_AXIS = "along_axis"  # scans or ranks along `axis`
    NORM = "norm"  # normalizes the trailing `num_axes` axes
    OWN = "own"  # a rule of its own in ir/batch_dims.py (layout, indexing, library ops)


# --------------------------------------------------------------------------- C spellings


@dataclass(frozen=True)
class CSpelling:
    """The C expression of an elementwise op over operands already in its computation type: a template
    over {x} (unary), {a} {b} (binary) or {c} {a} {b} (where) and {t}, the C type; `integer` and
    `boolean` replace `real` for integer and bool results (None: the next one up: bool → integer →
    real)."""

    real: str
    integer: str | None = None
    boolean: str | None = None

    def template(self, floating: bool, boolean: bool) -> str:
        if floating:
            return self.real
        if boolean and self.boolean is not None:
            return self.boolean
        return self.integer if self.integer is not None else self.real


# A spelling that depends on attributes: (x, C type, floating?, attrs, literal of a number) -> C text.
AttrSpelling = Callable[[str, str, bool, Any, Callable[[Any], str]], str]


def _gelu_c(x: str, t: str, floating: bool, attrs: Any, literal: Callable[[Any], str]) -> str:
    return f"bpk::gelu_{'tanh' if attrs.approximate == 'tanh' else 'erf'}({x})"


def _leaky_relu_c(x: str, t: str, floating: bool, attrs: Any, literal: Callable[[Any], str]) -> str:
    return f"({x} > {t}(0) ? {x} : {t}({x} * {literal(attrs.slope)}))"


def _clamp_c(x: str, t: str, floating: bool, attrs: Any, literal: Callable[[Any], str]) -> str:
    """NaN stays NaN (torch's clamp), through the NaN-propagating min / max of scalar_ops.h; both
    bounds, in order, through its clamp_nan (Note [Vector clamp]: the same values, fewer instructions)."""
    if floating and attrs.min is not None and attrs.max is not None and attrs.min <= attrs.max:
        return f"bpk::clamp_nan<{t}>({x}, {literal(attrs.min)}, {literal(attrs.max)})"
    out = x
    if attrs.min is not None:
        lo = literal(attrs.min)
        out = f"bpk::fmax_nan<{t}>({out}, {lo})" if floating else f"({out} < {lo} ? {lo} : {out})"
    if attrs.max is not None:
        hi = literal(attrs.max)
        out = f"bpk::fmin_nan<{t}>({out}, {hi})" if floating else f"({out} > {hi} ? {hi} : {out})"
    return out


# --------------------------------------------------------------------------- numpy references
# Called with the op's input arrays and its attributes as keywords; loader/reference.py casts the result
# to the result dtype. Functions numpy lacks are computed in float64.

_ERFC_COEF = (
    -1.26551223,
    1.00002368,
    0.37409196,
    0.09678418,
    -0.18628806,
    0.27886807,
    -1.13520398,
    1.48851587,
    -0.82215223,
    0.17087277,
)


def erfc(x: np.ndarray) -> np.ndarray:
    """Complementary error function in float64, relative error < 1.2e-7 everywhere (Chebyshev fit)
    and a series near zero so that erf keeps its relative accuracy for tiny arguments."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = np.zeros_like(t)
    for c in reversed(_ERFC_COEF):
        poly = poly * t + c
    ans = t * np.exp(-z * z + poly)
    out = np.where(x >= 0, ans, 2.0 - ans)
    small = z < 0.5
    if np.any(small):
        out = np.where(small, 1.0 - _erf_series(x.astype(np.float64)), out)
    return out


def _erf_series(x: np.ndarray) -> np.ndarray:
    term, total, x2 = x.copy(), x.copy(), x * x
    for n in range(1, 14):
        term = term * (-x2) / n
        total = total + term / (2 * n + 1)
    return total * (2.0 / math.sqrt(math.pi))


def erf(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    return np.where(np.abs(x64) < 0.5, _erf_series(x64), 1.0 - erfc(x64))


def _gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    x = x.astype(np.float64)
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * erfc(-x / math.sqrt(2.0))


def _clamp(x: np.ndarray, min: float | None, max: float | None) -> np.ndarray:  # the attributes' names
    if min is not None:
        x = np.maximum(x, np.asarray(min).astype(x.dtype))
    if max is not None:
        x = np.minimum(x, np.asarray(max).astype(x.dtype))
    return x


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """True division; on integers, truncation toward zero with x / 0 = 0 (as the kernels do)."""
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":
        a64, b64 = np.broadcast_arrays(a.astype(np.int64), b.astype(np.int64))
        safe = np.where(b64 == 0, 1, b64)
        q = np.abs(a64) // np.abs(safe)
        return np.where(b64 == 0, 0, np.where((a64 < 0) != (safe < 0), -q, q))
    return np.true_divide(a, b)


def _remainder(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch.remainder (Python's %): the remainder has the divisor's sign; on integers x % 0 is 0 (as
    the kernels do)."""
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":
        a64, b64 = np.broadcast_arrays(a.astype(np.int64), b.astype(np.int64))
        return np.where(b64 == 0, 0, np.remainder(a64, np.where(b64 == 0, 1, b64)))
    return np.remainder(a, b)


def _sign(x: np.ndarray) -> np.ndarray:
    """torch.sign: NaN gives 0 (numpy's gives NaN)."""
    if x.dtype.kind == "b":
        return x
    out = np.sign(x)
    return np.where(np.isnan(out), 0, out) if x.dtype.kind == "f" else out


def _fmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """C's fmod: the remainder has the dividend's sign; on integers x % 0 is 0 (as the kernels do)."""
    if a.dtype.kind in "iub" and b.dtype.kind in "iub":
        a64, b64 = np.broadcast_arrays(a.astype(np.int64), b.astype(np.int64))
        return np.where(b64 == 0, 0, np.fmod(a64, np.where(b64 == 0, 1, b64)))
    return np.fmod(a, b)


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class OpInfo:
    op_class: OpClass
    attrs: type
    min_inputs: int
    max_inputs: int  # -1: any number
    cost: Cost = Cost.CHEAP
    batch: Batch = Batch.OWN
    c: CSpelling | AttrSpelling | None = None  # elementwise ops: Note [Adding an elementwise op]
    numpy: Callable[..., Any] | None = None  # elementwise ops: the reference, fn(*inputs, **attrs)


def _unary(
    c: CSpelling | AttrSpelling, numpy: Callable[..., Any], cost: Cost = Cost.CHEAP, attrs: type = NoAttrs
) -> OpInfo:
    return OpInfo(OpClass.ELEMENTWISE, attrs, 1, 1, cost, Batch.ALIGNED, c, numpy)


def _binary(c: CSpelling, numpy: Callable[..., Any], cost: Cost = Cost.CHEAP) -> OpInfo:
    return OpInfo(OpClass.BROADCAST, NoAttrs, 2, 2, cost, Batch.ALIGNED, c, numpy)


def _info(
    c: OpClass, attrs: type, lo: int, hi: int | None = None, cost: Cost = Cost.CHEAP, batch: Batch = Batch.OWN
) -> OpInfo:
    return OpInfo(c, attrs, lo, lo if hi is None else hi, cost, batch)


K, S = OpKind, CSpelling
_E, _B, _I, _R, _L = OpClass.ELEMENTWISE, OpClass.BROADCAST, OpClass.INJECTIVE, OpClass.REDUCTION, OpClass.LIBRARY
_HEAVY, _LIBM, _LOOKUP = Cost.HEAVY, Cost.LIBM, Cost.LOOKUP

OP_INFO: dict[OpKind, OpInfo] = {
    K.NEG: _unary(S("{t}(-{x})", boolean="(!{x})"), np.negative),
    K.ABS: _unary(S("std::abs({x})", boolean="{x}"), np.abs),
    K.EXP: _unary(S("bpk::vexp({x})"), np.exp, _HEAVY),
    K.LOG: _unary(S("std::log({x})"), np.log, _HEAVY),
    K.SQRT: _unary(S("std::sqrt({x})"), np.sqrt),
    K.RSQRT: _unary(S("({t}(1) / std::sqrt({x}))"), lambda x: 1.0 / np.sqrt(x)),
    K.RECIPROCAL: _unary(S("({t}(1) / {x})"), lambda x: 1.0 / x),
    K.TANH: _unary(S("std::tanh({x})"), np.tanh, _HEAVY),
    K.SIGMOID: _unary(S("bpk::sigmoid({x})"), lambda x: 1.0 / (1.0 + np.exp(-x)), _HEAVY),
    # NaN stays NaN in the float form
    K.RELU: _unary(
        S("({x} < {t}(0) ? {t}(0) : {x})", integer="{t}({x} > 0 ? {x} : 0)"), lambda x: np.maximum(x, 0).astype(x.dtype)
    ),
    K.GELU: _unary(_gelu_c, _gelu, _HEAVY, GeluAttrs),
    K.SILU: _unary(S("({x} * bpk::sigmoid({x}))"), lambda x: x / (1.0 + np.exp(-x)), _HEAVY),
    K.ERF: _unary(S("bpk::verf({x})"), erf, _HEAVY),
    K.SIN: _unary(S("std::sin({x})"), np.sin, _LIBM),
    K.COS: _unary(S("std::cos({x})"), np.cos, _LIBM),
    K.FLOOR: _unary(S("std::floor({x})", integer="{x}"), np.floor),
    K.LEAKY_RELU: _unary(
        _leaky_relu_c, lambda x, slope: np.where(x > 0, x, x * np.asarray(slope, dtype=x.dtype)), attrs=LeakyReluAttrs
    ),
    K.CLAMP: _unary(_clamp_c, _clamp, attrs=ClampAttrs),
    K.CAST: _unary(S("{x}"), lambda x: x),
    K.LOGICAL_NOT: _unary(S("(!{x})"), np.logical_not),
    K.BITWISE_NOT: _unary(S("{t}(~{x})", boolean="(!{x})"), np.invert),
    K.SIGN: _unary(S("{t}(({x} > {t}(0)) - ({x} < {t}(0)))", boolean="{x}"), _sign),
    K.CEIL: _unary(S("std::ceil({x})", integer="{x}"), np.ceil),
    K.TRUNC: _unary(S("std::trunc({x})", integer="{x}"), np.trunc),
    K.ROUND: _unary(S("std::nearbyint({x})", integer="{x}"), np.rint),  # half to even, as torch.round
    K.LOG1P: _unary(S("std::log1p({x})"), np.log1p, _HEAVY),
    K.EXPM1: _unary(S("std::expm1({x})"), np.expm1, _HEAVY),
    K.LOG2: _unary(S("std::log2({x})"), np.log2, _HEAVY),
    K.LOG10: _unary(S("std::log10({x})"), np.log10, _HEAVY),
    K.TAN: _unary(S("std::tan({x})"), np.tan, _LIBM),
    K.ASIN: _unary(S("std::asin({x})"), np.arcsin, _LIBM),
    K.ACOS: _unary(S("std::acos({x})"), np.arccos, _LIBM),
    K.ATAN: _unary(S("std::atan({x})"), np.arctan, _LIBM),
    K.SINH: _unary(S("std::sinh({x})"), np.sinh, _HEAVY),
    K.COSH: _unary(S("std::cosh({x})"), np.cosh, _HEAVY),
    K.ASINH: _unary(S("std::asinh({x})"), np.arcsinh, _HEAVY),
    K.ACOSH: _unary(S("std::acosh({x})"), np.arccosh, _HEAVY),
    K.ATANH: _unary(S("std::atanh({x})"), np.arctanh, _HEAVY),
    K.ADD: _binary(S("{t}({a} + {b})", boolean="({a} || {b})"), np.add),
    K.SUB: _binary(S("{t}({a} - {b})"), np.subtract),
    K.MUL: _binary(S("{t}({a} * {b})", boolean="({a} && {b})"), np.multiply),
    K.DIV: _binary(S("({a} / {b})", integer="bpk::div_trunc<{t}>({a}, {b})"), _div),
    K.POW: _binary(S("{t}(std::pow({a}, {b}))", integer="bpk::ipow<{t}>({a}, {b})"), np.power, _HEAVY),
    K.MAXIMUM: _binary(S("bpk::fmax_nan<{t}>({a}, {b})", integer="({a} > {b} ? {a} : {b})"), np.maximum),
    K.MINIMUM: _binary(S("bpk::fmin_nan<{t}>({a}, {b})", integer="({a} < {b} ? {a} : {b})"), np.minimum),
    K.FMOD: _binary(S("{t}(std::fmod({a}, {b}))", integer="bpk::fmod_i<{t}>({a}, {b})"), _fmod),
    K.EQ: _binary(S("({a} == {b})"), np.equal),
    K.NE: _binary(S("({a} != {b})"), np.not_equal),
    K.LT: _binary(S("({a} < {b})"), np.less),
    K.LE: _binary(S("({a} <= {b})"), np.less_equal),
    K.GT: _binary(S("({a} > {b})"), np.greater),
    K.GE: _binary(S("({a} >= {b})"), np.greater_equal),
    K.LOGICAL_AND: _binary(S("(bool({a}) && bool({b}))"), np.logical_and),
    K.LOGICAL_OR: _binary(S("(bool({a}) || bool({b}))"), np.logical_or),
    K.BITWISE_AND: _binary(S("{t}({a} & {b})"), np.bitwise_and),
    K.BITWISE_OR: _binary(S("{t}({a} | {b})"), np.bitwise_or),
    K.BITWISE_XOR: _binary(S("{t}({a} ^ {b})"), np.bitwise_xor),
    K.LOGICAL_XOR: _binary(S("(bool({a}) != bool({b}))"), np.logical_xor),
    K.ATAN2: _binary(S("std::atan2({a}, {b})"), np.arctan2, _LIBM),
    K.REMAINDER: _binary(S("bpk::remainder_f<{t}>({a}, {b})", integer="bpk::remainder_i<{t}>({a}, {b})"), _remainder),
    K.WHERE: OpInfo(_B, NoAttrs, 3, 3, Cost.CHEAP, Batch.ALIGNED, S("({c} ? {a} : {b})"), np.where),
    K.CONSTANT: _info(_E, ConstantAttrs, 0, batch=Batch.ALIGNED),
    K.FULL: _info(_B, ConstantAttrs, 0, batch=Batch.ALIGNED),
    K.ARANGE: _info(_I, ArangeAttrs, 0),
    K.RESHAPE: _info(_I, NoAttrs, 1),
    K.EXPAND: _info(_B, NoAttrs, 1, batch=Batch.ALIGNED),
    K.PERMUTE: _info(_I, PermuteAttrs, 1),
    K.SLICE: _info(_I, SliceAttrs, 1),
    K.CONCAT: _info(_I, AxisAttrs, 1, -1),
    K.TAKE: _info(_I, AxisAttrs, 2, cost=_LOOKUP),
    K.GATHER: _info(_I, AxisAttrs, 2, cost=_LOOKUP),
    K.INDEX: _info(_I, IndexAttrs, 2, -1, cost=_LOOKUP),
    K.PAD: _info(_I, PadAttrs, 1),
    **{k: _info(_R, ReduceAttrs, 1, batch=Batch.REDUCE) for k in (K.SUM, K.MEAN, K.AMAX, K.AMIN, K.PROD)},
    K.ARGMAX: _info(_R, ArgReduceAttrs, 1, batch=Batch.ARG_REDUCE),
    K.ARGMIN: _info(_R, ArgReduceAttrs, 1, batch=Batch.ARG_REDUCE),
    K.CUMSUM: _info(_R, AxisAttrs, 1, batch=Batch.ALONG_AXIS),
    K.TOPK: _info(_R, TopkAttrs, 1, batch=Batch.ALONG_AXIS),
    K.SORT: _info(_R, SortAttrs, 1, batch=Batch.ALONG_AXIS),
    K.SCATTER: _info(_R, ScatterAttrs, 3, cost=_LOOKUP, batch=Batch.OWN),
    K.RECURRENT: _info(_R, RecurrentAttrs, 4, 6, cost=_HEAVY, batch=Batch.OWN),
    K.SELECTIVE_SCAN: _info(_R, SelectiveScanAttrs, 5, 8, cost=_HEAVY, batch=Batch.OWN),
    K.SOFTMAX: _info(_R, AxisAttrs, 1, batch=Batch.ALONG_AXIS),
    K.LOG_SOFTMAX: _info(_R, AxisAttrs, 1, batch=Batch.ALONG_AXIS),
    K.LAYER_NORM: _info(_R, NormAttrs, 1, 3, batch=Batch.NORM),
    K.RMS_NORM: _info(_R, NormAttrs, 1, 2, batch=Batch.NORM),
    K.MATMUL: _info(_L, MatmulAttrs, 2),
    K.CONV2D: _info(_L, Conv2dAttrs, 2, 3),
    K.MAX_POOL2D: _info(_R, Pool2dAttrs, 1),
    K.AVG_POOL2D: _info(_R, Pool2dAttrs, 1),
}

assert set(OP_INFO) == set(OpKind), "every OpKind needs an OP_INFO row"
assert all((i.c is None) == (i.numpy is None) for i in OP_INFO.values()), "a C spelling needs a numpy reference"

# Binary ops that compare their operands in the operands' promoted type (c_render.promote); every other
# elementwise op computes in its result type.
COMPARISONS = frozenset({K.EQ, K.NE, K.LT, K.LE, K.GT, K.GE})
