"""`torch.cond`: the taken branch inlined when the symbol ranges decide the predicate, else a run-time branch.

In: a `torch.ops.higher_order.cond` node, the branch graph modules its `get_attr` operands name, and a
function converting one node. Out: the cond's results, the branch nodes converted in place.

Note [Inlined torch.cond]: torch.export keeps `torch.cond(pred, true_fn, false_fn, operands)` as a
higher-order node over two subgraphs. A predicate that is a comparison of shape symbols (`x.shape[0] >
4`) and that every binding in the declared ranges decides the same way (a Dim whose min is above the
threshold), or a constant, selects one branch for every input in range: its nodes are converted as if
they were the model's, its placeholders bound to the cond's operands. The untaken branch is never
converted.

Note [Run-time branches]: a shape comparison the ranges leave open, or a predicate computed from tensor
data, becomes a run-time branch (Note [Guarded nodes] in ir/graph.py): the predicate as a 0-d bool
value (a `full` of the sympy comparison, which the shape program evaluates, or the data predicate
itself), both branches converted with a guard on it, and one `where(pred, then, else)` per result.
The branches must return tensors of one dtype and shape (torch.cond's own rule). The ONNX front end
does the same for `If` (onnx_import/control_flow.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy
import torch

from bladepack.dtypes import DType
from bladepack.export.context import Ctx, Unsupported
from bladepack.ir import Guard, OpKind, TensorType, Tri
from bladepack.ir.ops import ConstantAttrs


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


def _data_predicate(ctx: Ctx, v: int) -> int:
    """A one-element tensor predicate as the 0-d bool value a guard reads."""
    t = ctx.t(v)
    if any(d != 1 for d in t.shape):
        raise Unsupported(f"its predicate has shape {t}; torch.cond needs a one-element tensor")
    if t.shape:
        v = ctx.emit(OpKind.RESHAPE, (v,), TensorType(t.dtype, ()))
    return ctx.cast(v, DType.BOOL)


def inline_cond(
    ctx: Ctx,
    node: torch.fx.Node,
    branches: dict[torch.fx.Node, torch.fx.GraphModule],
    convert: Callable[[torch.fx.Node, torch.fx.GraphModule], None],
) -> tuple[Any, ...]:
    """The cond's results (IR values; None for one a branch did not produce) with the branch nodes
    converted through `convert` (node, the module owning it): the taken branch alone when the ranges
    decide the predicate, else both under guards and merged (Note [Run-time branches])."""
    pred_arg, true_arg, false_arg, raw_operands = node.args[:4]
    operands = list(raw_operands) if isinstance(raw_operands, (list, tuple)) else [raw_operands]
    loc = ctx.loc
    data: int | None = None
    if isinstance(pred_arg, torch.fx.Node):
        pred = ctx.syms.get(pred_arg)
        if pred is None:
            data = ctx.v(pred_arg)
    else:
        pred = sympy.sympify(bool(pred_arg))
    if data is None:
        assert pred is not None
        taken = decide(ctx, pred)
        if taken is not None:
            return _branch(ctx, branches, true_arg if taken else false_arg, operands, convert)
        p = ctx.emit(OpKind.FULL, (), TensorType(DType.BOOL, ()), ConstantAttrs(pred))
    else:
        p = _data_predicate(ctx, data)
    outer = ctx.b.guard
    try:
        ctx.b.guard = (*outer, Guard(p, True))
        then = _branch(ctx, branches, true_arg, operands, convert)
        ctx.b.guard = (*outer, Guard(p, False))
        other = _branch(ctx, branches, false_arg, operands, convert)
    finally:
        ctx.b.guard = outer
    ctx.node, ctx.loc = node, loc
    results: list[Any] = []
    for k, (a, b) in enumerate(zip(then, other)):
        if not isinstance(a, int) or not isinstance(b, int):
            results.append(None)
            continue
        ta, tb = ctx.t(a), ctx.t(b)
        same = ta.dtype is tb.dtype and len(ta.shape) == len(tb.shape)
        if not same or any(ctx.env.prove_eq(x, y) is not Tri.YES for x, y in zip(ta.shape, tb.shape)):
            raise Unsupported(f"its branches return different tensors as result {k}: {ta} and {tb}")
        results.append(ctx.emit(OpKind.WHERE, (p, a, b), ta))
    return tuple(results)


def _branch(
    ctx: Ctx,
    branches: dict[torch.fx.Node, torch.fx.GraphModule],
    arg: Any,
    operands: list[Any],
    convert: Callable[[torch.fx.Node, torch.fx.GraphModule], None],
) -> tuple[Any, ...]:
    """One branch's nodes converted, its placeholders bound to the cond's operands; its results."""
    gm = branches.get(arg)
    if gm is None:
        raise Unsupported("its branch is not a subgraph of the exported program")
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        raise Unsupported(f"its branch takes {len(placeholders)} operands, the cond passes {len(operands)}")
    for ph, operand in zip(placeholders, operands):
        if isinstance(operand, torch.fx.Node) and operand in ctx.values:
            ctx.values[ph] = ctx.values[operand]
        elif isinstance(operand, torch.fx.Node) and operand in ctx.syms:
            ctx.syms[ph] = ctx.syms[operand]
        elif isinstance(operand, (int, bool)):
            ctx.syms[ph] = sympy.sympify(operand)
        else:
            raise Unsupported(f"operand {operand} of its branch")
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
