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
from bladepack.dtypes import DType
from bladepack.ir import OpKind
from bladepack.ir.fusion_plan import Attention
from bladepack.ir.ops import ArangeAttrs, ConstantAttrs, MatmulAttrs, PermuteAttrs, SafeSoftmaxAttrs
from bladepack.ir.types import IRDim
from bladepack.ir.views import View, contiguous_strides, head_view


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


def row_base(view: View, shape: Sequence[IRDim], lead: Sequence[IRDim], syms: Sequence[sympy.Expr]) -> sympy.Expr:
    """The element offset of operand `view`'s first row for the output's leading index `syms`."""
    return view.offset_at([*lead_index(shape, lead, syms), sympy.Integer(0), sympy.Integer(0)])


def out_strides(att: Attention, ctx: KernelContext) -> tuple[IRDim, ...]:
    """The element stride of each axis of `att.out` in the buffer of `att.stored` (Note [Attention
    stores] in passes/attention_store.py)."""
    shape = ctx.types[att.out].shape
    if not att.store:
        return contiguous_strides(shape)
    permute = ctx.nodes[att.store[0]]
    assert isinstance(permute.attrs, PermuteAttrs)
    inner = contiguous_strides(ctx.types[permute.id].shape)
    strides: list[IRDim] = [0] * len(shape)
    for k, axis in enumerate(permute.attrs.perm):
        strides[axis] = inner[k]
    return tuple(strides)


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
    o_strides: tuple[IRDim, ...]  # each output axis's stride in the stored buffer (Note [Attention stores])

    @property
    def s_oi(self) -> IRDim:
        """The stride between output rows (an output row's dv elements are contiguous)."""
        return self.o_strides[-2]

    def out_base(self, syms: Sequence[sympy.Expr]) -> sympy.Expr:
        """The element offset of the output's first row for the leading index `syms`."""
        return sympy.Add(*(sympy.sympify(st) * x for st, x in zip(self.o_strides, syms)))


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
        out_strides(att, ctx),
    )


def empty_row(safe: bool, skv: str, t: str) -> str:
    """C for what a row with every score -inf (a sum of 0) gives: 0 under a safe softmax (sdpa's), NaN
    under a plain one; with no keys at all (`skv` 0) the product is an empty sum: 0, as torch's matmul
    gives. `t` is the accumulator's C type."""
    return f"{t}(0)" if safe else f"({skv} == 0 ? {t}(0) : std::numeric_limits<{t}>::quiet_NaN())"


@dataclass(frozen=True)
class KeyBound:
    """Note [Key bounds]: the bound `value + add`, value an integer read per query row."""

    value: int
    add: int


@dataclass(frozen=True)
class KeyBounds:
    lo: KeyBound | None  # keys below score -inf (None: from the first key)
    hi: KeyBound | None  # keys from here on score -inf (None: to the last key)


# comparison (key position on the left) -> (which bound, what to add); the mirrored form on the right
_KEY_LEFT = {OpKind.GE: ("lo", 0), OpKind.GT: ("lo", 1), OpKind.LT: ("hi", 0), OpKind.LE: ("hi", 1)}
_KEY_RIGHT = {OpKind.LE: ("lo", 0), OpKind.LT: ("lo", 1), OpKind.GT: ("hi", 0), OpKind.GE: ("hi", 1)}


def _integer(ctx: KernelContext, v: int) -> bool:
    return ctx.types[v].dtype.value.startswith("int")


def _int_constant(ctx: KernelContext, v: int) -> int | None:
    n = ctx.nodes.get(v)
    if n is None or n.op is not OpKind.CONSTANT or n.type.shape != () or not _integer(ctx, v):
        return None
    value = n.attrs.value if isinstance(n.attrs, ConstantAttrs) else None
    return value if isinstance(value, int) else None


