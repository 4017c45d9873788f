"""Dead code elimination.

In: a `Program`. Out: the same program without nodes that no output depends on, and without
weights nothing reads.
"""

from __future__ import annotations

import dataclasses

from bladepack.ir import Program


def dead_code_elimination(p: Program) -> Program:
    g = p.graph
    live = set(g.outputs)
    for n in reversed(g.nodes):
        if n.id in live:
            live.update(n.inputs)
            live.update(c.pred for c in n.guard)
    nodes = tuple(n for n in g.nodes if n.id in live)
    weights = tuple(w for w in g.weights if w.id in live)
    graph = dataclasses.replace(g, nodes=nodes, weights=weights)
    data = {w.name: p.weight_data[w.name] for w in weights}
    return dataclasses.replace(p, graph=graph, weight_data=data)
