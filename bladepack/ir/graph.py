"""The IR graph: immutable SSA nodes, named inputs, weights and outputs.

In: nodes built by a front end through `GraphBuilder`. Out: a `Graph` (plain frozen data that passes
read and rebuild) and a `Program` (graph + shape environment + weight arrays), the unit that flows
from export through optimize to the artifact writer.

Note [One value per node]: every node defines exactly one value, named by the node's id. Front-end ops
with several results (split, max.dim) become several nodes.

Note [Guarded nodes]: a run-time branch (torch.cond, ONNX If that optimize time cannot decide) is both
branches' nodes, each carrying a `guard` — the conditions, outermost first, under which its value is
needed — and one `where(pred, then_value, else_value)` per branch result that merges them. The merge
alone makes the program correct: a guard only lets an executor skip work whose value the merge then
discards. So a pass that drops or forgets a guard costs time, never correctness; and a guard is only
honoured where every reader of the value shares it (ir/guards.py decides, at lowering).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bladepack.ir.ops import OP_INFO, Attrs, NoAttrs, OpKind
from bladepack.ir.shape_env import ShapeEnv
from bladepack.ir.types import TensorType


@dataclass(frozen=True)
class Guard:
    """Note [Guarded nodes]: the value is needed only when boolean value `pred` (a 0-d tensor) is `taken`."""

    pred: int
    taken: bool


@dataclass(frozen=True)
class Node:
    id: int
    op: OpKind
    inputs: tuple[int, ...]
    attrs: Attrs
    type: TensorType
    loc: str = ""  # provenance: the source line and front-end op this node came from
    guard: tuple[Guard, ...] = ()  # Note [Guarded nodes]; outermost branch first


@dataclass(frozen=True)
class Param:
    """A graph input or a weight: a named value defined outside the node list."""

    name: str
    id: int
    type: TensorType


@dataclass(frozen=True)
class Graph:
    inputs: tuple[Param, ...]
    weights: tuple[Param, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[int, ...]
    output_names: tuple[str, ...]

    def value_types(self) -> dict[int, TensorType]:
        types = {p.id: p.type for p in self.inputs + self.weights}
        types.update((n.id, n.type) for n in self.nodes)
        return types

    def users(self) -> dict[int, list[int]]:
        """Each value's readers (node ids, in graph order, a node once however often it reads it)."""
        users: dict[int, list[int]] = {}
        for n in self.nodes:
            for i in dict.fromkeys(n.inputs):
                users.setdefault(i, []).append(n.id)
        return users


@dataclass(frozen=True)
class Program:
    graph: Graph
    shape_env: ShapeEnv
    weight_data: Mapping[str, np.ndarray] = field(default_factory=dict)
    # How the model's result was structured: "single" value or a "tuple" of values.
    output_structure: str = "single"
    # Conditions on the symbols that torch recorded at export (sympy booleans) with their messages.
    assertions: tuple[tuple[Any, str], ...] = ()
    # Per symbol, the widest range the front end found the model valid on, (min, max or None); a
    # symbol not here has no limit beyond its range facts (Note [Extending an artifact] in extend.py)
    limits: Mapping[str, tuple[int, int | None]] = field(default_factory=dict)


class GraphBuilder:
    """Appends nodes in topological order and hands out fresh value ids."""

    def __init__(self) -> None:
        self._next = 0
        self.inputs: list[Param] = []
        self.weights: list[Param] = []
        self.nodes: list[Node] = []
        self.types: dict[int, TensorType] = {}
        self.guard: tuple[Guard, ...] = ()  # given to every node added (Note [Guarded nodes])

    def _fresh(self) -> int:
        self._next += 1
        return self._next - 1

    def add_input(self, name: str, t: TensorType) -> int:
        p = Param(name, self._fresh(), t)
        self.inputs.append(p)
        self.types[p.id] = t
        return p.id

    def add_weight(self, name: str, t: TensorType) -> int:
        p = Param(name, self._fresh(), t)
        self.weights.append(p)
        self.types[p.id] = t
        return p.id

    def add(self, op: OpKind, inputs: tuple[int, ...], t: TensorType, attrs: Attrs | None = None, loc: str = "") -> int:
        a = attrs if attrs is not None else NoAttrs()
        expected = OP_INFO[op].attrs
        if not isinstance(a, expected):
            raise TypeError(f"{op.value} takes {expected.__name__}, got {type(a).__name__}")
        n = Node(self._fresh(), op, tuple(inputs), a, t, loc, self.guard)
        self.nodes.append(n)
        self.types[n.id] = t
        return n.id

    def finish(self, outputs: tuple[int, ...], output_names: tuple[str, ...]) -> Graph:
        return Graph(tuple(self.inputs), tuple(self.weights), tuple(self.nodes), outputs, output_names)


# rewrite(builder, node, remapped inputs) -> the value replacing the node, or None to copy it unchanged
NodeRewrite = Callable[[GraphBuilder, Node, tuple[int, ...]], int | None]


def rebuild_graph(g: Graph, rewrite: NodeRewrite) -> Graph:
    """A copy of `g` in which `rewrite` may replace each node by any nodes it adds to the builder
    (it may add weights too); the passes that change a few nodes share this."""
    b = GraphBuilder()
    remap: dict[int, int] = {}
    for prm in g.inputs:
        remap[prm.id] = b.add_input(prm.name, prm.type)
    for prm in g.weights:
        remap[prm.id] = b.add_weight(prm.name, prm.type)
    for n in g.nodes:
        ins = tuple(remap[i] for i in n.inputs)
        # the nodes replacing a guarded node share its guard (Note [Guarded nodes])
        b.guard = tuple(Guard(remap[c.pred], c.taken) for c in n.guard if c.pred in remap)
        new = rewrite(b, n, ins)
        remap[n.id] = new if new is not None else b.add(n.op, ins, n.type, n.attrs, n.loc)
    b.guard = ()
    return b.finish(tuple(remap[o] for o in g.outputs), g.output_names)
