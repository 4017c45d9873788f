"""aten → IR: interpolation (F.interpolate) — nearest, nearest-exact, linear / bilinear / trilinear
and bicubic, at symbolic sizes (Note [Interpolation at symbolic sizes] in ir/interpolate.py).

In: an upsample node (the `.vec` form from F.interpolate, or the `.default` form with explicit output
sizes and per-axis scales). Out: one gather-and-weigh chain per resized axis, last axis first, as
torch's kernels weigh within a row before across rows. antialias=True (a different filter, whose
support grows with the scale) has no converter.
"""

from __future__ import annotations

from typing import Any

import sympy

from bladepack.dtypes import DType
from bladepack.export.context import Ctx, Unsupported, Value, arg, converts
from bladepack.ir.interpolate import resize_axis

# op name → (mode, spatial rank, takes align_corners)
_MODES: dict[str, tuple[str, int, bool]] = {
    "upsample_nearest1d": ("nearest", 1, False),
    "upsample_nearest2d": ("nearest", 2, False),
    "upsample_nearest3d": ("nearest", 3, False),
    "_upsample_nearest_exact1d": ("nearest-exact", 1, False),
    "_upsample_nearest_exact2d": ("nearest-exact", 2, False),
    "_upsample_nearest_exact3d": ("nearest-exact", 3, False),
    "upsample_linear1d": ("linear", 1, True),
    "upsample_bilinear2d": ("linear", 2, True),
    "upsample_trilinear3d": ("linear", 3, True),
    "upsample_bicubic2d": ("cubic", 2, True),
}


def _names() -> list[str]:
    return [f"aten.{op}.{form}" for op in _MODES for form in ("vec", "default")]


@converts(*_names())
def _upsample(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    assert ctx.node is not None
    op, form = str(ctx.node.target).split(".")[1:3]
    mode, spatial, has_align = _MODES[op]
    x = ctx.v(args[0])
    out = ctx.out_type()
    align = bool(arg(args, kwargs, 2, "align_corners", False)) if has_align else False
    if form == "vec":
        factors = arg(args, kwargs, 3 if has_align else 2, "scale_factors")
        scales: list[Any] = list(factors) if factors is not None else [None] * spatial
    else:
        first = 3 if has_align else 2
        names = ("scales_d", "scales_h", "scales_w")[3 - spatial :] if spatial > 1 else ("scales",)
        scales = [arg(args, kwargs, first + k, names[k]) for k in range(spatial)]
    if len(scales) != spatial:
        raise Unsupported(f"{op} with {len(scales)} scale factors for {spatial} spatial axes")
    t = ctx.t(x)
    if t.rank != spatial + 2:
        raise Unsupported(f"{op} of a rank-{t.rank} input (expects [N, C] and {spatial} spatial axes)")
    compute = DType.FLOAT64 if t.dtype is DType.FLOAT64 else DType.FLOAT32
    if mode not in ("nearest", "nearest-exact") and not t.dtype.is_floating:
        raise Unsupported(f"{mode} interpolation of {t.dtype.value}")
    y = x if mode.startswith("nearest") else ctx.cast(x, compute)
    for k in reversed(range(spatial)):
        axis = 2 + k
        d, o = t.shape[axis], out.shape[axis]
        if d == o and scales[k] in (None, 1.0):
            continue
        if not isinstance(o, int):  # torch refuses an empty output ("sizes should be greater than 0")
            ctx.assume(sympy.Ge(o, 1), f"{ctx.loc}: {op} output size {o} along axis {axis} must be at least 1")
        factor = scales[k]
        if factor is not None and (not isinstance(factor, (int, float)) or factor <= 0):
            raise Unsupported(f"interpolation scale factor {factor!r}")
        transform = "align_corners" if align else ("asymmetric" if mode == "nearest" else "half_pixel")
        factor = None if factor is None else float(factor)
        y = resize_axis(ctx.b, ctx.loc, y, axis, mode, transform, d, o, factor, compute)
    return ctx.cast(y, out.dtype)
