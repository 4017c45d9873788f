"""Translate torch's symbolic-shape expressions into bladepack's sympy dialect.

In: a sympy expression from torch's ShapeEnv (symbols like s27; torch functions FloorDiv, CeilDiv,
PythonMod, ...) and a map from torch symbol names to bladepack symbols. Out: an expression built only
from plain sympy (floor, ceiling, Mod, Max, Min, Piecewise, relations) over bladepack symbols — the
forms `bladepack.lowering.shape_compiler` compiles.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy
import torch.utils._sympy.functions as tfn
from sympy.functions.elementary.piecewise import ExprCondPair


class UnsupportedShapeExpr(ValueError):
    pass


def _div(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    return a / b


# torch function class name -> builder over already-translated arguments
_FUNCS = {
    "FloorDiv": lambda a, b: sympy.floor(_div(a, b)),
    "CeilDiv": lambda a, b: sympy.ceiling(_div(a, b)),
    "CleanDiv": _div,
    "IntTrueDiv": _div,
    "Mod": sympy.Mod,
    "PythonMod": sympy.Mod,
    "Max": sympy.Max,
    "Min": sympy.Min,
    "PowByNatural": sympy.Pow,
    "FloorToInt": sympy.floor,
    "CeilToInt": sympy.ceiling,
    "TruncToInt": lambda a: _trunc(a),
    "Identity": lambda a: a,
    "ModularIndexing": lambda x, d, m: sympy.Mod(sympy.floor(_div(x, d)), m),
    "Where": lambda c, a, b: sympy.Piecewise((a, c), (b, True)),
    # float-valued subexpressions of an integer size, as in floor(ToFloat(h) * 1.5) for F.interpolate's
    # output size: kept exact (see `_exact`), so floor / ceiling land where torch's double arithmetic does
    "ToFloat": lambda a: a,
    "FloatTrueDiv": _div,
}


def _trunc(a: sympy.Expr) -> sympy.Expr:
    """Rounding toward zero: floor of what is never negative (sizes are), else by sign."""
    if a.is_nonnegative:
        return sympy.floor(a)
    if a.is_nonpositive:
        return sympy.ceiling(a)
    return sympy.Piecewise((sympy.floor(a), a >= 0), (sympy.ceiling(a), True))


def _exact(f: sympy.Float) -> sympy.Rational:
    """A float constant as the decimal it was written as (1.7 → 17/10, not the binary fraction just
    below it): floor(10 * 1.7) is 17 in torch's double arithmetic, and must be 17 here."""
    return sympy.Rational(repr(float(f)))


def to_bladepack(e: object, symbols: Mapping[str, sympy.Symbol]) -> sympy.Basic:
    """Translate; raises `UnsupportedShapeExpr` for unbacked (data-dependent) symbols or unknown forms."""
    if isinstance(e, bool):
        return sympy.true if e else sympy.false
    if isinstance(e, int):
        return sympy.Integer(e)
    if not isinstance(e, sympy.Basic):
        raise UnsupportedShapeExpr(f"not a shape expression: {e!r}")
    if isinstance(e, sympy.Symbol):
        if e.name not in symbols:
            kind = "data-dependent" if e.name.startswith("u") else "unknown"
            raise UnsupportedShapeExpr(f"{kind} symbol {e.name} in a shape")
        return symbols[e.name]
    if isinstance(e, sympy.Float):
        return _exact(e)
    if e.is_Number or e in (sympy.true, sympy.false):
        return e
    args = [to_bladepack(a, symbols) for a in e.args]
    name = type(e).__name__
    if name in _FUNCS and type(e).__module__ == tfn.__name__:
        return _FUNCS[name](*args)
    if isinstance(e, (sympy.Add, sympy.Mul, sympy.Pow, sympy.Max, sympy.Min, sympy.floor, sympy.ceiling, sympy.Mod)):
        return type(e)(*args)
    if isinstance(e, (sympy.Rel, sympy.And, sympy.Or, sympy.Not, sympy.Piecewise, ExprCondPair)):
        return type(e)(*args)
    raise UnsupportedShapeExpr(f"unsupported shape function {name} in {e}")
