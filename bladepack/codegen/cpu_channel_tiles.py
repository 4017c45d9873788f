"""CPU loop kernels whose inputs are contiguous along another dim than the output's last
(Note [Channel tiles]).

In: a loop kernel's spec and context. Out: the axis to tile along (`tile_axis`, None where the
ordinary schedule serves) and the kernel body that computes blocks of that axis in its inner loop
(`channel_tile_kernel`).

Note [Channel tiles]: a loop kernel runs its output's last dim as the inner, vectorized loop. Where
that dim is W of an NCHW result computed from channels-last data — SegFormer's decode head
upsamples four [B, h * w, C] projections bilinearly and concatenates them as NCHW for its 1 x 1
fusion convolution — every element of the inner loop reads its inputs C apart at positions the
interpolation computes per element, so each vector of outputs is four gathers per input, and the
per-column source index and weight are recomputed for every channel and row: 9.8 ms of a 21.5 ms
call at 4 x 256 x 256 in the AVX2 library on a Zen 4 EPYC (4.4 of 14.8 ms in the AVX-512 one).
`tile_axis` finds such a kernel by a dry run of its body: every load that varies along the last dim
is strided along it and contiguous along one other axis. Then each row (the dims but those two) walks
that axis in blocks of CHANNEL_TILE: per position x of the last dim (its per-position values, an
interpolation's source and weights, computed once there), the block's channels in the vectorized
inner loop, contiguous loads, into a thread-local tile [W][CHANNEL_TILE]; then the tile is written
out channel by channel, each a contiguous run of W stores. A concatenation along the tiled axis walks
its inputs' ranges one after another, each block inside one input.

Note [Tile write-out]: written out channel by channel, each store of a channel's run read the tile
CHANNEL_TILE elements apart (a gather per vector). The tile goes out in 8 x 8 blocks instead (eight
positions' eight channels, contiguous loads of the tile's rows, transposed in registers, stored as
eight contiguous runs of eight), then the positions past the last whole block and the channels past
the last whole eight as before. Measured in one process, per launch, on a Zen 4 EPYC (x86-64-v3 and
x86-64-v4 libraries): the permutes at the exits of channels-last chains, 64 channels at 8 x 48 x 48
381 -> 212 µs and 301 -> 175 µs, 256 channels at 112 x 112 2.26 -> 1.36 ms and 1.72 -> 1.28 ms, 16
channels 1.8-2.6x, maps narrower than a block (7 x 7) the same; SegFormer's decode head at
4 x 256 x 256 2.62 -> 1.64 ms and 2.11 -> 1.51 ms (the whole call 1.09x and 1.04x). The sums are the
same values moved, bitwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from bladepack.codegen.c_render import CTYPE, Args, Loop
from bladepack.codegen.cpu_loops import CpuEmitter
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import KernelContext, kernel_cost, store_offset
from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import KernelSpec
from bladepack.ir.ops import AxisAttrs
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify

CHANNEL_TILE = 16  # channels per block: one AVX-512 vector of float32, two AVX2 ones


def tile_axis(spec: KernelSpec, ctx: KernelContext) -> int | None:
    """Note [Channel tiles]: the axis a loop kernel of one root should compute in its inner loop, or
    None."""
    dom = spec.domain
    rank = len(dom)
    if spec.kind != "loop" or rank < 2 or len(spec.roots) != 1 or ctx.types[spec.roots[0]].dtype.itemsize != 4:
        return None
    syms = [Loop(f"i{k}") for k in range(rank)]
    axes: dict[int, int] = {}
    for off, varies in _probe(spec, ctx, syms):
        if not varies:
            continue
        e = sympy.expand(off)
        if e.coeff(syms[-1]) == 1:
            return None  # a load contiguous along the last dim: the ordinary schedule vectorizes it
        along = [k for k in range(rank - 1) if e.coeff(syms[k]) == 1]
        if len(along) != 1:
            return None
        axes[along[0]] = axes.get(along[0], 0) + 1
    if len(axes) != 1:
        return None
    (axis,) = axes
    split = _concat(ctx.nodes.get(spec.roots[0]), rank)
    return axis if split is None or split == axis else None


def _probe(spec: KernelSpec, ctx: KernelContext, idx: Sequence[Loop]) -> list[tuple[sympy.Expr, bool]]:
    """A dry run of the kernel's roots at `idx` inside a row scope (all but the last) and an inner scope
    (the last): each load's offset and whether it varies along the last axis (its value lands in the
    inner scope, directly or through an index that does)."""
    em = CpuEmitter(spec, ctx, Args(), list(spec.roots), [])
    em.probe = []
    em.push(idx[:-1])
    em.push(idx[-1:])
    inner = len(em.scopes) - 1
    for r in spec.roots:
        em.eval(r, tuple(idx))
    return [(off, depth >= inner) for off, depth in em.probe]


def _concat(n: Node | None, rank: int) -> int | None:
    if n is None or n.op is not OpKind.CONCAT:
        return None
    assert isinstance(n.attrs, AxisAttrs)
    return n.attrs.axis % rank


def channel_tile_kernel(em: Emitter, axis: int) -> None:
    """Note [Channel tiles]: the loop kernel's one root computed in blocks of `axis`."""
    dom = em.spec.domain
    rank = len(dom)
    root = em.spec.roots[0]
    dt = em.ctx.types[root].dtype
    t = CTYPE[dt]
    n_last = em.args.ref(dom[-1])
    tile = CHANNEL_TILE
    n = em.ctx.nodes.get(root)
    parts: list[tuple[IRDim, IRDim, int]] = []  # (start, end along the axis, the value computed there)
    if _concat(n, rank) == axis:
        assert n is not None
        start: IRDim = 0
        for v in n.inputs:
            end = simplify(start + em.ctx.types[v].shape[axis])
            parts.append((start, end, v))
            start = end
    else:
        parts.append((0, dom[axis], root))
    rows = [k for k in range(rank) if k not in (axis, rank - 1)]
    c, x = Loop("ct_"), Loop("xt_")  # rows_loop names the row symbols i0, i1, ...
    cw, xw = Loop("cw_"), Loop("xw_")
    out = em.ptr_store(root)

    def body(outer: tuple[Loop, ...]) -> None:
        idx: list[sympy.Expr] = [sympy.Integer(0)] * rank
        for k, s in zip(rows, outer):
            idx[k] = s
        idx[rank - 1] = x
        widx = list(idx)
        widx[axis], widx[rank - 1] = cw, xw
        woff = em.args.index(store_offset(dom, tuple(widx)))
        for start, end, v in parts:
            at = list(idx)
            at[axis] = sympy.expand(c - start)
            value = em._thunk(v, tuple(at), dt)

            def block(value: Callable[[], str] = value, end: IRDim = end) -> None:
                em.line(f"const int64_t cn_ = std::min<int64_t>({tile}, {em.args.ref(end)} - cb_);")

                def channels() -> None:
                    em.line(f"ctile_[{x.name} * {tile} + cc_] = {value()};")

                def position() -> None:
                    em.loop(
                        ["#pragma omp simd", "for (int64_t cc_ = 0; cc_ < cn_; ++cc_) {"],
                        [c],
                        channels,
                        prologue=[f"const int64_t {c.name} = cb_ + cc_;"],
                    )

                em.loop([f"for (int64_t {x.name} = 0; {x.name} < {n_last}; ++{x.name}) {{"], [x], position)
                # Note [Tile write-out]: whole 8 x 8 blocks of the tile through a register transpose,
                # then the positions past them and the channels past the last whole eight; a map
                # narrower than a block (no whole block, c8_ = 0) takes the second loop alone, as before
                em.line(f"const int64_t x8_ = {n_last} - {n_last} % 8, c8_ = x8_ > 0 ? cn_ - cn_ % 8 : 0;")
                em.line("for (int64_t xb_ = 0; xb_ < x8_; xb_ += 8)")
                em.line("  for (int64_t cq_ = 0; cq_ < c8_; cq_ += 8) {")
                em.line(f"    {t} tt_[8][8];")
                em.line("    #pragma GCC unroll 8")
                em.line("    for (int i = 0; i < 8; ++i)")
                em.line("      #pragma GCC unroll 8")
                em.line(f"      for (int j = 0; j < 8; ++j) tt_[j][i] = ctile_[(xb_ + i) * {tile} + cq_ + j];")
                em.line("    #pragma GCC unroll 8")
                em.line("    for (int j = 0; j < 8; ++j) {")
                em.line(f"      const int64_t {cw.name} = cb_ + cq_ + j;")
                em.line("      #pragma GCC unroll 8")
                em.line(
                    f"      for (int64_t {xw.name} = xb_; {xw.name} < xb_ + 8; ++{xw.name}) "
                    f"{out}[{woff}] = tt_[j][{xw.name} - xb_];"
                )
                em.line("    }")
                em.line("  }")
                for first, last, x0 in (("0", "c8_", "x8_"), ("c8_", "cn_", "0")):
                    em.line(f"for (int64_t cc_ = {first}; cc_ < {last}; ++cc_) {{")
                    em.line(f"  const int64_t {cw.name} = cb_ + cc_;")
                    em.line("  #pragma omp simd")
                    em.line(
                        f"  for (int64_t {xw.name} = {x0}; {xw.name} < {n_last}; ++{xw.name}) "
                        f"{out}[{woff}] = ctile_[{xw.name} * {tile} + cc_];"
                    )
                    em.line("}")

            # each input's blocks are a barrier scope: what a block computes stays in its input's loop
            scope = em.push(barrier=True)
            em.loop(
                [f"for (int64_t cb_ = {em.args.ref(start)}; cb_ < {em.args.ref(end)}; cb_ += {tile}) {{"], [], block
            )
            em.pop()
            em.scopes[-1].lines.extend(scope.lines)

    scratch = [
        f"static thread_local std::vector<{t}> ctile_buf_;",
        f"if (ctile_buf_.size() < size_t({n_last}) * {tile}) ctile_buf_.resize(size_t({n_last}) * {tile});",
        f"{t}* BPK_RESTRICT ctile_ = ctile_buf_.data();",
    ]
    nodes = [em.ctx.nodes[v] for v in em.spec.nodes]
    cost = f"{em.args.ref(dom[axis])} * {n_last} * {kernel_cost(nodes)}"
    em.rows_loop([dom[k] for k in rows], cost, body, scratch)
