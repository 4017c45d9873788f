"""ONNX GridSample (opsets 16 and 20): Note [Grid sampling] in ir/grid_sample.py.

In: X [N, C, H, W], grid [N, Ho, Wo, 2], the mode (opset 16: bilinear / nearest / bicubic; 20:
linear / nearest / cubic), padding_mode and align_corners. Out: Y [N, C, Ho, Wo]. Cubic sampling and
volumetric (5-D) inputs are refused by name.
"""

from __future__ import annotations

from bladepack.ir import TensorType
from bladepack.ir.grid_sample import BILINEAR, BORDER, NEAREST, REFLECTION, ZEROS, grid_sample
from bladepack.onnx_import.context import OnnxCtx, OVal, Unsupported, converts, need

_MODES = {"bilinear": BILINEAR, "linear": BILINEAR, "nearest": NEAREST}
_PADDING = {"zeros": ZEROS, "border": BORDER, "reflection": REFLECTION}


@converts("GridSample")
def _grid_sample(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x, grid = need(ins, 0, "X"), need(ins, 1, "grid")
    mode = ctx.text("mode", "bilinear" if ctx.opset < 20 else "linear")
    padding = ctx.text("padding_mode", "zeros")
    align = bool(int(ctx.attr("align_corners", 0)))
    if x.type.rank != 4 or grid.type.rank != 4:
        raise Unsupported(f"GridSample of a rank-{x.type.rank} input (2-D sampling: [N, C, H, W] and [N, Ho, Wo, 2])")
    if mode not in _MODES:
        raise Unsupported(f"GridSample with mode={mode!r} (linear / bilinear and nearest are converted)")
    if padding not in _PADDING:
        raise Unsupported(f"GridSample with padding_mode={padding!r} (zeros, border, reflection)")
    dt = x.type.dtype
    if not dt.is_floating:
        raise Unsupported(f"GridSample of {dt.value}")
    n, c = x.type.shape[:2]
    out = TensorType(dt, (n, c, grid.type.shape[1], grid.type.shape[2]))
    y = grid_sample(ctx, ctx.tensor(x), ctx.tensor(grid), x.type, grid.type, dt, _MODES[mode], _PADDING[padding], align)
    return [OVal(out, y)]
