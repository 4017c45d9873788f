"""How a fused attention kernel reads its operands, whatever the backend (Note [Fused attention]).

In: the kernel's context and the `Attention` record. Out: its `AttentionShape` (each operand's view
with strided rows, grouped-query heads read in place: ir/views.py `head_view`; their strides; the
lengths and head dims; the softmax's kind), and an operand's leading indices for an output's leading
index under matmul broadcasting. The CPU kernel
(library_ops/cpu_attention.py) and the CUDA one (library_ops/cuda_attention.py) address q, k and v
through these, so both read the same elements.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from bladepack.codegen.kernel import KernelContext
from bladepack.ir.fusion_plan import Attention
from bladepack.ir.ops import MatmulAttrs, SafeSoftmaxAttrs
from bladepack.ir.types import IRDim
from bladepack.ir.views import View, head_view


def operand_view(ctx: KernelContext, v: int) -> View:
    """Operand `v` as a view of a stored value whose last two axes are strided rows."""

    def materialized(u: int) -> bool:
        w = ctx.view(u)
        return w is not None and w.base == u

    view = head_view(ctx.nodes, ctx.types, v, materialized)
    assert view is not None, f"attention operand %{v} is not a view with strided rows"
    return view


def lead_index(shape: Sequence[IRDim], lead: Sequence[IRDim], syms: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """The operand's leading indices for the output's leading index `syms` (matmul broadcasting)."""
    own = shape[:-2]
    off = len(lead) - len(own)
    return [sympy.Integer(0) if (d == 1 and lead[k + off] != 1) else syms[k + off] for k, d in enumerate(own)]


@dataclass(frozen=True)
class AttentionShape:
    """What both kernels read of an `Attention` record: the operands' views, their row and element
    strides (the key's position stride `s_kj` and head-dim stride `s_kd` whether or not the first matmul
    transposes K), the scores' leading dims and lengths, the head dims, the softmax's kind and input."""

    q: View
    k: View
    v: View
    s_qi: IRDim
    s_qd: IRDim
    s_kj: IRDim
    s_kd: IRDim
    s_vj: IRDim
    s_ve: IRDim
    lead: tuple[IRDim, ...]
    sq: IRDim
    skv: IRDim
    d: int
    dv: int
    safe: bool  # sdpa's softmax: a row all -inf gives 0, not NaN
    chain_end: int  # the softmax's input: the chain's last value, or the scores


def attention_shape(att: Attention, ctx: KernelContext) -> AttentionShape:
    scores_t = ctx.types[att.scores]
    d, dv = ctx.types[att.q].shape[-1], ctx.types[att.out].shape[-1]
    assert isinstance(d, int) and isinstance(dv, int)
    qv, kv, vv = (operand_view(ctx, x) for x in (att.q, att.k, att.v))
    a = ctx.nodes[att.scores].attrs
    assert isinstance(a, MatmulAttrs)
    s_kj, s_kd = (kv.strides[-2], kv.strides[-1]) if a.transpose_b else (kv.strides[-1], kv.strides[-2])
    return AttentionShape(
        qv,
        kv,
        vv,
        qv.strides[-2],
        qv.strides[-1],
        s_kj,
        s_kd,
        vv.strides[-2],
        vv.strides[-1],
        tuple(scores_t.shape[:-2]),
        scores_t.shape[-2],
        scores_t.shape[-1],
        d,
        dv,
        isinstance(ctx.nodes[att.probs].attrs, SafeSoftmaxAttrs),
        ctx.nodes[att.probs].inputs[0],
    )
