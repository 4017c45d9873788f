"""What a value holds at padded positions: the small value lattice of the padding proof.

In: an elementwise op and, per operand, what it holds at the padded positions along one axis. Out:
what the result holds there. Used by ir/padding.py (Note [Padding proofs]).

A `Pad` is one of: an exact number (0.0 and 1.0 also stand for False and True), `NEG` (a number so
negative that exp of it minus any finite score is 0: -inf, a dtype's minimum, or at most `NEG_BOUND`),
or `ANY` (some finite value that may depend on what the padded positions hold). ANY is the default and
is always sound; the proof only ever needs 0 (a masked product or sum), 1 and NEG (a masked softmax
or max). Values at padded positions are finite because padded positions hold the pad values, which are
legitimate inputs (token 0, a feature of 0): a model finite on its inputs is finite there too. That is
what lets 0 times ANY be 0 and NEG plus ANY stay NEG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import numpy as np

from bladepack.ir.ops import OP_INFO, OpKind

K = OpKind


class _Neg:
    def __repr__(self) -> str:
        return "NEG"


NEG: Final = _Neg()
ANY: Final = None
Pad = float | _Neg | None

# A masked score at or below this is 0 after softmax's exp whatever finite score it was added to:
# Hugging Face's masks use the dtype's minimum, older exports -10000.
NEG_BOUND: Final = -1.0e4


def is_neg(c: Pad) -> bool:
    return c is NEG or (isinstance(c, float) and c <= NEG_BOUND)


def exact(c: Pad) -> bool:
    return isinstance(c, float) and not math.isnan(c)


def _truthy(c: Pad) -> bool | None:
    return bool(c) if exact(c) else None


def _sign_positive(c: Pad) -> bool:
    return exact(c) and c > 0  # type: ignore[operator]


def _mul(cs: Sequence[Pad]) -> Pad:
    if any(exact(c) and c == 0 for c in cs):
        return 0.0
    a, b = cs
    if (is_neg(a) and _sign_positive(b)) or (is_neg(b) and _sign_positive(a)):
        return NEG
    return ANY


def _add(cs: Sequence[Pad]) -> Pad:
    return NEG if any(is_neg(c) for c in cs) and not any(_sign_positive(c) and c == math.inf for c in cs) else ANY


def _sub(cs: Sequence[Pad]) -> Pad:
    return NEG if is_neg(cs[0]) and not is_neg(cs[1]) else ANY


def _and(cs: Sequence[Pad]) -> Pad:
    return 0.0 if any(_truthy(c) is False for c in cs) else ANY


def _or(cs: Sequence[Pad]) -> Pad:
    return 1.0 if any(_truthy(c) is True for c in cs) else ANY


def _where(cs: Sequence[Pad]) -> Pad:
    t = _truthy(cs[0])
    if t is None:
        return cs[1] if (cs[1] == cs[2] and exact(cs[1])) or (is_neg(cs[1]) and is_neg(cs[2])) else ANY
    return cs[1] if t else cs[2]


def _minimum(cs: Sequence[Pad]) -> Pad:
    return NEG if any(is_neg(c) for c in cs) else ANY


def _maximum(cs: Sequence[Pad]) -> Pad:
    return NEG if all(is_neg(c) for c in cs) else ANY


def _div(cs: Sequence[Pad]) -> Pad:
    if exact(cs[0]) and cs[0] == 0 and exact(cs[1]) and cs[1] != 0:
        return 0.0
    return NEG if is_neg(cs[0]) and _sign_positive(cs[1]) else ANY


def _exp(cs: Sequence[Pad]) -> Pad:
    return 0.0 if is_neg(cs[0]) else ANY


def _keep_neg(cs: Sequence[Pad]) -> Pad:
    return NEG if is_neg(cs[0]) else ANY


# the ops with a rule for operands that are not all exact
_RULES: Final[dict[OpKind, Callable[[Sequence[Pad]], Pad]]] = {
    K.MUL: _mul,
    K.ADD: _add,
    K.SUB: _sub,
    K.DIV: _div,
    K.LOGICAL_AND: _and,
    K.BITWISE_AND: _and,
    K.LOGICAL_OR: _or,
    K.BITWISE_OR: _or,
    K.WHERE: _where,
    K.MINIMUM: _minimum,
    K.MAXIMUM: _maximum,
    K.EXP: _exp,
}


def combine(op: OpKind, attrs: Mapping[str, object], cs: Sequence[Pad], dtype: str) -> Pad:
    """What the elementwise `op` gives at a padded position where its operands hold `cs`; `dtype` is
    the result's (a cast to bool or an integer type rounds an exact result)."""
    if op is K.EXPAND:  # the same values, broadcast
        return cs[0]
    if op is K.CAST:
        c = cs[0]
        if dtype == "bool":
            t = _truthy(c)
            return ANY if t is None else float(t)
        if dtype.startswith(("float", "bfloat")):
            return c
        return float(int(c)) if exact(c) and abs(c) < 2**62 else ANY  # type: ignore[arg-type]
    if all(exact(c) for c in cs):
        fn = OP_INFO[op].numpy
        if fn is not None:
            nums = [c for c in cs if isinstance(c, float)]
            with np.errstate(all="ignore"):
                try:
                    r = np.asarray(fn(*[np.float64(c) for c in nums], **attrs), dtype=np.float64)
                except TypeError:  # an integer op (bitwise and, shifts): on the integers, where they are
                    whole = all(c.is_integer() and abs(c) < 2**62 for c in nums)
                    r = (
                        np.asarray(fn(*[np.int64(c) for c in nums], **attrs), dtype=np.float64)
                        if whole
                        else np.zeros(1)
                    )
            if r.shape == ():
                v = float(r)
                if dtype == "bool":
                    return float(bool(v))
                return v if not math.isnan(v) else ANY
    rule = _RULES.get(op)
    if rule is not None:
        return rule(cs)
    return _keep_neg(cs) if op in (K.FLOOR, K.CEIL, K.TRUNC, K.ROUND) else ANY


def describe(c: Pad) -> str:
    if c is NEG:
        return "a large negative number"
    if c is ANY:
        return "anything"
    return repr(c)
