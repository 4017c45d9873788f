"""Pass: convolutions whose batch may exceed 1 produce channel-major results, so one GEMM covers the batch.

In: a `Program` whose convolutions (after `decompose`, bias-free) yield NCHW results. Out: each
convolution with groups 1 that goes through im2col and whose batch dim is not the constant 1 becomes
`conv2d(out_layout="cnhw")` with dims [C_out, N, OH, OW], followed by a permute back to NCHW.

Note [Batch-folded convolution]: per image, a convolution is W [C_out, C*KH*KW] @ cols [C*KH*KW, OH*OW];
at small images that GEMM is tiny and BLAS call overhead dominates (measured: 32 x 12 x 288 GEMMs run at
a quarter of the large-GEMM rate). With the im2col columns laid out [C*KH*KW, N, OH*OW], the whole
batch is one GEMM whose result is [C_out, N*OH*OW]. The permute is a layout op: the consumers (batch
norm, activation, residual) read it through an index map, so no copy is made unless the value is a
graph output.
"""

from __future__ import annotations

import dataclasses

from bladepack.ir import GraphBuilder, Node, OpKind, Program, rebuild_graph
from bladepack.ir.ops import Conv2dAttrs, PermuteAttrs
from bladepack.ir.types import TensorType


def _folds(n: Node, types: dict[int, TensorType]) -> bool:
    a = n.attrs
    if n.op is not OpKind.CONV2D or not isinstance(a, Conv2dAttrs):
        return False
    direct = a.stride == (1, 1) and a.padding == (0, 0) and tuple(types[n.inputs[1]].shape[2:]) == (1, 1)
    return (
        a.out_layout == "nchw"
        and a.weight_layout == "oihw"
        and a.groups == 1
        and not a.has_bias
        and not direct
        and n.type.shape[0] != 1
    )


def conv_layout(p: Program) -> Program:
    g = p.graph
    types = g.value_types()
    if not any(_folds(n, types) for n in g.nodes):
        return p

    def fold(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        if not _folds(n, types):
            return None
        assert isinstance(n.attrs, Conv2dAttrs)
        nb, oc, oh, ow = n.type.shape
        cm_type = TensorType(n.type.dtype, (oc, nb, oh, ow))
        cm = b.add(n.op, ins, cm_type, dataclasses.replace(n.attrs, out_layout="cnhw"), n.loc)
        return b.add(OpKind.PERMUTE, (cm,), n.type, PermuteAttrs((1, 0, 2, 3)), n.loc)

    return dataclasses.replace(p, graph=rebuild_graph(g, fold))
