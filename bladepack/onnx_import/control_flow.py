"""ONNX `If` whose condition is known at optimize time: the taken branch inlined.

In: an If node, its condition operand and a function converting one branch node into a scope. Out:
the If's outputs, the taken branch's outputs converted in place (no run-time branch).

Note [Inlined branches]: exporters leave If nodes on conditions computed from shapes (`if x.dim() ==
3`, `if seq_len > max_positions`) and on flags. A condition that folds to a constant, or to a shape
comparison the symbol ranges decide (ops_elementwise._compare), selects one branch for every input in
range, so the branch's nodes are converted as if they were the If's: they read the enclosing scope's
values by name, their own initializers and nested Ifs included, and the branch's outputs become the
If's. The untaken branch is never converted (its ops need not be supported). A condition that only
the input data or an undecided shape comparison can settle needs a plan-level branch, which the
artifact format does not have yet: it is reported with the comparison that stayed open.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import numpy_helper

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
    if cond.numeric is None or cond.numeric.size != 1:
        raise Unsupported(
            "condition computed at run time (from tensor data, or a shape comparison the declared ranges "
            "do not decide); only conditions known at optimize time are supported: narrow the ranges so "
            "that the comparison is decided, or export the branch taken"
        )
    taken = "then_branch" if bool(np.asarray(cond.numeric).ravel()[0]) else "else_branch"
    branch = ctx.attrs.get(taken)
    if not isinstance(branch, onnx.GraphProto):
        raise Unsupported(f"no {taken} graph")
    scope = dict(values)
    for t in branch.initializer:
        scope[t.name] = known(numpy_helper.to_array(t), dtype_of(t.data_type))
    where = ctx.loc
    for k, inner in enumerate(branch.node):
        convert(inner, k, f"{where} {taken}", scope)
    outs: list[OVal | None] = []
    for o in branch.output:
        outs.append(scope.get(o.name))
    return outs
