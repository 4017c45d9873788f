"""Mamba's selective scan, the kernel both backends share.

In: an `Emitter` (the CPU's or the CUDA one) whose spec is a "selective_scan" kernel (a SELECTIVE_SCAN
node, SelectiveScanAttrs), and whether to walk channels in blocks (the CPU). Out: the kernel body, a
block of channels of one sequence per iteration of the backend's `rows_loop`.

Note [Selective scan kernel]: every channel (b, d) is its own recurrence over the steps, so the rows
of the schedule are the channels (one CUDA thread each) or blocks of channels (CPU threads), and a row
runs its steps in order with each channel's N-wide state in a local array of the accumulator type:
per step, for channel d of head h, delta = softplus(dt[b, h, t] + dt_bias[h]), x = exp(delta * A[h]) * x
+ delta * Bm[b, :, t] * u, y = x . Cm[b, :, t] (+ D[h] * u), times silu(z) (Mamba: a head per
channel). N (the state size, 16 in Mamba, 64-128 in Mamba-2) is a constant of the weights. An A of
[H, 1] is one A per head for all N (Mamba-2): the decay exp(delta * A) is then one exp per step
instead of N. Grouped Bm, Cm [B, G, N, L] (Mamba-2: Note [Mamba-2 as a selective scan] in
export/selective_scan.py) give channel d the rows of group d // (D / G).

On the CPU a row is a block of up to BLOCK_STATE / N channels of one head (and group), which share
the step's delta and decay (computed once, not per channel) and Bm's and Cm's rows. Those rows sit
L apart in Hugging Face's layouts, so the row gathers them for STEP_CHUNK steps at once into two
contiguous local arrays (a chunk reads each cache line of a state element's steps once); then, four
channels at a time, the states update against them in a loop over N that vectorizes (`omp simd` with
the four y reductions). Mamba-2 at 1 x 256 tokens, 2 x 768, state 128, per layer's scan: one channel
per row reading Bm and Cm in the innermost loop with stride L (scalar code) 41 ms; rows of 16 channels
gathering one step at a time 4.3 ms; chunks of 16 steps 2.5 ms; rows of 64 channels (32 KiB of state)
1.5 ms (1.75 ms with the AVX2 library). Mamba's channels are a head each: its rows stay one channel,
the N = 16 states in registers (rows of many channels kept them in memory: 9 % slower).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import store_offset
from bladepack.dtypes import DType
from bladepack.ir.ops import SelectiveScanAttrs

BLOCK_STATE = 8192  # a CPU row's states: channels * N accumulators (32 KiB of float32)
STEP_CHUNK = 16  # steps of Bm's and Cm's rows a CPU row gathers at once (2 x 8 KiB at N = 128)


def channel_block(per_head: object, state: int) -> int:
    """The channels of a CPU row: the largest divisor of a head's channels whose states fit
    BLOCK_STATE; 1 where the count is symbolic."""
    if not isinstance(per_head, int):
        return 1
    return max(c for c in range(1, max(1, BLOCK_STATE // state) + 1) if per_head % c == 0)


def selective_scan_kernel(em: Emitter, blocked: bool = False) -> None:
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, SelectiveScanAttrs)
    u, dt, amat, bm, cm = n.inputs[:5]
    rest = list(n.inputs[5:])
    dvec = rest.pop(0) if a.has_d else None
    z = rest.pop(0) if a.has_z else None
    bias = rest.pop(0) if a.has_bias else None
    state = em.ctx.types[bm].shape[-2]
    assert isinstance(state, int), "the state size is a constant of the weights"
    scalar_a = em.ctx.types[amat].shape[1] == 1 and state != 1  # Mamba-2: one A per head, one decay per step
    out_dt = n.type.dtype
    acc_dt = DType.FLOAT64 if out_dt is DType.FLOAT64 else DType.FLOAT32
    acc = CTYPE[acc_dt]
    shape = n.type.shape
    steps, channels, heads = shape[2], shape[1], em.ctx.types[dt].shape[1]
    per_head = 1 if heads == channels else channels // heads
    groups = em.ctx.types[bm].shape[1] if em.ctx.types[bm].rank == 4 else None
    per_group = channels // groups if groups is not None else channels
    blocked = blocked and per_head != 1  # Mamba's channels (a head each) keep their state in registers
    # a row's channels share one head (dt, A and D computed once per step) and one group
    span = math.gcd(per_head, per_group) if isinstance(per_head, int) and isinstance(per_group, int) else per_head
    block = channel_block(span, state) if blocked else 1
    lanes = next(k for k in (4, 2, 1) if block % k == 0)  # channels per pass over N

    def load(v: int, idx: tuple[sympy.Expr, ...]) -> str:
        return em._as(em.eval(v, idx), em.ctx.types[v].dtype, acc_dt)

    def loop(sym: Loop, extent: object, gen: Callable[[], None], pragma: tuple[str, ...] = ()) -> None:
        em.loop([*pragma, f"for (int64_t {sym.name} = 0; {sym.name} < {extent}; ++{sym.name}) {{"], [sym], gen)

    def head_of(d: sympy.Expr) -> sympy.Expr:
        return d if per_head == 1 else sympy.floor(d / per_head)

    def body(outer: tuple[Loop, ...]) -> None:
        b, blk = outer
        first = blk * block
        lead: tuple[sympy.Expr, ...] = (b,)
        if groups is not None:
            lead = (b, first if per_group == 1 else sympy.floor(first / per_group))
        xs, la = em.fresh("xs"), em.fresh("la")
        em.declare(f"{acc} {xs}[{block * state}];", xs)
        width = 1 if scalar_a else state
        em.declare(f"{acc} {la}[{width}];", la)
        c0, k0 = Loop("c0"), Loop("n0")
        loop(c0, block * state, lambda: em.line(f"{xs}[{c0.name}] = {acc}(0);"))
        head = head_of(first)
        col = sympy.Integer(0) if scalar_a else k0
        loop(k0, width, lambda: em.line(f"{la}[{k0.name}] = {load(amat, (head, col))};"))

        def step(t: sympy.Expr, brow: str, crow: str) -> None:
            delta, decay = em.fresh("dl"), ""
            raw = load(dt, (b, head, t))
            if bias is not None:
                raw = f"({raw} + {load(bias, (head,))})"
            if a.softplus:  # torch's softplus: x above 20 passes through
                raw = f"({raw} > {acc}(20) ? {raw} : std::log1p(bpk::vexp({raw})))"
            em.declare(f"const {acc} {delta} = {raw};", delta)
            if scalar_a:
                decay = em.fresh("dc")
                em.declare(f"const {acc} {decay} = bpk::vexp({delta} * {la}[0]);", decay)
            c = Loop("c1")

            def channels_at() -> None:  # `lanes` channels share each load of Bm's and Cm's rows
                ds = [first + lanes * c + j for j in range(lanes)]
                uvs = [em.fresh("uv") for _ in ds]
                dus, ys, rows = [em.fresh("du") for _ in ds], [em.fresh("y") for _ in ds], [em.fresh("xr") for _ in ds]
                for j, d in enumerate(ds):
                    em.declare(f"const {acc} {uvs[j]} = {load(u, (b, d, t))};", uvs[j])
                    em.declare(f"const {acc} {dus[j]} = {delta} * {uvs[j]};", dus[j])
                    em.declare(f"{acc} {ys[j]} = {acc}(0);", ys[j])
                    em.declare(f"{acc}* {rows[j]} = {xs} + ({lanes} * {c.name} + {j}) * {state};", rows[j])
                k = Loop("n1")

                def update() -> None:
                    dk = decay or f"bpk::vexp({delta} * {la}[{k.name}])"
                    bv = f"{brow}[{k.name}]" if blocked else load(bm, (*lead, k, t))
                    cv = f"{crow}[{k.name}]" if blocked else load(cm, (*lead, k, t))
                    for j in range(lanes):
                        em.line(f"{rows[j]}[{k.name}] = {dk} * {rows[j]}[{k.name}] + {dus[j]} * {bv};")
                        em.line(f"{ys[j]} += {rows[j]}[{k.name}] * {cv};")

                pragma = (f"#pragma omp simd reduction(+ : {', '.join(ys)})",) if blocked else ()
                loop(k, state, update, pragma)
                for j, d in enumerate(ds):
                    result = ys[j]
                    if dvec is not None:
                        result = f"({result} + {load(dvec, (head,))} * {uvs[j]})"
                    if z is not None:
                        zv = em.fresh("zv")
                        em.declare(f"const {acc} {zv} = {load(z, (b, d, t))};", zv)
                        result = f"({result} * ({zv} * bpk::sigmoid<{acc}>({zv})))"
                    em.store(n.id, store_offset(shape, (b, d, t)), em._as(result, acc_dt, out_dt))

            loop(c, block // lanes, channels_at)

        if not blocked:
            t = Loop("t0")
            em.for_loop(t, steps, lambda: step(t, "", ""))
            return
        # Bm's and Cm's rows of STEP_CHUNK steps, gathered once for the block: each state element's
        # steps are adjacent in memory, so a chunk reads each of their cache lines once
        tc, t1, t2, k2 = Loop("tc"), Loop("t1"), Loop("t2"), Loop("n2")
        brows, crows, count = em.fresh("bb"), em.fresh("cb"), em.fresh("tn")

        def chunk() -> None:
            em.declare(
                f"const int64_t {count} = std::min<int64_t>({STEP_CHUNK}, {em.args.ref(steps)} - {tc.name});", count
            )
            em.declare(f"{acc} {brows}[{STEP_CHUNK * state}];", brows)
            em.declare(f"{acc} {crows}[{STEP_CHUNK * state}];", crows)

            def gather() -> None:
                em.line(f"{brows}[{t2.name} * {state} + {k2.name}] = {load(bm, (*lead, k2, tc + t2))};")
                em.line(f"{crows}[{t2.name} * {state} + {k2.name}] = {load(cm, (*lead, k2, tc + t2))};")

            loop(k2, state, lambda: loop(t2, count, gather))
            at = f"{t1.name} * {state}"
            loop(t1, count, lambda: step(tc + t1, f"({brows} + {at})", f"({crows} + {at})"))

        header = f"for (int64_t {tc.name} = 0; {tc.name} < {em.args.ref(steps)}; {tc.name} += {STEP_CHUNK}) {{"
        em.loop([header], [tc], chunk)

    em.rows_loop([shape[0], channels if block == 1 else channels // block], "65536", body)
