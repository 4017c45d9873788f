"""The operand check of a generated CPU kernel: its integer operands and pointer extents, checked in C.

In: a kernel's `Args` (its int64 operands, as sympy expressions over shape symbols) and, per pointer
operand, the shape and item size of the buffer it addresses. Out: the C++ source of
`BPK_KERNEL int64_t <name>(const int64_t* I, const int64_t* room, int64_t* status)`, which the library's
`bpk_check` runs before a launch list may run (Note [Kernel operand checks]).

Note [Kernel operand checks]: a generated kernel indexes its buffers with its integer operands (loop
bounds, strides, offsets) and nothing else, so whether a launch stays inside its buffers is a property
of those integers. The plan carries them as registers of the shape program, and a manifest edited and
re-hashed can hand a kernel any integers and any buffers. The compiler therefore emits, with every
kernel, the check that binds the two:
- the *atoms* of a kernel are the shape symbols its operands and buffer shapes are built from; each atom
  is itself an operand (added when the kernel would not otherwise take it) and must be non-negative;
- every other operand must equal its expression over the atoms, computed as the shape program computes
  it (the same forms, in the same order, in int64 with overflow checked);
- every pointer operand addresses a buffer whose shape is known over the atoms: the kernel touches at
  most that buffer's bytes from the pointer (loads read through views of the whole buffer, stores write
  whole values); every dim must be non-negative and the bytes must fit in the room the loader reports
  (the bytes from the pointer to the end of its slot's tensor).
The library's `bpk_check` also refuses a launch that writes (a kernel's store pointers, a GEMM's D)
into a slot the loader does not mark writable: inputs are the caller's, weights may be read-only pages.
A kernel given any integers either indexes consistently with its atoms and inside its buffers, or the
check names the operand that is wrong. Data-dependent indices (gather, take) are checked where they are
read (ERR_INDEX). CUDA kernels take the same operands (add_atoms runs for them too) and carry the same
rules as a shape program in their kernel row (lowering/operand_program.py). The status words: [launch, code, value, extra] with the OPERAND_* codes below; the
loaders' messages for them are docs/format.md's ("Kernel operand checks").
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from bladepack.codegen.c_render import Args
from bladepack.codegen.kernel import KernelContext
from bladepack.ir.types import IRDim
from bladepack.ir.views import View

OPERAND_COUNT = 1  # value: the pointers the function takes, extra: its integers
OPERAND_VALUE = 2  # value: the integer's index, extra: what the atoms make it
OPERAND_SIZE = 3  # value: the integer's index (a negative shape symbol, or int64 overflow)
OPERAND_EXTENT = 4  # value: the pointer's index, extra: the bytes it reaches
OPERAND_SLOT = 5  # value: the pointer's index (its slot or byte offset is outside the slot table)
OPERAND_BUFFER = 6  # value: the pointer's index (its buffer has a negative dim, or its bytes overflow)
OPERAND_WRITE = 7  # value: the pointer's index, extra: its slot (an input or a weight, which no launch writes)


class _Compiler:
    """Integer sympy expressions to C statements over `int64_t r<k>` with an overflow flag `o`: the
    forms and the evaluation order of lowering/shape_compiler.py, so that a value the shape program
    computed is computed here without a new overflow."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.memo: dict[sympy.Basic, str] = {}
        self.n = 0

    def bind(self, sym: sympy.Symbol, c_text: str) -> str:
        r = self._define(c_text)
        self.memo[sym] = r
        return r

    def _define(self, c_text: str) -> str:
        r = f"r{self.n}"
        self.n += 1
        self.lines.append(f"const int64_t {r} = {c_text};")
        return r

    def _op(self, fn: str, a: str, b: str) -> str:
        return self._define(f"bpk::chk::{fn}({a}, {b}, &o)")

    def _fold(self, fn: str, regs: Sequence[str]) -> str:
        acc = regs[0]
        for r in regs[1:]:
            acc = self._op(fn, acc, r)
        return acc

    def const(self, v: int) -> str:
        return f"int64_t({v}LL)" if v != -(2**63) else "INT64_MIN"

    def expr(self, e: sympy.Basic | int) -> str:
        e = sympy.sympify(e)
        if e not in self.memo:
            self.memo[e] = self._compile(e)
        return self.memo[e]

    def _quotient(self, fn: str, arg: sympy.Expr) -> str:
        num, den = sympy.fraction(sympy.together(arg))
        if den == 1:
            return self.expr(num)
        return self._op(fn, self.expr(sympy.expand(num)), self.expr(den))

    def _compile(self, e: sympy.Basic) -> str:
        if e is sympy.true:
            return "int64_t(1)"
        if e is sympy.false:
            return "int64_t(0)"
        if e.is_Integer:
            return self.const(int(e))
        if isinstance(e, sympy.Symbol):
            raise ValueError(f"operand check: symbol {e} is not an operand")
        if isinstance(e, (sympy.Add, sympy.Mul)) or e.is_Rational:
            num, den = (e, 1) if _whole(e) else sympy.fraction(sympy.together(e))
            if den != 1:
                return self._op("floordiv", self.expr(sympy.expand(num)), self.expr(den))
            if isinstance(e, sympy.Add):
                coeff, terms = e.as_coeff_add()
                acc = self._fold("add", [self.expr(t) for t in terms])
                return acc if coeff == 0 else self._op("add", acc, self.const(int(coeff)))
            coeff, factors = e.as_coeff_mul()
            acc = self._fold("mul", [self.expr(f) for f in factors])
            return acc if coeff == 1 else self._op("mul", self.const(int(coeff)), acc)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp >= 0:
            return self._fold("mul", [self.expr(e.base)] * int(e.exp)) if e.exp > 0 else "int64_t(1)"
        if isinstance(e, sympy.floor):
            return self._quotient("floordiv", e.args[0])
        if isinstance(e, sympy.ceiling):
            return self._quotient("ceildiv", e.args[0])
        if isinstance(e, sympy.Mod):
            return self._op("mod", self.expr(e.args[0]), self.expr(e.args[1]))
        if isinstance(e, (sympy.Max, sympy.Or)):
            return self._fold("max", [self.expr(a) for a in e.args])
        if isinstance(e, (sympy.Min, sympy.And)):
            return self._fold("min", [self.expr(a) for a in e.args])
        if isinstance(e, sympy.Piecewise):
            return self._piecewise(list(e.args))
        rel = {sympy.StrictLessThan: "lt", sympy.LessThan: "le", sympy.Equality: "eq", sympy.Unequality: "ne"}
        if type(e) in rel:
            return self._op(rel[type(e)], self.expr(e.lhs), self.expr(e.rhs))
        if isinstance(e, sympy.StrictGreaterThan):
            return self._op("lt", self.expr(e.rhs), self.expr(e.lhs))
        if isinstance(e, sympy.GreaterThan):
            return self._op("le", self.expr(e.rhs), self.expr(e.lhs))
        if isinstance(e, sympy.Not):
            return self._op("eq", self.expr(e.args[0]), "int64_t(0)")
        raise ValueError(f"operand check: cannot compile {e} ({type(e).__name__})")

    def _piecewise(self, branches: list[tuple[sympy.Expr, sympy.Basic]]) -> str:
        value, cond = branches[0]
        if cond is sympy.true or len(branches) == 1:
            return self.expr(value)
        c, v, rest = self.expr(cond), self.expr(value), self._piecewise(branches[1:])
        return self._define(f"{c} ? {v} : {rest}")


