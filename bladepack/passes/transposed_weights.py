"""Pass: a product with a transposed 2-D weight reads the weight transposed: `x @ W.T` → matmul(x, W,
transpose_b=True).

In: a Program. Out: the same program where each matmul (transpose_b False) whose second operand is
`permute(W, (1, 0))` of a 2-D weight W reads W itself with transpose_b True; a permute left unread goes.

Note [Transposed weights]: nn.Linear's product reaches the IR as `matmul(x, W, transpose_b=True)` (the
weight as stored, [N, K]), but a model that writes the product itself (Falcon's `FalconLinear`:
`input @ self.weight.T`) gives a permute of the weight between them. The dense-layer pass (Note
[Dense layers]) recognizes a linear layer by its weight operand, so these stayed BLAS GEMMs with the
activation, bias and residual in separate loop kernels; read as nn.Linear's form they are the same
linear layers. The zoo's Falcon at 16 x 64 tokens: its eight GEMMs (36-137 µs each) become dense
kernels; the call 1116 -> 723 µs (OpenVINO 1.04x -> 1.49x, ONNX Runtime 1.41x -> 2.08x).
"""

from __future__ import annotations

import dataclasses

from bladepack.ir import Node, OpKind, Program
from bladepack.ir.graph import GraphBuilder, rebuild_graph
from bladepack.ir.ops import MatmulAttrs, PermuteAttrs
from bladepack.passes.dce import dead_code_elimination


def transposed_weights(p: Program) -> Program:
    g = p.graph
    nodes = {n.id: n for n in g.nodes}
    weights = {w.id for w in g.weights}

    def weight_of(v: int) -> int | None:
        """W when v is permute(W, (1, 0)) of a 2-D weight."""
        n = nodes.get(v)
        if n is None or n.op is not OpKind.PERMUTE or not isinstance(n.attrs, PermuteAttrs):
            return None
        w = n.inputs[0]
        return w if w in weights and tuple(n.attrs.perm) == (1, 0) else None

    found = {
        n.id: w
        for n in g.nodes
        if n.op is OpKind.MATMUL
        and isinstance(n.attrs, MatmulAttrs)
        and not n.attrs.transpose_b
        and (w := weight_of(n.inputs[1])) is not None
    }
    if not found:
        return p

    names = {w.id: w.name for w in g.weights}

    def rewrite(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        if n.id not in found:
            return None
        assert isinstance(n.attrs, MatmulAttrs)
        w = next(prm.id for prm in b.weights if prm.name == names[found[n.id]])  # W in the new graph
        return b.add(n.op, (ins[0], w), n.type, dataclasses.replace(n.attrs, transpose_b=True), n.loc)

    graph = rebuild_graph(g, rewrite)
    return dead_code_elimination(dataclasses.replace(p, graph=graph))
