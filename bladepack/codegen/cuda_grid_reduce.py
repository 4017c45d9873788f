"""Reductions of a few outputs over many elements split over the blocks of the grid (CUDA).

In: a reduce or row kernel's spec, its reduction node and context. Out: which kernels may split
(`grid_root`), whether and how a reduction is split (`grid_split`: the parts per output, the shapes
where it is, the workspace of parts), the "_grid" variant of the kernel (`grid_variant`) and the kernel
that combines the parts (`combine_variant`).

Note [Grid reductions]: an output of a reduction gets at most one block: a reduce kernel's below
32 outputs (Note [Split reductions] in cuda_emitter.py: 256 threads each), a row kernel's one block of
512 threads per row. A sum of 64M elements (a loss, a global statistic, a norm of a whole tensor, a
mean over a long axis at batch 1) then runs on one SM of 132, at a hundredth of the memory bandwidth.
Where a reduce kernel, or a row kernel whose one root is a sum, mean, product, max or min of elements
computed inline (no softmax or norm among them: `grid_root`), has fewer than SPLIT_OUTS outputs and
each reduces at least two GRID_CHUNKs of elements, its "_grid" variant, first in line, gives every
output P blocks (P = min(floor(length / GRID_CHUNK), floor(GRID_BLOCKS / outputs), GRID_MAX), a
formula of the shape symbols the shape program evaluates per input signature), and runs as the
reduce kernel (anchor_kernels.reduce_kernel, which both kinds' reductions are): block b takes part p = b mod P of output t = b / P, its threads the
reduced positions p * 256 + thread, then in steps of P * 256 (each warp's loads coalesce), combines them
as the `_split1` block does (bpk::block_all) and stores the part, unconverted (float32 for float32 /
float16 / bfloat16, float64, int64 for integer sums and products), to element b of a workspace of
outputs x P accumulators in the arena. A second kernel ("reduce_combine", launched only at the shapes
where the split runs: Note [Guarded launches] in lowering/lower_native.py) gives each output a thread
that combines its P parts in order (sum, product, or max / min propagating NaN as the kernel does),
divides a mean by its count and stores the output's type. The order of every sum is fixed by the
shape, so results repeat exactly; only their association differs from the one-block variant's.
Arg-reductions keep a thread per output (Note [Split reductions]).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy

from bladepack.codegen.anchor_kernels import reduce_axes, reduce_kernel, reduce_kind, store_reduced
from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.cuda_loops import REDUCE_FUNCTORS, SPLIT_OUTS, SPLIT_THREADS, CudaEmitter, accumulator, volume
from bladepack.codegen.kernel import ROW_OPS, KernelContext
from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import KernelSpec
from bladepack.ir.types import TensorType
from bladepack.ir.views import simplify

GRID_CHUNK = 8192  # elements a block reduces, at least (32 a thread)
GRID_BLOCKS = 512  # blocks of all outputs together, at most (about four per SM of a large GPU)
GRID_MAX = 512  # blocks of one output, at most
_OPS = (OpKind.SUM, OpKind.MEAN, OpKind.PROD, OpKind.AMAX, OpKind.AMIN)


@dataclass(frozen=True)
class GridSplit:
    """Note [Grid reductions]: the blocks per output (`parts`), the shapes at which the "_grid" variant
    and the combining kernel run (`when`, a sympy boolean) and the workspace's type."""

    parts: sympy.Expr
    when: Any
    workspace: TensorType


def grid_root(spec: KernelSpec, ctx: KernelContext) -> Node | None:
    """The reduction a reduce or row kernel computes, where it is the kernel's one root and every other
    node of the kernel is computed inline per element (a row kernel of a sum over trailing axes, not a
    softmax or a norm): the kernels a grid split can serve. None otherwise."""
    if spec.kind not in ("reduce", "row") or len(spec.roots) != 1:
        return None
    n = ctx.nodes.get(spec.roots[0])
    if n is None or n.op not in _OPS:
        return None
    if any(ctx.nodes[v].op in ROW_OPS for v in spec.nodes if v != n.id and v in ctx.nodes):
        return None
    return n


