"""Shape-constraint analysis: what a program's ops imply about its symbolic dims.

In: a `Program` (graph and `ShapeEnv`), or facts added one by one. Out: `ShapeConstraints`, which holds
- equality classes of symbols (elementwise operands, matmul contracting and batch dims, concat's
  other dims, permutes, norms): every symbol is rewritten to its class representative (the symbol
  created first), whose range is the intersection of the members' ranges;
- definitions: a symbol proven equal to an expression of others (a reshape's product equality, a
  concat's summed axis) is replaced by that expression;
- residual equalities that no symbol can be solved from (`s0*s1 == s2*s3`), used by `eq`;
- broadcasts: an operand dim read at a result dim's index. Generated kernels broadcast only a dim
  that is 1 in the program (stride 0), so any other operand dim must equal the result dim: an equality.

Queries (`eq`, `le`, `is_one`, `same_shape`) answer `Tri.YES / NO / UNKNOWN`, proven over every
binding in range that satisfies the facts — never from sample values. A fact no binding in range can
satisfy raises `ShapeConflict`, naming the op that implied it.

Note [Sound simplification]: `canonical(e)` substitutes equals for equals only (class representatives
and definitions derived from facts), so `e` and `canonical(e)` agree on every binding that satisfies
the facts; the hypothesis tests check exactly this against exhaustive enumeration. Interval bounds
use the refined class ranges and ignore the ranges of eliminated symbols, which only widens them:
a YES or NO stays a proof.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from bladepack.errors import BladepackError
from bladepack.ir import Graph, OpKind, Program, ShapeEnv, Tri
from bladepack.ir.ops import OP_INFO, AxisAttrs, Conv2dAttrs, MatmulAttrs, NormAttrs, OpClass, PermuteAttrs
from bladepack.ir.shape_env import SymbolRange, interval
from bladepack.ir.types import IRDim, canonical_dim


class ShapeConflict(BladepackError, ValueError):
    """The program's ops imply a fact about its dims that no input shape in range satisfies."""


@dataclass(frozen=True)
class Fact:
    """lhs == rhs on every valid binding, with the op that implied it."""

    lhs: IRDim
    rhs: IRDim
    why: str

    def __str__(self) -> str:
        return f"{self.lhs} == {self.rhs}  ({self.why})"


def _expr(e: IRDim | sympy.Expr) -> sympy.Expr:
    return sympy.expand(sympy.sympify(e))


