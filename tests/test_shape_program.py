"""Shape-program compilation: random sympy expressions agree with their bytecode at random bindings."""

from __future__ import annotations

import sympy
from hypothesis import example, given, settings
from hypothesis import strategies as st

from bladepack.artifact.shape_program import ShapeProgram
from bladepack.ir import ShapeEnv, Tri
from bladepack.lowering.shape_compiler import ShapeProgramBuilder

S = [sympy.Symbol(n, integer=True, nonnegative=True) for n in ("a", "b", "c")]


def exprs() -> st.SearchStrategy[sympy.Expr]:
    leaves = st.one_of(st.sampled_from(S), st.integers(-5, 9).map(sympy.Integer))

    def extend(children: st.SearchStrategy[sympy.Expr]) -> st.SearchStrategy[sympy.Expr]:
        pos = st.integers(1, 7).map(sympy.Integer)
        return st.one_of(
            st.tuples(children, children).map(lambda t: t[0] + t[1]),
            st.tuples(children, children).map(lambda t: t[0] - t[1]),
            st.tuples(children, children).map(lambda t: t[0] * t[1]),
            st.tuples(children, pos).map(lambda t: sympy.floor(t[0] / t[1])),
            st.tuples(children, pos).map(lambda t: sympy.ceiling(t[0] / t[1])),
            st.tuples(children, pos).map(lambda t: sympy.Mod(t[0], t[1])),
            st.tuples(children, children).map(lambda t: sympy.Max(t[0], t[1])),
            st.tuples(children, children).map(lambda t: sympy.Min(t[0], t[1])),
            st.tuples(children, st.integers(0, 3)).map(lambda t: t[0] ** t[1]),
        )

    return st.recursive(leaves, extend, max_leaves=8)


def _program(es: list[sympy.Expr]) -> tuple[ShapeProgram, list[int]]:
    b = ShapeProgramBuilder()
    for axis, s in enumerate(S):
        b.bind(s, b.dim(0, axis))
    regs = [b.expr(e) for e in es]
    prog = ShapeProgram.from_manifest(b.finish().to_manifest())  # through the serialized form
    return prog, regs


@settings(max_examples=300, deadline=None)
@given(e=exprs(), values=st.tuples(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50)))
@example(e=sympy.Min(S[1], sympy.Max(2 * S[0] + S[2], sympy.Min(S[0], S[2]))), values=(1, 3, 0))
def test_bytecode_agrees_with_sympy(e: sympy.Expr, values: tuple[int, int, int]) -> None:
    prog, regs = _program([e])
    # xreplace: all symbols at once, exactly; sympy's subs substitutes one at a time and simplified
    # Min(b, Max(2*a + c, Min(a, c))) at (1, 3, 0) to 3 on the way (its value is 2)
    want = e.xreplace({s: sympy.Integer(v) for s, v in zip(S, values)})
    got = prog.evaluate([values])[regs[0]]
    assert got == int(want), f"{e} at {values}: bytecode {got}, sympy {want}"


@settings(max_examples=200, deadline=None)
@given(e=exprs(), values=st.tuples(st.integers(1, 20), st.integers(1, 20), st.integers(1, 20)))
def test_simplification_preserves_value(e: sympy.Expr, values: tuple[int, int, int]) -> None:
    """What sympy simplifies (and the compiler relies on) agrees at every binding in range."""
    binding = {s: sympy.Integer(v) for s, v in zip(S, values)}
    assert int(sympy.N(sympy.simplify(e).xreplace(binding))) == int(sympy.N(e.xreplace(binding)))


@settings(max_examples=200, deadline=None)
@given(e=exprs(), values=st.tuples(st.integers(1, 20), st.integers(1, 20), st.integers(1, 20)))
def test_bounds_contain_every_value(e: sympy.Expr, values: tuple[int, int, int]) -> None:
    env = ShapeEnv()
    syms = [env.create_symbol(s.name, 1, 20) for s in S]
    e2 = e.xreplace(dict(zip(S, syms)))
    lo, hi = env.bounds(e2)
    # exact simultaneous binding (see above); unevaluated constants (Max(1, 2)) compare once evaluated
    v = e2.xreplace({s: sympy.Integer(x) for s, x in zip(syms, values)}).doit()
    assert lo <= v <= hi, f"{e2} = {v} at {values}, bounds [{lo}, {hi}]"


def test_proofs_are_never_guesses() -> None:
    env = ShapeEnv()
    s = env.create_symbol("s", 1, 512)
    t = env.create_symbol("t", 1, 64)
    assert env.prove_eq(2 * s - s, s) is Tri.YES
    assert env.prove_eq(s + 1, s) is Tri.NO
    assert env.prove_eq(s, t) is Tri.UNKNOWN
    assert env.prove_le(s, 512) is Tri.YES
    assert env.prove_le(s, 100) is Tri.UNKNOWN
    assert env.prove_le(s + 600, 100) is Tri.NO
    assert env.prove_divisible(4 * s, 2) is Tri.YES
    assert env.prove_divisible(s, 2) is Tri.UNKNOWN


_SHARED_ENV = ShapeEnv()  # one env for every example: answers come from its memo after the first
_SHARED_SYMS = [_SHARED_ENV.create_symbol(s.name, 1, 20) for s in S]


@settings(max_examples=200, deadline=None)
@given(a=exprs(), b=exprs(), values=st.tuples(st.integers(1, 20), st.integers(1, 20), st.integers(1, 20)))
def test_le_proofs_hold_at_every_binding(a: sympy.Expr, b: sympy.Expr, values: tuple[int, int, int]) -> None:
    """prove_le's YES / NO hold at each binding, with the intervals and answers one env remembers."""
    env, syms = _SHARED_ENV, _SHARED_SYMS
    x, y = (e.xreplace(dict(zip(S, syms))) for e in (a, b))
    binding = {s: sympy.Integer(v) for s, v in zip(syms, values)}
    vx, vy = (e.xreplace(binding).doit() for e in (x, y))
    for _ in range(2):  # the second answer comes from the memo
        answer = env.prove_le(x, y)
        assert answer is Tri.UNKNOWN or (vx <= vy) == (answer is Tri.YES), f"{x} <= {y} at {values}: {answer}"


def test_le_proofs_expand_where_terms_cancel() -> None:
    """A product of a sum is expanded before its interval is taken (t * (s + 1) - t * s is t)."""
    env = ShapeEnv()
    s = env.create_symbol("s", 1, 512)
    t = env.create_symbol("t", 1, 64)
    assert env.prove_le(t * s + t, t * (s + 1)) is Tri.YES
    assert env.prove_le(t * (s + 1), t * s) is Tri.NO


def test_common_subexpressions_share_registers() -> None:
    a, b = S[0], S[1]
    prog, regs = _program([a * b + 1, a * b + 1, a * b])
    assert regs[0] == regs[1]
    muls = [ins for ins in prog.code if ins[0] == 4]
    assert len(muls) == 1
