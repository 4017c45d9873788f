"""The C-like rendering shared by the CPU and CUDA emitters.

In: IR dtypes, scalar attributes, and index expressions (sympy, over loop symbols and shape symbols).
Out: C type names, literals, the kernel's int-argument table (`Args`: every shape expression a kernel
needs becomes one int64 argument, computed by the shape program) and C text for index expressions
and scalar ops.

Note [Index expressions]: an index is a sympy expression over loop symbols (`Loop`), runtime symbols
(a gathered index held in a C variable) and shape symbols. Every maximal sub-expression free of loop
and runtime symbols is one kernel argument, so the generated C only adds and multiplies loop indices
by arguments; static sizes print as literals, which lets the C compiler unroll and vectorize.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sympy

from bladepack.dtypes import DType
from bladepack.opset import OP_INFO, CSpelling, OpKind

# C types of values in registers: float16 and bfloat16 compute in float (only their memory type is
# 16-bit: CPU_MEMTYPE here, cuda_emitter.MEMTYPE), so a fused kernel rounds once, when it stores.
CTYPE = {
    DType.FLOAT32: "float",
    DType.FLOAT64: "double",
    DType.FLOAT16: "float",
    DType.BFLOAT16: "float",
    DType.INT64: "int64_t",
    DType.INT32: "int32_t",
    DType.INT16: "int16_t",
    DType.INT8: "int8_t",
    DType.UINT8: "uint8_t",
    DType.BOOL: "bool",
}

# memory types of CPU kernel pointers: bpk::f16 / bpk::bf16 convert to and from float on each load and
# store (Note [16-bit floats on CPU] in cpu_runtime.h)
CPU_MEMTYPE = {**CTYPE, DType.FLOAT16: "bpk::f16", DType.BFLOAT16: "bpk::bf16"}


def prelude(name: str) -> str:
    """The runtime prelude `name` of this directory with every "// @splice <file>" line replaced by that
    file's text (the shared scalar helpers scalar_ops.h, the CPU GEMMs cpu_gemm.h); a spliced file's
    leading "//!" lines describe the file and are left out."""
    here = Path(__file__).parent
    out = []
    for line in (here / name).read_text().splitlines(keepends=True):
        if line.startswith(_SPLICE):
            body = (here / line[len(_SPLICE) :].strip()).read_text().splitlines(keepends=True)
            while body and body[0].startswith("//!"):
                body.pop(0)
            out += body
        else:
            out.append(line)
    return "".join(out)


_SPLICE = "// @splice "


class Loop(sympy.Symbol):  # type: ignore[misc]
    """A loop or runtime index symbol: always a non-negative integer."""

    def __new__(cls, name: str) -> Loop:
        obj: Loop = super().__new__(cls, name, integer=True, nonnegative=True)
        return obj


def literal(v: Any, dt: DType) -> str:
    t = CTYPE[dt]
    if dt is DType.BOOL:
        return "true" if bool(v) else "false"
    if dt.is_floating:
        f = float(v)
        if math.isnan(f):
            return f"std::numeric_limits<{t}>::quiet_NaN()"
        if math.isinf(f):
            return f"{'-' if f < 0 else ''}std::numeric_limits<{t}>::infinity()"
        return f"{t}({f!r})" if dt is DType.FLOAT64 else f"{f!r}f"
    i = int(v)
    if i == -(2**63):
        return "std::numeric_limits<int64_t>::min()"
    return f"{t}({i}LL)" if dt is DType.INT64 else f"{t}({i})"


def is_loop_free(e: sympy.Basic) -> bool:
    return not any(isinstance(s, Loop) for s in e.free_symbols)


class Args:
    """The int64 arguments of one kernel: shape expressions in first-use order, shared by its variants."""

    def __init__(self) -> None:
        self.exprs: list[sympy.Expr] = []
        self._index: dict[sympy.Expr, int] = {}

    def ref(self, e: Any) -> str:
        e = sympy.sympify(e)
        if e.is_Integer:
            return f"{int(e)}LL" if abs(int(e)) > 2**31 - 1 else str(int(e))
        e = sympy.expand(e)
        if e.is_Integer:
            return str(int(e))
        k = self._index.get(e)
        if k is None:
            k = self._index[e] = len(self.exprs)
            self.exprs.append(e)
        return f"a{k}"

    def index(self, e: Any) -> str:
        """C text of an integer index expression (Note [Index expressions])."""
        e = sympy.sympify(e)
        if is_loop_free(e):
            return self.ref(e)
        if isinstance(e, Loop):
            return str(e.name)
        if isinstance(e, sympy.Add):
            fixed = [t for t in e.args if is_loop_free(t)]
            moving = [t for t in e.args if not is_loop_free(t)]
            parts = [self.index(t) for t in moving]
            if fixed:
                parts.append(self.ref(sympy.Add(*fixed)))
            return "(" + " + ".join(parts) + ")"
        if isinstance(e, sympy.Mul):
            fixed = [t for t in e.args if is_loop_free(t)]
            moving = [t for t in e.args if not is_loop_free(t)]
            coef = sympy.Mul(*fixed)
            num, den = sympy.fraction(coef)
            parts = [self.index(t) for t in moving]
            if num != 1:
                parts.insert(0, self.ref(num))
            text = "*".join(parts)
            return f"({text} / {self.ref(den)})" if den != 1 else (text if len(parts) == 1 else f"({text})")
        if isinstance(e, sympy.floor):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            return f"({self.index(sympy.expand(num))} / {self.index(den)})"
        if isinstance(e, sympy.Mod):
            return f"({self.index(e.args[0])} % {self.index(e.args[1])})"
        raise ValueError(f"cannot render index expression {e}")


def unary(op: OpKind, x: str, dt: DType, attrs: Any) -> str:
    """C text of a unary elementwise op on a value already converted to the result type `dt` (the op
    table's spelling, opset/table.py)."""
    return _spell(op, dt, attrs, x=x)


def binary(op: OpKind, a: str, b: str, dt: DType) -> str:
    """C text of a binary op; operands are already in the computation type (`dt` for arithmetic)."""
    return _spell(op, dt, None, a=a, b=b)


def where(c: str, a: str, b: str, dt: DType) -> str:
    return _spell(OpKind.WHERE, dt, None, c=c, a=a, b=b)


def _spell(op: OpKind, dt: DType, attrs: Any, **operands: str) -> str:
    spelling = OP_INFO[op].c
    t = CTYPE[dt]
    if spelling is None:
        raise ValueError(f"no C rendering for {op.value}")
    if isinstance(spelling, CSpelling):
        return spelling.template(dt.is_floating, dt is DType.BOOL).format(t=t, **operands)
    return spelling(operands["x"], t, dt.is_floating, attrs, lambda v: literal(v, dt))


def promote(dts: Sequence[DType]) -> DType:
    """The type a comparison computes in (numpy-style promotion over the closed dtype set)."""
    order = [
        DType.BOOL,
        DType.UINT8,
        DType.INT8,
        DType.INT16,
        DType.INT32,
        DType.INT64,
        DType.BFLOAT16,
        DType.FLOAT16,
        DType.FLOAT32,
        DType.FLOAT64,
    ]
    best = max(dts, key=order.index)
    if best.is_floating and best is not DType.FLOAT64 and (DType.INT64 in dts or DType.INT32 in dts):
        return DType.FLOAT64
    return best