def _key_offset(ctx: KernelContext, v: int, rank: int, skv: IRDim) -> int | None:
    """The constant c for which value `v`, right-aligned to the scores' rank, is the key position k plus
    c at every score (an arange of the keys, plus or minus integer constants: transformers' `kv_arange +
    kv_offset`), or None."""
    shape = ctx.types[v].shape
    if len(shape) > rank or not shape or shape[-1] != skv or any(d != 1 for d in shape[:-1]) or not _integer(ctx, v):
        return None
    n, c = ctx.nodes.get(v), 0
    while n is not None:
        if n.op in (OpKind.RESHAPE, OpKind.EXPAND):
            n = ctx.nodes.get(n.inputs[0])
            continue
        if n.op in (OpKind.ADD, OpKind.SUB) and len(n.inputs) == 2:
            right = _int_constant(ctx, n.inputs[1])
            left = _int_constant(ctx, n.inputs[0]) if n.op is OpKind.ADD else None
            if right is not None or left is not None:
                c += (right if right is not None else left or 0) * (-1 if n.op is OpKind.SUB else 1)
                n = ctx.nodes.get(n.inputs[0] if right is not None else n.inputs[1])
                continue
        break
    if n is None or n.op is not OpKind.ARANGE or n.type.shape != (skv,):
        return None
    a = n.attrs
    return c if isinstance(a, ArangeAttrs) and a.start == 0 and a.step == 1 else None


def _per_row(ctx: KernelContext, v: int, rank: int) -> bool:
    """Whether integer value `v` is read per query row: broadcast along the keys."""
    shape = ctx.types[v].shape
    return len(shape) <= rank and (not shape or shape[-1] == 1) and _integer(ctx, v)


# the comparison negated: `where(k > q, -inf, x)` keeps k <= q
_NEGATED = {OpKind.GE: OpKind.LT, OpKind.GT: OpKind.LE, OpKind.LT: OpKind.GE, OpKind.LE: OpKind.GT}


def _minus_inf(ctx: KernelContext, v: int) -> bool:
    n = ctx.nodes.get(v)
    return (
        n is not None
        and n.op is OpKind.CONSTANT
        and isinstance(n.attrs, ConstantAttrs)
        and n.attrs.value == float("-inf")
    )


def key_bounds(att: Attention, ctx: KernelContext) -> KeyBounds | None:
    """Note [Key bounds]: what bounds each query row's keys, or None. `where(cond, x, -inf)` keeps
    the keys where every conjunct of cond holds; `where(cond, -inf, x)` (a masked_fill) those where no
    disjunct of cond does. A conjunct compares the key position (an arange of the keys, plus or minus
    constants) with an integer read per query row; cond may be a stored value (transformers' mask, built
    once for every layer): its definition is read, and the kernel still applies cond per score."""
    n = ctx.nodes[ctx.nodes[att.probs].inputs[0]]
    if n.op is not OpKind.WHERE or n.id not in att.chain or ctx.nodes.get(n.inputs[0]) is None:
        return None
    if _minus_inf(ctx, n.inputs[2]):
        join, negate = (OpKind.LOGICAL_AND, OpKind.BITWISE_AND), False
    elif _minus_inf(ctx, n.inputs[1]):
        join, negate = (OpKind.LOGICAL_OR, OpKind.BITWISE_OR), True
    else:
        return None
    scores = ctx.types[att.scores].shape
    found: dict[str, KeyBound] = {}
    terms = [ctx.nodes[n.inputs[0]]]
    while terms:
        c = terms.pop()
        if c.op is join[0] or (c.op is join[1] and c.type.dtype is DType.BOOL):
            terms += [t for i in c.inputs if (t := ctx.nodes.get(i)) is not None]
            continue
        if c.op not in _KEY_LEFT or len(c.inputs) != 2:
            continue
        op = _NEGATED[c.op] if negate else c.op
        a, b = c.inputs
        for key, x, table in ((a, b, _KEY_LEFT), (b, a, _KEY_RIGHT)):
            offset = _key_offset(ctx, key, len(scores), scores[-1])
            if offset is not None and _per_row(ctx, x, len(scores)):
                side, add = table[op]
                found.setdefault(side, KeyBound(x, add - offset))  # k + c < x: k < x - c
                break
    if not found:
        return None
    return KeyBounds(found.get("lo"), found.get("hi"))


def bound_index(ctx: KernelContext, bound: KeyBound, row: Sequence[sympy.Expr]) -> tuple[sympy.Expr, ...]:
    """The index of `bound`'s value for the scores' row index `row` (the keys' index 0): its
    broadcast dims read at 0."""
    return _broadcast_read(ctx.types[bound.value].shape, (*row, sympy.Integer(0)))


