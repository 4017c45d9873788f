"""torch's grid_sample (`aten.grid_sampler_2d`): Note [Grid sampling] in ir/grid_sample.py.

In: the input [N, C, H, W], the grid [N, Ho, Wo, 2] (x, y in [-1, 1]). Out: [N, C, Ho, Wo].
"""

from __future__ import annotations

from typing import Any

from bladepack.export.context import Ctx, Unsupported, Value, converts
from bladepack.ir.grid_sample import grid_sample


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
    if not out.dtype.is_floating:
        raise Unsupported(f"grid_sample of {out.dtype.value}")
    return grid_sample(ctx, x, grid, t, gt, out.dtype, mode, padding, align)
