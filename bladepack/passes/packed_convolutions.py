"""What `direct_conv` and `winograd_conv` share: convolutions reading their weight packed for a kernel.

In: a `Program` and, per convolution (node id) whose constant weight in torch's layout a pass has
chosen, its packed layout (opset/packed_weights.py). Out: the program with each chosen convolution
reading a new constant weight NAME.LAYOUT in that layout (`Conv2dAttrs.weight_layout`), one copy per
original weight and layout however many convolutions read it, and the original dropped, with its data,
when nothing else reads it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from bladepack.ir import GraphBuilder, Node, Program, rebuild_graph
from bladepack.ir.ops import Conv2dAttrs
from bladepack.ir.types import TensorType
from bladepack.opset import packed_weights
from bladepack.passes.dce import dead_code_elimination


def pack_convolution_weights(p: Program, layouts: Mapping[int, str]) -> Program:
    g = p.graph
    weights = {w.id: w for w in g.weights}
    data = dict(p.weight_data)
    packed: dict[tuple[int, str], int] = {}  # (original weight, layout) -> its packed copy (convolutions may share one)

    def pack(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        layout = layouts.get(n.id)
        if layout is None:
            return None
        assert isinstance(n.attrs, Conv2dAttrs)
        w = weights[n.inputs[1]]
        if (w.id, layout) not in packed:
            name = f"{w.name}.{layout}"
            data[name] = packed_weights.pack(layout, np.asarray(p.weight_data[w.name]))
            shape = packed_weights.packed_shape(layout, tuple(int(d) for d in w.type.shape))
            packed[(w.id, layout)] = b.add_weight(name, TensorType(w.type.dtype, shape))
        attrs = dataclasses.replace(n.attrs, weight_layout=layout)
        return b.add(n.op, (ins[0], packed[(w.id, layout)]), n.type, attrs, n.loc)

    graph = rebuild_graph(g, pack)
    # the original weights nothing reads any more go, with their data
    return dead_code_elimination(dataclasses.replace(p, graph=graph, weight_data=data))
