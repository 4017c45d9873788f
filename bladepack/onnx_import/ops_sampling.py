"""ONNX GridSample (opsets 16 and 20): Note [Grid sampling] in ir/grid_sample.py.

In: X [N, C, H, W], grid [N, Ho, Wo, 2] (or a volume: X [N, C, D, H, W], grid [N, Do, Ho, Wo, 3]), the
mode (opset 16: bilinear / nearest / bicubic; 20: linear / nearest / cubic), padding_mode and
align_corners. Out: Y [N, C, Ho, Wo] (or [N, C, Do, Ho, Wo]). Cubic sampling of a volume is refused
by name.
"""

from __future__ import annotations

from bladepack.ir import TensorType
from bladepack.ir.grid_sample import BICUBIC, BILINEAR, BORDER, NEAREST, REFLECTION, ZEROS, grid_sample
from bladepack.onnx_import.context import OnnxCtx, OVal, Unsupported, converts, need

_MODES = {"bilinear": BILINEAR, "linear": BILINEAR, "nearest": NEAREST, "bicubic": BICUBIC, "cubic": BICUBIC}
_PADDING = {"zeros": ZEROS, "border": BORDER, "reflection": REFLECTION}


@converts("GridSample")
def _grid_sample(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x, grid = need(ins, 0, "X"), need(ins, 1, "grid")
    mode = ctx.text("mode", "bilinear" if ctx.opset < 20 else "linear")
    padding = ctx.text("padding_mode", "zeros")
    align = bool(int(ctx.attr("align_corners", 0)))
    rank = x.type.rank
    if rank not in (4, 5) or grid.type.rank != rank:
        raise Unsupported(
            f"GridSample of a rank-{rank} input with a rank-{grid.type.rank} grid ([N, C, H, W] with "
            "[N, Ho, Wo, 2], or [N, C, D, H, W] with [N, Do, Ho, Wo, 3])"
        )
    if mode not in _MODES:
        raise Unsupported(f"GridSample with mode={mode!r} (linear / bilinear, nearest and cubic / bicubic)")
    if _MODES[mode] == BICUBIC and rank == 5:
        raise Unsupported(f"GridSample with mode={mode!r} of a volume (cubic samples 2-D images)")
    if padding not in _PADDING:
        raise Unsupported(f"GridSample with padding_mode={padding!r} (zeros, border, reflection)")
    dt = x.type.dtype
    if not dt.is_floating:
        raise Unsupported(f"GridSample of {dt.value}")
    n, c = x.type.shape[:2]
    out = TensorType(dt, (n, c, *grid.type.shape[1 : rank - 1]))
    y = grid_sample(
        ctx, ctx.tensor(x), ctx.tensor(grid), x.type, grid.type, dt, _MODES[mode], _PADDING[padding], align, True
    )
    return [OVal(out, y)]
