"""The CUDA backend's emitter: `CudaEmitter`, the index algebra of `Emitter` with GPU memory access.

In: a kernel spec and its context (as every emitter). Out: the emitter the CUDA schedules
(cuda_emitter.py) and the convolution kernels (cuda_conv.py) drive: vector loads across the lanes of
a thread, stores, error reports with the kernel's index (Note [CUDA error codes]), one thread per row
for the shared reduce / scan kernels, warp and block reductions over a row, and the row cache of Note
[Row cache] read back in place of recomputation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from bladepack.codegen.c_render import CTYPE, Args, Loop, literal
from bladepack.codegen.emitter import RowBody
from bladepack.codegen.kernel import KernelContext
from bladepack.codegen.row_emitter import RowEmitter
from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import KernelSpec
from bladepack.ir.ops import NormAttrs
from bladepack.ir.types import IRDim
from bladepack.ir.views import View, simplify

# memory types of pointers (registers use c_render.CTYPE; Note [Register types])
MEMTYPE = {**CTYPE, DType.FLOAT16: "__half", DType.BFLOAT16: "__nv_bfloat16"}

# Note [CUDA error codes]: a launch's status words hold the first error; its code is the CPU emitter's
# (ERR_INDEX + 16 x error site) plus the kernel's index in the CUDA plan shifted left by KERNEL_SHIFT,
# so the loader names the kernel without knowing which launch failed.
KERNEL_SHIFT = 24

# Note [Narrow index division]: a 64-bit integer division or remainder is a few dozen instructions on
# an NVIDIA GPU (no hardware divider; a 32-bit one is a handful), and a kernel over [batch, seq, hidden]
# with a dynamic seq splits each thread's position with one such pair per dynamic dim — for an
# elementwise kernel moving 16-48 bytes a thread, as much issue time as its memory traffic. Where the
# declared ranges prove every position of the split below 2^31 (ShapeEnv: `proven_le`), the split
# divides in 32 bits (exact: both operands fit, positions are never negative); otherwise the kernel tests
# the size once (the same answer in every thread: no divergence) and divides in 32 bits where it holds,
# in 64 where it does not.
INT32_MAX = (1 << 31) - 1
# the shared memory bpk::block_all combines a block's warps in (up to 32 values of up to 24 bytes)
BLOCK_SCRATCH = "__shared__ double bpk_scratch[3 * 32];"
# Note [Split reductions] (cuda_emitter.py): threads of a block sharing its outputs' reductions, and
# the output count below which a block takes one output (and Note [Grid reductions] splits it further)
SPLIT_THREADS = 256
SPLIT_OUTS = 32
REDUCE_FUNCTORS = {"sum": "bpk::Sum()", "prod": "bpk::Prod()", "max": "bpk::Max()", "min": "bpk::Min()"}


def accumulator(n: Node) -> DType:
    """The type a CUDA reduction of `n` accumulates in (Note [Register types]): float32 for float32 /
    float16 / bfloat16, float64 for float64, int64 for integer sums and products."""
    dt = n.type.dtype
    wide = DType.FLOAT64 if dt is DType.FLOAT64 else DType.FLOAT32
    if n.op in (OpKind.SUM, OpKind.MEAN, OpKind.PROD):
        return wide if dt.is_floating else DType.INT64
    return wide if dt.is_floating else dt


@dataclass(frozen=True)
class TileLoad:
    """Note [Transpose tiles] (cuda_emitter.py): loads of buffer `base` at `rest + k + stride * j` read
    `read`, the block's shared-memory tile element of the current (k, j), instead of global memory."""

    base: int
    rest: sympy.Expr
    k: Loop
    j: Loop
    stride: sympy.Expr
    read: str


def volume(shape: Sequence[IRDim]) -> IRDim:
    out: IRDim = 1
    for d in shape:
        out = simplify(out * d)
    return out


def inner_syms(spec: KernelSpec) -> tuple[Loop, ...]:
    """The symbols of a row's position (the reduced trailing dims)."""
    r = len(spec.domain) - spec.reduced
    return tuple(Loop(f"r{r + m}") for m in range(spec.reduced))


