"""Shape symbols, their ranges, and proofs about symbolic dims.

In: symbols created by a front end with inclusive ranges. Out: answers to "provably equal / <= /
divisible" as `Tri` (YES, NO, UNKNOWN) — never a guess from sample values — and value bounds of any
dim expression by interval arithmetic over the symbol ranges.

Note [Symbol assumptions]: every symbol is created `integer=True, nonnegative=True`, so sympy may
simplify `floor`, `Mod` and `Max` with that knowledge; ranges beyond that live here, not in sympy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

import sympy

from bladepack.ir.types import IRDim


class Tri(Enum):
    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SymbolRange:
    min: int
    max: int | None  # None: unbounded

    def __str__(self) -> str:
        return f"[{self.min}, {'inf' if self.max is None else self.max}]"


Bound = tuple[sympy.Expr, sympy.Expr]  # (lo, hi) with sympy.oo for unbounded


class ShapeEnv:
    """The symbols of one program with their ranges. One per program; never global."""

    def __init__(self) -> None:
        self._ranges: dict[str, SymbolRange] = {}
        self._symbols: dict[str, sympy.Symbol] = {}
        # Note [Range facts]: every answer so far that the ranges decided, in order, without repeats
        self._facts: dict[RangeFact, None] = {}
        # _eq's answers: a symbol's range never changes once created, so an answer stays true (the
        # verifier asks the same broadcasts after every pass)
        self._eq_answers: dict[tuple[sympy.Basic, sympy.Basic], Tri] = {}
        # for the same reason, each expression's interval once (a memory plan asks thousands of
        # `le` questions of the same few sizes)
        self._intervals: dict[sympy.Basic, tuple[Num, Num]] = {}
        self._le_answers: dict[tuple[sympy.Basic, sympy.Basic], tuple[Tri, bool]] = {}

    # -- building
    def create_symbol(self, name: str, min: int, max: int | None) -> sympy.Symbol:
        if name in self._symbols:
            raise ValueError(f"symbol {name!r} already exists")
        if max is not None and max < min:
            raise ValueError(f"symbol {name!r}: empty range [{min}, {max}]")
        sym = sympy.Symbol(name, integer=True, nonnegative=True)
        self._symbols[name] = sym
        self._ranges[name] = SymbolRange(min, max)
        return sym

    # -- queries
    @property
    def symbols(self) -> list[sympy.Symbol]:
        return list(self._symbols.values())

    def symbol(self, name: str) -> sympy.Symbol:
        return self._symbols[name]

    def range_of(self, sym: sympy.Symbol | str) -> SymbolRange:
        return self._ranges[sym if isinstance(sym, str) else sym.name]

    def restore_facts(self, facts: Sequence[RangeFact]) -> None:
        """Take over the facts a program's front end recorded under other ranges (extend: they remain
        the program's, whoever extends it next checks them again)."""
        for f in facts:
            self._facts[f] = None

    @property
    def facts(self) -> tuple[RangeFact, ...]:
        """Note [Range facts]: the answers the ranges decided, oldest first."""
        return tuple(self._facts)

    def bounds(self, e: IRDim) -> Bound:
        """Inclusive lower and upper bounds of `e` over every binding in range."""
        e = sympy.sympify(e)
        lo, hi = interval(e, self._ranges, self._intervals)
        if e.free_symbols:
            self._facts[RangeFact("bounds", e, 0, (_finite(lo), _finite(hi)))] = None
        return lo, hi

    def prove_le(self, a: IRDim, b: IRDim) -> Tri:
        x, y = sympy.sympify(a), sympy.sympify(b)
        answer, ranged = self._le_answer(x, y)
        if answer is not Tri.UNKNOWN and ranged:
            self._facts[RangeFact("le", x, y, answer)] = None
        return answer

    def prove_eq(self, a: IRDim, b: IRDim) -> Tri:
        answer = self._eq(a, b)
        if answer is Tri.NO and (sympy.sympify(a).free_symbols or sympy.sympify(b).free_symbols):
            self._facts[RangeFact("eq", sympy.sympify(a), sympy.sympify(b), answer)] = None
        return answer

    def differ(self, a: IRDim, b: IRDim) -> Tri:
        """A quick `prove_eq` for checks that act only on a proof: YES when a - b expands to 0, NO when
        the ranges put it away from 0, else UNKNOWN (never sympy.simplify, which can take seconds on a
        windowed model's floor expressions). Records no fact: nothing is built on the answer."""
        x, y = sympy.sympify(a), sympy.sympify(b)
        if x == y:
            return Tri.YES
        diff = sympy.expand(x - y)
        if diff == 0:
            return Tri.YES
        lo, hi = interval(diff, self._ranges, self._intervals)
        return Tri.NO if lo > 0 or hi < 0 else Tri.UNKNOWN

    def _le(self, a: IRDim, b: IRDim) -> Tri:
        return self._le_answer(sympy.sympify(a), sympy.sympify(b))[0]

    def _le_answer(self, a: sympy.Basic, b: sympy.Basic) -> tuple[Tri, bool]:
        """Whether a <= b, and whether the answer rests on the ranges (b - a has symbols)."""
        found = self._le_answers.get((a, b))
        if found is None:
            # intervals are sound on any form of b - a; expanding (slow: ~1 ms on a memory plan's
            # aligned sizes) only tightens them, so it is tried only when the plain difference is
            # undecided
            diff = b - a
            answer = self._sign(diff)
            if answer is Tri.UNKNOWN and _distributable(diff):
                diff = sympy.expand(diff)
                answer = self._sign(diff)
            found = self._le_answers[(a, b)] = (answer, bool(diff.free_symbols))
        return found

    def _sign(self, diff: sympy.Basic) -> Tri:
        """YES when diff >= 0 over the ranges, NO when < 0, else UNKNOWN."""
        lo, hi = _interval(diff, self._ranges, self._intervals)
        return Tri.YES if lo >= 0 else Tri.NO if hi < 0 else Tri.UNKNOWN

    def _eq(self, a: IRDim, b: IRDim) -> Tri:
        x, y = sympy.sympify(a), sympy.sympify(b)
        if x == y:
            return Tri.YES
        if x.is_Integer and y.is_Integer:
            return Tri.NO
        answer = self._eq_answers.get((x, y))
        if answer is None:
            diff = sympy.simplify(x - y)
            if diff == 0:
                answer = Tri.YES
            else:
                lo, hi = interval(diff, self._ranges, self._intervals)
                answer = Tri.NO if lo > 0 or hi < 0 else Tri.UNKNOWN
            self._eq_answers[(x, y)] = answer
        return answer

    def holds(self, f: RangeFact) -> bool:
        """Whether fact `f`, recorded under other ranges, is still true under these (Note [Range facts])."""
        if f.kind == "le":
            return self._le(f.a, f.b) is f.answer
        if f.kind == "eq":
            return self._eq(f.a, f.b) is f.answer
        assert isinstance(f.answer, tuple)
        lo, hi = (_finite(v) for v in interval(f.a, self._ranges, self._intervals))
        was_lo, was_hi = f.answer
        return (was_lo is None or (lo is not None and lo >= was_lo)) and (
            was_hi is None or (hi is not None and hi <= was_hi)
        )

    def prove_divisible(self, a: IRDim, k: int) -> Tri:
        if sympy.simplify(sympy.Mod(a, k)) == 0:
            return Tri.YES
        if isinstance(a, int) or sympy.sympify(a).is_Integer:
            return Tri.NO
        return Tri.UNKNOWN


