"""A CUDA kernel's operand check as a shape program (Note [Kernel operand checks] in
codegen/operand_check.py, for kernels whose code runs where the host cannot call a check).

In: the kernel's int64 operands (sympy expressions over its shape symbols, each symbol also an operand
of its own) and, per pointer operand, the shape and item size of the buffer it addresses. Out: a
`ShapeProgram` over two pseudo-inputs — input 0's dims are the launch's integers, input 1's the room
(bytes from each pointer to the end of its slot's tensor) — whose ASSERTs are the CPU check's: shape
symbols non-negative, every other integer equal to its expression over them, every buffer inside its
room. The loader evaluates it per input-shape signature before any launch; an int64 overflow is a
guard error there too.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from bladepack.artifact.shape_program import Op, ShapeProgram
from bladepack.ir.types import IRDim
from bladepack.lowering.shape_compiler import ShapeProgramBuilder


def operand_program(exprs: Sequence[sympy.Expr], buffers: Sequence[tuple[Sequence[IRDim], int]]) -> ShapeProgram:
    b = ShapeProgramBuilder()
    ints = [b.dim(0, k) for k in range(len(exprs))]
    zero = b.const(0)
    for k, e in enumerate(exprs):
        if isinstance(e, sympy.Symbol):
            b.bind(e, ints[k])
            b.check(b.binary(Op.LE, zero, ints[k]), ints[k], f"integer {k} is {{value}}, a negative size")
    for k, e in enumerate(exprs):
        if not isinstance(e, sympy.Symbol):
            want = b.expr(e)
            b.check(
                b.binary(Op.EQ, want, ints[k]),
                ints[k],
                f"passes {{value}} as integer {k}; its shape symbols make it {{other}}",
                want,
            )
    for p, (shape, itemsize) in enumerate(buffers):
        total = b.const(itemsize)
        for d in shape:
            r = b.expr(d)
            if not isinstance(d, int):
                b.check(b.binary(Op.LE, zero, r), r, f"pointer {p}'s buffer has a negative dim ({{value}})")
            total = b.binary(Op.MUL, total, r)
        room = b.dim(1, p)
        b.check(
            b.binary(Op.LE, total, room),
            total,
            f"pointer {p} reaches {{value}} bytes; its tensor holds {{other}} from there",
            room,
        )
    return b.finish()