def _broadcast_read(shape: Sequence[IRDim], full: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
    """The index of a value of `shape`, right-aligned to the scores, at the scores' index `full`: its
    size-1 dims read at 0."""
    return tuple(sympy.Integer(0) if d == 1 else i for d, i in zip(shape, full[len(full) - len(shape) :]))


MASK_FILL_MAX = -1.0e4  # a where's constant at most this is a mask's fill (Note [Masked key blocks])


@dataclass(frozen=True)
class KeyMask:
    """Note [Masked key blocks]: a key of a leading index scores `fill` at every query row wherever one
    of `terms` (boolean values read per key, broadcast along the query rows) is `masks`."""

    terms: tuple[tuple[int, bool], ...]  # (value, the value of it that masks the key)
    fill: int  # the where's constant (a value id)
    finite: bool  # the fill is not -inf: a row may need every key (a second pass)


def _depends_on(ctx: KernelContext, v: int, target: int, inside: frozenset[int]) -> bool:
    """Whether value `v`, computed from the kernel's own nodes `inside`, reads `target`."""
    todo, seen = [v], set()
    while todo:
        u = todo.pop()
        if u == target:
            return True
        if u in seen or u not in inside:
            continue
        seen.add(u)
        todo += ctx.nodes[u].inputs
    return False


def key_mask(att: Attention, ctx: KernelContext) -> KeyMask | None:
    """Note [Masked key blocks]: the per-key terms of the softmax input's where, or None. In
    `where(cond, x, fill)` a key is masked where a conjunct of cond is false, in `where(cond, fill, x)`
    (a masked_fill) where a disjunct is true; the terms are those conjuncts / disjuncts that are read per
    key (a padding mask: size 1 along the query rows) and that the kernel can read or compute."""
    n = ctx.nodes[ctx.nodes[att.probs].inputs[0]]
    if n.op is not OpKind.WHERE or n.id not in att.chain:
        return None
    fills = [k for k in (1, 2) if _fill(ctx, n.inputs[k])]
    if len(fills) != 1:
        return None
    keep = fills[0] == 2
    join = (OpKind.LOGICAL_AND, OpKind.BITWISE_AND) if keep else (OpKind.LOGICAL_OR, OpKind.BITWISE_OR)
    rank = len(ctx.types[att.scores].shape)
    inside = frozenset(att.nodes) | frozenset(att.chain)
    terms: list[tuple[int, bool]] = []
    todo = [n.inputs[0]]
    while todo:
        c = ctx.nodes.get(todo.pop())
        if c is None:
            continue
        shape = c.type.shape
        if (
            c.type.dtype is DType.BOOL
            and len(shape) <= rank
            and (len(shape) < 2 or shape[-2] == 1)
            and (c.id in inside or ctx.view(c.id) is not None)
            and not _depends_on(ctx, c.id, att.scores, inside)
        ):
            terms.append((c.id, not keep))
        elif c.op is join[0] or (c.op is join[1] and c.type.dtype is DType.BOOL):
            todo += c.inputs
    fill = n.inputs[fills[0]]
    return KeyMask(tuple(terms), fill, not _minus_inf(ctx, fill)) if terms else None


def _fill(ctx: KernelContext, v: int) -> bool:
    """Whether `v` is a scalar constant a mask fills with (-inf, a dtype's lowest, -1e4 ...)."""
    n = ctx.nodes.get(v)
    value = n.attrs.value if n is not None and isinstance(n.attrs, ConstantAttrs) else None
    return (
        n is not None
        and n.op is OpKind.CONSTANT
        and n.type.shape == ()
        and isinstance(value, (int, float))
        and not isinstance(value, bool)
        and value <= MASK_FILL_MAX
    )


def mask_index(ctx: KernelContext, term: int, lead: Sequence[sympy.Expr], key: sympy.Expr) -> tuple[sympy.Expr, ...]:
    """The index of key mask term `term` for the scores' leading index `lead` and key `key`: its
    broadcast dims (the query rows among them) read at 0."""
    return _broadcast_read(ctx.types[term].shape, (*lead, sympy.Integer(0), key))
