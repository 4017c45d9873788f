"""Pass: the packed form of a program whose sequence dim is proven paddable (Note [Packed sequences]).

In: a front end's program, a symbol s the padding proof holds for with a batch-like dim b whose rows
may each have their own length (ir/padding.py). Out: `Packed` — the program over the valid tokens of
several sequences concatenated along s (b is 1, s becomes the token count), with two int64 inputs that
give each token its sequence's first token and the one past its last — or `NotPackable` with the first
op (and source line) that stops it.

Note [Packed sequences]: a batch of sequences of different lengths padded to the longest computes every
padded position in every GEMM; packed, only the valid tokens are computed. The packed program is the
same graph over [1, T] instead of [b, s], changed in three places:
- attention: a softmax along s whose rows are positions of s too (a [.., Sq, Skv] score matrix) gets
  its scores outside the query's own sequence set to -inf first (`where(start[q] <= k < end[q], x,
  -inf)`), so each token attends to its own sequence; the product of those probabilities with the
  values, contracting over s, then sums the sequence's own keys. The CPU attention kernel reads the
  bounds from the chain and walks only those keys (Note [Key bounds] in library_ops/cpu_attention.py).
  Any other op reading across positions of s — a sum or other reduction over it, a contraction not
  after such a softmax, a cumulative sum, a scan or recurrence along it, a softmax over it whose rows
  are not positions — would mix sequences: refused.
- positions: an `arange` along s (start 0, step 1) whose values are used as numbers (position
  embeddings, rotary angles) becomes the token's position in its sequence, t - start[t]; where it
  indexes a tensor along s (a mask builder's (row, position) grid) or is compared with another
  position grid (a causal mask) it stays the packed position, which keeps the order within a sequence.
  A slice to length s of a tensor without s (a buffer of position ids or token types) becomes a take
  at the positions in the sequence.
- b is 1: every input holding s has b as its rows (an input holding b without s is refused), and
  values holding b without s carry no per-row content (such content would come from a reduction
  over s or an input without s).
- one position of each sequence (a pooler or classifier reading each sequence's first token, a slice
  of length 1 at a constant position along s) becomes a take at each sequence's first token plus
  that position, through a third int64 input of shape [sequences] (each sequence's first token); its
  result holds one row per sequence where b was, and what is computed from it too (b becomes the
  sequence count there). Such values must not meet the tokens' values again.
Every output holds s (one row of tokens) or one row per sequence; any other is refused.
Assertions that mention s hold per sequence: the loader checks each sequence's length against the
unpacked plan, so the packed program drops them. The token count's range is [1, max(s) * max(b)].
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy

from bladepack.dtypes import DType
from bladepack.ir.batch_dims import batch_proofs
from bladepack.ir.graph import GraphBuilder, Guard, Node, Program
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
    ReduceAttrs,
    SliceAttrs,
)
from bladepack.ir.padding import prove_padding
from bladepack.ir.shape_env import ShapeEnv
from bladepack.ir.types import TensorType
from bladepack.opset import Batch
from bladepack.passes.canonicalize_shapes import canonicalize_shapes

K = OpKind
_POSITION_OPS = (K.EXPAND, K.CAST, K.RESHAPE, K.PERMUTE, K.SLICE, K.ADD)
_COMPARISONS = (K.LT, K.LE, K.GT, K.GE, K.EQ, K.NE)


class NotPackable(Exception):
    """The program has no packed form; the message says which op (and source line) stops it."""


@dataclass(frozen=True)
class Packed:
    program: Program
    symbol: str  # the ragged dim s of the unpacked program
    rows: str  # its batch-like dim b
    tokens: str  # the packed program's symbol for the token count T
    starts: str  # the int64 [T] input: each token's sequence's first token
    ends: str  # ... and the token past its last
    inputs: Mapping[str, tuple[int, int]]  # ragged input -> (its rows axis, its axis of s)
    # output -> (its rows axis, its axis of s; -1: one row per sequence along its rows axis)
    outputs: Mapping[str, tuple[int, int]]
    firsts: str | None = None  # the int64 [sequences] input (each sequence's first token), when read
    sequences: str | None = None  # ... and the symbol of its length

    def to_manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "symbol": self.symbol,
            "rows": self.rows,
            "tokens": self.tokens,
            "starts": self.starts,
            "ends": self.ends,
            "inputs": {n: list(a) for n, a in sorted(self.inputs.items())},
            "outputs": {n: list(a) for n, a in sorted(self.outputs.items())},
        }
        if self.firsts is not None:
            out.update(firsts=self.firsts, sequences=self.sequences)
        return out


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    taken.add(out)
    return out


def _mentions(v: Any, s: sympy.Symbol) -> bool:
    if isinstance(v, sympy.Basic):
        return s in v.free_symbols
    if isinstance(v, tuple):
        return any(_mentions(x, s) for x in v)
    return False


class _Packer:
    def __init__(self, p: Program, s: sympy.Symbol, b: sympy.Symbol) -> None:
        self.p, self.s, self.b = p, s, b
        self.g = p.graph
        self.types = self.g.value_types()
        self.nodes = {n.id: n for n in self.g.nodes}
        names = {x.name for x in self.g.inputs} | {x.name for x in self.g.weights} | set(self.g.output_names)
        rs, rb = p.shape_env.range_of(s), p.shape_env.range_of(b)
        self.env = ShapeEnv()
        syms = {x.name for x in p.shape_env.symbols}
        for x in p.shape_env.symbols:
            if x not in (s, b):
                r = p.shape_env.range_of(x)
                self.env.create_symbol(x.name, r.min, r.max)
        self.tokens = _fresh("tokens", syms)
        self.T = self.env.create_symbol(self.tokens, 1, None if rs.max is None or rb.max is None else rs.max * rb.max)
        self.subst: dict[sympy.Basic, sympy.Basic] = {s: self.T, b: sympy.Integer(1)}
        self.starts_name = _fresh("sequence_starts", names)
        self.ends_name = _fresh("sequence_ends", names)
        self.firsts_name: str | None = None
        self.N: sympy.Symbol | None = None
        if any(self.picks(n) for n in self.g.nodes):  # one position per sequence is read
            self.firsts_name = _fresh("sequence_firsts", names)
            self.sequences = _fresh("sequences", syms | {self.tokens})
            self.N = self.env.create_symbol(
                self.sequences, 1, None if rs.max is None or rb.max is None else rs.max * rb.max
            )
            self.seq_subst: dict[sympy.Basic, sympy.Basic] = {s: self.T, b: self.N}
        self.per_seq: set[int] = set()  # original values whose packed rows are the sequences
        self.bld = GraphBuilder()
        self.glob: dict[int, int] = {}
        self.local: dict[int, int] = {}
        self.pos: set[int] = set()  # original values holding positions along s (Note [Packed sequences])
        # probabilities that are 0 outside each query's sequence -> their key axis
        self.masked: dict[int, int] = {}
        self.local_positions: int | None = None
        self.inputs: dict[str, tuple[int, int]] = {}

    # ------------------------------------------------------------------ types

    def dim(self, d: Any, per_seq: bool = False) -> Any:
        """A dim of the packed program: s the tokens, b 1 (or, in a value with one row per sequence,
        the sequence count)."""
        if not isinstance(d, sympy.Basic):
            return d
        e = sympy.sympify(d).xreplace(self.seq_subst if per_seq else self.subst)
        return int(e) if e.is_Integer else e

    def type(self, t: TensorType, per_seq: bool = False) -> TensorType:
        return TensorType(t.dtype, tuple(self.dim(d, per_seq) for d in t.shape))

    def picks(self, n: Node) -> bool:
        """A slice of one position along s at a constant start: each sequence's token at that position."""
        if n.op is not K.SLICE or not n.inputs:
            return False
        a = n.attrs
        assert isinstance(a, SliceAttrs)
        src = self.types[n.inputs[0]].shape
        return src[a.axis] == self.s and n.type.shape[a.axis] == 1 and isinstance(a.start, int)

    def attrs(self, n: Node) -> Any:
        a = n.attrs
        if not dataclasses.is_dataclass(a):
            return a
        changes = {}
        for f in dataclasses.fields(a):
            v = getattr(a, f.name)
            if _mentions(v, self.b) or _mentions(v, self.s):
                raise NotPackable(f"its {f.name} depends on the dims {self.b} / {self.s}")
            changes[f.name] = v
        return dataclasses.replace(a, **changes)

    def axes(self, vid: int) -> list[int]:
        return [k for k, d in enumerate(self.types[vid].shape) if d == self.s]

    # ------------------------------------------------------------------ positions

    def token_positions(self) -> int:
        """t - start[t]: each token's position in its sequence (int64 [T])."""
        if self.local_positions is None:
            t = TensorType(DType.INT64, (self.T,))
            ar = self.bld.add(K.ARANGE, (), t, ArangeAttrs(0, 1))
            self.local_positions = self.bld.add(K.SUB, (ar, self.starts), t)
        return self.local_positions

    def loc(self, vid: int) -> int:
        """The value `vid` (holding positions along s) with each token's position in its sequence."""
        if vid in self.local:
            return self.local[vid]
        n = self.nodes[vid]
        if n.op is K.ARANGE:
            v = self.token_positions()
            if n.type.dtype is not DType.INT64:
                v = self.bld.add(K.CAST, (v,), TensorType(n.type.dtype, (self.T,)))
        else:
            ins = tuple(self.loc(i) if i in self.pos else self.glob[i] for i in n.inputs)
            v = self.bld.add(n.op, ins, self.type(n.type), self.attrs(n), n.loc)
        self.local[vid] = v
        return v

    def is_positions(self, n: Node) -> bool:
        """Note [Padding proofs]' positions: an arange along s from 0 by 1, and what keeps its values."""
        if n.op is K.ARANGE:
            a = n.attrs
            assert isinstance(a, ArangeAttrs)
            return n.type.shape == (self.s,) and a.start == 0 and a.step == 1
        if n.op not in _POSITION_OPS or not n.inputs or not self.axes(n.id):
            return False
        if n.op is K.ADD:
            pos = [i for i in n.inputs if i in self.pos]
            other = [i for i in n.inputs if i not in self.pos]
            return len(pos) == 1 and len(other) == 1 and _is_zero(self.nodes.get(other[0]))
        if n.op is K.SLICE:
            a = n.attrs
            assert isinstance(a, SliceAttrs)
            return n.inputs[0] in self.pos and (self.types[n.inputs[0]].shape[a.axis] != self.s or a.start == 0)
        return n.inputs[0] in self.pos

    def operand(self, n: Node, slot: int) -> int:
        """Input `slot` of `n`, as packed or as positions in the sequence (Note [Packed sequences])."""
        i = n.inputs[slot]
        if i not in self.pos:
            return self.glob[i]
        if n.op in _COMPARISONS and all(j in self.pos for j in n.inputs):
            return self.glob[i]  # a causal mask: packed positions keep the order within a sequence
        if n.op is K.INDEX and slot > 0:
            a = n.attrs
            assert isinstance(a, IndexAttrs)
            if self.types[n.inputs[0]].shape[a.axes[slot - 1]] == self.s:
                return self.glob[i]  # reads a tensor along s at its positions
        if n.op is K.GATHER and slot == 1:
            a = n.attrs
            assert isinstance(a, AxisAttrs)
            if self.types[n.inputs[0]].shape[a.axis] == self.s:
                return self.glob[i]
        return self.loc(i)

    # ------------------------------------------------------------------ the walk

    def run(self) -> Packed:
        bld = self.bld
        for prm in self.g.inputs:
            shape = prm.type.shape
            if self.s in shape:
                if self.b not in shape:
                    raise NotPackable(f"input '{prm.name}' holds {self.s} without its rows {self.b}")
                self.inputs[prm.name] = (shape.index(self.b), shape.index(self.s))
            elif any(_mentions(d, self.b) for d in shape):
                raise NotPackable(f"input '{prm.name}' holds the rows {self.b} without {self.s}: one value per row")
            self.glob[prm.id] = bld.add_input(prm.name, self.type(prm.type))
        bounds = TensorType(DType.INT64, (self.T,))
        self.starts = bld.add_input(self.starts_name, bounds)
        self.ends = bld.add_input(self.ends_name, bounds)
        if self.firsts_name is not None:
            self.firsts = bld.add_input(self.firsts_name, TensorType(DType.INT64, (self.N,)))
        for w in self.g.weights:
            self.glob[w.id] = bld.add_weight(w.name, w.type)
        for n in self.g.nodes:
            bld.guard = tuple(Guard(self.glob[c.pred], c.taken) for c in n.guard if c.pred in self.glob)
            try:
                self.glob[n.id] = self.node(n)
            except NotPackable as e:
                raise NotPackable(f"{n.op.value} at {n.loc or f'%{n.id}'}: {e}") from None
        bld.guard = ()
        outputs: dict[str, tuple[int, int]] = {}
        for name, o in zip(self.g.output_names, self.g.outputs):
            shape = self.types[o].shape
            if o in self.per_seq and self.b in shape:
                outputs[name] = (shape.index(self.b), -1)
                continue
            if self.s not in shape or self.b not in shape:
                raise NotPackable(
                    f"output '{name}' (shape [{', '.join(str(d) for d in shape)}]) holds neither the tokens "
                    f"({self.b}, {self.s}) nor one row per sequence: a packed call has no rows of its own for it"
                )
            outputs[name] = (shape.index(self.b), shape.index(self.s))
        graph = bld.finish(tuple(self.glob[o] for o in self.g.outputs), self.g.output_names)
        assertions = tuple(
            (c.xreplace(self.subst), msg)
            for c, msg in self.p.assertions
            if not (isinstance(c, sympy.Basic) and self.s in c.free_symbols)
        )
        assertions = tuple((c, m) for c, m in assertions if c is not sympy.true)
        limits = {k: v for k, v in self.p.limits.items() if k not in (self.s.name, self.b.name)}
        program = dataclasses.replace(self.p, graph=graph, shape_env=self.env, assertions=assertions, limits=limits)
        return Packed(
            program,
            self.s.name,
            self.b.name,
            self.tokens,
            self.starts_name,
            self.ends_name,
            self.inputs,
            outputs,
            self.firsts_name,
            self.sequences if self.firsts_name is not None else None,
        )

    def node(self, n: Node) -> int:
        bld, op = self.bld, n.op
        if self.firsts_name is not None and self.picks(n):
            return self.pick(n)
        if any(i in self.per_seq for i in n.inputs):
            return self.per_sequence(n)
        t = self.type(n.type)
        if self.is_positions(n):
            self.pos.add(n.id)
            return bld.add(op, tuple(self.glob[i] for i in n.inputs), t, self.attrs(n), n.loc)
        held = [self.axes(i) for i in n.inputs]
        if op is K.SLICE and not held[0] and self.axes(n.id):
            return self.slice_positions(n, t)
        if op is K.SLICE and held[0]:
            a = n.attrs
            assert isinstance(a, SliceAttrs)
            if a.axis in held[0] and n.type.shape[a.axis] != self.s:
                raise NotPackable(
                    f"it reads {n.type.shape[a.axis]} positions of each sequence: only one position per sequence "
                    "(or the whole sequence) has a packed form"
                )
        if op in (K.SOFTMAX, K.LOG_SOFTMAX):
            a = n.attrs
            assert isinstance(a, AxisAttrs)
            if a.axis % len(n.type.shape) in held[0]:
                return self.attention(n, t, held[0])
        elif op is K.MATMUL:
            self.contraction(n, held)
        elif op is K.CAST and n.inputs[0] in self.masked:
            self.masked[n.id] = self.masked[n.inputs[0]]
        elif op is K.CUMSUM and held[0] and not n.type.dtype.is_floating:
            return self.running_sum(n, t, held[0])
        elif op is K.CUMSUM or OP_INFO[op].batch in (Batch.REDUCE, Batch.ARG_REDUCE, Batch.ALONG_AXIS, Batch.NORM):
            self.along(n, held[0] if held else [])
        elif op in (K.RECURRENT, K.SELECTIVE_SCAN) and any(held):
            raise NotPackable("a recurrence or scan along the sequence would run across the sequences packed together")
        ins = tuple(self.operand(n, k) for k in range(len(n.inputs)))
        return bld.add(op, ins, t, self.attrs(n), n.loc)

    def pick(self, n: Node) -> int:
        """One position p of each sequence: a take at each sequence's first token plus p, its rows then
        moved to where b was (Note [Packed sequences])."""
        a = n.attrs
        assert isinstance(a, SliceAttrs) and isinstance(a.start, int)
        src = self.types[n.inputs[0]].shape
        if self.b not in src:
            raise NotPackable(f"it reads a position of the sequence from a value without its rows {self.b}")
        rows = src.index(self.b)
        bld, i64 = self.bld, DType.INT64
        idx = self.firsts
        if a.start:
            c = bld.add(K.CONSTANT, (), TensorType(i64, ()), ConstantAttrs(a.start))
            idx = bld.add(K.ADD, (idx, c), TensorType(i64, (self.N,)))
        taken = tuple(self.N if k == a.axis else self.dim(d) for k, d in enumerate(src))
        v = bld.add(K.TAKE, (self.glob[n.inputs[0]], idx), TensorType(n.type.dtype, taken), AxisAttrs(a.axis), n.loc)
        perm = list(range(len(src)))
        perm[rows], perm[a.axis] = a.axis, rows
        self.per_seq.add(n.id)
        return bld.add(K.PERMUTE, (v,), self.type(n.type, per_seq=True), PermuteAttrs(tuple(perm)), n.loc)

    def per_sequence(self, n: Node) -> int:
        """An op on values with one row per sequence: b is the sequence count; tokens must not join."""
        if any(self.axes(i) for i in n.inputs):
            raise NotPackable("it combines values of one row per sequence with the tokens' values")
        if any(i in self.pos for i in n.inputs):
            raise NotPackable("it combines values of one row per sequence with positions along the sequence")
        self.per_seq.add(n.id)
        ins = tuple(self.glob[i] for i in n.inputs)
        return self.bld.add(n.op, ins, self.type(n.type, per_seq=True), self.attrs(n), n.loc)

    def along(self, n: Node, held: list[int]) -> None:
        """Reductions, scans, norms, sorts: refused when they run along s (they would mix sequences)."""
        a = n.attrs
        rank = len(self.types[n.inputs[0]].shape) if n.inputs else 0
        if isinstance(a, ReduceAttrs):
            axes = set(a.axes)
        elif isinstance(a, NormAttrs):
            axes = set(range(rank - a.num_axes, rank))
        else:
            axis = getattr(a, "axis", None)
            axes = set() if axis is None else {axis % rank if rank else axis}
        if axes & set(held):
            raise NotPackable(
                f"it runs {n.op.value} along the sequence: in a packed batch it would mix the sequences' tokens"
            )

    def running_sum(self, n: Node, t: TensorType, held: list[int]) -> int:
        """An integer cumulative sum along s (RoBERTa's position ids from the mask): the packed sum less
        its value before each token's sequence starts, exact in integers."""
        a = n.attrs
        assert isinstance(a, AxisAttrs)
        rank = len(t.shape)
        axis = a.axis % rank
        if axis not in held:
            return self.bld.add(n.op, (self.glob[n.inputs[0]],), t, self.attrs(n), n.loc)
        bld, i64 = self.bld, DType.INT64
        total = bld.add(K.CUMSUM, (self.glob[n.inputs[0]],), t, self.attrs(n), n.loc)
        tokens, scalar = TensorType(i64, (self.T,)), TensorType(i64, ())
        zero, one = (bld.add(K.CONSTANT, (), scalar, ConstantAttrs(c)) for c in (0, 1))
        later = bld.add(K.GT, (self.starts, zero), TensorType(DType.BOOL, (self.T,)))
        before = bld.add(K.WHERE, (later, bld.add(K.SUB, (self.starts, one), tokens), zero), tokens)
        prior = bld.add(K.TAKE, (total, before), t, AxisAttrs(axis))
        along = TensorType(DType.BOOL, tuple(self.T if k == axis else 1 for k in range(rank)))
        first = bld.add(K.RESHAPE, (later,), along)
        none = bld.add(K.CONSTANT, (), TensorType(t.dtype, ()), ConstantAttrs(0))
        return bld.add(K.SUB, (total, bld.add(K.WHERE, (first, prior, none), t)), t, loc=n.loc)

    def slice_positions(self, n: Node, t: TensorType) -> int:
        """A slice to length s of a tensor without s (a buffer of position ids): a take at each token's
        position in its sequence (plus the slice's start)."""
        a = n.attrs
        assert isinstance(a, SliceAttrs)
        if not isinstance(a.start, int) or a.step != 1:
            raise NotPackable("it slices a tensor to the sequence's length other than from a constant start by 1")
        idx = self.token_positions()
        if a.start:
            c = self.bld.add(K.CONSTANT, (), TensorType(DType.INT64, ()), ConstantAttrs(a.start))
            idx = self.bld.add(K.ADD, (idx, c), TensorType(DType.INT64, (self.T,)))
        return self.bld.add(K.TAKE, (self.glob[n.inputs[0]], idx), t, AxisAttrs(a.axis), n.loc)

    def attention(self, n: Node, t: TensorType, held: list[int]) -> int:
        """A softmax over keys along s whose rows are queries along s: scores outside each query's own
        sequence are -inf first (Note [Packed sequences])."""
        a = n.attrs
        assert isinstance(a, AxisAttrs)
        rank = len(t.shape)
        key = a.axis % rank
        queries = [ax for ax in held if ax != key]
        if n.op is K.LOG_SOFTMAX or len(queries) != 1:
            raise NotPackable(
                "it runs a softmax along the sequence whose rows are not the sequence's positions: "
                "in a packed batch it would mix the sequences"
            )
        q = queries[0]
        bld, i64 = self.bld, DType.INT64

        def along(v: int, axis: int) -> int:
            shape = tuple(self.T if k == axis else 1 for k in range(rank))
            return bld.add(K.RESHAPE, (v,), TensorType(i64, shape))

        keys = along(bld.add(K.ARANGE, (), TensorType(i64, (self.T,)), ArangeAttrs(0, 1)), key)
        grid = tuple(self.T if k in (key, q) else 1 for k in range(rank))
        after = bld.add(K.GE, (keys, along(self.starts, q)), TensorType(DType.BOOL, grid))
        before = bld.add(K.LT, (keys, along(self.ends, q)), TensorType(DType.BOOL, grid))
        inside = bld.add(K.LOGICAL_AND, (after, before), TensorType(DType.BOOL, grid))
        ninf = bld.add(K.CONSTANT, (), TensorType(t.dtype, ()), ConstantAttrs(-math.inf))
        x = self.types[n.inputs[0]]
        scores = bld.add(K.WHERE, (inside, self.glob[n.inputs[0]], ninf), self.type(x), loc=n.loc)
        self.masked[n.id] = key
        return bld.add(n.op, (scores,), t, self.attrs(n), n.loc)

    def contraction(self, n: Node, held: list[list[int]]) -> None:
        a = n.attrs
        assert isinstance(a, MatmulAttrs)
        ra, rb = (len(self.types[i].shape) for i in n.inputs)
        kb = rb - 1 if a.transpose_b else rb - 2
        x, y = n.inputs
        # zero outside each query's sequence along the contracted axis: the sum reads the sequence's own
        neutral = self.masked.get(x) == ra - 1 or self.masked.get(y) == kb
        if (ra - 1 in held[0] or kb in held[1]) and not neutral:
            raise NotPackable(
                "it contracts over the sequence outside attention: in a packed batch it would sum every "
                "sequence's tokens"
            )