class CudaEmitter(RowEmitter):
    def __init__(
        self, spec: KernelSpec, ctx: KernelContext, args: Args, stores: list[int], loads: list[View], index: int = 0
    ) -> None:
        super().__init__(spec, ctx, args, stores, loads)
        self.index = index
        self.lane: Loop | None = None
        self.width = 1
        self.thread = "threadIdx.x"  # the row schedules' thread index within the row and its stride
        self.stride = "blockDim.x"
        self.block_reduce = False
        self.cache: tuple[int, tuple[sympy.Expr, ...], str] | None = None  # (value, row index, C array)
        self.cache_ready = False
        self.position = ""  # C expression of the element's position within the row (row loops)
        self.row_width = 1  # Note [Row vectors]: consecutive elements of a row per thread and step
        # Note [Rows in registers]: with `steps` > 0 a thread walks its part of the row in that many
        # unrolled steps (`ragged`: the last may fall outside the row), so per-step values can live in
        # registers; 0: a strided loop over the row
        self.steps = 0
        self.ragged = True
        self.uses_barriers = False
        # Note [Split reductions]: (outputs a block computes at once, threads sharing each output's
        # reduction) for a reduce kernel whose outputs are few; None: a thread per output
        self.shares: tuple[int, int] | None = None
        # Note [Grid reductions] (cuda_grid_reduce.py): (C expression of the blocks sharing each output,
        # the workspace value their parts go to) for the "_grid" variant of a reduce kernel; None: a
        # block computes whole outputs
        self.grid: tuple[str, int] | None = None
        self._rows = ""  # the split schedule's output count (C), for its stores' guard
        self.tile: TileLoad | None = None  # Note [Transpose tiles]: the load the block's tile serves
        self.probe: list[tuple[int, DType, sympy.Expr]] | None = None  # loads seen (a dry run records them)

    def narrow(self, dims: Sequence[IRDim]) -> bool | str:
        """Note [Narrow index division]: True where every row-major position in `dims` is below 2^31 at
        every shape in the declared ranges; else the C condition saying so at run time."""
        size = volume(dims)
        if self.ctx.proven_le(size, INT32_MAX):
            return True
        return f"{self.args.ref(size)} <= {INT32_MAX}"

    # -- memory
    def load(self, base: int, dt: DType, off: sympy.Expr, syms: set[sympy.Symbol], key: Any) -> str:
        if self.probe is not None:
            self.probe.append((base, dt, off))
        t = self.tile
        if t is not None and base == t.base and sympy.expand(off - t.rest - t.k - t.stride * t.j) == 0:
            return self.define(CTYPE[dt], t.read, syms, key)
        p = self.ptr_load(base)
        lane = self.lane
        if lane is not None and self.width > 1 and lane in off.free_symbols:
            rest = sympy.expand(off - lane)
            if self._vector_ok(lane, rest):  # contiguous across the lanes: one vector load
                vkey = ("vec", base, rest)
                buf = self.lookup(vkey)
                if buf is None:
                    buf = self.fresh("b")
                    stmt = f"{CTYPE[dt]} {buf}[{self.width}]; bpk::ldv<{self.width}>({buf}, {p} + {self.args.index(rest)});"
                    self.define_stmt(stmt, buf, syms - {lane}, vkey)
                return self.define(CTYPE[dt], f"{buf}[{lane.name}]", syms, key)
        return self.define(CTYPE[dt], f"bpk::ld({p} + {self.args.index(off)})", syms, key)

    def _vector_ok(self, lane: Loop, rest: sympy.Expr) -> bool:
        """A vector load at `rest` is hoisted above the lane loop: only when `rest` is known there and
        no branch (concat, pad: its guard may exclude some lanes' elements) lies between."""
        pos = next(k for k, s in enumerate(self.scopes) if lane in s.syms)
        if any(s.barrier for s in self.scopes[pos:]):
            return False
        known: set[sympy.Symbol] = set().union(*(s.syms for s in self.scopes[:pos]))
        return all(s in known for s in rest.free_symbols if isinstance(s, Loop))

    def store(self, vid: int, off: sympy.Expr, val: str) -> None:
        st = f"bpk::st({self.ptr_store(vid)} + {self.args.index(off)}, {val});"
        if self.shares is not None:  # Note [Split reductions]: the first sharer of a real output stores
            st = f"if (g_ == 0 && b_ + l_ < {self._rows}) {st}"
        self.line(st)

    def fail(self, code: str, value: str, size: str) -> str:
        return f"bpk::fail(st, ({code}) + {self.index << KERNEL_SHIFT}LL, {value}, {size});"

    def accumulator(self, n: Node) -> DType:
        return accumulator(n)

    def eval(self, vid: int, idx: tuple[sympy.Expr, ...]) -> str:
        c = self.cache
        if c is not None and self.cache_ready and vid == c[0] and tuple(sympy.sympify(i) for i in idx) == c[1]:
            syms = {s for e in idx for s in sympy.sympify(e).free_symbols if isinstance(s, Loop)}
            return self.define(CTYPE[self.ctx.types[vid].dtype], f"{c[2]}[{self.position}]", syms, ("cache", c[1]))
        return super().eval(vid, idx)

    # -- schedules shared with the CPU emitter's reduce and scan kernels: one thread per row
    def rows_loop(self, outer_dims: Sequence[IRDim], cost: str, body: RowBody, chunk_setup: Sequence[str] = ()) -> None:
        assert not chunk_setup, "CUDA rows are threads: no per-chunk scratch"
        if self.shares is not None:
            self._split_rows_loop(outer_dims, body)
            return
        syms = tuple(Loop(f"i{k}") for k in range(len(outer_dims)))
        rows = volume(outer_dims)
        header = [
            "for (int64_t t_ = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; "
            f"t_ < {self.args.ref(rows)}; t_ += int64_t(gridDim.x) * blockDim.x) {{"
        ]
        narrow = self.narrow(outer_dims)
        self.loop(header, syms, lambda: body(syms), prologue=split_index("t_", syms, outer_dims, self.args, narrow))

    def _split_rows_loop(self, outer_dims: Sequence[IRDim], body: RowBody) -> None:
        """Note [Split reductions]: a block computes `outs` consecutive outputs at once (block-strided
        over them), the rest of `shares` threads each: thread x takes output x % outs (its lane `l_`)
        and the share x / outs (`g_`) of its reduction. A block's last outputs past the end are computed again as the
        last one (every thread reaches the barriers; nothing is read out of range) and not stored."""
        assert self.shares is not None
        outs = self.shares[0]
        syms = tuple(Loop(f"i{k}") for k in range(len(outer_dims)))
        rows = self.args.ref(volume(outer_dims))
        self._rows = rows
        self.uses_barriers = True
        self.scopes[0].lines.append(f"const int l_ = int(threadIdx.x % {outs}u), g_ = int(threadIdx.x / {outs}u);")
        if self.grid is not None:  # Note [Grid reductions]: block b_ takes part p_ of output t_
            parts = self.grid[0]
            header = [f"for (int64_t b_ = blockIdx.x; b_ < {rows} * {parts}; b_ += gridDim.x) {{"]
            first = [f"const int64_t t_ = b_ / {parts}, p_ = b_ - t_ * {parts};"]
        else:
            header = [
                f"for (int64_t b_ = int64_t(blockIdx.x) * {outs}; b_ < {rows}; b_ += int64_t(gridDim.x) * {outs}) {{"
            ]
            first = [f"const int64_t t_ = b_ + l_ < {rows} ? b_ + l_ : {rows} - 1;"]
        narrow = self.narrow(outer_dims)
        self.loop(
            header, syms, lambda: body(syms), prologue=first + split_index("t_", syms, outer_dims, self.args, narrow)
        )

    def reduce_loops(self, syms: Sequence[Loop], extents: Sequence[IRDim], gen: Callable[[], None]) -> None:
        if self.shares is None:
            super().reduce_loops(syms, extents, gen)
            return
        # Note [Split reductions]: the output's reduced positions, row-major, strided over its sharers
        per = self.shares[1]
        total = self.args.ref(volume(extents))
        header = [f"for (int64_t r_ = g_; r_ < {total}; r_ += {per}) {{"]
        if self.grid is not None:  # Note [Grid reductions]: the parts interleave in steps of a block
            parts = self.grid[0]
            header = [f"for (int64_t r_ = p_ * {per} + g_; r_ < {total}; r_ += {parts} * {per}) {{"]
        self.loop(header, syms, gen, prologue=split_index("r_", syms, extents, self.args, self.narrow(extents)))

    def combine_shares(self, acc: str, kind: str, ctype: str) -> None:
        if self.shares is None:
            return
        outs, per = self.shares
        functor = REDUCE_FUNCTORS[kind]
        if outs == 1:  # the whole block shares one output: a tree over warps, then over the block
            self.line(BLOCK_SCRATCH)
            self.line(f"{acc} = bpk::block_all({acc}, {functor}, reinterpret_cast<{ctype}*>(bpk_scratch));")
            return
        part = self.fresh("part")  # each lane's sharers combined in their order
        self.line(f"__shared__ {ctype} {part}[{outs * per}];")
        self.line("__syncthreads();  // the last output's readers are done")
        self.line(f"{part}[threadIdx.x] = {acc};")
        self.line("__syncthreads();")
        self.line(f"{acc} = {part}[l_];")
        self.line(f"for (int q_ = 1; q_ < {per}; ++q_) {acc} = {functor}({acc}, {part}[q_ * {outs} + l_]);")

    def store_partial(self, acc: str) -> bool:
        if self.grid is None:
            return False
        # Note [Grid reductions]: part p_ of output t_ is workspace element b_ = t_ * parts + p_
        self.line(f"if (threadIdx.x == 0) {self.ptr_store(self.grid[1])}[b_] = {acc};")
        return True

    def block_rows_loop(self, outer_dims: Sequence[IRDim], body: RowBody) -> None:
        """One block per row (its threads cooperate: Note [Block sort]), block-strided over the rows."""
        syms = tuple(Loop(f"i{k}") for k in range(len(outer_dims)))
        rows = volume(outer_dims)
        header = [f"for (int64_t t_ = int64_t(blockIdx.x); t_ < {self.args.ref(rows)}; t_ += int64_t(gridDim.x)) {{"]
        self.uses_barriers = True
        narrow = self.narrow(outer_dims)
        self.loop(header, syms, lambda: body(syms), prologue=split_index("t_", syms, outer_dims, self.args, narrow))

    # -- row reductions across the threads of a warp or block
    def row_index(self) -> tuple[sympy.Expr, ...]:
        """The element's position in the row as the row loops index it: the reduced dims' symbols,
        the last shifted by the lane where the row is walked in vectors (Note [Row vectors])."""
        inner = inner_syms(self.spec)
        if self.row_width == 1:
            return inner
        return (*inner[:-1], inner[-1] + Loop("l0"))

    def _elements(
        self, gen: Callable[[tuple[sympy.Expr, ...]], None], after: Callable[[sympy.Expr], None] | None = None
    ) -> None:
        """The strided loop of this thread over the current row; `gen(the element's row index)` is its
        body. Note [Row vectors]: with `row_width` W > 1 (a one-axis row whose length W divides) each
        step takes W consecutive elements, so loads contiguous across them are one vector access;
        `after(the step's first position)` then runs once per step, after its W elements. Note [Rows in
        registers]: with `steps` set, the walk is that many unrolled steps (guarded where `ragged`) and
        `position` indexes the thread's register array (`s_ * W + l0`) instead of the row."""
        dom = self.spec.domain
        k = self.spec.reduced
        r = len(dom) - k
        inner = inner_syms(self.spec)
        length = self.args.ref(self._row_len())
        w = self.row_width
        q = inner[0].name if k == 1 else "q_"
        footer: tuple[str, ...] = ("}",)
        if self.steps:  # Note [Rows in registers]: unrolled steps, each guarded where the row may end
            first = f"({self.thread} + s_ * {self.stride})" + (f" * {w}" if w > 1 else "")
            header = [
                "#pragma unroll",
                f"for (int s_ = 0; s_ < {self.steps}; ++s_) {{",
                f"  const int64_t {q} = {first};",
            ]
            if self.ragged:
                header.append(f"  if ({q} < {length}) {{")
                footer = ("  }", "}")
            step = "s_"
        else:
            header = [f"for (int64_t {q} = {self.thread} * {w}; {q} < {length}; {q} += {self.stride} * {w}) {{"]
            if w == 1:
                header = [f"for (int64_t {q} = {self.thread}; {q} < {length}; {q} += {self.stride}) {{"]
            step = q
        if w > 1:
            assert k == 1, "row vectors walk one-axis rows"
            lane = Loop("l0")

            def lanes() -> None:
                saved = self.lane, self.width
                self.lane, self.width = lane, w
                self.position = f"({step} * {w} + l0)" if self.steps else f"({q} + l0)"
                self.loop(
                    ["#pragma unroll", f"for (int l0 = 0; l0 < {w}; ++l0) {{"], [lane], lambda: gen(self.row_index())
                )
                self.lane, self.width = saved
                if after is not None:
                    after(inner[0])

            self.loop(header, inner, lanes, footer=footer)
            return
        prologue = [] if k == 1 else split_index("q_", inner, dom[r:], self.args, self.narrow(dom[r:]))
        self.position = step
        assert after is None, "a scalar row walk has no steps of several elements"
        self.loop(header, inner, lambda: gen(inner), footer=footer, prologue=prologue)

    def reduce_pass(
        self,
        dt: DType,
        kind: str,
        body: Callable[[tuple[sympy.Expr, ...]], str],
        store: Callable[[tuple[sympy.Expr, ...], str], None] | None = None,
    ) -> str:
        assert store is None, "softmax in place is off on CUDA (registers or L2 serve the last pass)"
        acc = self._local_pass(dt, kind, body)
        self.scopes[1].lines.append(self._combine(acc, REDUCE_FUNCTORS[kind], CTYPE[dt]))
        return acc

    def _local_pass(self, dt: DType, kind: str, body: Callable[[tuple[sympy.Expr, ...]], str], count: str = "") -> str:
        """One pass of this thread over its elements of the row, combined into an accumulator at row
        scope (no other thread's elements: the caller combines across threads); `count`, a variable
        declared at row scope, counts the elements."""
        t = CTYPE[dt]
        acc, saved = self._pass_accumulator(dt, kind)
        functor = REDUCE_FUNCTORS[kind]
        tally = f" {count} += {t}(1);" if count else ""

        def step(inner: tuple[sympy.Expr, ...]) -> None:
            self.line(f"{acc} = {functor}({acc}, {t}({body((*self.outer, *inner))}));{tally}")

        self._elements(step)
        self.depth[acc] = 1
        self.scopes = saved
        return acc

    def _combine(self, var: str, functor: str, ctype: str) -> str:
        """The statement combining `var` over the row's threads (a warp's lanes or a block's threads)."""
        self.uses_barriers = True
        if self.block_reduce:
            return f"{var} = bpk::block_all({var}, {functor}, reinterpret_cast<{ctype}*>(bpk_scratch));"
        return f"{var} = bpk::warp_all({var}, {functor});"

    def _merged(self, kind: str, t: str, fields: Sequence[str]) -> str:
        """A `bpk::<kind><t>` of this thread's statistics `fields`, merged over the row's threads by
        `bpk::Merge<kind>` (Note [Row moments]); the C variable holding it."""
        v = self.fresh(kind.lower())
        self.scopes[1].lines.append(f"bpk::{kind}<{t}> {v} = {{{', '.join(fields)}}};")
        self.scopes[1].lines.append(self._combine(v, f"bpk::Merge{kind}()", f"bpk::{kind}<{t}>"))
        return v

    def _stats(self, n: Node) -> dict[str, str]:
        """Note [Row moments] (cuda_runtime.cuh): layer norm's mean and variance and a softmax's maximum
        and sum in one reduction across threads each; the other row ops as `RowEmitter` computes them."""
        if n.id in self.row_stats or n.op not in (OpKind.LAYER_NORM, OpKind.SOFTMAX, OpKind.LOG_SOFTMAX):
            return super()._stats(n)
        x = n.inputs[0]
        xt = self.ctx.types[x].dtype
        acc_t = self.accumulator(n)
        t = CTYPE[acc_t]
        row = self.scopes[1].lines

        def load(idx: tuple[sympy.Expr, ...]) -> str:
            return self._as(self.eval(x, idx), xt, acc_t)

        stats: dict[str, str] = {}
        if n.op is OpKind.LAYER_NORM:
            assert isinstance(n.attrs, NormAttrs)
            count = self.fresh("count")
            row.append(f"{t} {count} = {t}(0);")
            self.depth[count] = 1
            total = self._local_pass(acc_t, "sum", load, count)
            length = self.args.ref(self._row_len())
            mine = self.fresh("mean")
            row.append(f"const {t} {mine} = {count} > {t}(0) ? {total} / {count} : {t}(0);")
            m2 = self._local_pass(acc_t, "sum", lambda idx: f"(({load(idx)} - {mine}) * ({load(idx)} - {mine}))")
            mo = self._merged("Moments", t, (count, total, m2))
            mean, rstd = self.fresh("mean"), self.fresh("rstd")
            eps = literal(n.attrs.eps, acc_t)
            row.append(f"const {t} {mean} = {mo}.sum / {t}({length});")
            row.append(f"const {t} {rstd} = {t}(1) / std::sqrt({mo}.m2 / {t}({length}) + {eps});")
            stats["mean"], stats["rstd"] = mean, rstd
        else:
            m = self._local_pass(acc_t, "max", load)
            # exp(x - max) of a thread whose elements are all -inf (or that has none) is 0, not NaN
            lowest = literal(-math.inf, acc_t)
            safe = self.fresh("m")
            row.append(f"const {t} {safe} = {m} == {lowest} ? {t}(0) : {m};")
            s = self._local_pass(acc_t, "sum", lambda idx: f"bpk::vexp_nonpos({load(idx)} - {safe})")
            ms = self._merged("MaxSum", t, (m, s))
            top, masked = self._safe_max(n, acc_t, f"{ms}.max")
            stats = self._softmax_stats(n, acc_t, top, f"{ms}.sum", masked)
        self.row_stats[n.id] = stats
        return stats


