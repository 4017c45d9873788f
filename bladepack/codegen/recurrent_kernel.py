"""The recurrent-layer kernel both backends share: one direction of an LSTM, GRU or plain RNN layer.

In: an `Emitter` (the CPU's or the CUDA one) whose spec is a "recurrent" kernel (a RECURRENT node,
Note [Recurrent cells] in opset/attrs.py). Out: the kernel body, one sequence of the batch per
iteration of the backend's `rows_loop`.

Note [Recurrent kernel]: the input projection of every step (xg, a GEMM of the whole sequence) is
computed before the kernel; what is left is inherently sequential in the steps and independent across
the batch, so a row of the schedule is one sequence: on the CPU the batch is split across threads,
on CUDA one thread runs one sequence. Per step, the gate pre-activations start from the recurrent
bias and take h @ R as AXPYs over R's rows (R is W_hh^T, [H, G*H], so the innermost loop runs over
contiguous gate columns and vectorizes without reassociating a sum); the cell then reads xg at the
step and updates the state in place. State and gates live in local arrays in the accumulator type
(float for 16-bit floats), so H is bounded by `MAX_RECURRENT_HIDDEN`. A GRU with linear_before_reset
False needs r before its candidate gate's product: the r and z columns first, then (r*h) @ R_n.
"""

from __future__ import annotations

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import store_offset
from bladepack.dtypes import DType
from bladepack.ir.ops import RECURRENT_GATES, RecurrentAttrs


def recurrent_kernel(em: Emitter) -> None:
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, RecurrentAttrs)
    xg, r, rb, h0 = n.inputs[:4]
    c0 = n.inputs[4] if a.cell == "lstm" else None
    hid = a.hidden
    cols = RECURRENT_GATES[a.cell] * hid
    dt = n.type.dtype
    acc_dt = DType.FLOAT64 if dt is DType.FLOAT64 else DType.FLOAT32
    acc = CTYPE[acc_dt]
    shape = n.type.shape
    steps = shape[0]
    sig = f"bpk::sigmoid<{acc}>"

    def load(v: int, idx: tuple[sympy.Expr, ...]) -> str:
        return em._as(em.eval(v, idx), em.ctx.types[v].dtype, acc_dt)

    def body(outer: tuple[Loop, ...]) -> None:
        b = outer[0]
        hs, gs, cs, rh = em.fresh("hs"), em.fresh("gs"), em.fresh("cs"), em.fresh("rh")
        em.declare(f"{acc} {hs}[{hid}];", hs)
        em.declare(f"{acc} {gs}[{cols}];", gs)
        if c0 is not None:
            em.declare(f"{acc} {cs}[{hid}];", cs)
        before = a.cell == "gru" and not a.linear_before_reset
        if before:
            em.declare(f"{acc} {rh}[{hid}];", rh)
        u0 = Loop("u0")

        def init() -> None:
            em.line(f"{hs}[{u0.name}] = {load(h0, (b, u0))};")
            if c0 is not None:
                em.line(f"{cs}[{u0.name}] = {load(c0, (b, u0))};")

        em.for_loop(u0, hid, init)
        s = Loop("s0")
        t = steps - 1 - s if a.reverse else s

        def product(src: str, first: int, count: int, k: Loop, j: Loop) -> None:
            """gs[first + j] += src[k] * R[k, first + j] over k < H, j < count."""

            def row() -> None:
                hk = em.fresh("hk")
                em.declare(f"const {acc} {hk} = {src}[{k.name}];", hk)
                em.for_loop(j, count, lambda: em.line(f"{gs}[{first} + {j.name}] += {hk} * {load(r, (k, first + j))};"))

            em.for_loop(k, hid, row)

        def step() -> None:
            j0 = Loop("j0")
            em.for_loop(j0, cols, lambda: em.line(f"{gs}[{j0.name}] = {load(rb, (j0,))};"))
            product(hs, 0, 2 * hid if before else cols, Loop("k1"), Loop("j1"))
            u = Loop("u1")

            def x(gate: int) -> str:
                return f"({load(xg, (t, b, gate * hid + u))} + {gs}[{gate * hid} + {u.name}])"

            def put(value: str, offset: int = 0) -> None:
                em.store(n.id, store_offset(shape, (t, b, offset + u)), em._as(value, acc_dt, dt))

            if a.cell == "lstm":

                def lstm() -> None:
                    i, f, g, o = (em.fresh(p) for p in ("gi", "gf", "gg", "go"))
                    em.declare(f"const {acc} {i} = {sig}{x(0)};", i)
                    em.declare(f"const {acc} {f} = {sig}{x(1)};", f)
                    em.declare(f"const {acc} {g} = std::tanh{x(2)};", g)
                    em.declare(f"const {acc} {o} = {sig}{x(3)};", o)
                    em.line(f"{cs}[{u.name}] = {f} * {cs}[{u.name}] + {i} * {g};")
                    em.line(f"{hs}[{u.name}] = {o} * std::tanh({cs}[{u.name}]);")
                    put(f"{hs}[{u.name}]")
                    put(f"{cs}[{u.name}]", hid)

                em.for_loop(u, hid, lstm)
            elif a.cell == "gru" and before:
                ug = Loop("u2")

                def reset() -> None:
                    em.line(f"{rh}[{ug.name}] = {sig}({load(xg, (t, b, ug))} + {gs}[{ug.name}]) * {hs}[{ug.name}];")

                em.for_loop(ug, hid, reset)
                product(rh, 2 * hid, hid, Loop("k2"), Loop("j2"))

                def update() -> None:
                    z, c = em.fresh("gz"), em.fresh("gn")
                    em.declare(f"const {acc} {z} = {sig}{x(1)};", z)
                    em.declare(f"const {acc} {c} = std::tanh{x(2)};", c)
                    em.line(f"{hs}[{u.name}] = ({acc}(1) - {z}) * {c} + {z} * {hs}[{u.name}];")
                    put(f"{hs}[{u.name}]")

                em.for_loop(u, hid, update)
            elif a.cell == "gru":

                def gru() -> None:
                    rr, z, c = em.fresh("gr"), em.fresh("gz"), em.fresh("gn")
                    em.declare(f"const {acc} {rr} = {sig}{x(0)};", rr)
                    em.declare(f"const {acc} {z} = {sig}{x(1)};", z)
                    xn = load(xg, (t, b, 2 * hid + u))
                    em.declare(f"const {acc} {c} = std::tanh({xn} + {rr} * {gs}[{2 * hid} + {u.name}]);", c)
                    em.line(f"{hs}[{u.name}] = ({acc}(1) - {z}) * {c} + {z} * {hs}[{u.name}];")
                    put(f"{hs}[{u.name}]")

                em.for_loop(u, hid, gru)
            else:
                act = "std::tanh({})" if a.cell == "rnn_tanh" else "({0} > {1}(0) ? {0} : {1}(0))"

                def plain() -> None:
                    pre = em.fresh("ga")
                    em.declare(f"const {acc} {pre} = {x(0)};", pre)
                    em.line(f"{hs}[{u.name}] = {act.format(pre, acc)};")
                    put(f"{hs}[{u.name}]")

                em.for_loop(u, hid, plain)

        em.for_loop(s, steps, step)

    em.rows_loop([shape[1]], "65536", body)