def _is_zero(n: Node | None) -> bool:
    return n is not None and n.op in (K.CONSTANT, K.FULL) and isinstance(n.attrs, ConstantAttrs) and n.attrs.value == 0


def pack_sequences(p: Program, symbol: str | None = None) -> Packed:
    """Note [Packed sequences]: the packed form of `p` along `symbol` (None: the one dim whose padding
    proof holds with rows of their own length). NotPackable says why there is none."""
    p = canonicalize_shapes(p)
    batches = batch_proofs(p)
    rows = [bp for bp in batches if bp.proven]
    bound = [d for prm in p.graph.inputs for d in prm.type.shape if isinstance(d, sympy.Symbol)]
    names = [x.name for x in p.shape_env.symbols if x in bound and x.name not in {bp.symbol for bp in rows}]
    if symbol is not None:
        if symbol not in names:
            raise NotPackable(f"{symbol!r} is not a dynamic dim of the inputs that is not batch-like (those: {names})")
        names = [symbol]
    if not rows:
        why = "; ".join(f"{bp.symbol}: {bp.reason}" for bp in batches) or "no input has a dynamic dim"
        raise NotPackable(f"no dim is proven batch-like, so no rows may have their own length ({why})")
    reasons = []
    for name in names:
        s = p.shape_env.symbol(name)
        proof = prove_padding(p, s, batches)
        if not proof.proven or proof.rows is None:
            reasons.append(f"{name}: {proof.reason or 'no batch-like dim holds its rows'}")
            continue
        return _Packer(p, s, p.shape_env.symbol(proof.rows)).run()
    raise NotPackable("; ".join(reasons) or "no dynamic dim besides the batch-like ones")


__all__ = ["NotPackable", "Packed", "pack_sequences"]
