"""Fused attention on CUDA: one generated kernel per `Attention` record (Note [Fused attention]).

In: the kernel spec of an attention step (kind "attention": the second matmul is the root, every node it
computes inline listed) and the record. Out: the kernel's variants for the CUDA emitter, each a (name
suffix, shape predicate, body emitter, grid, block size, dynamic shared memory).

Note [Online softmax on CUDA]: a block computes R query rows of one leading index (batch, head) with
W warps. The warps split the keys: warp w takes the 32-key tiles w, w + W, w + 2W, ..., one key per lane,
and keeps its own running maximum m, sum l and output accumulator for each of the R rows; the block
combines the W partial results at the end (m = max m_w, l = sum l_w exp(m_w - m), acc likewise), so
no [Sq, Skv] tensor is written and the scores are read once. Per tile a lane computes its key's R
scores as dot products over the head dim (the R query rows in shared memory, read by every lane at
once; its key's row of K in 16-byte loads where the head dim is contiguous), applies the graph's chain
to each (scale, masks: `Emitter.eval` of the softmax's input with the first matmul's value bound to the
score, as the CPU kernel does), takes the tile's maximum across the warp, and writes its R
probabilities to the warp's slice of shared memory; then each lane accumulates its columns of the
output (lane, lane + 32, ...) over the tile's keys, each V row read across the lanes in one coalesced
access. Accumulation is in float32 for float32 / float16 / bfloat16 (Note [Register types]) and in
float64 for float64. Special values are the CPU kernel's (Note [Online softmax on CPU]): a row entirely
-inf gives 0 under a safe softmax and NaN under a plain one (0 with no keys at all), a NaN or +inf
score makes its row NaN.

Variants, chosen by the shape program on the query rows Sq: "_rows" (Sq < 8: decoding, a few new
tokens against a long cache) gives each block one query row and eight warps, so a cache is read by
eight independent streams per (leading index, row); "_tile" (Sq >= 8) gives each block R query rows
(8, or fewer where the head dims would not fit shared memory or registers) and four warps, so each key
and value row read serves R rows. Grouped-query K / V heads are read in place (library_ops/
attention_operands.py), and a block walks only the keys its rows can see (Note [Key bounds]: about
half of them in a causal prefill). In float16 / bfloat16 from 16 query rows, the "_mma" variant
(library_ops/cuda_attention_mma.py, Note [Tensor-core attention]) runs on tensor cores first.

Note [Split keys] (flash-decoding): a decoding step has few (leading index, query row) pairs — batch 1
of 32 heads gives 32 blocks, a quarter of an H100's SMs, each streaming a whole cache. Where the rows
number fewer than SPLIT_BLOCKS and the keys more than SPLIT_KEYS, the "_split" variant cuts the key
range into S chunks (S = min(ceil(Skv / SPLIT_KEYS), floor(SPLIT_BLOCKS / rows), SPLIT_MAX), chunks of
a whole number of 32-key tiles, from key 0 so that every query row sees the same chunks) and gives each
(row, chunk) its own block. A block runs the "_rows" walk over its chunk (intersected with the row's key
bounds: a chunk outside them walks nothing) and writes, unnormalized, its output row, maximum and sum
to a workspace row of Dv + 2 accumulator-type values ([rows * S, Dv + 2] in the arena, float32 or
float64). A second kernel ("attention_combine", launched only at the shapes where the split variant
runs: Note [Guarded launches]) combines each row's S partial results exactly as the warps' are combined
(m = max m_s, l = sum l_s exp(m_s - m), the output likewise, then divided by l, with the same special
values), so the split changes only the order of the sums. S and the chunk length are formulas of the
shape symbols, evaluated per input signature by the shape program, as the workspace's size is.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.cuda_emitter import CudaPlan, launch_grid
from bladepack.codegen.cuda_loops import CudaEmitter, split_index, volume
from bladepack.codegen.kernel import KernelContext
from bladepack.dtypes import DType
from bladepack.ir.fusion_plan import Attention
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.views import View, simplify
from bladepack.library_ops.attention_operands import (
    attention_shape,
    bound_index,
    empty_row,
    key_bounds,
    row_base,
)
from bladepack.library_ops.cuda_attention_mma import mma_plan

TILE = 32  # keys per warp step: one per lane
ROWS_MAX_SQ = 8  # the "_rows" variant below this many query rows
ROWS_WARPS = 8  # warps per block in "_rows"
TILE_WARPS = 4  # ... in "_tile"
TILE_ROWS = 8  # query rows per block in "_tile", at most
SMEM_BYTES = 40 * 1024  # static shared memory per block, at most (48 KiB without opting in)
ACC_REGS = 64  # output accumulators per lane (rows x columns per lane), at most
HEAD_MAX = 512  # head dims the CUDA kernel takes (Capabilities.attention_head_max): both variants fit
SPLIT_KEYS = ROWS_WARPS * TILE  # Note [Split keys]: a chunk is at least one step of the "_rows" block
SPLIT_BLOCKS = 256  # ... split while the rows are fewer than this (about two blocks per SM of a large GPU)
SPLIT_MAX = 64  # chunks per row, at most
COMBINE_BLOCK = 128  # threads per row of the combining kernel


def _cols(dv: int) -> int:
    return (dv + TILE - 1) // TILE  # output columns per lane


def _smem(rows: int, warps: int, d: int, dv: int, itemsize: int) -> int:
    """Shared bytes of a block: its query rows, each warp's probabilities, maxima, sums and outputs."""
    return itemsize * (rows * d + warps * rows * (TILE + 2 + dv))