def _distributable(e: sympy.Basic) -> bool:
    """Whether expanding `e` could cancel terms: some product or power of its sum has a sum inside
    (a difference of two sums of products is already expanded: sympy combines like terms itself)."""
    for t in e.args if isinstance(e, sympy.Add) else (e,):
        for f in t.args if isinstance(t, sympy.Mul) else (t,):
            if isinstance(f, sympy.Add) or (isinstance(f, sympy.Pow) and isinstance(f.base, sympy.Add)):
                return True
    return False


@dataclass(frozen=True)
class RangeFact:
    """Note [Range facts]: an answer about dims that the symbol ranges decided — `le` (a <= b is
    `answer`), `eq` (a == b is `answer`, NO only: YES is algebra), or `bounds` (a lies within `answer`,
    (lo, hi) with None for unbounded). A front end that relied on such an answer built a program valid
    for those ranges; whoever changes the ranges later (`bladepack extend`) must find every fact still
    true (`ShapeEnv.holds`). Narrowing a range keeps every fact; widening may not."""

    kind: str
    a: sympy.Expr
    b: sympy.Expr | int
    answer: Tri | tuple[int | None, int | None]


def _finite(v: sympy.Expr) -> int | None:
    return None if v in (sympy.oo, -sympy.oo) else int(v)


Num = int | Fraction | float  # float only for +-inf (and nan from inf - inf)