def _whole(e: sympy.Basic) -> bool:
    """Whether `e` has no denominator in its sums, products and powers (so `together(e)` is e over 1;
    sympy's `together` is most of the cost of compiling a check). Function arguments (floor, Mod, ...)
    are atoms to `together` and to this test."""
    if e.is_Rational:
        return bool(e.is_Integer)
    if isinstance(e, sympy.Pow):
        return bool(e.exp.is_Integer and e.exp >= 0) and _whole(e.base)
    if isinstance(e, (sympy.Add, sympy.Mul)):
        return all(_whole(a) for a in e.args)
    return True


def operand_buffers(
    ctx: KernelContext, stores: Sequence[int], loads: Sequence[View]
) -> list[tuple[Sequence[IRDim], int]]:
    """Per pointer operand of a kernel (its stores, then its loads), the shape and item size of the
    whole buffer it addresses."""
    buffers = [(ctx.types[v].shape, ctx.types[v].dtype.itemsize) for v in stores]
    return buffers + [(ctx.types[v.base].shape, ctx.types[v.base].dtype.itemsize) for v in loads]


def add_atoms(args: Args, buffers: Sequence[tuple[Sequence[IRDim], int]]) -> None:
    """Make every shape symbol of the operands and of the buffers' shapes an operand of its own (call
    before the kernel's functions are rendered: it can add operands)."""
    atoms: set[sympy.Symbol] = set()
    for e in args.exprs:
        atoms |= sympy.sympify(e).free_symbols
    for shape, _ in buffers:
        for d in shape:
            atoms |= sympy.sympify(d).free_symbols
    for s in sorted(atoms, key=str):
        args.ref(s)


