"""Shape-constraint analysis: facts implied by ops, and soundness of every simplification and answer
against exhaustive enumeration of the bindings that satisfy the facts (hypothesis)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bladepack.dtypes import DType
from bladepack.ir import GraphBuilder, OpKind, Program, ShapeEnv, Tri
from bladepack.ir.ops import AxisAttrs, MatmulAttrs
from bladepack.ir.types import TensorType
from bladepack.passes.shape_constraints import ShapeConflict, ShapeConstraints, analyze

N_SYMS, TOP = 4, 5  # symbols s0..s3, each with a range inside [1, TOP]: every binding can be enumerated

# A fact: ("eq", i, j) s_i == s_j; ("mul", i, j, k) s_i == s_j * s_k; ("add", i, j, c) s_i == s_j + c;
# ("prod", i, j, k, l) s_i * s_j == s_k * s_l; ("bcast", i, j) s_i broadcasts to s_j: nothing when s_i is
# provably 1, else s_i == s_j ("bcast-free" / "bcast-eq" once applied, see _apply).
_i = st.integers(0, N_SYMS - 1)
facts_st = st.lists(
    st.one_of(
        st.tuples(st.just("eq"), _i, _i),
        st.tuples(st.just("mul"), _i, _i, _i),
        st.tuples(st.just("add"), _i, _i, st.integers(-2, 2)),
        st.tuples(st.just("prod"), _i, _i, _i, _i),
        st.tuples(st.just("bcast"), _i, _i),
    ),
    max_size=4,
)
ranges_st = st.lists(
    st.tuples(st.integers(1, TOP), st.integers(1, TOP)).map(lambda t: (min(t), max(t))),
    min_size=N_SYMS,
    max_size=N_SYMS,
)


@st.composite
def exprs(draw: Any, depth: int = 2) -> Any:
    """A small integer expression tree over the symbols: (op, ...) tuples built into sympy later."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.one_of(st.tuples(st.just("sym"), _i), st.tuples(st.just("int"), st.integers(-3, 4))))
    op = draw(st.sampled_from(["+", "*", "-", "floordiv2", "max"]))
    if op == "floordiv2":
        return (op, draw(exprs(depth - 1)))
    return (op, draw(exprs(depth - 1)), draw(exprs(depth - 1)))


def _build(t: Any, syms: list[sympy.Symbol]) -> sympy.Expr:
    kind = t[0]
    if kind == "sym":
        return syms[t[1]]
    if kind == "int":
        return sympy.Integer(t[1])
    if kind == "floordiv2":
        return sympy.floor(_build(t[1], syms) / 2)
    a, b = _build(t[1], syms), _build(t[2], syms)
    return {"+": a + b, "*": a * b, "-": a - b, "max": sympy.Max(a, b)}[kind]


def _holds(fact: tuple, v: tuple[int, ...]) -> bool:
    kind = fact[0]
    if kind == "eq":
        return v[fact[1]] == v[fact[2]]
    if kind == "mul":
        return v[fact[1]] == v[fact[2]] * v[fact[3]]
    if kind == "add":
        return v[fact[1]] == v[fact[2]] + fact[3]
    if kind == "prod":
        return v[fact[1]] * v[fact[2]] == v[fact[3]] * v[fact[4]]
    if kind == "bcast-eq":
        return v[fact[1]] == v[fact[2]]
    return True  # bcast-free: s_i is 1 on every binding that satisfies the earlier facts


def _apply(cons: ShapeConstraints, fact: tuple, s: list[sympy.Symbol]) -> None:
    kind = fact[0]
    if kind == "eq":
        cons.equate(s[fact[1]], s[fact[2]], "test")
    elif kind == "mul":
        cons.equate(s[fact[1]], s[fact[2]] * s[fact[3]], "test")
    elif kind == "add":
        cons.equate(s[fact[1]], s[fact[2]] + fact[3], "test")
    elif kind == "prod":
        cons.equate(s[fact[1]] * s[fact[2]], s[fact[3]] * s[fact[4]], "test")
    else:
        cons.broadcast(s[fact[1]], s[fact[2]], "test")


def _value(e: Any, syms: list[sympy.Symbol], v: tuple[int, ...]) -> int:
    return int(sympy.sympify(e).xreplace(dict(zip(syms, map(sympy.Integer, v)))))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ranges=ranges_st, facts=facts_st, es=st.lists(exprs(), min_size=2, max_size=3))
