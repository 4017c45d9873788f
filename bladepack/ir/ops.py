"""The closed operator set of the bladepack IR and the op-class lattice.

In: nothing. Out: `OpKind` (every operator the IR may contain), `OpClass` (the fusion lattice
elementwise < broadcast < injective < reduction < library < opaque), per-op attribute dataclasses, and
`OP_INFO`, the one table that says for each op its class, its attribute type and how many inputs it takes.

Note [Shapes come from types]: ops whose result shape is fully described by the result type
(reshape, expand, full, arange's length, slice's length) do not repeat it in their attributes; the
shape program computes the result type's dims and the executor reads them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Union

import sympy

# An integer that may be symbolic: a plain int or a sympy expression over shape symbols.
SymInt = Union[int, sympy.Expr]
Scalar = Union[bool, int, float]


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
    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    # library ops (compute-intensive)
    MATMUL = "matmul"
    CONV2D = "conv2d"
    MAX_POOL2D = "max_pool2d"
    AVG_POOL2D = "avg_pool2d"


# --------------------------------------------------------------------------- attributes


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True)
class GeluAttrs:
    approximate: str = "none"  # "none" (erf) or "tanh"


@dataclass(frozen=True)
class LeakyReluAttrs:
    slope: float


@dataclass(frozen=True)
class ClampAttrs:
    min: float | None
    max: float | None


@dataclass(frozen=True)
class ConstantAttrs:
    value: Scalar | sympy.Expr  # a symbolic value is computed by the shape program


@dataclass(frozen=True)
class ArangeAttrs:
    start: SymInt | float
    step: SymInt | float


@dataclass(frozen=True)
class PermuteAttrs:
    perm: tuple[int, ...]


@dataclass(frozen=True)
class SliceAttrs:
    """result[..., i, ...] = x[..., start + i * step, ...] along `axis`; the length is the type's."""

    axis: int
    start: SymInt
    step: int


@dataclass(frozen=True)
class AxisAttrs:
    axis: int


@dataclass(frozen=True)
class SafeSoftmaxAttrs(AxisAttrs):
    """Softmax whose rows that are entirely -inf give 0, not NaN: torch's scaled_dot_product_attention
    (aten._safe_softmax), where a fully masked query row (a left-padded position) attends to nothing."""

    safe: bool = True


@dataclass(frozen=True)
class IndexAttrs:
    """Advanced indexing: the index tensors (inputs 1..) stand at `axes`; other axes are taken whole."""

    axes: tuple[int, ...]


@dataclass(frozen=True)
class PadAttrs:
    """Constant padding; `pads` is (before, after) per axis, outermost first."""

    pads: tuple[tuple[SymInt, SymInt], ...]
    value: float


@dataclass(frozen=True)
class ReduceAttrs:
    axes: tuple[int, ...]
    keepdim: bool


@dataclass(frozen=True)
class ArgReduceAttrs:
    axis: int
    keepdim: bool


MAX_TOPK = 1024  # the kernels keep the best k of a line in registers


@dataclass(frozen=True)
class TopkAttrs:
    """The int64 positions of the k largest (or smallest) elements along `axis`, best first; ties keep
    the earlier position, NaN counts as larger than any number. The values are a GATHER of these."""

    axis: int
    k: int
    largest: bool


@dataclass(frozen=True)
class NormAttrs:
    """layer_norm / rms_norm over the trailing `num_axes` axes; optional weight and bias inputs follow x."""

    num_axes: int
    eps: float
    has_weight: bool
    has_bias: bool


@dataclass(frozen=True)
class MatmulAttrs:
    """torch.matmul semantics for operands of rank >= 2; `transpose_b` reads b as its last-two transpose."""

    transpose_b: bool = False


@dataclass(frozen=True)
class Conv2dAttrs:
    """`out_layout` "nchw" (torch's); "cnhw": the result's dims are [C_out, N, OH, OW], so one GEMM
    covers the whole batch (see passes/conv_layout.py), the input NCHW; or "nhwc": the input's dims are
    [N, H, W, C_in] and the result's [N, OH, OW, C_out] (Note [Channels-last chains] in
    passes/channels_last.py). `weight_layout`
    "oihw" (torch's), or "ihwo": the weight is stored [C_in, KH, KW, C_out], packed at optimize time
    for the direct convolution kernel (see passes/direct_conv.py)."""

    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    groups: int
    has_bias: bool
    out_layout: str = "nchw"
    weight_layout: str = "oihw"


# A pointwise channels-last convolution on a packed weight [C_in, 1, 1, C_out]: a linear layer over the
# rows (pixels) of [N, H, W, C_in] (Note [Dense layers] in passes/dense_layers.py), which the CPU
# emitter gives kernels of their own; channels-last chains make them of 1x1 convolutions too.
DENSE_CONV = Conv2dAttrs((1, 1), (0, 0), (1, 1), 1, False, "nhwc", "ihwo")


