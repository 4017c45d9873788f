"""Decompose ops whose pieces fuse better apart: a convolution's bias becomes an add after it.

In: an IR `Program`. Out: the same program where every conv2d with a bias is a bias-free conv2d
followed by `add(conv, reshape(bias, [C, 1, 1]))`. The GEMM computes the convolution and the add joins
the generated kernel that consumes it (with a folded batch norm and the activation), as a GEMM epilogue.
"""

from __future__ import annotations

import dataclasses

from bladepack.ir import GraphBuilder, Node, OpKind, Program, rebuild_graph
from bladepack.ir.ops import Conv2dAttrs
from bladepack.ir.types import TensorType


def decompose(p: Program) -> Program:
    g = p.graph
    if not any(_biased_conv(n) for n in g.nodes):
        return p

    def split_bias(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        if not _biased_conv(n):
            return None
        assert isinstance(n.attrs, Conv2dAttrs)
        conv = b.add(n.op, ins[:2], n.type, dataclasses.replace(n.attrs, has_bias=False), n.loc)
        bias_t = b.types[ins[2]]
        col = b.add(OpKind.RESHAPE, (ins[2],), TensorType(bias_t.dtype, (bias_t.shape[0], 1, 1)), loc=n.loc)
        return b.add(OpKind.ADD, (conv, col), n.type, loc=n.loc)

    return dataclasses.replace(p, graph=rebuild_graph(g, split_bias))


def _biased_conv(n: Node) -> bool:
    return n.op is OpKind.CONV2D and isinstance(n.attrs, Conv2dAttrs) and n.attrs.has_bias
