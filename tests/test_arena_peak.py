"""Note [Arena peak] (lowering/build_plan.py): the reference executor's arena bound, the max of a
plan's live sums, is built without comparing every pair of them, and is still their max at every shape."""

from __future__ import annotations

import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from bladepack.ir import ShapeEnv
from bladepack.lowering.build_plan import _max_of

# a live sum: constant, b, b*s, s^2, floor(s / 3) * b (a factor proven non-negative) and, opaque to the
# coefficient test, floor((s - 2000) / 7) * b (negative below s = 2000)
_TERM = st.tuples(*(st.integers(lo, hi) for lo, hi in ((-5, 60), (0, 60), (0, 9), (0, 3), (0, 2), (0, 2))))


@settings(max_examples=40, deadline=None)
@given(st.lists(_TERM, min_size=1, max_size=80))
def test_the_arena_peak_is_the_max_of_the_live_sums(coefficients: list[tuple[int, ...]]) -> None:
    env = ShapeEnv()
    b = env.create_symbol("b", 1, 32)
    s = env.create_symbol("s", 0, 4096)
    terms = [
        sympy.expand(
            c0 + c1 * b + c2 * b * s + c3 * s**2 + c4 * sympy.floor(s / 3) * b + c5 * sympy.floor((s - 2000) / 7) * b
        )
        for c0, c1, c2, c3, c4, c5 in coefficients
    ]
    peak = _max_of(env, terms)
    for bv in (1, 2, 7, 32):
        for sv in (0, 1, 2, 3, 5, 100, 1999, 2000, 2007, 4095, 4096):
            at = {b: bv, s: sv}
            assert peak.xreplace(at) == max(t.xreplace(at) for t in terms), (at, peak)


def test_a_long_program_keeps_the_sums_no_other_bounds() -> None:
    """Sums that grow step by step reduce to the last (a 1.1B decoder's 1,725 once took 22 s)."""
    env = ShapeEnv()
    b = env.create_symbol("b", 1, 32)
    p = env.create_symbol("p", 16, 4096)
    terms = [sympy.expand(k * b * p + 3 * b + 1) for k in range(2000)] + [sympy.Integer(0), 99999 * b]
    assert _max_of(env, terms) == sympy.Max(1999 * b * p + 3 * b + 1, 99999 * b)
