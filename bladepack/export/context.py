"""Per-node conversion context shared by the aten → IR converters.

In: the exported FX graph being walked, the IR builder, the symbol map. Out: helpers that turn FX
arguments into IR values or symbolic ints and emit IR nodes with the right types and provenance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy
import torch

from bladepack.dtypes import DType
from bladepack.export.sym import UnsupportedShapeExpr, to_bladepack
from bladepack.ir import GraphBuilder, OpKind, ShapeEnv, TensorType
from bladepack.ir.guards import under_guard
from bladepack.ir.ops import Attrs, ConstantAttrs, SymInt
from bladepack.ir.types import IRDim

TORCH_TO_DTYPE = {
    torch.float32: DType.FLOAT32,
    torch.float64: DType.FLOAT64,
    torch.float16: DType.FLOAT16,
    torch.bfloat16: DType.BFLOAT16,
    torch.int64: DType.INT64,
    torch.int32: DType.INT32,
    torch.int16: DType.INT16,
    torch.int8: DType.INT8,
    torch.uint8: DType.UINT8,
    torch.bool: DType.BOOL,
}
DTYPE_TO_TORCH = {v: k for k, v in TORCH_TO_DTYPE.items()}


class Unsupported(Exception):
    """Raised by a converter for an op (or an argument combination) bladepack does not handle."""


def dtype_of(t: torch.dtype) -> DType:
    try:
        return TORCH_TO_DTYPE[t]
    except KeyError:
        raise Unsupported(f"dtype {t}") from None


Value = int  # an IR value id
Result = Any  # Value, a tuple of Values (or None for results that must stay unused), or None


@dataclass
class Ctx:
    b: GraphBuilder
    env: ShapeEnv
    symbols: dict[str, sympy.Symbol]
    values: dict[torch.fx.Node, Result] = field(default_factory=dict)
    syms: dict[torch.fx.Node, sympy.Basic] = field(default_factory=dict)
    weight_data: dict[str, np.ndarray] = field(default_factory=dict)
    assertions: list[tuple[sympy.Basic, str]] = field(default_factory=list)
    node: torch.fx.Node | None = None
    loc: str = ""

    # -- reading arguments
    def v(self, a: Any) -> Value:
        if not isinstance(a, torch.fx.Node):
            raise Unsupported(f"expected a tensor argument, got {type(a).__name__}")
        if a not in self.values and a in self.syms:  # a symbolic int where a tensor goes: a 0-d tensor
            e = self.syms[a]
            if isinstance(e, (sympy.logic.boolalg.Boolean, sympy.core.relational.Relational)):
                raise Unsupported("a condition on symbolic sizes used as a tensor")
            return self.emit(OpKind.CONSTANT, (), TensorType(DType.INT64, ()), ConstantAttrs(e))
        r = self.values.get(a)
        if not isinstance(r, int):
            what = "several tensors (one result of them is wanted)" if isinstance(r, tuple) else "not a tensor"
            raise Unsupported(f"an argument is {what}")
        return r

    def t(self, v: Value) -> TensorType:
        return self.b.types[v]

    def s(self, a: Any) -> SymInt:
        """An int argument that may be symbolic (an FX node producing a SymInt)."""
        if isinstance(a, torch.fx.Node):
            if a not in self.syms:
                raise Unsupported("an integer argument computed from tensor values (sizes must not depend on data)")
            e = self.syms[a]
            return int(e) if getattr(e, "is_Integer", False) else e
        if isinstance(a, torch.SymInt):
            return self.expr(a.node.expr)
        if isinstance(a, bool) or not isinstance(a, int):
            raise Unsupported(f"expected an int, got {a!r}")
        return a

    def expr(self, e: Any) -> sympy.Basic:
        try:
            return to_bladepack(e, self.symbols)
        except UnsupportedShapeExpr as err:
            raise Unsupported(str(err)) from None

    def dims(self, seq: Sequence[Any]) -> tuple[SymInt, ...]:
        return tuple(self.s(a) for a in seq)

    # -- types
    def type_of_val(self, val: Any) -> TensorType:
        if not isinstance(val, torch.Tensor):
            raise Unsupported(f"non-tensor result {type(val).__name__}")
        return TensorType(dtype_of(val.dtype), tuple(self._dim(d) for d in val.shape))

    def _dim(self, d: Any) -> IRDim:
        if isinstance(d, torch.SymInt):
            return self.expr(d.node.expr)
        return int(d)

    def out_type(self, index: int | None = None) -> TensorType:
        assert self.node is not None
        val: Any = self.node.meta.get("val")
        if index is not None:
            val = val[index]
        return self.type_of_val(val)

    def assume(self, cond: Any, message: str) -> None:
        """Record a shape condition the program needs (checked by the shape program at every call);
        under a guard, it holds only where the guard's shape predicates do (ir/guards.py)."""
        self.assertions.append((under_guard(self.b, cond), message))

    # -- emitting
    def emit(
        self, op: OpKind, inputs: Sequence[Value], t: TensorType | None = None, attrs: Attrs | None = None
    ) -> Value:
        return self.b.add(op, tuple(inputs), t if t is not None else self.out_type(), attrs, self.loc)

    def derived_weight(self, key: str, dtype: DType, compute: Callable[[], np.ndarray]) -> Value:
        """A weight computed at optimize time from others' data, added once per key (a layer called
        twice shares it)."""
        if key in self.weight_data:
            return next(p.id for p in self.b.weights if p.name == key)
        data = np.ascontiguousarray(compute())
        self.weight_data[key] = data
        return self.b.add_weight(key, TensorType(dtype, tuple(int(d) for d in data.shape)))

    def const(self, value: bool | int | float, dtype: DType) -> Value:
        try:
            value = dtype.scalar(value)
        except ValueError as e:
            raise Unsupported(str(e)) from None
        return self.emit(OpKind.CONSTANT, (), TensorType(dtype, ()), ConstantAttrs(value))

    def cast(self, v: Value, dtype: DType) -> Value:
        t = self.t(v)
        if t.dtype is dtype:
            return v
        return self.emit(OpKind.CAST, (v,), TensorType(dtype, t.shape))

    def operand(self, a: Any, dtype: DType) -> Value:
        """A tensor argument cast to `dtype`, or a scalar argument as a 0-d constant of `dtype`."""
        if isinstance(a, torch.fx.Node) and a in self.syms:
            return self.emit(OpKind.CONSTANT, (), TensorType(dtype, ()), ConstantAttrs(self.syms[a]))
        if isinstance(a, torch.fx.Node):
            return self.cast(self.v(a), dtype)
        if isinstance(a, (bool, int, float)):
            return self.const(a, dtype)
        raise Unsupported(f"operand {a!r}")


Converter = Callable[[Ctx, tuple[Any, ...], dict[str, Any]], Result]
TABLE: dict[str, Converter] = {}


def converts(*names: str) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for n in names:
            assert n not in TABLE, f"duplicate converter for {n}"
            TABLE[n] = fn
        return fn

    return register


def arg(args: tuple[Any, ...], kwargs: dict[str, Any], i: int, name: str, default: Any = None) -> Any:
    if i < len(args):
        return args[i]
    return kwargs.get(name, default)


def norm_axis(axis: int, rank: int) -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise Unsupported(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)
