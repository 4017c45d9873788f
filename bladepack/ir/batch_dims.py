"""Which dynamic dims are batch-like: proven on the IR, so a batch above the range may run in pieces.

In: an optimized `Program`. Out: per symbol, a `BatchProof` — either the axis the symbol occupies in
every input and output (-1: the tensor does not carry it), or the first reason it is not batch-like,
naming the op and its source line.

Note [Batch-like dims]: a symbol s is batch-like when the program computes row b of every output
(along s) from row b of the inputs alone, whatever the other rows hold and however many there are.
Then a call with s above its maximum equals the concatenation of calls on consecutive pieces of the
batch (the out-of-range "split" policy; docs/format.md "Batch-like dims"). The proof walks the graph
once and gives every value either one axis whose dim is exactly s (its batch axis) or none:
- a value whose shape mentions s in any other way (2*s, s + 1, s twice) fails, as does a shape
  assertion, an attribute or a constant value that mentions s (the computation would depend on how
  many rows there are);
- an `arange` along s holds row numbers. Reshaped, expanded, permuted or plus 0 it still does, and
  an `index` may read the batch axis with it: row b reads row b, as Hugging Face's mask builders
  index the attention mask by (row, position) grids. Used any other way (or returned) it fails;
- elementwise and broadcasting ops keep the batch axis of their operands aligned from the right;
  layout ops move it (a reshape only where the dims before it keep their product, a permute as its
  permutation says); slicing, padding, concatenating, gathering or indexing along it fail;
- reductions, scans, softmax, norms, top-k and arg-reductions fail when their axes include it;
- matmul fails when s is the contracted dim; convolution and pooling need it as the batch (N) axis,
  except a pointwise channels-last convolution (a linear layer), which takes it on N, H or W;
- an op reading a batch-carrying operand whose result carries no batch axis fails (a total over rows).
The rules are conservative: a failure means "not proven", with the first reason found. Which rule an
op follows is its `Batch` in the op table (opset/table.py); the `Batch.OWN` rules are written per op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import sympy

from bladepack.ir.graph import Node, Program
from bladepack.ir.ops import (
    OP_INFO,
    ArgReduceAttrs,
    AxisAttrs,
    Conv2dAttrs,
    IndexAttrs,
    MatmulAttrs,
    NormAttrs,
    OpKind,
    PadAttrs,
    PermuteAttrs,
    ReduceAttrs,
    ScatterAttrs,
    SelectiveScanAttrs,
    SliceAttrs,
    SortAttrs,
    TopkAttrs,
    is_dense_conv,
)
from bladepack.ir.types import IRDim
from bladepack.opset import Batch

K = OpKind


@dataclass(frozen=True)
class BatchProof:
    symbol: str
    reason: str  # "" when proven
    inputs: tuple[int, ...] = ()  # per input, its batch axis (-1: none)
    outputs: tuple[int, ...] = ()  # per output, its batch axis (-1: none)

    @property
    def proven(self) -> bool:
        return not self.reason

    def to_manifest(self) -> dict[str, object]:
        if self.reason:
            return {"split": False, "reason": self.reason}
        return {"split": True, "inputs": list(self.inputs), "outputs": list(self.outputs)}


class _NotBatchLike(Exception):
    pass


def _mentions(v: object, s: sympy.Symbol) -> bool:
    if isinstance(v, sympy.Basic):
        return s in v.free_symbols
    if isinstance(v, (tuple, list)):
        return any(_mentions(x, s) for x in v)
    return False


def _axis_of(shape: Sequence[IRDim], s: sympy.Symbol, what: str) -> int:
    """The batch axis of a value of this shape (-1: none); fails when s appears any other way."""
    axes = [k for k, d in enumerate(shape) if isinstance(d, sympy.Basic) and s in d.free_symbols]
    if not axes:
        return -1
    if len(axes) > 1 or shape[axes[0]] != s:
        raise _NotBatchLike(
            f"{what} has shape {tuple(str(d) for d in shape)}, which holds {s} other than as one whole axis"
        )
    return axes[0]


def products_equal(a: Sequence[IRDim], b: Sequence[IRDim]) -> bool:
    """Whether the dims of `a` and of `b` multiply to the same size (a reshape keeps what precedes an
    axis exactly when the dims before it do)."""
    pa = sympy.expand(sympy.Mul(*[sympy.sympify(d) for d in a]))
    pb = sympy.expand(sympy.Mul(*[sympy.sympify(d) for d in b]))
    return bool(sympy.simplify(pa - pb) == 0)


def _expected(n: Node, ins: list[int], ranks: list[int], out_rank: int, pointwise: bool = False) -> int | None:
    """The output's batch axis the op's rule gives from its operands' (None: the rule has no opinion,
    e.g. no operand carries the batch); raises when the op mixes rows."""
    a = n.attrs
    carried = [(k, ax) for k, ax in enumerate(ins) if ax >= 0]
    if not carried:
        return None
    op = n.op
    rule = OP_INFO[op].batch
    if rule is Batch.ALIGNED:
        outs = {ax + out_rank - ranks[k] for k, ax in carried}
        if len(outs) != 1:
            raise _NotBatchLike("its operands hold the dim on different axes")
        return outs.pop()
    x = ins[0]
    if op is K.RESHAPE:
        return -2  # decided against the output's own axis by the caller
    if op is K.PERMUTE:
        assert isinstance(a, PermuteAttrs)
        return a.perm.index(x)
    if op is K.SLICE:
        assert isinstance(a, SliceAttrs)
        if a.axis == x:
            raise _NotBatchLike("it slices along the dim's axis")
        return x
    if op is K.PAD:
        assert isinstance(a, PadAttrs)
        if x >= 0 and tuple(a.pads[x]) != (0, 0):
            raise _NotBatchLike("it pads along the dim's axis")
        return x
    if op is K.CONCAT:
        assert isinstance(a, AxisAttrs)
        if len(carried) != len(ins) or len({ax for _, ax in carried}) != 1:
            raise _NotBatchLike("it concatenates values that do not all hold the dim on one axis")
        if a.axis == x:
            raise _NotBatchLike("it concatenates along the dim's axis")
        return x
    if op is K.TAKE:
        assert isinstance(a, AxisAttrs)
        idx = ins[1]
        if x >= 0 and (x == a.axis or idx >= 0):
            raise _NotBatchLike("it takes rows along the dim's axis")
        if x >= 0:
            return x if x < a.axis else x + ranks[1] - 1
        return a.axis + idx
    if op is K.GATHER:
        assert isinstance(a, AxisAttrs)
        if x == a.axis or ins[1] < 0 or (x >= 0 and x != ins[1]):
            raise _NotBatchLike("it gathers along the dim's axis, or with indices that do not follow the dim")
        return ins[1]
    if op is K.SCATTER:
        assert isinstance(a, ScatterAttrs)
        if x < 0 or x == a.axis or ins[1] != x or ins[2] not in (x, -1):
            raise _NotBatchLike("it scatters along the dim's axis, or its index and source do not hold the dim there")
        return x
    if op is K.RECURRENT:  # xg [S, B, G*H], r, rb, h0 [B, H], c0 [B, H] -> [S, B, H or 2H]
        if x != 1 or ins[1] >= 0 or ins[2] >= 0 or any(ax != 0 for ax in ins[3:5]) or any(ax >= 0 for ax in ins[5:]):
            raise _NotBatchLike("it runs a recurrence whose rows are not the dim")
        return 1
    if op is K.SELECTIVE_SCAN:  # u [B, D, L], dt [B, H, L], A, Bm, Cm [B, (G,) N, L], then D, z [B, D, L], dt_bias
        assert isinstance(a, SelectiveScanAttrs)
        per_batch = [0, 1, 3, 4] + ([5 + int(a.has_d)] if a.has_z else [])
        if any(ins[k] != 0 for k in per_batch) or any(ins[k] >= 0 for k in range(len(ins)) if k not in per_batch):
            raise _NotBatchLike("it scans rows that do not hold the dim on their first axis")
        return 0
    if op is K.INDEX:
        assert isinstance(a, IndexAttrs)
        if any(ax >= 0 for ax in ins[1:]) or x < 0 or any(ax <= x for ax in a.axes):
            raise _NotBatchLike("it indexes along or before the dim's axis, or with indices that hold the dim")
        return x
    if rule is Batch.REDUCE:
        assert isinstance(a, ReduceAttrs)
        if x in a.axes:
            raise _NotBatchLike(f"it reduces over the dim's axis ({op.value} over axes {list(a.axes)})")
        return x if a.keepdim else x - sum(1 for ax in a.axes if ax < x)
    if rule is Batch.ARG_REDUCE:
        assert isinstance(a, ArgReduceAttrs)
        if a.axis == x:
            raise _NotBatchLike(f"it reduces over the dim's axis ({op.value})")
        return x if a.keepdim or a.axis > x else x - 1
    if rule is Batch.ALONG_AXIS:
        assert isinstance(a, (AxisAttrs, TopkAttrs, SortAttrs))
        if a.axis == x:
            raise _NotBatchLike(f"it runs {op.value} along the dim's axis")
        return x
    if rule is Batch.NORM:
        assert isinstance(a, NormAttrs)
        if x < 0 or any(ax >= 0 for ax in ins[1:]) or x >= ranks[0] - a.num_axes:
            raise _NotBatchLike(f"it normalizes over the dim's axis ({op.value})")
        return x
    if op is K.MATMUL:
        assert isinstance(a, MatmulAttrs)
        ra, rb = ranks
        kb = rb - 1 if a.transpose_b else rb - 2
        nb = rb - 2 if a.transpose_b else rb - 1
        outs = set()
        if x >= 0:
            if x == ra - 1:
                raise _NotBatchLike("the dim is a matmul's contracted dim")
            outs.add(out_rank - 2 if x == ra - 2 else x + out_rank - ra)
        y = ins[1]
        if y >= 0:
            if y == kb:
                raise _NotBatchLike("the dim is a matmul's contracted dim")
            outs.add(out_rank - 1 if y == nb else y + out_rank - rb)
        if len(outs) != 1:
            raise _NotBatchLike("its operands hold the dim on different axes")
        return outs.pop()
    if op is K.CONV2D:
        assert isinstance(a, Conv2dAttrs)
        if pointwise and x in (0, 1, 2) and not any(ax >= 0 for ax in ins[1:]):
            return x  # each pixel on its own: a linear layer over rows (Note [Dense layers])
        if x != 0 or any(ax >= 0 for ax in ins[1:]):
            raise _NotBatchLike("a convolution whose batch (N) axis is not the dim")
        return 1 if a.out_layout == "cnhw" else 0
    if op in (K.MAX_POOL2D, K.AVG_POOL2D):
        if x != 0:
            raise _NotBatchLike("pooling whose batch (N) axis is not the dim")
        return 0
    raise _NotBatchLike(f"no batch rule for {op.value}")


_ROW_NUMBER_KEEPERS = (K.RESHAPE, K.EXPAND, K.PERMUTE)


def _is_zero(node: Node | None) -> bool:
    return node is not None and node.op is K.CONSTANT and getattr(node.attrs, "value", None) == 0


def _index_by_rows(n: Node, ins: list[int], ranks: list[int], rows: dict[int, str]) -> int:
    """The result's batch axis of an `index` that reads the batch axis with row numbers (Note
    [Batch-like dims]); numpy's rule places the broadcast index dims at the first indexed axis when
    the indexed axes are adjacent, else first."""
    a = n.attrs
    assert isinstance(a, IndexAttrs)
    x = ins[0]
    k = a.axes.index(x)
    idx = n.inputs[1 + k]
    if idx not in rows or any(ax >= 0 for j, ax in enumerate(ins[1:]) if j != k):
        raise _NotBatchLike("it indexes the dim's axis with other values than the row numbers")
    width = max(ranks[1:])
    at = ins[1 + k] + width - ranks[1 + k]
    adjacent = sorted(a.axes) == list(range(min(a.axes), min(a.axes) + len(a.axes)))
    return at + (min(a.axes) if adjacent else 0)


def prove_batch_like(p: Program, s: sympy.Symbol) -> BatchProof:
    """Note [Batch-like dims] for symbol `s`."""
    g = p.graph
    types = g.value_types()
    producer = {n.id: n for n in g.nodes}
    rows: dict[int, str] = {}  # values holding row numbers along s -> where their arange is
    try:
        for cond, msg in p.assertions:
            if _mentions(cond, s):
                raise _NotBatchLike(f"a shape constraint involves it ({msg})")
        axis: dict[int, int] = {}
        for prm in g.inputs:
            axis[prm.id] = _axis_of(prm.type.shape, s, f"input '{prm.name}'")
        for w in g.weights:
            axis[w.id] = _axis_of(w.type.shape, s, f"weight '{w.name}'")
        for n in g.nodes:
            where = f"{n.op.value} at {n.loc or f'%{n.id}'}"
            try:
                out = _axis_of(n.type.shape, s, "its result")
                for f in fields(n.attrs):
                    if _mentions(getattr(n.attrs, f.name), s):
                        raise _NotBatchLike(f"its {f.name} depends on {s}")
                ins = [axis[i] for i in n.inputs]
                if n.op is K.ARANGE and out >= 0:
                    a = n.attrs
                    if getattr(a, "start", None) != 0 or getattr(a, "step", None) != 1:
                        raise _NotBatchLike("its values count along the dim")
                    rows[n.id] = where
                    axis[n.id] = out
                    continue
                numbered = [i for i in n.inputs if i in rows]
                keeps = n.op in _ROW_NUMBER_KEEPERS or (
                    n.op is K.ADD and len(numbered) == 1 and any(_is_zero(producer.get(i)) for i in n.inputs)
                )
                reads_rows = n.op is K.INDEX and n.inputs[0] not in rows and ins[0] in getattr(n.attrs, "axes", ())
                if numbered and not keeps and not reads_rows:
                    raise _NotBatchLike(f"{rows[numbered[0]]}: its values count along the dim")
                ranks = [len(types[i].shape) for i in n.inputs]
                if numbered and reads_rows:
                    if _index_by_rows(n, ins, ranks, rows) != out:
                        raise _NotBatchLike("its result does not hold the dim where the rows of its operands go")
                    axis[n.id] = out
                    continue
                if numbered and keeps:
                    rows[n.id] = rows[numbered[0]]
                pointwise = n.op is K.CONV2D and is_dense_conv(n.attrs, types[n.inputs[1]].shape)
                want = _expected(n, ins, ranks, len(n.type.shape), pointwise)
                if want is None:
                    if out >= 0 and OP_INFO[n.op].batch is not Batch.ALIGNED:
                        raise _NotBatchLike("its result holds the dim while none of its operands does")
                elif want == -2:  # a reshape: the result's own axis, checked against the dims before it
                    x = ins[0]
                    if out < 0 or not products_equal(types[n.inputs[0]].shape[:x], n.type.shape[:out]):
                        raise _NotBatchLike("it merges the dim with other dims, or moves the dims before it")
                elif want != out:
                    raise _NotBatchLike(
                        "its result does not hold the dim where the rows of its operands go"
                        if out >= 0
                        else "it combines rows along the dim into a result without a batch axis"
                    )
                axis[n.id] = out
            except _NotBatchLike as e:
                raise _NotBatchLike(f"{where}: {e}") from None
        for o in g.outputs:
            if o in rows:
                raise _NotBatchLike(f"{rows[o]}: its values count along the dim, and the model returns them")
        ins_axes = tuple(axis[prm.id] for prm in g.inputs)
        if all(ax < 0 for ax in ins_axes):
            raise _NotBatchLike("no input has it as a dim")
        return BatchProof(s.name, "", ins_axes, tuple(axis[o] for o in g.outputs))
    except _NotBatchLike as e:
        return BatchProof(s.name, str(e))


def batch_proofs(p: Program) -> tuple[BatchProof, ...]:
    """Note [Batch-like dims] for every symbol an input binds."""
    bound = {d for prm in p.graph.inputs for d in prm.type.shape if isinstance(d, sympy.Symbol)}
    return tuple(prove_batch_like(p, s) for s in p.shape_env.symbols if s in bound)
