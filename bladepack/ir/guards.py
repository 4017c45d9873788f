"""Which guards an executor may honour: the effective guard of every node (Note [Guarded nodes]).

In: a `Graph` whose nodes may carry guards. Out: per node id, the longest prefix of its guard that
every reader of its value shares — where the reader is the merge `where(pred, a, b)` of that branch,
the merge's own condition is shared by the operand it selects when the condition holds (a for
`taken`, b otherwise). A graph output, or a value read outside its branch after a pass moved it, so
keeps no guard and is always computed. Also: whether a predicate is decided by the shape program.

Note [Branch predicates]: a predicate is a 0-d bool value. One made by a `full` whose value is a
sympy boolean over the shape symbols (or a constant) is a *shape* predicate: the shape program
computes it, and a loader drops the launches it rules out when it prepares a shape signature. Any
other is a *data* predicate: the executor reads its one byte when it reaches the first launch that
depends on it (on CUDA, a synchronisation with the stream). Conditions are read outermost first and
stop at the first that fails, so an inner predicate computed inside an untaken branch is never read.
"""

from __future__ import annotations

import sympy

from bladepack.dtypes import DType
from bladepack.ir.graph import Graph, Guard, Node
from bladepack.ir.ops import ConstantAttrs, OpKind

Guards = dict[int, tuple[Guard, ...]]


def _shared(guard: tuple[Guard, ...], reader: Node, reader_guard: tuple[Guard, ...], v: int) -> tuple[Guard, ...]:
    keep = 0
    for c in guard:
        merge = (
            reader.op is OpKind.WHERE
            and len(reader.inputs) == 3
            and reader.inputs[0] == c.pred
            and reader.inputs[1 if c.taken else 2] == v
            and reader.inputs[2 if c.taken else 1] != v
        )
        if c not in reader_guard and not merge:
            break
        keep += 1
    return guard[:keep]


def effective_guards(g: Graph) -> Guards:
    """Per node id, the guard its computation may be skipped under (empty: always computed)."""
    readers: dict[int, list[Node]] = {}
    for n in g.nodes:
        for i in dict.fromkeys(n.inputs):
            readers.setdefault(i, []).append(n)
    defined = {p.id for p in g.inputs + g.weights}
    position: dict[int, int] = {}
    for k, n in enumerate(g.nodes):
        position[n.id] = k
    outputs = set(g.outputs)
    eff: Guards = {}
    for n in reversed(g.nodes):
        guard = () if n.id in outputs else n.guard
        # a predicate must be computed before the node (the verifier checks it; a pass may not have)
        for k, c in enumerate(guard):
            if not (c.pred in defined or position.get(c.pred, len(g.nodes)) < position[n.id]):
                guard = guard[:k]
                break
        for r in readers.get(n.id, ()):
            guard = _shared(guard, r, eff[r.id], n.id)
        eff[n.id] = guard
    return eff


def shape_predicate(nodes: dict[int, Node], pred: int) -> sympy.Basic | None:
    """Note [Branch predicates]: the predicate as a sympy boolean when the shape program decides it."""
    n = nodes.get(pred)
    while n is not None and n.op in (OpKind.RESHAPE, OpKind.CAST) and len(n.inputs) == 1:
        n = nodes.get(n.inputs[0])  # one element throughout; a cast of a boolean keeps its truth
        if n is not None and n.op is OpKind.FULL and n.type.dtype is not DType.BOOL:
            return None
    if n is None or n.op is not OpKind.FULL or not isinstance(n.attrs, ConstantAttrs):
        return None
    v = n.attrs.value
    if isinstance(v, (bool, int, sympy.Basic)):
        return sympy.sympify(bool(v)) if isinstance(v, (bool, int)) else v
    return None


def data_predicates(g: Graph, eff: Guards) -> set[int]:
    """The predicates some effective guard reads at run time (they must be materialized)."""
    nodes = {n.id: n for n in g.nodes}
    return {c.pred for guard in eff.values() for c in guard if shape_predicate(nodes, c.pred) is None}
