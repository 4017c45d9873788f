"""ONNX `If` and `Loop`: branches inlined or guarded, loops unrolled to their bound under guards.

In: an If or Loop node, its operands and a function converting one body node into a scope. Out: the
node's outputs: an If's taken branch's, or both branches' merged under guards; a Loop's carried
values and scan outputs after its iterations.

Note [Inlined branches]: exporters leave If nodes on conditions computed from shapes (`if x.dim() ==
3`, `if seq_len > max_positions`) and on flags. A condition that folds to a constant, or to a shape
comparison the symbol ranges decide (ops_elementwise._compare), selects one branch for every input in
range, so the branch's nodes are converted as if they were the If's: they read the enclosing scope's
values by name, their own initializers and nested Ifs included, and the branch's outputs become the
If's. The untaken branch is never converted (its ops need not be supported). A condition that only
the input data or an undecided shape comparison can settle is a run-time branch (Note [Run-time
branches] in export/control_flow.py): both branches converted, each under a guard on the condition
(a shape comparison is a shape predicate, ops_elementwise._comparison), and a `where` per output.

Note [Unrolled loops]: a Loop whose trip count is a constant or a shape value with a bounded range
(`Shape -> Gather` of a dim whose Dim has a maximum) is unrolled to the largest trip count: iteration
i is the body converted with the iteration number i and the carried values bound, under a guard
"trip count > i" when the range leaves that open (a shape predicate: a loader drops the iterations
past the trip count when it prepares the signature, so a call does exactly trip-count iterations of
work). Each guarded iteration's carried results are merged with the previous ones (`where`), so the
values after the last iteration that ran come out. A body condition computed from data (a while
loop) guards each later iteration on it too (a data predicate, read on the host), nested so that an
iteration runs only when every earlier one did and continued. Scan outputs (one slice per iteration,
zeros where an iteration did not run) are concatenated and cut to the trip count; with a data
condition their length would depend on the data, which a static artifact cannot express, so they are
refused there. The body must keep every
carried value's dtype and shape (shape-stable); a trip count computed from tensor data, one without
a bound, or an unrolling above UNROLL_BUDGET body copies is refused with what to change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import sympy
from onnx import numpy_helper

from bladepack.dtypes import DType
from bladepack.ir import Guard, OpKind, TensorType, Tri
from bladepack.ir.ops import AxisAttrs, ConstantAttrs, SliceAttrs
from bladepack.onnx_import.context import OnnxCtx, OVal, Unsupported, dtype_of, known, simplify_dim

CONTROL_FLOW = frozenset({"If", "Loop"})

# Note [Unrolled loops]: most copies of a Loop body one model may hold (iterations x body nodes)
UNROLL_BUDGET = 4096
MAX_GUARDED_TRIPS = 256  # iteration i's launches carry i conditions: the manifest grows with the square

# converts one node of a branch: (node, its index in the branch, where it sits, the scope's values)
BranchConverter = Callable[[onnx.NodeProto, int, str, dict[str, OVal]], None]


def inline_if(
    ctx: OnnxCtx, node: onnx.NodeProto, ins: list[OVal | None], values: dict[str, OVal], convert: BranchConverter
) -> list[OVal | None]:
    cond = ins[0] if ins else None
    if cond is None:
        raise Unsupported("missing condition")
    where = ctx.loc
    if cond.numeric is not None:
        if cond.numeric.size != 1:
            raise Unsupported(f"its condition has {cond.numeric.size} elements; If takes one")
        taken = "then_branch" if bool(np.asarray(cond.numeric).ravel()[0]) else "else_branch"
        scope = _branch(ctx, taken, values, convert, where)
        return [scope.get(o.name) for o in _graph(ctx, taken).output]
    # Note [Run-time branches] in export/control_flow.py: both branches under guards, merged by where
    t = cond.type
    if any(d != 1 for d in t.shape):
        raise Unsupported(f"its condition has shape {t}; If takes one element")
    pred = ctx.cast(ctx.reshape(ctx.tensor(cond), ()), DType.BOOL)
    outer = ctx.b.guard
    results: list[list[int | None]] = []
    try:
        for name, taken_when in (("then_branch", True), ("else_branch", False)):
            ctx.b.guard = (*outer, Guard(pred, taken_when))
            scope = _branch(ctx, name, values, convert, where)
            outs = [scope.get(o.name) for o in _graph(ctx, name).output]
            results.append([ctx.tensor(v) if v is not None else None for v in outs])
    finally:
        ctx.b.guard = outer
    ctx.node, ctx.loc = node, where
    merged: list[OVal | None] = []
    for k, (a, b) in enumerate(zip(*results)):
        if a is None or b is None:
            merged.append(None)
            continue
        ta, tb = ctx.t(a), ctx.t(b)
        same = ta.dtype is tb.dtype and len(ta.shape) == len(tb.shape)
        if not same or any(ctx.eq(x, y) is not Tri.YES for x, y in zip(ta.shape, tb.shape)):
            raise Unsupported(
                f"its branches give output {k} ({node.output[k] if k < len(node.output) else k}) as {ta} and {tb}; "
                "a run-time If needs one dtype and shape from both"
            )
        merged.append(ctx.out(OpKind.WHERE, (pred, a, b), ta))
    return merged


def _graph(ctx: OnnxCtx, name: str) -> onnx.GraphProto:
    branch = ctx.attrs.get(name)
    if not isinstance(branch, onnx.GraphProto):
        raise Unsupported(f"no {name} graph")
    return branch


def _branch(ctx: OnnxCtx, name: str, values: dict[str, OVal], convert: BranchConverter, where: str) -> dict[str, OVal]:
    """The scope after converting one branch: the enclosing values, its initializers, its nodes' outputs."""
    branch = _graph(ctx, name)
    attrs = ctx.attrs
    scope = dict(values)
    for t in branch.initializer:
        scope[t.name] = known(numpy_helper.to_array(t), dtype_of(t.data_type))
    for k, inner in enumerate(branch.node):
        convert(inner, k, f"{where} {name}", scope)
    ctx.attrs = attrs
    return scope


