"""Structural and type checks on a graph.

In: a `Graph` and its `ShapeEnv`. Out: nothing, or `IRVerificationError` listing every problem found:
undefined or duplicate values, wrong arity or attribute type, free symbols not in the shape
environment, and broadcast operands whose dims provably cannot broadcast.
"""

from __future__ import annotations

import sympy

from bladepack.dtypes import DType
from bladepack.errors import BladepackError
from bladepack.ir.graph import Graph
from bladepack.ir.ops import OP_INFO, OpClass, OpKind
from bladepack.ir.shape_env import ShapeEnv, Tri
from bladepack.ir.types import TensorType


class IRVerificationError(BladepackError):
    pass


def _broadcast_problems(env: ShapeEnv, ts: list[TensorType], out: TensorType) -> list[str]:
    problems = []
    for axis in range(1, out.rank + 1):
        od = out.shape[-axis]
        for t in ts:
            if axis > t.rank:
                continue
            d = t.shape[-axis]
            if env.differ(d, 1) is Tri.YES:
                continue
            if env.differ(d, od) is Tri.NO:
                problems.append(f"operand dim {d} cannot broadcast to result dim {od}")
    return problems


def verify(g: Graph, env: ShapeEnv) -> None:
    problems: list[str] = []
    defined: dict[int, TensorType] = {}
    known = set(env.symbols)

    def define(vid: int, t: TensorType, what: str) -> None:
        if vid in defined:
            problems.append(f"{what}: value %{vid} defined twice")
        defined[vid] = t
        for d in t.shape:
            if isinstance(d, sympy.Expr) and not d.free_symbols <= known:
                problems.append(f"{what}: dim {d} uses unknown symbols {d.free_symbols - known}")
            elif isinstance(d, int) and d < 0:
                problems.append(f"{what}: negative dim {d}")

    for p in g.inputs + g.weights:
        define(p.id, p.type, p.name)
    for n in g.nodes:
        where = f"%{n.id} = {n.op.value}"
        info = OP_INFO[n.op]
        if not isinstance(n.attrs, info.attrs):
            problems.append(f"{where}: attrs {type(n.attrs).__name__}, expected {info.attrs.__name__}")
        if len(n.inputs) < info.min_inputs or (info.max_inputs >= 0 and len(n.inputs) > info.max_inputs):
            problems.append(f"{where}: {len(n.inputs)} inputs")
        missing = [i for i in n.inputs if i not in defined]
        if missing:
            problems.append(f"{where}: uses undefined values {missing}")
        elif info.op_class is OpClass.BROADCAST and n.op not in (OpKind.FULL, OpKind.EXPAND):
            problems += [f"{where}: {p}" for p in _broadcast_problems(env, [defined[i] for i in n.inputs], n.type)]
        for c in n.guard:  # Note [Guarded nodes]: a predicate defined before, a 0-d boolean
            t = defined.get(c.pred)
            if t is None:
                problems.append(f"{where}: guard on undefined value %{c.pred}")
            elif t.dtype is not DType.BOOL or t.shape != ():
                problems.append(f"{where}: guard on %{c.pred} of type {t}, not a 0-d bool")
        define(n.id, n.type, where)
    for o in g.outputs:
        if o not in defined:
            problems.append(f"output %{o} is not defined")
    if len(g.outputs) != len(g.output_names):
        problems.append("outputs and output_names differ in length")
    if problems:
        raise IRVerificationError("IR verification failed:\n" + "\n".join(f"  - {p}" for p in problems))
