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


def _interpret(prog: ShapeProgram, dims: list[list[int]]) -> list[int]:
    """docs/format.md's semantics instruction by instruction: the oracle for the compiled evaluator
    (Note [Compiled shape programs])."""
    from bladepack.artifact.shape_program import Op
    from bladepack.errors import ShapeGuardError

    def i64(v: int, pc: int) -> int:
        if not -(1 << 63) <= v < (1 << 63):
            raise ShapeGuardError(f"overflow at {pc}")
        return v

    def nz(v: int) -> int:
        if v == 0:
            raise ShapeGuardError("divided by zero")
        return v

    r = [0] * prog.num_registers
    for pc, (op, d, a, b, c) in enumerate(prog.code):
        o = Op(op)
        if o is Op.CONST:
            r[d] = a
        elif o is Op.DIM:
            r[d] = dims[a][b]
        elif o is Op.SELECT:
            r[d] = r[b] if r[a] else r[c]
        elif o is Op.ASSERT:
            if not r[a]:
                raise ShapeGuardError(prog.messages[c].replace("{value}", str(r[b])).replace("{other}", str(r[d])))
        elif o is Op.MOD:
            r[d] = r[a] % nz(r[b])
        elif o is Op.FLOORDIV:
            r[d] = i64(r[a] // nz(r[b]), pc)
        elif o is Op.CEILDIV:
            r[d] = i64(-((-r[a]) // nz(r[b])), pc)
        else:
            fn = {
                Op.ADD: lambda x, y: x + y,
                Op.SUB: lambda x, y: x - y,
                Op.MUL: lambda x, y: x * y,
                Op.MIN: min,
                Op.MAX: max,
                Op.LT: lambda x, y: int(x < y),
                Op.LE: lambda x, y: int(x <= y),
                Op.EQ: lambda x, y: int(x == y),
                Op.NE: lambda x, y: int(x != y),
            }[o]
            r[d] = i64(fn(r[a], r[b]), pc)
    return r


def _raw_programs() -> st.SearchStrategy[tuple[ShapeProgram, list[list[int]]]]:
    """Any valid program over two inputs of rank 2 — registers read before they are written, int64's
    ends, zero divisors, failing asserts — with input dims as large as int64 allows."""
    big = st.one_of(st.integers(-9, 9), st.sampled_from([(1 << 63) - 1, -(1 << 63), 1 << 62, -(1 << 62), 3037000500]))
    n = 6

    def ins(op: int) -> st.SearchStrategy[tuple[int, int, int, int, int]]:
        r = st.integers(0, n - 1)
        if op == 0:
            return st.tuples(st.just(op), r, big, st.just(0), st.just(0))
        if op == 1:
            return st.tuples(st.just(op), r, st.integers(0, 1), st.integers(0, 1), st.just(0))
        return st.tuples(st.just(op), r, r, r, st.integers(0, 1) if op == 15 else r)

    ops = st.sampled_from(
        [0, 0, 0, 1, 2, 3, 4, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    )  # constants and products often
    code = st.lists(ops.flatmap(ins), min_size=n, max_size=24)
    dims = st.lists(
        st.lists(st.integers(0, (1 << 63) - 1) | st.integers(0, 9), min_size=2, max_size=2), min_size=2, max_size=2
    )
    return st.tuples(code, dims).map(lambda t: (ShapeProgram(tuple(t[0]), n, _MESSAGES), t[1]))


_MESSAGES = ("no {value} {other}", "shape {value}")
_BIG = 1 << 62


def _case(*code: tuple[int, int, int, int, int]) -> tuple[ShapeProgram, list[list[int]]]:
    padded = code + ((0, 5, 7, 0, 0),) * (6 - len(code))
    return ShapeProgram(padded, 6, _MESSAGES), [[3, (1 << 63) - 1], [0, 5]]


@settings(max_examples=600, deadline=None)
@given(case=_raw_programs())
@example(case=_case((0, 0, _BIG, 0, 0), (0, 1, 4, 0, 0), (4, 2, 0, 1, 0)))  # a product past int64
@example(case=_case((1, 0, 0, 1, 0), (0, 1, 1, 0, 0), (2, 2, 0, 1, 0)))  # a sum past it
@example(case=_case((1, 0, 0, 1, 0), (3, 1, 2, 0, 0), (3, 2, 1, 0, 0)))  # -max - max
@example(case=_case((0, 0, -(1 << 63), 0, 0), (0, 1, -1, 0, 0), (5, 2, 0, 1, 0)))  # INT64_MIN // -1
@example(case=_case((0, 0, -(1 << 63), 0, 0), (0, 1, -1, 0, 0), (6, 2, 0, 1, 0)))  # ... rounded up
@example(case=_case((1, 0, 1, 0, 0), (5, 1, 3, 0, 0)))  # a zero divisor
@example(case=_case((0, 0, 3, 0, 0), (7, 1, 0, 4, 0)))  # a zero modulus (r4 never written)
@example(case=_case((1, 0, 1, 0, 0), (10, 1, 0, 3, 0), (15, 2, 1, 0, 1)))  # a failing assert's message
@example(case=_case((0, 0, 2, 0, 0), (14, 1, 3, 0, 4)))  # a select of registers never written
def test_compiled_programs_evaluate_as_the_format_says(case: tuple[ShapeProgram, list[list[int]]]) -> None:
    """Note [Compiled shape programs]: the compiled evaluator gives the oracle's registers, or the same
    guard error (overflow, division by zero, an assert's message with its values)."""
    from bladepack.errors import ShapeGuardError

    def kind(e: ShapeGuardError) -> str:
        text = str(e)
        return "overflow" if "overflow" in text else ("zero" if "divided by zero" in text else text)

    prog, dims = case
    prog.validate([2, 2])
    try:
        want: list[int] | str = _interpret(prog, dims)
    except ShapeGuardError as e:
        want = kind(e)
    try:
        got: list[int] | str = prog.evaluate(dims)
    except ShapeGuardError as e:
        got = kind(e)
    assert got == want, prog.text()


@settings(max_examples=600, deadline=None)
@given(case=_raw_programs(), known=st.sampled_from([(0,), (1,), (0, 1)]))
@example(case=_case((0, 0, _BIG, 0, 0), (0, 1, 4, 0, 0), (4, 2, 0, 1, 0)), known=(0,))  # a folded product past int64
@example(case=_case((1, 0, 1, 0, 0), (5, 1, 3, 0, 0)), known=(0, 1))  # a folded zero divisor
@example(case=_case((1, 0, 1, 0, 0), (10, 1, 0, 3, 0), (15, 2, 1, 0, 1)), known=(0, 1))  # a folded failing assert
@example(case=_case((0, 0, 2, 0, 0), (14, 1, 3, 0, 4)), known=(0,))  # a folded select of registers never written
def test_folded_programs_evaluate_as_the_format_says(
    case: tuple[ShapeProgram, list[list[int]]], known: tuple[int, ...]
) -> None:
    """Note [Folded checks]: a program made into source with some inputs' dims known (the CUDA
    preparation's literal kernel operands) computes what depends on them alone when the source is made,
    and still gives the oracle's registers, or raises the same guard error at the same instruction."""
    from bladepack.artifact.shape_program import Locals, program_lines
    from bladepack.errors import ShapeGuardError

    prog, dims = case
    prog.validate([2, 2])
    body, final = program_lines(
        prog.code,
        prog.num_registers,
        lambda a, b: dims[a][b] if a in known else f"dims[{a}][{b}]",
        Locals("r"),
        lambda c, value, other: f"_fail({c}, {value}, {other})",
        lambda pc: f"_fail(-1, {pc}, 0)",
        "_fail(-2, 0, 0)",
    )
    source = "def evaluate(dims):\n" + "".join(f"    {line}\n" for line in [*body, f"return [{', '.join(final)}]"])

    def fail(c: int, value: int, other: int) -> None:
        what = {-1: "overflow", -2: "zero"}
        raise ShapeGuardError(what.get(c) or _MESSAGES[c].replace("{value}", str(value)).replace("{other}", str(other)))

    scope: dict[str, object] = {"_fail": fail, "min": min, "max": max}
    exec(compile(source, "<folded>", "exec"), scope)

    def kind(e: ShapeGuardError) -> str:
        text = str(e)
        return "overflow" if "overflow" in text else ("zero" if "zero" in text else text)

    try:
        want: list[int] | str = _interpret(prog, dims)
    except ShapeGuardError as e:
        want = kind(e)
    try:
        got: list[int] | str = scope["evaluate"](dims)  # type: ignore[operator]
    except ShapeGuardError as e:
        got = kind(e)
    assert got == want, (prog.text(), source)
