"""Pass: small convolutions run as a direct kernel on weights packed at optimize time.

In: a `Program` after `decompose` (bias-free convolutions). Out: each convolution with groups 1, at
most 64 output channels and at most 1152 taps per output (C_in * KH * KW), whose weight is a constant,
reads a new constant weight packed [C_in, KH, KW, C_out] (`weight_layout="ihwo"`); the original weight
is dropped when nothing else reads it.

Note [Direct convolution]: for small images and channel counts, im2col + GEMM is dominated by the
column buffer and by BLAS call overhead (a 16 x 96 x 144 GEMM). The direct kernel (codegen
`_direct_conv_kernel`) keeps a tile of output pixels x all output channels in registers, walks the
taps, and reads each tap's C_out weights as one contiguous vector — which is why the weights are
packed output-channel-last, once, here. 1x1 stride-1 unpadded convolutions stay GEMMs on x itself.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bladepack.ir import GraphBuilder, Node, OpKind, Program
from bladepack.ir.ops import Conv2dAttrs
from bladepack.ir.types import TensorType

MAX_OUT_CHANNELS = 64
MAX_TAPS = 1152


def _packs(n: Node, types: dict[int, TensorType], weights: set[int]) -> bool:
    a = n.attrs
    if n.op is not OpKind.CONV2D or not isinstance(a, Conv2dAttrs) or a.weight_layout != "oihw":
        return False
    if a.groups != 1 or a.has_bias or a.out_layout != "nchw" or n.inputs[1] not in weights:
        return False
    oc, cin, kh, kw = types[n.inputs[1]].shape
    if not all(isinstance(d, int) for d in (oc, cin, kh, kw)):
        return False
    pointwise = (kh, kw) == (1, 1) and a.stride == (1, 1) and a.padding == (0, 0)
    return not pointwise and oc <= MAX_OUT_CHANNELS and cin * kh * kw <= MAX_TAPS


def direct_conv(p: Program) -> Program:
    g = p.graph
    types = g.value_types()
    weight_ids = {w.id for w in g.weights}
    chosen = {n.id for n in g.nodes if _packs(n, types, weight_ids)}
    if not chosen:
        return p
    by_id = {w.id: w for w in g.weights}
    packed_of = {n.inputs[1] for n in g.nodes if n.id in chosen}
    still_read = {i for n in g.nodes if n.id not in chosen for i in n.inputs} | set(g.outputs)
    b = GraphBuilder()
    remap: dict[int, int] = {}
    data = dict(p.weight_data)
    for prm in g.inputs:
        remap[prm.id] = b.add_input(prm.name, prm.type)
    for prm in g.weights:
        if prm.id not in packed_of or prm.id in still_read:
            remap[prm.id] = b.add_weight(prm.name, prm.type)
    packed: dict[int, int] = {}
    for wid in sorted(packed_of):
        w = by_id[wid]
        name = f"{w.name}.ihwo"
        data[name] = np.ascontiguousarray(np.asarray(p.weight_data[w.name]).transpose(1, 2, 3, 0))
        oc, cin, kh, kw = w.type.shape
        packed[wid] = b.add_weight(name, TensorType(w.type.dtype, (cin, kh, kw, oc)))
        if wid not in still_read:
            del data[w.name]
    for n in g.nodes:
        if n.id in chosen:
            assert isinstance(n.attrs, Conv2dAttrs)
            ins = (remap[n.inputs[0]], packed[n.inputs[1]])
            remap[n.id] = b.add(n.op, ins, n.type, dataclasses.replace(n.attrs, weight_layout="ihwo"), n.loc)
        else:
            remap[n.id] = b.add(n.op, tuple(remap[i] for i in n.inputs), n.type, n.attrs, n.loc)
    graph = b.finish(tuple(remap[o] for o in g.outputs), g.output_names)
    return dataclasses.replace(p, graph=graph, weight_data=data)