class ShapeConstraints:
    """Facts about the symbols of one program (see the module docstring). One per program."""

    def __init__(self, env: ShapeEnv) -> None:
        self._order = {s.name: k for k, s in enumerate(env.symbols)}
        self._ranges: dict[str, SymbolRange] = {s.name: env.range_of(s) for s in env.symbols}
        self._subst: dict[sympy.Symbol, sympy.Expr] = {}  # eliminated symbol -> expression of the rest
        self._residual: list[tuple[sympy.Expr, str]] = []  # expressions proven zero
        self._multiples: dict[tuple[sympy.Expr, sympy.Expr], bool] = {}  # _multiple's answers
        self._atoms: dict[sympy.Expr, sympy.Expr] = {}  # Note [Atom values]
        self.facts: list[Fact] = []  # every fact added, for dumps and error messages

    # -- building
    def equate(self, a: IRDim, b: IRDim, why: str) -> None:
        """Record a == b for every valid binding."""
        d = _expr(self.canonical(a) - self.canonical(b))
        if d == 0:
            return
        self.facts.append(Fact(a, b, why))
        if self._tri_zero(d) is Tri.NO:
            raise ShapeConflict(f"{why}: {a} == {b} cannot hold for any input shape in range ({self._range_text(d)})")
        for s in sorted(d.free_symbols, key=lambda s: -self._order.get(s.name, -1)):
            c = d.coeff(s)
            if c in (1, -1) and s not in _expr(d - c * s).free_symbols:
                self._eliminate(s, _expr(-(d - c * s) / c), why)
                return
        self._residual.append((d, why))
        self._learn_atom(d)

    def _learn_atom(self, d: sympy.Expr) -> None:
        """Note [Atom values]: a residual fact `F + c == 0` whose only non-constant term is one
        non-polynomial atom F (Max, Min, floor, ceiling, Mod) gives F's value; `canonical` rewrites F to
        it (sound: equal on every binding that satisfies the facts, and the fact stays a run-time guard).
        A clamped slice length `Max(0, Min(n, s + 1) - Min(n, s))` that the program equates with 1 so
        becomes 1 everywhere."""
        terms = sympy.Add.make_args(d)
        rest = [t for t in terms if not t.is_Integer]
        if len(rest) != 1:
            return
        coeff, atom = rest[0].as_coeff_Mul()
        if coeff in (1, -1) and isinstance(atom, (sympy.Max, sympy.Min, sympy.floor, sympy.ceiling, sympy.Mod)):
            const = sum((t for t in terms if t.is_Integer), sympy.Integer(0))
            self._atoms[atom] = _expr(-const / coeff)

    def equate_shapes(self, a: Sequence[IRDim], b: Sequence[IRDim], why: str) -> None:
        for x, y in zip(a, b, strict=True):
            self.equate(x, y, why)

    def broadcast(self, operand: IRDim, result: IRDim, why: str) -> None:
        """Record that an operand dim is broadcast to a result dim. A dim that is 1 in the program
        broadcasts (stride 0); any other is read at the result's index, so it must equal the result dim
        (a front end that cannot tell, such as ONNX's `N` against `M`, gets that equality, guarded at run
        time like every other)."""
        if self.is_one(operand) is Tri.YES or self.eq(operand, result) is Tri.YES:
            return
        self.equate(operand, result, f"{why} (only a dim that is 1 at compile time broadcasts)")

    def _eliminate(self, s: sympy.Symbol, value: sympy.Expr, why: str) -> None:
        gone = self._ranges.get(s.name)
        if gone is not None:
            self._narrow(value, gone, f"{why}: {s} in {gone} cannot equal {value}")
        self._subst = {k: _expr(v.xreplace({s: value})) for k, v in self._subst.items()}
        self._subst[s] = value
        self._residual = [(_expr(r.xreplace({s: value})), w) for r, w in self._residual]
        self._residual = [(r, w) for r, w in self._residual if r != 0]
        self._atoms = {_expr(k.xreplace({s: value})): v for k, v in self._atoms.items()}

    def _narrow(self, value: sympy.Expr, rng: SymbolRange, conflict: str) -> None:
        """`value` lies in `rng` on every valid binding: where `value` is c*t + d in one symbol t, narrow
        t's range to match (other forms keep their symbols' ranges, which only widens bounds)."""
        syms = value.free_symbols
        if len(syms) != 1:
            return
        (t,) = syms
        c, d = value.coeff(t), _expr(value - value.coeff(t) * t)
        if t.name not in self._ranges or not (c.is_Integer and d.is_Integer) or c == 0 or t in c.free_symbols:
            return
        cur = self._ranges[t.name]
        ends = [sympy.Integer(rng.min) - d, (sympy.oo if rng.max is None else sympy.Integer(rng.max) - d)]
        lo_v, hi_v = (ends[0] / c, ends[1] / c) if c > 0 else (ends[1] / c, ends[0] / c)
        lo = max(cur.min, int(sympy.ceiling(lo_v)) if lo_v.is_finite else cur.min)
        hi_b = None if not hi_v.is_finite else int(sympy.floor(hi_v))
        hi = cur.max if hi_b is None else hi_b if cur.max is None else min(cur.max, hi_b)
        if hi is not None and hi < lo:
            raise ShapeConflict(conflict)
        self._ranges[t.name] = SymbolRange(lo, hi)

    # -- queries
    def canonical(self, e: IRDim | sympy.Expr) -> IRDim:
        """`e` with every symbol replaced by its representative or definition (equal on every valid binding)."""
        if isinstance(e, int):
            return e
        c = _expr(sympy.sympify(e).xreplace(self._subst))
        return canonical_dim(_expr(c.xreplace(self._atoms)) if self._atoms else c)

    def eliminated(self) -> dict[sympy.Symbol, sympy.Expr]:
        """Each symbol rewritten away, with the expression of representatives that replaces it."""
        return dict(self._subst)

    def residual(self) -> list[tuple[sympy.Expr, str]]:
        """Equalities no symbol could be solved from, as expressions proven zero (with their reasons)."""
        return list(self._residual)

    def range_of(self, name: str) -> SymbolRange:
        """The refined range of a representative symbol (the intersection over its class)."""
        return self._ranges[name]

    def bounds(self, e: IRDim | sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
        return interval(_expr(self.canonical(e)), self._ranges)

    def eq(self, a: IRDim, b: IRDim) -> Tri:
        d = _expr(self.canonical(a) - self.canonical(b))
        if d == 0:
            return Tri.YES
        if d.is_Number or self._tri_zero(d) is Tri.NO:  # never 0 on a valid binding: no fact makes it 0
            return Tri.NO
        opaque = d.atoms(sympy.Function)  # floor, Mod, Max, ...: a quotient keeping one is no polynomial
        for r, _ in self._residual:
            if opaque <= r.atoms(sympy.Function) and self._multiple(d, r):
                return Tri.YES  # d == c * r and r == 0
        return Tri.UNKNOWN

    def _multiple(self, d: sympy.Expr, r: sympy.Expr) -> bool:
        """Whether d is a polynomial multiple of r (sympy's cancel, ~10 ms on a chunked scan's sizes:
        each pair is asked once)."""
        found = self._multiples.get((d, r))
        if found is None:
            c = sympy.cancel(d / r)
            found = bool(c.is_polynomial(*r.free_symbols, *d.free_symbols)) and sympy.fraction(c)[1] == 1
            self._multiples[(d, r)] = found
        return found

    def le(self, a: IRDim, b: IRDim) -> Tri:
        if self.eq(a, b) is Tri.YES:
            return Tri.YES
        lo, hi = self.bounds(_expr(sympy.sympify(b) - sympy.sympify(a)))
        if lo >= 0:
            return Tri.YES
        if hi < 0:
            return Tri.NO
        return Tri.UNKNOWN

    def is_one(self, a: IRDim) -> Tri:
        return self.eq(a, 1)

    def same_shape(self, a: Sequence[IRDim], b: Sequence[IRDim]) -> Tri:
        if len(a) != len(b):
            return Tri.NO
        answers = [self.eq(x, y) for x, y in zip(a, b)]
        if all(t is Tri.YES for t in answers):
            return Tri.YES
        return Tri.NO if Tri.NO in answers else Tri.UNKNOWN

    def text(self) -> str:
        """The facts with their reasons, then the definitions, residual facts and ranges they imply, one
        per line (for BLADEPACK_DUMP)."""
        lines = [f"fact {f}" for f in self.facts]
        lines += [f"{s} := {v}" for s, v in sorted(self._subst.items(), key=lambda kv: kv[0].name)]
        lines += [f"{r} == 0  ({w})" for r, w in self._residual]
        gone = {s.name for s in self._subst}
        lines += [f"{n} in {r}" for n, r in self._ranges.items() if n not in gone]
        return "\n".join(lines) + "\n"

    def _tri_zero(self, d: sympy.Expr) -> Tri:
        lo, hi = interval(d, self._ranges)
        if lo > 0 or hi < 0:
            return Tri.NO
        return Tri.UNKNOWN

    def _range_text(self, d: sympy.Expr) -> str:
        return ", ".join(
            f"{s} in {self._ranges[s.name]}" for s in sorted(d.free_symbols, key=str) if s.name in self._ranges
        )


# ------------------------------------------------------------------------------------------ analysis


def _where(n_op: str, loc: str) -> str:
    return f"{n_op} at {loc}" if loc else n_op


def analyze(p: Program) -> ShapeConstraints:
    """Every fact the program's ops imply about its dims (see the module docstring)."""
    cons = ShapeConstraints(p.shape_env)
    add_graph_facts(cons, p.graph)
    return cons


def add_graph_facts(cons: ShapeConstraints, g: Graph) -> None:
    types = g.value_types()
    for n in g.nodes:
        why = _where(n.op.value, n.loc)
        out = n.type.shape
        ins = [types[i].shape for i in n.inputs]
        cls = OP_INFO[n.op].op_class
        if cls in (OpClass.ELEMENTWISE, OpClass.BROADCAST) and n.op not in (OpKind.FULL, OpKind.CONSTANT):
            for s in ins:  # numpy broadcasting: align from the right
                for d, r in zip(reversed(s), reversed(out)):
                    cons.broadcast(d, r, why)
        elif n.op is OpKind.RESHAPE:
            cons.equate(_product(ins[0]), _product(out), why)
        elif n.op is OpKind.PERMUTE:
            assert isinstance(n.attrs, PermuteAttrs)
            cons.equate_shapes([ins[0][k] for k in n.attrs.perm], out, why)
        elif n.op is OpKind.CONCAT:
            assert isinstance(n.attrs, AxisAttrs)
            axis = n.attrs.axis % len(out)
            for s in ins:
                cons.equate_shapes(
                    [d for k, d in enumerate(s) if k != axis], [d for k, d in enumerate(out) if k != axis], why
                )
            cons.equate(sympy.Add(*[sympy.sympify(s[axis]) for s in ins]), out[axis], why)
        elif n.op in (OpKind.SOFTMAX, OpKind.LOG_SOFTMAX, OpKind.CUMSUM):
            cons.equate_shapes(ins[0], out, why)
        elif n.op in (OpKind.LAYER_NORM, OpKind.RMS_NORM):
            assert isinstance(n.attrs, NormAttrs)
            cons.equate_shapes(ins[0], out, why)
            for s in ins[1:]:  # weight and bias cover the normalized trailing axes
                cons.equate_shapes(s, out[len(out) - n.attrs.num_axes :], why)
        elif n.op is OpKind.MATMUL:
            assert isinstance(n.attrs, MatmulAttrs)
            a, b = ins
            kb = b[-1] if n.attrs.transpose_b else b[-2]
            nb = b[-2] if n.attrs.transpose_b else b[-1]
            cons.equate(a[-1], kb, f"{why} (contracting dims)")
            cons.equate(a[-2], out[-2], why)
            cons.equate(nb, out[-1], why)
            for s in (a[:-2], b[:-2]):  # batch dims broadcast
                for d, r in zip(reversed(s), reversed(out[:-2])):
                    cons.broadcast(d, r, f"{why} (batch dims)")
        elif n.op is OpKind.CONV2D:
            assert isinstance(n.attrs, Conv2dAttrs)
            x, w = ins[0], ins[1]
            layout = n.attrs.out_layout
            nb, oc = (out[1], out[0]) if layout == "cnhw" else (out[0], out[3] if layout == "nhwc" else out[1])
            cons.equate(x[0], nb, why)
            # panels and blocks hold C_out rounded up (Note [Dense weight panels], Note [Wide convolutions])
            if n.attrs.weight_layout not in ("panels", "tap_panels", "winograd"):
                cons.equate(w[-1] if n.attrs.weight_layout in ("ihwo", "hwio_winograd") else w[0], oc, why)


def _product(dims: Sequence[IRDim]) -> sympy.Expr:
    return sympy.Mul(*[sympy.sympify(d) for d in dims])
