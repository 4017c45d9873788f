"""Fused attention on CUDA tensor cores: the "_mma" variant of a prefill's attention kernel.

In: an `Attention` record whose operands are float16 or bfloat16 and whose head dims suit the tiles.
Out: the variant for library_ops/cuda_attention.py's plan list (Sq >= 16), or None.

Note [Tensor-core attention]: flash-attention-2's schedule on mma.sync.m16n8k16 (Note [Tensor-core
fragments] in codegen/cuda_runtime.cuh): 16-bit operands, float accumulators. A block of four warps
takes 64 query rows of one leading index (batch, head), 16 a warp, whose A fragments stay in registers
for the whole walk, and walks the keys its rows can see (Note [Key bounds]) 64 at a time; a warp whose
own rows see none of a tile's keys stages its share and skips the rest (Note [Group key bounds] in
library_ops/cpu_attention.py: packed sequences, a causal diagonal). Per tile the
block stages K (row-major, rows padded by 8 values so that a warp's fragment loads hit 32 different
banks) and V (transposed, so that a B fragment is one 32-bit load) in shared memory as 16-bit values;
each warp computes its 16 x 64 scores (8 x d / 16 products), applies the graph's chain to each score
in its registers (scale, masks; keys past the end -inf), updates each row's running maximum and sum —
a row's values are spread over the four lanes g * 4 .. g * 4 + 3, which combine by two shuffles —
rescales its output accumulators and multiplies the probabilities with V into 16 x Dv float
accumulators. The score accumulators' layout is the A operand's, so the probabilities become A
fragments in place, rounded to the input dtype as flash-attention rounds them (the sums take them
unrounded). At the end a row's four lanes add their sums and each lane stores its own elements.
Special values are Note [Online softmax on CUDA]'s. Taken for Sq >= 16 with head dims that are
multiples of 16 (scores) and 8 (values) up to 128: a lane then holds 4 d / 16 + 4 Dv / 8 + 32 floats.
Shared memory: 64 (d + 8) + 72 Dv 16-bit values (36 KiB at 128 / 128).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import sympy

from bladepack.codegen.c_render import Loop
from bladepack.codegen.cuda_emitter import CudaPlan, launch_grid
from bladepack.codegen.cuda_loops import CudaEmitter, split_index, volume
from bladepack.codegen.kernel import KernelContext
from bladepack.dtypes import DType
from bladepack.ir.fusion_plan import Attention
from bladepack.ir.types import IRDim
from bladepack.ir.views import View, simplify
from bladepack.library_ops.attention_operands import (
    attention_shape,
    bound_index,
    empty_row,
    key_bounds,
    row_base,
)

ROWS = 64  # query rows per block
WARPS = 4  # 16 rows each
KEYS = 64  # keys per tile
MIN_SQ = 16  # query rows from which the variant runs
HEAD_MAX = 128
K_PAD = 8  # 16-bit values after each staged K row
V_STRIDE = KEYS + 8  # ... per transposed V row
HALF = {DType.FLOAT16: "__half", DType.BFLOAT16: "__nv_bfloat16"}
NINF = "-std::numeric_limits<float>::infinity()"


def mma_plan(att: Attention, ctx: KernelContext) -> CudaPlan | None:
    """Note [Tensor-core attention]: the "_mma" variant, or None where its dtype or head dims do not fit."""
    sh = attention_shape(att, ctx)
    dt = ctx.types[att.out].dtype
    if dt not in HALF or any(ctx.types[v].dtype is not dt for v in (att.q, att.k, att.v)):
        return None
    if sh.d % 16 or sh.dv % 8 or max(sh.d, sh.dv) > HEAD_MAX:
        return None
    pred = sympy.Ge(sympy.sympify(sh.sq), MIN_SQ)
    if pred is sympy.false:
        return None
    blocks = simplify(volume(sh.lead) * _blocks(sh.sq))
    return ("_mma", pred, functools.partial(_kernel, att=att), launch_grid(blocks, 1), WARPS * 32, 0)


def _blocks(sq: object) -> sympy.Expr:
    return sympy.floor((sympy.sympify(sq) + ROWS - 1) / ROWS)


def _kernel(em: CudaEmitter, att: Attention) -> None:
    ctx = em.ctx
    out_t = ctx.types[att.out]
    h = HALF[out_t.dtype]
    r = em.args.ref
    sh = attention_shape(att, ctx)
    lead, sq, skv, d, dv = sh.lead, sh.sq, sh.skv, sh.d, sh.dv
    kst = d + K_PAD
    pq, pk, pv = (em.ptr_load(x.base) for x in (sh.q, sh.k, sh.v))
    syms = tuple(Loop(f"i{k}") for k in range(len(lead)))
    blk = Loop("b_")
    em.uses_barriers = True
    bounds = key_bounds(att, ctx)

    def base(view: View, shape: Sequence[IRDim]) -> str:
        return em.args.index(row_base(view, shape, lead, syms))

    em.line("const int lane_ = int(threadIdx.x & 31u), warp_ = int(threadIdx.x >> 5), g_ = lane_ >> 2, t_ = lane_ & 3;")
    em.line(f"__align__(16) __shared__ uint16_t bpk_k[{max(KEYS, ROWS) * kst}];  // K's tile (first the query rows)")
    em.line(f"__align__(16) __shared__ uint16_t bpk_v[{dv * V_STRIDE}];  // V's tile, transposed")

    def stage(src: str, rows: int, cols: int, row: str, valid: str | None, s_row: str, s_col: object, dst: str) -> None:
        """Rows `row` (a C expression of i) of `src`, `cols` values each, into shared memory as 16-bit
        values (0 where `valid` is false); `dst(i, c)` is a C index."""
        vec = 8 if s_col == 1 and cols % 8 == 0 else 1
        em.line(f"for (int e = int(threadIdx.x); e < {rows * cols // vec}; e += {WARPS * 32}) {{")
        em.line(f"  const int i = e / {cols // vec}, c = e % {cols // vec} * {vec};")
        em.line(f"  const int64_t j = {row};")
        em.line(f"  float w_[{vec}];")
        load = (
            f"bpk::ldv<{vec}>(w_, {src} + j * {s_row} + c)"
            if vec > 1
            else f"w_[0] = bpk::ld({src} + j * {s_row} + c * {r(s_col)})"
        )
        if valid is None:
            em.line(f"  {load};")
        else:
            em.line(f"  if ({valid}) {load};")
            em.line(f"  else for (int u = 0; u < {vec}; ++u) w_[u] = 0.f;")
        em.line("  #pragma unroll")
        em.line(f"  for (int u = 0; u < {vec}; ++u) bpk_{dst} = bpk::bits16<{h}>(w_[u]);")
        em.line("}")

    def body() -> None:
        em.line(f"const int64_t q0_ = b_ * {ROWS};")
        em.line(f"const auto* __restrict__ qp_ = {pq} + {base(sh.q, ctx.types[att.q].shape)};")
        em.line(f"const auto* __restrict__ kp_ = {pk} + {base(sh.k, ctx.types[att.k].shape)};")
        em.line(f"const auto* __restrict__ vp_ = {pv} + {base(sh.v, ctx.types[att.v].shape)};")
        store = em.args.index(sh.out_base(syms))  # Note [Attention stores]
        em.line(f"auto* __restrict__ op_ = {em.ptr_store(att.stored)} + {store};")
        em.line("__syncthreads();  // the previous rows' readers of the shared tiles are done")
        last = f"{r(sq)} - 1"
        stage(
            "qp_", ROWS, d, f"q0_ + i < {r(sq)} ? q0_ + i : {last}", None, r(sh.s_qi), sh.s_qd, f"k[i * {kst} + c + u]"
        )
        em.line("__syncthreads();")
        em.line(f"uint32_t qf_[{d // 16}][4];  // the warp's 16 query rows as A fragments")
        em.line("#pragma unroll")
        em.line(f"for (int kk = 0; kk < {d // 16}; ++kk) {{")
        em.line("  #pragma unroll")
        em.line("  for (int x = 0; x < 4; ++x) {")
        em.line(f"    const int at = (warp_ * 16 + g_ + (x & 1) * 8) * {kst} + kk * 16 + (x >> 1) * 8 + 2 * t_;")
        em.line("    qf_[kk][x] = *reinterpret_cast<const uint32_t*>(bpk_k + at);")
        em.line("  }")
        em.line("}")
        em.line(f"float m_[2] = {{{NINF}, {NINF}}}, l_[2] = {{0.f, 0.f}}, o_[{dv // 8}][4];")
        em.line("#pragma unroll")
        em.line(f"for (int n = 0; n < {dv // 8}; ++n) o_[n][0] = o_[n][1] = o_[n][2] = o_[n][3] = 0.f;")
        start, end = "int64_t(0)", r(skv)
        if bounds is not None:  # Note [Key bounds]: the keys the block's rows can see
            em.line(f"int64_t klo_ = {r(skv) if bounds.lo else 0}, khi_ = {0 if bounds.hi else r(skv)};")
            qb = Loop("qb_")

            def rows_bounds(lo: str, hi: str) -> None:
                for bound, less, name in ((bounds.lo, True, lo), (bounds.hi, False, hi)):
                    if bound is not None:
                        x = f"({em.eval(bound.value, bound_index(ctx, bound, (*syms, qb)))} + {bound.add})"
                        em.line(f"{name} = {x} {'<' if less else '>'} {name} ? int64_t{x} : {name};")

            header = [f"for (int64_t qb_ = q0_; qb_ < q0_ + {ROWS} && qb_ < {r(sq)}; ++qb_) {{"]
            em.loop(header, [qb], functools.partial(rows_bounds, "klo_", "khi_"))
            em.line(f"klo_ = klo_ > 0 ? klo_ : 0; khi_ = khi_ < {r(skv)} ? khi_ : {r(skv)};")
            # Note [Group key bounds] (library_ops/cpu_attention.py): the warp's own 16 rows' keys
            em.line(f"int64_t wlo_ = {r(skv) if bounds.lo else 0}, whi_ = {0 if bounds.hi else r(skv)};")
            first = f"q0_ + warp_ * 16 < {r(sq)} ? q0_ + warp_ * 16 : {r(sq)} - 1"
            header = [f"for (int64_t qb_ = {first}; qb_ < q0_ + warp_ * 16 + 16 && qb_ < {r(sq)}; ++qb_) {{"]
            em.loop(header, [qb], functools.partial(rows_bounds, "wlo_", "whi_"))
            start, end = "klo_", "khi_"
        header = [f"for (int64_t k0 = {start}; k0 < {end}; k0 += {KEYS}) {{"]
        em.loop(header, [], functools.partial(tile, end, bounds is not None))
        finish()

    def tile(end: str, bounded: bool) -> None:
        """One tile of 64 keys from k0: staged, scored, the softmax's running state, the products."""
        em.line("__syncthreads();  // every warp is done with the last tile")
        stage("kp_", KEYS, d, "k0 + i", f"j < {end}", r(sh.s_kj), sh.s_kd, f"k[i * {kst} + c + u]")
        stage("vp_", KEYS, dv, "k0 + i", f"j < {end}", r(sh.s_vj), sh.s_ve, f"v[(c + u) * {V_STRIDE} + i]")
        em.line("__syncthreads();")
        if bounded:  # every warp staged its share; one whose rows see none of these keys computes nothing
            em.line(f"if (whi_ <= k0 || wlo_ >= k0 + {KEYS}) continue;")
        em.line(f"float s_[{KEYS // 8}][4];  // the warp's 16 x 64 scores")
        em.line("#pragma unroll")
        em.line(f"for (int nt = 0; nt < {KEYS // 8}; ++nt) {{")
        em.line("  s_[nt][0] = s_[nt][1] = s_[nt][2] = s_[nt][3] = 0.f;")
        em.line("  #pragma unroll")
        em.line(f"  for (int kk = 0; kk < {d // 16}; ++kk) {{")
        em.line(f"    const uint16_t* kr_ = bpk_k + (nt * 8 + g_) * {kst} + kk * 16 + 2 * t_;")
        em.line("    const uint32_t kb_[2] = {*reinterpret_cast<const uint32_t*>(kr_),")
        em.line("                             *reinterpret_cast<const uint32_t*>(kr_ + 8)};")
        em.line(f"    bpk::mma16816<{h}>(s_[nt], qf_[kk], kb_);")
        em.line("  }")
        em.line("}")
        # the graph's chain on each score (its row and key in the fragment layout); keys past the end -inf
        qr, kc = Loop("qr_"), Loop("kc_")

        def chain() -> None:
            em.line("const float sv_ = s_[e_ >> 2][e_ & 3];")
            at = (*syms, qr, kc)
            em.bind(att.scores, at, "sv_")
            x = em.eval(sh.chain_end, at)
            em.line(f"s_[e_ >> 2][e_ & 3] = kj_ < {end} ? float({x}) : {NINF};")

        prologue = [
            f"const int64_t qr_ = q0_ + warp_ * 16 + g_ + (e_ & 2) * 4 < {r(sq)} ? "
            f"q0_ + warp_ * 16 + g_ + (e_ & 2) * 4 : {r(sq)} - 1;",
            "const int64_t kj_ = k0 + (e_ >> 2) * 8 + 2 * t_ + (e_ & 1);",
            f"const int64_t kc_ = kj_ < {end} ? kj_ : {end} - 1;",
        ]
        em.loop(["#pragma unroll", f"for (int e_ = 0; e_ < {KEYS // 2}; ++e_) {{"], [qr, kc], chain, prologue=prologue)
        for row in (0, 1):  # rows g and g + 8: elements 2 row and 2 row + 1 of each fragment
            a, b = 2 * row, 2 * row + 1
            em.line(f"float mx{row}_ = {NINF};")
            em.line("#pragma unroll")
            em.line(
                f"for (int nt = 0; nt < {KEYS // 8}; ++nt) mx{row}_ = bpk::Max()(mx{row}_, bpk::Max()(s_[nt][{a}], s_[nt][{b}]));"
            )
            em.line(f"mx{row}_ = bpk::Max()(mx{row}_, __shfl_xor_sync(0xffffffffu, mx{row}_, 1));")
            em.line(f"mx{row}_ = bpk::Max()(mx{row}_, __shfl_xor_sync(0xffffffffu, mx{row}_, 2));")
            em.line(f"const float mn{row}_ = bpk::Max()(m_[{row}], mx{row}_);")
            # Note [Softmax exponentials]: a row all -inf so far keeps its sums (exp(-inf - 0) = 0)
            em.line(f"const float al{row}_ = mn{row}_ == m_[{row}] ? 1.f : bpk::vexp(m_[{row}] - mn{row}_);")
            em.line(f"const float mz{row}_ = mn{row}_ == {NINF} ? 0.f : mn{row}_;")
            em.line(f"float ps{row}_ = 0.f;")
            em.line("#pragma unroll")
            em.line(f"for (int nt = 0; nt < {KEYS // 8}; ++nt) {{")
            em.line(f"  s_[nt][{a}] = bpk::vexp(s_[nt][{a}] - mz{row}_);")
            em.line(f"  s_[nt][{b}] = bpk::vexp(s_[nt][{b}] - mz{row}_);")
            em.line(f"  ps{row}_ += s_[nt][{a}] + s_[nt][{b}];")
            em.line("}")
            em.line(f"l_[{row}] = l_[{row}] * al{row}_ + ps{row}_;")
            em.line(f"m_[{row}] = mn{row}_;")
            em.line("#pragma unroll")
            em.line(f"for (int n = 0; n < {dv // 8}; ++n) {{ o_[n][{a}] *= al{row}_; o_[n][{b}] *= al{row}_; }}")
        em.line("#pragma unroll")
        em.line(f"for (int j = 0; j < {KEYS // 16}; ++j) {{  // the probabilities of 16 keys as an A fragment")
        em.line("  const uint32_t pa_[4] = {")
        em.line(f"      bpk::pack2<{h}>(s_[2 * j][0], s_[2 * j][1]), bpk::pack2<{h}>(s_[2 * j][2], s_[2 * j][3]),")
        em.line(
            f"      bpk::pack2<{h}>(s_[2 * j + 1][0], s_[2 * j + 1][1]), bpk::pack2<{h}>(s_[2 * j + 1][2], s_[2 * j + 1][3])}};"
        )
        em.line("  #pragma unroll")
        em.line(f"  for (int n = 0; n < {dv // 8}; ++n) {{")
        em.line(f"    const uint16_t* vr_ = bpk_v + (n * 8 + g_) * {V_STRIDE} + j * 16 + 2 * t_;")
        em.line("    const uint32_t vb_[2] = {*reinterpret_cast<const uint32_t*>(vr_),")
        em.line("                             *reinterpret_cast<const uint32_t*>(vr_ + 8)};")
        em.line(f"    bpk::mma16816<{h}>(o_[n], pa_, vb_);")
        em.line("  }")
        em.line("}")

    def finish() -> None:
        """Each row's sum over its four lanes; the lane's elements of the row, divided by it."""
        so = r(sh.s_oi)  # Note [Attention stores]
        for row in (0, 1):
            em.line(f"float ls{row}_ = l_[{row}];")
            em.line(f"ls{row}_ += __shfl_xor_sync(0xffffffffu, ls{row}_, 1);")
            em.line(f"ls{row}_ += __shfl_xor_sync(0xffffffffu, ls{row}_, 2);")
            em.line(f"const int64_t row{row}_ = q0_ + warp_ * 16 + g_ + {8 * row};")
            em.line(f"if (row{row}_ < {r(sq)}) {{")
            em.line(f"  const float f_ = ls{row}_ == 0.f ? {empty_row(sh.safe, r(skv), 'float')} : 1.f / ls{row}_;")
            em.line("  #pragma unroll")
            em.line(f"  for (int n = 0; n < {dv // 8}; ++n) {{")
            em.line(f"    bpk::st(op_ + row{row}_ * {so} + n * 8 + 2 * t_, o_[n][{2 * row}] * f_);")
            em.line(f"    bpk::st(op_ + row{row}_ * {so} + n * 8 + 2 * t_ + 1, o_[n][{2 * row + 1}] * f_);")
            em.line("  }")
            em.line("}")

    blocks = _blocks(sq)
    rows_ref = r(simplify(volume(lead) * blocks))
    header = [f"for (int64_t row_ = blockIdx.x; row_ < {rows_ref}; row_ += gridDim.x) {{"]
    em.loop(header, (*syms, blk), body, prologue=split_index("row_", (*syms, blk), (*lead, blocks), em.args))
