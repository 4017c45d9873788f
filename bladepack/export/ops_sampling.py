"""torch's grid_sample (`aten.grid_sampler_2d`, `aten.grid_sampler_3d`): Note [Grid sampling] in
ir/grid_sample.py.

In: the input [N, C, H, W] and the grid [N, Ho, Wo, 2] (x, y in [-1, 1]), or a volume [N, C, D, H, W]
and [N, Do, Ho, Wo, 3]. Out: [N, C, Ho, Wo] or [N, C, Do, Ho, Wo].
"""

from __future__ import annotations

from typing import Any

from bladepack.export.context import Ctx, Unsupported, Value, converts
from bladepack.ir.grid_sample import BICUBIC, grid_sample


@converts("aten.grid_sampler_2d.default", "aten.grid_sampler_3d.default", "aten.grid_sampler.default")
def _grid_sampler(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, grid = ctx.v(args[0]), ctx.v(args[1])
    mode, padding, align = int(args[2]), int(args[3]), bool(args[4])
    t, gt = ctx.t(x), ctx.t(grid)
    out = ctx.out_type()
    if t.rank not in (4, 5) or gt.rank != t.rank:
        raise Unsupported(
            f"grid_sample of a rank-{t.rank} input with a rank-{gt.rank} grid ([N, C, H, W] with [N, Ho, Wo, 2], "
            "or [N, C, D, H, W] with [N, Do, Ho, Wo, 3])"
        )
    if mode not in (0, 1, 2) or (mode == BICUBIC and t.rank == 5):
        raise Unsupported(f"grid_sample with mode {mode} on a rank-{t.rank} input (bicubic samples 2-D images)")
    if padding not in (0, 1, 2):
        raise Unsupported(f"grid_sample with padding mode {padding}")
    if not out.dtype.is_floating:
        raise Unsupported(f"grid_sample of {out.dtype.value}")
    return grid_sample(ctx, x, grid, t, gt, out.dtype, mode, padding, align)
