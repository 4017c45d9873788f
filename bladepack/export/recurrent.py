"""torch's recurrent layers (nn.LSTM, nn.GRU, nn.RNN) kept whole through torch.export.

In: a model whose submodules may be recurrent layers. Out: `recurrent_layers(model)`, a context in
which those layers export as one `bladepack::recurrent_layer` node per layer and direction, and the
converter of that node to IR (ir/recurrent.py).

Note [Recurrent layers through export]: torch.export traces nn.LSTM's decomposition, a Python loop
over the sample's steps, so the sequence length becomes a constant (the export of a dynamic `seq`
fails, "specialized to be a constant"). Inside `recurrent_layers` each such module's forward is
replaced (on the instance, restored afterwards) by the same computation written over a custom op
with a fake (meta) kernel: export keeps one node per layer and direction whose result shapes are
symbolic, and the layer stacking, bidirectional concatenation, batch_first transposes and the
stacked final states around it are ordinary traced ops. The op's eager kernel (the same cell
equations, step by step) runs only where the exported program itself is run (the dim probe);
reference cases come from the unpatched model. Packed sequences are refused by name.

Note [LSTM projections]: an LSTM with proj_size P carries h = W_hr (o * tanh c) [P] between steps, so
its gates read h_{t-1} W_hh^T = (o * tanh c)_{t-1} W_hr^T W_hh^T: the RECURRENT kernel runs over the
unprojected state with R = W_hr^T W_hh^T [H, G*H] (computed at optimize time in float64), h0 0, and the
first step's h0 W_hh^T added to that step's input projection; y and h_n are the unprojected states
times W_hr^T, one GEMM over all steps. The recurrence then does H / P times the product's work of a
kernel that projected every step, in exchange for no change to the kernel.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import sympy
import torch

from bladepack.errors import ExportError
from bladepack.export.context import Ctx, Unsupported, arg, converts
from bladepack.export.ops_conv import weight_name
from bladepack.ir import OpKind, TensorType
from bladepack.ir.ops import RECURRENT_GATES, ConstantAttrs, MatmulAttrs, PermuteAttrs, RecurrentAttrs
from bladepack.ir.recurrent import MAX_RECURRENT_HIDDEN, LayerWeights, recurrent_layer


@torch.library.custom_op("bladepack::recurrent_layer", mutates_args=())
def _layer_op(
    x: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor | None,
    b_hh: torch.Tensor | None,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    cell: str,
    reverse: bool,
    w_hr: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One direction of one layer, sequence-major: x [S, B, I] -> (y [S, B, H], h_n, c_n); c_n is
    zeros for cells without a cell state. `w_hr` [P, H]: an LSTM's projection (h is W_hr (o * tanh c),
    y and h_n are [.., P])."""
    hid = w_hh.shape[0] // RECURRENT_GATES[cell]
    xg = x @ w_ih.t() + (b_ih if b_ih is not None else 0)
    h, c = h0, c0
    ys: list[torch.Tensor] = [h0] * x.shape[0]
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    for t in steps:
        hg = h @ w_hh.t() + (b_hh if b_hh is not None else 0)
        g = xg[t]
        if cell == "lstm":
            assert c is not None
            i, f, z, o = (g[:, k * hid : (k + 1) * hid] + hg[:, k * hid : (k + 1) * hid] for k in range(4))
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(z)
            h = torch.sigmoid(o) * torch.tanh(c)
            if w_hr is not None:
                h = h @ w_hr.t()
        elif cell == "gru":
            r = torch.sigmoid(g[:, :hid] + hg[:, :hid])
            u = torch.sigmoid(g[:, hid : 2 * hid] + hg[:, hid : 2 * hid])
            n = torch.tanh(g[:, 2 * hid :] + r * hg[:, 2 * hid :])
            h = (1 - u) * n + u * h
        else:
            a = g + hg
            h = torch.tanh(a) if cell == "rnn_tanh" else torch.relu(a)
        ys[t] = h
    c_n = c.clone() if c is not None else torch.zeros_like(h0)
    return torch.stack(ys), h.clone(), c_n