def grid_workspace(spec: KernelSpec, ctx: KernelContext) -> int | None:
    """The workspace of parts the lowering placed after a reduce or row kernel's root (`_reduce` in
    lowering/lower_native.py), or None where it placed none."""
    if spec.kind in ("reduce", "row") and len(spec.roots) == 2 and spec.roots[1] not in ctx.nodes:
        return spec.roots[1]
    return None


def grid_split(n: Node, ctx: KernelContext) -> GridSplit | None:
    """How reduction `n` splits over blocks, or None where it never does (an arg-reduction, a boolean,
    many outputs or short reductions at every shape in range)."""
    if n.op not in _OPS or n.type.dtype is DType.BOOL:
        return None
    xt = ctx.types[n.inputs[0]]
    axes, _ = reduce_axes(n, xt.rank)
    length = sympy.sympify(volume([xt.shape[a] for a in axes]))
    outputs = sympy.sympify(volume(n.type.shape))
    if ctx.proven_le(length, 2 * GRID_CHUNK - 1) or not ctx.proven_le(1, outputs):
        return None  # never long enough; or an empty output possible (no blocks to share)
    parts = sympy.Max(
        1,
        sympy.Min(sympy.floor(length / GRID_CHUNK), sympy.floor(sympy.Integer(GRID_BLOCKS) / outputs), GRID_MAX),
    )
    when = sympy.And(sympy.Lt(outputs, SPLIT_OUTS), sympy.Gt(parts, 1))
    if when is sympy.false:
        return None
    return GridSplit(parts, when, TensorType(accumulator(n), (simplify(outputs * parts),)))


def grid_variant(n: Node, ctx: KernelContext, workspace: int) -> tuple[Any, Callable[[CudaEmitter], None], sympy.Expr]:
    """The reduce kernel's "_grid" variant, given the workspace the lowering placed: its predicate,
    body and blocks."""
    split = grid_split(n, ctx)
    assert split is not None, "a workspace for a reduction that never splits over blocks"
    body = functools.partial(_grid_reduce, parts=split.parts, workspace=workspace)
    return split.when, body, simplify(volume(n.type.shape) * split.parts)


def _grid_reduce(em: CudaEmitter, parts: sympy.Expr, workspace: int) -> None:
    em.shares = (1, SPLIT_THREADS)
    em.grid = (em.args.ref(parts), workspace)
    reduce_kernel(em)


def combine_variant(n: Node, ctx: KernelContext, workspace: int) -> tuple[Callable[[CudaEmitter], None], sympy.Expr]:
    """Note [Grid reductions]: the kernel combining each output's parts (a thread an output): its body and
    threads."""
    split = grid_split(n, ctx)
    assert split is not None, "a combining kernel for a reduction that never splits over blocks"
    return functools.partial(_combine_kernel, parts=split.parts, workspace=workspace), sympy.sympify(
        volume(n.type.shape)
    )


def _combine_kernel(em: CudaEmitter, parts: sympy.Expr, workspace: int) -> None:
    n = em.ctx.nodes[em.spec.roots[0]]
    xt = em.ctx.types[n.inputs[0]]
    axes, _ = reduce_axes(n, xt.rank)
    kept = [d for d in range(xt.rank) if d not in axes]
    acc_t = accumulator(n)
    t = CTYPE[acc_t]
    functor = REDUCE_FUNCTORS[reduce_kind(n)]
    pw = em.ptr_load(workspace)

    def body(outer: tuple[Loop, ...]) -> None:
        full: list[sympy.Expr] = [sympy.Integer(0)] * xt.rank
        for d, s in zip(kept, outer):
            full[d] = s
        acc = em.fresh("acc")
        em.line(f"const int64_t np_ = {em.args.ref(parts)};")
        em.line(f"const auto* __restrict__ wp_ = {pw} + t_ * np_;")
        em.line(f"{t} {acc} = wp_[0];")
        em.line(f"for (int64_t q_ = 1; q_ < np_; ++q_) {acc} = {functor}({acc}, {t}(wp_[q_]));")
        store_reduced(em, n, xt, acc, acc_t, full)

    em.rows_loop([xt.shape[d] for d in kept], "16", body)