def split_index(
    var: str, syms: Sequence[Loop], dims: Sequence[IRDim], args: Args, narrow: bool | str = False
) -> list[str]:
    """Statements defining `syms` (row-major position in `dims`) from the linear index `var`. Note
    [Narrow index division]: `narrow` True (every position proven below 2^31) divides in 32 bits; a C
    condition divides in 32 bits where it holds at run time, in 64 where not."""
    if not syms:
        return []
    if len(syms) == 1:
        return [f"const int64_t {syms[0].name} = {var};"]
    if narrow is False:
        return _split(var, syms, dims, args, "int64_t", "const int64_t ")
    if narrow is True:
        return _split(var, syms, dims, args, "uint32_t", "const int64_t ")
    out = [f"int64_t {', '.join(s.name for s in syms)};", f"if ({narrow}) {{"]
    out += ["  " + ln for ln in _split(var, syms, dims, args, "uint32_t", "")]
    out.append("} else {")
    out += ["  " + ln for ln in _split(var, syms, dims, args, "int64_t", "")]
    out.append("}")
    return out


def _split(var: str, syms: Sequence[Loop], dims: Sequence[IRDim], args: Args, t: str, decl: str) -> list[str]:
    out = [f"{t} s_{var} = {t}({var});"]
    for k in range(len(syms) - 1, 0, -1):
        d = args.ref(dims[k])
        out.append(f"{decl}{syms[k].name} = int64_t(s_{var} % {t}({d})); s_{var} /= {t}({d});")
    out.append(f"{decl}{syms[0].name} = int64_t(s_{var});")
    return out
