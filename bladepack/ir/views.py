"""Strided views: which layout ops are free, proven for every shape in range.

In: the IR graph and a predicate saying which values live in memory. Out: `View` (base value, element
offset, shape, per-dim element strides, all int-or-sympy) for a value reached from a materialized value
through reshape / permute / slice / expand only, or None where some shape in range would need a copy.

Note [Reshape of a strided view]: a view is a list of (size, stride) modes; a reshape regroups the
modes into the new dims, splitting a mode where a new dim boundary falls inside it (proven divisible)
and merging adjacent modes that are contiguous (stride_k == stride_{k+1} * size_{k+1}, proven). A new
dim whose modes do not merge is kept as several sub-modes (a hierarchical dim, as in CuTe layouts):
such an intermediate cannot be indexed with one stride, but a later reshape or permute may make every
dim flat again — torch's attention splits heads as [L, N, E] -> [L, N*H, hd] -> [N*H, L, hd] ->
[N, H, L, hd], whose middle step is not strided while the end is. `view_of` answers only with flat
views. Size-1 dims whose size is the constant 1 place no constraint; a symbolic size that may be 1 is a
real mode, so the decision holds for every binding, never just for the samples.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy

from bladepack.ir import Node, OpKind, TensorType
from bladepack.ir.ops import PermuteAttrs, SliceAttrs
from bladepack.ir.types import IRDim, canonical_dim


def sym_eq(a: IRDim | sympy.Expr, b: IRDim | sympy.Expr) -> bool:
    """a == b for every binding of the symbols (a proof, not a sample check)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    return bool(sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0)


def simplify(e: IRDim | sympy.Expr) -> IRDim:
    return canonical_dim(sympy.expand(e)) if isinstance(e, sympy.Basic) else e


def contiguous_strides(shape: Sequence[IRDim]) -> tuple[IRDim, ...]:
    out: list[IRDim] = []
    acc: IRDim = 1
    for d in reversed(shape):
        out.append(acc)
        acc = simplify(acc * d)
    return tuple(reversed(out))


Mode = tuple[IRDim, IRDim]  # (size, stride)


@dataclass(frozen=True)
class View:
    base: int
    offset: IRDim
    shape: tuple[IRDim, ...]
    strides: tuple[IRDim, ...]  # meaningless (0) for a hierarchical dim
    sub: tuple[tuple[Mode, ...] | None, ...] | None = None  # per dim: its sub-modes, outer first, when not flat

    @property
    def flat(self) -> bool:
        return self.sub is None

    def _modes(self, d: int) -> tuple[Mode, ...]:
        if self.sub is not None and self.sub[d] is not None:
            return self.sub[d]  # type: ignore[return-value]
        return ((self.shape[d], self.strides[d]),)

    @staticmethod
    def whole(base: int, shape: Sequence[IRDim]) -> View:
        return View(base, 0, tuple(shape), contiguous_strides(shape))

    def is_contiguous(self) -> bool:
        want = contiguous_strides(self.shape)
        return all(d == 1 or sym_eq(s, w) for d, s, w in zip(self.shape, self.strides, want))

    def offset_at(self, idx: Sequence[sympy.Expr]) -> sympy.Expr:
        """The element offset of `idx`; a hierarchical dim's index splits over its sub-modes (outer
        first: quotient by the inner sizes, remainder by its own size)."""
        off = sympy.sympify(self.offset)
        for d, i in enumerate(idx):
            modes = self._modes(d)
            inner: sympy.Expr = sympy.Integer(1)
            for k in range(len(modes) - 1, -1, -1):
                size, stride = modes[k]
                part = sympy.sympify(i) if inner == 1 else sympy.floor(sympy.sympify(i) / inner)
                if k > 0:
                    part = sympy.Mod(part, size)
                off += part * stride
                inner = sympy.expand(inner * size)
        return sympy.expand(off)

    def permute(self, perm: Sequence[int]) -> View:
        sub = None if self.sub is None else tuple(self.sub[p] for p in perm)
        return View(
            self.base, self.offset, tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm), sub
        )

    def slice(self, axis: int, start: IRDim, step: int, length: IRDim) -> View | None:
        if self.sub is not None and self.sub[axis] is not None:
            return None
        shape = list(self.shape)
        strides = list(self.strides)
        offset = simplify(self.offset + start * strides[axis])
        shape[axis] = length
        strides[axis] = simplify(strides[axis] * step)
        return View(self.base, offset, tuple(shape), tuple(strides), self.sub)

    def broadcast_to(self, shape: Sequence[IRDim]) -> View | None:
        """numpy broadcasting: new leading dims and size-1 dims that grow get stride 0."""
        lead = len(shape) - len(self.shape)
        strides: list[IRDim] = [0] * lead
        sub: list[tuple[Mode, ...] | None] = [None] * lead
        for k, (d_in, d_out, s) in enumerate(zip(self.shape, shape[lead:], self.strides)):
            same = sym_eq(d_in, d_out)
            if not same and self.sub is not None and self.sub[k] is not None:
                return None
            strides.append(s if same else 0)
            sub.append(self.sub[k] if same and self.sub is not None else None)
        return View(self.base, self.offset, tuple(shape), tuple(strides), _sub_or_none(sub))

    def reshape(self, shape: Sequence[IRDim]) -> View | None:
        """Note [Reshape of a strided view]; None when no proof exists for every binding."""
        atoms = _merge([m for d in range(len(self.shape)) for m in self._modes(d) if m[0] != 1])
        strides: list[IRDim] = []
        sub: list[tuple[Mode, ...] | None] = []
        for want in shape:
            taken: list[Mode] = []
            have: sympy.Expr = sympy.Integer(1)
            while not sym_eq(have, want):
                if not atoms:
                    return None
                size, stride = atoms[0]
                need = quotient(sympy.sympify(want), have)
                if _divides(size, need):  # the whole mode fits in this dim
                    taken.append(atoms.pop(0))
                    have = sympy.expand(have * size)
                elif _divides(need, size):  # the dim ends inside this mode: split it
                    rest = simplify(quotient(sympy.sympify(size), need))
                    taken.append((simplify(need), simplify(stride * rest)))
                    atoms[0] = (rest, stride)
                    have = sympy.expand(have * need)
                else:
                    return None
            merged = _merge(taken)
            if len(merged) == 1:
                strides.append(merged[0][1])
                sub.append(None)
            elif not merged:
                strides.append(0)
                sub.append(None)
            else:
                strides.append(0)
                sub.append(tuple(merged))
        if atoms:
            return None
        return View(self.base, self.offset, tuple(shape), tuple(strides), _sub_or_none(sub))


