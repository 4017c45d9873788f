"""Pass: rewrite every dim in the program to its canonical form under the shape constraints.

In: a `Program` whose front end may have given equal dims different symbols (an ONNX model names each
input's dims on its own; a reshape's result may carry a fresh symbol). Out: the same program with
every type and symbolic attribute rewritten by `ShapeConstraints.canonical`, a `ShapeEnv` holding only
the class representatives with their intersected ranges, and runtime assertions for what the rewrite
no longer shows: the declared range of each symbol replaced by an expression and every residual product
equality. Equal dims are then syntactically equal, so fusion and
code generation see them as one (DISC's shape canonicalization).

A program with no such facts (torch.export unifies dims itself) is returned unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import sympy

from bladepack.ir import Graph, Node, Program, ShapeEnv, Tri
from bladepack.ir.graph import Param
from bladepack.ir.types import TensorType
from bladepack.passes.shape_constraints import ShapeConstraints, analyze


def canonicalize_shapes(p: Program) -> Program:
    cons = analyze(p)
    if not cons.facts:
        return p
    env = ShapeEnv()
    gone = cons.eliminated()
    for s in p.shape_env.symbols:
        if s not in gone:
            r = cons.range_of(s.name)
            env.create_symbol(s.name, r.min, r.max)
    assertions = [(_canon(cons, c), msg) for c, msg in p.assertions] + _runtime_facts(cons, p.shape_env, gone)
    g = p.graph
    graph = Graph(
        tuple(_param(cons, x) for x in g.inputs),
        tuple(_param(cons, w) for w in g.weights),
        tuple(_node(cons, n) for n in g.nodes),
        g.outputs,
        g.output_names,
    )
    return dataclasses.replace(p, graph=graph, shape_env=env, assertions=tuple(assertions))


def _runtime_facts(
    cons: ShapeConstraints, old: ShapeEnv, gone: dict[sympy.Symbol, sympy.Expr]
) -> list[tuple[Any, str]]:
    out: list[tuple[Any, str]] = []
    for s, v in gone.items():
        r = old.range_of(s)
        lo_ok = cons.le(r.min, v) is Tri.YES
        hi_ok = r.max is None or cons.le(v, r.max) is Tri.YES
        conds = ([] if lo_ok else [sympy.Le(r.min, v)]) + ([] if hi_ok else [sympy.Le(v, r.max)])
        if conds:
            out.append((sympy.And(*conds), f"{s.name} = {v} must stay in its declared range {r}"))
    for r, why in cons.residual():
        out.append((sympy.Eq(r, 0), f"{r} == 0, implied by {why}"))
    return out


def _canon(cons: ShapeConstraints, v: Any) -> Any:
    if isinstance(v, sympy.Basic):
        return v.xreplace(cons.eliminated()) if isinstance(v, sympy.logic.boolalg.Boolean) else cons.canonical(v)
    if isinstance(v, tuple):
        return tuple(_canon(cons, x) for x in v)
    return v


def _type(cons: ShapeConstraints, t: TensorType) -> TensorType:
    return TensorType(t.dtype, tuple(cons.canonical(d) for d in t.shape))


def _param(cons: ShapeConstraints, x: Param) -> Param:
    return dataclasses.replace(x, type=_type(cons, x.type))


def _node(cons: ShapeConstraints, n: Node) -> Node:
    attrs = n.attrs
    if dataclasses.is_dataclass(attrs):
        changes = {f.name: _canon(cons, getattr(attrs, f.name)) for f in dataclasses.fields(attrs)}
        attrs = dataclasses.replace(attrs, **changes)
    return dataclasses.replace(n, type=_type(cons, n.type), attrs=attrs)