def test_simplification_and_answers_are_sound(ranges, facts, es) -> None:
    env = ShapeEnv()
    syms = [env.create_symbol(f"s{k}", lo, hi) for k, (lo, hi) in enumerate(ranges)]
    cons = ShapeConstraints(env)
    everything = list(itertools.product(*[range(lo, hi + 1) for lo, hi in ranges]))
    applied: list[tuple] = []
    for f in facts:
        if f[0] == "bcast":
            f = ("bcast-free" if cons.is_one(syms[f[1]]) is Tri.YES else "bcast-eq", f[1], f[2])
        applied.append(f)
        try:
            _apply(cons, f, syms)
        except ShapeConflict:
            # a conflict is a proof that no binding in range satisfies the facts so far
            assert not any(all(_holds(g, v) for g in applied) for v in everything), applied
            return
    valid = [v for v in everything if all(_holds(f, v) for f in applied)]
    built = [_build(t, syms) for t in es]
    for e in built:
        c = cons.canonical(e)
        for v in valid:  # equal on every binding that satisfies the facts
            assert _value(e, syms, v) == _value(c, syms, v), (e, c, v, applied)
        lo, hi = cons.bounds(e)
        for v in valid:
            assert lo <= _value(e, syms, v) <= hi, (e, lo, hi, v)
    for a, b in itertools.permutations(built, 2):
        eq, le = cons.eq(a, b), cons.le(a, b)
        for v in valid:
            x, y = _value(a, syms, v), _value(b, syms, v)
            assert eq is not Tri.YES or x == y, (a, b, v, applied)
            assert eq is not Tri.NO or x != y, (a, b, v, applied)
            assert le is not Tri.YES or x <= y, (a, b, v, applied)
            assert le is not Tri.NO or x > y, (a, b, v, applied)


def _f32(*shape: Any) -> TensorType:
    return TensorType(DType.FLOAT32, tuple(shape))


def test_ops_imply_equalities_products_and_broadcasts() -> None:
    env = ShapeEnv()
    a, b, c, k1, k2, r, q = (
        env.create_symbol(n, lo, hi)
        for n, lo, hi in [
            ("a", 2, 64),
            ("b", 2, 64),
            ("c", 1, 64),
            ("k1", 1, 128),
            ("k2", 1, 128),
            ("r", 1, 4096),
            ("q", 1, 8),
        ]
    )
    gb = GraphBuilder()
    x = gb.add_input("x", _f32(a, 8))
    y = gb.add_input("y", _f32(b, 8))
    z = gb.add_input("z", _f32(c, 8))
    m1 = gb.add_input("m1", _f32(a, k1))
    m2 = gb.add_input("m2", _f32(k2, 4))
    s = gb.add(OpKind.ADD, (x, y), _f32(a, 8), loc="model.py:3 in forward: x + y")
    t = gb.add(OpKind.MUL, (s, z), _f32(a, 8), loc="model.py:4")
    u = gb.add(OpKind.MATMUL, (m1, m2), _f32(a, 4), MatmulAttrs(), loc="model.py:5")
    v = gb.add(OpKind.RESHAPE, (t,), _f32(r), loc="model.py:6")
    w = gb.add(OpKind.CONCAT, (x, y), _f32(q, 8), AxisAttrs(0), loc="model.py:7")
    g = gb.finish((u, v, w), ("u", "v", "w"))
    cons = analyze(Program(g, env))
    assert cons.eq(a, b) is Tri.YES  # neither can be 1, so add's broadcast is an equality
    assert cons.eq(a, c) is Tri.YES  # c may be 1, but kernels broadcast only dims that are 1 in the program
    assert cons.eq(k1, k2) is Tri.YES  # matmul contracting dims
    assert cons.eq(r, 8 * a) is Tri.YES  # reshape keeps the element count
    assert cons.eq(q, 2 * b) is Tri.YES  # concat sums its axis
    assert cons.range_of("a").min == 2 and cons.range_of("q").max == 8
    assert cons.le(q, 8) is Tri.YES and cons.le(2 * a, q) is Tri.YES
    assert cons.eq(q, 5) is Tri.UNKNOWN and cons.eq(2 * a, 5) is Tri.UNKNOWN
    assert cons.eq(a * k1, b * k2) is Tri.YES
    assert cons.same_shape((a, k1), (b, k2)) is Tri.YES and cons.same_shape((a,), (a, 1)) is Tri.NO
    text = cons.text()
    assert "only a dim that is 1 at compile time broadcasts" in text and "model.py:4" in text


def test_range_intersection_and_residual_products() -> None:
    env = ShapeEnv()
    s0, s1, s2, s3 = (env.create_symbol(f"s{k}", 1, 32) for k in range(4))
    cons = ShapeConstraints(env)
    cons.equate(s0 * s1, s2 * s3, "reshape at model.py:9")
    assert cons.eq(2 * s0 * s1, 2 * s2 * s3) is Tri.YES
    assert cons.eq(s0 * s1 + 1, s2 * s3 + 1) is Tri.YES
    assert cons.eq(s0, s2) is Tri.UNKNOWN
    env2 = ShapeEnv()
    x, y = env2.create_symbol("x", 1, 8), env2.create_symbol("y", 4, 100)
    c2 = ShapeConstraints(env2)
    c2.equate(x, y, "add at model.py:2")
    assert (c2.range_of("x").min, c2.range_of("x").max) == (4, 8)
    assert c2.le(y, 8) is Tri.YES


