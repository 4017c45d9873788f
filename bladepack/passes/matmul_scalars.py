"""Scalar factors of a matmul's operands move onto its product: (a·x) @ (b·y) → (x @ y)·a·b.

In: a Program. Out: the same program where a matmul operand that is `mul(x, c)` (c a literal constant
of one element, or a reshape of one; the mul read by nothing else), directly or under layout ops, is
replaced by x (under the same layout ops) and the product is multiplied by c.

Why: ONNX exporters write scaled dot-product attention as `(q·√s) @ (kᵀ·√s)` (torchscript's sdpa
symbolic), so the scaled K — a layout chain over the KV cache that attention would read in place, GQA
repeat included — becomes a computed value that must be stored first, and the fused attention (Note
[Fused attention]) would be one kernel and one copy where the torch front end's plan has one kernel.
After the move, both front ends give the same plan: the scale is part of the scores' chain. The
product is rounded differently (one multiply per score instead of one per operand element): the same
size of difference as torch's own `scale` placement choices, within every numerics test's bound.
"""

from __future__ import annotations

import dataclasses

from bladepack.ir import Node, OpKind, Program
from bladepack.ir.graph import GraphBuilder, rebuild_graph
from bladepack.ir.ops import ConstantAttrs
from bladepack.ir.views import LAYOUT_OPS
from bladepack.passes.dce import dead_code_elimination


def _scalar(n: Node | None, nodes: dict[int, Node]) -> bool:
    """n is a literal constant of one element, or a reshape of one (ONNX writes `Reshape(Constant)`)."""
    while n is not None and n.op is OpKind.RESHAPE and all(d == 1 for d in n.type.shape):
        n = nodes.get(n.inputs[0])
    return (
        n is not None
        and n.op is OpKind.CONSTANT
        and not n.inputs
        and isinstance(n.attrs, ConstantAttrs)
        and isinstance(n.attrs.value, (int, float))
        and not isinstance(n.attrs.value, bool)
        and all(d == 1 for d in n.type.shape)
    )


def matmul_scalars(p: Program) -> Program:
    g = p.graph
    nodes = {n.id: n for n in g.nodes}
    types = g.value_types()
    users: dict[int, int] = {}
    for n in g.nodes:
        for i in n.inputs:
            users[i] = users.get(i, 0) + 1
    outputs = set(g.outputs)

    def split(v: int, rank: int) -> tuple[int, int, int] | None:
        """(the mul, position of x, position of c) when operand v is mul(x, c), or a layout chain over
        one (a scalar factor commutes with reshape / permute / slice / expand), for a one-element
        constant c of rank <= the product's, x of the mul's own type, each value read only once."""
        while v in nodes and nodes[v].op in LAYOUT_OPS and users.get(v, 0) == 1 and v not in outputs:
            v = nodes[v].inputs[0]
        n = nodes.get(v)
        if n is None or n.op is not OpKind.MUL or users.get(v, 0) != 1 or v in outputs:
            return None
        for kx, kc in ((0, 1), (1, 0)):
            c = nodes.get(n.inputs[kc])
            if _scalar(c, nodes) and c is not None and c.type.rank <= rank and types[n.inputs[kx]] == n.type:
                return v, kx, kc
        return None

    muls: dict[int, tuple[int, int]] = {}  # the muls that go: (position of x, position of c)
    moved: dict[int, list[int]] = {}  # matmul -> the muls its product takes over
    for n in g.nodes:
        if n.op is OpKind.MATMUL:
            for v in dict.fromkeys(n.inputs):
                s = split(v, n.type.rank)
                if s is not None:
                    muls[s[0]] = s[1:]
                    moved.setdefault(n.id, []).append(s[0])
    if not moved:
        return p
    scale: dict[int, int] = {}  # mul -> its constant in the new graph

    def rewrite(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        if n.id in muls:
            kx, kc = muls[n.id]
            scale[n.id] = ins[kc]
            return ins[kx]
        if n.id not in moved:
            return None
        out = b.add(n.op, ins, n.type, n.attrs, n.loc)
        for m in moved[n.id]:
            out = b.add(OpKind.MUL, (out, scale[m]), n.type, loc=n.loc)
        return out

    graph = rebuild_graph(g, rewrite)
    return dead_code_elimination(dataclasses.replace(p, graph=graph))
