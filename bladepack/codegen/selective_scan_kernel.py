"""Mamba's selective scan, the kernel both backends share.

In: an `Emitter` (the CPU's or the CUDA one) whose spec is a "selective_scan" kernel (a SELECTIVE_SCAN
node, SelectiveScanAttrs). Out: the kernel body, one channel of one sequence per iteration of the
backend's `rows_loop`.

Note [Selective scan kernel]: every channel (b, d) is its own recurrence over the steps, so the rows
of the schedule are the B * D channels (threads on the CPU, one CUDA thread each) and a row runs its
steps in order with its N-wide state in a local array of the accumulator type: per step delta =
softplus(dt + dt_bias), x = exp(delta * A[d]) * x + delta * Bm[b, :, t] * u, y = x . Cm[b, :, t]
(+ D[d] * u), times silu(z). The state's loop over N vectorizes; A's row and D are read once per
row. Mamba's N (the state size, 16 in the released models) is a constant of the weights.
"""

from __future__ import annotations

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import store_offset
from bladepack.dtypes import DType
from bladepack.ir.ops import SelectiveScanAttrs


def selective_scan_kernel(em: Emitter) -> None:
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, SelectiveScanAttrs)
    u, dt, amat, bm, cm = n.inputs[:5]
    rest = list(n.inputs[5:])
    dvec = rest.pop(0) if a.has_d else None
    z = rest.pop(0) if a.has_z else None
    bias = rest.pop(0) if a.has_bias else None
    state = em.ctx.types[amat].shape[1]
    assert isinstance(state, int), "the state size is a constant of the weights"
    out_dt = n.type.dtype
    acc_dt = DType.FLOAT64 if out_dt is DType.FLOAT64 else DType.FLOAT32
    acc = CTYPE[acc_dt]
    shape = n.type.shape
    steps = shape[2]

    def load(v: int, idx: tuple[sympy.Expr, ...]) -> str:
        return em._as(em.eval(v, idx), em.ctx.types[v].dtype, acc_dt)

    def body(outer: tuple[Loop, ...]) -> None:
        b, d = outer
        xs, la = em.fresh("xs"), em.fresh("la")
        em.declare(f"{acc} {xs}[{state}];", xs)
        em.declare(f"{acc} {la}[{state}];", la)
        k0 = Loop("n0")

        def init() -> None:
            em.line(f"{xs}[{k0.name}] = {acc}(0);")
            em.line(f"{la}[{k0.name}] = {load(amat, (d, k0))};")

        em.for_loop(k0, state, init)
        t = Loop("t0")

        def step() -> None:
            delta, uv, y = em.fresh("dl"), em.fresh("uv"), em.fresh("y")
            raw = load(dt, (b, d, t))
            if bias is not None:
                raw = f"({raw} + {load(bias, (d,))})"
            if a.softplus:  # torch's softplus: x above 20 passes through
                raw = f"({raw} > {acc}(20) ? {raw} : std::log1p(bpk::vexp({raw})))"
            em.declare(f"const {acc} {delta} = {raw};", delta)
            em.declare(f"const {acc} {uv} = {load(u, (b, d, t))};", uv)
            em.declare(f"{acc} {y} = {acc}(0);", y)
            k = Loop("n1")

            def update() -> None:
                em.line(
                    f"{xs}[{k.name}] = bpk::vexp({delta} * {la}[{k.name}]) * {xs}[{k.name}] + "
                    f"{delta} * {load(bm, (b, k, t))} * {uv};"
                )
                em.line(f"{y} += {xs}[{k.name}] * {load(cm, (b, k, t))};")

            em.for_loop(k, state, update)
            result = y
            if dvec is not None:
                result = f"({result} + {load(dvec, (d,))} * {uv})"
            if z is not None:
                zv = em.fresh("zv")
                em.declare(f"const {acc} {zv} = {load(z, (b, d, t))};", zv)
                result = f"({result} * ({zv} * bpk::sigmoid<{acc}>({zv})))"
            em.store(n.id, store_offset(shape, (b, d, t)), em._as(result, acc_dt, out_dt))

        em.for_loop(t, steps, step)

    em.rows_loop([shape[0], shape[1]], "65536", body)
