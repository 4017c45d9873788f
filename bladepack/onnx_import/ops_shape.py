"""ONNX → IR: shape computations and indexing.

In: an ONNX node's operands. Out: IR values or known values. Shape and Size produce shape values
(object arrays of symbolic dims); Gather, Squeeze, Unsqueeze and Reshape on shape values compute new
shape values (Concat, Slice, Expand and Tile in ops_layout.py do too); Reshape, ConstantOfShape and
Range read them as their result dims, so a dynamic export's Shape → Gather → Concat → Reshape chain
ends as one RESHAPE whose result type holds sympy dims (Note [Known values] in context.py).
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import sympy
from onnx import numpy_helper

from bladepack.dtypes import DType
from bladepack.ir import OpKind, TensorType, Tri
from bladepack.ir.ops import ArangeAttrs, AxisAttrs, ConstantAttrs, IndexAttrs, ScatterAttrs
from bladepack.ir.types import IRDim
from bladepack.onnx_import.context import (
    RUNTIME_DATA,
    OnnxCtx,
    OVal,
    Unsupported,
    arg,
    converts,
    dtype_of,
    known,
    need,
    norm_axis,
    simplify_dim,
)
from bladepack.onnx_import.ops_layout import slice_axis

K = OpKind


def _prod(dims: Any) -> IRDim:
    p: Any = 1
    for d in dims:
        p = p * d
    return simplify_dim(p)


def _dims_array(dims: Any) -> np.ndarray:
    out = np.empty(len(dims), dtype=object)
    out[:] = [simplify_dim(d) for d in dims]
    return out


# --------------------------------------------------------------------------- constants and shapes


@converts("Constant", foldable=False)
def _constant(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    a = ctx.attrs
    if "value" in a:
        return [known(numpy_helper.to_array(a["value"]), dtype_of(a["value"].data_type))]
    if "value_float" in a:
        return [known(np.array(a["value_float"], dtype=np.float32))]
    if "value_floats" in a:
        return [known(np.array(a["value_floats"], dtype=np.float32))]
    if "value_int" in a:
        return [known(np.array(a["value_int"], dtype=np.int64))]
    if "value_ints" in a:
        return [known(np.array(a["value_ints"], dtype=np.int64))]
    raise Unsupported(f"a constant given as {sorted(a)}")


@converts("Shape", foldable=False)
def _shape(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    rank = x.type.rank
    start, end = int(ctx.attr("start", 0)), ctx.attr("end")
    start = min(max(start + rank if start < 0 else start, 0), rank)
    stop = rank if end is None else min(max(int(end) + rank if int(end) < 0 else int(end), 0), rank)
    return [known(_dims_array(x.type.shape[start:stop]), DType.INT64)]


@converts("Size", foldable=False)
def _size(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    return [known(np.array(_prod(x.type.shape), dtype=object), DType.INT64)]


@converts("ConstantOfShape")
def _constant_of_shape(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    dims = ctx.const_ints(need(ins, 0), "shape")
    value = ctx.attr("value")
    arr = numpy_helper.to_array(value) if value is not None else np.zeros(1, dtype=np.float32)
    dt = dtype_of(value.data_type) if value is not None else DType.FLOAT32
    v = arr.ravel()[0].item()
    t = TensorType(dt, tuple(dims))
    return [ctx.out(K.FULL, (), t, ConstantAttrs(bool(v) if dt is DType.BOOL else v))]


@converts("Range")
def _range(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    start, limit, delta = need(ins, 0), need(ins, 1), need(ins, 2)
    dt = start.type.dtype
    if dt.is_floating:
        raise Unsupported(f"floating-point Range bounds {RUNTIME_DATA}")
    s, lim = ctx.const_ints(start, "start")[0], ctx.const_ints(limit, "limit")[0]
    d = ctx.const_ints(delta, "delta")[0]
    if not isinstance(d, int) or d == 0:
        raise Unsupported(f"Range with delta {d} (a non-zero constant is required)")
    n = sympy.ceiling(sympy.sympify(lim - s) / d)
    length = simplify_dim(n if ctx.env.prove_le(0, n) is Tri.YES else sympy.Max(n, 0))
    return [ctx.out(K.ARANGE, (), TensorType(dt, (length,)), ArangeAttrs(s, d))]


# --------------------------------------------------------------------------- reshapes


def _reshape_to(ctx: OnnxCtx, x: OVal, dims: list[IRDim]) -> OVal:
    dims = [simplify_dim(d) for d in dims]
    if x.data is not None and all(isinstance(d, int) for d in dims):
        return known(np.reshape(x.data, [int(d) for d in dims]), x.type.dtype)
    if tuple(dims) == x.type.shape:
        return x
    return OVal(TensorType(x.type.dtype, tuple(dims)), ctx.reshape(ctx.tensor(x), dims))


@converts("Reshape")
def _reshape(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    want = ctx.const_ints(need(ins, 1), "shape")
    allowzero = int(ctx.attr("allowzero", 0))
    dims: list[Any] = []
    infer = None
    for k, d in enumerate(want):
        if isinstance(d, int) and d == 0 and not allowzero:
            if k >= x.type.rank:
                raise Unsupported(f"shape entry {k} copies a dim the rank-{x.type.rank} input does not have")
            dims.append(x.type.shape[k])
        elif isinstance(d, int) and d == -1:
            if infer is not None:
                raise Unsupported("a shape with two -1 entries")
            infer = k
            dims.append(None)
        elif isinstance(d, int) and d < 0:
            raise Unsupported(f"shape entry {d}")
        else:
            dims.append(d)
    if infer is not None:
        dims[infer] = _infer_dim(ctx, _prod(x.type.shape), _prod(d for d in dims if d is not None))
    return [_reshape_to(ctx, x, dims)]


def _infer_dim(ctx: OnnxCtx, total: IRDim, known_part: IRDim) -> IRDim:
    """total / known_part, exact: a quotient that is not a polynomial is floored and checked at run time."""
    if isinstance(total, int) and isinstance(known_part, int):
        if known_part == 0 or total % known_part:
            raise Unsupported(f"cannot reshape {total} elements into groups of {known_part}")
        return total // known_part
    q = sympy.cancel(sympy.sympify(total) / known_part)
    if q.is_Integer and q > 0:  # the symbols cancel: batch * seq * 64 elements in rows of batch * seq * 16
        return int(q)
    _, den = sympy.fraction(q)
    gens = sorted(q.free_symbols, key=str)
    if den == 1 and gens and q.is_polynomial() and all(c.is_Integer for c in sympy.Poly(q, *gens).coeffs()):
        return simplify_dim(q)
    ctx.assume(
        sympy.Eq(sympy.Mod(total, known_part), 0), f"{ctx.loc}: {total} elements must split into rows of {known_part}"
    )
    return simplify_dim(sympy.floor(sympy.sympify(total) / known_part))


@converts("Flatten")
def _flatten(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    rank = x.type.rank
    axis = int(ctx.attr("axis", 1))
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        raise Unsupported(f"axis {ctx.attr('axis')} for rank {rank}")
    return [_reshape_to(ctx, x, [_prod(x.type.shape[:axis]), _prod(x.type.shape[axis:])])]


def _axes_operand(ctx: OnnxCtx, ins: list[OVal | None]) -> list[int] | None:
    """Squeeze / Unsqueeze take their axes as input 1 from opset 13 on (older models are upgraded)."""
    v = arg(ins, 1)
    return None if v is None else ctx.const_int_list(v, "axes")


@converts("Squeeze")
def _squeeze(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    rank = x.type.rank
    axes = _axes_operand(ctx, ins)
    if axes is None:
        drop = {k for k, d in enumerate(x.type.shape) if isinstance(d, int) and d == 1}
    else:
        drop = {norm_axis(a, rank) for a in axes}
        for a in drop:
            d = x.type.shape[a]
            if ctx.eq(d, 1) is Tri.NO:
                raise Unsupported(f"squeeze of axis {a}, whose size {d} is not 1")
            if not isinstance(d, int):
                ctx.assume(sympy.Eq(d, 1), f"{ctx.loc}: squeezed dim {d} must be 1")
    return [_reshape_to(ctx, x, [d for k, d in enumerate(x.type.shape) if k not in drop])]


@converts("Unsqueeze")
def _unsqueeze(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x = need(ins, 0)
    axes = _axes_operand(ctx, ins)
    if axes is None:
        raise Unsupported("Unsqueeze without axes")
    rank = x.type.rank + len(axes)
    where = sorted(norm_axis(a, rank) for a in axes)
    if len(set(where)) != len(where):
        raise Unsupported(f"repeated axes {axes}")
    dims = list(x.type.shape)
    for a in where:
        dims.insert(a, 1)
    return [_reshape_to(ctx, x, dims)]


# --------------------------------------------------------------------------- gather


def _indices(ctx: OnnxCtx, idx: OVal, size: IRDim) -> int:
    """The index tensor as int64. Known indices are wrapped now; the kernels wrap negative run-time
    indices themselves and report out-of-range ones."""
    if idx.numeric is not None and isinstance(size, int):
        if idx.numeric.size and (idx.numeric.min() < -size or idx.numeric.max() >= size):
            raise Unsupported(f"indices {idx.numeric.ravel().tolist()[:8]} out of range for a dim of {size}")
        return ctx.tensor(known(np.where(idx.numeric < 0, idx.numeric + size, idx.numeric).astype(np.int64)))
    return ctx.cast(ctx.tensor(idx), DType.INT64)


def _arithmetic_run(ctx: OnnxCtx, idx: OVal, d: IRDim) -> tuple[IRDim, int, int] | None:
    """(start, step, count) when the known indices are start, start + step, ... inside [0, d); indices
    that need a run-time bound (d symbolic) add a guard."""
    assert idx.numeric is not None
    raw = [int(k) for k in idx.numeric.ravel()]
    if not raw:
        return None
    if not (all(k >= 0 for k in raw) or all(k < 0 for k in raw)):
        return None
    step = raw[1] - raw[0] if len(raw) > 1 else 1
    if step == 0 or any(b - a != step for a, b in itertools.pairwise(raw)):
        return None
    lo, hi = min(raw), max(raw)
    if not isinstance(d, int):
        need_ok = sympy.Le(hi + 1, d) if lo >= 0 else sympy.Le(-lo, d)
        if ctx.env.prove_le(hi + 1 if lo >= 0 else -lo, d) is not Tri.YES:
            ctx.assume(need_ok, f"{ctx.loc}: indices {raw[:8]} must lie inside dim {d}")
    start = raw[0] if raw[0] >= 0 else simplify_dim(sympy.sympify(d) + raw[0])
    return start, step, len(raw)


@converts("Gather")
def _gather(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x, idx = need(ins, 0), need(ins, 1)
    axis = norm_axis(int(ctx.attr("axis", 0)), x.type.rank)
    d = x.type.shape[axis]
    if idx.numeric is not None and isinstance(d, int):
        if idx.numeric.size and (idx.numeric.min() < -d or idx.numeric.max() >= d):
            raise Unsupported(f"indices {idx.numeric.ravel().tolist()[:8]} out of range for a dim of {d}")
        if x.data is not None:
            flat = np.where(idx.numeric < 0, idx.numeric + d, idx.numeric).astype(np.int64)
            return [known(np.take(x.data, flat, axis=axis), x.type.dtype)]
    run = _arithmetic_run(ctx, idx, d) if idx.numeric is not None and idx.type.rank <= 1 else None
    if run is not None:  # an arithmetic run of known indices is a slice (a select when the index is a scalar)
        start, step, count = run
        y = slice_axis(ctx, x, axis, start, step, count)
        if idx.type.rank == 0:
            shape0 = x.type.shape[:axis] + x.type.shape[axis + 1 :]
            y = OVal(TensorType(x.type.dtype, shape0), ctx.reshape(ctx.tensor(y), shape0))
        return [y]
    shape = x.type.shape[:axis] + idx.type.shape + x.type.shape[axis + 1 :]
    i = _indices(ctx, idx, d)
    return [ctx.out(K.TAKE, (ctx.tensor(x), i), TensorType(x.type.dtype, shape), AxisAttrs(axis))]


@converts("GatherND")
def _gather_nd(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    """data[i_0, ..., i_k-1] with the k index tensors the last axis of `indices` holds (torch's advanced
    indexing over leading axes); the batch_dims leading axes index themselves (aranges)."""
    x, idx = need(ins, 0), need(ins, 1)
    b = int(ctx.attr("batch_dims", 0))
    k = idx.type.shape[-1] if idx.type.rank else None
    if not isinstance(k, int) or not 1 <= k <= x.type.rank - b or not 0 <= b < idx.type.rank:
        raise Unsupported(f"index depth {k} for rank {x.type.rank} data with batch_dims {b}")
    lead = idx.type.shape[:-1]
    i64 = OVal(TensorType(DType.INT64, idx.type.shape), ctx.cast(ctx.tensor(idx), DType.INT64))
    index: list[int] = []
    for a in range(b):
        n = x.type.shape[a]
        r = ctx.emit(OpKind.ARANGE, (), TensorType(DType.INT64, (n,)), ArangeAttrs(0, 1))
        index.append(ctx.reshape(r, [n if j == a else 1 for j in range(len(lead))]))
    for j in range(k):
        column = slice_axis(ctx, i64, idx.type.rank - 1, j, 1, 1)
        index.append(ctx.reshape(ctx.tensor(column), lead))
    shape = lead + x.type.shape[b + k :]
    t = TensorType(x.type.dtype, shape)
    return [ctx.out(OpKind.INDEX, (ctx.tensor(x), *index), t, IndexAttrs(tuple(range(b + k))))]


@converts("GatherElements")
def _gather_elements(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    x, idx = need(ins, 0), need(ins, 1)
    axis = norm_axis(int(ctx.attr("axis", 0)), x.type.rank)
    i = _indices(ctx, idx, x.type.shape[axis])
    return [ctx.out(K.GATHER, (ctx.tensor(x), i), TensorType(x.type.dtype, idx.type.shape), AxisAttrs(axis))]


_SCATTER_REDUCTIONS = {"none": "none", "add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@converts("ScatterElements", "Scatter")
def _scatter_elements(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    """The SCATTER op (Note [Scatter kernel]); negative indices count from the end, as ONNX allows
    (wrapped here, so the kernel's [0, size) check names what is still out of range). Indices and
    updates have one shape, no longer than the data off the axis (shape constraints where open)."""
    x, idx, upd = need(ins, 0), need(ins, 1), need(ins, 2)
    rank = x.type.rank
    axis = norm_axis(int(ctx.attr("axis", 0)), rank)
    reduction = ctx.text("reduction", "none")
    if reduction not in _SCATTER_REDUCTIONS:
        raise Unsupported(f"ScatterElements with reduction={reduction!r} (none, add, mul, max, min)")
    if rank == 0 or idx.type.rank != rank or upd.type.rank != rank:
        raise Unsupported("ScatterElements whose data, indices and updates differ in rank")
    if reduction != "none" and x.type.dtype is DType.BOOL:
        raise Unsupported(f"ScatterElements with reduction={reduction!r} of bool")
    for d in range(rank):
        checks = [(idx.type.shape[d], upd.type.shape[d], "==", "the updates")]
        if d != axis:
            checks.append((idx.type.shape[d], x.type.shape[d], "<=", "the data"))
        for a, b, rel, what in checks:
            proof = ctx.eq(a, b) if rel == "==" else ctx.env.prove_le(a, b)
            if proof is Tri.NO:
                raise Unsupported(f"ScatterElements: indices of {a} along dimension {d} against {b} in {what}")
            if proof is not Tri.YES:
                cond = sympy.Eq(a, b) if rel == "==" else sympy.Le(a, b)
                ctx.assume(cond, f"{ctx.loc}: ScatterElements' indices along dimension {d} must fit {what}")
    size = x.type.shape[axis]
    i = ctx.cast(ctx.tensor(idx), DType.INT64)
    it = ctx.t(i)
    bound = ctx.const(size if isinstance(size, int) else sympy.sympify(size), DType.INT64)
    negative = ctx.emit(K.LT, (i, ctx.const(0, DType.INT64)), TensorType(DType.BOOL, it.shape))
    wrapped = ctx.emit(K.WHERE, (negative, ctx.emit(K.ADD, (i, bound), it), i), it)
    src = ctx.cast(ctx.tensor(upd), x.type.dtype)
    attrs = ScatterAttrs(axis, _SCATTER_REDUCTIONS[reduction], True)
    return [ctx.out(K.SCATTER, (ctx.tensor(x), wrapped, src), x.type, attrs)]
