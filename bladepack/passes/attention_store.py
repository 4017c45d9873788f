"""Attention stores: a fused attention writes the permuted, reshaped tensor its output becomes.

In: a fused attention record (Note [Fused attention] in fuse_attention.py), the graph's nodes, users,
types and outputs. Out: the store chain — a permute of the attention's output and the reshapes after
it — or None. The backends' kernels write the chain's end at the strides
library_ops/attention_operands.py `out_strides` derives from it.

Note [Attention stores]: models split the heads before attention and merge them after it:
`(probs @ v).transpose(1, 2).reshape(b, s, heads * dv)` before the output projection. Run as written, a
copy kernel reads and writes every element of the attention's output once more between the attention
and the next GEMM. When the output's only use is a permute that keeps its last axis last, followed
only by reshapes (each the only use of the one before, none a graph output but the last), the planner
(passes/fusion.py) lets the attention kernel store the chain's end instead, provided the kernel that
would store it computes nothing but the chain: the output's element (..., i, e) lands at the row-major
position of its permuted index in the permute's shape (a reshape keeps row-major positions), so an
output row is still dv contiguous elements, at a row stride the permute gives. The reads are already
in place (head views); with this the attention moves no data but its own.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import Attention
from bladepack.ir.ops import PermuteAttrs


def find_attention_store(
    att: Attention, nodes: Mapping[int, Node], users: Mapping[int, Sequence[int]], outputs: Collection[int]
) -> tuple[int, ...] | None:
    """Note [Attention stores]: the permute and reshapes `att.out` becomes, in order, or None."""
    if att.out in outputs:
        return None
    chain: list[int] = []
    v = att.out
    while len(users.get(v, ())) == 1 and v not in outputs:
        u = nodes[users[v][0]]
        if not chain:
            perm = u.attrs.perm if isinstance(u.attrs, PermuteAttrs) else ()
            if u.op is not OpKind.PERMUTE or not perm or perm[-1] != len(perm) - 1:
                return None
        elif u.op is not OpKind.RESHAPE:
            break
        chain.append(u.id)
        v = u.id
    return tuple(chain) or None


__all__ = ["find_attention_store"]
