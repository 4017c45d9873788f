"""Note [Conditioned cases] (bladepack/reference_record.py) for the ONNX oracle: the model's order
decisions (TopK, ArgMax, ArgMin whose indices a node reads or the graph outputs) and a float64 twin
of the model to judge them by.

In: the ModelProto. Out: `OrderNode`s (what to fetch from a run to log each decision) and the twin
(`float64_twin`: float initializers, constants and casts in float64; None where the model has
nothing to widen). onnx's reference evaluator hands out any intermediate by name, so the oracle
fetches the decisions' values beside the outputs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import AttributeProto, ModelProto, TensorProto, helper, numpy_helper

from bladepack.ir.order_margins import OrderCall, OrderLog

_NARROW = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16}


@dataclass(frozen=True)
class OrderNode:
    """A decision of the main graph: its values `x`, `k` (TopK's count input, else None), the axis,
    the order and the op."""

    op: str
    x: str
    k: str | None
    axis: int
    descending: bool


def order_nodes(proto: ModelProto) -> list[OrderNode]:
    """The main graph's TopK / ArgMax / ArgMin nodes whose indices are read (by a node, or as an
    output). A TopK of opset 1 (k an attribute) or a decision inside a subgraph is not logged."""
    g = proto.graph
    read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    out = []
    for n in g.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if n.op_type == "TopK" and len(n.input) > 1 and len(n.output) > 1 and n.output[1] in read:
            axis, largest = int(attrs.get("axis", -1)), bool(attrs.get("largest", 1))
            out.append(OrderNode("TopK", n.input[0], n.input[1], axis, largest))
        elif n.op_type in ("ArgMax", "ArgMin") and n.output[0] in read:
            out.append(OrderNode(n.op_type, n.input[0], None, int(attrs.get("axis", 0)), n.op_type == "ArgMax"))
    return out


def fetched(nodes: list[OrderNode]) -> list[str]:
    """The intermediate values a run must hand out to log the decisions."""
    return [name for n in nodes for name in (n.x, n.k) if name]


def order_log(nodes: list[OrderNode], values: dict[str, Any]) -> OrderLog:
    """The decisions of one run from its fetched values, every one used (order_nodes keeps only those);
    a decision over integers is left out (integers round nowhere: nothing to judge)."""
    log = OrderLog()
    for k, n in enumerate(nodes):
        x = np.asarray(values[n.x])
        if not np.issubdtype(x.dtype, np.floating):
            continue
        lead = 1 if n.k is None else int(np.asarray(values[n.k]).reshape(-1)[0])
        log.decided(OrderCall(n.op, x.astype(np.float64), x.shape, n.axis, lead, n.descending), k)
        log.used.add(len(log.calls) - 1)
    return log


def float64_twin(proto: ModelProto) -> ModelProto | None:
    """The model computing in float64: its float initializers, Constant and ConstantOfShape values,
    Cast targets and declared value types widened, subgraphs included."""
    twin = copy.deepcopy(proto)
    changed = _widen_graph(twin.graph)
    return twin if changed else None


def _widen_tensor(t: TensorProto) -> bool:
    if t.data_type not in _NARROW:
        return False
    wide = numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name)
    t.CopyFrom(wide)
    return True


def _widen_graph(g: Any) -> bool:
    changed = False
    for t in g.initializer:
        changed |= _widen_tensor(t)
    for v in (*g.input, *g.output, *g.value_info):
        tt = v.type.tensor_type
        if tt.elem_type in _NARROW:
            tt.elem_type = TensorProto.DOUBLE
            changed = True
    for n in g.node:
        for a in n.attribute:
            if a.type == AttributeProto.TENSOR:
                changed |= _widen_tensor(a.t)
            elif a.type == AttributeProto.GRAPH:
                changed |= _widen_graph(a.g)
            elif a.type == AttributeProto.GRAPHS:
                for sub in a.graphs:
                    changed |= _widen_graph(sub)
            elif n.op_type == "Cast" and a.name == "to" and a.i in _NARROW:
                a.i = TensorProto.DOUBLE
                changed = True
    return changed
