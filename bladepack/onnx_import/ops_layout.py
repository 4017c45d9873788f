"""ONNX → IR: layout ops — Transpose, Concat, Split, Slice, Expand, Tile, Pad, Trilu and Resize.

In: an ONNX node's operands. Out: IR values, or known values where the operands are known (shape
values included: Concat, Slice, Expand and Tile compute new shape values, Note [Known values] in
context.py). Expand and Slice read shape values as their result dims.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sympy

from bladepack.dtypes import DType
from bladepack.ir import OpKind, TensorType, Tri
from bladepack.ir.interpolate import TRANSFORMS, resize_axis
from bladepack.ir.ops import ArangeAttrs, AxisAttrs, PadAttrs, PermuteAttrs, SliceAttrs
from bladepack.ir.types import IRDim
from bladepack.onnx_import.context import (
    RUNTIME_DATA,
    OnnxCtx,
    OVal,
    Unsupported,
    arg,
    converts,
    known,
    need,
    norm_axis,
    simplify_dim,
)

K = OpKind


@converts("Transpose")
def _transpose(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    rank = x.type.rank
    perm = tuple(norm_axis(p, rank) for p in (ctx.ints("perm") or list(range(rank))[::-1]))
    if sorted(perm) != list(range(rank)):
        raise Unsupported(f"perm {list(perm)} is not a permutation of {rank} axes")
    if x.data is not None:
        return [known(np.transpose(x.data, perm), x.type.dtype)]
    return [permute(ctx, x, perm)]


def permute(ctx: OnnxCtx, x: OVal, perm: tuple[int, ...]) -> OVal:
    if perm == tuple(range(len(perm))):
        return x
    t = TensorType(x.type.dtype, tuple(x.type.shape[p] for p in perm))
    return ctx.out(K.PERMUTE, (ctx.tensor(x),), t, PermuteAttrs(perm))


# --------------------------------------------------------------------------- concat, split, slice


@converts("Concat")
def _concat(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    vals = [v for v in ins if v is not None]
    rank = vals[0].type.rank
    axis = norm_axis(int(ctx.attr("axis")), rank)
    dt = vals[0].type.dtype
    if any(v.type.dtype is not dt or v.type.rank != rank for v in vals):
        raise Unsupported("inputs of different types or ranks")
    if all(v.data is not None for v in vals):
        return [known(np.concatenate([np.asarray(v.data, dtype=object) for v in vals], axis=axis), dt)]
    parts = [v for v in vals if not (isinstance(v.type.shape[axis], int) and v.type.shape[axis] == 0)]
    if len(parts) == 1:
        return [parts[0]]
    shape = list(parts[0].type.shape)
    shape[axis] = simplify_dim(sympy.Add(*[sympy.sympify(v.type.shape[axis]) for v in parts]))
    for k in range(rank):  # the other dims agree; keep a static one when an input has it
        if k != axis:
            statics = [v.type.shape[k] for v in parts if isinstance(v.type.shape[k], int)]
            if statics:
                shape[k] = statics[0]
    return [ctx.out(K.CONCAT, [ctx.tensor(v) for v in parts], TensorType(dt, tuple(shape)), AxisAttrs(axis))]


def slice_axis(ctx: OnnxCtx, x: OVal, axis: int, start: IRDim, step: int, length: IRDim) -> OVal:
    if start == 0 and step == 1 and ctx.eq(length, x.type.shape[axis]) is Tri.YES:
        return x
    shape = list(x.type.shape)
    shape[axis] = simplify_dim(length)
    t = TensorType(x.type.dtype, tuple(shape))
    return ctx.out(K.SLICE, (ctx.tensor(x),), t, SliceAttrs(axis, simplify_dim(start), step))


@converts("Split")
def _split(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    x = need(ins, 0)
    axis = norm_axis(int(ctx.attr("axis", 0)), x.type.rank)
    d = x.type.shape[axis]
    n_out = len(ctx.node.output)
    given = arg(ins, 1)
    if given is not None:
        sizes: list[IRDim] = list(ctx.const_ints(given, "split"))
    elif ctx.attr("split") is not None:
        sizes = list(ctx.ints("split") or [])
    else:
        n = int(ctx.attr("num_outputs", n_out))
        if isinstance(d, int):
            chunk = -(-d // n)
            sizes = [min(chunk, max(d - k * chunk, 0)) for k in range(n)]
            if ctx.opset < 18 and d % n:
                raise Unsupported(f"an even split of {d} into {n} parts")
        elif ctx.opset >= 18:  # parts of ceil(d / n), the last ones smaller
            chunk = sympy.ceiling(sympy.sympify(d) / n)
            sizes = [simplify_dim(sympy.Min(chunk, sympy.Max(d - k * chunk, 0))) for k in range(n)]
        else:
            sizes = [simplify_dim(sympy.floor(sympy.sympify(d) / n))] * n
            ctx.assume(sympy.Eq(sympy.Mod(d, n), 0), f"{ctx.loc}: dim {d} must split into {n} equal parts")
    if len(sizes) != n_out:
        raise Unsupported(f"{len(sizes)} split sizes for {n_out} outputs")
    outs: list[OVal | None] = []
    start: Any = 0
    for size in sizes:
        if x.data is not None and isinstance(start, int) and isinstance(size, int):
            outs.append(known(np.take(x.data, np.arange(start, start + size), axis=axis), x.type.dtype))
        else:
            outs.append(slice_axis(ctx, x, axis, start, 1, size))
        start = simplify_dim(sympy.sympify(start) + size)
    return outs


def _nonneg(ctx: OnnxCtx, v: IRDim) -> bool | None:
    if isinstance(v, int):
        return v >= 0
    lo, hi = ctx.env.bounds(v)
    return True if lo >= 0 else False if hi < 0 else None


def _clamp(ctx: OnnxCtx, v: IRDim, lo: IRDim, hi: IRDim) -> IRDim:
    if ctx.env.prove_le(v, lo) is Tri.YES:
        return lo
    if ctx.env.prove_le(hi, v) is Tri.YES:
        return hi
    if ctx.env.prove_le(lo, v) is Tri.YES and ctx.env.prove_le(v, hi) is Tri.YES:
        return v
    return simplify_dim(sympy.Min(sympy.Max(v, lo), hi))


def _wrap(ctx: OnnxCtx, v: IRDim, d: IRDim) -> IRDim:
    sign = _nonneg(ctx, v)
    if sign is None:
        raise Unsupported(f"a slice bound {v} that may be negative or not")
    return v if sign else simplify_dim(sympy.sympify(v) + d)


def slice_bounds(ctx: OnnxCtx, d: IRDim, start: IRDim, end: IRDim, step: int) -> tuple[IRDim, IRDim]:
    """ONNX Slice's first index and length along one axis of size d: negative bounds count from the
    end, then clamp to [0, d] (step > 0) or [-1, d - 1] (step < 0)."""
    start, end = _wrap(ctx, start, d), _wrap(ctx, end, d)
    if step > 0:
        s, e = _clamp(ctx, start, 0, d), _clamp(ctx, end, 0, d)
        n = sympy.ceiling(sympy.sympify(e - s) / step)
    else:
        last = simplify_dim(sympy.sympify(d) - 1)
        s, e = _clamp(ctx, start, 0, last), _clamp(ctx, end, -1, last)
        n = sympy.ceiling(sympy.sympify(s - e) / (-step))
    length = simplify_dim(n) if ctx.env.prove_le(0, n) is Tri.YES else simplify_dim(sympy.Max(n, 0))
    return s, length


@converts("Slice")
def _slice(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    rank = x.type.rank
    starts, ends = ctx.const_ints(need(ins, 1), "starts"), ctx.const_ints(need(ins, 2), "ends")
    axes_v = arg(ins, 3)
    axes = ctx.const_int_list(axes_v, "axes") if axes_v is not None else list(range(len(starts)))
    steps_v = arg(ins, 4)
    steps = ctx.const_int_list(steps_v, "steps") if steps_v is not None else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Unsupported("starts, ends, axes and steps of different lengths")
    y = x
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        if sp == 0:
            raise Unsupported("a slice step of 0")
        a = norm_axis(ax, rank)
        d = y.type.shape[a]
        s, n = slice_bounds(ctx, d, st, en, sp)
        if y.data is not None and isinstance(s, int) and isinstance(n, int):
            y = known(np.take(y.data, s + sp * np.arange(n, dtype=np.int64), axis=a), y.type.dtype)
        else:
            y = slice_axis(ctx, y, a, s, sp, n)
    return [y]


# --------------------------------------------------------------------------- expand, tile, pad


@converts("Expand")
def _expand(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    want = ctx.const_ints(need(ins, 1), "shape")
    shape = ctx.broadcast_shapes(x.type.shape, want)
    if x.data is not None and all(isinstance(d, int) for d in shape):
        return [known(np.broadcast_to(x.data, [int(d) for d in shape]).copy(), x.type.dtype)]
    if shape == x.type.shape:
        return [x]
    return [ctx.out(K.EXPAND, (ctx.tensor(x),), TensorType(x.type.dtype, shape))]


@converts("Tile")
def _tile(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    reps = ctx.const_ints(need(ins, 1), "repeats")
    if len(reps) != x.type.rank:
        raise Unsupported(f"{len(reps)} repeats for rank {x.type.rank}")
    if all(r == 1 for r in reps):
        return [x]
    inter = tuple(d for s in x.type.shape for d in (1, s))
    expanded = tuple(d for r, s in zip(reps, x.type.shape) for d in (r, s))
    y = ctx.reshape(ctx.tensor(x), inter)
    y = ctx.emit(K.EXPAND, (y,), TensorType(x.type.dtype, expanded))
    out = tuple(simplify_dim(sympy.sympify(r) * s) for r, s in zip(reps, x.type.shape))
    return [OVal(TensorType(x.type.dtype, out), ctx.reshape(y, out))]


def _positive(p: IRDim) -> IRDim:
    return 0 if isinstance(p, int) and p < 0 else p


@converts("Pad")
def _pad(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    rank = x.type.rank
    pads = ctx.const_ints(need(ins, 1), "pads")
    axes_v = arg(ins, 3)
    axes = [norm_axis(a, rank) for a in ctx.const_int_list(axes_v, "axes")] if axes_v is not None else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise Unsupported(f"{len(pads)} pads for {len(axes)} axes")
    mode = ctx.text("mode", "constant")
    value_v = arg(ins, 2)
    value = 0.0 if value_v is None else float(ctx.const_scalar(value_v, "constant_value"))
    per_axis: dict[int, tuple[IRDim, IRDim]] = {a: (pads[k], pads[k + len(axes)]) for k, a in enumerate(axes)}
    y = x
    # negative pads crop the axis first
    for a, (lo, hi) in per_axis.items():
        lo_c = -lo if isinstance(lo, int) and lo < 0 else 0
        hi_c = -hi if isinstance(hi, int) and hi < 0 else 0
        if lo_c or hi_c:
            d = y.type.shape[a]
            y = slice_axis(ctx, y, a, lo_c, 1, simplify_dim(sympy.sympify(d) - lo_c - hi_c))
    grow = {a: (_positive(lo), _positive(hi)) for a, (lo, hi) in per_axis.items()}
    grow = {a: p for a, p in grow.items() if p != (0, 0)}
    if not grow:
        return [y]
    if mode == "constant":
        full = tuple(grow.get(a, (0, 0)) for a in range(rank))
        shape = tuple(simplify_dim(sympy.sympify(d) + full[a][0] + full[a][1]) for a, d in enumerate(y.type.shape))
        return [ctx.out(K.PAD, (ctx.tensor(y),), TensorType(y.type.dtype, shape), PadAttrs(full, value))]
    if mode not in ("edge", "reflect", "wrap"):
        raise Unsupported(f"mode {mode!r}")
    for a, (lo, hi) in grow.items():
        d = y.type.shape[a]
        if not (isinstance(d, int) and isinstance(lo, int) and isinstance(hi, int)):
            raise Unsupported(f"{mode} padding of a dynamic axis")
        src = np.arange(-lo, d + hi)
        if mode == "edge":
            idx = np.clip(src, 0, d - 1)
        elif mode == "wrap":
            idx = np.mod(src, d)
        else:
            if lo >= d or hi >= d:
                raise Unsupported(f"reflect padding by {max(lo, hi)} on an axis of size {d}")
            idx = (d - 1) - np.abs((d - 1) - np.abs(src))
        grown = list(y.type.shape)
        grown[a] = len(idx)
        y = ctx.out(
            K.TAKE,
            (ctx.tensor(y), ctx.tensor(known(idx.astype(np.int64)))),
            TensorType(y.type.dtype, tuple(grown)),
            AxisAttrs(a),
        )
    return [y]


@converts("Trilu")
def _trilu(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    if x.type.rank < 2:
        raise Unsupported("Trilu of a tensor with rank < 2")
    kv = arg(ins, 1)
    upper = int(ctx.attr("upper", 1))
    rows, cols = x.type.shape[-2], x.type.shape[-1]
    i = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (rows,)), ArangeAttrs(0, 1))
    i = ctx.reshape(i, (rows, 1))
    j = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (cols,)), ArangeAttrs(0, 1))
    diff = ctx.emit(K.SUB, (j, i), TensorType(DType.INT64, (rows, cols)))
    if kv is None:
        kk = ctx.const(0, DType.INT64)
    elif kv.data is not None:
        k = ctx.const_ints(kv, "k")[0]
        kk = ctx.const(k if isinstance(k, int) else sympy.sympify(k), DType.INT64)
    else:  # a run-time diagonal only moves the mask
        kk = ctx.reshape(ctx.cast(ctx.tensor(kv), DType.INT64), ())
    keep = ctx.emit(K.GE if upper else K.LE, (diff, kk), TensorType(DType.BOOL, (rows, cols)))
    zero = ctx.const(0, x.type.dtype)
    return [ctx.out(K.WHERE, (keep, ctx.tensor(x), zero), x.type)]


# --------------------------------------------------------------------------- resize (nearest)


def _nearest_indices(
    ctx: OnnxCtx, dims: dict[int, int], rank: int, axis: int, resize_inputs: dict[str, Any]
) -> np.ndarray:
    """Source index of each output position along `axis`: onnx's reference Resize run on an index ramp
    along that axis (a nearest resize is a gather, separable by axis), so every coordinate
    transformation, rounding mode and aspect-ratio policy means exactly what the reference says.
    `dims`: the resized axes' sizes (the probe is 1 elsewhere); `resize_inputs`: "scales" or "sizes"
    over the probe's full rank."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    assert ctx.node is not None
    keep = {
        "mode",
        "coordinate_transformation_mode",
        "nearest_mode",
        "exclude_outside",
        "keep_aspect_ratio_policy",
        "axes",
    }
    attrs = {a.name: helper.get_attribute_value(a) for a in ctx.node.attribute if a.name in keep}
    inputs = ["x", "", "scales"] if "scales" in resize_inputs else ["x", "", "", "sizes"]
    node = helper.make_node("Resize", inputs, ["y"], **attrs)
    shape = [dims.get(k, 1) for k in range(rank)]
    ramp = np.broadcast_to(
        np.arange(shape[axis], dtype=np.float32).reshape([-1 if k == axis else 1 for k in range(rank)]), shape
    )
    feeds = {"x": np.ascontiguousarray(ramp), **resize_inputs}
    (out,) = ReferenceEvaluator(node, opsets={"": max(ctx.opset, 19)}).run(None, feeds)
    out = np.asarray(out)
    return out[tuple(slice(None) if k == axis else 0 for k in range(rank))].astype(np.int64)


