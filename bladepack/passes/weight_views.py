"""Pass: a reshape of a weight is a weight of the new shape.

In: a `Program`. Out: the same program where each reshape whose input is a weight (or a reshape
folded here) read by nothing else becomes a weight holding the same data in the reshape's shape,
under the original weight's name; the original weight goes (dead code elimination).

Note [Weight views]: the passes that pack a weight for a kernel (`direct_conv`, `channels_last`,
`dense_layers`) recognize a weight by its operand being a graph weight. A model that hands its weight
to a functional op through views reaches the IR as reshapes between them: Mamba's and Mamba-2's
mixers call `causal_conv1d_fn(x, self.conv1d.weight.squeeze(1))`, whose torch fallback unsqueezes it
again for `F.conv1d`, so the depthwise convolution of every Mamba layer read `reshape(reshape(W))`
and ran as one BLAS GEMM per channel (1 x (L + 3) x 4, 1792 of them) plus an im2col. A reshape keeps
the bytes in order, so the folded weight's data is the original's, reshaped, and keeping the name
lets the artifact store those bytes once for the plan and the source program (Note [Derived source
weights] in artifact/writer.py). Only a weight with no other reader is folded: a second shape of a
weight other ops still read would store it twice.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bladepack.ir import GraphBuilder, Node, OpKind, Program, rebuild_graph
from bladepack.ir.types import TensorType
from bladepack.passes.dce import dead_code_elimination


def weight_views(p: Program) -> Program:
    g = p.graph
    readers: dict[int, int] = {}
    for n in g.nodes:
        for i in set(n.inputs):
            readers[i] = readers.get(i, 0) + 1
    for o in g.outputs:
        readers[o] = readers.get(o, 0) + 1
    names = {w.id: w.name for w in g.weights}  # weights, and the reshapes folded into weights
    for n in g.nodes:
        src = n.inputs[0] if n.inputs else -1
        if (
            n.op is OpKind.RESHAPE
            and src in names
            and readers.get(src) == 1
            and all(isinstance(d, int) for d in n.type.shape)
        ):
            names[n.id] = names[src]
    folds = set(names) - {w.id for w in g.weights}
    if not folds:
        return p
    data = dict(p.weight_data)

    def fold(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        if n.id not in folds:
            return None
        name = names[n.id]
        data[name] = np.asarray(data[name]).reshape(tuple(int(d) for d in n.type.shape))
        return b.add_weight(name, TensorType(n.type.dtype, n.type.shape))

    graph = rebuild_graph(g, fold)
    return dead_code_elimination(dataclasses.replace(p, graph=graph, weight_data=data))
