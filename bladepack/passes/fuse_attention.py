"""Fused attention: softmax(mask(scale(q @ k))) @ v recognised as one op of the fusion plan.

In: a matmul node, the graph's users and types, the planner's roles (as a predicate: may this node be
computed inline by a kernel), the graph's outputs and a guard test. Out: an `Attention` record (the
two matmuls, the softmax, the elementwise chain between the first matmul and the softmax, and the
q / k / v operands), or None.

Note [Fused attention]: attention as torch and ONNX graphs write it is two batched GEMMs around a
row softmax; run as such, it writes the [*lead, Sq, Skv] scores and reads them back twice, and at a
long sequence those passes cost more than both GEMMs. Both front ends produce the same shape of
graph — sdpa (export/ops_nn.py) is lowered to it too: `matmul(q, k) → elementwise chain → softmax
(last axis) → matmul(·, v)`, where the chain is any run of elementwise / broadcasting ops on the
scores' shape whose other operands do not depend on the scores (the 1/sqrt(d) scale, a boolean mask
through `where`, an additive mask, a causal mask from two aranges, a padding mask broadcast from
[batch, seq]). The record says which values; a backend's kernel evaluates the chain per score with
the code a loop kernel would use, so any mask the graph can express is a mask the kernel applies.
Conditions: the scores, each chain value and the probabilities have exactly one user (the next op),
none is a graph output, all run under the out matmul's guard; the head dims (D, Dv) are constants up
to the backend's limit; the dtype one the backend's kernel takes (float32 and float64 on CPU, and the
16-bit floats on CUDA: Note [Online softmax on CUDA]). Grouped-query attention's repeated K / V heads are read in place (a hierarchical
leading dim: ir/views.py `head_view`), so the repeat is never materialized.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import Attention
from bladepack.ir.ops import OP_INFO, AxisAttrs, MatmulAttrs, OpClass
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.views import sym_eq


def _same(a: Sequence[IRDim], b: Sequence[IRDim]) -> bool:
    return len(a) == len(b) and all(sym_eq(x, y) for x, y in zip(a, b))


def find_attention(
    out: Node,
    nodes: Mapping[int, Node],
    users: Mapping[int, Sequence[int]],
    types: Mapping[int, TensorType],
    inline_ok: Callable[[int], bool],
    outputs: Collection[int],
    same_guard: Callable[[int, int], bool],
    dtypes: Collection[DType],
    head_max: int,
) -> Attention | None:
    """Note [Fused attention]: the attention whose second matmul is `out`, or None. `inline_ok(v)`:
    node v may be computed inside a kernel (an elementwise op with kernels on this target); `dtypes`
    and `head_max`: what the target's attention kernel takes."""
    if out.op is not OpKind.MATMUL or out.type.dtype not in dtypes or out.type.rank < 2:
        return None

    def private(v: int, user: int) -> bool:  # computed inline by the attention kernel alone
        return v in nodes and list(users.get(v, ())) == [user] and v not in outputs and same_guard(v, out.id)

    probs = nodes.get(out.inputs[0])
    if probs is None or probs.op is not OpKind.SOFTMAX or not private(probs.id, out.id):
        return None
    assert isinstance(probs.attrs, AxisAttrs)
    scores_t = types[probs.id]
    if probs.attrs.axis % scores_t.rank != scores_t.rank - 1 or scores_t.dtype != out.type.dtype:
        return None

    def path(v: int, user: int) -> list[int] | None:
        """[v, ..., the scores' matmul] when v (read by `user`) reaches a matmul through private
        elementwise ops on the scores' shape and type; the chain goes through exactly one operand."""
        n = nodes.get(v)
        if n is None or not private(v, user) or not _same(n.type.shape, scores_t.shape):
            return None
        if n.type.dtype != scores_t.dtype:
            return None
        if n.op is OpKind.MATMUL:
            return [v]
        cls = OP_INFO[n.op].op_class
        if cls not in (OpClass.ELEMENTWISE, OpClass.BROADCAST) or n.op is OpKind.EXPAND or not inline_ok(v):
            return None
        found = [q for i in dict.fromkeys(n.inputs) if (q := path(i, v)) is not None]
        if len(found) != 1 or n.inputs.count(found[0][0]) != 1:
            return None
        return [v, *found[0]]

    walk = path(probs.inputs[0], probs.id)
    if walk is None:
        return None
    scores = nodes[walk[-1]]
    chain = walk[-2::-1]  # from the scores to the softmax's input
    a = scores.attrs
    assert isinstance(a, MatmulAttrs)
    q, k = scores.inputs
    v = out.inputs[1]
    qt, kt, vt = types[q], types[k], types[v]
    if any(t.dtype != out.type.dtype or t.rank < 2 for t in (qt, kt, vt)):
        return None
    d, dv = qt.shape[-1], out.type.shape[-1]
    if not isinstance(d, int) or not isinstance(dv, int) or max(d, dv) > head_max:
        return None
    if isinstance(out.attrs, MatmulAttrs) and out.attrs.transpose_b:
        return None  # v read as [*lead, Dv, Skv]: not produced by either front end
    lead = scores_t.shape[:-2]
    if not _same(out.type.shape[:-1], (*lead, scores_t.shape[-2])):
        return None
    return Attention(out.id, scores.id, probs.id, tuple(chain), q, k, v)


def side_inputs(att: Attention, nodes: Mapping[int, Node]) -> list[int]:
    """The values the chain reads besides itself (masks, scales): the kernel evaluates them inline
    where they are not in memory."""
    inside = {att.scores, *att.chain}
    return [i for c in att.chain for i in nodes[c].inputs if i not in inside]