@_layer_op.register_fake
def _(
    x: torch.Tensor,
    w_ih: torch.Tensor,
    w_hh: torch.Tensor,
    b_ih: torch.Tensor | None,
    b_hh: torch.Tensor | None,
    h0: torch.Tensor,
    c0: torch.Tensor | None,
    cell: str,
    reverse: bool,
    w_hr: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    c_shape = c0.shape if c0 is not None else h0.shape
    return x.new_empty((x.shape[0], x.shape[1], h0.shape[-1])), h0.new_empty(h0.shape), h0.new_empty(c_shape)


def _cell(m: torch.nn.RNNBase) -> str:
    if isinstance(m, torch.nn.LSTM):
        return "lstm"
    if isinstance(m, torch.nn.GRU):
        return "gru"
    return "rnn_relu" if getattr(m, "nonlinearity", "tanh") == "relu" else "rnn_tanh"


def _forward(m: torch.nn.RNNBase) -> Any:
    """nn.LSTM / GRU / RNN's forward (eval mode) over `_layer_op`."""
    cell = _cell(m)
    lstm = cell == "lstm"

    def forward(input: Any, hx: Any = None) -> Any:
        name = type(m).__name__
        if isinstance(input, torch.nn.utils.rnn.PackedSequence):
            raise ExportError(f"{name} over a PackedSequence (pass the padded tensor; bladepack has no packed input)")
        proj = int(getattr(m, "proj_size", 0) or 0)
        batched = input.dim() == 3
        x = input if batched else input.unsqueeze(1)
        if batched and m.batch_first:
            x = x.transpose(0, 1)
        dirs = 2 if m.bidirectional else 1
        hid = m.hidden_size
        if hx is None:
            zeros = x.new_zeros((m.num_layers * dirs, x.shape[1], hid))
            h0, c0 = (
                (x.new_zeros((m.num_layers * dirs, x.shape[1], proj)) if proj else zeros),
                (zeros if lstm else None),
            )
        else:
            h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
            if not batched:
                h0, c0 = h0.unsqueeze(1), (c0.unsqueeze(1) if c0 is not None else None)
        hs, cs = [], []
        for layer in range(m.num_layers):
            outs = []
            for d in range(dirs):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                k = layer * dirs + d
                y, h, c = torch.ops.bladepack.recurrent_layer(
                    x,
                    getattr(m, "weight_ih" + sfx),
                    getattr(m, "weight_hh" + sfx),
                    getattr(m, "bias_ih" + sfx) if m.bias else None,
                    getattr(m, "bias_hh" + sfx) if m.bias else None,
                    h0[k],
                    c0[k] if c0 is not None else None,
                    cell,
                    bool(d),
                    getattr(m, "weight_hr" + sfx) if proj else None,
                )
                outs.append(y)
                hs.append(h)
                if lstm:
                    cs.append(c)
            x = outs[0] if dirs == 1 else torch.cat(outs, dim=2)
        out = x.transpose(0, 1) if batched and m.batch_first else x
        h_n = torch.stack(hs)
        if not batched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
        if not lstm:
            return out, h_n
        c_n = torch.stack(cs)
        return out, (h_n, c_n if batched else c_n.squeeze(1))

    return forward


_LAYERS = (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)


@contextlib.contextmanager
def recurrent_layers(model: torch.nn.Module) -> Iterator[None]:
    """Note [Recurrent layers through export]: the recurrent submodules' forwards over the custom op."""
    patched = [m for m in model.modules() if isinstance(m, torch.nn.RNNBase) and type(m) in _LAYERS]
    for m in patched:
        m.forward = _forward(m)
    try:
        yield
    finally:
        for m in patched:
            del m.forward


def _transposed(ctx: Ctx, w: int) -> int:
    """W_hh^T: a weight's data transposed at optimize time (the kernel reads its rows contiguously);
    a computed weight through a permute."""
    t = ctx.t(w)
    shape = (t.shape[1], t.shape[0])
    name = weight_name(ctx, w)
    if name is None:
        return ctx.emit(OpKind.PERMUTE, (w,), TensorType(t.dtype, shape), PermuteAttrs((1, 0)))
    return ctx.derived_weight(f"{name}:t", t.dtype, lambda: ctx.weight_data[name].T)


@converts("bladepack.recurrent_layer.default")
def _recurrent_layer(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
    x, w_ih, w_hh = (ctx.v(a) for a in args[:3])
    b_ih, b_hh, h0, c0 = (arg(args, kwargs, k, n) for k, n in ((3, "b_ih"), (4, "b_hh"), (5, "h0"), (6, "c0")))
    cell, reverse = str(arg(args, kwargs, 7, "cell")), bool(arg(args, kwargs, 8, "reverse"))
    w_hr = arg(args, kwargs, 9, "w_hr", None)
    xt = ctx.t(x)
    dt = xt.dtype
    hid = ctx.t(w_hh).shape[0] // RECURRENT_GATES[cell]
    if not isinstance(hid, int) or hid > MAX_RECURRENT_HIDDEN:
        raise Unsupported(f"a recurrent layer of hidden size {hid} (at most {MAX_RECURRENT_HIDDEN})")
    if not dt.is_floating or any(ctx.t(v).dtype is not dt for v in (w_ih, w_hh)):
        raise Unsupported(f"a recurrent layer over {dt.value} with {ctx.t(w_ih).dtype.value} weights")
    steps = xt.shape[0]
    if not isinstance(steps, int):
        ctx.assume(sympy.Ge(steps, 1), f"{ctx.loc}: a recurrent layer needs at least one step")
    cols = RECURRENT_GATES[cell] * hid
    rb = ctx.v(b_hh) if b_hh is not None else ctx.emit(OpKind.FULL, (), TensorType(dt, (cols,)), ConstantAttrs(0.0))
    attrs = RecurrentAttrs(cell, hid, reverse)
    if w_hr is not None:
        return _projected(ctx, x, w_ih, ctx.v(b_ih) if b_ih is not None else None, w_hh, ctx.v(w_hr), rb, h0, c0, attrs)
    w = LayerWeights(w_ih, ctx.v(b_ih) if b_ih is not None else None, _transposed(ctx, w_hh), rb)
    y, h, c = recurrent_layer(ctx, x, w, ctx.v(h0), ctx.v(c0) if c0 is not None else None, attrs)
    return y, h, c


def _projected(
    ctx: Ctx, x: int, w_ih: int, b_ih: int | None, w_hh: int, w_hr: int, rb: int, h0: Any, c0: Any, a: RecurrentAttrs
) -> tuple[int, int, int]:
    """Note [LSTM projections]: one direction of an LSTM with proj_size."""
    dt, hid = ctx.t(x).dtype, a.hidden
    batch = ctx.t(x).shape[1]
    cols = RECURRENT_GATES[a.cell] * hid
    proj = ctx.t(w_hr).shape[0]
    hh, hr = weight_name(ctx, w_hh), weight_name(ctx, w_hr)
    if hh is not None and hr is not None:  # R = (W_hh W_hr)^T, [H, G*H], at optimize time
        data = ctx.weight_data
        r = ctx.derived_weight(
            f"{hh}:{hr}:projected",
            dt,
            lambda: (data[hh].astype(np.float64) @ data[hr].astype(np.float64)).T.astype(data[hh].dtype),
        )
    else:  # computed weights: the product at run time
        prod = ctx.emit(OpKind.MATMUL, (w_hh, w_hr), TensorType(dt, (cols, hid)), MatmulAttrs(False))
        r = ctx.emit(OpKind.PERMUTE, (prod,), TensorType(dt, (hid, cols)), PermuteAttrs((1, 0)))
    first = ctx.emit(OpKind.MATMUL, (ctx.v(h0), w_hh), TensorType(dt, (batch, cols)), MatmulAttrs(True))
    w = LayerWeights(w_ih, b_ih, r, rb)
    zeros = ctx.emit(OpKind.FULL, (), TensorType(dt, (batch, hid)), ConstantAttrs(0.0))
    c_init = ctx.v(c0) if c0 is not None else zeros
    full, h, c = recurrent_layer(ctx, x, w, zeros, c_init, a, first_input=first)
    steps = ctx.t(x).shape[0]
    y = ctx.emit(OpKind.MATMUL, (full, w_hr), TensorType(dt, (steps, batch, proj)), MatmulAttrs(True))
    h = ctx.emit(OpKind.MATMUL, (h, w_hr), TensorType(dt, (batch, proj)), MatmulAttrs(True))
    assert c is not None
    return y, h, c
