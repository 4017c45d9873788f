"""Per-model conversion state shared by the ONNX → IR converters.

In: the IR builder, the shape environment and the ONNX node being converted. Out: helpers that turn
ONNX values into IR values, fold what is known at optimize time and emit IR nodes with their types.

Note [Known values]: an ONNX value is an `OVal`: its IR type, plus either an IR value id, or its
contents known at optimize time (`data`), or both. Contents are a numeric numpy array (initializers,
Constant nodes, anything computed from them) or an object array of ints and sympy expressions (the
"shape values" that Shape → Gather → Concat chains compute from the input symbols). A converter that
needs an operand's contents (a Reshape's shape, a Slice's starts) reads `data`; one that computes on
tensors asks `ctx.tensor(v)`, which materializes known contents as a weight, or as CONSTANT nodes
whose symbolic values the shape program computes at run time. So shape arithmetic never runs as
tensor ops at run time, and a value only becomes a tensor when a real op consumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import sympy
from onnx import TensorProto

from bladepack.dtypes import DType
from bladepack.ir import GraphBuilder, OpKind, ShapeEnv, TensorType, Tri
from bladepack.ir.broadcast import BroadcastError, broadcast_shapes
from bladepack.ir.guards import under_guard
from bladepack.ir.ops import AxisAttrs, ConstantAttrs
from bladepack.ir.types import IRDim, canonical_dim

ONNX_TO_DTYPE: dict[int, DType] = {
    TensorProto.FLOAT: DType.FLOAT32,
    TensorProto.DOUBLE: DType.FLOAT64,
    TensorProto.FLOAT16: DType.FLOAT16,
    TensorProto.INT64: DType.INT64,
    TensorProto.INT32: DType.INT32,
    TensorProto.INT16: DType.INT16,
    TensorProto.INT8: DType.INT8,
    TensorProto.UINT8: DType.UINT8,
    TensorProto.BOOL: DType.BOOL,
}


# Why an operand that must be known at optimize time (a shape, axes, pads) is not.
RUNTIME_DATA = "computed from tensor data at run time (it must be known at optimize time)"


class Unsupported(Exception):
    """Raised by a converter for an op, attribute or input combination bladepack does not handle."""


def dtype_of(elem_type: int) -> DType:
    try:
        return ONNX_TO_DTYPE[elem_type]
    except KeyError:
        name = TensorProto.DataType.Name(elem_type) if elem_type in TensorProto.DataType.values() else elem_type
        allowed = ", ".join(d.value for d in ONNX_TO_DTYPE.values())
        raise Unsupported(f"element type {name} (the CPU backend computes {allowed})") from None


def simplify_dim(e: Any) -> IRDim:
    """An int or an expanded sympy expression (the form every IR dim takes)."""
    if isinstance(e, (bool, np.bool_)):
        raise Unsupported("a boolean where a dimension was expected")
    if isinstance(e, (int, np.integer)):
        return int(e)
    e = sympy.sympify(e)
    if e.is_Integer:
        return int(e)
    return canonical_dim(sympy.expand(e))


@dataclass
class OVal:
    """One ONNX value (Note [Known values])."""

    type: TensorType
    ir: int | None = None
    data: np.ndarray | None = None

    @property
    def is_symbolic(self) -> bool:
        return self.data is not None and self.data.dtype == object

    @property
    def numeric(self) -> np.ndarray | None:
        return self.data if self.data is not None and self.data.dtype != object else None


def text(v: object) -> str:
    """An attribute string as onnx's helper gives it (bytes) or as written (str)."""
    return v.decode() if isinstance(v, bytes) else str(v)


def dtype_of_numpy(dt: np.dtype) -> DType:
    for d in ONNX_TO_DTYPE.values():
        if d.to_numpy() == dt:
            return d
    allowed = ", ".join(d.value for d in ONNX_TO_DTYPE.values())
    raise Unsupported(f"element type {np.dtype(dt).name} (the CPU backend computes {allowed})")