def is_dense_conv(attrs: object, weight_shape: tuple[object, ...]) -> bool:
    return attrs == DENSE_CONV and tuple(weight_shape[1:3]) == (1, 1)


@dataclass(frozen=True)
class Pool2dAttrs:
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    ceil_mode: bool
    count_include_pad: bool = True
    layout: str = "nchw"  # or "nhwc": input and result dims [N, H, W, C] (Note [Channels-last chains])


Attrs = Union[
    NoAttrs,
    GeluAttrs,
    LeakyReluAttrs,
    ClampAttrs,
    ConstantAttrs,
    ArangeAttrs,
    PermuteAttrs,
    SliceAttrs,
    AxisAttrs,
    IndexAttrs,
    PadAttrs,
    ReduceAttrs,
    ArgReduceAttrs,
    TopkAttrs,
    NormAttrs,
    MatmulAttrs,
    Conv2dAttrs,
    Pool2dAttrs,
]


@dataclass(frozen=True)
class OpInfo:
    op_class: OpClass
    attrs: type
    min_inputs: int
    max_inputs: int  # -1: any number


def _info(c: OpClass, attrs: type, lo: int, hi: int | None = None) -> OpInfo:
    return OpInfo(c, attrs, lo, lo if hi is None else hi)


_E, _B, _I, _R, _L = (
    OpClass.ELEMENTWISE,
    OpClass.BROADCAST,
    OpClass.INJECTIVE,
    OpClass.REDUCTION,
    OpClass.LIBRARY,
)
K = OpKind

OP_INFO: dict[OpKind, OpInfo] = {
    **{
        k: _info(_E, NoAttrs, 1)
        for k in (
            K.NEG,
            K.ABS,
            K.EXP,
            K.LOG,
            K.SQRT,
            K.RSQRT,
            K.RECIPROCAL,
            K.TANH,
            K.SIGMOID,
            K.RELU,
            K.SILU,
            K.ERF,
            K.SIN,
            K.COS,
            K.FLOOR,
            K.CAST,
            K.LOGICAL_NOT,
            K.BITWISE_NOT,
        )
    },
    K.GELU: _info(_E, GeluAttrs, 1),
    K.LEAKY_RELU: _info(_E, LeakyReluAttrs, 1),
    K.CLAMP: _info(_E, ClampAttrs, 1),
    **{
        k: _info(_B, NoAttrs, 2)
        for k in (
            K.ADD,
            K.SUB,
            K.MUL,
            K.DIV,
            K.POW,
            K.MAXIMUM,
            K.MINIMUM,
            K.FMOD,
            K.EQ,
            K.NE,
            K.LT,
            K.LE,
            K.GT,
            K.GE,
            K.LOGICAL_AND,
            K.LOGICAL_OR,
            K.BITWISE_AND,
            K.BITWISE_OR,
            K.BITWISE_XOR,
        )
    },
    K.WHERE: _info(_B, NoAttrs, 3),
    K.CONSTANT: _info(_E, ConstantAttrs, 0),
    K.FULL: _info(_B, ConstantAttrs, 0),
    K.ARANGE: _info(_I, ArangeAttrs, 0),
    K.RESHAPE: _info(_I, NoAttrs, 1),
    K.EXPAND: _info(_B, NoAttrs, 1),
    K.PERMUTE: _info(_I, PermuteAttrs, 1),
    K.SLICE: _info(_I, SliceAttrs, 1),
    K.CONCAT: _info(_I, AxisAttrs, 1, -1),
    K.TAKE: _info(_I, AxisAttrs, 2),
    K.GATHER: _info(_I, AxisAttrs, 2),
    K.INDEX: _info(_I, IndexAttrs, 2, -1),
    K.PAD: _info(_I, PadAttrs, 1),
    **{k: _info(_R, ReduceAttrs, 1) for k in (K.SUM, K.MEAN, K.AMAX, K.AMIN, K.PROD)},
    K.ARGMAX: _info(_R, ArgReduceAttrs, 1),
    K.ARGMIN: _info(_R, ArgReduceAttrs, 1),
    K.CUMSUM: _info(_R, AxisAttrs, 1),
    K.TOPK: _info(_R, TopkAttrs, 1),
    K.SOFTMAX: _info(_R, AxisAttrs, 1),
    K.LOG_SOFTMAX: _info(_R, AxisAttrs, 1),
    K.LAYER_NORM: _info(_R, NormAttrs, 1, 3),
    K.RMS_NORM: _info(_R, NormAttrs, 1, 2),
    K.MATMUL: _info(_L, MatmulAttrs, 2),
    K.CONV2D: _info(_L, Conv2dAttrs, 2, 3),
    K.MAX_POOL2D: _info(_R, Pool2dAttrs, 1),
    K.AVG_POOL2D: _info(_R, Pool2dAttrs, 1),
}

assert set(OP_INFO) == set(OpKind), "every OpKind needs an OP_INFO row"
