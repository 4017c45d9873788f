"""Transposed operands of CUDA loop kernels through shared-memory tiles (Note [Transpose tiles]).

In: a loop kernel's spec and context (cuda_emitter.py asks for its variants). Out: `tile_variant`, the
tiled variant's predicate, body and tile count, where the kernel reads an operand contiguously along
another dim than the output's last; the body drives a `CudaEmitter` whose loads of that operand read
the block's tile (`TileLoad` in cuda_loops.py).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import sympy

from bladepack.codegen.c_render import CTYPE, Args, Loop
from bladepack.codegen.cuda_loops import CudaEmitter, TileLoad, split_index, volume
from bladepack.codegen.kernel import KernelContext, store_offset
from bladepack.ir.fusion_plan import KernelSpec
from bladepack.ir.views import simplify

# a TILE x TILE tile of the transposed operand per block of TILE x TILE_ROWS threads
TILE = 32
TILE_ROWS = 8
TILE_THREADS = TILE * TILE_ROWS

# Note [Transpose tiles]: a loop kernel stores its output row-major, so its threads walk the last dim;
# an operand whose contiguous dim is another one of the domain (dim k: a permute's source, an NCHW <->
# NHWC conversion, a head split) is then read with a stride on every load — each warp's 32 loads touch
# 32 sectors. Such a kernel gets a variant that moves a TILE x TILE tile of that operand through
# shared memory: the block's threads read it with consecutive lanes along dim k (coalesced), wait,
# then compute and store the outputs with consecutive lanes along the last dim (coalesced), reading
# the operand's element from the tile (column reads of a TILE + 1 wide tile: no bank conflicts). Every
# other operand is read as before. The variant runs where both dims are at least TILE long (a short
# one would leave most of each tile idle); one operand per kernel is tiled (the first found).


def transposed_load(spec: KernelSpec, ctx: KernelContext, index: int) -> tuple[int, TileLoad] | None:
    """(dim k, the tile's load with `read` unset) for a loop kernel with an operand read contiguously along
    a dim other than the last and with another stride along the last (a dry run of its body records the
    loads it makes), or None."""
    dom = spec.domain
    if len(dom) < 2:
        return None
    idx = tuple(Loop(f"i{m}") for m in range(len(dom)))
    probe = CudaEmitter(spec, ctx, Args(), list(spec.roots), [], index)
    probe.probe = []
    for r in spec.roots:
        probe.eval(r, idx)
    j = idx[-1]
    for base, _, off in probe.probe:
        off = sympy.expand(off)
        if not off.is_polynomial(*idx):
            continue
        stride = off.coeff(j)
        if stride == 0 or stride == 1 or j in stride.free_symbols:
            continue
        for k in range(len(dom) - 1):
            rest = sympy.expand(off - idx[k] - stride * j)
            if off.coeff(idx[k]) == 1 and not rest.free_symbols & {idx[k], j}:
                return k, TileLoad(base, rest, idx[k], j, stride, "")
    return None


def tile_kernel(em: CudaEmitter, k: int, tile: TileLoad) -> None:
    """Note [Transpose tiles]: one TILE x TILE tile of the domain's (dim k, last dim) per block iteration."""
    dom = em.spec.domain
    rank = len(dom)
    idx = tuple(Loop(f"i{m}") for m in range(rank))
    others = [m for m in range(rank - 1) if m != k]
    tiles_k, tiles_j = sympy.ceiling(sympy.sympify(dom[k]) / TILE), sympy.ceiling(sympy.sympify(dom[-1]) / TILE)
    dims = [dom[m] for m in others] + [tiles_k, tiles_j]
    tk, tj = Loop("tk_"), Loop("tj_")
    count = em.args.ref(simplify(volume(dims)))
    size_k, size_j = em.args.ref(dom[k]), em.args.ref(dom[-1])
    dt = em.ctx.types[tile.base].dtype
    em.uses_barriers = True
    em.line(f"__shared__ {CTYPE[dt]} bpk_tile[{TILE}][{TILE + 1}];")
    em.line(f"const int tx_ = threadIdx.x % {TILE}, ty_ = threadIdx.x / {TILE};")
    em.tile = TileLoad(tile.base, tile.rest, tile.k, tile.j, tile.stride, "bpk_tile[tx_][ty_ + r_]")
    header = [f"for (int64_t t_ = blockIdx.x; t_ < {count}; t_ += gridDim.x) {{"]
    prologue = split_index("t_", (*(idx[m] for m in others), tk, tj), dims, em.args, em.narrow(dims))

    def body() -> None:
        kk, jj = Loop("kk_"), Loop("jj_")
        src = sympy.expand(tile.rest + kk + tile.stride * jj)
        em.line(f"for (int r_ = 0; r_ < {TILE}; r_ += {TILE_ROWS}) {{")
        em.line(f"  const int64_t kk_ = tk_ * {TILE} + tx_, jj_ = tj_ * {TILE} + ty_ + r_;")
        load = f"bpk::ld({em.ptr_load(tile.base)} + {em.args.index(src)})"
        em.line(f"  if (kk_ < {size_k} && jj_ < {size_j}) bpk_tile[ty_ + r_][tx_] = {load};")
        em.line("}")
        em.line("__syncthreads();")

        def outputs() -> None:
            for r in em.spec.roots:
                em.store(r, store_offset(dom, idx), em.eval(r, idx))

        em.loop(
            [
                f"for (int r_ = 0; r_ < {TILE}; r_ += {TILE_ROWS}) {{",
                f"  const int64_t {idx[k].name} = tk_ * {TILE} + ty_ + r_, {idx[-1].name} = tj_ * {TILE} + tx_;",
                f"  if ({idx[k].name} < {size_k} && {idx[-1].name} < {size_j}) {{",
            ],
            (idx[k], idx[-1]),
            outputs,
            footer=("  }", "}"),
        )
        em.line("__syncthreads();  // the tile is read before the next one is written")

    em.loop(header, (*(idx[m] for m in others), tk, tj), body, prologue=prologue)


def tile_variant(
    spec: KernelSpec, ctx: KernelContext, index: int
) -> tuple[Any, Callable[[CudaEmitter], None], Any] | None:
    """Note [Transpose tiles]: (predicate, body, tiles) of the tiled variant of a loop kernel with a
    transposed operand (the caller launches a block per tile, grid-striding past its cap), or None: no
    such operand, or a tiled dim shorter than TILE at every shape."""
    found = transposed_load(spec, ctx, index)
    if found is None:
        return None
    k, tile = found
    dom = spec.domain
    pred = sympy.And(sympy.Ge(sympy.sympify(dom[k]), TILE), sympy.Ge(sympy.sympify(dom[-1]), TILE))
    if pred is sympy.false:
        return None
    tiles = volume([*(dom[m] for m in range(len(dom) - 1) if m != k), sympy.ceiling(sympy.sympify(dom[k]) / TILE)])
    return (
        pred,
        functools.partial(tile_kernel, k=k, tile=tile),
        sympy.sympify(tiles) * sympy.ceiling(sympy.sympify(dom[-1]) / TILE),
    )