def test_contradiction_names_the_op() -> None:
    env = ShapeEnv()
    a = env.create_symbol("a", 1, 16)
    gb = GraphBuilder()
    m1 = gb.add_input("m1", _f32(a, 8))
    m2 = gb.add_input("m2", _f32(16, 4))
    u = gb.add(OpKind.MATMUL, (m1, m2), _f32(a, 4), MatmulAttrs(), loc="model.py:12 in forward: m1 @ m2")
    g = gb.finish((u,), ("u",))
    with pytest.raises(ShapeConflict, match=r"matmul at model.py:12 .*contracting dims.*8 == 16"):
        analyze(Program(g, env))
    env2 = ShapeEnv()
    x, y = env2.create_symbol("x", 1, 8), env2.create_symbol("y", 9, 100)
    with pytest.raises(ShapeConflict, match=r"concat at f.py:1: .*cannot"):
        ShapeConstraints(env2).equate(x, y, "concat at f.py:1")


def _two_inputs_program() -> Program:
    """x: [a, c] + y: [b, c] with a, b in [2, 64] (so a == b), then reshape to a fresh r (== a*c)."""
    env = ShapeEnv()
    a, b, c = env.create_symbol("a", 2, 64), env.create_symbol("b", 2, 64), env.create_symbol("c", 1, 64)
    r = env.create_symbol("r", 1, 256)
    gb = GraphBuilder()
    x = gb.add_input("x", _f32(a, c))
    y = gb.add_input("y", _f32(b, c))
    s = gb.add(OpKind.ADD, (x, y), _f32(a, c), loc="m.py:1")
    e = gb.add(OpKind.EXP, (s,), _f32(b, c), loc="m.py:2")
    v = gb.add(OpKind.RESHAPE, (e,), _f32(r), loc="m.py:3")
    return Program(gb.finish((v,), ("v",)), env)


def test_canonicalize_shapes_unifies_and_guards_at_run_time() -> None:
    import numpy as np

    import bladepack
    from bladepack.api import optimize_program
    from bladepack.ir import print_graph
    from bladepack.passes.canonicalize_shapes import canonicalize_shapes

    p = canonicalize_shapes(_two_inputs_program())
    text = print_graph(p.graph, p.shape_env)
    assert "b" not in {s.name for s in p.shape_env.symbols} and "r" not in {s.name for s in p.shape_env.symbols}
    assert "[a*c]" in text and "[b" not in text
    art = optimize_program(_two_inputs_program())
    m = bladepack.load(art.to_bytes())
    assert m.executor.startswith("native")
    x, y = np.ones((3, 8), np.float32), np.full((3, 8), 2.0, np.float32)
    assert np.allclose(m(x, y), np.exp(3.0) * np.ones(24))
    with pytest.raises(
        bladepack.ShapeGuardError, match="input 'y' dimension 0 is 4, but it must equal input 'x' dimension 0"
    ):
        m(x, np.ones((4, 8), np.float32))
    with pytest.raises(bladepack.ShapeGuardError, match=r"r = a\*c must stay in its declared range \[1, 256\]"):
        m(np.ones((33, 8), np.float32), np.ones((33, 8), np.float32))  # a and c in range, but r = 264 is not
    assert m(np.ones((2, 1), np.float32), np.ones((2, 1), np.float32)).shape == (2,)
    with pytest.raises(
        bladepack.ShapeGuardError, match=r"input 'x' dimension 0 \(symbol 'a'\) is 1; the allowed range is \[2, 64\]"
    ):
        m(np.ones((1, 3), np.float32), np.ones((1, 3), np.float32))


def test_atom_value_from_residual() -> None:
    """A clamped slice length the program equates with 1 rewrites to 1 everywhere (Note [Atom
    values]); the fact stays a residual, so it is still checked at run time."""
    env = ShapeEnv()
    s = env.create_symbol("past", 1, None)
    length = sympy.Max(0, sympy.Min(1024, s + 1) - sympy.Min(1024, s))
    cons = ShapeConstraints(env)
    cons.equate(s + length, s + 1, "matmul contracting dims")
    assert cons.canonical(s + length) == s + 1
    assert cons.canonical(2 * length * s) == 2 * s
    assert cons.eq(length, 1) is Tri.YES
    assert [str(r) for r, _ in cons.residual()] == [str(sympy.expand(length - 1))]
