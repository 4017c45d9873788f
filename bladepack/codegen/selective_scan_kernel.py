"""Mamba's selective scan, the kernel both backends share.

In: an `Emitter` (the CPU's or the CUDA one) whose spec is a "selective_scan" kernel (a SELECTIVE_SCAN
node, SelectiveScanAttrs), and whether to walk channels in blocks (the CPU). Out: the kernel body, a
block of channels of one sequence per iteration of the backend's `rows_loop`.

Note [Selective scan kernel]: every channel (b, d) is its own recurrence over the steps, so the rows
of the schedule are the channels (one CUDA thread each) or blocks of channels (CPU threads), and a row
runs its steps in order with each channel's N-wide state in a local array of the accumulator type:
per step delta = softplus(dt + dt_bias), x = exp(delta * A[d]) * x + delta * Bm[b, :, t] * u,
y = x . Cm[b, :, t] (+ D[d] * u), times silu(z). Mamba's N (the state size, 16 in Mamba, 64-128 in
Mamba-2) is a constant of the weights. An A of [D, 1] is one A per channel for all N (Mamba-2): the
decay exp(delta * A) is then one exp per step instead of N. Grouped Bm, Cm [B, G, N, L] (Mamba-2:
Note [Mamba-2 as a selective scan] in export/selective_scan.py) give channel d the rows of group
d // (D / G).

On the CPU a row is a block of up to BLOCK_STATE / N channels of one group: per step it copies Bm's
and Cm's N values into two contiguous local rows once (they sit L apart in Hugging Face's layouts: a
strided gather) and the block's channels then update their states against those rows in a loop over
N that vectorizes (`omp simd` with the y reduction). One channel per row read Bm and Cm with stride L
in the innermost loop: scalar code, 41 ms of a Mamba-2 layer's 45 at 1 x 256 tokens.
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

BLOCK_STATE = 2048  # a CPU row's states: channels * N accumulators (8 KiB of float32)


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
        t = Loop("t0")

        def step() -> None:
            brow, crow = em.fresh("bb"), em.fresh("cb")
            if blocked:  # Bm's and Cm's rows of this step, gathered once for the block
                em.declare(f"{acc} {brow}[{state}];", brow)
                em.declare(f"{acc} {crow}[{state}];", crow)
                k2 = Loop("n2")

                def gather() -> None:
                    em.line(f"{brow}[{k2.name}] = {load(bm, (*lead, k2, t))};")
                    em.line(f"{crow}[{k2.name}] = {load(cm, (*lead, k2, t))};")

                loop(k2, state, gather)
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

            def channel() -> None:
                d = first + c
                uv, y, row = em.fresh("uv"), em.fresh("y"), em.fresh("xr")
                em.declare(f"const {acc} {uv} = {load(u, (b, d, t))};", uv)
                em.declare(f"{acc} {y} = {acc}(0);", y)
                em.declare(f"{acc}* {row} = {xs} + {c.name} * {state};", row)
                k = Loop("n1")

                def update() -> None:
                    dk = decay or f"bpk::vexp({delta} * {la}[{k.name}])"
                    bv = f"{brow}[{k.name}]" if blocked else load(bm, (*lead, k, t))
                    cv = f"{crow}[{k.name}]" if blocked else load(cm, (*lead, k, t))
                    em.line(f"{row}[{k.name}] = {dk} * {row}[{k.name}] + {delta} * {bv} * {uv};")
                    em.line(f"{y} += {row}[{k.name}] * {cv};")

                loop(k, state, update, (f"#pragma omp simd reduction(+ : {y})",) if blocked else ())
                result = y
                if dvec is not None:
                    result = f"({result} + {load(dvec, (head,))} * {uv})"
                if z is not None:
                    zv = em.fresh("zv")
                    em.declare(f"const {acc} {zv} = {load(z, (b, d, t))};", zv)
                    result = f"({result} * ({zv} * bpk::sigmoid<{acc}>({zv})))"
                em.store(n.id, store_offset(shape, (b, d, t)), em._as(result, acc_dt, out_dt))

            loop(c, block, channel)

        em.for_loop(t, steps, step)

    em.rows_loop([shape[0], channels if block == 1 else channels // block], "65536", body)