def unroll_loop(
    ctx: OnnxCtx, node: onnx.NodeProto, ins: list[OVal | None], values: dict[str, OVal], convert: BranchConverter
) -> list[OVal | None]:
    """Note [Unrolled loops]."""
    where = ctx.loc
    body = _graph(ctx, "body")
    trips, count = _trip_bound(ctx, ins[0] if ins else None)
    n_carried = len(ins) - 2
    n_scan = len(body.output) - 1 - n_carried
    if n_carried < 0 or n_scan < 0 or len(body.input) != 2 + n_carried:
        raise Unsupported(
            f"its body takes {len(body.input)} inputs and gives {len(body.output)} outputs for "
            f"{max(n_carried, 0)} carried values"
        )
    if trips * max(len(body.node), 1) > UNROLL_BUDGET or (trips > MAX_GUARDED_TRIPS and not isinstance(count, int)):
        raise Unsupported(
            f"unrolling it takes {trips} copies of its {len(body.node)}-node body, above the budget "
            f"({UNROLL_BUDGET} nodes, {MAX_GUARDED_TRIPS} iterations for a symbolic trip count): narrow the range "
            "of the dim its trip count comes from (bladepack.Dim max)"
        )
    carried: list[OVal] = []
    for k, v in enumerate(ins[2:]):
        if v is None:
            raise Unsupported(f"carried value {k} is missing")
        carried.append(v)
    first = ins[1] if len(ins) > 1 else None
    keep: OVal | bool = True if first is None else (_known_bool(first) if first.numeric is not None else first)
    outer = ctx.b.guard
    initial = [ctx.tensor(v) for v in carried]  # made outside the iterations (a merge's fallback)
    guard = outer
    levels: list[tuple[int | None, tuple[Guard, ...], list[int]]] = []  # per iteration: pred, its guard, results
    scans: list[list[int]] = [[] for _ in range(n_scan)]
    attrs = ctx.attrs
    try:
        for i in range(trips):
            if keep is False:
                break
            if isinstance(keep, OVal) and n_scan:
                raise Unsupported(
                    "its body's condition is computed from data, so its scan outputs would have a length the "
                    "data decides; unrolling takes scan outputs with a constant or symbolic trip count"
                )
            pred = _iteration_predicate(ctx, i, count, keep, guard)
            if pred is not None and i >= MAX_GUARDED_TRIPS:
                raise Unsupported(
                    f"it runs up to {trips} iterations under run-time conditions; unrolling takes at most "
                    f"{MAX_GUARDED_TRIPS} such iterations (narrow the range its trip count comes from)"
                )
            enclosing = guard
            if pred is not None:
                guard = (*guard, Guard(pred, True))
            ctx.b.guard = guard
            scope = dict(values)
            for t in body.initializer:
                scope[t.name] = known(numpy_helper.to_array(t), dtype_of(t.data_type))
            scope[body.input[0].name] = known(np.array(i, dtype=np.int64))
            scope[body.input[1].name] = known(np.array(True)) if keep is True else keep
            for k, v in enumerate(carried):
                scope[body.input[2 + k].name] = v
            for j, inner in enumerate(body.node):
                convert(inner, j, f"{where} iteration {i}", scope)
            ctx.attrs = attrs
            outs = [scope.get(o.name) for o in body.output]
            if any(o is None for o in outs):
                raise Unsupported("its body does not produce all of its outputs")
            new = [o for o in outs[1 : 1 + n_carried] if o is not None]
            for k, (old, v) in enumerate(zip(carried, new)):
                _same_shape(ctx, old.type, v.type, f"carried value {k} ({node.input[2 + k]})")
            for k, o in enumerate(outs[1 + n_carried :]):
                assert o is not None
                row = ctx.reshape(ctx.tensor(o), (1, *o.type.shape))
                if pred is not None:  # zeros past the trip count, cut off below; merged outside the iterations
                    ctx.b.guard = outer
                    zero = ctx.emit(OpKind.FULL, (), ctx.t(row), ConstantAttrs(o.type.dtype.scalar(0)))
                    row = ctx.emit(OpKind.WHERE, (pred, row, zero), ctx.t(row))
                    ctx.b.guard = guard
                scans[k].append(row)
            levels.append((pred, enclosing, [ctx.tensor(v) for v in new]))
            carried = [v for v in new if v is not None]
            cond_out = outs[0]
            assert cond_out is not None
            keep = _known_bool(cond_out) if cond_out.numeric is not None else cond_out
        # the results, merged from the last iteration back: after iteration i, the later iterations' results
        # where the next one ran, else iteration i's own (each merge under the guard iteration i ran with)
        result = levels[-1][2] if levels else initial
        for k in range(len(levels) - 1, -1, -1):
            pred, enclosing, _ = levels[k]
            if pred is None:
                continue
            before = levels[k - 1][2] if k > 0 else initial
            ctx.b.guard = enclosing
            result = [ctx.emit(OpKind.WHERE, (pred, r, b), ctx.t(b)) for r, b in zip(result, before)]
    finally:
        ctx.b.guard = outer
        ctx.attrs = attrs
    ctx.loc = where
    results: list[OVal | None] = [OVal(ctx.t(r), r) for r in result]
    for parts in scans:
        results.append(_scan_output(ctx, parts, count))
    return results


