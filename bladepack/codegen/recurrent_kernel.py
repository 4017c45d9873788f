"""The recurrent-layer kernel both backends share: one direction of an LSTM, GRU or plain RNN layer.

In: an `Emitter` (the CPU's or the CUDA one) whose spec is a "recurrent" kernel (a RECURRENT node,
Note [Recurrent cells] in opset/attrs.py), and whether the CPU's team schedule may apply. Out: the
kernel body.

Note [Recurrent kernel]: the input projection of every step (xg, a GEMM of the whole sequence) is
computed before the kernel; what is left is sequential in the steps. Per step each sequence's gate
pre-activations are h @ R (R = W_hh^T, [H, G*H]) plus the recurrent bias; the cell then reads xg at
the step and updates the state. State and gates live in arrays in the accumulator type (float for
16-bit floats), so H is bounded by `ir.recurrent.MAX_RECURRENT_HIDDEN`. A GRU with linear_before_reset
False needs r before its candidate gate's product: the r and z columns first, then (r*h) @ R_n. An
LSTM's peepholes add p * c to i and f before the cell update and p * c' to o after it.

Two schedules:
- team (CPU, float32 / float64, R a contiguous buffer): the batch in blocks of up to `_rows(...)`
  sequences, and each block's steps split over a team of the pool's threads by hidden units (Note
  [Teams] in cpu_runtime.h): a member owns units [lo, hi) and their columns of every gate, so its
  slice of R stays in its own core's cache across the steps, and computes the block's products for
  those columns (`bpk::recurrent_product`, Note [Recurrent products] in cpu_gemm.h: one read of the
  slice per step whatever the block's size) and the cells of its units. h is double-buffered by step
  parity, so a member writing step s+1's h never races one still reading step s's; the members meet
  once per step (twice for a GRU with linear_before_reset False, whose candidate product reads the
  whole r*h);
- one sequence per row (CUDA: one thread per sequence; the CPU's 16-bit types and an R read through a
  view): the product as AXPYs over R's rows, whose innermost loop runs over contiguous gate columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.cpu_loops import DECLS
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import store_offset
from bladepack.dtypes import DType
from bladepack.ir.ops import RECURRENT_GATES, RecurrentAttrs

RECURRENT_ROWS = 16  # most sequences in a block of the team schedule
GATE_ELEMENTS = 16384  # ... and at most this many gate accumulators in a block (64 KB of float)
UNIT_ALIGN = 16  # a team member's first hidden unit is a multiple of this (whole vectors of columns)


def _rows(cols: int) -> int:
    return max(1, min(RECURRENT_ROWS, GATE_ELEMENTS // cols))


def recurrent_kernel(em: Emitter, team: bool = False) -> None:
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, RecurrentAttrs)
    xg, r, rb, h0 = n.inputs[:4]
    c0 = n.inputs[4] if a.cell == "lstm" else None
    peep = n.inputs[5] if len(n.inputs) > 5 else None
    hid = a.hidden
    gates = RECURRENT_GATES[a.cell]
    cols = gates * hid
    dt = n.type.dtype
    acc_dt = DType.FLOAT64 if dt is DType.FLOAT64 else DType.FLOAT32
    acc = CTYPE[acc_dt]
    shape = n.type.shape
    steps, batch = shape[0], shape[1]
    sig = f"bpk::sigmoid<{acc}>"
    before = a.cell == "gru" and not a.linear_before_reset
    rview = em.ctx.view(r)
    team = (
        team
        and dt in (DType.FLOAT32, DType.FLOAT64)
        and em.ctx.types[r].dtype is dt
        and r not in em.inside
        and rview is not None
        and rview.flat
        and rview.is_contiguous()
    )
    rows = _rows(cols) if team else 1
    names = {k: em.fresh(k) for k in ("hs", "gs", "cs", "rh", "nb", "hp", "hn", "ul", "uh")}
    hs, gs, cs, rh, nb, hp, hn, ulo, uhi = (names[k] for k in ("hs", "gs", "cs", "rh", "nb", "hp", "hn", "ul", "uh"))
    q = Loop("q0")
    s = Loop("s0")
    t = steps - 1 - s if a.reverse else s
    first = Loop("f0")
    seq: sympy.Expr = first + q if team else first

    def load(v: int, idx: tuple[sympy.Expr, ...]) -> str:
        return em._as(em.eval(v, idx), em.ctx.types[v].dtype, acc_dt)

    def scoped(header: Sequence[str], syms: Sequence[sympy.Symbol], gen: Callable[[], None], footer: str = "}") -> None:
        """Like Emitter.loop, but nothing is hoisted out of it (a lambda's body: Note [Restrict inside
        the parallel body])."""
        sc = em.push(syms, barrier=True)
        gen()
        em.pop()
        em.scopes[-1].lines.extend(header)
        em.scopes[-1].lines.extend("  " + ln for ln in sc.lines)
        em.scopes[-1].lines.append(footer)

    def units(u: Loop, gen: Callable[[], None]) -> None:
        """`gen` for each sequence of the block and each hidden unit this member owns."""

        def inner() -> None:
            if team:  # independent units; the shared arrays' aliasing is what keeps GCC from vectorizing
                header = ["#pragma omp simd", f"for (int64_t {u.name} = {ulo}; {u.name} < {uhi}; ++{u.name}) {{"]
                em.loop(header, [u], gen)
            else:
                em.for_loop(u, hid, gen)

        if team:
            em.loop([f"for (int64_t {q.name} = 0; {q.name} < {nb}; ++{q.name}) {{"], [q], inner)
        else:
            inner()

    def at(arr: str, width: int, u: sympy.Expr) -> str:
        return f"{arr}[{q.name} * {width} + {em.args.index(sympy.sympify(u))}]"

    def product(src: str, gate_ranges: Sequence[int], offset: int = 0) -> None:
        """gs[:, g*H + units] = src @ R[:, g*H + units] for each gate g (+ the recurrent bias: added
        here on one-sequence rows, by the cell in the team schedule). `offset`: the first gate's
        column offset on one-sequence rows (the GRU's candidate columns)."""
        if team:
            assert rview is not None
            rp = f"({em.ptr_load(rview.base)} + {em.args.index(sympy.sympify(rview.offset))})"
            for g in gate_ranges:
                em.line(
                    f"bpk::recurrent_product<{acc}>({nb}, {g * hid} + {ulo}, {g * hid} + {uhi}, {hid}, {src}, "
                    f"{hid}, {rp}, {cols}, {gs}, {cols});"
                )
            return
        n0, n1 = gate_ranges[0] * hid, (gate_ranges[-1] + 1) * hid
        j, k = Loop(f"j{n0}"), Loop(f"k{n0}")
        em.for_loop(j, n1 - n0, lambda: em.line(f"{gs}[{n0} + {j.name}] = {load(rb, (n0 + j,))};"))

        def row() -> None:
            hk = em.fresh("hk")
            em.declare(f"const {acc} {hk} = {src}[{k.name}];", hk)
            em.for_loop(j, n1 - n0, lambda: em.line(f"{gs}[{n0} + {j.name}] += {hk} * {load(r, (k, n0 + j))};"))

        em.for_loop(k, hid, row)

    u = Loop("u1")

    def hpart(gate: int, at_u: sympy.Expr = u) -> str:
        """h @ R_gate + rb_gate at (q, u)."""
        g = at(gs, cols, gate * hid + at_u)
        return f"({g} + {load(rb, (gate * hid + at_u,))})" if team else g

    def x(gate: int) -> str:
        return f"({load(xg, (t, seq, gate * hid + u))} + {hpart(gate)})"

    def put(value: str, offset: int = 0) -> None:
        em.store(n.id, store_offset(shape, (t, seq, offset + u)), em._as(value, acc_dt, dt))

    def cell() -> None:
        h_new = at(hn, hid, u)
        if a.cell == "lstm":
            c = at(cs, hid, u)
            i, f, g, o = (em.fresh(p) for p in ("gi", "gf", "gg", "go"))

            def peephole(k: int) -> str:  # p * c: the old c for i and f, the new one for o
                return f" + {load(peep, (k * hid + u,))} * {c}" if peep is not None else ""

            em.declare(f"const {acc} {i} = {sig}({x(0)}{peephole(0)});", i)
            em.declare(f"const {acc} {f} = {sig}({x(1)}{peephole(1)});", f)
            em.declare(f"const {acc} {g} = bpk::vtanh{x(2)};", g)
            em.line(f"{c} = {f} * {c} + {i} * {g};")
            em.declare(f"const {acc} {o} = {sig}({x(3)}{peephole(2)});", o)
            em.line(f"{h_new} = {o} * bpk::vtanh({c});")
            put(h_new)
            put(c, hid)
        elif a.cell == "gru":
            z, cand = em.fresh("gz"), em.fresh("gn")
            em.declare(f"const {acc} {z} = {sig}{x(1)};", z)
            if before:  # the candidate's product already took r * h
                em.declare(f"const {acc} {cand} = bpk::vtanh{x(2)};", cand)
            else:
                rr = em.fresh("gr")
                em.declare(f"const {acc} {rr} = {sig}{x(0)};", rr)
                xn = load(xg, (t, seq, 2 * hid + u))
                em.declare(f"const {acc} {cand} = bpk::vtanh({xn} + {rr} * {hpart(2)});", cand)
            em.line(f"{h_new} = ({acc}(1) - {z}) * {cand} + {z} * {at(hp, hid, u)};")
            put(h_new)
        else:
            pre = em.fresh("ga")
            em.declare(f"const {acc} {pre} = {x(0)};", pre)
            act = f"bpk::vtanh({pre})" if a.cell == "rnn_tanh" else f"({pre} > {acc}(0) ? {pre} : {acc}(0))"
            em.line(f"{h_new} = {act};")
            put(h_new)

    def sync() -> None:
        if team:
            em.line("team_.sync(tsz_, ++round_);")

    def step() -> None:
        size = rows * hid
        restrict = " BPK_RESTRICT" if team else ""  # the CPU prelude's; the halves never overlap
        em.line(f"{acc}*{restrict} const {hp} = {hs} + ({s.name} & 1) * {size};")
        em.line(f"{acc}*{restrict} const {hn} = {hs} + (({s.name} & 1) ^ 1) * {size};")
        em.depth[hp] = em.depth[hn] = len(em.scopes) - 1
        if before:
            product(hp, (0, 1))
            ur = Loop("u2")

            def reset() -> None:
                em.line(f"{at(rh, hid, ur)} = {sig}({load(xg, (t, seq, ur))} + {hpart(0, ur)}) * {at(hp, hid, ur)};")

            units(ur, reset)
            sync()
            product(rh, (2,))
        else:
            product(hp, tuple(range(gates)))
        units(u, cell)
        sync()

    def sequence() -> None:
        """The block's (or the row's) whole recurrence."""
        u0 = Loop("u0")

        def init() -> None:
            em.line(f"{at(hs, hid, u0)} = {load(h0, (seq, u0))};")
            if c0 is not None:
                em.line(f"{at(cs, hid, u0)} = {load(c0, (seq, u0))};")

        units(u0, init)
        sync()
        em.for_loop(s, steps, step)

    def arrays() -> None:
        parts = [(hs, 2 * hid), (gs, cols)] + ([(cs, hid)] if c0 is not None else []) + ([(rh, hid)] if before else [])
        for arr, width in parts:
            em.declare(f"{acc} {arr}[{rows * width}];", arr)

    if not team:

        def row(outer: tuple[Loop, ...]) -> None:
            em.scopes[-1].syms.add(first)
            em.declare(f"const int64_t {first.name} = {outer[0].name};", first.name)
            em.declare(f"const int64_t {q.name} = 0; (void){q.name};", q.name)
            em.scopes[-1].syms.add(q)
            arrays()
            sequence()

        em.rows_loop([batch], "65536", row)
        return

    # the team schedule: shared state in the kernel's frame, one team per block of sequences
    arrays()
    b = em.args.ref(batch)

    def block() -> None:
        em.declare(f"const int64_t {nb} = std::min<int64_t>({rows}, {b} - {first.name});", nb)

        def member() -> None:
            em.line(DECLS)
            em.line("int64_t round_ = 0;")
            share = f"((({hid} + tsz_ - 1) / tsz_ + {UNIT_ALIGN - 1}) / {UNIT_ALIGN} * {UNIT_ALIGN})"
            em.declare(f"const int64_t {ulo} = std::min<int64_t>({hid}, int64_t(tm_) * {share});", ulo)
            em.declare(f"const int64_t {uhi} = std::min<int64_t>({hid}, {ulo} + {share});", uhi)
            sequence()

        scoped(["bpk::team_run(st, [&](int tm_, int tsz_, bpk::Team& team_) {"], [], member, "});")

    scoped([f"for (int64_t {first.name} = 0; {first.name} < {b}; {first.name} += {rows}) {{"], [first], block)
