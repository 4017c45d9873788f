"""Pass: 3x3 stride-1 convolutions of 16 channels and more compute by Winograd's F(2x2, 3x3).

In: a `Program` after `decompose` (bias-free convolutions). Out: each float32 convolution with groups 1,
a 3x3 constant weight, stride 1 and dilation 1 reads a new constant weight (opset/packed_weights.py),
the original dropped when nothing else reads it: with at least MIN_CHANNELS input and output channels
packed "winograd" (the filters' transforms G g G^T in blocks of output channels; Note [Winograd
convolutions] in codegen/cpu_conv_winograd.py); with MIN_PAIRED_CHANNELS to CHANNEL_BLOCK output
channels and at least MIN_PAIRED_CHANNELS input channels, what `direct_conv` would take, packed
"hwio_winograd" (the filter and its transform, for a kernel with a direct and a Winograd variant chosen
per call: Note [Winograd at few channels]). `channels_last` then makes each such convolution
channels-last. A layout pass: CPU plans only. Runs before `direct_conv`, which would otherwise pack
them for its own kernel.

Measured on ResNet-18's 3x3 convolutions (bench/results/zoo_resnet18.md): the transforms, linear in the
channels, are paid for by the products, quadratic in them, from 64 channels on at every image size; from
16 channels on only where the image holds enough tiles, hence the paired weight below 64.
"""

from __future__ import annotations

from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind, Program
from bladepack.ir.ops import CHANNEL_BLOCK, Conv2dAttrs
from bladepack.ir.types import TensorType
from bladepack.passes.channels_last import stores_an_output
from bladepack.passes.direct_conv import MAX_TAPS
from bladepack.passes.packed_convolutions import pack_convolution_weights

MIN_CHANNELS = 64
MIN_PAIRED_CHANNELS = 16  # Note [Winograd at few channels]
MAX_CHANNEL_PAIRS = 256 * 256  # C_in x C_out: transformed weights of at most 4 MB


def _layout(n: Node, types: dict[int, TensorType], weights: set[int], stores_output: bool) -> str | None:
    """The packed layout of a convolution this pass takes ("winograd" or "hwio_winograd"), else None;
    `stores_output`: its epilogue chain ends at a graph output."""
    a = n.attrs
    if n.op is not OpKind.CONV2D or not isinstance(a, Conv2dAttrs) or a.weight_layout != "oihw":
        return None
    if a.groups != 1 or a.has_bias or a.out_layout != "nchw" or n.inputs[1] not in weights:
        return None
    if a.stride != (1, 1) or a.dilation != (1, 1):
        return None
    if n.type.dtype is not DType.FLOAT32 or types[n.inputs[0]].dtype is not DType.FLOAT32:
        return None
    oc, cin, kh, kw = types[n.inputs[1]].shape
    if not isinstance(oc, int) or not isinstance(cin, int) or (kh, kw) != (3, 3):
        return None
    if oc >= MIN_CHANNELS and cin >= MIN_CHANNELS and oc * cin <= MAX_CHANNEL_PAIRS:
        return "winograd"
    if MIN_PAIRED_CHANNELS <= oc <= CHANNEL_BLOCK and cin >= MIN_PAIRED_CHANNELS and cin * 9 <= MAX_TAPS:
        # the direct kernel's convolutions (passes/direct_conv.py), but not one that stores NCHW itself
        # (passes/channels_last.py): a channels-last kernel's output would take a copy at the exit
        return None if stores_output else "hwio_winograd"
    return None


def winograd_conv(p: Program) -> Program:
    g = p.graph
    types, weight_ids, outputs = g.value_types(), {w.id for w in g.weights}, set(g.outputs)
    nodes, users = {n.id: n for n in g.nodes}, g.users()
    layouts = {
        n.id: lay for n in g.nodes if (lay := _layout(n, types, weight_ids, stores_an_output(n, nodes, users, outputs)))
    }
    return pack_convolution_weights(p, layouts) if layouts else p
