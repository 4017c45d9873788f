"""Fused attention on CPU: one generated kernel per `Attention` record (Note [Fused attention]).

In: the kernel spec of an attention step (kind "attention": the second matmul is the root, every node
it computes inline listed) and the record. Out: the kernel's variants for `codegen.emit_kernel`, each a
(name suffix, shape predicate, body emitter).

Note [Online softmax on CPU]: one parallel row per (leading index, block of query rows). The row walks
the keys in blocks of KB; per query row and key block it computes the KB scores into registers-sized
scratch, applies the graph's chain to each (scale, masks: `Emitter.eval` of the softmax's input with
the first matmul's value bound to the score), and folds the block into a running maximum m, sum l and
output accumulator acc[Dv] (acc and l rescaled by exp(m_old - m_new) when the maximum grows). So no
[Sq, Skv] tensor is written, and the scores are read once. Accumulation is in the kernel's type
(float32 or float64), as torch's softmax and matmul accumulate. Rows that stay entirely -inf end with
l = 0: a safe softmax (sdpa) gives 0 there, a plain one NaN — what torch gives (with no keys at all,
Skv = 0, both give 0: an empty matmul); a NaN score makes its row NaN; a +inf score makes it NaN
(exp(inf - inf)), as in torch.

Variants (chosen by the shape program on the query rows Sq): "_wide" for Sq >= 64 and "_blocked" for
Sq >= 4 pack each key block transposed ([D][KB]) once for 64 / 16 query rows and take the rows eight /
four at a time (each packed key vector feeds that many FMAs, each V row that many accumulators, the
chain's loads shared by the group; eight only where an output row fits two vectors); "_rows" for
fewer query rows (decoding: a few new tokens against the whole KV cache) takes each score as a dot
product over the head dim straight from K, with no packing to amortize. The last, partial key block runs over whole vectors (lanes past the last key score -inf).
Head dims are compile-time constants; the key block KB is 64 (32 / 16 for head dims past 128 / 256).

The key range a block walks: Note [Key bounds] (library_ops/attention_operands.py).

Note [Group key bounds]: a block's key range is the union of its rows' (Note [Key bounds]), but each
register group of rows (four or eight; one row in `_rows`) skips a key block outside its own rows'
union. Every score of such a block is -inf for those rows, so the fold would leave their maximum, sum
and accumulators as they are: skipping is exact. It matters where a block's rows attend to different
keys: packed sequences (Note [Packed sequences]), where a block of 64 rows spans several sequences of a
few dozen tokens and each row would otherwise score every key of all of them (the packed encoder's
attention took 1.2x the time of the same sequences run one by one).

Note [Masked key blocks]: a padded batch's keys past each sequence's length are masked by a value read
per key, the same at every query row (`masked_fill(mask[:, None, None, :] == 0, lowest)`, or a where
keeping `mask > 0`, alone or and'd with a causal mask: `key_mask` in attention_operands.py finds such
terms). Before a key block, the kernel reads the terms at its keys and skips the block when every key is
masked: no packing, scores or exponentials for it. A masked key's probability is exp(fill - m), m the
row's final maximum; with a fill of -inf that is 0 always, so skipping is exact. With a finite fill
(a dtype's lowest, -1e4) it is 0 wherever some unmasked key scores high enough above the fill for the
exponential to underflow, which holds unless a row's unmasked scores are all -inf or near the fill:
then (`full_`) the block of rows runs again over every key, as without the skip. A skipped key's value
row is not read: a NaN in V at a key masked with the rest of its block does not reach the output
(eager multiplies it by 0: NaN), as in kernels that drop padding. A padded batch costs its valid keys:
`python -m bench.causal_prefill --form padded` (lengths spread evenly up to the longest), 1.29-1.65x
the kernel without the skip at x86-64-v4, 1.31-1.70x at x86-64-v3; 1.0x at no padding. The encoder
sample at 2 x 512 tokens: 1.76x. Additive masks (`scores + (1 - mask) * lowest`, transformers' eager
BERT) are not read: whether a masked key's exponential underflows depends on its score there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import KernelContext
from bladepack.ir.fusion_plan import Attention
from bladepack.ir.types import IRDim
from bladepack.ir.views import View, simplify
from bladepack.library_ops.attention_operands import (
    attention_shape,
    bound_index,
    key_bounds,
    key_mask,
    mask_index,
    row_base,
)

BLOCK_ROWS = 16  # query rows per parallel row in the blocked variant
WIDE_ROWS = 64  # ... in the wide variant, from this many query rows
ROWS_MIN = 4  # the blocked variant from this many query rows
WIDE_GROUP = 8  # query rows per register block in the wide variant
AVX2_WIDE_GROUP = 6  # ... in its AVX2 library (Note [Attention groups per ISA]) ...
AVX2_WIDE_HEAD = 32  # ... from this head dim (four rows below it)


def _key_block(d: int) -> int:
    return 64 if d <= 128 else (32 if d <= 256 else 16)


def attention_variants(att: Attention, ctx: KernelContext) -> list[tuple[str, Any, Callable[[Emitter], None]]]:
    """Note [Online softmax on CPU]: `_wide` (Sq >= 64: 64 query rows share each packed key block),
    `_blocked` (Sq >= 4: 16 rows), `_rows` (decoding); the first whose predicate holds runs."""
    sq = sympy.sympify(ctx.types[att.scores].shape[-2])  # the query rows
    plans: list[tuple[str, Any, Callable[[Emitter], None]]] = []
    for name, lo, rows in (("_wide", WIDE_ROWS, WIDE_ROWS), ("_blocked", ROWS_MIN, BLOCK_ROWS)):
        pred = sympy.Ge(sq, lo)
        if pred is not sympy.false:
            plans.append((name, pred, functools.partial(_kernel, att=att, blocked=True, qb=rows)))
        if pred is sympy.true:
            break
    if not plans or plans[-1][1] is not sympy.true:
        plans.append(("_rows", sympy.true, functools.partial(_kernel, att=att, blocked=False, qb=ROWS_MIN)))
    if len(plans) == 1:
        return [("", sympy.true, plans[0][2])]
    return plans


# Note [Value chunks per ISA]: a register group's probabilities times the block's values sum into the
# group's output rows. Four rows of a head of 64 floats are 32 of AVX2's 8-lane registers: GCC kept
# the rows on the stack, a load and a store beside each FMA. Each library walks the block's keys once
# per chunk of output columns whose accumulators fit its registers (AVX2: 16 columns, two vectors per
# row, 8 or 12 registers; AVX-512: 64 or 32, 16 registers; the baseline: 8), the chunk's value rows read
# again from L1: a padded batch's attention at head dim 64 (`bench.causal_prefill --form padded`,
# x86-64-v3) 1.19-1.35x. For the AVX2 library's six rows (Note [Attention groups per ISA]) both
# products are written as the dense kernel's tile (Note [Dense tiles per ISA]): per row of the group,
# one broadcast and that row's FMAs, the rows unrolled; GCC keeps one broadcast register, where with
# every row's broadcast loaded first it spilled accumulators past eight. Four and eight rows keep one
# loop over every row's FMAs, each key or value vector loaded once for all of them (per row, the
# AVX-512 library's four rows of a head of 64 measured 0.86-0.90x).
# (preprocessor guard, accumulator registers, vector bytes, vectors per row at most) per ISA library:
_ISA_ACC = (("#if defined(__AVX512F__)", 16, 64, 4), ("#elif defined(__AVX2__)", 12, 32, 2), ("#else", 8, 16, 2))


def _value_chunk(registers: int, vector: int, most: int, group: int, itemsize: int, dv: int) -> int:
    """Note [Value chunks per ISA]: the output columns per pass over a key block's values: as many
    vectors per row as `registers` accumulators allow for `group` rows, at most `most`, at least one."""
    return min(max(min(registers // group, most), 1) * (vector // itemsize), dv)


def _kernel(em: Emitter, att: Attention, blocked: bool, qb: int) -> None:
    ctx = em.ctx
    out_t = ctx.types[att.out]
    dt = out_t.dtype
    t = CTYPE[dt]
    r = em.args.ref
    sh = attention_shape(att, ctx)
    qv, kv, vv = sh.q, sh.k, sh.v
    lead, sq, skv, d, dv = sh.lead, sh.sq, sh.skv, sh.d, sh.dv
    kb = _key_block(d)
    pq, pk, pv = (em.ptr_load(x.base) for x in (qv, kv, vv))
    s_qi, s_qd, s_kj, s_kd, s_vj, s_ve = sh.s_qi, sh.s_qd, sh.s_kj, sh.s_kd, sh.s_vj, sh.s_ve
    safe, chain_end = sh.safe, sh.chain_end
    ninf = f"-std::numeric_limits<{t}>::infinity()"
    blocks = sympy.floor((sympy.sympify(sq) + qb - 1) / qb) if not isinstance(sq, int) else (sq + qb - 1) // qb
    k0, qi, jj = Loop("k0"), Loop("qi"), Loop("jj")
    bounds = key_bounds(att, ctx)
    mask = key_mask(att, ctx)
    # a fill of -inf adds exp(-inf) = 0 for every skipped key: one pass; another fill, a second where a
    # row's maximum leaves it above 0
    second_pass = mask is not None and mask.finite

    def body(outer: tuple[Loop, ...]) -> None:
        syms, blk = outer[:-1], outer[-1]

        def base(view: View, shape: Sequence[IRDim]) -> str:
            return em.args.index(row_base(view, shape, lead, syms))

        em.line(f"const int64_t q0_ = {blk.name} * {qb};")
        em.line(f"const int64_t nq_ = std::min<int64_t>({qb}, {r(sq)} - q0_);")
        em.line(f"const {t}* BPK_RESTRICT qp_ = {pq} + {base(qv, ctx.types[att.q].shape)};")
        em.line(f"const {t}* BPK_RESTRICT kp_ = {pk} + {base(kv, ctx.types[att.k].shape)};")
        em.line(f"const {t}* BPK_RESTRICT vp_ = {pv} + {base(vv, ctx.types[att.v].shape)};")
        store = em.args.index(sh.out_base(syms))  # Note [Attention stores]
        em.line(f"{t}* BPK_RESTRICT op_ = {em.ptr_store(att.stored)} + {store};")
        vl = 64 // dt.itemsize  # lanes of one 64-byte vector
        # query rows per register block: eight in the wide variant where the output row fits two vectors
        # (1.1x at seq 300-512 over four; at a few rows the padding to eight costs more than it saves)
        group = WIDE_GROUP if qb == WIDE_ROWS and dv <= vl * 2 else 4
        avx2_group = AVX2_WIDE_GROUP if d >= AVX2_WIDE_HEAD else 4  # Note [Attention groups per ISA]
        sizes = (group, avx2_group) if qb == WIDE_ROWS else (group,)
        slots = max(-(-qb // g) * g for g in sizes)
        em.line(f"{t} m_[{slots}], l_[{slots}];")
        em.line(f"alignas(64) {t} acc_[{slots * dv}];")
        if blocked:
            em.line(f"alignas(64) {t} kt_[{d * kb}];")
        idx = (*syms, blk * qb + qi, k0 + jj)

        def chain(row: str) -> None:
            em.bind(att.scores, idx, f"{row}[jj]")
            x = em.eval(chain_end, idx)
            em.line(f"{row}[jj] = {x};")
            em.line(f"mb_ = {row}[jj] > mb_ ? {row}[jj] : mb_;")

        def grow_max(row: str, block_max: str) -> None:
            """Row `row`'s running maximum takes the block's; when it grows, what the earlier blocks
            summed (l and the accumulator row) is rescaled by exp(m_old - m_new)."""
            em.line(f"const {t} mo_ = m_[{row}], mn_ = mo_ > {block_max} ? mo_ : {block_max};")
            em.line("if (mn_ != mo_) {")
            em.line(f"  const {t} al_ = bpk::vexp(mo_ - mn_);")
            em.line(f"  l_[{row}] *= al_;")
            em.line(f"  for (int e = 0; e < {dv}; ++e) acc_[{row} * {dv} + e] *= al_;")
            em.line(f"  m_[{row}] = mn_;")
            em.line("}")

        def softmax_row(row: str) -> None:
            """The chain on one query row's block of scores, the running max / sum update, then the
            scores become probabilities exp(s - m) in place."""
            em.line(f"{t} mb_ = {ninf};")
            em.loop(
                ["#pragma omp simd reduction(max:mb_)", "for (int64_t jj = 0; jj < nk_; ++jj) {"],
                [jj],
                lambda: chain(row),
            )
            grow_max("qi", "mb_")
            # Note [Softmax exponentials]: 0 for the maximum of a row whose scores are all -inf so far
            em.line(f"const {t} mz_ = mn_ == {ninf} ? {t}(0) : mn_;")
            em.line(f"{t} ls_ = {t}(0);")
            em.line("#pragma omp simd reduction(+:ls_)")
            em.line("for (int64_t jj = 0; jj < nk_; ++jj) {")
            em.line(f"  const {t} p_ = bpk::vexp_nonpos({row}[jj] - mz_);")
            em.line(f"  {row}[jj] = p_;")
            em.line("  ls_ += p_;")
            em.line("}")
            em.line("l_[qi] += ls_;")

        def tile_update(group: int, i: str, n: int, vector: str, scalar: Callable[[int], str], acc: str) -> None:
            """{acc}{q}_[i] += scalar(q) * vector for the group's rows q and lanes i < n (`vector` reads
            lane `i`), Note [Value chunks per ISA]: the AVX2 library's six rows one after the other,
            one broadcast each; fewer rows in one loop over every row's FMAs, each vector loaded once."""
            pad = "    "
            if group == AVX2_WIDE_GROUP:
                for q in range(group):
                    em.line(f"{pad}{{ const {t} x_ = {scalar(q)};")
                    em.line(f"{pad}#pragma omp simd")
                    em.line(f"{pad}for (int {i} = 0; {i} < {n}; ++{i}) {acc}{q}_[{i}] += x_ * {vector}; }}")
                return
            em.line(f"{pad}const {t} " + ", ".join(f"x{q}_ = {scalar(q)}" for q in range(group)) + ";")
            em.line(f"{pad}#pragma omp simd")
            em.line(
                f"{pad}for (int {i} = 0; {i} < {n}; ++{i}) {{ const {t} v_ = {vector}; "
                + " ".join(f"{acc}{q}_[{i}] += x{q}_ * v_;" for q in range(group))
                + " }"
            )

        def row_group(group: int) -> None:
            """`group` query rows at once: each packed key vector feeds `group` FMAs, each V row as many
            independent accumulators (rows past the last are clamped reads, never stored)."""
            rows = range(group)
            for q in rows:
                em.line(
                    f"const {t}* BPK_RESTRICT qr{q}_ = qp_ + std::min<int64_t>(q0_ + g_ + {q}, {r(sq)} - 1) * {r(s_qi)};"
                )
            em.line(f"for (int c = 0; c < nk_; c += {vl}) {{  // whole vectors up to the last key")
            em.line(f"  {t} " + ", ".join(f"a{q}_[{vl}] = {{}}" for q in rows) + ";")
            em.line(f"  for (int d = 0; d < {d}; ++d) {{")
            em.line(f"    const {t}* BPK_RESTRICT kr_ = kt_ + d * {kb} + c;")
            tile_update(group, "l", vl, "kr_[l]", lambda q: f"qr{q}_[d * {r(s_qd)}]", "a")
            em.line("  }")
            em.line(
                f"  for (int l = 0; l < {vl}; ++l) {{ " + " ".join(f"s_[{q}][c + l] = a{q}_[l];" for q in rows) + " }"
            )
            em.line("}")
            # the chain on the group's scores in one pass: what it reads per key (a padding mask)
            # is loaded once for the group (Note [Online softmax on CPU]); rows past the last are
            # evaluated at the last row, so the chain never reads outside its operands
            qc = [Loop(f"qc{q}_") for q in rows]
            for q in rows:
                em.declare(f"const int64_t qc{q}_ = std::min<int64_t>(q0_ + g_ + {q}, {r(sq)} - 1);", f"qc{q}_")
            em.scopes[-1].syms.update(qc)
            em.line(f"{t} " + ", ".join(f"mb{q}_ = {ninf}" for q in rows) + ";")

            def chain_group(key: sympy.Expr, last: bool) -> None:
                """`last`: the last, partial key block, run over whole vectors: lanes past the last key
                read the chain's operands at the last key and score -inf (no scalar remainder)."""
                if last:
                    em.declare("const int64_t jc_ = k0 + (jj < nk_ ? jj : nk_ - 1);", "jc_")
                    em.scopes[-1].syms.add(key)
                for q in rows:
                    at = (*syms, qc[q], key)
                    em.bind(att.scores, at, f"s_[{q}][jj]")
                    x = em.eval(chain_end, at)
                    em.line(f"s_[{q}][jj] = {f'jj < nk_ ? {x} : {ninf}' if last else x};")
                    em.line(f"mb{q}_ = s_[{q}][jj] > mb{q}_ ? s_[{q}][jj] : mb{q}_;")

            maxes = ",".join(f"mb{q}_" for q in rows)
            whole = (f"for (int64_t jj = 0; jj < {kb}; ++jj) {{", k0 + jj, False)
            last = ("for (int64_t jj = 0; jj < nkv_; ++jj) {", Loop("jc_"), True)
            for head, (loop, key, partial) in zip((f"if (nk_ == {kb}) {{", "} else {"), (whole, last)):
                em.line(head)
                branch = em.push(barrier=True)  # nothing either branch computes is visible to the other
                em.loop(
                    [f"#pragma omp simd reduction(max:{maxes})", loop],
                    [jj],
                    functools.partial(chain_group, key, partial),
                )
                em.pop()
                em.scopes[-1].lines.extend("  " + ln for ln in branch.lines)
            em.line("}")
            for q in rows:
                em.line("{")
                grow_max(f"(g_ + {q})", f"mb{q}_")
                em.line("}")
            # Note [Softmax exponentials]: a row whose scores are all -inf so far gets 0 for its maximum
            # here, so each -inf score is exp(-inf) = 0 (not exp(-inf + inf), NaN)
            em.line(
                f"const {t} "
                + ", ".join(f"mx{q}_ = m_[g_ + {q}] == {ninf} ? {t}(0) : m_[g_ + {q}]" for q in rows)
                + ";"
            )
            em.line(f"{t} " + ", ".join(f"ls{q}_ = {t}(0)" for q in rows) + ";")
            em.line(f"#pragma omp simd reduction(+:{','.join(f'ls{q}_' for q in rows)})")
            em.line("for (int64_t jj = 0; jj < nkv_; ++jj) {  // lanes past the last key are -inf: 0")
            for q in rows:
                em.line(f"  const {t} p{q}_ = bpk::vexp_nonpos(s_[{q}][jj] - mx{q}_);")
                em.line(f"  s_[{q}][jj] = p{q}_;")
                em.line(f"  ls{q}_ += p{q}_;")
            em.line("}")
            for q in rows:
                em.line(f"l_[g_ + {q}] += ls{q}_;")
            widths = {g: _value_chunk(regs, vec, most, group, dt.itemsize, dv) for g, regs, vec, most in _ISA_ACC}
            if len(set(widths.values())) == 1:
                value_chunks(group, widths["#else"])
                return
            for guard, width in widths.items():  # Note [Value chunks per ISA]
                em.branch(guard, functools.partial(value_chunks, group, width))
            em.line("#endif")

        def value_chunks(group: int, width: int) -> None:
            """The probabilities times V into the rows' accumulators, `width` output columns at a time:
            the chunk's accumulators stay in registers across the block's keys."""
            rows = range(group)
            for c0 in range(0, dv, width):
                w = min(width, dv - c0)
                em.line("{" if w == dv else f"{{  // output columns {c0}-{c0 + w - 1}")
                em.line(f"  {t} " + ", ".join(f"o{q}_[{w}]" for q in rows) + ";")
                em.line(
                    f"  for (int e = 0; e < {w}; ++e) {{ "
                    + " ".join(f"o{q}_[e] = acc_[(g_ + {q}) * {dv} + {c0} + e];" for q in rows)
                    + " }"
                )
                em.line("  for (int64_t jj = 0; jj < nk_; ++jj) {")
                em.line(f"    const {t}* BPK_RESTRICT vr_ = vp_ + (k0 + jj) * {r(s_vj)} + {c0} * {r(s_ve)};")
                tile_update(group, "e", w, f"vr_[e * {r(s_ve)}]", lambda q: f"s_[{q}][jj]", "o")
                em.line("  }")
                em.line(
                    f"  for (int e = 0; e < {w}; ++e) {{ "
                    + " ".join(f"acc_[(g_ + {q}) * {dv} + {c0} + e] = o{q}_[e];" for q in rows)
                    + " }"
                )
                em.line("}")

        def query_row() -> None:
            """One query row (decoding): each score a dot product straight from K; the probabilities
            times V summed into four partial accumulators over alternating keys."""
            em.line(f"const {t}* BPK_RESTRICT qr_ = qp_ + (q0_ + qi) * {r(s_qi)};")
            em.line(f"alignas(64) {t} s_[{kb}];")
            em.line("for (int64_t jj = 0; jj < nk_; ++jj) {")
            em.line(f"  const {t}* BPK_RESTRICT kr_ = kp_ + (k0 + jj) * {r(s_kj)};")
            em.line(f"  {t} dot_ = {t}(0);")
            em.line("  #pragma omp simd reduction(+:dot_)")
            em.line(f"  for (int d = 0; d < {d}; ++d) dot_ += qr_[d * {r(s_qd)}] * kr_[d * {r(s_kd)}];")
            em.line("  s_[jj] = dot_;")
            em.line("}")
            softmax_row("s_")
            em.line(f"{t} o_[4][{dv}] = {{}};")
            em.line("int64_t jj = 0;")
            em.line("for (; jj + 4 <= nk_; jj += 4) {")
            em.line("  for (int u = 0; u < 4; ++u) {")
            em.line(f"    const {t}* BPK_RESTRICT vr_ = vp_ + (k0 + jj + u) * {r(s_vj)};")
            em.line(f"    const {t} p_ = s_[jj + u];")
            em.line("    #pragma omp simd")
            em.line(f"    for (int e = 0; e < {dv}; ++e) o_[u][e] += p_ * vr_[e * {r(s_ve)}];")
            em.line("  }")
            em.line("}")
            em.line("for (; jj < nk_; ++jj) {")
            em.line(f"  const {t}* BPK_RESTRICT vr_ = vp_ + (k0 + jj) * {r(s_vj)};")
            em.line(f"  for (int e = 0; e < {dv}; ++e) o_[0][e] += s_[jj] * vr_[e * {r(s_ve)}];")
            em.line("}")
            em.line(
                f"for (int e = 0; e < {dv}; ++e) acc_[qi * {dv} + e] += (o_[0][e] + o_[1][e]) + (o_[2][e] + o_[3][e]);"
            )

        def live_key() -> None:
            assert mask is not None
            keys = []
            for term, masks in mask.terms:
                x = em.eval(term, mask_index(ctx, term, syms, k0 + jj))
                keys.append(f"!{x}" if masks else x)
            em.line(f"if ({' && '.join(keys)}) {{ live_ = true; break; }}")

        def skip_masked() -> None:
            """Note [Masked key blocks]: on to the next block where every key of this one is masked."""
            scope = em.push(barrier=True)  # nothing the scan reads is visible to the block's chain
            em.line("bool live_ = false;")
            em.loop(["for (int64_t jj = 0; jj < nk_; ++jj) {"], [jj], live_key)
            em.line("if (!live_) continue;")
            em.pop()
            em.line("if (pass_ == 0) {" if second_pass else "{")
            em.scopes[-1].lines.extend("  " + ln for ln in scope.lines)
            em.line("}")

        def key_block() -> None:
            em.line(f"const int64_t nk_ = std::min<int64_t>({kb}, {r(skv) if bounds is None else 'khi_'} - k0);")
            if mask is not None:
                skip_masked()
            if not blocked:

                def one_row() -> None:
                    if bounds is not None:  # Note [Group key bounds]
                        em.line("if (rhi_[qi] <= k0 || rlo_[qi] >= k0 + nk_) continue;")
                    query_row()

                em.loop(["for (int64_t qi = 0; qi < nq_; ++qi) {"], [qi], one_row)
                return
            # the block's keys transposed, [D][KB], zero from the last key to the end of its vector
            em.line("for (int64_t jj = 0; jj < nk_; ++jj) {")
            em.line(f"  const {t}* BPK_RESTRICT kr_ = kp_ + (k0 + jj) * {r(s_kj)};")
            em.line(f"  for (int d = 0; d < {d}; ++d) kt_[d * {kb} + jj] = kr_[d * {r(s_kd)}];")
            em.line("}")
            em.line(f"const int64_t nkv_ = (nk_ + {vl - 1}) / {vl} * {vl};")
            em.line("for (int64_t jj = nk_; jj < nkv_; ++jj)")
            em.line(f"  for (int d = 0; d < {d}; ++d) kt_[d * {kb} + jj] = {t}(0);")

            def bounded_group(size: int) -> None:
                if bounds is not None:  # Note [Group key bounds]
                    em.line("int64_t glo_ = rlo_[g_], ghi_ = rhi_[g_];")
                    em.line(f"for (int64_t q = g_ + 1; q < std::min<int64_t>(g_ + {size}, nq_); ++q) {{")
                    em.line("  glo_ = std::min<int64_t>(glo_, rlo_[q]);")
                    em.line("  ghi_ = std::max<int64_t>(ghi_, rhi_[q]);")
                    em.line("}")
                    em.line("if (ghi_ <= k0 || glo_ >= k0 + nk_) continue;")
                row_group(size)

            def groups(size: int) -> None:
                em.line(f"alignas(64) {t} s_[{size}][{kb}];")
                em.loop([f"for (int64_t g_ = 0; g_ < nq_; g_ += {size}) {{"], [], lambda: bounded_group(size))

            if qb != WIDE_ROWS:
                groups(group)
                return
            # Note [Attention groups per ISA]: eight rows of 64-byte score vectors are 16 of AVX2's 16
            # registers before the broadcasts; GCC kept two accumulators and every broadcast on the
            # stack. The AVX2 library takes six rows at a time from head dims of 32 (AVX2_WIDE_HEAD):
            # 6 x 16 keys, and 6 x 16 output columns (Note [Value chunks per ISA]), twelve accumulators,
            # BLIS's and MLAS's Haswell tile; a padded batch at head dim 64, x86-64-v3, 1.07-1.12x over
            # four rows (1.00-1.09x at head dim 32). Four below: the encoder sample's head of 16
            # measured 0.93-0.96x at six rows (its products' 16 steps too short for the tile's setup).
            # The rows' state (m_, l_, acc_) has a slot for each row the last group computes past the
            # block (never stored).
            em.branch("#if defined(__AVX2__) && !defined(__AVX512F__)", lambda: groups(avx2_group))
            em.branch("#else", lambda: groups(group))
            em.line("#endif")

        first, end = "0", r(skv)
        if bounds is not None:  # Note [Key bounds]: the block's rows' keys only
            em.line(f"int64_t klo_ = {r(skv) if bounds.lo else 0}, khi_ = {0 if bounds.hi else r(skv)};")
            em.line(f"int64_t rlo_[{qb}], rhi_[{qb}];  // each row's own bounds (Note [Group key bounds])")

            def row_bounds() -> None:
                for bound, pick, name, row, open_end in (
                    (bounds.lo, "min", "klo_", "rlo_", "0"),
                    (bounds.hi, "max", "khi_", "rhi_", r(skv)),
                ):
                    if bound is None:
                        em.line(f"{row}[qi] = {open_end};")
                        continue
                    at = bound_index(ctx, bound, (*syms, blk * qb + qi))
                    em.line(f"{row}[qi] = {em.eval(bound.value, at)} + {bound.add};")
                    em.line(f"{name} = std::{pick}<int64_t>({name}, {row}[qi]);")

            em.loop(["for (int64_t qi = 0; qi < nq_; ++qi) {"], [qi], row_bounds)
            em.line("klo_ = std::max<int64_t>(klo_, 0);")
            em.line(f"khi_ = std::min<int64_t>(khi_, {r(skv)});")
            first, end = "klo_", "khi_"

        def walk() -> None:
            em.line(f"for (int q = 0; q < {slots}; ++q) {{ m_[q] = {ninf}; l_[q] = {t}(0); }}")
            em.line(f"for (int e = 0; e < {slots * dv}; ++e) acc_[e] = {t}(0);")
            em.loop([f"for (int64_t k0 = {first}; k0 < {end}; k0 += {kb}) {{"], [k0], key_block)
            if not second_pass:
                return
            assert mask is not None
            # Note [Masked key blocks]: a skipped key's probability is exp(fill - m) for the row's final
            # maximum m: 0 unless the row saw no key above the fill; then all keys, as before
            fill = em.eval(mask.fill, ())
            em.line("if (pass_ == 0) {")
            em.line("  bool full_ = false;")
            em.line(
                f"  for (int64_t q = 0; q < nq_; ++q) full_ = full_ || m_[q] == {ninf}"
                f" || bpk::vexp_nonpos({fill} - m_[q]) != {t}(0);"
            )
            em.line("  if (!full_) break;")
            em.line("}")

        if second_pass:
            em.loop(["for (int pass_ = 0; pass_ < 2; ++pass_) {  // Note [Masked key blocks]"], [], walk)
        else:
            walk()
        # a row with every score -inf (l = 0) is 0 under a safe softmax, NaN under a plain one; with no
        # keys at all the product is an empty sum: 0, as torch's matmul gives
        nan = f"std::numeric_limits<{t}>::quiet_NaN()"
        empty = f"{t}(0)" if safe else f"({r(skv)} == 0 ? {t}(0) : {nan})"
        em.line("for (int64_t q = 0; q < nq_; ++q) {")
        em.line(f"  const {t} inv_ = l_[q] == {t}(0) ? {empty} : {t}(1) / l_[q];")
        em.line(f"  for (int e = 0; e < {dv}; ++e) op_[(q0_ + q) * {r(sh.s_oi)} + e] = acc_[q * {dv} + e] * inv_;")
        em.line("}")

    cost = f"{qb} * {r(skv)} * {d + dv + 24}"
    em.rows_loop([*lead, simplify(blocks) if not isinstance(blocks, int) else blocks], cost, body)
