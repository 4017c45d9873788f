"""The attributes of IR ops: one frozen dataclass per attribute shape (loader-safe: no sympy at run time).

In: nothing. Out: the attribute types `OP_INFO` (table.py) names per op, `Attrs` (their union),
`DENSE_CONV` / `is_dense_conv` and `MAX_TOPK`. Sizes that may be symbolic are `SymInt` (ir/ops.py gives
the run-time alias: sympy stays a compile-side dependency).

Note [Negative indices]: an index operand of take, gather and index (advanced indexing) may be
negative and counts from the end of its axis, as ONNX and torch's `x[idx]` say — unless the op's
attributes are `TakeAttrs` with `wrap=False` (torch's embedding, index_select, gather), where a
negative index is out of range like one past the end: the kernels report it (ERR_INDEX_NONNEG,
codegen/kernel.py) and the loaders raise IndexRangeError (an ExecutionError, and an InputError: a
server answers 400; the C ABI's BPK_ERR_INDEX) naming the op and its source line, as eager raises
IndexError. Every other index the front ends or passes make (interpolation, topk's values) is
in range by construction.

Note [Shapes come from types]: ops whose result shape is fully described by the result type
(reshape, expand, full, arange's length, slice's length) do not repeat it in their attributes; the
shape program computes the result type's dims and the executor reads them from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    import sympy

    # An integer that may be symbolic: a plain int or a sympy expression over shape symbols.
    SymInt = Union[int, sympy.Expr]
    Scalar = Union[bool, int, float]


@dataclass(frozen=True)
class NoAttrs:
    pass


@dataclass(frozen=True)
class GeluAttrs:
    approximate: str = "none"  # "none" (the exact form) or "tanh"


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
class TakeAttrs(AxisAttrs):
    """take / gather whose indices may not be negative: torch's embedding, index_select and gather raise
    on a negative index, where ONNX's Gather and torch's advanced indexing count it from the end (plain
    `AxisAttrs`: Note [Negative indices])."""

    wrap: bool = False


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


SCATTER_REDUCTIONS = ("none", "sum", "prod", "amax", "amin")


@dataclass(frozen=True)
class ScatterAttrs:
    """scatter(self, index, src) along `axis`: the result is self, then for every position p of index,
    result[p with p[axis] = index[p]] = src[p] ("none": the last such src in index order wins) or
    combined with it by `reduce`; with include_self False an element some p reaches starts from the
    reduction's identity instead of self. An index outside [0, self.shape[axis]) is an error (torch's
    scatter takes no negative index)."""

    axis: int
    reduce: str = "none"
    include_self: bool = True


# Note [Recurrent cells]: the cells of RECURRENT and their gates, in torch's order (ONNX's importer
# reorders its weights to it): LSTM i, f, g, o (c' = f*c + i*g, h' = o*tanh(c')); GRU r, z, n
# (h' = (1 - z)*n + z*h); the plain cells one gate, h' = tanh(.) or relu(.).
RECURRENT_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


@dataclass(frozen=True)
class RecurrentAttrs:
    """One direction of one recurrent layer over the sequence (Note [Recurrent cells]). Inputs: xg
    [S, B, G*H] (the input projection x @ W_ih^T + b_ih, for every step at once), r [H, G*H] (W_hh^T),
    rb [G*H] (b_hh), h0 [B, H], and for an LSTM c0 [B, H] and optionally its peephole weights p [3H]
    (i, f, o: i and f add p * c before the step, o adds p * c after it). Steps run t = 0 .. S-1, or S-1 .. 0 with
    `reverse`. The result is [S, B, H], the hidden state after each step; an LSTM's is [S, B, 2H], the
    cell state after each step in the second half. A GRU's candidate gate is tanh(xg_n + r*(h @ R_n +
    rb_n)) (torch's, ONNX's linear_before_reset=1), or with `linear_before_reset` False ONNX's default,
    tanh(xg_n + (r*h) @ R_n + rb_n)."""

    cell: str
    hidden: int
    reverse: bool = False
    linear_before_reset: bool = True


@dataclass(frozen=True)
class SelectiveScanAttrs:
    """Mamba's selective scan over the last axis (Note [Selective scan kernel] in
    codegen/selective_scan_kernel.py). Inputs u [B, D, L]; dt [B, H, L] for H heads dividing D (H = D
    in Mamba; channel d is in head d // (D / H)); A [H, N] or [H, 1] (one A for every N); Bm, Cm
    [B, N, L] or [B, G, N, L] (channel d reads group d // (D / G)); then D [H], z [B, D, L] and
    dt_bias [H] where the flags say. Per channel: delta = dt (+ dt_bias), softplus'd with `softplus`;
    x = exp(delta * A) * x + delta * Bm * u from x = 0; y = x . Cm (+ D * u), times silu(z). The result
    is y [B, D, L]."""

    softplus: bool
    has_d: bool
    has_z: bool
    has_bias: bool


@dataclass(frozen=True)
class TopkAttrs:
    """The int64 positions of the k largest (or smallest) elements along `axis`, best first; ties keep
    the earlier position, NaN counts as larger than any number. The values are a GATHER of these."""

    axis: int
    k: int
    largest: bool


@dataclass(frozen=True)
class SortAttrs:
    """The int64 positions of a line along `axis` in stable sorted order (Note [Sort kernel]):
    ascending with NaN last, or descending with NaN first; ties keep input order, as
    torch.sort(stable=True). For any length, constant or symbolic. The values are a GATHER of these."""

    axis: int
    descending: bool


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
    "oihw" (torch's), "ihwo": the weight is stored [C_in, KH, KW, C_out], packed at optimize time
    for the direct convolution kernel (see passes/direct_conv.py), or "panels": a 1x1 weight stored
    [ceil(C_out / 16), C_in, 1, 16], the [C_in, C_out] matrix in column panels of 16, zero-padded
    (Note [Dense weight panels] in passes/dense_layers.py), or "tap_panels": a weight stored
    [ceil(C_out / 16) * KH, KW, C_in, 16]: per panel of 16 output channels (the last zero-padded), per
    tap, the [C_in, 16] matrix, each panel contiguous (Note [Wide convolutions] and Note [Weight panels]
    in codegen/cpu_conv_wide.py), or "winograd": a 3x3 weight's Winograd transform, stored
    [ceil(C_out / B) * 4, 4, C_in, B] with B = min(C_out, CHANNEL_BLOCK): per block of B output channels
    (the last zero-padded), per transformed element, the [C_in, B] matrix (Note [Winograd convolutions] in codegen/
    cpu_conv_winograd.py), or "hwio_winograd": a 3x3 weight of at most CHANNEL_BLOCK output channels
    stored [9 + 16, 1, C_in, C_out], the filter and then its Winograd transform, for a kernel with a
    direct and a Winograd variant (Note [Winograd at few channels] in codegen/cpu_conv_winograd.py)."""

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
# The same product on a weight in column panels (Note [Dense weight panels]): a linear layer's.
DENSE_PANELS = Conv2dAttrs((1, 1), (0, 0), (1, 1), 1, False, "nhwc", "panels")
PANEL = 16  # columns per weight panel
# Note [Dense weight sizes] in passes/dense_layers.py: a dense layer's weight (or a piece of its K) of
# up to this many bytes stays in the core's L2 while the kernel walks a tile's rows outer; a larger one
# is walked by its column blocks outer, one block's panel in L2.
MAX_WEIGHT_BYTES = 512 * 1024
# Output channels per register tile of the channels-last and dense kernels at their widest (four
# AVX-512 vectors); wider convolutions loop over blocks, and a panel's K bound follows from it.
CHANNEL_BLOCK = 64


def is_dense_conv(attrs: object, weight_shape: tuple[object, ...]) -> bool:
    if attrs == DENSE_PANELS:
        return len(weight_shape) == 4 and weight_shape[2] == 1 and weight_shape[3] == PANEL
    return attrs == DENSE_CONV and tuple(weight_shape[1:3]) == (1, 1)


def generated_conv(attrs: object) -> bool:
    """A convolution a generated kernel runs on its packed weight ("ihwo", "panels", "tap_panels", "winograd"
    or "hwio_winograd"), not a GEMM."""
    packed = ("ihwo", "panels", "tap_panels", "winograd", "hwio_winograd")
    return isinstance(attrs, Conv2dAttrs) and attrs.weight_layout in packed


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
    TakeAttrs,
    IndexAttrs,
    PadAttrs,
    ReduceAttrs,
    ArgReduceAttrs,
    TopkAttrs,
    SortAttrs,
    ScatterAttrs,
    RecurrentAttrs,
    SelectiveScanAttrs,
    NormAttrs,
    MatmulAttrs,
    Conv2dAttrs,
    Pool2dAttrs,
]
