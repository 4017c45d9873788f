"""Grid sampling in IR, shared by the torch front end (grid_sampler_2d / 3d) and the ONNX importer
(GridSample): bilinear (trilinear), nearest and bicubic sampling, zeros / border / reflection padding,
align_corners either way, as coordinate arithmetic and gathers.

In: a `Builder` (either front end's context, ir/builder.py), the input [N, C, H, W] or [N, C, D, H, W],
the grid [N, Ho, Wo, 2] or [N, Do, Ho, Wo, 3] (x, y (, z) in [-1, 1]), the mode, padding and
align_corners. Out: [N, C, Ho, Wo] or [N, C, Do, Ho, Wo].

Note [Grid sampling]: torch's own arithmetic, step by step (GridSampler.h), which ONNX's GridSample
specifies too: a coordinate is unnormalized to pixels (align_corners: (g + 1) / 2 * (size - 1), else
((g + 1) * size - 1) / 2), then clipped (border) or reflected about the edges and clipped
(reflection); nearest rounds it half to even, bilinear takes the four neighbours floor / floor + 1
weighted by the distances (trilinear: the eight of a voxel). A neighbour outside the image contributes
zero: its index is clamped into the image for the gather (an INDEX on the input read as [N, H, W, C],
so every pixel's channels are one row) and its weight multiplied by 0. Bicubic (2-D only, as torch
has it) unnormalizes without padding, takes the 4 x 4 taps from floor - 1 to floor + 2, pads each tap's
own integer position (torch's get_value_bounded), and weights them by the cubic convolution with
A = -0.75, each row along x first, then the rows along y (torch's cubic_interp1d twice).
"""

from __future__ import annotations

import itertools

from bladepack.dtypes import DType
from bladepack.ir.builder import Builder
from bladepack.ir.ops import ArangeAttrs, ConstantAttrs, IndexAttrs, OpKind, PermuteAttrs, SliceAttrs
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.views import simplify

K = OpKind
BILINEAR, NEAREST, BICUBIC = 0, 1, 2  # torch's mode numbers
CUBIC_A = -0.75  # the cubic convolution's parameter, torch's and ONNX's
ZEROS, BORDER, REFLECTION = 0, 1, 2  # torch's padding numbers


class _Coords:
    """Elementwise arithmetic on [N, Ho, Wo] coordinate tensors of one dtype."""

    def __init__(self, b: Builder, shape: tuple[IRDim, ...], dt: DType) -> None:
        self.b, self.shape, self.dt = b, shape, dt

    def t(self, dt: DType | None = None) -> TensorType:
        return TensorType(dt or self.dt, self.shape)

    def c(self, v: float | IRDim) -> int:
        if isinstance(v, (int, float)):
            return self.b.const(float(v), self.dt)
        size = self.b.emit(K.CONSTANT, (), TensorType(DType.INT64, ()), ConstantAttrs(v))
        return self.b.cast(size, self.dt)

    def op(self, kind: OpKind, *ins: int, dt: DType | None = None) -> int:
        """`kind` of coordinates, or of scalars (a size minus one) where every operand is one."""
        if all(self.b.t(i).rank == 0 for i in ins):
            return self.b.emit(kind, ins, TensorType(dt or self.dt, ()))
        return self.b.emit(kind, ins, self.t(dt))

    def clip(self, v: int, hi: IRDim) -> int:
        return self.op(K.MINIMUM, self.op(K.MAXIMUM, v, self.c(0)), self.op(K.SUB, self.c(hi), self.c(1)))

    def reflect(self, v: int, twice_low: int | IRDim, twice_high: IRDim) -> int:
        """torch's reflect_coordinates: v mirrored into [twice_low / 2, twice_high / 2]."""
        lo = self.op(K.MUL, self.c(twice_low), self.c(0.5))
        span = self.op(K.MUL, self.op(K.SUB, self.c(twice_high), self.c(twice_low)), self.c(0.5))
        d = self.op(K.ABS, self.op(K.SUB, v, lo))
        extra = self.op(K.FMOD, d, span)
        flips = self.op(K.FLOOR, self.op(K.DIV, d, span))
        even = self.op(K.EQ, self.op(K.FMOD, flips, self.c(2)), self.c(0), dt=DType.BOOL)
        mirrored = self.op(K.WHERE, even, self.op(K.ADD, extra, lo), self.op(K.ADD, self.op(K.SUB, span, extra), lo))
        degenerate = self.op(K.EQ, span, self.c(0), dt=DType.BOOL)  # a one-pixel axis without align_corners
        return self.op(K.WHERE, degenerate, self.c(0), mirrored)

    def inside(self, i: int, size: IRDim) -> int:
        ge = self.op(K.GE, i, self.c(0), dt=DType.BOOL)
        lt = self.op(K.LT, i, self.c(size), dt=DType.BOOL)
        return self.op(K.LOGICAL_AND, ge, lt, dt=DType.BOOL)


