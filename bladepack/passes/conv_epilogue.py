"""Convolution epilogues: the elementwise ops after a direct convolution, computed before its store.

In: a direct convolution node (passes/direct_conv.py: weight packed "ihwo"), the graph's users and
types, the planner's view function and materialized set, the graph's outputs. Out: a `ConvEpilogue`
— the chain of elementwise ops the convolution kernel evaluates on its accumulators — or None.

Note [Convolution epilogue]: a convolution in a CNN is followed by its bias add, the batch norm's
scale and shift, often a residual add and an activation. Run as a separate kernel, that chain reads
the convolution's whole output back and writes it again, and costs a launch of the pool — at the
small images dynamic-shape CNNs serve, as much time as the convolution itself. Unlike a BLAS call,
the direct kernel has every output value in registers before it stores, so it evaluates the chain
there (codegen `direct_conv_kernel`). From the convolution, follow single users while each is an
elementwise or broadcasting op of the convolution's own type whose other operands are in memory
(views of materialized values: weights, a residual) or literal constants; the chain ends at the first
value the plan keeps in memory (its stored result). Any elementwise op qualifies — the emitter
computes the chain with the same code a loop kernel would, so the results are bit-identical to the
unfused plan. Intermediate ops have exactly one user, so no other kernel needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import ConvEpilogue
from bladepack.ir.ops import OP_INFO, Conv2dAttrs, OpClass
from bladepack.ir.types import TensorType
from bladepack.ir.views import View


def _literal(nodes: Mapping[int, Node], v: int) -> bool:
    n = nodes.get(v)
    return n is not None and n.op in (OpKind.CONSTANT, OpKind.FULL) and not n.inputs


def find_conv_epilogue(
    conv: Node,
    nodes: Mapping[int, Node],
    users: Mapping[int, Sequence[int]],
    types: Mapping[int, TensorType],
    view: Callable[[int], View | None],
    materialized: Callable[[int], bool],
    outputs: Collection[int],
    same_guard: Callable[[int, int], bool],
) -> ConvEpilogue | None:
    """Note [Convolution epilogue]: the epilogue of direct convolution `conv`, or None. `view(v)` is v
    as a view of a materialized value (None when it is computed inline); `materialized(v)` tells the
    planner's current choice; `same_guard(a, b)`: a and b run under the same guard."""
    a = conv.attrs
    if conv.op is not OpKind.CONV2D or not isinstance(a, Conv2dAttrs) or a.weight_layout != "ihwo":
        return None
    out_type = types[conv.id]
    chain: list[int] = []
    cur = conv.id
    while not (materialized(cur) if chain else cur in outputs):
        us = users.get(cur, ())
        if len(us) != 1:
            break
        u = nodes[us[0]]
        cls = OP_INFO[u.op].op_class
        if cls not in (OpClass.ELEMENTWISE, OpClass.BROADCAST) or u.op is OpKind.EXPAND:
            break
        if types[u.id] != out_type or u.inputs.count(cur) != 1 or not same_guard(u.id, conv.id):
            break
        others = [i for i in u.inputs if i != cur]
        if not all(view(i) is not None or _literal(nodes, i) for i in others):
            break
        chain.extend(i for i in others if _literal(nodes, i) and i not in chain)
        chain.append(u.id)
        cur = u.id
    if not chain:
        return None
    return ConvEpilogue(cur, tuple(chain))
