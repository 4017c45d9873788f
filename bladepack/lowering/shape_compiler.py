"""Compile sympy dim expressions into shape-program bytecode.

In: symbol bindings (input dims) and any integer or boolean sympy expressions over the symbols.
Out: a `ShapeProgram` whose registers hold those values, with common subexpressions computed once.

Supported forms: integers, symbols, Add, Mul (rational coefficients allowed when the whole expression is
integer-valued), Pow with a non-negative integer exponent, floor / ceiling of quotients, Mod, Max, Min,
Piecewise with integer branches, and the relations < <= > >= == != with And / Or / Not.
"""

from __future__ import annotations

import sympy

from bladepack.artifact.shape_program import Op, ShapeProgram


class ShapeCompileError(ValueError):
    pass


class ShapeProgramBuilder:
    def __init__(self) -> None:
        self.code: list[tuple[int, int, int, int, int]] = []
        self.messages: list[str] = []
        self._nregs = 0
        self._memo: dict[sympy.Basic, int] = {}

    # -- primitive emission
    def _reg(self) -> int:
        self._nregs += 1
        return self._nregs - 1

    def _emit(self, op: Op, a: int = 0, b: int = 0, c: int = 0) -> int:
        d = self._reg()
        self.code.append((int(op), d, a, b, c))
        return d

    def const(self, v: int) -> int:
        key = sympy.Integer(v)
        if key not in self._memo:
            self._memo[key] = self._emit(Op.CONST, int(v))
        return self._memo[key]

    def dim(self, input_index: int, axis: int) -> int:
        return self._emit(Op.DIM, input_index, axis)

    def binary(self, op: Op, a: int, b: int) -> int:
        return self._emit(op, a, b)

    def bind(self, sym: sympy.Symbol, reg: int) -> None:
        self._memo[sym] = reg

    def is_bound(self, sym: sympy.Symbol) -> bool:
        return sym in self._memo

    def check(self, cond: int, value: int, message: str, other: int | None = None) -> None:
        """ASSERT: raise `message` (with {value} and {other} filled in) when register `cond` is 0."""
        if message not in self.messages:
            self.messages.append(message)
        other_reg = other if other is not None else value
        self.code.append((int(Op.ASSERT), other_reg, cond, value, self.messages.index(message)))

    def program(self) -> ShapeProgram:
        """The program so far (not validated: registers may still be bound later)."""
        return ShapeProgram(tuple(self.code), self._nregs, tuple(self.messages))

    def finish(self) -> ShapeProgram:
        prog = self.program()
        prog.validate()
        return prog

    # -- expressions
    def expr(self, e: sympy.Basic | int | bool) -> int:
        e = sympy.sympify(e)
        if e in self._memo:
            return self._memo[e]
        r = self._compile(e)
        self._memo[e] = r
        return r

    def _fold(self, op: Op, regs: list[int]) -> int:
        acc = regs[0]
        for r in regs[1:]:
            acc = self._emit(op, acc, r)
        return acc

    def _quotient(self, op: Op, arg: sympy.Expr) -> int:
        num, den = sympy.fraction(sympy.together(arg))
        if den == 1:
            return self.expr(num)
        return self._emit(op, self.expr(sympy.expand(num)), self.expr(den))

    def _compile(self, e: sympy.Basic) -> int:
        if e is sympy.true:
            return self.const(1)
        if e is sympy.false:
            return self.const(0)
        if e.is_Integer:
            return self.const(int(e))
        if isinstance(e, sympy.Symbol):
            raise ShapeCompileError(f"symbol {e} is not bound to any input dimension")
        if isinstance(e, (sympy.Add, sympy.Mul)) or e.is_Rational:
            num, den = sympy.fraction(sympy.together(e))
            if den != 1:
                return self._emit(Op.FLOORDIV, self.expr(sympy.expand(num)), self.expr(den))
            if isinstance(e, sympy.Add):
                coeff, terms = e.as_coeff_add()
                regs = [self.expr(t) for t in terms]
                acc = self._fold(Op.ADD, regs)
                return acc if coeff == 0 else self._emit(Op.ADD, acc, self.const(int(coeff)))
            coeff, factors = e.as_coeff_mul()
            regs = [self.expr(f) for f in factors]
            acc = self._fold(Op.MUL, regs)
            return acc if coeff == 1 else self._emit(Op.MUL, self.const(int(coeff)), acc)
        if isinstance(e, sympy.Pow):
            if e.exp.is_Integer and e.exp >= 0:
                base = self.expr(e.base)
                return self._fold(Op.MUL, [base] * int(e.exp)) if e.exp > 0 else self.const(1)
            raise ShapeCompileError(f"cannot compile power {e}")
        if isinstance(e, sympy.floor):
            return self._quotient(Op.FLOORDIV, e.args[0])
        if isinstance(e, sympy.ceiling):
            return self._quotient(Op.CEILDIV, e.args[0])
        if isinstance(e, sympy.Mod):
            return self._emit(Op.MOD, self.expr(e.args[0]), self.expr(e.args[1]))
        if isinstance(e, sympy.Max):
            return self._fold(Op.MAX, [self.expr(a) for a in e.args])
        if isinstance(e, sympy.Min):
            return self._fold(Op.MIN, [self.expr(a) for a in e.args])
        if isinstance(e, sympy.Piecewise):
            return self._piecewise(list(e.args))
        rel = {sympy.StrictLessThan: Op.LT, sympy.LessThan: Op.LE, sympy.Equality: Op.EQ, sympy.Unequality: Op.NE}
        if type(e) in rel:
            return self._emit(rel[type(e)], self.expr(e.lhs), self.expr(e.rhs))
        if isinstance(e, sympy.StrictGreaterThan):
            return self._emit(Op.LT, self.expr(e.rhs), self.expr(e.lhs))
        if isinstance(e, sympy.GreaterThan):
            return self._emit(Op.LE, self.expr(e.rhs), self.expr(e.lhs))
        if isinstance(e, sympy.And):
            return self._fold(Op.MIN, [self.expr(a) for a in e.args])
        if isinstance(e, sympy.Or):
            return self._fold(Op.MAX, [self.expr(a) for a in e.args])
        if isinstance(e, sympy.Not):
            return self._emit(Op.EQ, self.expr(e.args[0]), self.const(0))
        raise ShapeCompileError(f"cannot compile shape expression {e} ({type(e).__name__})")

    def _piecewise(self, branches: list[tuple[sympy.Expr, sympy.Basic]]) -> int:
        value, cond = branches[0]
        if cond is sympy.true or len(branches) == 1:
            return self.expr(value)
        return self._emit(Op.SELECT, self.expr(cond), self.expr(value), self._piecewise(branches[1:]))