def _tile_rows(d: int, dv: int, itemsize: int) -> int:
    for rows in (TILE_ROWS, 4, 2, 1):
        if _smem(rows, TILE_WARPS, d, dv, itemsize) <= SMEM_BYTES and rows * _cols(dv) <= ACC_REGS:
            return rows
    return 1


def _query_blocks(sq: IRDim, rows: int) -> sympy.Expr:
    """Blocks of `rows` query rows covering the Sq query rows."""
    return sympy.floor((sympy.sympify(sq) + rows - 1) / rows)


@dataclass(frozen=True)
class KeySplit:
    """Note [Split keys]: the chunks per query row (`count`), their length in keys (`chunk`), the shapes at
    which the "_split" variant and the combining kernel run (`when`) and the workspace's type."""

    count: sympy.Expr
    chunk: sympy.Expr
    when: Any  # sympy boolean
    workspace: TensorType


def key_split(att: Attention, ctx: KernelContext) -> KeySplit | None:
    """How a decoding step of `att` splits its keys over blocks, or None where it never does (a query
    length of 8 or more, or too few keys, at every shape in range)."""
    sh = attention_shape(att, ctx)
    if ctx.proven_le(sh.skv, sympy.sympify(sh.sq) + SPLIT_KEYS - ROWS_MAX_SQ + 1):
        return None  # fewer than 8 query rows, so at most SPLIT_KEYS keys (self-attention: Skv = Sq)
    rows = simplify(volume(sh.lead) * sh.sq)
    skv = sympy.sympify(sh.skv)
    count = sympy.Max(
        1, sympy.Min(sympy.ceiling(skv / SPLIT_KEYS), sympy.floor(sympy.Integer(SPLIT_BLOCKS) / rows), SPLIT_MAX)
    )
    when = sympy.And(sympy.Lt(sympy.sympify(sh.sq), ROWS_MAX_SQ), sympy.Gt(count, 1))
    if when is sympy.false:
        return None
    chunk = TILE * sympy.ceiling(skv / (TILE * count))
    acc = DType.FLOAT64 if CTYPE[ctx.types[att.out].dtype] == "double" else DType.FLOAT32
    return KeySplit(count, chunk, when, TensorType(acc, (simplify(rows * count), sh.dv + 2)))


