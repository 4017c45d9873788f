"""torch's grid_sample (`aten.grid_sampler_2d`): bilinear and nearest sampling, zeros / border /
reflection padding, align_corners either way, as coordinate arithmetic and gathers.

In: the input [N, C, H, W], the grid [N, Ho, Wo, 2] (x, y in [-1, 1]). Out: [N, C, Ho, Wo].

Note [Grid sampling]: torch's own arithmetic, step by step (GridSampler.h): a coordinate is
unnormalized to pixels (align_corners: (g + 1) / 2 * (size - 1), else ((g + 1) * size - 1) / 2), then
clipped (border) or reflected about the edges and clipped (reflection); nearest rounds it half to
even, bilinear takes the four neighbours floor / floor + 1 weighted by the distances. A neighbour
outside the image contributes zero: its index is clamped into the image for the gather (an INDEX on
the input read as [N, H, W, C], so every pixel's channels are one row) and its weight multiplied by
0. Bicubic (16 neighbours) is refused.
"""

from __future__ import annotations

from typing import Any

from bladepack.dtypes import DType
from bladepack.export.context import Ctx, Unsupported, Value, converts
from bladepack.export.ops_layout import permute, reshape, slice_axis
from bladepack.ir import TensorType
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify
from bladepack.opset import OpKind
from bladepack.opset.attrs import ArangeAttrs, ConstantAttrs, IndexAttrs

K = OpKind


class _Coords:
    """Elementwise arithmetic on [N, Ho, Wo] coordinate tensors of one dtype."""

    def __init__(self, ctx: Ctx, shape: tuple[IRDim, ...], dt: DType) -> None:
        self.ctx, self.shape, self.dt = ctx, shape, dt

    def t(self, dt: DType | None = None) -> TensorType:
        return TensorType(dt or self.dt, self.shape)

    def c(self, v: float | IRDim) -> Value:
        if isinstance(v, (int, float)):
            return self.ctx.const(float(v), self.dt)
        size = self.ctx.emit(K.CONSTANT, (), TensorType(DType.INT64, ()), ConstantAttrs(v))
        return self.ctx.cast(size, self.dt)

    def op(self, kind: OpKind, *ins: Value, dt: DType | None = None) -> Value:
        return self.ctx.emit(kind, ins, self.t(dt))

    def clip(self, v: Value, hi: IRDim) -> Value:
        return self.op(K.MINIMUM, self.op(K.MAXIMUM, v, self.c(0)), self.op(K.SUB, self.c(hi), self.c(1)))

    def reflect(self, v: Value, twice_low: int | IRDim, twice_high: IRDim) -> Value:
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

    def inside(self, i: Value, size: IRDim) -> Value:
        ge = self.op(K.GE, i, self.c(0), dt=DType.BOOL)
        lt = self.op(K.LT, i, self.c(size), dt=DType.BOOL)
        return self.op(K.LOGICAL_AND, ge, lt, dt=DType.BOOL)


def _pixel(k: _Coords, g: Value, size: IRDim, align: bool, padding: int) -> Value:
    if align:  # (g + 1) / 2 * (size - 1)
        v = k.op(K.MUL, k.op(K.MUL, k.op(K.ADD, g, k.c(1)), k.c(0.5)), k.op(K.SUB, k.c(size), k.c(1)))
    else:  # ((g + 1) * size - 1) / 2
        v = k.op(K.MUL, k.op(K.SUB, k.op(K.MUL, k.op(K.ADD, g, k.c(1)), k.c(size)), k.c(1)), k.c(0.5))
    if padding == 1:
        return k.clip(v, size)
    if padding == 2:
        v = k.reflect(v, 0, simplify(size * 2 - 2)) if align else k.reflect(v, -1, simplify(size * 2 - 1))
        return k.clip(v, size)
    return v


@converts("aten.grid_sampler_2d.default", "aten.grid_sampler.default")
def _grid_sampler(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, grid = ctx.v(args[0]), ctx.v(args[1])
    mode, padding, align = int(args[2]), int(args[3]), bool(args[4])
    t, gt = ctx.t(x), ctx.t(grid)
    out = ctx.out_type()
    if t.rank != 4 or gt.rank != 4:
        raise Unsupported(f"grid_sample of a rank-{t.rank} input (2-D sampling: [N, C, H, W] and [N, Ho, Wo, 2])")
    if mode not in (0, 1):
        raise Unsupported("grid_sample with mode='bicubic' (bilinear and nearest are converted)")
    if padding not in (0, 1, 2):
        raise Unsupported(f"grid_sample with padding mode {padding}")
    dt = out.dtype
    if not dt.is_floating:
        raise Unsupported(f"grid_sample of {dt.value}")
    n, c, h, w = t.shape
    ho, wo = gt.shape[1], gt.shape[2]
    shape = (n, ho, wo)
    k = _Coords(ctx, shape, dt)
    grid = ctx.cast(grid, dt)
    gx = reshape(ctx, slice_axis(ctx, grid, 3, 0, 1, 1), shape)
    gy = reshape(ctx, slice_axis(ctx, grid, 3, 1, 1, 1), shape)
    ix, iy = _pixel(k, gx, w, align, padding), _pixel(k, gy, h, align, padding)
    pixels = permute(ctx, ctx.cast(x, dt), (0, 2, 3, 1))  # [N, H, W, C]
    batch = reshape(ctx, ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (n,)), ArangeAttrs(0, 1)), (n, 1, 1))
    rows = TensorType(dt, (n, ho, wo, c))

    def tap(xi: Value, yi: Value, weight: Value | None) -> Value:
        """The pixels at (xi, yi), float coordinates holding integers, times `weight` ([N, Ho, Wo]),
        zero where (xi, yi) lies outside the image."""
        valid = k.op(K.LOGICAL_AND, k.inside(xi, w), k.inside(yi, h), dt=DType.BOOL)
        cx = ctx.cast(k.clip(xi, w), DType.INT64)
        cy = ctx.cast(k.clip(yi, h), DType.INT64)
        gathered = ctx.emit(K.INDEX, (pixels, batch, cy, cx), rows, IndexAttrs((0, 1, 2)))
        scale = ctx.cast(valid, dt) if weight is None else k.op(K.MUL, weight, ctx.cast(valid, dt))
        return ctx.emit(K.MUL, (gathered, reshape(ctx, scale, (n, ho, wo, 1))), rows)

    if mode == 1:
        total = tap(k.op(K.ROUND, ix), k.op(K.ROUND, iy), None)
    else:
        x0, y0 = k.op(K.FLOOR, ix), k.op(K.FLOOR, iy)
        x1, y1 = k.op(K.ADD, x0, k.c(1)), k.op(K.ADD, y0, k.c(1))
        ax1, ay1 = k.op(K.SUB, ix, x0), k.op(K.SUB, iy, y0)  # weights toward x1, y1
        ax0, ay0 = k.op(K.SUB, x1, ix), k.op(K.SUB, y1, iy)
        total = tap(x0, y0, k.op(K.MUL, ax0, ay0))
        for xi, yi, wx, wy in ((x1, y0, ax1, ay0), (x0, y1, ax0, ay1), (x1, y1, ax1, ay1)):
            total = ctx.emit(K.ADD, (total, tap(xi, yi, k.op(K.MUL, wx, wy))), rows)
    return permute(ctx, total, (0, 3, 1, 2))
