"""Strided views: which layout ops are free, proven for every shape in range.

In: the IR graph and a predicate saying which values live in memory. Out: `View` (base value, element
offset, shape, per-dim element strides, all int-or-sympy) for a value reached from a materialized value
through reshape / permute / slice / expand only, or None where some shape in range would need a copy.

Note [Reshape of a strided view]: a reshape is free when the input and output dims fall into groups
with equal products (proven symbolically) and, inside each group, the input dims are contiguous among
themselves (stride_k == stride_{k+1} * size_{k+1}, proven). Size-1 dims whose size is the constant 1
place no constraint. A symbolic size that may be 1 still counts as a real dim, so the decision holds for
every binding, never just for the samples.
"""

from __future__ import annotations

import itertools
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


@dataclass(frozen=True)
class View:
    base: int
    offset: IRDim
    shape: tuple[IRDim, ...]
    strides: tuple[IRDim, ...]

    @staticmethod
    def whole(base: int, shape: Sequence[IRDim]) -> View:
        return View(base, 0, tuple(shape), contiguous_strides(shape))

    def is_contiguous(self) -> bool:
        want = contiguous_strides(self.shape)
        return all(d == 1 or sym_eq(s, w) for d, s, w in zip(self.shape, self.strides, want))

    def permute(self, perm: Sequence[int]) -> View:
        return View(self.base, self.offset, tuple(self.shape[p] for p in perm), tuple(self.strides[p] for p in perm))

    def slice(self, axis: int, start: IRDim, step: int, length: IRDim) -> View:
        shape = list(self.shape)
        strides = list(self.strides)
        offset = simplify(self.offset + start * strides[axis])
        shape[axis] = length
        strides[axis] = simplify(strides[axis] * step)
        return View(self.base, offset, tuple(shape), tuple(strides))

    def broadcast_to(self, shape: Sequence[IRDim]) -> View:
        """numpy broadcasting: new leading dims and size-1 dims that grow get stride 0."""
        lead = len(shape) - len(self.shape)
        strides: list[IRDim] = [0] * lead
        for d_in, d_out, s in zip(self.shape, shape[lead:], self.strides):
            strides.append(s if sym_eq(d_in, d_out) else 0)
        return View(self.base, self.offset, tuple(shape), tuple(strides))

    def reshape(self, shape: Sequence[IRDim]) -> View | None:
        groups = reshape_groups(self.shape, shape)
        if groups is None:
            return None
        strides: list[IRDim] = []
        for ins, outs in groups:
            real = [k for k in ins if self.shape[k] != 1]
            for a, b in itertools.pairwise(real):
                if not sym_eq(self.strides[a], simplify(self.strides[b] * self.shape[b])):
                    return None
            inner: IRDim = self.strides[real[-1]] if real else 0
            group_strides: list[IRDim] = []
            for k in reversed(outs):
                group_strides.append(inner)
                inner = simplify(inner * shape[k])
            strides.extend(reversed(group_strides))
        return View(self.base, self.offset, tuple(shape), tuple(strides))


def _divides(small: sympy.Expr, big: sympy.Expr) -> bool:
    """big is a multiple of small for every binding."""
    small, big = sympy.sympify(small), sympy.sympify(big)
    if small.is_Integer and big.is_Integer:
        return int(small) != 0 and int(big) % int(small) == 0
    _num, den = sympy.fraction(sympy.cancel(big / small))
    return bool(den == 1)


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
    """The strided view `vid` is, when it is a layout chain over a materialized value."""
    if materialized(vid):
        return View.whole(vid, types[vid].shape)
    n = g_nodes.get(vid)
    if n is None or n.op not in LAYOUT_OPS:
        return None
    src = view_of(g_nodes, types, n.inputs[0], materialized)
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
