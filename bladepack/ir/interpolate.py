"""Separable interpolation along one axis at symbolic sizes, as IR: shared by the torch front end
(F.interpolate) and the ONNX importer (Resize on dynamic axes).

In: a graph builder, the value to resize, the axis, its input size `d` and output size `o` (ints or
symbols), the mode and coordinate transformation. Out: the resized value.

Note [Interpolation at symbolic sizes]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Every output position along the axis reads a few source positions (1 nearest, 2 linear, 4 cubic) and
weighs them. Both sizes may be symbols (a ViT run at a new image size resizes its position grid to the
patch grid), so the source indices and weights are computed in the graph, not at compile time: an
ARANGE over the output positions, the step as a float of the shape program's integers, then torch's
formulas (aten/src/ATen/native/UpSample.h) in torch's order and precision: `area_pixel_compute_scale`,
`area_pixel_compute_source_index`, every tap clamped into [0, d - 1], the cubic convolution
coefficients. ONNX Resize means the same where the two overlap: its linear taps left of a negative
coordinate read the edge, as torch's clamp of the coordinate at 0 does, and a whole coordinate weighs
one pixel by 1 either way. The result is TAKEs along the axis and a weighted sum, which fusion turns
into one loop kernel per axis.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from bladepack.dtypes import DType
from bladepack.ir.graph import GraphBuilder
from bladepack.ir.ops import ArangeAttrs, AxisAttrs, ClampAttrs, ConstantAttrs, OpKind
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.views import simplify

K = OpKind

MODES = ("nearest", "nearest-exact", "linear", "cubic")
# half_pixel: torch's align_corners=False; pytorch_half_pixel: that, but position 0 when o is 1 (ONNX);
# align_corners: the corner pixels' centres coincide; asymmetric: i * step (torch's nearest)
TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


@dataclass
class _Emit:
    b: GraphBuilder
    loc: str

    def __call__(self, op: OpKind, inputs: tuple[int, ...], t: TensorType, attrs: object = None) -> int:
        return self.b.add(op, inputs, t, attrs, self.loc)  # type: ignore[arg-type]

    def const(self, value: float | int, dt: DType) -> int:
        return self(K.CONSTANT, (), TensorType(dt, ()), ConstantAttrs(dt.scalar(value)))

    def int_const(self, value: IRDim) -> int:
        v = value if isinstance(value, int) else simplify(value)
        return self(K.CONSTANT, (), TensorType(DType.INT64, ()), ConstantAttrs(v))

    def cast(self, v: int, dt: DType) -> int:
        t = self.b.types[v]
        return v if t.dtype is dt else self(K.CAST, (v,), TensorType(dt, t.shape))


def resize_axis(
    b: GraphBuilder,
    loc: str,
    x: int,
    axis: int,
    mode: str,
    transform: str,
    d: IRDim,
    o: IRDim,
    factor: float | None,
    dt: DType,
    cubic_a: float = -0.75,
) -> int:
    """`x` resized along `axis` from d to o positions. `factor`: the output / input ratio the model
    gave (the step is its inverse), or None for d / o. `dt`: the float type positions and weights are
    computed in (and, for linear and cubic, the type `x` must already have)."""
    assert mode in MODES and transform in TRANSFORMS, (mode, transform)
    e = _Emit(b, loc)
    vec_f, vec_i = TensorType(dt, (o,)), TensorType(DType.INT64, (o,))
    ramp = e(K.ARANGE, (), vec_f, ArangeAttrs(0.0, 1.0))
    last = e.int_const(simplify(d - 1))
    zero = e.const(0, DType.INT64)

    def clamp_index(i: int) -> int:
        return e(K.MINIMUM, (e(K.MAXIMUM, (i, zero), vec_i), last), vec_i)

    def floor_index(v: int) -> int:
        return e.cast(e(K.FLOOR, (v,), vec_f), DType.INT64)

    step = _step(e, d, o, transform == "align_corners", factor, dt)
    half = e.const(0.5, dt)
    if mode == "nearest":  # floor(i * step)
        return _take(e, x, axis, clamp_index(floor_index(e(K.MUL, (ramp, step), vec_f))), o)
    if mode == "nearest-exact":  # floor((i + 0.5) * step)
        shifted = e(K.MUL, (e(K.ADD, (ramp, half), vec_f), step), vec_f)
        return _take(e, x, axis, clamp_index(floor_index(shifted)), o)
    if transform in ("align_corners", "asymmetric"):
        src = e(K.MUL, (step, ramp), vec_f)
    else:  # step * (i + 0.5) - 0.5
        src = e(K.SUB, (e(K.MUL, (step, e(K.ADD, (ramp, half), vec_f)), vec_f), half), vec_f)
        if transform == "pytorch_half_pixel" and not (isinstance(o, int) and o > 1):
            single = e(K.EQ, (e.int_const(o), e.const(1, DType.INT64)), TensorType(DType.BOOL, ()))
            src = e(K.WHERE, (single, e.const(0.0, dt), src), vec_f)
    if mode == "linear":  # taps i0 and i0 + 1 (the edge repeated), weights 1 - t and t
        src = e(K.CLAMP, (src,), vec_f, ClampAttrs(0.0, None))
        i0 = clamp_index(floor_index(src))  # the integer clamp proves the taps in range (Note [Index checks])
        frac = e(K.CLAMP, (e(K.SUB, (src, e.cast(i0, dt)), vec_f),), vec_f, ClampAttrs(0.0, 1.0))
        i1 = e(K.MINIMUM, (e(K.ADD, (i0, e.const(1, DType.INT64)), vec_i), last), vec_i)
        w0 = e(K.SUB, (e.const(1.0, dt), frac), vec_f)
        return _weighted(e, x, axis, o, [(i0, w0), (i1, frac)])
    base = floor_index(src)
    frac = e(K.SUB, (src, e(K.FLOOR, (src,), vec_f)), vec_f)
    taps = []
    for k, coef in enumerate(_cubic_coefficients(e, frac, vec_f, cubic_a)):
        shifted = e(K.ADD, (base, e.const(k - 1, DType.INT64)), vec_i)
        taps.append((clamp_index(shifted), coef))
    return _weighted(e, x, axis, o, taps)


def _step(e: _Emit, d: IRDim, o: IRDim, align: bool, factor: float | None, dt: DType) -> int:
    """torch's area_pixel_compute_scale: (d - 1) / (o - 1) aligning corners (any step when o is 1: the
    one position reads position 0), else 1 / factor when the model gave a factor, else d / o; in float."""
    scalar = TensorType(dt, ())
    if align:
        den = sympy.Max(sympy.sympify(o) - 1, 1) if not isinstance(o, int) else max(o - 1, 1)
        return e(K.DIV, (e.cast(e.int_const(simplify(d - 1)), dt), e.cast(e.int_const(den), dt)), scalar)
    if factor is not None:
        return e.const(1.0 / factor, dt)
    return e(K.DIV, (e.cast(e.int_const(d), dt), e.cast(e.int_const(o), dt)), scalar)


def _cubic_coefficients(e: _Emit, t: int, vt: TensorType, a: float) -> list[int]:
    """torch's get_cubic_upsample_coefficients: cubic convolution 2 at t + 1 and 2 - t, 1 at t and 1 - t."""

    def c(v: float) -> int:
        return e.const(v, vt.dtype)

    def mul(x: int, y: int) -> int:
        return e(K.MUL, (x, y), vt)

    def add(x: int, y: int) -> int:
        return e(K.ADD, (x, y), vt)

    def sub(x: int, y: int) -> int:
        return e(K.SUB, (x, y), vt)

    def conv1(x: int) -> int:  # ((A + 2) * x - (A + 3)) * x * x + 1
        return add(mul(mul(sub(mul(c(a + 2), x), c(a + 3)), x), x), c(1.0))

    def conv2(x: int) -> int:  # ((A * x - 5A) * x + 8A) * x - 4A
        return sub(mul(add(mul(sub(mul(c(a), x), c(5 * a)), x), c(8 * a)), x), c(4 * a))

    one_minus = sub(c(1.0), t)
    return [conv2(add(t, c(1.0))), conv1(t), conv1(one_minus), conv2(add(one_minus, c(1.0)))]


def _take(e: _Emit, x: int, axis: int, index: int, o: IRDim) -> int:
    t = e.b.types[x]
    shape = list(t.shape)
    shape[axis] = o
    return e(K.TAKE, (x, index), TensorType(t.dtype, tuple(shape)), AxisAttrs(axis))


def _weighted(e: _Emit, x: int, axis: int, o: IRDim, taps: list[tuple[int, int]]) -> int:
    """sum over taps of weight[j] * x[..., index[j], ...] along `axis`, in tap order."""
    rank = e.b.types[x].rank
    acc: int | None = None
    for index, weight in taps:
        g = _take(e, x, axis, index, o)
        wt = e.b.types[weight]
        w_shape = (o,) + (1,) * (rank - axis - 1)
        w = weight if wt.shape == w_shape else e(K.RESHAPE, (weight,), TensorType(wt.dtype, w_shape))
        term = e(K.MUL, (w, g), e.b.types[g])
        acc = term if acc is None else e(K.ADD, (acc, term), e.b.types[g])
    assert acc is not None
    return acc