def attention_plans(att: Attention, ctx: KernelContext, workspace: int | None = None) -> list[CudaPlan]:
    """Note [Online softmax on CUDA]: `_tile` (Sq >= 8), `_split` (Note [Split keys]: given the workspace
    value the lowering placed for `key_split`) and `_rows` (decoding); the first whose predicate holds
    runs."""
    sh = attention_shape(att, ctx)
    d, dv = sh.d, sh.dv
    assert max(d, dv) <= HEAD_MAX
    item = 8 if CTYPE[ctx.types[att.out].dtype] == "double" else 4
    lead = volume(sh.lead)
    plans: list[CudaPlan] = []
    rows = _tile_rows(d, dv, item)
    assert _smem(1, ROWS_WARPS, d, dv, item) <= SMEM_BYTES
    split = key_split(att, ctx) if workspace is not None else None
    mma = mma_plan(att, ctx)  # Note [Tensor-core attention]: Sq >= 16 in float16 / bfloat16
    if mma is not None:
        plans.append(mma)
        if mma[1] is sympy.true:
            return [("", sympy.true, *mma[2:])]
    variants: list[tuple[str, Any, int, int, KeySplit | None]] = [
        ("_tile", sympy.Ge(sympy.sympify(sh.sq), ROWS_MAX_SQ), rows, TILE_WARPS, None)
    ]
    if split is not None:
        variants.append(("_split", split.when, 1, ROWS_WARPS, split))
    variants.append(("_rows", sympy.true, 1, ROWS_WARPS, None))
    for name, pred, r, warps, chunks in variants:
        if pred is sympy.false:
            continue
        blocks = simplify(lead * _query_blocks(sh.sq, r) * (1 if chunks is None else chunks.count))
        body = functools.partial(_kernel, att=att, rows=r, warps=warps, split=chunks, workspace=workspace)
        plans.append((name, pred, body, launch_grid(blocks, 1), warps * 32, 0))
        if pred is sympy.true:
            break
    if len(plans) == 1:
        return [("", sympy.true, *plans[0][2:])]
    return plans


def combine_plans(att: Attention, ctx: KernelContext, workspace: int) -> list[CudaPlan]:
    """Note [Split keys]: the kernel combining each query row's chunks (one block a row)."""
    split = key_split(att, ctx)
    assert split is not None, "a combining kernel for an attention that never splits its keys"
    sh = attention_shape(att, ctx)
    body = functools.partial(_combine_kernel, att=att, split=split, workspace=workspace)
    return [("", sympy.true, body, launch_grid(simplify(volume(sh.lead) * sh.sq), 1), COMBINE_BLOCK, 0)]


