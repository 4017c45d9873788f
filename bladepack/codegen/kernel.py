"""Plain data and small helpers every kernel emitter shares (CPU and CUDA).

In: nothing but the IR. Out: `KernelContext` (what an emitter reads about the graph), `EmittedKernel`
(what it returns: variants, predicates, the shared argument list, source), `KernelEmitError`, the
error codes kernels report, and helpers for store offsets, accumulator types and reduction identities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from bladepack.codegen.c_render import CTYPE, Args
from bladepack.dtypes import DType
from bladepack.ir import OP_INFO, Node, OpKind
from bladepack.ir.fusion_plan import KernelSpec
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.views import View, contiguous_strides, sym_eq

# error codes a kernel reports through RunState::fail, plus 16 x its error site (the loader turns them into
# messages): an index out of [-size, size - 1], or out of [0, size - 1] where negatives are not allowed
# (Note [Negative indices] in opset/attrs.py)
ERR_INDEX = 1
ERR_INDEX_NONNEG = 2


FLOATS = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)


class KernelEmitError(ValueError):
    """A kernel could not be generated; `nodes` are the IR nodes it covered."""

    def __init__(self, message: str, nodes: frozenset[int]) -> None:
        super().__init__(message)
        self.nodes = nodes


@dataclass
class EmittedKernel:
    name: str
    spec: KernelSpec
    variants: list[tuple[str, Any]]  # (C function name, sympy predicate)
    stores: list[int]  # value ids written, in pointer order
    loads: list[View]  # buffers read (base value ids), in pointer order after the stores
    args: Args
    source: str
    error_sites: list[str] = field(default_factory=list)  # per error site: what failed, for messages
    check: str = ""  # the C function that checks a launch's operands (Note [Kernel operand checks])


@dataclass(frozen=True)
class KernelContext:
    nodes: dict[int, Node]
    types: dict[int, TensorType]
    view: Callable[[int], View | None]  # strided view of a value over a materialized buffer, if any
    proven_le: Callable[[IRDim, IRDim], bool]  # a <= b for every shape in the declared ranges (ShapeEnv)


def kernel_cost(nodes: Sequence[Node]) -> int:
    """A kernel's work per element, for the threads' chunk size: each op's `Cost.weight` (opset/table.py)."""
    return 1 + sum(OP_INFO[n.op].cost.weight for n in nodes)


def store_offset(shape: Sequence[IRDim], idx: Sequence[sympy.Expr]) -> sympy.Expr:
    return sympy.expand(sum((i * s for i, s in zip(idx, contiguous_strides(shape))), sympy.Integer(0)))


def same_shape(a: Sequence[IRDim], b: Sequence[IRDim]) -> bool:
    return len(a) == len(b) and all(sym_eq(x, y) for x, y in zip(a, b))


def reduce_init(kind: str, dt: DType) -> str:
    """C text of the identity of a "sum", "prod", "max" or "min" reduction in type `dt`."""
    t = CTYPE[dt]
    if kind in ("max", "min"):
        big = kind == "max"
        if dt in FLOATS:
            return f"{'-' if big else ''}std::numeric_limits<{t}>::infinity()"
        return f"std::numeric_limits<{t}>::{'lowest' if big else 'max'}()"
    return f"{t}({1 if kind == 'prod' else 0})"


def accumulator_type(n: Node) -> DType:
    """Sums and means of float32 accumulate in float64 (a user-visible reduction may cancel); integer
    sums and products in int64 (torch's result type); max / min and the row ops in their own type."""
    dt = n.type.dtype
    if n.op in (OpKind.SUM, OpKind.MEAN):
        return DType.FLOAT64 if dt in FLOATS else DType.INT64
    if n.op is OpKind.PROD:
        return dt if dt in FLOATS else DType.INT64
    return dt


ROW_OPS = (
    OpKind.SUM,
    OpKind.MEAN,
    OpKind.AMAX,
    OpKind.AMIN,
    OpKind.PROD,
    OpKind.SOFTMAX,
    OpKind.LOG_SOFTMAX,
    OpKind.LAYER_NORM,
    OpKind.RMS_NORM,
)
