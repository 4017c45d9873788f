"""ONNX LSTM, GRU and RNN: each direction one recurrent layer in IR (ir/recurrent.py).

In: the node's X, W, R and optional B, sequence_lens, initial_h, initial_c (LSTM also P) and its
attributes. Out: Y [S, D, B, H] (layout 1: [B, S, D, H]), Y_h and (LSTM) Y_c [D, B, H] (layout 1:
[B, D, H]).

Note [ONNX recurrent weights]: ONNX orders the gates LSTM i, o, f, c and GRU z, r, h; the RECURRENT
op takes torch's order (Note [Recurrent cells] in opset/attrs.py), so each direction's W, R and B rows
are permuted by blocks and R is transposed: at optimize time for initializers and constants, as every
exporter writes them; weights given at run time become slices, a concat and a permute that the GEMM
and the kernel read through (correct, slower). What the kernels do not compute is
refused by name: activations other than the defaults (LSTM Sigmoid / Tanh / Tanh, GRU Sigmoid /
Tanh, RNN Tanh or Relu), clip and input_forget. sequence_lens, known or given at run time, makes each
sequence stop at its own length (Note [Recurrent lengths] in ir/recurrent.py): Y is 0 past it, Y_h and
Y_c are the states at its last step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sympy

from bladepack.dtypes import DType
from bladepack.ir import OpKind, TensorType
from bladepack.ir.ops import RECURRENT_GATES, AxisAttrs, ConstantAttrs, PermuteAttrs, RecurrentAttrs, SliceAttrs
from bladepack.ir.recurrent import MAX_RECURRENT_HIDDEN, LayerWeights, recurrent_layer
from bladepack.ir.types import IRDim
from bladepack.onnx_import.context import OnnxCtx, OVal, Unsupported, arg, converts, known, need, text

K = OpKind
# block b of torch's gate order is block _ORDER[cell][b] of ONNX's (Note [ONNX recurrent weights]);
# an LSTM's peepholes P are i, o, f in ONNX, i, f, o in the RECURRENT op
_ORDER = {"lstm": (0, 2, 3, 1), "gru": (1, 0, 2), "rnn": (0,), "peephole": (0, 2, 1)}
_ACTIVATIONS = {"lstm": ["Sigmoid", "Tanh", "Tanh"], "gru": ["Sigmoid", "Tanh"]}


def _gates(a: np.ndarray, cell: str, hid: int) -> np.ndarray:
    """Rows (axis 0) of one direction's W, R or half of B in torch's gate order."""
    return np.concatenate([a[k * hid : (k + 1) * hid] for k in _ORDER[cell]], axis=0)


def _direction(ctx: OnnxCtx, v: OVal, d: int, start: int, cols: int, cell: str, hid: int, transpose: bool) -> int:
    """Rows [start, start + cols) of direction d of W, R or B ([D, rows, ...]) in torch's gate order
    (Note [ONNX recurrent weights]), transposed for R: at optimize time when the weights are known,
    else as slices, a concat and a permute the kernels read through."""
    order = _ORDER[cell]
    if v.numeric is not None:
        a = _gates(v.numeric[d, start : start + cols], cell, hid)
        return ctx.tensor(known(np.ascontiguousarray(a.T if transpose else a)))
    dt, rest = v.type.dtype, tuple(v.type.shape[2:])
    flat = ctx.reshape(
        ctx.emit(K.SLICE, (ctx.tensor(v),), TensorType(dt, (1, *v.type.shape[1:])), SliceAttrs(0, d, 1)),
        v.type.shape[1:],
    )
    blocks = [
        ctx.emit(K.SLICE, (flat,), TensorType(dt, (hid, *rest)), SliceAttrs(0, start + k * hid, 1)) for k in order
    ]
    rows = blocks[0] if len(blocks) == 1 else ctx.emit(K.CONCAT, blocks, TensorType(dt, (cols, *rest)), AxisAttrs(0))
    if not transpose:
        return rows
    return ctx.emit(K.PERMUTE, (rows,), TensorType(dt, (*rest, cols)), PermuteAttrs((1, 0)))


def _cell(ctx: OnnxCtx, op: str, dirs: int) -> str:
    acts = [text(a) for a in (ctx.attr("activations") or [])]
    if op == "RNN":
        kinds = {a.lower() for a in acts} or {"tanh"}
        if len(kinds) != 1 or not kinds <= {"tanh", "relu"}:
            raise Unsupported(f"RNN with activations {acts} (Tanh or Relu, the same in both directions)")
        return "rnn_" + kinds.pop()
    want = _ACTIVATIONS[op.lower()] * dirs
    if acts and [a.lower() for a in acts] != [a.lower() for a in want]:
        raise Unsupported(f"{op} with activations {acts} (only the defaults {want[: len(want) // dirs]})")
    return op.lower()


def _state(ctx: OnnxCtx, v: OVal | None, d: int, batch: IRDim, hid: int, dt: DType, layout: int) -> int:
    """Direction d's initial state [B, H] from [D, B, H] (layout 1: [B, D, H]); zeros when absent."""
    t = TensorType(dt, (batch, hid))
    if v is None:
        return ctx.emit(K.FULL, (), t, ConstantAttrs(0.0))
    axis = 1 if layout else 0
    shape = list(v.type.shape)
    shape[axis] = 1
    part = ctx.emit(K.SLICE, (ctx.tensor(v),), TensorType(v.type.dtype, tuple(shape)), SliceAttrs(axis, d, 1))
    return ctx.reshape(part, (batch, hid))