def _kernel(
    em: CudaEmitter, att: Attention, rows: int, warps: int, split: KeySplit | None, workspace: int | None
) -> None:
    ctx = em.ctx
    out_t = ctx.types[att.out]
    dt = out_t.dtype
    t = CTYPE[dt]
    r = em.args.ref
    sh = attention_shape(att, ctx)
    lead, sq, skv, d, dv = sh.lead, sh.sq, sh.skv, sh.d, sh.dv
    cols = _cols(dv)
    pq, pk, pv = (em.ptr_load(x.base) for x in (sh.q, sh.k, sh.v))
    ninf = f"-std::numeric_limits<{t}>::infinity()"
    blocks = _query_blocks(sq, rows)
    syms = tuple(Loop(f"i{k}") for k in range(len(lead)))
    blk, chunk_of = Loop("b_"), Loop("c_")
    em.uses_barriers = True
    q_rows = range(rows)
    bounds = key_bounds(att, ctx)

    def base(view: View, shape: Sequence[IRDim]) -> str:
        return em.args.index(row_base(view, shape, lead, syms))

    em.line("const int lane_ = int(threadIdx.x & 31u), warp_ = int(threadIdx.x >> 5);")
    em.line(f"__align__(16) __shared__ {t} bpk_q[{rows * d}];  // the block's query rows")
    em.line(f"__align__(16) __shared__ {t} bpk_p[{warps * rows * TILE}];  // each warp's probabilities of its tile")
    em.line(f"__shared__ {t} bpk_m[{warps * rows}], bpk_l[{warps * rows}];  // each warp's maxima and sums")
    em.line(f"__align__(16) __shared__ {t} bpk_o[{warps * rows * dv}];  // each warp's output rows")

    def body() -> None:
        em.line(f"const int64_t q0_ = b_ * {rows};")
        em.line(f"const auto* __restrict__ qp_ = {pq} + {base(sh.q, ctx.types[att.q].shape)};")
        em.line(f"const auto* __restrict__ kp_ = {pk} + {base(sh.k, ctx.types[att.k].shape)};")
        em.line(f"const auto* __restrict__ vp_ = {pv} + {base(sh.v, ctx.types[att.v].shape)};")
        store = em.args.index(sh.out_base(syms))  # Note [Attention stores]
        em.line(f"auto* __restrict__ op_ = {em.ptr_store(att.stored)} + {store};")
        em.line("__syncthreads();  // the previous row's readers of the shared arrays are done")
        em.line(f"for (int e = int(threadIdx.x); e < {rows * d}; e += int(blockDim.x)) {{")
        em.line(f"  const int64_t qi_ = q0_ + e / {d} < {r(sq)} ? q0_ + e / {d} : {r(sq)} - 1;")
        em.line(f"  bpk_q[e] = bpk::ld(qp_ + qi_ * {r(sh.s_qi)} + (e % {d}) * {r(sh.s_qd)});")
        em.line("}")
        em.line("__syncthreads();")
        qc = [Loop(f"qc{q}_") for q in q_rows]
        for q in q_rows:  # rows past the last are evaluated at the last row and never stored
            em.declare(f"const int64_t qc{q}_ = q0_ + {q} < {r(sq)} ? q0_ + {q} : {r(sq)} - 1;", f"qc{q}_")
        em.scopes[-1].syms.update(qc)
        for q in q_rows:
            em.line(f"{t} m{q}_ = {ninf}, l{q}_ = {t}(0), o{q}_[{cols}];")
            em.line("#pragma unroll")
            em.line(f"for (int c = 0; c < {cols}; ++c) o{q}_[c] = {t}(0);")
        start, end = f"int64_t(warp_) * {TILE}", r(skv)
        if bounds is not None:  # Note [Key bounds]: the keys the block's rows can see
            em.line(f"int64_t klo_ = {r(skv) if bounds.lo else 0}, khi_ = {0 if bounds.hi else r(skv)};")
            for q in q_rows:
                for bound, less, name in ((bounds.lo, True, "klo_"), (bounds.hi, False, "khi_")):
                    if bound is not None:
                        x = f"({em.eval(bound.value, bound_index(ctx, bound, (*syms, qc[q])))} + {bound.add})"
                        em.line(f"{name} = {x} {'<' if less else '>'} {name} ? int64_t{x} : {name};")
            em.line(f"klo_ = klo_ > 0 ? klo_ : 0; khi_ = khi_ < {r(skv)} ? khi_ : {r(skv)};")
            start, end = f"klo_ + {start}", "khi_"
        if split is not None:  # Note [Split keys]: this block's chunk of them
            if bounds is None:
                em.line(f"int64_t klo_ = 0, khi_ = {r(skv)};")
            em.line(f"const int64_t k0_ = c_ * {r(split.chunk)}, k1_ = k0_ + {r(split.chunk)};")
            em.line("klo_ = klo_ > k0_ ? klo_ : k0_; khi_ = khi_ < k1_ ? khi_ : k1_;")
            start, end = f"klo_ + int64_t(warp_) * {TILE}", "khi_"
        header = [f"for (int64_t k0 = {start}; k0 < {end}; k0 += {warps * TILE}) {{"]
        prologue = ["const int64_t j_ = k0 + lane_;", f"const int64_t jc_ = j_ < {end} ? j_ : {end} - 1;"]
        em.loop(header, [Loop("jc_")], functools.partial(key_tile, qc, end), prologue=prologue)
        combine()
        if split is not None:
            partial()
            return
        normalize()

    def scores() -> None:
        """This lane's key's R scores: dot products of the shared query rows with its row of K."""
        em.line(f"const auto* __restrict__ kr_ = kp_ + jc_ * {r(sh.s_kj)};")
        for q in q_rows:
            em.declare(f"{t} s{q}_ = {t}(0);", f"s{q}_")
        width = 16 // dt.itemsize
        if sh.s_kd == 1 and d % width == 0 and width > 1:  # 16-byte loads of the key row
            em.line(f"#pragma unroll {min(d // width, 4)}")
            em.line(f"for (int d = 0; d < {d}; d += {width}) {{")
            em.line(f"  {t} kw_[{width}];")
            em.line(f"  bpk::ldv<{width}>(kw_, kr_ + d);")
            em.line("  #pragma unroll")
            em.line(f"  for (int u = 0; u < {width}; ++u) {{")
            for q in q_rows:
                em.line(f"    s{q}_ += bpk_q[{q * d} + d + u] * kw_[u];")
            em.line("  }")
            em.line("}")
            return
        em.line(f"#pragma unroll {min(d, 8)}")
        em.line(f"for (int d = 0; d < {d}; ++d) {{")
        em.line(f"  const {t} kd_ = bpk::ld(kr_ + d * {r(sh.s_kd)});")
        for q in q_rows:
            em.line(f"  s{q}_ += bpk_q[{q * d} + d] * kd_;")
        em.line("}")

    def key_tile(qc: list[Loop], end: str) -> None:
        """One tile of 32 keys from k0 (keys from `end` on score -inf; each lane one key)."""
        scores()
        jc = Loop("jc_")
        for q in q_rows:  # the graph's chain on each score; keys past the last score -inf
            at = (*syms, qc[q], jc)
            em.bind(att.scores, at, f"s{q}_")
            x = em.eval(sh.chain_end, at)
            em.line(f"s{q}_ = j_ < {end} ? {t}({x}) : {ninf};")
        em.line(f"const int nk_ = int({end} - k0 < {TILE} ? {end} - k0 : {TILE});")
        for q in q_rows:
            # the running maximum takes the tile's; what the earlier tiles summed is rescaled by
            # exp(m_old - m_new) (1 when it did not grow: also for two -inf maxima)
            em.line(f"const {t} mn{q}_ = bpk::Max()(m{q}_, bpk::warp_all(s{q}_, bpk::Max()));")
            em.line(f"const {t} al{q}_ = mn{q}_ == m{q}_ ? {t}(1) : bpk::vexp(m{q}_ - mn{q}_);")
            # Note [Softmax exponentials]: 0 for the maximum of a row all -inf so far, so each -inf
            # score is exp(-inf) = 0, not exp(-inf + inf)
            em.line(f"const {t} p{q}_ = bpk::vexp(s{q}_ - (mn{q}_ == {ninf} ? {t}(0) : mn{q}_));")
            em.line(f"l{q}_ = l{q}_ * al{q}_ + p{q}_;")
            em.line(f"m{q}_ = mn{q}_;")
            em.line("#pragma unroll")
            em.line(f"for (int c = 0; c < {cols}; ++c) o{q}_[c] *= al{q}_;")
            em.line(f"bpk_p[(warp_ * {rows} + {q}) * {TILE} + lane_] = p{q}_;")
        em.line("__syncwarp();")
        em.line("for (int jj = 0; jj < nk_; ++jj) {")
        em.line(f"  const auto* __restrict__ vr_ = vp_ + (k0 + jj) * {r(sh.s_vj)};")
        em.line(f"  {t} v_[{cols}];")
        em.line("  #pragma unroll")
        em.line(f"  for (int c = 0; c < {cols}; ++c) {{")
        em.line("    const int e = lane_ + c * 32;")
        em.line(f"    v_[c] = e < {dv} ? {t}(bpk::ld(vr_ + e * {r(sh.s_ve)})) : {t}(0);")
        em.line("  }")
        for q in q_rows:
            em.line(f"  const {t} pj{q}_ = bpk_p[(warp_ * {rows} + {q}) * {TILE} + jj];")
            em.line("  #pragma unroll")
            em.line(f"  for (int c = 0; c < {cols}; ++c) o{q}_[c] += pj{q}_ * v_[c];")
        em.line("}")
        em.line("__syncwarp();  // every lane has read the tile's probabilities")

    def combine() -> None:
        """The warps' partial rows into shared memory: maxima, sums and outputs."""
        for q in q_rows:
            em.line(f"const {t} ls{q}_ = bpk::warp_all(l{q}_, bpk::Sum());")
            em.line(f"if (lane_ == 0) {{ bpk_m[warp_ * {rows} + {q}] = m{q}_; bpk_l[warp_ * {rows} + {q}] = ls{q}_; }}")
            em.line("#pragma unroll")
            em.line(f"for (int c = 0; c < {cols}; ++c) {{")
            em.line("  const int e = lane_ + c * 32;")
            em.line(f"  if (e < {dv}) bpk_o[(warp_ * {rows} + {q}) * {dv} + e] = o{q}_[c];")
            em.line("}")
        em.line("__syncthreads();")

    def normalize() -> None:
        """The block's rows: the warps' results combined, divided by the sums."""
        em.line(f"for (int e = int(threadIdx.x); e < {rows * dv}; e += int(blockDim.x)) {{")
        em.line(f"  const int q = e / {dv}, c = e % {dv};")
        em.line(f"  if (q0_ + q >= {r(sq)}) continue;")
        at = f"w * {rows} + q"
        for line in _merge(
            t, f"for (int w = 0; w < {warps}; ++w)", f"bpk_m[{at}]", f"bpk_l[{at}]", f"bpk_o[({at}) * {dv} + c]"
        ):
            em.line(f"  {line}")
        em.line(
            f"  bpk::st(op_ + (q0_ + q) * {r(sh.s_oi)} + c, o_ * (l_ == {t}(0) ? {empty_row(sh.safe, r(skv), t)} : {t}(1) / l_));"
        )
        em.line("}")

    def partial() -> None:
        """Note [Split keys]: the block's chunk of its row, unnormalized, to its workspace row."""
        assert rows == 1 and workspace is not None
        em.line(f"{t}* __restrict__ wp_ = {em.ptr_store(workspace)} + row_ * {dv + 2};")
        em.line(f"for (int c = int(threadIdx.x); c < {dv}; c += int(blockDim.x)) {{")
        for line in _merge(t, f"for (int w = 0; w < {warps}; ++w)", "bpk_m[w]", "bpk_l[w]", f"bpk_o[w * {dv} + c]"):
            em.line(f"  {line}")
        em.line("  wp_[c] = o_;")
        em.line(f"  if (c == 0) {{ wp_[{dv}] = mx_; wp_[{dv + 1}] = l_; }}")
        em.line("}")

    loops, extents = (*syms, blk), (*lead, blocks)
    if split is not None:
        loops, extents = (*loops, chunk_of), (*extents, split.count)
    rows_ref = r(simplify(volume(extents)))
    header = [f"for (int64_t row_ = blockIdx.x; row_ < {rows_ref}; row_ += gridDim.x) {{"]
    em.loop(header, loops, body, prologue=split_index("row_", loops, extents, em.args))


