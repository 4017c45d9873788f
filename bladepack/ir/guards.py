"""Which guards an executor may honour: the effective guard of every node (Note [Guarded nodes]).

In: a `Graph` whose nodes may carry guards. Out: per node id, the longest prefix of its guard that
every reader of its value shares — where the reader is the merge `where(pred, a, b)` of that branch,
the merge's own condition is shared by the operand it selects when the condition holds (a for
`taken`, b otherwise); a condition a shared one implies ("n > 3" implies "n > 2") counts as shared. A graph output, or a value read outside its branch after a pass moved it, so
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
from bladepack.ir.graph import Graph, GraphBuilder, Guard, Node
from bladepack.ir.ops import ConstantAttrs, OpKind

Guards = dict[int, tuple[Guard, ...]]


def _shared(
    nodes: dict[int, Node], guard: tuple[Guard, ...], reader: Node, reader_guard: tuple[Guard, ...], v: int
) -> tuple[Guard, ...]:
    if reader_guard[: len(guard)] == guard:  # the usual case: the reader is inside the value's branch
        return guard
    allowed = set(reader_guard)
    if reader.op is OpKind.WHERE and len(reader.inputs) == 3 and reader.inputs[1] != reader.inputs[2]:
        if reader.inputs[1] == v:  # the merge selects v exactly when its predicate holds
            allowed.add(Guard(reader.inputs[0], True))
        elif reader.inputs[2] == v:
            allowed.add(Guard(reader.inputs[0], False))
    keep = 0
    for c in guard:
        if c not in allowed and not any(_implies(nodes, a, c) for a in allowed):
            break
        keep += 1
    return guard[:keep]


def _implies(nodes: dict[int, Node], a: Guard, b: Guard) -> bool:
    """Whether condition `a` implies `b`: "e > t" implies "e > t'" for t >= t' (an unrolled loop's
    iteration i + 1 runs only where iteration i did)."""
    if not (a.taken and b.taken):
        return False
    pa, pb = shape_predicate(nodes, a.pred), shape_predicate(nodes, b.pred)
    ta = _threshold(pa) if pa is not None else None
    tb = _threshold(pb) if pb is not None else None
    return ta is not None and tb is not None and ta[0] == tb[0] and ta[1] >= tb[1]


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
    nodes = {n.id: n for n in g.nodes}
    eff: Guards = {}
    for n in reversed(g.nodes):
        guard = () if n.id in outputs else n.guard
        # a predicate must be computed before the node (the verifier checks it; a pass may not have)
        for k, c in enumerate(guard):
            if not (c.pred in defined or position.get(c.pred, len(g.nodes)) < position[n.id]):
                guard = guard[:k]
                break
        for r in readers.get(n.id, ()):
            guard = _shared(nodes, guard, r, eff[r.id], n.id)
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


def under_guard(b: GraphBuilder, cond: sympy.Basic) -> sympy.Basic:
    """A shape condition a front end records while converting nodes under `b.guard`, made to hold only
    where the guard's shape predicates do (an iteration past the trip count, or an untaken branch, must
    not fail the call). Data predicates cannot condition it: it stays required there."""
    nodes = {n.id: n for n in b.nodes}
    parts = []
    for c in pruned(nodes, b.guard):
        shape = shape_predicate(nodes, c.pred)
        if shape is not None:
            parts.append(shape if c.taken else sympy.Not(shape))
            continue
        todo = [c.pred] if c.taken else []  # a taken conjunction implies each of its shape operands
        while todo:
            n = nodes.get(todo.pop())
            if n is not None and n.op is OpKind.LOGICAL_AND:
                for i in n.inputs:
                    part = shape_predicate(nodes, i)
                    if part is not None:
                        parts.append(part)
                    else:
                        todo.append(i)
    return sympy.Or(sympy.Not(sympy.And(*parts)), cond) if parts else cond


def _threshold(p: sympy.Basic) -> tuple[sympy.Basic, int] | None:
    """(e, t) for a predicate "e > t" (or e >= t + 1) with an integer t, else None."""
    if isinstance(p, (sympy.StrictGreaterThan, sympy.GreaterThan)) and p.rhs.is_Integer:
        return p.lhs, int(p.rhs) + (0 if isinstance(p, sympy.StrictGreaterThan) else -1)
    if isinstance(p, (sympy.StrictLessThan, sympy.LessThan)) and p.lhs.is_Integer:
        return p.rhs, int(p.lhs) + (0 if isinstance(p, sympy.StrictLessThan) else -1)
    return None


def pruned(nodes: dict[int, Node], guard: tuple[Guard, ...]) -> tuple[Guard, ...]:
    """`guard` without the shape conditions "e > t" that a stronger "e > t'" of it implies (an unrolled
    loop's iteration i is under "trip > 0", ..., "trip > i"). Shape conditions are all decided when a
    signature is prepared, before any data condition is read, so dropping one never changes which
    reads happen."""
    best: dict[sympy.Basic, int] = {}
    for c in guard:
        p = shape_predicate(nodes, c.pred) if c.taken else None
        th = _threshold(p) if p is not None else None
        if th is not None:
            best[th[0]] = max(best.get(th[0], th[1]), th[1])
    if not best:
        return guard
    out, kept = [], set()
    for c in guard:
        p = shape_predicate(nodes, c.pred) if c.taken else None
        th = _threshold(p) if p is not None else None
        if th is not None:
            if th[1] < best[th[0]] or th[0] in kept:
                continue
            kept.add(th[0])
        out.append(c)
    return tuple(out)