_PROBE_LIMIT = 1 << 12


@converts("Resize")
def _resize(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    rank = x.type.rank
    mode = ctx.text("mode", "nearest")
    ctm = ctx.text("coordinate_transformation_mode", "half_pixel")
    rounding = ctx.text("nearest_mode", "round_prefer_floor")
    policy = ctx.text("keep_aspect_ratio_policy", "stretch")
    if mode not in ("nearest", "linear", "cubic"):
        raise Unsupported(f"mode={mode!r}")
    if mode != "nearest" and int(ctx.attr("antialias", 0)):
        raise Unsupported(f"{mode} Resize with antialias=1")
    if ctm == "tf_crop_and_resize":
        raise Unsupported("coordinate_transformation_mode='tf_crop_and_resize'")
    axes = [norm_axis(a, rank) for a in (ctx.ints("axes") or list(range(rank)))]
    scales_v, sizes_v = arg(ins, 2), arg(ins, 3)
    scales: dict[int, float] = {}
    outs: dict[int, IRDim] = {}
    probe_inputs: dict[str, Any] = {}
    static = {a: x.type.shape[a] for a in axes if isinstance(x.type.shape[a], int)}
    symbolic_sizes = sizes_v is not None and sizes_v.data is not None and sizes_v.data.size > 0
    symbolic_sizes = symbolic_sizes and not all(isinstance(s_, int) for s_ in ctx.const_ints(sizes_v, "sizes"))
    if mode != "nearest" and (
        symbolic_sizes or any(not isinstance(x.type.shape[a], int) for a in axes)
    ):  # linear / cubic along symbolic axes: positions and weights computed in the graph
        return [_resize_dynamic(ctx, x, axes, mode, ctm, policy, scales_v, sizes_v)]
    if sizes_v is not None and (sizes_v.data is None or sizes_v.data.size):
        sizes = ctx.const_int_list(sizes_v, "sizes")
        if len(static) != len(axes):
            raise Unsupported("Resize to given sizes of a dynamic axis")
        if policy != "stretch" and int(np.prod([static[a] for a in axes])) > _PROBE_LIMIT:
            raise Unsupported(f"keep_aspect_ratio_policy={policy!r} on more than {_PROBE_LIMIT} positions")
        probe_inputs["sizes"] = np.asarray(sizes, dtype=np.int64)
        ratios = [s_ / static[a] for s_, a in zip(sizes, axes)]
        if policy != "stretch":
            common = min(ratios) if policy == "not_larger" else max(ratios)
            sizes = [int(np.floor(common * static[a] + 0.5)) for a in axes]
            ratios = [common] * len(axes)
        for a, s_, r in zip(axes, sizes, ratios):
            scales[a], outs[a] = r, s_
    elif scales_v is not None:
        if scales_v.numeric is None:
            raise Unsupported(f"scales {RUNTIME_DATA}")
        probe_inputs["scales"] = scales_v.numeric.astype(np.float32)
        for a, s_ in zip(axes, scales_v.numeric.ravel().tolist()):
            d = x.type.shape[a]
            scales[a] = float(s_)
            outs[a] = int(np.floor(d * float(s_))) if isinstance(d, int) else simplify_dim(sympy.sympify(d) * int(s_))
    else:
        raise Unsupported("Resize without scales or sizes")
    y = x
    for a in axes:
        d, s, o = x.type.shape[a], scales[a], outs[a]
        if s == 1.0 and o == d:
            continue
        if mode != "nearest":
            if not isinstance(d, int):
                raise Unsupported(f"{mode} Resize of dynamic axis {a}")
            y = _weighted_taps(ctx, y, a, _interpolation_taps(ctx, mode, ctm, d, int(o), s))
            continue
        if isinstance(d, int):
            if policy == "stretch":  # the axis alone: the other axes are 1 in the probe, and stay 1
                probe_dims: dict[int, int] = {a: d}
                inputs = {k: np.where(np.array(axes) == a, v, 1).astype(v.dtype) for k, v in probe_inputs.items()}
            else:  # a kept aspect ratio depends on every resized axis
                probe_dims, inputs = static, probe_inputs
            idx = _nearest_indices(ctx, probe_dims, rank, a, inputs)
            if len(idx) != o:
                raise Unsupported(f"Resize along axis {a}: {len(idx)} positions for an output of {o}")
            index = ctx.tensor(known(idx))
        else:
            exact = (
                ctm in ("half_pixel", "pytorch_half_pixel") and rounding in ("round_prefer_floor", "round_prefer_ceil")
            ) or (ctm == "asymmetric" and rounding == "floor")
            if not (float(s).is_integer() and s >= 1 and exact):
                raise Unsupported(
                    f"nearest Resize of dynamic axis {a} by {s} with {ctm} / {rounding} "
                    "(integer upscaling with half_pixel / pytorch_half_pixel rounding to nearest, or asymmetric floor)"
                )
            ramp = ctx.emit(K.ARANGE, (), TensorType(DType.INT64, (o,)), ArangeAttrs(0, 1))
            index = ctx.emit(K.DIV, (ramp, ctx.const(int(s), DType.INT64)), TensorType(DType.INT64, (o,)))
        shape = list(y.type.shape)
        shape[a] = o
        y = ctx.out(K.TAKE, (ctx.tensor(y), index), TensorType(y.type.dtype, tuple(shape)), AxisAttrs(a))
    return [y]


def _source_coordinate(ctm: str, i: int, d: int, o: int, scale: float) -> float:
    """Where output position i of a resized axis samples the input (the ONNX Resize definition)."""
    width = scale * d  # the real-valued output length the transformations use
    if ctm == "align_corners":
        return 0.0 if width == 1 else i * (d - 1) / (width - 1)
    if ctm == "asymmetric":
        return i / scale
    if ctm == "pytorch_half_pixel":
        return -0.5 if width == 1 else (i + 0.5) / scale - 0.5
    if ctm == "half_pixel":
        return (i + 0.5) / scale - 0.5
    if ctm == "half_pixel_symmetric":
        return d / 2 * (1 - o / width) + (i + 0.5) / scale - 0.5
    raise Unsupported(f"coordinate_transformation_mode={ctm!r}")


def _resize_dynamic(
    ctx: OnnxCtx, x: OVal, axes: list[int], mode: str, ctm: str, policy: str, scales_v: Any, sizes_v: Any
) -> OVal:
    """Linear or cubic Resize where an axis is symbolic (a ViT's position grid resized to the patch
    grid of the image at hand): Note [Interpolation at symbolic sizes] in ir/interpolate.py."""
    if ctm not in TRANSFORMS:
        raise Unsupported(f"{mode} Resize of a dynamic axis with coordinate_transformation_mode={ctm!r}")
    if policy != "stretch" or int(ctx.attr("exclude_outside", 0)):
        raise Unsupported(f"{mode} Resize of a dynamic axis with keep_aspect_ratio_policy / exclude_outside")
    outs: dict[int, IRDim] = {}
    factors: dict[int, float | None] = {}
    if sizes_v is not None and (sizes_v.data is None or sizes_v.data.size):
        for a, s_ in zip(axes, ctx.const_ints(sizes_v, "sizes")):
            outs[a], factors[a] = s_, None
    elif scales_v is not None and scales_v.numeric is not None:
        for a, s_ in zip(axes, scales_v.numeric.ravel().tolist()):
            d = x.type.shape[a]
            if float(s_) <= 0:
                raise Unsupported(f"Resize scale {s_}")
            outs[a] = simplify_dim(sympy.floor(sympy.sympify(d) * sympy.Rational(repr(float(s_)))))
            factors[a] = float(s_)
    else:
        raise Unsupported(f"{mode} Resize of a dynamic axis without constant scales or sizes")
    dt = x.type.dtype if x.type.dtype in (DType.FLOAT32, DType.FLOAT64) else DType.FLOAT32
    y = ctx.cast(ctx.tensor(x), dt)
    shape = list(x.type.shape)
    cubic_a = float(ctx.attr("cubic_coeff_a", -0.75))
    for a in reversed(axes):
        d, o = shape[a], outs[a]
        if d == o and factors[a] in (None, 1.0):
            continue
        if not isinstance(o, int):
            ctx.assume(sympy.Ge(o, 1), f"{ctx.loc}: Resize output size {o} along axis {a} must be at least 1")
        y = resize_axis(ctx.b, ctx.loc, y, a, mode, ctm, d, o, factors[a], dt, cubic_a)
        shape[a] = o
    return OVal(TensorType(x.type.dtype, tuple(shape)), ctx.cast(y, x.type.dtype))


def _interpolation_taps(
    ctx: OnnxCtx, mode: str, ctm: str, d: int, o: int, scale: float
) -> list[tuple[np.ndarray, np.ndarray]]:
    """(source indices, weights) per tap for linear (2 taps) or cubic (4) interpolation along an axis
    of d resized to o: the left tap is the pixel left of the source coordinate (a whole coordinate uses
    ratio 1, as the reference does), outside indices read the edge, or drop out and the rest
    renormalize with exclude_outside."""
    a_coef = float(ctx.attr("cubic_coeff_a", -0.75))
    exclude = bool(int(ctx.attr("exclude_outside", 0)))
    n = 2 if mode == "linear" else 4
    idx = np.zeros((n, o), dtype=np.int64)
    w = np.zeros((n, o), dtype=np.float64)
    for i in range(o):
        x = _source_coordinate(ctm, i, d, o, scale)
        left = int(np.ceil(x)) - 1
        r = x - left  # in (0, 1]
        if mode == "linear":
            taps, coef = [left, left + 1], [1 - r, r]
        else:
            q = 1 - r
            coef = [
                ((a_coef * (r + 1) - 5 * a_coef) * (r + 1) + 8 * a_coef) * (r + 1) - 4 * a_coef,
                ((a_coef + 2) * r - (a_coef + 3)) * r * r + 1,
                ((a_coef + 2) * q - (a_coef + 3)) * q * q + 1,
                ((a_coef * (q + 1) - 5 * a_coef) * (q + 1) + 8 * a_coef) * (q + 1) - 4 * a_coef,
            ]
            taps = [left - 1, left, left + 1, left + 2]
        c = np.array(coef, dtype=np.float64)
        if exclude:
            c = np.where([0 <= t < d for t in taps], c, 0.0)
            c = c / c.sum()
        idx[:, i] = np.clip(taps, 0, d - 1)
        w[:, i] = c
    return [(idx[k], w[k]) for k in range(n)]


def _weighted_taps(ctx: OnnxCtx, x: OVal, axis: int, taps: list[tuple[np.ndarray, np.ndarray]]) -> OVal:
    """sum over taps of weight[o] * x[..., index[o], ...] along `axis`: gathers and a weighted sum, one
    fused loop kernel."""
    rank, dt = x.type.rank, x.type.dtype
    o = len(taps[0][0])
    shape = list(x.type.shape)
    shape[axis] = o
    t = TensorType(dt, tuple(shape))
    w_shape = (o,) + (1,) * (rank - axis - 1)
    acc: int | None = None
    for index, weight in taps:
        g = ctx.emit(K.TAKE, (ctx.tensor(x), ctx.tensor(known(index))), t, AxisAttrs(axis))
        wv = ctx.tensor(known(weight.astype(dt.to_numpy()).reshape(w_shape)))
        term = ctx.emit(K.MUL, (g, wv), t)
        acc = term if acc is None else ctx.emit(K.ADD, (acc, term), t)
    assert acc is not None
    return OVal(t, acc)
