"""Decompose ops whose pieces fuse better apart: a convolution's bias becomes an add after it.

In: an IR `Program`. Out: the same program where every conv2d with a bias is a bias-free conv2d
followed by `add(conv, reshape(bias, [C, 1, 1]))`. The GEMM computes the convolution and the add joins
the generated kernel that consumes it (with a folded batch norm and the activation), as a GEMM epilogue.
"""

from __future__ import annotations

import dataclasses

from bladepack.ir import GraphBuilder, OpKind, Program
from bladepack.ir.ops import Conv2dAttrs
from bladepack.ir.types import TensorType


def decompose(p: Program) -> Program:
    g = p.graph
    if not any(n.op is OpKind.CONV2D and isinstance(n.attrs, Conv2dAttrs) and n.attrs.has_bias for n in g.nodes):
        return p
    b = GraphBuilder()
    remap: dict[int, int] = {}
    for prm in g.inputs:
        remap[prm.id] = b.add_input(prm.name, prm.type)
    for prm in g.weights:
        remap[prm.id] = b.add_weight(prm.name, prm.type)
    for n in g.nodes:
        ins = tuple(remap[i] for i in n.inputs)
        if n.op is OpKind.CONV2D and isinstance(n.attrs, Conv2dAttrs) and n.attrs.has_bias:
            conv = b.add(n.op, ins[:2], n.type, dataclasses.replace(n.attrs, has_bias=False), n.loc)
            bias_t = b.types[ins[2]]
            col = b.add(OpKind.RESHAPE, (ins[2],), TensorType(bias_t.dtype, (bias_t.shape[0], 1, 1)), loc=n.loc)
            remap[n.id] = b.add(OpKind.ADD, (conv, col), n.type, loc=n.loc)
        else:
            remap[n.id] = b.add(n.op, ins, n.type, n.attrs, n.loc)
    graph = b.finish(tuple(remap[o] for o in g.outputs), g.output_names)
    return dataclasses.replace(p, graph=graph)