def _merge(t: str, loop: str, m: str, s: str, o: str) -> list[str]:
    """C merging partial softmax results (Note [Online softmax on CUDA]: a block's warps, a row's key
    chunks): `loop` is the for-header over the parts, `m`, `s` and `o` C expressions of a part's maximum,
    sum and output element; they leave the maximum in mx_, and the sum and the element rescaled to it in
    l_ and o_ (a part whose maximum is -inf adds 0, also when every part's is)."""
    ninf = f"-std::numeric_limits<{t}>::infinity()"
    return [
        f"{t} mx_ = {ninf};",
        f"{loop} mx_ = bpk::Max()(mx_, {m});",
        f"const {t} mz_ = mx_ == {ninf} ? {t}(0) : mx_;",
        f"{t} l_ = {t}(0), o_ = {t}(0);",
        f"{loop} {{",
        f"  const {t} f_ = bpk::vexp({m} - mz_);",
        f"  l_ += {s} * f_;",
        f"  o_ += {o} * f_;",
        "}",
    ]


def _combine_kernel(em: CudaEmitter, att: Attention, split: KeySplit, workspace: int) -> None:
    """Note [Split keys]: each query row's chunks combined and normalized (one block a row, a column a
    thread), as `_kernel` combines its warps."""
    ctx = em.ctx
    out_t = ctx.types[att.out]
    t = CTYPE[out_t.dtype]
    r = em.args.ref
    sh = attention_shape(att, ctx)
    dv, width = sh.dv, sh.dv + 2
    syms = tuple(Loop(f"i{k}") for k in range(len(sh.lead)))
    qrow = Loop("q_")
    pw = em.ptr_load(workspace)

    def body() -> None:
        store = em.args.index(sh.out_base(syms) + qrow * sympy.sympify(sh.s_oi))  # Note [Attention stores]
        em.line(f"auto* __restrict__ op_ = {em.ptr_store(att.stored)} + {store};")
        em.line(f"const int64_t ns_ = {r(split.count)};")
        em.line(f"const auto* __restrict__ wp_ = {pw} + row_ * ns_ * {width};")
        em.line(f"for (int c = int(threadIdx.x); c < {dv}; c += int(blockDim.x)) {{")
        part = [f"{t}(wp_[s * {width} + {e}])" for e in (dv, dv + 1, "c")]
        for line in _merge(t, "for (int64_t s = 0; s < ns_; ++s)", *part):
            em.line(f"  {line}")
        em.line(f"  bpk::st(op_ + c, o_ * (l_ == {t}(0) ? {empty_row(sh.safe, r(sh.skv), t)} : {t}(1) / l_));")
        em.line("}")

    rows = simplify(volume(sh.lead) * sh.sq)
    header = [f"for (int64_t row_ = blockIdx.x; row_ < {r(rows)}; row_ += gridDim.x) {{"]
    em.loop(header, (*syms, qrow), body, prologue=split_index("row_", (*syms, qrow), (*sh.lead, sh.sq), em.args))