def _stack(ctx: OnnxCtx, parts: Sequence[int], axis: int) -> int:
    """Values of one shape stacked along a new `axis`."""
    t = ctx.t(parts[0])
    one = [ctx.reshape(p, (*t.shape[:axis], 1, *t.shape[axis:])) for p in parts]
    if len(one) == 1:
        return one[0]
    shape = (*t.shape[:axis], len(one), *t.shape[axis:])
    return ctx.emit(K.CONCAT, one, TensorType(t.dtype, shape), AxisAttrs(axis))


@converts("LSTM", "GRU", "RNN", foldable=False)
def _recurrent(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    assert ctx.node is not None
    op = ctx.node.op_type
    x = need(ins, 0, "X")
    direction = ctx.text("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        raise Unsupported(f"{op} with direction {direction!r} (forward, reverse or bidirectional)")
    dirs = 2 if direction == "bidirectional" else 1
    cell = _cell(ctx, op, dirs)
    for name in ("clip",) + (("input_forget",) if op == "LSTM" else ()):
        if ctx.attr(name):
            raise Unsupported(f"{op} with {name}={ctx.attr(name)}")
    if ctx.attr("activation_alpha") or ctx.attr("activation_beta"):
        raise Unsupported(f"{op} with activation_alpha / activation_beta")
    layout = int(ctx.attr("layout", 0))
    w, r = need(ins, 1, "W"), need(ins, 2, "R")
    hid = int(ctx.attr("hidden_size", r.type.shape[-1]))
    if hid > MAX_RECURRENT_HIDDEN:
        raise Unsupported(f"{op} of hidden size {hid} (at most {MAX_RECURRENT_HIDDEN})")
    cols = RECURRENT_GATES[cell] * hid
    b = arg(ins, 3) or known(np.zeros((dirs, 2 * cols), dtype=w.type.dtype.to_numpy()))
    peep = arg(ins, 7) if op == "LSTM" else None
    seq = x.type.shape[1 if layout else 0]
    batch = x.type.shape[0 if layout else 1]
    lens = arg(ins, 4)
    lengths = None  # Note [Recurrent lengths]: sequences shorter than the input, or given at run time
    if lens is not None and not (
        lens.numeric is not None and all(isinstance(seq, int) and int(n) == seq for n in lens.numeric.ravel())
    ):
        lengths = ctx.reshape(ctx.cast(ctx.tensor(lens), DType.INT64), (batch,))
    dt = x.type.dtype
    if not dt.is_floating or w.type.dtype is not dt or r.type.dtype is not dt or b.type.dtype is not dt:
        raise Unsupported(f"{op} over {dt.value} with {w.type.dtype.value} weights (one floating type)")
    xv = ctx.tensor(x)
    if layout:
        xv = ctx.emit(K.PERMUTE, (xv,), TensorType(dt, (seq, batch, x.type.shape[2])), PermuteAttrs((1, 0, 2)))
    if not isinstance(seq, int):
        ctx.assume(sympy.Ge(seq, 1), f"{ctx.loc}: {op} needs at least one step")
    order = "lstm" if cell == "lstm" else ("gru" if cell == "gru" else "rnn")
    ys, hs, cs = [], [], []
    for d in range(dirs):
        weights = LayerWeights(
            _direction(ctx, w, d, 0, cols, order, hid, False),
            _direction(ctx, b, d, 0, cols, order, hid, False),
            _direction(ctx, r, d, 0, cols, order, hid, True),
            _direction(ctx, b, d, cols, cols, order, hid, False),
        )
        h0 = _state(ctx, arg(ins, 5), d, batch, hid, dt, layout)
        c0 = _state(ctx, arg(ins, 6), d, batch, hid, dt, layout) if cell == "lstm" else None
        reverse = direction == "reverse" or d == 1
        lbr = bool(int(ctx.attr("linear_before_reset", 0))) if cell == "gru" else True
        p = _direction(ctx, peep, d, 0, 3 * hid, "peephole", hid, False) if peep is not None else None
        attrs = RecurrentAttrs(cell, hid, reverse, lbr)
        y, h, c = recurrent_layer(ctx, xv, weights, h0, c0, attrs, p, lengths)
        ys.append(y)
        hs.append(h)
        if c is not None:
            cs.append(c)
    y_all = _stack(ctx, ys, 1)  # [S, D, B, H]
    if layout:
        y_all = ctx.emit(K.PERMUTE, (y_all,), TensorType(dt, (batch, seq, dirs, hid)), PermuteAttrs((2, 0, 1, 3)))
    outs: list[OVal | None] = [OVal(ctx.t(y_all), y_all)]
    for states in (hs, cs):
        if states:
            s = _stack(ctx, states, 1 if layout else 0)
            outs.append(OVal(ctx.t(s), s))
    return outs
