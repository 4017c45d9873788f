"""Which dynamic dims may be padded: proven on the IR, so requests of different lengths may merge.

In: an optimized `Program`, a symbol and the batch-like proofs. Out: a `PaddingProof` — the pad value
of every input holding the symbol, the axes every output holds it on, and the inputs whose padded
values mask the rest (the attention mask) — or the first reason it does not hold, naming the op and
its source line.

Note [Padding proofs]: a dim s (a sequence) may be padded when, with every input holding s extended
from length l to L (the request padded at the end) by its pad value, the outputs at positions below l
are the unpadded call's whatever the padded positions held. A server may then pad requests to the
longest of a batch and give each request its positions back (Note [Serving batches]). The proof walks
the graph once and gives every value the axes that hold s (each must be s exactly) and, per such axis,
what the value holds at the padded positions along it, at the valid positions of its other axes
(ir/padding_values.py: an exact number, NEG, or ANY). Inputs are padded with 0, so they hold 0 there,
an additive mask (a float input tried when zeros fail) its dtype's minimum. Then:
- elementwise and layout ops keep positions: their results hold s where their operands did, and what
  they hold at padded positions follows from their operands' (a mask cast, inverted, scaled by a
  minimum, or-ed with a causal mask, chosen by `where`);
- an op reading across positions along s needs the padded ones neutral: a sum or a matmul contraction
  where they hold 0, a max or softmax where they hold NEG (a softmax then holds 0 there), a product
  where they hold 1. Mean, norms, top-k, arg-reductions, sorting, padding and concatenating along s,
  convolution and pooling over it fail: their valid positions would read padded ones (or count them);
- scans (cumsum, a forward recurrence, a selective scan) read earlier positions only, so they keep
  positions; a reverse recurrence fails;
- a slice along s keeps positions when it starts at 0; taking a position p survives when p is below
  the dim's minimum (Bert's pooler reads position 0); an `arange` along s holds positions, and an
  `index` reading s with positions (a mask builder's grid) reads what its operand holds there;
- comparing two position grids on different axes (a causal mask, key <= query) is known where one is
  padded and the other not (the padded one is the larger), so a decoder's causal self-attention
  masks padded keys for every valid query without a mask input.
The rules are conservative: a failure means "not proven", with the first reason found. Each row of the
batch may have its own length when the rows never mix, i.e. when a batch-like dim holds them (Note
[Batch-like dims]); the proof names it. The inputs whose padded values a neutralizing step used are the
masks; none means every op is position-wise or causal (a decoder's self-attention without a mask).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields

import sympy

from bladepack.ir.batch_dims import BatchProof, products_equal
from bladepack.ir.graph import Node, Program
from bladepack.ir.ops import (
    OP_INFO,
    ArangeAttrs,
    AxisAttrs,
    ConstantAttrs,
    IndexAttrs,
    MatmulAttrs,
    NormAttrs,
    OpKind,
    PermuteAttrs,
    RecurrentAttrs,
    ReduceAttrs,
    SliceAttrs,
    is_dense_conv,
)
from bladepack.ir.padding_values import ANY, NEG, Pad, combine, describe, exact, is_neg
from bladepack.ir.types import IRDim
from bladepack.opset import Batch

K = OpKind
# a comparison's answer when its left operand is the larger (EQ / NE: when the two differ)
_ORDERINGS = {K.LT: False, K.LE: False, K.GT: True, K.GE: True, K.EQ: False, K.NE: True}


@dataclass(frozen=True)
class PaddingProof:
    symbol: str
    reason: str  # "" when proven
    pads: Mapping[str, tuple[int, float]] = field(default_factory=dict)  # input -> (axis, pad value)
    outputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # output -> the axes holding s
    masks: tuple[str, ...] = ()  # the inputs whose padded values mask the others
    rows: str | None = None  # the batch-like dim whose rows may each have their own length

    @property
    def proven(self) -> bool:
        return not self.reason

    def to_manifest(self) -> dict[str, object]:
        if self.reason:
            return {"padding": False, "reason": self.reason}
        return {
            "padding": True,
            "inputs": {n: {"axis": a, "pad": v} for n, (a, v) in sorted(self.pads.items())},
            "outputs": {n: list(a) for n, a in sorted(self.outputs.items())},
            "masks": list(self.masks),
            "rows": self.rows,
        }


class _Mixes(Exception):
    pass


@dataclass(frozen=True)
class _Value:
    pads: dict[int, Pad]  # axis holding s -> what the value holds at padded positions along it
    positions: bool = False  # the values are the positions along its one axis holding s
    const: Pad = ANY  # the value everywhere, when it is one known number
    sources: frozenset[str] = frozenset()  # inputs whose padded values flowed into `pads`


def _axes_of(shape: Sequence[IRDim], s: sympy.Symbol, what: str) -> list[int]:
    axes = [k for k, d in enumerate(shape) if isinstance(d, sympy.Basic) and s in d.free_symbols]
    for k in axes:
        if shape[k] != s:
            raise _Mixes(f"{what} has shape {tuple(str(d) for d in shape)}, which holds {s} other than as whole axes")
    return axes


class _Prover:
    def __init__(self, p: Program, s: sympy.Symbol, pad_values: Mapping[str, float]) -> None:
        self.p, self.s = p, s
        self.g = p.graph
        self.types = self.g.value_types()
        self.values: dict[int, _Value] = {}
        self.pad_values = pad_values
        self.used: set[str] = set()
        self.s_min = p.shape_env.range_of(s).min

    # ------------------------------------------------------------------ helpers

    def shape(self, vid: int) -> Sequence[IRDim]:
        return self.types[vid].shape

    def use(self, v: _Value) -> None:
        self.used |= v.sources

    def pad_at(self, v: _Value, rank: int, out_rank: int, axis: int) -> Pad:
        """What operand `v` (of rank `rank`, broadcast to `out_rank`) holds at padded positions along
        the result's `axis`."""
        own = axis - (out_rank - rank)
        if own in v.pads:
            return v.pads[own]
        return v.const

    # ------------------------------------------------------------------ the walk

    def run(self) -> tuple[dict[str, tuple[int, ...]], tuple[str, ...]]:
        for prm in self.g.inputs:
            axes = _axes_of(prm.type.shape, self.s, f"input '{prm.name}'")
            if len(axes) > 1:
                raise _Mixes(f"input '{prm.name}' holds {self.s} on more than one axis")
            pad = self.pad_values.get(prm.name, 0.0)
            self.values[prm.id] = _Value(
                {a: (NEG if is_neg(pad) else pad) for a in axes}, sources=frozenset([prm.name])
            )
        for w in self.g.weights:
            self.values[w.id] = _Value({})
        for n in self.g.nodes:
            where = f"{n.op.value} at {n.loc or f'%{n.id}'}"
            try:
                out_axes = _axes_of(n.type.shape, self.s, "its result")
                for f in fields(n.attrs):
                    v = getattr(n.attrs, f.name)
                    if isinstance(v, sympy.Basic) and self.s in v.free_symbols:
                        if n.op in (K.SLICE, K.TAKE, K.GATHER, K.INDEX):
                            raise _Mixes(
                                "it reads positions counted from the dim's end, which are padded when a request "
                                "is shorter than the batch's longest"
                            )
                        raise _Mixes(f"its {f.name} depends on {self.s}")
                val = self.node(n, out_axes)
                if sorted(val.pads) != out_axes:
                    raise _Mixes("its result does not hold the dim where its operands' positions go")
                self.values[n.id] = val
            except _Mixes as e:
                raise _Mixes(f"{where}: {e}") from None
        outs = {}
        for name, o in zip(self.g.output_names, self.g.outputs):
            outs[name] = tuple(sorted(self.values[o].pads))
        return outs, tuple(sorted(self.used))

    def node(self, n: Node, out_axes: list[int]) -> _Value:
        op, a = n.op, n.attrs
        ins = [self.values[i] for i in n.inputs]
        ranks = [len(self.shape(i)) for i in n.inputs]
        out_rank = len(n.type.shape)
        if op in (K.CONSTANT, K.FULL):
            assert isinstance(a, ConstantAttrs)
            c = float(a.value) if isinstance(a.value, (int, float, bool)) else ANY
            return _Value({ax: c for ax in out_axes}, const=c)
        if op is K.ARANGE:
            assert isinstance(a, ArangeAttrs)
            return _Value({ax: ANY for ax in out_axes}, positions=bool(out_axes) and a.start == 0 and a.step == 1)
        if OP_INFO[op].batch is Batch.ALIGNED:
            return self.elementwise(n, ins, ranks, out_rank, out_axes)
        if op is K.RESHAPE:
            return self.reshape(n, ins[0])
        if op is K.PERMUTE:
            assert isinstance(a, PermuteAttrs)
            x = ins[0]
            return _Value({j: x.pads[k] for j, k in enumerate(a.perm) if k in x.pads}, x.positions, x.const, x.sources)
        if op is K.SLICE:
            return self.slice(n, ins[0])
        if op is K.TAKE:
            return self.take(n, ins, ranks)
        if op is K.GATHER:
            return self.gather(n, ins)
        if op is K.INDEX:
            return self.index(n, ins, ranks, out_rank)
        if op is K.MATMUL:
            return self.matmul(n, ins, ranks, out_rank)
        rule = OP_INFO[op].batch
        if rule is Batch.REDUCE:
            return self.reduce(n, ins[0])
        if op in (K.SOFTMAX, K.LOG_SOFTMAX, K.CUMSUM):
            assert isinstance(a, AxisAttrs)
            x = ins[0]
            if a.axis not in x.pads:
                return _Value({ax: ANY for ax in out_axes})
            if op is K.CUMSUM:
                return _Value({ax: ANY for ax in out_axes})  # a running sum reads earlier positions only
            if not is_neg(x.pads[a.axis]):
                raise _Mixes(
                    f"it runs {op.value} along the dim, whose padded positions hold {describe(x.pads[a.axis])}, "
                    "not a masked (large negative) score"
                )
            self.use(x)
            pads: dict[int, Pad] = {ax: ANY for ax in out_axes}
            pads[a.axis] = 0.0 if op is K.SOFTMAX else NEG
            return _Value(pads, sources=x.sources)
        if rule in (Batch.ARG_REDUCE, Batch.ALONG_AXIS):
            if getattr(a, "axis", None) in ins[0].pads:
                raise _Mixes(f"it runs {op.value} along the dim: its result would read padded positions")
            return _Value({ax: ANY for ax in out_axes})
        if rule is Batch.NORM:
            assert isinstance(a, NormAttrs)
            if any(ax >= ranks[0] - a.num_axes for ax in ins[0].pads) or any(v.pads for v in ins[1:]):
                raise _Mixes(f"it normalizes over the dim ({op.value}): padded positions would count")
            return _Value({ax: ANY for ax in out_axes})
        if op is K.CONCAT or op is K.PAD:  # along the dim its result would not be the dim (refused above)
            if any(sorted(v.pads) != out_axes for v in ins if v.pads):
                raise _Mixes(f"it {'concatenates' if op is K.CONCAT else 'pads'} along the dim")
            return _Value({ax: ANY for ax in out_axes})
        if op is K.CONV2D:
            pointwise = is_dense_conv(a, tuple(self.shape(n.inputs[1])))
            x = ins[0]
            if any(v.pads for v in ins[1:]) or any(ax != 0 and not (pointwise and ax in (1, 2)) for ax in x.pads):
                raise _Mixes("a convolution over the dim mixes neighbouring positions")
            return _Value({ax: ANY for ax in out_axes})
        if op in (K.MAX_POOL2D, K.AVG_POOL2D):
            if any(ax != 0 for ax in ins[0].pads):
                raise _Mixes("pooling over the dim mixes neighbouring positions")
            return _Value({ax: ANY for ax in out_axes})
        if op is K.RECURRENT:
            assert isinstance(a, RecurrentAttrs)
            if a.reverse and 0 in ins[0].pads:
                raise _Mixes("a reverse recurrence reads the padded steps before the valid ones")
            if any(ax != 0 for ax in ins[0].pads) or any(v.pads for v in ins[1:]):
                raise _Mixes("it runs a recurrence whose steps are not the dim")
            return _Value({ax: ANY for ax in out_axes})
        if op is K.SELECTIVE_SCAN:  # the steps are the last axis of u, dt, Bm, Cm (grouped or not) and z
            if any(ax != r - 1 for v, r in zip(ins, ranks) for ax in v.pads):
                raise _Mixes("it scans along another axis than the dim")
            return _Value({ax: ANY for ax in out_axes})
        if any(v.pads for v in ins) or out_axes:
            raise _Mixes(f"no padding rule for {op.value}")
        return _Value({})

    # ------------------------------------------------------------------ rules

    def elementwise(self, n: Node, ins: list[_Value], ranks: list[int], out_rank: int, out_axes: list[int]) -> _Value:
        attrs = {f.name: getattr(n.attrs, f.name) for f in fields(n.attrs)}
        numeric = {k: v for k, v in attrs.items() if isinstance(v, (int, float, bool, str))}
        dt = n.type.dtype.value
        pads = {
            ax: combine(n.op, numeric, [self.pad_at(v, r, out_rank, ax) for v, r in zip(ins, ranks)], dt)
            for ax in out_axes
        }
        pads.update(self.causal(n.op, ins, ranks, out_rank))
        const = ANY
        if ins and all(exact(v.const) for v in ins):
            const = combine(n.op, numeric, [v.const for v in ins], dt)
        positions = False
        if n.op in (K.EXPAND, K.CAST) and ins[0].positions:
            positions = True
        elif n.op is K.ADD and len(out_axes) == 1:
            pos = [v for v in ins if v.positions]
            positions = len(pos) == 1 and any(v.const == 0.0 for v in ins)
        known = any(c is not ANY for c in pads.values())
        sources = frozenset().union(*(v.sources for v in ins)) if known and ins else frozenset()
        return _Value(pads, positions, const, sources)

    def causal(self, op: OpKind, ins: list[_Value], ranks: list[int], out_rank: int) -> dict[int, Pad]:
        """A comparison of two position grids on different axes (a causal mask: key <= query): where
        one side's position is padded and the other's is not, the padded one is the larger, so the
        answer is known there (Note [Padding proofs]: a decoder with no mask input)."""
        if op not in _ORDERINGS or len(ins) != 2 or not all(v.positions and len(v.pads) == 1 for v in ins):
            return {}
        (a,), (b,) = ((ax + out_rank - r for ax in v.pads) for v, r in zip(ins, ranks))
        if a == b:
            return {}
        bigger = _ORDERINGS[op]  # the answer when the left side is the larger
        return {a: float(bigger), b: float(not bigger) if op not in (K.EQ, K.NE) else float(bigger)}

    def reshape(self, n: Node, x: _Value) -> _Value:
        src, dst = self.shape(n.inputs[0]), n.type.shape
        out_axes = [k for k, d in enumerate(dst) if d == self.s]
        in_axes = sorted(x.pads)
        if len(in_axes) != len(out_axes) or not all(
            products_equal(src[:i], dst[:o]) for i, o in zip(in_axes, out_axes)
        ):
            raise _Mixes("it merges the dim with other dims")
        return _Value({o: x.pads[i] for i, o in zip(in_axes, out_axes)}, x.positions, x.const, x.sources)

    def slice(self, n: Node, x: _Value) -> _Value:
        a = n.attrs
        assert isinstance(a, SliceAttrs)
        length = n.type.shape[a.axis]
        pads = {ax: c for ax, c in x.pads.items() if ax != a.axis}
        if length == self.s:  # a prefix of a longer axis, or the whole dim
            if a.start != 0 or a.step != 1:
                raise _Mixes("it slices the dim other than from position 0")
            pads[a.axis] = x.pads.get(a.axis, ANY)
            return _Value(pads, x.positions, x.const, x.sources)
        if a.axis in x.pads:
            if not (isinstance(a.start, int) and isinstance(length, int) and a.step == 1 and 0 <= a.start):
                raise _Mixes("it slices positions out of the dim other than a constant prefix")
            if a.start + length > self.s_min:
                raise _Mixes(
                    f"it reads positions {a.start}..{a.start + length - 1} of the dim, which are padded when a "
                    f"request is shorter than {a.start + length} (the dim's minimum is {self.s_min})"
                )
        return _Value(pads, False, x.const, x.sources)

    def take(self, n: Node, ins: list[_Value], ranks: list[int]) -> _Value:
        a = n.attrs
        assert isinstance(a, AxisAttrs)
        data, idx = ins
        if a.axis in data.pads:
            raise _Mixes("it takes entries along the dim by index")
        pads = {(ax if ax < a.axis else ax + ranks[1] - 1): c for ax, c in data.pads.items()}
        pads.update({a.axis + ax: ANY for ax in idx.pads})
        return _Value(pads)

    def gather(self, n: Node, ins: list[_Value]) -> _Value:
        a = n.attrs
        assert isinstance(a, AxisAttrs)
        data, idx = ins
        if a.axis in data.pads and not (idx.positions and a.axis in idx.pads):
            raise _Mixes("it gathers along the dim by index")
        if data.pads and sorted(data.pads) != sorted(idx.pads):
            raise _Mixes("its data and indices hold the dim on different axes")
        return _Value({ax: data.pads.get(ax, ANY) for ax in idx.pads}, sources=data.sources)

    def index(self, n: Node, ins: list[_Value], ranks: list[int], out_rank: int) -> _Value:
        a = n.attrs
        assert isinstance(a, IndexAttrs)
        x, idxs = ins[0], ins[1:]
        width = max(ranks[1:])
        adjacent = sorted(a.axes) == list(range(min(a.axes), min(a.axes) + len(a.axes)))
        base = min(a.axes) if adjacent else 0
        rest = [k for k in range(ranks[0]) if k not in a.axes]
        before = [k for k in rest if adjacent and k < base]
        place = {k: j for j, k in enumerate(before)}
        place.update({k: len(before) + width + j for j, k in enumerate(k for k in rest if k not in before)})
        pads: dict[int, Pad] = {place[ax]: c for ax, c in x.pads.items() if ax in place}
        for k, (ax, idx) in enumerate(zip(a.axes, idxs)):
            for t in idx.pads:
                at = base + t + width - ranks[1 + k]
                if ax in x.pads and not idx.positions:
                    raise _Mixes("it indexes the dim with other values than its positions")
                # two axes read along one (a diagonal): its padded positions are padded on both
                pads[at] = x.pads[ax] if ax in x.pads and at not in pads else ANY
            if ax in x.pads and not idx.pads:
                raise _Mixes("it indexes the dim by values that are not its positions")
        return _Value(pads, sources=x.sources)

    def matmul(self, n: Node, ins: list[_Value], ranks: list[int], out_rank: int) -> _Value:
        a = n.attrs
        assert isinstance(a, MatmulAttrs)
        x, y = ins
        ra, rb = ranks
        kb, nb = (rb - 1, rb - 2) if a.transpose_b else (rb - 2, rb - 1)
        if ra - 1 in x.pads or kb in y.pads:
            cx, cy = x.pads.get(ra - 1, ANY), y.pads.get(kb, ANY)
            if not ((exact(cx) and cx == 0) or (exact(cy) and cy == 0)):
                raise _Mixes(
                    "it contracts over the dim, and neither operand holds 0 at the padded positions "
                    f"({describe(cx)} and {describe(cy)})"
                )
            self.use(x if exact(cx) and cx == 0 else y)
            # a padded row or column read padded positions of the contraction, which nothing describes
            return _Value({ax: ANY for ax in _axes_of(n.type.shape, self.s, "its result")})
        pads: dict[int, Pad] = {}
        for ax, c in x.pads.items():
            if ax == ra - 2:
                pads[out_rank - 2] = 0.0 if exact(c) and c == 0 else ANY
            elif ax < ra - 2:
                pads[ax + out_rank - ra] = ANY
        for ax, c in y.pads.items():
            if ax == nb:
                pads[out_rank - 1] = 0.0 if exact(c) and c == 0 else ANY
            elif ax < rb - 2:
                pads.setdefault(ax + out_rank - rb, ANY)
        return _Value(pads, sources=x.sources | y.sources if any(c is not ANY for c in pads.values()) else frozenset())

    def reduce(self, n: Node, x: _Value) -> _Value:
        a = n.attrs
        assert isinstance(a, ReduceAttrs)
        op = n.op
        for ax in a.axes:
            if ax not in x.pads:
                continue
            c = x.pads[ax]
            if op is K.MEAN:
                raise _Mixes("a mean over the dim counts the padded positions")
            neutral = {K.SUM: exact(c) and c == 0, K.AMAX: is_neg(c), K.PROD: exact(c) and c == 1}.get(op, False)
            if not neutral:
                raise _Mixes(f"it reduces over the dim ({op.value}), whose padded positions hold {describe(c)}")
            self.use(x)
        across = any(ax in x.pads for ax in a.axes)  # then padded rows summed padded entries: unknown
        pads: dict[int, Pad] = {}
        for ax, c in x.pads.items():
            if ax in a.axes:
                continue
            at = ax if a.keepdim else ax - sum(1 for r in a.axes if r < ax)
            keep = not across and (
                (exact(c) and (c == 0 or (op is not K.SUM and (op is not K.PROD or c == 1))))
                or (is_neg(c) and op is not K.PROD)
            )
            pads[at] = c if keep else ANY
        return _Value(pads, sources=x.sources)


