"""Pass: 3x3 stride-1 convolutions of 64 channels and more compute by Winograd's F(2x2, 3x3).

In: a `Program` after `decompose` (bias-free convolutions). Out: each float32 convolution with groups 1,
a 3x3 constant weight, stride 1, dilation 1 and at least MIN_CHANNELS input and output channels reads a
new constant weight packed "winograd" (the filters' transforms G g G^T in blocks of output channels:
opset/packed_weights.py); the original weight is dropped when nothing else reads it. `channels_last`
then makes each such convolution channels-last, and the CPU emitter gives it the kernel of Note
[Winograd convolutions] (codegen/cpu_conv_winograd.py). A layout pass: CPU plans only. Runs before
`direct_conv`, which would otherwise pack the 64-channel ones for its own kernel.

Measured on ResNet-18's 3x3 convolutions (bench/results/zoo_resnet18.md): below MIN_CHANNELS the
transforms, linear in the channels, are not paid for by the products, quadratic in them (the CNN
sample's 16- and 32-channel convolutions on images of a few pixels were as fast or slower).
"""

from __future__ import annotations

from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind, Program
from bladepack.ir.ops import Conv2dAttrs
from bladepack.ir.types import TensorType
from bladepack.passes.packed_convolutions import pack_convolution_weights

MIN_CHANNELS = 64
MAX_CHANNEL_PAIRS = 256 * 256  # C_in x C_out: transformed weights of at most 4 MB


def _eligible(n: Node, types: dict[int, TensorType], weights: set[int]) -> bool:
    a = n.attrs
    if n.op is not OpKind.CONV2D or not isinstance(a, Conv2dAttrs) or a.weight_layout != "oihw":
        return False
    if a.groups != 1 or a.has_bias or a.out_layout != "nchw" or n.inputs[1] not in weights:
        return False
    if a.stride != (1, 1) or a.dilation != (1, 1):
        return False
    if n.type.dtype is not DType.FLOAT32 or types[n.inputs[0]].dtype is not DType.FLOAT32:
        return False
    oc, cin, kh, kw = types[n.inputs[1]].shape
    if not all(isinstance(d, int) for d in (oc, cin)) or (kh, kw) != (3, 3):
        return False
    assert isinstance(oc, int) and isinstance(cin, int)
    return oc >= MIN_CHANNELS and cin >= MIN_CHANNELS and oc * cin <= MAX_CHANNEL_PAIRS


def winograd_conv(p: Program) -> Program:
    types = p.graph.value_types()
    weight_ids = {w.id for w in p.graph.weights}
    chosen = {n.id for n in p.graph.nodes if _eligible(n, types, weight_ids)}
    return pack_convolution_weights(p, chosen, "winograd") if chosen else p
