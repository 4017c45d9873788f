"""aten → IR: convolutions — conv1d (as a height-1 conv2d), conv2d, and transposed convolution
(as a stride-1 convolution of the zero-stuffed input, Note [Transposed convolution]).

In: an FX node's args. Out: CONV2D nodes, with the PADs, RESHAPEs and optimize-time weight
transforms they need.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bladepack.export.context import Ctx, Unsupported, Value, arg, converts
from bladepack.export.ops_layout import reshape
from bladepack.ir import OpKind, TensorType
from bladepack.ir.ops import Conv2dAttrs, PadAttrs
from bladepack.ir.views import simplify

K = OpKind


def pair(v: Any, name: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    v = list(v)
    if len(v) == 1:
        return (int(v[0]), int(v[0]))
    if len(v) != 2 or not all(isinstance(x, int) for x in v):
        raise Unsupported(f"{name}={v!r} (2-D convolution and pooling take one or two ints)")
    return (v[0], v[1])


def _conv(ctx: Ctx, x: Any, w: Any, b: Any, stride: Any, padding: Any, dilation: Any, groups: int) -> Value:
    xv, wv = ctx.v(x), ctx.v(w)
    if ctx.t(xv).rank == 3:
        return _conv1d_as_2d(ctx, xv, wv, b, stride, padding, dilation, groups)
    return _conv_values(ctx, xv, wv, b, stride, padding, dilation, groups, ctx.out_type())


def _conv1d_as_2d(
    ctx: Ctx, xv: Value, wv: Value, b: Any, stride: Any, padding: Any, dilation: Any, groups: int
) -> Value:
    """conv1d (Whisper, wav2vec-style front ends, depthwise 1-D) as a conv2d of height 1: the input
    viewed as [N, C, 1, L], the kernel as [O, C / groups, 1, K] (a weight of that shape when the kernel
    is a weight, so layout passes see a parameter), the result viewed back."""
    out = ctx.out_type()
    n, c, length = ctx.t(xv).shape
    x4 = reshape(ctx, xv, (n, c, 1, length))
    wt = ctx.t(wv)
    o, ci, k = wt.shape
    name = weight_name(ctx, wv)
    if name is not None:
        w4_name = f"{name}:as2d"
        if w4_name not in ctx.weight_data:
            ctx.weight_data[w4_name] = ctx.weight_data[name].reshape(o, ci, 1, k)
        w4 = ctx.b.add_weight(w4_name, TensorType(wt.dtype, (o, ci, 1, k)))
    else:
        w4 = reshape(ctx, wv, (o, ci, 1, k))

    def one(v: Any, name: str, default: int) -> Any:  # "valid" / "same" pass through
        if v in ("valid", "same"):
            return v
        (q,) = [v] if isinstance(v, int) else list(v)
        if not isinstance(q, int):
            raise Unsupported(f"{name}={v!r} (conv1d takes one int)")
        return (default, q)

    y4 = _conv_values(
        ctx,
        x4,
        w4,
        b,
        one(stride, "stride", 1),
        one(padding, "padding", 0),
        one(dilation, "dilation", 1),
        groups,
        TensorType(out.dtype, (out.shape[0], out.shape[1], 1, out.shape[2])),
    )
    return reshape(ctx, y4, out.shape)


def _conv_values(
    ctx: Ctx,
    xv: Value,
    wv: Value,
    b: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    groups: int,
    out: TensorType,
) -> Value:
    if ctx.t(xv).rank != 4:
        raise Unsupported(f"convolution of rank {ctx.t(xv).rank} input (conv1d and conv2d are supported)")
    kh, kw = ctx.t(wv).shape[2], ctx.t(wv).shape[3]
    dil = pair(dilation, "dilation")
    if padding == "valid":
        pad = (0, 0)
    elif padding == "same":
        if not (isinstance(kh, int) and isinstance(kw, int)):
            raise Unsupported("padding='same' with a symbolic kernel")
        total = (dil[0] * (kh - 1), dil[1] * (kw - 1))
        if total[0] % 2 or total[1] % 2:
            raise Unsupported("padding='same' with an even kernel extent (asymmetric padding)")
        pad = (total[0] // 2, total[1] // 2)
    else:
        pad = pair(padding, "padding")
    inputs = [xv, wv] + ([ctx.v(b)] if b is not None else [])
    attrs = Conv2dAttrs(pair(stride, "stride"), pad, dil, int(groups), b is not None)
    return ctx.emit(K.CONV2D, inputs, out, attrs)


@converts("aten.conv2d.default", "aten.conv2d.padding", "aten.conv1d.default", "aten.conv1d.padding")
def _conv2d(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    a = [
        arg(args, kwargs, i, n, d)
        for i, (n, d) in enumerate(
            [
                ("input", None),
                ("weight", None),
                ("bias", None),
                ("stride", 1),
                ("padding", 0),
                ("dilation", 1),
                ("groups", 1),
            ]
        )
    ]
    return _conv(ctx, *a)


@converts("aten.convolution.default")
def _convolution(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    if transposed:
        return _conv_transpose(ctx, x, w, b, stride, padding, output_padding, groups, dilation)
    return _conv(ctx, x, w, b, stride, padding, dilation, groups)


@converts("aten.conv_transpose2d.input", "aten.conv_transpose1d.default")
def _conv_transpose_op(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Value:
    names = [("input", None), ("weight", None), ("bias", None), ("stride", 1), ("padding", 0)]
    names += [("output_padding", 0), ("groups", 1), ("dilation", 1)]
    return _conv_transpose(ctx, *[arg(args, kwargs, i, n, d) for i, (n, d) in enumerate(names)])


def _conv_transpose(
    ctx: Ctx, x: Any, w: Any, b: Any, stride: Any, padding: Any, output_padding: Any, groups: Any, dilation: Any
) -> Value:
    """Note [Transposed convolution]: conv_transpose(x, w) with stride s, padding p, output padding q
    and dilation d is the plain convolution (stride 1, dilation d) of x with s - 1 zeros stuffed
    between its pixels, padded by d (k - 1) - p before and that plus q after, with the kernel flipped
    and its in / out channels swapped per group (done on the weight at optimize time). The stuffed
    zeros cost s² the multiply-adds of a scatter formulation; in exchange the op reuses the tuned
    convolution kernels. Padding larger than d (k - 1) (a cropping transposed conv) is refused."""
    xv, wv = ctx.v(x), ctx.v(w)
    out = ctx.out_type()
    one_d = ctx.t(xv).rank == 3

    def two(v: Any, name: str, default: int) -> tuple[int, int]:
        if one_d:
            (q,) = [v] if isinstance(v, int) else list(v)
            return (default, int(q))
        return pair(v, name)

    s, p, q, d = (
        two(stride, "stride", 1),
        two(padding, "padding", 0),
        two(output_padding, "output_padding", 0),
        two(dilation, "dilation", 1),
    )
    g = int(groups)
    name = weight_name(ctx, wv)
    if name is None:
        raise Unsupported(
            "transposed convolution with a computed weight (only a weight can be flipped at optimize time)"
        )
    wt = ctx.weight_data[name]
    if one_d:
        wt = wt[:, :, None, :]
    cin, cout_g, kh, kw = wt.shape
    k = (kh, kw)
    lo = tuple(d[a] * (k[a] - 1) - p[a] for a in range(2))
    if min(lo) < 0:
        raise Unsupported(f"transposed convolution with padding {p} beyond dilation * (kernel - 1)")
    flipped = wt.reshape(g, cin // g, cout_g, kh, kw).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
    w_name = f"{name}:transposed"
    if w_name not in ctx.weight_data:
        ctx.weight_data[w_name] = np.ascontiguousarray(flipped.reshape(g * cout_g, cin // g, kh, kw))
    wconv = ctx.b.add_weight(w_name, TensorType(ctx.t(wv).dtype, (g * cout_g, cin // g, kh, kw)))
    t = ctx.t(xv)
    n, c, h, wd = (t.shape[0], t.shape[1], 1, t.shape[2]) if one_d else t.shape
    x4 = reshape(ctx, xv, (n, c, h, wd))
    if s != (1, 1):  # zeros between pixels: [N, C, H, 1, W, 1] padded to [N, C, H, sh, W, sw]
        x6 = reshape(ctx, x4, (n, c, h, 1, wd, 1))
        pads6 = ((0, 0), (0, 0), (0, 0), (0, s[0] - 1), (0, 0), (0, s[1] - 1))
        stuffed = TensorType(t.dtype, (n, c, h, s[0], wd, s[1]))
        x6 = ctx.emit(K.PAD, (x6,), stuffed, PadAttrs(pads6, 0.0))
        hs, ws = simplify(h * s[0]), simplify(wd * s[1])
        x4 = reshape(ctx, x6, (n, c, hs, ws))
        h, wd = hs, ws
    # the stuffing left s - 1 trailing zeros; the rest of the padding comes before and after
    hi = tuple(lo[a] + q[a] - (s[a] - 1) for a in range(2))
    if min(hi) < 0:
        raise Unsupported(f"transposed convolution with output_padding {q} below stride - 1 at padding {p}")
    ph, pw = simplify(h + lo[0] + hi[0]), simplify(wd + lo[1] + hi[1])
    padded = ctx.emit(
        K.PAD,
        (x4,),
        TensorType(t.dtype, (n, c, ph, pw)),
        PadAttrs(((0, 0), (0, 0), (lo[0], hi[0]), (lo[1], hi[1])), 0.0),
    )
    out4 = TensorType(out.dtype, (out.shape[0], out.shape[1], 1, out.shape[2])) if one_d else out
    y = _conv_values(ctx, padded, wconv, b, (1, 1), (0, 0), d, g, out4)
    return reshape(ctx, y, out.shape)


def weight_name(ctx: Ctx, v: Value) -> str | None:
    for p in ctx.b.weights:
        if p.id == v:
            return p.name
    return None
