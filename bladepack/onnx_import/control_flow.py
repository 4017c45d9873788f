"""ONNX `If`: the taken branch inlined when the condition is known at optimize time, else a run-time branch.

In: an If node, its condition operand and a function converting one branch node into a scope. Out:
the If's outputs: the taken branch's, or both branches' merged under guards.

Note [Inlined branches]: exporters leave If nodes on conditions computed from shapes (`if x.dim() ==
3`, `if seq_len > max_positions`) and on flags. A condition that folds to a constant, or to a shape
comparison the symbol ranges decide (ops_elementwise._compare), selects one branch for every input in
range, so the branch's nodes are converted as if they were the If's: they read the enclosing scope's
values by name, their own initializers and nested Ifs included, and the branch's outputs become the
If's. The untaken branch is never converted (its ops need not be supported). A condition that only
the input data or an undecided shape comparison can settle is a run-time branch (Note [Run-time
branches] in export/control_flow.py): both branches converted, each under a guard on the condition
(a shape comparison is a shape predicate, ops_elementwise._comparison), and a `where` per output.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from bladepack.dtypes import DType
from bladepack.ir import Guard, OpKind, Tri
from bladepack.onnx_import.context import OnnxCtx, OVal, Unsupported, dtype_of, known

CONTROL_FLOW = frozenset({"If"})

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