def _merge(modes: list[Mode]) -> list[Mode]:
    """Adjacent modes that are contiguous (outer stride == inner stride * inner size) become one."""
    out: list[Mode] = []
    for size, stride in modes:
        if out and sym_eq(out[-1][1], simplify(stride * size)):
            out[-1] = (simplify(out[-1][0] * size), stride)
        else:
            out.append((size, stride))
    return out


def _sub_or_none(sub: Sequence[tuple[Mode, ...] | None]) -> tuple[tuple[Mode, ...] | None, ...] | None:
    return tuple(sub) if any(m is not None for m in sub) else None


def _divides(small: sympy.Expr, big: sympy.Expr) -> bool:
    """big is a multiple of small for every binding."""
    small, big = sympy.sympify(small), sympy.sympify(big)
    if small.is_Integer and big.is_Integer:
        return int(small) != 0 and int(big) % int(small) == 0
    _num, den = sympy.fraction(quotient(big, small))
    return bool(den == 1)


@functools.lru_cache(maxsize=4096)
def quotient(big: sympy.Expr, small: sympy.Expr) -> sympy.Expr:
    """big / small, cancelled. Memoized like sympy's own cache (a pure function of its arguments): a
    layout chain asks the same few questions many times (a SegFormer's lowering: 8772 cancels of 102
    distinct quotients, 8 of its 9 s), and a cancel of products of floor expressions costs
    milliseconds."""
    return sympy.cancel(big / small)


def reshape_groups(src: Sequence[IRDim], dst: Sequence[IRDim]) -> list[tuple[list[int], list[int]]] | None:
    """Pair runs of src dims with runs of dst dims of equal product; None when no proof exists."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        ins: list[int] = []
        outs: list[int] = []
        p_in: sympy.Expr = sympy.Integer(1)
        p_out: sympy.Expr = sympy.Integer(1)
        if i < len(src):
            ins.append(i)
            p_in = sympy.expand(p_in * src[i])
            i += 1
        if j < len(dst):
            outs.append(j)
            p_out = sympy.expand(p_out * dst[j])
            j += 1
        while not sym_eq(p_in, p_out):
            if i < len(src) and _divides(p_in, p_out):
                ins.append(i)
                p_in = sympy.expand(p_in * src[i])
                i += 1
            elif j < len(dst) and _divides(p_out, p_in):
                outs.append(j)
                p_out = sympy.expand(p_out * dst[j])
                j += 1
            else:
                return None
        groups.append((ins, outs))
    return groups


LAYOUT_OPS = (OpKind.RESHAPE, OpKind.PERMUTE, OpKind.SLICE, OpKind.EXPAND)


def view_of(
    g_nodes: dict[int, Node], types: dict[int, TensorType], vid: int, materialized: Callable[[int], bool]
) -> View | None:
    """The strided view `vid` is, when it is a layout chain over a materialized value and every dim of
    the result has one stride (intermediate values of the chain may be hierarchical)."""
    v = _view_of(g_nodes, types, vid, materialized)
    return v if v is not None and v.flat else None


def head_view(
    g_nodes: dict[int, Node], types: dict[int, TensorType], vid: int, materialized: Callable[[int], bool]
) -> View | None:
    """The view `vid` is when its last two dims have one stride each; leading dims may be hierarchical
    (grouped-query attention's K and V: a KV head repeated over the query heads that share it)."""
    v = _view_of(g_nodes, types, vid, materialized)
    if v is None or len(v.shape) < 2 or (v.sub is not None and any(m is not None for m in v.sub[-2:])):
        return None
    return v


def _view_of(
    g_nodes: dict[int, Node], types: dict[int, TensorType], vid: int, materialized: Callable[[int], bool]
) -> View | None:
    if materialized(vid):
        return View.whole(vid, types[vid].shape)
    n = g_nodes.get(vid)
    if n is None or n.op not in LAYOUT_OPS:
        return None
    src = _view_of(g_nodes, types, n.inputs[0], materialized)
    if src is None:
        return None
    if n.op is OpKind.RESHAPE:
        return src.reshape(n.type.shape)
    if n.op is OpKind.PERMUTE:
        assert isinstance(n.attrs, PermuteAttrs)
        return src.permute(n.attrs.perm)
    if n.op is OpKind.SLICE:
        assert isinstance(n.attrs, SliceAttrs)
        return src.slice(n.attrs.axis, n.attrs.start, n.attrs.step, n.type.shape[n.attrs.axis])
    return src.broadcast_to(n.type.shape)