def _pixel(k: _Coords, g: int, size: IRDim, align: bool, padding: int) -> int:
    if align:  # (g + 1) / 2 * (size - 1)
        v = k.op(K.MUL, k.op(K.MUL, k.op(K.ADD, g, k.c(1)), k.c(0.5)), k.op(K.SUB, k.c(size), k.c(1)))
    else:  # ((g + 1) * size - 1) / 2
        v = k.op(K.MUL, k.op(K.SUB, k.op(K.MUL, k.op(K.ADD, g, k.c(1)), k.c(size)), k.c(1)), k.c(0.5))
    return _padded(k, v, size, align, padding)


def _reshape(b: Builder, v: int, dt: DType, shape: tuple[IRDim, ...]) -> int:
    return b.emit(K.RESHAPE, (v,), TensorType(dt, shape))


def _cubic_weights(k: _Coords, t: int) -> list[int]:
    """torch's get_cubic_upsample_coefficients (A = -0.75): the weights of the taps at floor - 1 ..
    floor + 2 for a fractional part t."""

    def near(x: int) -> int:  # ((A + 2) x - (A + 3)) x^2 + 1, for |x| <= 1
        inner = k.op(K.SUB, k.op(K.MUL, k.c(CUBIC_A + 2), x), k.c(CUBIC_A + 3))
        return k.op(K.ADD, k.op(K.MUL, k.op(K.MUL, inner, x), x), k.c(1))

    def far(x: int) -> int:  # ((A x - 5A) x + 8A) x - 4A, for 1 < |x| < 2
        inner = k.op(K.SUB, k.op(K.MUL, k.c(CUBIC_A), x), k.c(5 * CUBIC_A))
        return k.op(K.SUB, k.op(K.MUL, k.op(K.ADD, k.op(K.MUL, inner, x), k.c(8 * CUBIC_A)), x), k.c(4 * CUBIC_A))

    rest = k.op(K.SUB, k.c(1), t)
    return [far(k.op(K.ADD, t, k.c(1))), near(t), near(rest), far(k.op(K.ADD, rest, k.c(1)))]