def prove_padding(
    p: Program, s: sympy.Symbol, batch: Sequence[BatchProof] = (), pad_values: Mapping[str, float] | None = None
) -> PaddingProof:
    """Note [Padding proofs] for symbol `s`. Inputs are padded with 0 unless `pad_values` says; when
    that fails, each float input holding s is tried as an additive mask (padded with its minimum)."""
    import numpy as np

    tries: list[dict[str, float]] = [dict(pad_values or {})]
    if pad_values is None:
        for prm in p.graph.inputs:
            if prm.type.dtype.value.startswith(("float", "bfloat")) and s in prm.type.shape:
                tries.append(
                    {prm.name: float(np.finfo(np.dtype(prm.type.dtype.value.replace("bfloat16", "float32"))).min)}
                )
    first = ""
    for values in tries:
        try:
            prover = _Prover(p, s, values)
            outs, masks = prover.run()
        except _Mixes as e:
            first = first or str(e)
            continue
        pads = {}
        for prm in p.graph.inputs:
            axes = [k for k, d in enumerate(prm.type.shape) if d == s]
            if axes:
                pads[prm.name] = (axes[0], values.get(prm.name, 0.0))
        rows = next((b.symbol for b in batch if b.proven and b.symbol != s.name), None)
        return PaddingProof(s.name, "", pads, outs, masks, rows)
    return PaddingProof(s.name, first)


def padding_proofs(p: Program, batch: Sequence[BatchProof]) -> tuple[PaddingProof, ...]:
    """Note [Padding proofs] for every symbol an input binds that is not batch-like."""
    bound = {d for prm in p.graph.inputs for d in prm.type.shape if isinstance(d, sympy.Symbol)}
    batch_like = {b.symbol for b in batch if b.proven}
    return tuple(prove_padding(p, s, batch) for s in p.shape_env.symbols if s in bound and s.name not in batch_like)