def operand_check(name: str, args: Args, buffers: Sequence[tuple[Sequence[IRDim], int]]) -> str:
    """The C++ check function `name` (Note [Kernel operand checks]); `buffers` holds, per pointer
    operand in order, the shape and item size of the buffer it addresses. `add_atoms` ran first."""
    c = _Compiler()
    body: list[str] = []
    exprs = [sympy.sympify(e) for e in args.exprs]
    for k, e in enumerate(exprs):
        if isinstance(e, sympy.Symbol):
            c.bind(e, f"I[{k}]")
    for k, e in enumerate(exprs):
        if isinstance(e, sympy.Symbol):
            body.append(f"if (I[{k}] < 0) return bpk::chk::fail(status, {OPERAND_SIZE}, {k});")
    checks: list[str] = []
    for k, e in enumerate(exprs):
        if isinstance(e, sympy.Symbol):
            continue
        start = len(c.lines)
        r = c.expr(e)
        checks += c.lines[start:]
        del c.lines[start:]
        checks.append(f"if (o) return bpk::chk::fail(status, {OPERAND_SIZE}, {k});")
        checks.append(f"if ({r} != I[{k}]) return bpk::chk::fail(status, {OPERAND_VALUE}, {k}, {r});")
    signed: set[str] = set()  # registers known to be non-negative
    for p, (shape, itemsize) in enumerate(buffers):
        total = f"int64_t({itemsize})"
        for d in shape:
            d = sympy.sympify(d)
            if d.is_Integer:
                total = f"bpk::chk::mul({total}, {c.const(int(d))}, &o)"
                continue
            start = len(c.lines)
            r = c.expr(d)
            checks += c.lines[start:]
            del c.lines[start:]
            if r not in signed and not isinstance(d, sympy.Symbol):
                checks.append(f"if (o || {r} < 0) return bpk::chk::fail(status, {OPERAND_BUFFER}, {p});")
                signed.add(r)
            total = f"bpk::chk::mul({total}, {r}, &o)"
        checks.append(f"const int64_t n{p} = {total};")
        checks.append(f"if (o) return bpk::chk::fail(status, {OPERAND_BUFFER}, {p});")
        checks.append(f"if (n{p} > room[{p}]) return bpk::chk::fail(status, {OPERAND_EXTENT}, {p}, n{p});")
    lines = [f"BPK_KERNEL int64_t {name}(const int64_t* I, const int64_t* room, int64_t* status) {{"]
    lines += ["  bool o = false;", "  (void)I; (void)room; (void)o;"]
    lines += ["  " + ln for ln in c.lines + body + checks]
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)
