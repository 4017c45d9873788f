"""Grid sampling in IR, shared by the torch front end (grid_sampler_2d) and the ONNX importer
(GridSample): bilinear and nearest sampling, zeros / border / reflection padding, align_corners either
way, as coordinate arithmetic and gathers.

In: a `Builder` (either front end's context, ir/builder.py), the input [N, C, H, W], the grid
[N, Ho, Wo, 2] (x, y in [-1, 1]), the mode, padding and align_corners. Out: [N, C, Ho, Wo].

Note [Grid sampling]: torch's own arithmetic, step by step (GridSampler.h), which ONNX's GridSample
specifies too: a coordinate is unnormalized to pixels (align_corners: (g + 1) / 2 * (size - 1), else
((g + 1) * size - 1) / 2), then clipped (border) or reflected about the edges and clipped
(reflection); nearest rounds it half to even, bilinear takes the four neighbours floor / floor + 1
weighted by the distances. A neighbour outside the image contributes zero: its index is clamped into
the image for the gather (an INDEX on the input read as [N, H, W, C], so every pixel's channels are
one row) and its weight multiplied by 0. Bicubic (16 neighbours) is refused by the front ends.
"""

from __future__ import annotations

from bladepack.dtypes import DType
from bladepack.ir.builder import Builder
from bladepack.ir.ops import ArangeAttrs, ConstantAttrs, IndexAttrs, OpKind, PermuteAttrs, SliceAttrs
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.views import simplify

K = OpKind
NEAREST, BILINEAR = 1, 0  # torch's mode numbers
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
    if padding == BORDER:
        return k.clip(v, size)
    if padding == REFLECTION:
        v = k.reflect(v, 0, simplify(size * 2 - 2)) if align else k.reflect(v, -1, simplify(size * 2 - 1))
        return k.clip(v, size)
    return v


def _reshape(b: Builder, v: int, dt: DType, shape: tuple[IRDim, ...]) -> int:
    return b.emit(K.RESHAPE, (v,), TensorType(dt, shape))


def grid_sample(
    b: Builder, x: int, grid: int, xt: TensorType, gt: TensorType, dt: DType, mode: int, padding: int, align: bool
) -> int:
    """Note [Grid sampling]; x [N, C, H, W] and grid [N, Ho, Wo, 2] of types xt, gt, computed in `dt`."""
    n, c, h, w = xt.shape
    ho, wo = gt.shape[1], gt.shape[2]
    shape = (n, ho, wo)
    k = _Coords(b, shape, dt)
    grid = b.cast(grid, dt)
    half = TensorType(dt, (n, ho, wo, 1))
    gx = _reshape(b, b.emit(K.SLICE, (grid,), half, SliceAttrs(3, 0, 1)), dt, shape)
    gy = _reshape(b, b.emit(K.SLICE, (grid,), half, SliceAttrs(3, 1, 1)), dt, shape)
    ix, iy = _pixel(k, gx, w, align, padding), _pixel(k, gy, h, align, padding)
    pixels = b.emit(K.PERMUTE, (b.cast(x, dt),), TensorType(dt, (n, h, w, c)), PermuteAttrs((0, 2, 3, 1)))
    batch = _reshape(b, b.emit(K.ARANGE, (), TensorType(DType.INT64, (n,)), ArangeAttrs(0, 1)), DType.INT64, (n, 1, 1))
    rows = TensorType(dt, (n, ho, wo, c))

    def tap(xi: int, yi: int, weight: int | None) -> int:
        """The pixels at (xi, yi), float coordinates holding integers, times `weight` ([N, Ho, Wo]),
        zero where (xi, yi) lies outside the image."""
        valid = k.op(K.LOGICAL_AND, k.inside(xi, w), k.inside(yi, h), dt=DType.BOOL)
        cx = b.cast(k.clip(xi, w), DType.INT64)
        cy = b.cast(k.clip(yi, h), DType.INT64)
        gathered = b.emit(K.INDEX, (pixels, batch, cy, cx), rows, IndexAttrs((0, 1, 2)))
        scale = b.cast(valid, dt) if weight is None else k.op(K.MUL, weight, b.cast(valid, dt))
        return b.emit(K.MUL, (gathered, _reshape(b, scale, dt, (n, ho, wo, 1))), rows)

    if mode == NEAREST:
        total = tap(k.op(K.ROUND, ix), k.op(K.ROUND, iy), None)
    else:
        x0, y0 = k.op(K.FLOOR, ix), k.op(K.FLOOR, iy)
        x1, y1 = k.op(K.ADD, x0, k.c(1)), k.op(K.ADD, y0, k.c(1))
        ax1, ay1 = k.op(K.SUB, ix, x0), k.op(K.SUB, iy, y0)  # weights toward x1, y1
        ax0, ay0 = k.op(K.SUB, x1, ix), k.op(K.SUB, y1, iy)
        total = tap(x0, y0, k.op(K.MUL, ax0, ay0))
        for xi, yi, wx, wy in ((x1, y0, ax1, ay0), (x0, y1, ax0, ay1), (x1, y1, ax1, ay1)):
            total = b.emit(K.ADD, (total, tap(xi, yi, k.op(K.MUL, wx, wy))), rows)
    return b.emit(K.PERMUTE, (total,), TensorType(dt, (n, c, ho, wo)), PermuteAttrs((0, 3, 1, 2)))
