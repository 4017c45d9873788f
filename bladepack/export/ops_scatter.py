"""torch's scatters: scatter (a source tensor or a value), scatter_add and scatter_reduce, as one
SCATTER op (ScatterAttrs; Note [Scatter kernel] in codegen/anchor_kernels.py).

In: the FX node's arguments. Out: the IR values; a `mean` reduction is the sum divided by the count of
contributions (self's included when include_self), self where nothing was scattered.
"""

from __future__ import annotations

from typing import Any

import sympy

from bladepack.dtypes import DType
from bladepack.export.context import Ctx, Unsupported, Value, arg, converts, norm_axis
from bladepack.ir import TensorType, Tri
from bladepack.opset import OpKind
from bladepack.opset.attrs import ConstantAttrs, ScatterAttrs

K = OpKind

_REDUCE = ("sum", "prod", "mean", "amax", "amin")


def scatter(ctx: Ctx, x: Value, axis: int, index: Value, src: Value, reduce: str, include_self: bool) -> Value:
    """SCATTER of src into x along `axis` at `index` (int64, in [0, size)), after the extents torch
    requires: index no longer than x off the axis, src no shorter than index anywhere (a shape
    constraint where the ranges leave it open)."""
    t, it, st = ctx.t(x), ctx.t(index), ctx.t(src)
    if t.rank == 0 or it.rank != t.rank or st.rank != t.rank:
        raise Unsupported(f"scatter of ranks {t.rank}, {it.rank} (index), {st.rank} (source): one rank of at least 1")
    for d in range(t.rank):
        pairs = [(it.shape[d], st.shape[d], "the source")] + ([] if d == axis else [(it.shape[d], t.shape[d], "self")])
        for small, big, what in pairs:
            proof = ctx.env.prove_le(small, big)
            if proof is Tri.NO:
                raise Unsupported(f"scatter with an index longer than {what} along dimension {d} ({small} > {big})")
            if proof is not Tri.YES:
                ctx.assume(
                    sympy.Le(small, big),
                    f"{ctx.loc}: scatter's index must not be longer than {what} along dimension {d}",
                )
    dt = t.dtype
    index = ctx.cast(index, DType.INT64)
    src = ctx.cast(src, dt)
    out = TensorType(dt, t.shape)
    if reduce != "mean":
        return ctx.emit(K.SCATTER, (x, index, src), out, ScatterAttrs(axis, reduce, include_self))
    if not dt.is_floating:
        raise Unsupported(f"scatter_reduce 'mean' of {dt.value} (floating types only)")
    total = ctx.emit(K.SCATTER, (x, index, src), out, ScatterAttrs(axis, "sum", include_self))
    base = ctx.emit(K.FULL, (), out, ConstantAttrs(dt.scalar(1.0 if include_self else 0.0)))
    ones = ctx.emit(K.FULL, (), TensorType(dt, it.shape), ConstantAttrs(dt.scalar(1.0)))
    count = ctx.emit(K.SCATTER, (base, index, ones), out, ScatterAttrs(axis, "sum", True))
    none = ctx.emit(K.EQ, (count, ctx.const(0, dt)), TensorType(DType.BOOL, t.shape))
    return ctx.emit(K.WHERE, (none, x, ctx.emit(K.DIV, (total, count), out)), out)


@converts("aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default", "aten.scatter_reduce.two")
def _scatter(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    target = str(ctx.node.target if ctx.node is not None else "")
    x, index = ctx.v(args[0]), ctx.v(args[2])
    t = ctx.t(x)
    axis = norm_axis(int(args[1]), t.rank)
    out = ctx.out_type()
    x = ctx.cast(x, out.dtype)
    if target == "aten.scatter.value":
        value = args[3]
        if not isinstance(value, (int, float, bool)):
            raise Unsupported(f"scatter of a value {value!r} (a number)")
        try:
            fill = ConstantAttrs(out.dtype.scalar(value))
        except ValueError as e:
            raise Unsupported(str(e)) from None
        src = ctx.emit(K.FULL, (), TensorType(out.dtype, ctx.t(index).shape), fill)
    else:
        src = ctx.v(args[3])
    reduce, include_self = "none", True
    if target == "aten.scatter_add.default":
        reduce = "sum"
    elif target == "aten.scatter_reduce.two":
        name = str(args[4])
        if name not in _REDUCE:
            raise Unsupported(f"scatter_reduce with reduce={name!r} (sum, prod, mean, amax, amin)")
        reduce, include_self = name, bool(arg(args, kwargs, 5, "include_self", True))
    if reduce != "none" and out.dtype is DType.BOOL:
        raise Unsupported(f"scatter with reduce={reduce!r} of bool")
    return scatter(ctx, x, axis, index, src, reduce, include_self)


@converts("aten.index_put.default")
def _index_put(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    """`x[mask] = v` (and `x[mask] += v` with accumulate): one boolean mask over x's leading dims and
    one value broadcast to x, a WHERE. Integer indices need a scatter by several index tensors, not
    built yet."""
    x = ctx.v(args[0])
    t = ctx.t(x)
    indices = list(args[1])
    accumulate = bool(arg(args, kwargs, 3, "accumulate", False))
    masks = [i for i in indices if i is not None]
    if len(masks) != 1 or indices[0] is None:
        raise Unsupported("index_put with integer or several index tensors (only x[mask] = value is converted)")
    mask = ctx.v(masks[0])
    mt = ctx.t(mask)
    if mt.dtype is not DType.BOOL or mt.shape != t.shape[: mt.rank]:
        raise Unsupported("index_put with integer or several index tensors (only x[mask] = value is converted)")
    values = ctx.cast(ctx.v(args[2]), t.dtype)
    vt = ctx.t(values)
    if vt.rank > t.rank - mt.rank or any(d != 1 for d in vt.shape[: max(0, vt.rank - (t.rank - mt.rank))]):
        raise Unsupported("index_put whose values are not one value per element of x's trailing dims")
    if any(vt.shape[-k] not in (1, t.shape[-k]) for k in range(1, vt.rank + 1)):
        raise Unsupported("index_put whose values do not broadcast over x's trailing dims")
    full_mask = (
        ctx.emit(K.RESHAPE, (mask,), TensorType(DType.BOOL, (*mt.shape, *([1] * (t.rank - mt.rank)))))
        if mt.rank < t.rank
        else mask
    )
    new = ctx.emit(K.ADD, (x, values), t) if accumulate else values
    return ctx.emit(K.WHERE, (full_mask, new, x), t)