def _mul_bounds(x: tuple[Num, Num], y: tuple[Num, Num]) -> tuple[Num, Num]:
    cands: list[Num] = []
    for p in x:
        for q in y:
            if (p == 0 and math.isinf(q)) or (q == 0 and math.isinf(p)):
                cands.append(0)
            else:
                cands.append(p * q)
    return min(cands), max(cands)


def _as_sympy(v: Num) -> sympy.Expr:
    if isinstance(v, float):
        return sympy.oo if v > 0 else -sympy.oo if v < 0 else sympy.nan
    if isinstance(v, Fraction):
        return sympy.Rational(v.numerator, v.denominator)
    return sympy.Integer(v)


def _as_num(v: sympy.Expr) -> Num:
    if v is sympy.oo or v is -sympy.oo:
        return math.inf if v is sympy.oo else -math.inf
    if v.is_Integer:
        return int(v)
    if v.is_Rational:
        return Fraction(int(v.p), int(v.q))
    try:
        return Fraction(float(v))
    except (TypeError, ValueError, OverflowError):  # nan, complex infinity: nothing is known
        return math.nan


def interval(
    e: sympy.Expr, ranges: dict[str, SymbolRange], memo: dict[sympy.Basic, tuple[Num, Num]] | None = None
) -> Bound:
    """Inclusive (lo, hi) of `e` by interval arithmetic over the symbol ranges (sympy.oo where unbounded).
    Computed in Python integers and fractions (sympy's numbers are slow), the result in sympy's. `memo`:
    intervals of (sub)expressions already computed under these same ranges (a ShapeEnv keeps one)."""
    lo, hi = _interval(e, ranges, {} if memo is None else memo)
    return _as_sympy(lo), _as_sympy(hi)


def _interval(
    e: sympy.Expr, ranges: dict[str, SymbolRange], memo: dict[sympy.Basic, tuple[Num, Num]]
) -> tuple[Num, Num]:
    if isinstance(e, sympy.Symbol):
        r = ranges.get(e.name)
        if r is None:
            return -math.inf, math.inf
        return r.min, (math.inf if r.max is None else r.max)
    if isinstance(e, sympy.Number):
        v = _as_num(e)
        return v, v
    found = memo.get(e)
    if found is None:
        found = memo[e] = _compound(e, ranges, memo)
    return found


def _compound(
    e: sympy.Expr, ranges: dict[str, SymbolRange], memo: dict[sympy.Basic, tuple[Num, Num]]
) -> tuple[Num, Num]:
    if not e.free_symbols:  # a constant, possibly unevaluated: evaluate it
        v = _as_num(e.doit())
        return v, v
    if isinstance(e, sympy.Add):
        lo: Num = 0
        hi: Num = 0
        for t in e.args:
            a, b = _interval(t, ranges, memo)
            lo, hi = lo + a, hi + b
        return lo, hi
    if isinstance(e, sympy.Mul):
        acc: tuple[Num, Num] = (1, 1)
        for t in e.args:
            acc = _mul_bounds(acc, _interval(t, ranges, memo))
        return acc
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
        acc = (1, 1)
        base = _interval(e.base, ranges, memo)
        for _ in range(int(e.exp)):
            acc = _mul_bounds(acc, base)
        if int(e.exp) % 2 == 0 and base[0] < 0:
            acc = (0, acc[1])
        return acc
    if isinstance(e, sympy.Pow) and e.exp == -1:
        lo, hi = _interval(e.base, ranges, memo)
        if lo > 0:
            return (Fraction(1) / hi if not math.isinf(hi) else 0), Fraction(1) / lo
        return -math.inf, math.inf
    if isinstance(e, (sympy.floor, sympy.ceiling)):
        lo, hi = _interval(e.args[0], ranges, memo)
        f = math.floor if isinstance(e, sympy.floor) else math.ceil
        return (lo if math.isinf(lo) else f(lo)), (hi if math.isinf(hi) else f(hi))
    if isinstance(e, (sympy.Max, sympy.Min)):
        bs = [_interval(a, ranges, memo) for a in e.args]
        pick = max if isinstance(e, sympy.Max) else min
        return pick(b[0] for b in bs), pick(b[1] for b in bs)
    if isinstance(e, sympy.Mod):
        _, m_hi = _interval(e.args[1], ranges, memo)
        return 0, (m_hi - 1 if not math.isinf(m_hi) else math.inf)
    return -math.inf, math.inf
