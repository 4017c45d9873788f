"""One direction of one recurrent layer in IR, shared by the torch front end and the ONNX importer.

In: a `Builder` (either front end's context, ir/builder.py), the layer's sequence-major input x [S, B, I], its
weights in the RECURRENT op's form (Note [Recurrent cells] in opset/attrs.py: W_ih [G*H, I], an
optional b_ih [G*H], R = W_hh^T [H, G*H], rb = b_hh [G*H]), initial states h0 (and c0) [B, H] and an
LSTM's optional peephole weights [3H] (i, f, o).
Out: the hidden state of every step y [S, B, H], the final h [B, H] and, for an LSTM, the final c.

Note [Recurrent layers]: the input projection of all steps is one MATMUL (the GEMM library's, with
the bias an epilogue add), so only h @ W_hh^T is left inside the sequential RECURRENT kernel (Note
[Recurrent kernel] in codegen/recurrent_kernel.py). The final states are the result at the last step
taken (step 0 in reverse): an LSTM's result carries the cell state next to h, so c_n needs no second
result.

Note [Recurrent lengths]: with per-sequence lengths L [B] (ONNX's sequence_lens), sequence b has L_b
steps and the rest of its S are padding: its outputs there are 0 and its final state is the one after
its own last step. A forward recurrence reads earlier steps only, so it runs over all S and its
result is masked, the final state gathered at step L_b - 1. A reverse one must start at each
sequence's own last step, so its input is reversed within each length first (step t reads L_b - 1 - t
below L_b and stays in place above), run forward, and its result reversed back the same way: no kernel
change, only gathers around it. L_b = 0 gives zero states, as ONNX Runtime does; an L_b above S is an
index error at run time.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from bladepack.dtypes import DType
from bladepack.ir.builder import Builder
from bladepack.ir.ops import (
    RECURRENT_GATES,
    ArangeAttrs,
    ConstantAttrs,
    MatmulAttrs,
    RecurrentAttrs,
    SliceAttrs,
    TakeAttrs,
)
from bladepack.ir.types import TensorType
from bladepack.opset import OpKind

K = OpKind

# Note [Recurrent kernel]: a step's gates live in a local array of G*H accumulators per sequence
MAX_RECURRENT_HIDDEN = 4096


@dataclass(frozen=True)
class LayerWeights:
    """One direction's weights in the RECURRENT op's form."""

    w_ih: int  # [G*H, I]
    b_ih: int | None  # [G*H]
    r: int  # W_hh^T, [H, G*H]
    rb: int  # b_hh, [G*H]


def recurrent_layer(
    b: Builder,
    x: int,
    w: LayerWeights,
    h0: int,
    c0: int | None,
    attrs: RecurrentAttrs,
    peepholes: int | None = None,
    lengths: int | None = None,
    first_input: int | None = None,
) -> tuple[int, int, int | None]:
    """`lengths`: int64 [B], each sequence's own number of steps (Note [Recurrent lengths]).
    `first_input` [B, G*H]: added to the input projection of the first step taken (the last in reverse;
    Note [LSTM projections] in export/recurrent.py)."""
    if lengths is not None:
        assert first_input is None, "a first-step input with lengths: each sequence's first step differs"
        return _ragged_layer(b, x, w, h0, c0, attrs, peepholes, lengths)
    xt = b.t(x)
    steps, batch, dt, hid = xt.shape[0], xt.shape[1], xt.dtype, attrs.hidden
    lstm = attrs.cell == "lstm"
    width = 2 * hid if lstm else hid
    out = _states(b, x, w, h0, c0, attrs, peepholes, first_input)

    def part(v: int, start: int) -> int:
        t = b.t(v)
        return b.emit(OpKind.SLICE, (v,), TensorType(dt, (*t.shape[:-1], hid)), SliceAttrs(t.rank - 1, start, 1))

    y = part(out, 0) if lstm else out
    last = 0 if attrs.reverse else steps - 1
    final = b.emit(OpKind.SLICE, (out,), TensorType(dt, (1, batch, width)), SliceAttrs(0, last, 1))
    final = b.emit(OpKind.RESHAPE, (final,), TensorType(dt, (batch, width)), None)
    if not lstm:
        return y, final, None
    return y, part(final, 0), part(final, hid)


def _states(
    b: Builder,
    x: int,
    w: LayerWeights,
    h0: int,
    c0: int | None,
    attrs: RecurrentAttrs,
    peep: int | None,
    first_input: int | None = None,
) -> int:
    """The RECURRENT op's result over x: the state after each step [S, B, H] (an LSTM's h then c, 2H)."""
    xt = b.t(x)
    steps, batch, dt = xt.shape[0], xt.shape[1], xt.dtype
    cols = RECURRENT_GATES[attrs.cell] * attrs.hidden
    xg = b.emit(K.MATMUL, (x, w.w_ih), TensorType(dt, (steps, batch, cols)), MatmulAttrs(True))
    if w.b_ih is not None:
        xg = b.emit(K.ADD, (xg, w.b_ih), TensorType(dt, (steps, batch, cols)), None)
    if first_input is not None:  # added where the step number is the first one taken
        i64 = DType.INT64
        t = b.emit(K.ARANGE, (), TensorType(i64, (steps,)), ArangeAttrs(0, 1))
        first = b.emit(K.CONSTANT, (), TensorType(i64, ()), ConstantAttrs(steps - 1 if attrs.reverse else 0))
        at_first = b.emit(K.EQ, (t, first), TensorType(DType.BOOL, (steps,)))
        at_first = b.emit(K.RESHAPE, (b.cast(at_first, dt),), TensorType(dt, (steps, 1, 1)))
        extra = b.emit(K.MUL, (at_first, first_input), TensorType(dt, (steps, batch, cols)))
        xg = b.emit(K.ADD, (xg, extra), TensorType(dt, (steps, batch, cols)), None)
    lstm = attrs.cell == "lstm"
    width = 2 * attrs.hidden if lstm else attrs.hidden
    states = (h0, c0) if lstm and c0 is not None else (h0,)
    if peep is not None:
        assert lstm and c0 is not None, "peepholes are an LSTM's"
        states = (*states, peep)
    return b.emit(K.RECURRENT, (xg, w.r, w.rb, *states), TensorType(dt, (steps, batch, width)), attrs)


def _ragged_layer(
    b: Builder, x: int, w: LayerWeights, h0: int, c0: int | None, attrs: RecurrentAttrs, peep: int | None, lengths: int
) -> tuple[int, int, int | None]:
    """Note [Recurrent lengths]."""
    xt = b.t(x)
    steps, batch, dt = xt.shape[0], xt.shape[1], xt.dtype
    i64, hid = DType.INT64, attrs.hidden
    t = b.emit(
        K.RESHAPE, (b.emit(K.ARANGE, (), TensorType(i64, (steps,)), ArangeAttrs(0, 1)),), TensorType(i64, (steps, 1))
    )
    lens = b.emit(K.RESHAPE, (lengths,), TensorType(i64, (1, batch)))
    valid = b.emit(K.LT, (t, lens), TensorType(DType.BOOL, (steps, batch)))
    last = b.emit(K.SUB, (lens, b.const(1, i64)), TensorType(i64, (1, batch)))
    order = None
    if attrs.reverse:
        back = b.emit(K.SUB, (last, t), TensorType(i64, (steps, batch)))
        order = b.emit(K.WHERE, (valid, back, t), TensorType(i64, (steps, batch)))
        x = _along_steps(b, x, order)
        attrs = dataclasses.replace(attrs, reverse=False)
    full = _states(b, x, w, h0, c0, attrs, peep)  # in the order run
    lstm = attrs.cell == "lstm"
    width = b.t(full).shape[2]
    y = b.emit(K.SLICE, (full,), TensorType(dt, (steps, batch, hid)), SliceAttrs(2, 0, 1)) if lstm else full
    at = b.emit(K.MAXIMUM, (last, b.const(0, i64)), TensorType(i64, (1, batch)))
    at = b.emit(
        K.EXPAND, (b.emit(K.RESHAPE, (at,), TensorType(i64, (1, batch, 1))),), TensorType(i64, (1, batch, width))
    )
    final = b.emit(K.GATHER, (full, at), TensorType(dt, (1, batch, width)), TakeAttrs(0, wrap=False))
    final = b.emit(K.RESHAPE, (final,), TensorType(dt, (batch, width)))
    some = b.emit(
        K.RESHAPE,
        (b.emit(K.GT, (lens, b.const(0, i64)), TensorType(DType.BOOL, (1, batch))),),
        TensorType(DType.BOOL, (batch, 1)),
    )
    final = b.emit(K.WHERE, (some, final, b.const(0.0, dt)), TensorType(dt, (batch, width)))
    if order is not None:
        y = _along_steps(b, y, order)
    mask = b.emit(K.RESHAPE, (valid,), TensorType(DType.BOOL, (steps, batch, 1)))
    y = b.emit(K.WHERE, (mask, y, b.const(0.0, dt)), TensorType(dt, (steps, batch, hid)))
    if not lstm:
        return y, final, None
    h = b.emit(K.SLICE, (final,), TensorType(dt, (batch, hid)), SliceAttrs(1, 0, 1))
    c = b.emit(K.SLICE, (final,), TensorType(dt, (batch, hid)), SliceAttrs(1, hid, 1))
    return y, h, c


def _along_steps(b: Builder, v: int, order: int) -> int:
    """v [S, B, F] with step t of sequence b read from step order[t, b]."""
    t = b.t(v)
    steps, batch, feats = t.shape
    idx = b.emit(K.RESHAPE, (order,), TensorType(DType.INT64, (steps, batch, 1)))
    idx = b.emit(K.EXPAND, (idx,), TensorType(DType.INT64, (steps, batch, feats)))
    return b.emit(K.GATHER, (v, idx), t, TakeAttrs(0, wrap=False))
