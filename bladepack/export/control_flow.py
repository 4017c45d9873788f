"""`torch.cond` whose predicate the symbol ranges decide: the taken branch inlined.

In: a `torch.ops.higher_order.cond` node, the branch graph modules its `get_attr` operands name, and a
function converting one node. Out: the cond's results, the taken branch's nodes converted in place.

Note [Inlined torch.cond]: torch.export keeps `torch.cond(pred, true_fn, false_fn, operands)` as a
higher-order node over two subgraphs. A predicate that is a comparison of shape symbols (`x.shape[0] >
4`) and that every binding in the declared ranges decides the same way (a Dim whose min is above the
threshold), or a constant, selects one branch for every input in range: its nodes are converted as if
they were the model's, its placeholders bound to the cond's operands. The untaken branch is never
converted. A predicate on tensor data, or a shape comparison the ranges leave open, needs a plan-level
branch (not in the artifact format yet): it is one clear error naming the predicate and the ranges.
The ONNX front end does the same for `If` (onnx_import/control_flow.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from bladepack.export.context import Ctx, Unsupported
from bladepack.ir import Tri


def decide(ctx: Ctx, pred: sympy.Basic) -> bool | None:
    """The truth of a predicate over shape symbols for every binding in range; None when open."""
    if pred in (sympy.true, True):
        return True
    if pred in (sympy.false, False):
        return False
    if isinstance(pred, sympy.Not):
        inner = decide(ctx, pred.args[0])
        return None if inner is None else not inner
    if isinstance(pred, (sympy.And, sympy.Or)):
        parts = [decide(ctx, a) for a in pred.args]
        if isinstance(pred, sympy.And):
            return False if False in parts else (True if all(p is True for p in parts) else None)
        return True if True in parts else (False if all(p is False for p in parts) else None)
    env = ctx.env
    if isinstance(pred, sympy.Rel):
        a, b = pred.lhs, pred.rhs
        if isinstance(pred, (sympy.Gt, sympy.Lt)):
            lo, hi = (b, a) if isinstance(pred, sympy.Gt) else (a, b)
            yes, no = env.prove_le(lo + 1, hi), env.prove_le(hi, lo)
        elif isinstance(pred, (sympy.Ge, sympy.Le)):
            lo, hi = (b, a) if isinstance(pred, sympy.Ge) else (a, b)
            yes, no = env.prove_le(lo, hi), env.prove_le(hi + 1, lo)
        elif isinstance(pred, (sympy.Eq, sympy.Ne)):
            eq = env.prove_eq(a, b)
            if eq is Tri.UNKNOWN:
                return None
            return (eq is Tri.YES) == isinstance(pred, sympy.Eq)
        else:
            return None
        if yes is Tri.YES:
            return True
        if no is Tri.YES:
            return False
    return None


def _ranges(ctx: Ctx, pred: sympy.Basic) -> str:
    syms = sorted(pred.free_symbols, key=str)
    parts = []
    for s in syms:
        r = ctx.env.range_of(s)
        parts.append(f"{s} in [{r.min}, {'inf' if r.max is None else r.max}]")
    return ", ".join(parts)


def inline_cond(
    ctx: Ctx,
    node: torch.fx.Node,
    branches: dict[torch.fx.Node, torch.fx.GraphModule],
    convert: Callable[[torch.fx.Node, torch.fx.GraphModule], None],
) -> tuple[Any, ...]:
    """The cond's results (IR values; None for one its branch did not produce) with the taken branch's
    nodes converted through `convert` (node, the module owning it); Unsupported when the predicate is
    not decided."""
    pred_arg, true_arg, false_arg, raw_operands = node.args[:4]
    operands = list(raw_operands) if isinstance(raw_operands, (list, tuple)) else [raw_operands]
    if isinstance(pred_arg, torch.fx.Node):
        pred = ctx.syms.get(pred_arg)
        if pred is None:
            raise Unsupported(
                "torch.cond on a predicate computed from tensor data: a run-time branch, which the artifact "
                "format does not have yet (only predicates over shapes that the declared ranges decide are inlined)"
            )
    else:
        pred = sympy.sympify(bool(pred_arg))
    taken = decide(ctx, pred)
    if taken is None:
        raise Unsupported(
            f"torch.cond on {pred}, which the declared ranges ({_ranges(ctx, pred)}) do not decide: a "
            "run-time branch, which the artifact format does not have yet; narrow the ranges (bladepack.Dim) "
            "so that one branch is taken for every input"
        )
    gm = branches.get(true_arg if taken else false_arg)  # type: ignore[arg-type]
    if gm is None:
        raise Unsupported("its branch is not a subgraph of the exported program")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        raise Unsupported(f"its branch takes {len(placeholders)} operands, the cond passes {len(operands)}")
    for ph, arg in zip(placeholders, operands):
        if isinstance(arg, torch.fx.Node) and arg in ctx.values:
            ctx.values[ph] = ctx.values[arg]
        elif isinstance(arg, torch.fx.Node) and arg in ctx.syms:
            ctx.syms[ph] = ctx.syms[arg]
        elif isinstance(arg, (int, bool)):
            ctx.syms[ph] = sympy.sympify(arg)
        else:
            raise Unsupported(f"operand {arg} of its branch")
    results: tuple[Any, ...] = ()
    for inner in gm.graph.nodes:
        if inner.op == "placeholder":
            continue
        if inner.op == "output":
            outs = inner.args[0] if isinstance(inner.args[0], (list, tuple)) else [inner.args[0]]
            results = tuple(ctx.values.get(o) if isinstance(o, torch.fx.Node) else None for o in outs)
            continue
        convert(inner, gm)
    return results
