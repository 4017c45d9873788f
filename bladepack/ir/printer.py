"""Deterministic text form of a graph (used for dumps and golden tests).

In: a `Graph` (and optionally its `ShapeEnv`). Out: text such as

    symbols { batch: [1, 64] }
    graph(%0 x: f32[batch, 16]) weights(%1 fc.weight: f32[32, 16]) {
      %2: f32[batch, 32] = matmul(%0, %1) {transpose_b=True}
      return %2
    }
"""

from __future__ import annotations

import dataclasses

from bladepack.ir.graph import Graph, Node
from bladepack.ir.shape_env import ShapeEnv
from bladepack.ir.types import dim_str


def _attr_text(v: object) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(_attr_text(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, (bool, int, str)) or v is None:
        return repr(v) if isinstance(v, str) else str(v)
    return dim_str(v)


def node_text(n: Node, with_loc: bool = False) -> str:
    args = ", ".join(f"%{i}" for i in n.inputs)
    fields = dataclasses.fields(n.attrs)
    attrs = ", ".join(f"{f.name}={_attr_text(getattr(n.attrs, f.name))}" for f in fields)
    text = f"%{n.id}: {n.type} = {n.op.value}({args})" + (f" {{{attrs}}}" if attrs else "")
    if n.guard:
        text += " if " + " and ".join(f"{'' if c.taken else 'not '}%{c.pred}" for c in n.guard)
    if with_loc and n.loc:
        text += f"  # {n.loc}"
    return text


def print_graph(g: Graph, env: ShapeEnv | None = None, with_loc: bool = False) -> str:
    lines = []
    if env is not None and env.symbols:
        syms = ", ".join(f"{s.name}: {env.range_of(s)}" for s in env.symbols)
        lines.append(f"symbols {{ {syms} }}")
    ins = ", ".join(f"%{p.id} {p.name}: {p.type}" for p in g.inputs)
    ws = ", ".join(f"%{p.id} {p.name}: {p.type}" for p in g.weights)
    lines.append(f"graph({ins})" + (f" weights({ws})" if ws else "") + " {")
    lines.extend("  " + node_text(n, with_loc) for n in g.nodes)
    outs = ", ".join(f"%{o}" for o in g.outputs)
    lines.append(f"  return {outs}")
    lines.append("}")
    return "\n".join(lines) + "\n"
