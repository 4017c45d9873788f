"""Pass: a unary elementwise op applied after reshapes / permutes of a value is applied to the value
itself, the reshapes / permutes after it.

In: a Program. Out: the same program where each unary elementwise op (GELU, ReLU, a cast, ...) whose
input is a chain of RESHAPE / PERMUTE nodes over a computed value, each read by nothing else and none
a graph output, reads that value directly; the chain is rebuilt over its result, in its type.

Note [Layout sinking]: a 1-D convolution is a 2-D one between reshapes, and on CPU between permutes
too (Note [Channels-last chains]): Whisper's `gelu(conv1d(x))` became conv (channels-last) → permute
to NCW → gelu → permute back → the next conv. The GELU, behind the permute, could not join the
convolution's epilogue (Note [Convolution epilogue]); it was a kernel of its own that read the
convolution's output transposed, element by element, and wrote a layout the next convolution then read
with strided loads. Applied before the layout chain, the GELU is in the convolution's store, and the
chain, permute then inverse permute, is a plain view of it for the next consumer. The op computes the
same values on the same number of elements, so nothing else changes: a consumer that needs the
permuted layout in memory gets the copy it would have read anyway, with the op computed inline.
Whisper's encoder at batch 16: its two GELU kernels (75 and 38 µs) are gone.
"""

from __future__ import annotations

import dataclasses

from bladepack.ir import Node, OpKind, Program
from bladepack.ir.graph import GraphBuilder, rebuild_graph
from bladepack.ir.ops import OP_INFO, OpClass
from bladepack.ir.types import TensorType
from bladepack.passes.dce import dead_code_elimination

_CHAIN = (OpKind.RESHAPE, OpKind.PERMUTE)


def sink_layout(p: Program) -> Program:
    g = p.graph
    nodes = {n.id: n for n in g.nodes}
    users: dict[int, int] = {}
    for n in g.nodes:
        for i in dict.fromkeys(n.inputs):
            users[i] = users.get(i, 0) + 1
    outputs = set(g.outputs)

    def chain(v: int) -> tuple[int, list[Node]] | None:
        """(the computed value, the layout nodes from it to v) when v is such a chain over it."""
        links: list[Node] = []
        while v in nodes and nodes[v].op in _CHAIN and users.get(v, 0) == 1 and v not in outputs:
            links.append(nodes[v])
            v = nodes[v].inputs[0]
        if not links or v not in nodes or not any(n.op is OpKind.PERMUTE for n in links):
            return None
        return v, links[::-1]

    moves: dict[int, tuple[int, list[Node]]] = {}  # elementwise op -> its chain
    for n in g.nodes:
        if OP_INFO[n.op].op_class is OpClass.ELEMENTWISE and len(n.inputs) == 1:
            found = chain(n.inputs[0])
            if found is not None:
                moves[n.id] = found
    if not moves:
        return p
    bases = {base for base, _ in moves.values()}
    new_id: dict[int, int] = {}  # each base's value in the new graph

    def rewrite(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        if n.id in moves:
            base, links = moves[n.id]
            out = b.add(n.op, (new_id[base],), TensorType(n.type.dtype, nodes[base].type.shape), n.attrs, n.loc)
            for link in links:
                out = b.add(link.op, (out,), TensorType(n.type.dtype, link.type.shape), link.attrs, link.loc)
        elif n.id in bases:
            out = b.add(n.op, ins, n.type, n.attrs, n.loc)
        else:
            return None
        if n.id in bases:  # a moved op may itself be the base of another
            new_id[n.id] = out
        return out

    graph = rebuild_graph(g, rewrite)
    return dead_code_elimination(dataclasses.replace(p, graph=graph))