def known(data: np.ndarray, dtype: DType | None = None) -> OVal:
    """An OVal of known contents. Object arrays hold shape values (ints and sympy expressions) or
    decided booleans; those whose elements are all plain become numeric arrays."""
    data = np.asarray(data)
    if dtype is None:
        dtype = DType.INT64 if data.dtype == object else dtype_of_numpy(data.dtype)
    if data.dtype == object:
        if dtype is DType.BOOL:
            data = np.array([bool(x) for x in data.ravel()], dtype=bool).reshape(data.shape)
        else:
            flat = [simplify_dim(x) for x in data.ravel()]
            if all(isinstance(x, int) for x in flat):
                data = np.array(flat, dtype=np.int64).reshape(data.shape).astype(dtype.to_numpy())
            else:
                boxed = np.empty(len(flat), dtype=object)
                boxed[:] = flat
                data = boxed.reshape(data.shape)
    else:
        data = data.astype(dtype.to_numpy(), copy=False)
    return OVal(TensorType(dtype, tuple(int(d) for d in data.shape)), None, data)


@dataclass
class OnnxCtx:
    b: GraphBuilder
    env: ShapeEnv
    opset: int
    weight_data: dict[str, np.ndarray] = field(default_factory=dict)
    assertions: list[tuple[Any, str]] = field(default_factory=list)
    node: onnx.NodeProto | None = None
    attrs: dict[str, Any] = field(default_factory=dict)
    loc: str = ""
    _const_count: int = 0

    # -- attributes
    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def text(self, name: str, default: str) -> str:
        """A string attribute (onnx gives bytes) or `default`."""
        return text(self.attrs.get(name, default))

    def ints(self, name: str, default: Sequence[int] | None = None) -> list[int] | None:
        v = self.attrs.get(name)
        return [int(x) for x in v] if v is not None else (list(default) if default is not None else None)

    # -- reading known operands
    def const_ints(self, v: OVal | None, what: str) -> list[IRDim]:
        """The contents of a 0-d or 1-d integer operand known at optimize time (entries may be symbolic)."""
        if v is None:
            raise Unsupported(f"missing {what}")
        if v.data is None:
            raise Unsupported(f"{what} {RUNTIME_DATA}")
        return [simplify_dim(x) for x in np.asarray(v.data).ravel()]

    def const_int_list(self, v: OVal | None, what: str) -> list[int]:
        vals = self.const_ints(v, what)
        if not all(isinstance(x, int) for x in vals):
            raise Unsupported(f"symbolic {what} {vals}")
        return [int(x) for x in vals]

    def const_scalar(self, v: OVal | None, what: str) -> float | int | bool:
        if v is None or v.numeric is None or v.numeric.size != 1:
            raise Unsupported(f"{what} must be a constant scalar")
        return v.type.dtype.scalar(v.numeric.ravel()[0].item())

    # -- materializing
    def tensor(self, v: OVal) -> int:
        """The IR value of `v`, creating it from known contents on first use."""
        if v.ir is not None:
            return v.ir
        assert v.data is not None
        if v.is_symbolic:
            v.ir = self._symbolic_tensor(v.data, v.type.dtype)
        elif v.data.ndim == 0 or (v.data.size == 1 and v.data.ndim <= 1 and v.type.dtype is not DType.BOOL):
            c = self.const(v.data.ravel()[0].item(), v.type.dtype)
            v.ir = c if v.data.ndim == 0 else self.reshape(c, v.type.shape)
        else:
            self._const_count += 1
            name = f"onnx_constant:{self._const_count}"
            self.weight_data[name] = np.ascontiguousarray(v.data).reshape(v.data.shape)
            v.ir = self.b.add_weight(name, v.type)
        return v.ir

    def _symbolic_tensor(self, data: np.ndarray, dtype: DType) -> int:
        if dtype not in (DType.INT64, DType.INT32):
            raise Unsupported(f"a symbolic shape value as {dtype.value}")
        items = [self.const(simplify_dim(x), dtype) for x in data.ravel()]
        if data.ndim == 0:
            return items[0]
        parts = [self.reshape(i, (1,)) for i in items]
        flat = (
            parts[0]
            if len(parts) == 1
            else self.emit(OpKind.CONCAT, parts, TensorType(dtype, (len(parts),)), AxisAttrs(0))
        )
        return self.reshape(flat, tuple(int(d) for d in data.shape))

    def assume(self, cond: Any, message: str) -> None:
        """Record a shape condition the program needs (checked by the shape program at every call);
        under a guard, it holds only where the guard's shape predicates do (ir/guards.py)."""
        self.assertions.append((under_guard(self.b, cond), message))

    # -- emitting
    def emit(self, op: OpKind, inputs: Sequence[int], t: TensorType, attrs: Any = None) -> int:
        return self.b.add(op, tuple(inputs), t, attrs, self.loc)

    def out(self, op: OpKind, inputs: Sequence[int], t: TensorType, attrs: Any = None) -> OVal:
        return OVal(t, self.emit(op, inputs, t, attrs))

    def t(self, v: int) -> TensorType:
        return self.b.types[v]

    def const(self, value: bool | int | float | sympy.Expr, dtype: DType) -> int:
        if isinstance(value, sympy.Expr):
            return self.emit(OpKind.CONSTANT, (), TensorType(dtype, ()), ConstantAttrs(simplify_dim(value)))
        try:
            value = dtype.scalar(value)
        except ValueError as e:
            raise Unsupported(str(e)) from None
        return self.emit(OpKind.CONSTANT, (), TensorType(dtype, ()), ConstantAttrs(value))

    def cast(self, v: int, dtype: DType) -> int:
        t = self.t(v)
        if t.dtype is dtype:
            return v
        return self.emit(OpKind.CAST, (v,), TensorType(dtype, t.shape))

    def reshape(self, v: int, shape: Sequence[IRDim]) -> int:
        t = self.t(v)
        shape = tuple(simplify_dim(d) for d in shape)
        if t.shape == shape:
            return v
        return self.emit(OpKind.RESHAPE, (v,), TensorType(t.dtype, shape))

    # -- shapes
    def eq(self, a: IRDim, b: IRDim) -> Tri:
        return self.env.prove_eq(a, b)

    def broadcast_shapes(self, *shapes: Sequence[IRDim]) -> tuple[IRDim, ...]:
        """The IR's broadcasting rule (ir/broadcast.py); shapes that cannot broadcast are Unsupported."""
        try:
            return broadcast_shapes(*shapes)
        except BroadcastError as e:
            raise Unsupported(str(e)) from None


Converter = Callable[[OnnxCtx, list[OVal | None]], list[OVal | None]]
TABLE: dict[str, Converter] = {}
# Ops whose results are computed at optimize time when their operands are known (Note [Known values])
# by the onnx reference implementation; everything else folds only through its own converter.
FOLDABLE: set[str] = set()


def converts(*op_types: str, foldable: bool = True) -> Callable[[Converter], Converter]:
    def register(fn: Converter) -> Converter:
        for op in op_types:
            assert op not in TABLE, f"duplicate converter for {op}"
            TABLE[op] = fn
            if foldable:
                FOLDABLE.add(op)
        return fn

    return register


def norm_axis(axis: int, rank: int) -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise Unsupported(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def arg(ins: Sequence[OVal | None], i: int) -> OVal | None:
    return ins[i] if i < len(ins) else None


def need(ins: Sequence[OVal | None], i: int, what: str = "input") -> OVal:
    v = arg(ins, i)
    if v is None:
        raise Unsupported(f"missing {what} {i}")
    return v
