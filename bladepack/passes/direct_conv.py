"""Pass: small convolutions run as a direct kernel on weights packed at optimize time.

In: a `Program` after `decompose` (bias-free convolutions). Out: each convolution with groups 1, at
most 64 output channels and at most 1152 taps per output (C_in * KH * KW), whose weight is a constant,
reads a new constant weight packed [C_in, KH, KW, C_out] (`weight_layout="ihwo"`); the original weight
is dropped when nothing else reads it.

Note [Direct convolution]: for small images and channel counts, im2col + GEMM is dominated by the
column buffer and by BLAS call overhead (a 16 x 96 x 144 GEMM). The direct kernel (codegen
`_direct_conv_kernel`) keeps a tile of output pixels x all output channels in registers, walks the
taps, and reads each tap's C_out weights as one contiguous vector — which is why the weights are
packed output-channel-last, once, here. 1x1 stride-1 unpadded convolutions stay GEMMs on x itself;
larger convolutions are left to `channels_last` (Note [Wide convolutions]) on the CPU, and to im2col +
GEMM elsewhere.
"""

from __future__ import annotations

from bladepack.ir import Node, OpKind, Program
from bladepack.ir.ops import Conv2dAttrs
from bladepack.ir.types import TensorType
from bladepack.passes.packed_convolutions import pack_convolution_weights

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
    types = p.graph.value_types()
    weight_ids = {w.id for w in p.graph.weights}
    chosen = {n.id: "ihwo" for n in p.graph.nodes if _packs(n, types, weight_ids)}
    return pack_convolution_weights(p, chosen) if chosen else p
