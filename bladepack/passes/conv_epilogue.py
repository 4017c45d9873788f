"""Convolution epilogues: the elementwise ops after a direct convolution, computed before its store.

In: a direct convolution node (passes/direct_conv.py: weight packed "ihwo"), the graph's users and
types, the planner's view function and materialized set, the graph's outputs. Out: a `ConvEpilogue`
— the chain of elementwise ops the convolution kernel evaluates on its accumulators — or None.

Note [Convolution epilogue]: a convolution in a CNN is followed by its bias add, the batch norm's
scale and shift, often a residual add and an activation. Run as a separate kernel, that chain reads
the convolution's whole output back and writes it again, and costs a launch of the pool — at the
small images dynamic-shape CNNs serve, as much time as the convolution itself. Unlike a BLAS call,
the direct kernel has every output value in registers before it stores, so it evaluates the chain
there (codegen `direct_conv_kernel`). From the convolution, ops join one at a time while each is an
elementwise or broadcasting op of the convolution's own type whose operands are the convolution, ops
already in, values in memory (views of materialized values: weights, a residual) or literal
constants; the epilogue ends at the first value the plan keeps in memory (its stored result). It may
be a DAG (hardswish reads its input twice), as long as every op but the last is read only inside it,
so no other kernel needs an intermediate. Any elementwise op qualifies — the emitter computes the
epilogue with the same code a loop kernel would, so the results are bit-identical to the unfused plan.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import ConvEpilogue
from bladepack.ir.ops import OP_INFO, Conv2dAttrs, OpClass, generated_conv, is_dense_conv
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
    planner's current choice; `same_guard(a, b)`: a and b run under the same guard.

    The epilogue may be a DAG, not only a chain: hardswish's x * clamp(x + 3, 0, 6) / 6 reads its input
    twice. Ops join one at a time, each once all its operands are the convolution, ops already in, or
    values in memory / literals; an epilogue is complete when every op in it but the last has all its
    users in it (the last is the one value stored). The largest complete one is taken, stopping at the
    first value the plan keeps in memory."""
    a = conv.attrs
    if conv.op is not OpKind.CONV2D or not isinstance(a, Conv2dAttrs) or not generated_conv(a):
        return None
    if conv.id in outputs:
        return None
    out_type = types[conv.id]
    members = [conv.id]  # the convolution, then the ops that joined, in order
    inside = {conv.id}
    order: list[int] = []  # the epilogue's nodes: each op after the literals it reads first
    best: ConvEpilogue | None = None

    def complete() -> bool:
        """Every member but the last is read only inside, is no output, and (past the convolution)
        is not a value the plan stores."""
        return all(
            m not in outputs and (k == 0 or not materialized(m)) and all(u in inside for u in users.get(m, ()))
            for k, m in enumerate(members[:-1])
        )

    def ready(u: Node) -> bool:
        cls = OP_INFO[u.op].op_class
        if cls not in (OpClass.ELEMENTWISE, OpClass.BROADCAST) or u.op is OpKind.EXPAND:
            return False
        if types[u.id] != out_type or not same_guard(u.id, conv.id):
            return False
        return all(i in inside or view(i) is not None or _literal(nodes, i) for i in u.inputs)

    while True:
        end = members[-1]
        if end != conv.id and complete():
            best = ConvEpilogue(end, tuple(order))
        if end != conv.id and (materialized(end) or end in outputs):
            break
        frontier = sorted({u for m in members for u in users.get(m, ()) if u not in inside})
        nxt = next((nodes[u] for u in frontier if u in nodes and ready(nodes[u])), None)
        if nxt is None:
            break
        order.extend(i for i in dict.fromkeys(nxt.inputs) if _literal(nodes, i) and i not in order)
        order.append(nxt.id)
        members.append(nxt.id)
        inside.add(nxt.id)
    if is_dense_conv(a, types[conv.inputs[1]].shape):
        return _into_output(conv.id, best, nodes, users, outputs) or best
    return best


def _into_output(
    conv: int,
    best: ConvEpilogue | None,
    nodes: Mapping[int, Node],
    users: Mapping[int, Sequence[int]],
    outputs: Collection[int],
) -> ConvEpilogue | None:
    """Note [Dense outputs]: a linear layer's result [N, H, W, C] that only a reshape back to [..., C]
    reads, a graph output: the dense kernel stores it straight into the output (both are contiguous with
    the same element order, and the kernel stores by linear offset), not into a buffer a copy kernel
    then reads. The reshape joins the epilogue as its last node."""
    end = best.out if best is not None else conv
    us = users.get(end, ())
    if len(us) != 1 or us[0] not in outputs or nodes[us[0]].op is not OpKind.RESHAPE or end in outputs:
        return None
    return ConvEpilogue(us[0], (*(best.nodes if best is not None else ()), us[0]))