def _known_bool(v: OVal) -> bool:
    assert v.numeric is not None
    if v.numeric.size != 1:
        raise Unsupported(f"a loop condition of {v.numeric.size} elements")
    return bool(np.asarray(v.numeric).ravel()[0])


def _trip_bound(ctx: OnnxCtx, m: OVal | None) -> tuple[int, Any]:
    """(most iterations, the trip count as an int or a sympy expression)."""
    if m is None:
        raise Unsupported(
            "a Loop without a trip count (a while loop) has no bound to unroll to; give it a trip count "
            "(a constant, or a shape value with a bounded range)"
        )
    if m.data is None:
        raise Unsupported(
            "its trip count is computed from tensor data; only a constant or a shape value (with a bounded "
            "range) is unrolled"
        )
    if m.data.size != 1:
        raise Unsupported(f"its trip count has {m.data.size} elements")
    e = np.asarray(m.data).ravel()[0]
    if m.numeric is not None:
        return max(int(e), 0), int(e)
    e = sympy.sympify(e)
    hi = ctx.env.bounds(e)[1]
    if hi is None or hi == sympy.oo or not isinstance(hi, (int, sympy.Integer)):
        raise Unsupported(
            f"its trip count {e} has no upper bound: give the dim it comes from a maximum (bladepack.Dim)"
        )
    return max(int(hi), 0), e


def _iteration_predicate(ctx: OnnxCtx, i: int, count: Any, keep: OVal | bool, guard: tuple[Guard, ...]) -> int | None:
    """The 0-d bool under which iteration i runs, None when it always does."""
    shape: int | None = None
    if not isinstance(count, int):
        lo = ctx.env.bounds(count)[0]
        if not (isinstance(lo, (int, sympy.Integer)) and int(lo) > i):
            shape = ctx.emit(OpKind.FULL, (), TensorType(DType.BOOL, ()), ConstantAttrs(sympy.Gt(count, i)))
    if not isinstance(keep, OVal):
        return shape
    ctx.b.guard = guard  # the condition was computed by the previous iteration: read only if it ran
    data = ctx.cast(ctx.reshape(ctx.tensor(keep), ()), DType.BOOL)
    if shape is None:
        return data
    return ctx.emit(OpKind.LOGICAL_AND, (shape, data), TensorType(DType.BOOL, ()))


def _same_shape(ctx: OnnxCtx, a: TensorType, b: TensorType, what: str) -> None:
    same = a.dtype is b.dtype and len(a.shape) == len(b.shape)
    if not same or any(ctx.eq(x, y) is not Tri.YES for x, y in zip(a.shape, b.shape)):
        raise Unsupported(f"its body changes {what} from {a} to {b}; unrolling needs a shape-stable body")


def _scan_output(ctx: OnnxCtx, parts: list[int], count: Any) -> OVal:
    """Scan slices stacked along a new axis 0 and cut to the trip count."""
    if not parts:
        raise Unsupported("a scan output of a loop that runs no iteration")
    t = ctx.t(parts[0])
    stacked_t = TensorType(t.dtype, (len(parts), *t.shape[1:]))
    stacked = parts[0] if len(parts) == 1 else ctx.emit(OpKind.CONCAT, parts, stacked_t, AxisAttrs(0))
    if isinstance(count, int) or len(parts) == 0:
        return OVal(stacked_t, stacked)
    out_t = TensorType(t.dtype, (simplify_dim(count), *t.shape[1:]))
    return ctx.out(OpKind.SLICE, (stacked,), out_t, SliceAttrs(0, 0, 1))