def grid_sample(
    b: Builder,
    x: int,
    grid: int,
    xt: TensorType,
    gt: TensorType,
    dt: DType,
    mode: int,
    padding: int,
    align: bool,
    onnx_cubic: bool = False,
) -> int:
    """Note [Grid sampling]; x [N, C, *spatial] (H, W or D, H, W) and grid [N, *out, len(spatial)] of
    types xt, gt, computed in `dt`. Bicubic takes two spatial axes; `onnx_cubic`: ONNX's bicubic
    (Note [ONNX cubic sampling])."""
    n, c, *sizes = xt.shape
    d = len(sizes)
    assert d in (2, 3) and gt.rank == d + 2 and (mode != BICUBIC or d == 2)
    shape = (n, *gt.shape[1 : d + 1])
    k = _Coords(b, shape, dt)
    grid = b.cast(grid, dt)
    one = TensorType(dt, (*shape, 1))
    # the grid's last axis holds x, y (, z): spatial axis a (D, H, W order) reads coordinate d - 1 - a
    g = [_reshape(b, b.emit(K.SLICE, (grid,), one, SliceAttrs(d + 1, d - 1 - a, 1)), dt, shape) for a in range(d)]
    pixels = b.emit(K.PERMUTE, (b.cast(x, dt),), TensorType(dt, (n, *sizes, c)), PermuteAttrs((0, *range(2, d + 2), 1)))
    arange = b.emit(K.ARANGE, (), TensorType(DType.INT64, (n,)), ArangeAttrs(0, 1))
    batch = _reshape(b, arange, DType.INT64, (n, *[1] * d))
    rows = TensorType(dt, (*shape, c))

    def tap(at: list[int], weight: int | None) -> int:
        """The pixels at `at` (per spatial axis, float coordinates holding integers) times `weight`
        ([N, *out]), zero where the point lies outside the image."""
        valid = k.inside(at[0], sizes[0])
        for a in range(1, d):
            valid = k.op(K.LOGICAL_AND, valid, k.inside(at[a], sizes[a]), dt=DType.BOOL)
        index = [b.cast(k.clip(at[a], sizes[a]), DType.INT64) for a in range(d)]
        gathered = b.emit(K.INDEX, (pixels, batch, *index), rows, IndexAttrs(tuple(range(d + 1))))
        scale = b.cast(valid, dt) if weight is None else k.op(K.MUL, weight, b.cast(valid, dt))
        return scaled(gathered, scale)

    def scaled(v: int, weight: int) -> int:
        return b.emit(K.MUL, (v, _reshape(b, weight, dt, (*shape, 1))), rows)

    def add(total: int | None, v: int) -> int:
        return v if total is None else b.emit(K.ADD, (total, v), rows)

    total: int | None = None
    if mode == NEAREST:
        total = tap([k.op(K.ROUND, _pixel(k, g[a], sizes[a], align, padding)) for a in range(d)], None)
    elif mode == BILINEAR:  # the 2^d corners, x fastest (torch's nw, ne, sw, se; tnw ... bse)
        p = [_pixel(k, g[a], sizes[a], align, padding) for a in range(d)]
        lo = [k.op(K.FLOOR, v) for v in p]
        hi = [k.op(K.ADD, v, k.c(1)) for v in lo]
        toward_hi = [k.op(K.SUB, p[a], lo[a]) for a in range(d)]
        toward_lo = [k.op(K.SUB, hi[a], p[a]) for a in range(d)]
        for corner in itertools.product((0, 1), repeat=d):
            weights = [toward_hi[a] if corner[a] else toward_lo[a] for a in reversed(range(d))]  # x's first
            weight = weights[0]
            for w in weights[1:]:
                weight = k.op(K.MUL, weight, w)
            total = add(total, tap([hi[a] if corner[a] else lo[a] for a in range(d)], weight))
    else:  # bicubic: 4 x 4 taps around floor(p), each coordinate padded on its own (torch's get_value_bounded)
        p = [_pixel(k, g[a], sizes[a], align, ZEROS) for a in range(d)]
        if onnx_cubic:
            p = [_onnx_point(k, p[a], sizes[a], align, padding) for a in range(d)]
        lo = [k.op(K.FLOOR, v) for v in p]
        wy, wx = (_cubic_weights(k, k.op(K.SUB, p[a], lo[a])) for a in range(d))
        ys = [_padded(k, k.op(K.ADD, lo[0], k.c(i - 1)), sizes[0], align, padding) for i in range(4)]
        xs = [_padded(k, k.op(K.ADD, lo[1], k.c(j - 1)), sizes[1], align, padding) for j in range(4)]
        for i in range(4):
            row: int | None = None
            for j in range(4):
                row = add(row, tap([ys[i], xs[j]], wx[j]))
            assert row is not None
            total = add(total, scaled(row, wy[i]))
    assert total is not None
    back = (0, d + 1, *range(1, d + 1))
    return b.emit(K.PERMUTE, (total,), TensorType(dt, (n, c, *shape[1:])), PermuteAttrs(back))


def _padded(k: _Coords, v: int, size: IRDim, align: bool, padding: int) -> int:
    """torch's compute_coordinates: a position clipped (border), reflected and clipped (reflection), or as
    it is (zeros: a tap outside reads 0)."""
    if padding == BORDER:
        return k.clip(v, size)
    if padding == REFLECTION:
        v = k.reflect(v, 0, simplify(size * 2 - 2)) if align else k.reflect(v, -1, simplify(size * 2 - 1))
        return k.clip(v, size)
    return v


def _onnx_point(k: _Coords, v: int, size: IRDim, align: bool, padding: int) -> int:
    """Note [ONNX cubic sampling]: ONNX's GridSample (its reference, and ONNX Runtime) pads a sampling
    point before taking its taps, in every mode: one outside [-0.5, size - 0.5] ([0, size - 1] with
    align_corners) is clamped into [0, size - 1] (border) or reflected into the range (reflection).
    For linear and nearest this changes nothing the tap padding would not; for cubic it moves the
    16 taps, so ONNX's cubic differs from torch's (which pads each tap alone) near the edges."""
    if padding == BORDER:
        lo, hi = (k.c(0), k.c(simplify(size - 1))) if align else (k.c(-0.5), k.op(K.SUB, k.c(size), k.c(0.5)))
        out = k.op(K.LOGICAL_OR, k.op(K.LT, v, lo, dt=DType.BOOL), k.op(K.GT, v, hi, dt=DType.BOOL), dt=DType.BOOL)
        return k.op(K.WHERE, out, k.clip(v, size), v)
    if padding == REFLECTION:
        return k.reflect(v, 0, simplify(size * 2 - 2)) if align else k.reflect(v, -1, simplify(size * 2 - 1))
    return v
