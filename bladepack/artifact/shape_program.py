"""The shape-symbol program: a flat int64 register bytecode and its evaluator.

In: input dims (one tuple per input). Out: a register file holding every symbol, every dim of every
value, every symbolic attribute and the arena size — or `ShapeGuardError` from a failed ASSERT.
Loader-safe (standard library only); the compiler from sympy lives in `bladepack.lowering.shape_compiler`.

Encoding (see docs/format.md): `code` is little-endian int64, five words per instruction
`[opcode, d, a, b, c]`. Python's integer semantics are the reference: FLOORDIV and MOD round toward
negative infinity, CEILDIV is -((-a) // b); comparisons give 1 or 0.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from bladepack.errors import ShapeGuardError


class Op(IntEnum):
    CONST = 0  # r[d] = a
    DIM = 1  # r[d] = dims of input a, axis b
    ADD = 2  # r[d] = r[a] + r[b]
    SUB = 3
    MUL = 4
    FLOORDIV = 5
    CEILDIV = 6
    MOD = 7
    MIN = 8
    MAX = 9
    LT = 10  # r[d] = 1 if r[a] < r[b] else 0
    LE = 11
    EQ = 12
    NE = 13
    SELECT = 14  # r[d] = r[b] if r[a] != 0 else r[c]
    ASSERT = 15  # if r[a] == 0: raise messages[c] with {value} = r[b], {other} = r[d]


WORDS = 5


@dataclass(frozen=True)
class ShapeProgram:
    code: tuple[tuple[int, int, int, int, int], ...]
    num_registers: int
    messages: tuple[str, ...]

    # -- serialization
    def to_manifest(self) -> dict[str, object]:
        flat = [w for ins in self.code for w in ins]
        return {
            "num_registers": self.num_registers,
            "code": struct.pack(f"<{len(flat)}q", *flat),
            "messages": list(self.messages),
        }

    def text(self) -> str:
        """One instruction a line, as `rD = OP a b c` (BLADEPACK_DUMP's shape-program texts)."""
        lines = [f"shape program: {self.num_registers} registers, {len(self.code)} instructions"]
        for op, d, a, b, c in self.code:
            name = Op(op).name.lower()
            if op == Op.CONST:
                lines.append(f"  r{d} = {a}")
            elif op == Op.DIM:
                lines.append(f"  r{d} = dim(input {a}, axis {b})")
            elif op == Op.SELECT:
                lines.append(f"  r{d} = r{b} if r{a} else r{c}")
            elif op == Op.ASSERT:
                lines.append(f"  assert r{a} (value r{b}, other r{d}): {self.messages[c]}")
            else:
                lines.append(f"  r{d} = {name}(r{a}, r{b})")
        return "\n".join(lines) + "\n"

    @staticmethod
    def from_manifest(m: dict[str, object]) -> ShapeProgram:
        raw = m["code"]
        if not isinstance(raw, bytes) or len(raw) % (8 * WORDS):
            raise ValueError("shape program code must be a multiple of 40 bytes")
        flat = struct.unpack(f"<{len(raw) // 8}q", raw)
        code = tuple(tuple(flat[i : i + WORDS]) for i in range(0, len(flat), WORDS))
        prog = ShapeProgram(code, int(m["num_registers"]), tuple(m["messages"]))  # type: ignore[arg-type, call-overload]
        prog.validate()
        return prog

    def validate(self, input_ranks: Sequence[int] | None = None) -> None:
        """Reject programs that would index outside the register file, the message table or the inputs
        (`input_ranks`: each input's rank), or that claim more registers than instructions define (a
        register file sized by a lying count would be allocated per shape)."""
        n = self.num_registers
        if n < 0:
            raise ValueError("shape program: negative register count")
        if n > len(self.code):
            raise ValueError(
                f"shape program: {n} registers for {len(self.code)} instructions (each defines at most one)"
            )
        for pc, (op, d, a, b, c) in enumerate(self.code):
            try:
                kind = Op(op)
            except ValueError:
                raise ValueError(f"shape program: unknown opcode {op} at {pc}") from None
            regs: tuple[int, ...]
            if kind is Op.CONST or kind is Op.DIM:
                regs = (d,)
                if (
                    kind is Op.DIM
                    and input_ranks is not None
                    and not (0 <= a < len(input_ranks) and 0 <= b < input_ranks[a])
                ):
                    raise ValueError(
                        f"shape program: DIM reads input {a} axis {b}, which the signature does not have at {pc}"
                    )
            elif kind is Op.SELECT:
                regs = (d, a, b, c)
            elif kind is Op.ASSERT:
                regs = (d, a, b)
                if not 0 <= c < len(self.messages):
                    raise ValueError(f"shape program: message {c} out of range at {pc}")
            else:
                regs = (d, a, b)
            if any(not 0 <= r < n for r in regs):
                raise ValueError(f"shape program: register out of range at {pc}")

    # -- evaluation
    def evaluate(self, dims: Sequence[Sequence[int]]) -> list[int]:
        """Every register for these input dims (Note [Compiled shape programs])."""
        return self._compiled(dims)

    @functools.cached_property
    def _compiled(self) -> Callable[[Sequence[Sequence[int]]], list[int]]:
        return compile_program(self.code, self.num_registers, self.messages)


# Note [Compiled shape programs]: a new input-shape signature evaluates the shape program once (and on
# CUDA each kernel's operand check program), so an interpreter loop's dispatch per instruction was a
# visible part of a new shape's first call (16 µs of 134 instructions for the LLaMA sample's step). A
# program is therefore compiled once, at its first evaluation, into straight-line Python: each register
# a local variable, each instruction one statement with the interpreter's checks written out — int64
# overflow after ADD / SUB / MUL / FLOORDIV / CEILDIV / MIN / MAX (an operand check's integers come from
# outside the program), division by zero, ASSERT's message — and a register read before any instruction
# writes it the literal 0 (the register file starts zeroed). The source holds only integer literals and
# register names (opcodes are checked by `validate`, messages are read from the table by index), so
# nothing of a manifest's text reaches the compiler.
#
# Note [Folded checks]: where some DIMs are known when the source is made — a CUDA kernel's literal
# integer operands, inlined into the compiled preparation (Note [Compiled CUDA preparation]) — every
# instruction whose operands are all known (so are CONSTs and registers never written) is computed then,
# with the interpreter's semantics: a known result outside int64 or a known zero divisor becomes the
# overflow or zero statement at that instruction's place, a known true ASSERT disappears and a known
# false one becomes its failure; the rest is written out with the known values as literals. The
# statements that remain run in the same order, so the first failure is the same instruction's. Each
# value written out is a fresh local (`Locals`), never reassigned, so an expression already computed —
# in the same program or in an earlier one made into the same function — is read from its local instead
# of computed again (it ran, with its checks, before anything after it), and an ASSERT of a value an
# earlier ASSERT established is dropped (that one failed first, or held). A 12-layer encoder's CUDA
# preparation inlines 86 operand checks, most of them alike layer after layer: 6394 lines became 1859,
# its compile 89 -> 55 ms, a new signature's preparation ~600 -> ~430 µs.
_I64 = (-(1 << 63), 1 << 63)
_INFIX = {Op.ADD: "+", Op.SUB: "-", Op.MUL: "*", Op.LT: "<", Op.LE: "<=", Op.EQ: "==", Op.NE: "!="}


@dataclass
class Locals:
    """The locals of programs made into one function's source (Note [Folded checks]): each computed value
    is a fresh local `{prefix}{n}`, never reassigned, so one computed earlier — in this program or in
    another made into the same function — is reused wherever the same expression comes again, and an
    ASSERT of a value an earlier ASSERT established is dropped."""

    prefix: str
    count: int = 0
    memo: dict[str, str] = field(default_factory=dict)  # expression source -> the local holding it
    asserted: set[str] = field(default_factory=set)


def program_lines(
    code: Sequence[tuple[int, int, int, int, int]],
    num_registers: int,
    dim: Callable[[int, int], int | str],
    names: Locals,
    fail: Callable[[int, str, str], str],
    overflow: Callable[[int], str],
    zero: str,
) -> tuple[list[str], list[str]]:
    """A validated program's statements (Note [Compiled shape programs]) and each register's value at
    its end, as source: DIM a b reads `dim(a, b)` (an integer where it is known when the source is made);
    `fail(message, value, other)`, `overflow(pc)` and `zero` are the statements run where an ASSERT
    fails, a result leaves int64 and a divisor is zero. What depends only on known values is computed
    here, with the same checks in the same order, and a value computed before is not computed again
    (Note [Folded checks])."""
    known: dict[int, int] = {}
    local: dict[int, str] = {}  # register -> the local holding its value (when not known)

    def value(k: int) -> int | None:
        if k in known:
            return known[k]
        return None if k in local else 0  # the register file starts zeroed

    def reg(k: int) -> str:
        v = value(k)
        if v is None:
            return local[k]
        return str(v) if v >= 0 else f"({v})"

    body: list[str] = []

    def emit(d: int, expr: str, checked: bool, pc: int) -> None:
        name = names.memo.get(expr)
        if name is None:  # (an earlier one ran, with its check, before any statement that reads this)
            name = names.memo[expr] = f"{names.prefix}{names.count}"
            names.count += 1
            body.append(f"{name} = {expr}")
            if checked:
                body.append(f"if not {_I64[0]} <= {name} < {_I64[1]}: {overflow(pc)}")
        local[d] = name
        known.pop(d, None)

    def fold(d: int, v: int, checked: bool, pc: int) -> None:
        if checked and not _I64[0] <= v < _I64[1]:
            body.append(overflow(pc))  # raises here, as the statement would
            v = 0
        known[d] = v
        local.pop(d, None)

    for pc, (op, d, a, b, c) in enumerate(code):
        kind = Op(op)
        va, vb = value(a), value(b)
        if kind is Op.CONST:
            fold(d, int(a), False, pc)
        elif kind is Op.DIM:
            x = dim(int(a), int(b))
            if isinstance(x, int):
                fold(d, x, False, pc)
            else:
                emit(d, x, False, pc)
        elif kind is Op.SELECT:
            if va is None:
                emit(d, f"{reg(b)} if {reg(a)} else {reg(c)}", False, pc)
            else:
                pick = b if va else c
                v = value(pick)
                if v is None:
                    local[d] = local[pick]
                    known.pop(d, None)
                else:
                    fold(d, v, False, pc)
        elif kind is Op.ASSERT:
            if va is None:
                if reg(a) not in names.asserted:  # (an earlier ASSERT of it failed first, or held)
                    body.append(f"if not {reg(a)}: {fail(int(c), reg(b), reg(d))}")
                    names.asserted.add(reg(a))
            elif not va:
                body.append(fail(int(c), reg(b), reg(d)))
        elif kind in (Op.FLOORDIV, Op.CEILDIV, Op.MOD):
            if vb is None:
                body.append(f"if not {reg(b)}: {zero}")
            elif vb == 0:
                body.append(zero)  # raises here, as the statement would
                fold(d, 0, False, pc)
                continue
            checked = kind is not Op.MOD
            if va is not None and vb is not None:
                v = {Op.FLOORDIV: va // vb, Op.CEILDIV: -((-va) // vb), Op.MOD: va % vb}[kind]
                fold(d, v, checked, pc)
            else:
                x, y = reg(a), reg(b)
                expr = {Op.FLOORDIV: f"{x} // {y}", Op.CEILDIV: f"-((-{x}) // {y})", Op.MOD: f"{x} % {y}"}[kind]
                emit(d, expr, checked, pc)
        elif kind in (Op.MIN, Op.MAX):  # checked as the interpreter did: an operand may come from outside
            if va is not None and vb is not None:
                fold(d, min(va, vb) if kind is Op.MIN else max(va, vb), True, pc)
            else:
                emit(d, f"{kind.name.lower()}({reg(a)}, {reg(b)})", True, pc)
        else:
            infix = _INFIX[kind]
            arithmetic = kind in (Op.ADD, Op.SUB, Op.MUL)
            if va is not None and vb is not None:
                v = {
                    Op.ADD: va + vb,
                    Op.SUB: va - vb,
                    Op.MUL: va * vb,
                    Op.LT: int(va < vb),
                    Op.LE: int(va <= vb),
                    Op.EQ: int(va == vb),
                    Op.NE: int(va != vb),
                }[kind]
                fold(d, v, arithmetic, pc)
            else:
                expr = f"{reg(a)} {infix} {reg(b)}"
                emit(d, expr if arithmetic else f"int({expr})", arithmetic, pc)
    return body, [reg(k) for k in range(num_registers)]


def compile_program(
    code: Sequence[tuple[int, int, int, int, int]], num_registers: int, messages: Sequence[str]
) -> Callable[[Sequence[Sequence[int]]], list[int]]:
    """The program as one Python function of the input dims returning the register file."""
    body, final = program_lines(
        code,
        num_registers,
        lambda a, b: f"dims[{a}][{b}]",
        Locals("r"),
        lambda c, value, other: f"_fail({c}, {value}, {other})",
        lambda pc: f"_overflow({pc})",
        "_zero()",
    )
    body.append("return [" + ", ".join(final) + "]")
    source = "def evaluate(dims):\n" + "".join(f"    {line}\n" for line in body)

    def fail(c: int, value: int, other: int) -> None:
        raise ShapeGuardError(messages[c].replace("{value}", str(value)).replace("{other}", str(other)))

    def overflow(pc: int) -> None:
        _int64(1 << 63, pc)

    def zero() -> None:
        _nonzero(0)

    scope: dict[str, object] = {"_fail": fail, "_overflow": overflow, "_zero": zero, "min": min, "max": max}
    exec(compile(source, "<bladepack shape program>", "exec"), scope)
    return scope["evaluate"]  # type: ignore[return-value]


def _int64(v: int, pc: int) -> int:
    """Note [int64 shape arithmetic]: both loaders compute sizes in int64; a result outside it is a guard
    error, as in the C++ evaluator, never a size numpy cannot allocate."""
    if not -(1 << 63) <= v < (1 << 63):
        raise ShapeGuardError(
            f"shape program overflowed int64 at instruction {pc}: an input dimension is too large for the sizes "
            "derived from it"
        )
    return v


def _nonzero(x: int) -> int:
    if x == 0:
        raise ShapeGuardError("shape program divided by zero: an input dimension makes a derived size undefined")
    return x
