"""Pass: chains of direct convolutions, pooling and elementwise ops compute in channels-last order.

In: a `Program` after `direct_conv` (convolutions on weights packed "ihwo"). Out: each direct
convolution, each depthwise convolution, each wider groups-1 one (Note [Wide convolutions] in
codegen/cpu_conv_wide.py: its weight packed in blocks of output channels) and each pointwise (1x1) one
whose input is already channels-last (all on weights packed here), and each pooling, elementwise op or
global pooling (sum /
mean / max / min over H and W) that reads a value so converted, computes with dims [N, H, W, C]
(`out_layout="nhwc"` on convolutions, `layout="nhwc"` on pooling, axes (1, 2) on reductions). A
direct convolution whose elementwise chain ends at a graph output stays NCHW (it stores NCHW itself, no
copy at the exit), and so does a pointwise one there that widens (Note [Pointwise exits]). A permute to
NCHW follows each converted value that a consumer outside the chain reads, and one from NCHW precedes a
convolution whose input is not channels-last. Other operands of a
converted elementwise op (a batch norm's per-channel [C, 1, 1] scale) are read through a reshape to
rank 4 and the same permute; an elementwise op with a whole NCHW operand stays NCHW and reads the
channels-last one through its permute.

Note [Channels-last chains]: in NCHW order a convolution's register tile (pixels x output channels,
channels in the vector lanes) is stored transposed, one scalar per output, and its epilogue is scalar
too; pooling vectorizes along a row, which at the widths dynamic-shape CNNs see (1-32) leaves its
vector loops in their scalar remainders. Channels-last, a pixel's channels are contiguous: the tile
stores whole vectors with a vectorized epilogue, pooling combines whole vectors of channels whatever
the width, and a convolution reading a channels-last input tiles any run of output pixels (rows
included), so a width of 1 does not leave the tile's pixels idle. The permutes are layout ops: they
cost nothing unless a consumer needs a copy (a graph output, a reshape of a non-contiguous view), so
the layout is converted once at the chain's edges. This is MLAS's / oneDNN's NCHWc blocking with one
block per pixel: for the channel counts of the CNNs served here (up to 64) a block of all channels is
what NCHWc's inner block would hold. CPU plans only: the CUDA kernels index NCHW.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bladepack.ir import GraphBuilder, Node, OpKind, Program, rebuild_graph
from bladepack.ir.ops import OP_INFO, Conv2dAttrs, OpClass, PermuteAttrs, Pool2dAttrs, ReduceAttrs
from bladepack.ir.types import TensorType
from bladepack.opset import packed_weights
from bladepack.passes.dce import dead_code_elimination

MAX_DEPTHWISE_TAPS = 64  # kernels up to 8 x 8 (the kernel keeps a pointer per tap and pixel)
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def _nhwc(t: TensorType) -> TensorType:
    n, c, h, w = t.shape
    return TensorType(t.dtype, (n, h, w, c))


def _direct_conv(n: Node) -> bool:
    a = n.attrs
    return (
        n.op is OpKind.CONV2D
        and isinstance(a, Conv2dAttrs)
        and a.weight_layout == "ihwo"
        and a.out_layout == "nchw"
        and a.groups == 1
        and not a.has_bias
    )


def _packable(n: Node, types: dict[int, TensorType], weights: set[int]) -> str | None:
    """ "depthwise" (groups = C_in, C_out a multiple of it: MobileNet's, and its channel-multiplying
    downsamplers), "pointwise" (1x1, stride 1, unpadded, groups 1) or "wide" (groups 1, more channels
    or taps than `direct_conv` takes: Note [Wide convolutions]) for a convolution on a constant weight
    in torch's layout that this pass packs [C_in/groups, KH, KW, C_out] for the channels-last kernel
    itself (`direct_conv` leaves them: im2col per group, a GEMM on the input, im2col + GEMM), else
    None."""
    a = n.attrs
    if n.op is not OpKind.CONV2D or not isinstance(a, Conv2dAttrs) or a.weight_layout != "oihw":
        return None
    if a.has_bias or a.out_layout != "nchw" or n.inputs[1] not in weights:
        return None
    oc, cg, kh, kw = types[n.inputs[1]].shape
    if not all(isinstance(d, int) for d in (oc, cg, kh, kw)):
        return None
    if a.groups > 1 and cg == 1 and oc % a.groups == 0 and kh * kw <= MAX_DEPTHWISE_TAPS:
        return "depthwise"
    if a.groups == 1 and (kh, kw) == (1, 1) and a.stride == (1, 1) and a.padding == (0, 0):
        return "pointwise"
    if a.groups == 1 and kh * kw <= MAX_DEPTHWISE_TAPS:  # what direct_conv left: Note [Wide convolutions]
        return "wide"
    return None


def _winograd(n: Node) -> bool:
    """A convolution `winograd_conv` packed (Note [Winograd convolutions]): its kernels are channels-last."""
    a = n.attrs
    return n.op is OpKind.CONV2D and isinstance(a, Conv2dAttrs) and a.weight_layout in ("winograd", "hwio_winograd")


def _pool(n: Node) -> bool:
    return n.op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D) and isinstance(n.attrs, Pool2dAttrs)


def _elementwise(n: Node) -> bool:
    cls = OP_INFO[n.op].op_class
    return (
        cls in (OpClass.ELEMENTWISE, OpClass.BROADCAST)
        and n.op not in (OpKind.CONSTANT, OpKind.FULL, OpKind.EXPAND)
        and n.type.rank == 4
    )


def stores_an_output(conv: Node, nodes: dict[int, Node], users: dict[int, list[int]], outputs: set[int]) -> bool:
    """Whether the elementwise chain after `conv` (single users of its shape, what its epilogue would
    compute) ends at a graph output: that convolution stores NCHW itself rather than leave a copy."""
    v = conv.id
    while v not in outputs and len(users.get(v, ())) == 1:
        u = nodes[users[v][0]]
        if not _elementwise(u) or u.type.shape != conv.type.shape:
            break
        v = u.id
    return v in outputs


def _widens(conv: Node, types: dict[int, TensorType]) -> bool:
    """Whether a convolution has more output channels than input channels.

    Note [Pointwise exits]: a pointwise convolution on a channels-last input whose chain ends at a graph
    output is either a GEMM that stores NCHW, after a copy of its input to NCHW (C_in channels) and
    with its epilogue (a batch norm, a residual) a pass of its own, or a channels-last kernel with the
    epilogue fused, whose output (C_out channels) is copied to NCHW at the exit. Where C_out <= C_in the
    second copies less and fuses the rest: a MobileNet inverted residual ending the model (64 -> 16
    channels with a batch norm and the residual; bench.peak's block at 8 x 48 x 48 on a Zen 4 EPYC) took
    1573 -> 1020 µs in the AVX2 library and 1232 -> 860 µs in the AVX-512 one, the 64-channel permute
    alone having been 750 µs. A widening one (24 -> 40) keeps the GEMM, whose input copy is the
    narrower."""
    oc, cg = types[conv.inputs[1]].shape[:2]
    return isinstance(oc, int) and isinstance(cg, int) and oc > cg  # pointwise: groups 1


def _spatial_reduction(n: Node) -> bool:
    """A sum / mean / max / min over H and W of an NCHW value (a global pooling)."""
    a = n.attrs
    return (
        n.op in (OpKind.SUM, OpKind.MEAN, OpKind.AMAX, OpKind.AMIN)
        and isinstance(a, ReduceAttrs)
        and sorted(ax % 4 for ax in a.axes) == [2, 3]
    )


def channels_last(p: Program) -> Program:
    g = p.graph
    nodes, users = {n.id: n for n in g.nodes}, g.users()
    outputs = set(g.outputs)
    types = g.value_types()
    weights = {w.id: w for w in g.weights}
    weight_ids = set(weights)
    packs = {n.id: k for n in g.nodes if (k := _packable(n, types, weight_ids)) is not None}
    convs = {n.id for n in g.nodes if _direct_conv(n) and not stores_an_output(n, nodes, users, outputs)}
    # depthwise and wide convolutions always (their other plans are a GEMM per channel, and im2col +
    # GEMM); pointwise ones where their input is channels-last already and their chain does not end
    # at an output (else one GEMM)
    convs |= {v for v, k in packs.items() if k in ("depthwise", "wide")}
    convs |= {n.id for n in g.nodes if _winograd(n)}  # the only kernel of their packed weight
    if not convs:
        return p
    data = dict(p.weight_data)
    packed: dict[tuple[int, str], int] = {}  # (original weight, layout) -> its packed copy

    def pack(b: GraphBuilder, w_id: int, layout: str) -> int:
        """The weight in `layout`: [C_in/groups, KH, KW, C_out] ("ihwo"), or that in panels of 16 output
        channels ("tap_panels": Note [Weight panels] in codegen/cpu_conv_wide.py)."""
        if (w_id, layout) not in packed:
            w = weights[w_id]
            name = f"{w.name}.{layout}"
            data[name] = packed_weights.pack(layout, np.asarray(p.weight_data[w.name]))
            shape = packed_weights.packed_shape(layout, tuple(int(d) for d in w.type.shape))
            packed[(w_id, layout)] = b.add_weight(name, TensorType(w.type.dtype, shape))
        return packed[(w_id, layout)]

    # the channels-last version of a value of the new graph, keyed by its NCHW version (the permute)
    nhwc_of: dict[int, int] = {}

    def to_nhwc(b: GraphBuilder, v: int, t: TensorType, loc: str) -> int:
        """v's channels-last version: its own, or a permute of it (after a reshape to rank 4)."""
        if v in nhwc_of:
            return nhwc_of[v]
        if t.rank < 4:
            t4 = TensorType(t.dtype, (1,) * (4 - t.rank) + tuple(t.shape))
            v, t = b.add(OpKind.RESHAPE, (v,), t4, loc=loc), t4
        return b.add(OpKind.PERMUTE, (v,), _nhwc(t), PermuteAttrs(TO_NHWC), loc)

    def ok(v: int, old: int) -> bool:
        """An operand a converted elementwise op may take: channels-last, a scalar, or constant along
        N, H and W (a per-channel scale); a whole NCHW tensor keeps the op NCHW (no copy)."""
        shape = (1,) * (4 - types[old].rank) + tuple(types[old].shape)
        return v in nhwc_of or types[old].rank == 0 or all(d == 1 for k, d in enumerate(shape) if k != 1)

    def convert(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        pointwise = packs.get(n.id) == "pointwise" and ins[0] in nhwc_of
        if pointwise and stores_an_output(n, nodes, users, outputs) and _widens(n, types):
            pointwise = False  # Note [Pointwise exits]
        if n.id in convs or pointwise:
            assert isinstance(n.attrs, Conv2dAttrs)
            x = to_nhwc(b, ins[0], types[n.inputs[0]], n.loc)
            layout = "tap_panels" if packs.get(n.id) == "wide" else "ihwo"
            if _winograd(n):
                layout = n.attrs.weight_layout
            w = ins[1] if n.id not in packs else pack(b, n.inputs[1], layout)
            attrs = dataclasses.replace(n.attrs, out_layout="nhwc", weight_layout=layout)
            y = b.add(n.op, (x, w, *ins[2:]), _nhwc(n.type), attrs, n.loc)
        elif _pool(n) and ins[0] in nhwc_of and isinstance(n.type.shape[1], int):
            assert isinstance(n.attrs, Pool2dAttrs)
            attrs_p = dataclasses.replace(n.attrs, layout="nhwc")
            y = b.add(n.op, (nhwc_of[ins[0]],), _nhwc(n.type), attrs_p, n.loc)
        elif _elementwise(n) and any(i in nhwc_of for i in ins) and all(ok(i, o) for i, o in zip(ins, n.inputs)):
            xs = tuple(i if types[o].rank == 0 else to_nhwc(b, i, types[o], n.loc) for i, o in zip(ins, n.inputs))
            y = b.add(n.op, xs, _nhwc(n.type), n.attrs, n.loc)
        elif _spatial_reduction(n) and ins[0] in nhwc_of:
            assert isinstance(n.attrs, ReduceAttrs)
            x = nhwc_of[ins[0]]
            if not n.attrs.keepdim:  # [N, C] either way
                return b.add(n.op, (x,), n.type, ReduceAttrs((1, 2), False), n.loc)
            y = b.add(n.op, (x,), _nhwc(n.type), ReduceAttrs((1, 2), True), n.loc)
        else:
            return None
        back = b.add(OpKind.PERMUTE, (y,), n.type, PermuteAttrs(TO_NCHW), n.loc)
        nhwc_of[back] = y
        return back

    graph = rebuild_graph(g, convert)
    # the original weights nothing reads any more go, with their data
    return dead_code_elimination(dataclasses.replace(p, graph=graph, weight_data=data))
