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
"""

from __future__ import annotations

from dataclasses import dataclass

from bladepack.ir.builder import Builder
from bladepack.ir.ops import RECURRENT_GATES, MatmulAttrs, RecurrentAttrs, SliceAttrs
from bladepack.ir.types import TensorType
from bladepack.opset import OpKind

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
) -> tuple[int, int, int | None]:
    xt = b.t(x)
    steps, batch = xt.shape[0], xt.shape[1]
    hid, dt = attrs.hidden, xt.dtype
    cols = RECURRENT_GATES[attrs.cell] * hid
    xg = b.emit(OpKind.MATMUL, (x, w.w_ih), TensorType(dt, (steps, batch, cols)), MatmulAttrs(True))
    if w.b_ih is not None:
        xg = b.emit(OpKind.ADD, (xg, w.b_ih), TensorType(dt, (steps, batch, cols)), None)
    lstm = attrs.cell == "lstm"
    width = 2 * hid if lstm else hid
    states = (h0, c0) if lstm and c0 is not None else (h0,)
    if peepholes is not None:
        assert lstm and c0 is not None, "peepholes are an LSTM's"
        states = (*states, peepholes)
    out = b.emit(OpKind.RECURRENT, (xg, w.r, w.rb, *states), TensorType(dt, (steps, batch, width)), attrs)

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
