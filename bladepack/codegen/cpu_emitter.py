"""The CPU emitter: one C++ function per kernel variant, from a `KernelSpec`.

In: a kernel spec of the fusion plan, the graph, and a function giving the strided view of each
materialized value. Out: `EmittedKernel` — the C++ source of every variant, the predicate (sympy) that
selects each variant at run time, and the argument list all variants share: pointers (stored values
first, then the buffers read), then int64 arguments (shape expressions; see c_render.Args).

How a kernel reads: a value is evaluated at an index (a tuple of sympy expressions over the loop
symbols). Materialized values and layout chains over them are strided loads; elementwise ops evaluate
their operands at the broadcast-adjusted index; permute / slice / expand / reshape transform the index
(Note [Reshape of a strided view] in optimize/views.py says when that stays affine); concat and pad
branch; take / gather load an index and check it. Every (value, index) pair is computed once and placed
in the outermost loop where all its symbols are defined (loop-invariant code motion by construction).

Schedules: loop kernels run rows (all dims but the last) in parallel and the last dim as the inner,
vectorizable loop. Row kernels run one row per iteration: each reduction is a pass over the row
(`#pragma omp simd reduction`, honoured through -fopenmp-simd with no OpenMP runtime, so the compiler
may reassociate just these sums), then one pass writes the results.

Variants (chosen per input shape by the shape program, first true predicate wins):
- loop kernels: inner extent >= 8 -> SIMD inner loop; shorter -> scalar loop without vector prologue
  and epilogue (vector width from the innermost extent);
- row kernels: rows of >= 16 elements -> SIMD reduction passes; shorter rows -> scalar passes
  (reduction schedule from the row length).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from bladepack.codegen.c_render import COMPARE, CTYPE, Args, Loop, binary, literal, promote, unary
from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind
from bladepack.ir.ops import (
    OP_INFO,
    ArangeAttrs,
    ArgReduceAttrs,
    AxisAttrs,
    ConstantAttrs,
    IndexAttrs,
    NormAttrs,
    OpClass,
    PadAttrs,
    PermuteAttrs,
    Pool2dAttrs,
    ReduceAttrs,
    SliceAttrs,
)
from bladepack.ir.types import IRDim, TensorType
from bladepack.optimize.fusion import KernelSpec
from bladepack.optimize.views import LAYOUT_OPS, View, contiguous_strides, reshape_groups, simplify, sym_eq

# error codes a kernel reports through RunState::fail (the loader turns them into messages)
ERR_INDEX = 1

_FLOATS = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)
_VAR = re.compile(r"\b[a-z]+\d+\b")


class KernelEmitError(ValueError):
    """A kernel could not be generated; `nodes` are the IR nodes it covered."""

    def __init__(self, message: str, nodes: frozenset[int]) -> None:
        super().__init__(message)
        self.nodes = nodes


@dataclass
class EmittedKernel:
    name: str
    spec: KernelSpec
    variants: list[tuple[str, Any]]  # (C function name, sympy predicate)
    stores: list[int]  # value ids written, in pointer order
    loads: list[View]  # buffers read (base value ids), in pointer order after the stores
    args: Args
    source: str
    error_sites: list[str] = field(default_factory=list)  # per error site: what failed, for messages


class _Scope:
    def __init__(self, syms: Sequence[sympy.Symbol] = (), barrier: bool = False) -> None:
        self.syms = set(syms)
        self.barrier = barrier
        self.lines: list[str] = []
        self.memo: dict[Any, str] = {}


@dataclass(frozen=True)
class KernelContext:
    nodes: dict[int, Node]
    types: dict[int, TensorType]
    view: Callable[[int], View | None]  # strided view of a value over a materialized buffer, if any


def _cost(nodes: Sequence[Node]) -> int:
    heavy = {OpKind.EXP, OpKind.LOG, OpKind.TANH, OpKind.ERF, OpKind.GELU, OpKind.SIGMOID, OpKind.SILU, OpKind.POW}
    return 1 + sum(8 if n.op in heavy else 1 for n in nodes)


class _Emitter:
    def __init__(self, spec: KernelSpec, ctx: KernelContext, args: Args, stores: list[int], loads: list[View]) -> None:
        self.spec, self.ctx, self.args = spec, ctx, args
        self.stores, self.loads = stores, loads
        self.inside = set(spec.nodes)
        self.scopes: list[_Scope] = [_Scope()]
        self.tmp = 0
        self.row_stats: dict[int, dict[str, str]] = {}
        self.outer: tuple[sympy.Expr, ...] = ()
        self.simd = False
        self.error_sites: list[str] = []
        self.row_ops: set[int] = set()
        self.softmax_in_place: int | None = None  # Note [Softmax in place]
        self.depth: dict[str, int] = {}  # scope depth of each C variable defined so far

    # -- scopes and statements
    def fresh(self, prefix: str = "v") -> str:
        self.tmp += 1
        return f"{prefix}{self.tmp}"

    def _target(self, syms: set[sympy.Symbol]) -> int:
        """Index of the outermost scope where `syms` are all defined, not crossing a barrier."""
        k = len(self.scopes) - 1
        # never above the row loop: values defined outside the parallel body would reach it only
        # through the lambda's by-reference captures (Note [Restrict inside the parallel body])
        while k > 1 and not self.scopes[k].barrier:
            defined = set().union(*(s.syms for s in self.scopes[:k]))
            if not syms <= defined:
                break
            k -= 1
        return k

    def define(self, ctype: str, expr: str, syms: set[sympy.Symbol], key: Any = None) -> str:
        name = self.fresh()
        self.define_stmt(f"const {ctype} {name} = {expr};", name, syms, key)
        return name

    def define_stmt(self, stmt: str, name: str, syms: set[sympy.Symbol], key: Any = None) -> None:
        """Place `stmt` (defining C variable `name`) in the outermost scope where `syms` are defined,
        never above a variable it reads."""
        k = self._target(syms)
        k = max([k, *(self.depth.get(tok, 0) for tok in _VAR.findall(stmt) if tok != name)])
        self.scopes[k].lines.append(stmt)
        self.depth[name] = k
        if key is not None:
            self.scopes[k].memo[key] = name

    def declare(self, text: str, name: str) -> None:
        """A statement in the current scope that defines the C variable `name`."""
        self.line(text)
        self.depth[name] = len(self.scopes) - 1

    def loop(
        self,
        header: Sequence[str],
        syms: Sequence[sympy.Symbol],
        gen: Callable[[], None],
        footer: Sequence[str] = ("}",),
        prologue: Sequence[str] = (),
    ) -> None:
        """Emit a loop: its body is generated first, so statements hoisted out of it land before it."""
        s = self.push(syms)
        s.lines.extend(prologue)
        gen()
        self.pop()
        pad = "  " * max(1, len(header))
        self.scopes[-1].lines.extend(header)
        self.scopes[-1].lines.extend(pad + ln for ln in s.lines)
        self.scopes[-1].lines.extend(footer)

    def lookup(self, key: Any) -> str | None:
        for s in reversed(self.scopes):
            if key in s.memo:
                return s.memo[key]
        return None

    def line(self, text: str) -> None:
        self.scopes[-1].lines.append(text)

    def push(self, syms: Sequence[sympy.Symbol] = (), barrier: bool = False) -> _Scope:
        s = _Scope(syms, barrier)
        self.scopes.append(s)
        return s

    def pop(self) -> _Scope:
        return self.scopes.pop()

    # -- pointers
    def ptr_load(self, base: int) -> str:
        for k, v in enumerate(self.loads):
            if v.base == base:
                return f"p{len(self.stores) + k}"
        self.loads.append(View.whole(base, self.ctx.types[base].shape))
        return f"p{len(self.stores) + len(self.loads) - 1}"

    def ptr_store(self, vid: int) -> str:
        return f"p{self.stores.index(vid)}"

    def store(self, vid: int, off: sympy.Expr, val: str) -> None:
        """Write `val` (a register value of vid's type) to element `off` of vid's buffer."""
        self.line(f"{self.ptr_store(vid)}[{self.args.index(off)}] = {val};")

    def rows_loop(self, outer_dims: Sequence[IRDim], cost: str, body: Callable[[tuple[Loop, ...]], None]) -> None:
        """Run `body` once per row of `outer_dims` (the schedule's parallel loop)."""
        _rows_loop(self, outer_dims, cost, body)

    # -- evaluation
    def eval(self, vid: int, idx: tuple[sympy.Expr, ...]) -> str:
        idx = tuple(sympy.sympify(i) for i in idx)
        key = (vid, idx)
        hit = self.lookup(key)
        if hit is not None:
            return hit
        syms: set[sympy.Symbol] = set()
        for e in idx:
            syms |= {s for s in e.free_symbols if isinstance(s, Loop)}
        t = self.ctx.types[vid]
        in_memory = vid not in self.inside or (
            self.ctx.nodes[vid].op in LAYOUT_OPS and self.ctx.view(vid) is not None and vid not in self.stores
        )
        if in_memory:
            view = self.ctx.view(vid)
            assert view is not None, f"value %{vid} is neither computed in {self.spec.name} nor in memory"
            off = view.offset + sum((i * s for i, s in zip(idx, view.strides)), sympy.Integer(0))
            return self.load(view.base, t.dtype, sympy.expand(off), syms, key)
        n = self.ctx.nodes[vid]
        expr = self._node(n, idx)
        return self.define(CTYPE[t.dtype], expr, syms, key)

    def load(self, base: int, dt: DType, off: sympy.Expr, syms: set[sympy.Symbol], key: Any) -> str:
        """A C variable holding element `off` of the materialized buffer `base`."""
        return self.define(CTYPE[dt], f"{self.ptr_load(base)}[{self.args.index(off)}]", syms, key)

    def fail(self, code: str, value: str, size: str) -> str:
        """C statement reporting an error (the kernel goes on with a safe value)."""
        return f"st->fail({code}, {value}, {size});"

    def accumulator(self, n: Node) -> DType:
        return _accumulator(n)

    def _bcast(self, operand: int, out_shape: Sequence[IRDim], idx: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
        shape = self.ctx.types[operand].shape
        lead = len(out_shape) - len(shape)
        return tuple(
            sympy.Integer(0) if (d == 1 and out_shape[k + lead] != 1) else idx[k + lead] for k, d in enumerate(shape)
        )

    def _as(self, x: str, src: DType, dst: DType) -> str:
        if src is dst:
            return x
        if dst is DType.BOOL:
            return f"({x} != 0)"
        return f"{CTYPE[dst]}({x})"

    def operand(self, n: Node, k: int, idx: tuple[sympy.Expr, ...], as_type: DType | None = None) -> str:
        v = n.inputs[k]
        x = self.eval(v, self._bcast(v, n.type.shape, idx))
        return self._as(x, self.ctx.types[v].dtype, as_type) if as_type is not None else x

    def _node(self, n: Node, idx: tuple[sympy.Expr, ...]) -> str:
        dt = n.type.dtype
        op = n.op
        cls = OP_INFO[op].op_class
        if op in (OpKind.CONSTANT, OpKind.FULL):
            assert isinstance(n.attrs, ConstantAttrs)
            v = n.attrs.value
            if isinstance(v, sympy.Basic):
                return self._as(self.args.ref(v), DType.INT64, dt)
            return literal(v, dt)
        if op is OpKind.ARANGE:
            assert isinstance(n.attrs, ArangeAttrs)
            i = self.args.index(idx[0])
            start, step = n.attrs.start, n.attrs.step
            if isinstance(start, float) or isinstance(step, float):
                return self._as(f"(double({start!r}) + double({step!r}) * double({i}))", DType.FLOAT64, dt)
            return self._as(f"({self.args.ref(start)} + {self.args.ref(step)} * {i})", DType.INT64, dt)
        if op is OpKind.WHERE:
            c = self.operand(n, 0, idx, DType.BOOL)
            a = self.operand(n, 1, idx, dt)
            b = self.operand(n, 2, idx, dt)
            return f"({c} ? {a} : {b})"
        if op in COMPARE:
            ct = promote([self.ctx.types[i].dtype for i in n.inputs])
            return binary(op, self.operand(n, 0, idx, ct), self.operand(n, 1, idx, ct), dt)
        if cls is OpClass.BROADCAST and len(n.inputs) == 2:
            ct = dt
            return binary(op, self.operand(n, 0, idx, ct), self.operand(n, 1, idx, ct), dt)
        if cls is OpClass.ELEMENTWISE and len(n.inputs) == 1:
            src = self.ctx.types[n.inputs[0]].dtype
            x = self.operand(n, 0, idx)
            if op is OpKind.CAST:
                return self._as(x, src, dt)
            if op in (OpKind.LOGICAL_NOT,):
                return f"(!{self._as(x, src, DType.BOOL)})"
            return unary(op, self._as(x, src, dt), dt, n.attrs)
        if op is OpKind.RESHAPE:
            return self.eval(n.inputs[0], self._reshape_index(n, idx))
        if op is OpKind.EXPAND:
            return self.eval(n.inputs[0], self._bcast(n.inputs[0], n.type.shape, idx))
        if op is OpKind.PERMUTE:
            assert isinstance(n.attrs, PermuteAttrs)
            src_idx: list[sympy.Expr] = [sympy.Integer(0)] * len(idx)
            for k, p in enumerate(n.attrs.perm):
                src_idx[p] = idx[k]
            return self.eval(n.inputs[0], tuple(src_idx))
        if op is OpKind.SLICE:
            assert isinstance(n.attrs, SliceAttrs)
            ax = n.attrs.axis
            sl = list(idx)
            sl[ax] = sympy.sympify(n.attrs.start) + n.attrs.step * idx[ax]
            return self.eval(n.inputs[0], tuple(sl))
        if op is OpKind.CONCAT:
            return self._concat(n, idx)
        if op is OpKind.PAD:
            return self._pad(n, idx)
        if op in (OpKind.TAKE, OpKind.GATHER, OpKind.INDEX):
            return self._gather(n, idx)
        if n.id in self.row_ops:
            return self._row_value(n, idx)
        raise ValueError(f"the CPU emitter cannot compute {op.value} inside a {self.spec.kind} kernel")

    def _reshape_index(self, n: Node, idx: tuple[sympy.Expr, ...]) -> tuple[sympy.Expr, ...]:
        src = self.ctx.types[n.inputs[0]].shape
        dst = n.type.shape
        groups = reshape_groups(src, dst)
        out: list[sympy.Expr] = [sympy.Integer(0)] * len(src)
        if groups is None:  # one group: linearize fully
            groups = [(list(range(len(src))), list(range(len(dst))))]
        for ins, outs in groups:
            lin = sympy.Integer(0)
            for k in outs:
                lin = lin * dst[k] + idx[k]
            lin = sympy.expand(lin)
            inner: IRDim = 1
            for pos, k in enumerate(reversed(ins)):
                q = lin if inner == 1 else sympy.floor(lin / inner)
                out[k] = q if pos == len(ins) - 1 else sympy.Mod(q, src[k])
                inner = simplify(inner * src[k])
        return tuple(out)

    def _branch(self, ctype: str, cases: list[tuple[str, Callable[[], str]]], default: Callable[[], str]) -> str:
        """if / else-if chain; each branch computes its value inside a barrier scope."""
        if not cases:
            return default()
        name = self.fresh()
        self.declare(f"{ctype} {name};", name)
        heads = [f"if ({cases[0][0]})" if k == 0 else f"else if ({c})" for k, (c, _) in enumerate(cases)]
        for head, fn in zip([*heads, "else"], [*(f for _, f in cases), default]):
            self.line(f"{head} {{")
            s = self.push(barrier=True)
            val = fn()
            self.pop()
            self.scopes[-1].lines.extend("  " + ln for ln in s.lines)
            self.line(f"  {name} = {val};")
            self.line("}")
        return name

    def _concat(self, n: Node, idx: tuple[sympy.Expr, ...]) -> str:
        assert isinstance(n.attrs, AxisAttrs)
        a = n.attrs.axis % len(idx)
        dt = n.type.dtype
        bounds: list[IRDim] = []
        acc: IRDim = 0
        for v in n.inputs:
            acc = simplify(acc + self.ctx.types[v].shape[a])
            bounds.append(acc)
        ia = self.args.index(idx[a])
        cases: list[tuple[str, Callable[[], str]]] = []
        start: IRDim = 0
        for k, v in enumerate(n.inputs[:-1]):
            j = list(idx)
            j[a] = sympy.expand(idx[a] - start)
            cases.append((f"{ia} < {self.args.ref(bounds[k])}", self._thunk(v, tuple(j), dt)))
            start = bounds[k]
        j = list(idx)
        j[a] = sympy.expand(idx[a] - start)
        return self._branch(CTYPE[dt], cases, self._thunk(n.inputs[-1], tuple(j), dt))

    def _thunk(self, v: int, idx: tuple[sympy.Expr, ...], dt: DType) -> Callable[[], str]:
        return lambda: self._as(self.eval(v, idx), self.ctx.types[v].dtype, dt)

    def _pad(self, n: Node, idx: tuple[sympy.Expr, ...]) -> str:
        assert isinstance(n.attrs, PadAttrs)
        src = self.ctx.types[n.inputs[0]].shape
        conds = []
        j = list(idx)
        for k, (before, _after) in enumerate(n.attrs.pads):
            if before == 0 and _after == 0:
                continue
            shifted = sympy.expand(idx[k] - before)
            i = self.args.index(idx[k])
            conds.append(f"{i} >= {self.args.ref(before)} && {i} < {self.args.ref(simplify(src[k] + before))}")
            j[k] = shifted
        dt = n.type.dtype
        if not conds:
            return self.eval(n.inputs[0], tuple(j))
        fill = literal(n.attrs.value, dt)
        return self._branch(CTYPE[dt], [(" && ".join(conds), self._thunk(n.inputs[0], tuple(j), dt))], lambda: fill)

    def _checked_index(self, raw: str, size: IRDim, what: str) -> Loop:
        """A runtime index symbol holding `raw` wrapped (negative from the end) and bounds-checked."""
        sz = self.args.ref(size)
        self.error_sites.append(what)
        site = len(self.error_sites) - 1
        sym = Loop(self.fresh("g"))
        self.declare(f"int64_t {sym.name} = int64_t({raw});", sym.name)
        self.line(f"if ({sym.name} < 0) {sym.name} += {sz};")
        report = self.fail(f"{ERR_INDEX} + 16 * {site}", f"int64_t({raw})", sz)
        self.line(f"if ({sym.name} < 0 || {sym.name} >= {sz}) {{ {report} {sym.name} = 0; }}")
        self.scopes[-1].syms.add(sym)
        return sym

    def _gather(self, n: Node, idx: tuple[sympy.Expr, ...]) -> str:
        x = n.inputs[0]
        xshape = self.ctx.types[x].shape
        if n.op is OpKind.TAKE:
            assert isinstance(n.attrs, AxisAttrs)
            a = n.attrs.axis % len(xshape)
            r = self.ctx.types[n.inputs[1]].rank
            raw = self.eval(n.inputs[1], idx[a : a + r])
            g = self._checked_index(raw, xshape[a], f"take along dimension {a}")
            return self.eval(x, (*idx[:a], g, *idx[a + r :]))
        if n.op is OpKind.GATHER:
            assert isinstance(n.attrs, AxisAttrs)
            a = n.attrs.axis % len(xshape)
            raw = self.eval(n.inputs[1], idx)
            g = self._checked_index(raw, xshape[a], f"gather along dimension {a}")
            j = list(idx)
            j[a] = g
            return self.eval(x, tuple(j))
        assert isinstance(n.attrs, IndexAttrs)
        axes = list(n.attrs.axes)
        b_rank = n.type.rank - (len(xshape) - len(axes))
        lead = idx[axes[0] : axes[0] + b_rank]
        bshape = n.type.shape[axes[0] : axes[0] + b_rank]
        src: list[sympy.Expr] = list(idx[: axes[0]])
        for k, t in enumerate(n.inputs[1:]):
            tshape = self.ctx.types[t].shape
            off = len(bshape) - len(tshape)
            ti = tuple(
                sympy.Integer(0) if d == 1 and bshape[off + m] != 1 else lead[off + m] for m, d in enumerate(tshape)
            )
            raw = self.eval(t, ti)
            if self.ctx.types[t].dtype is DType.BOOL:
                raise ValueError("boolean mask indexing has a data-dependent shape")
            src.append(self._checked_index(raw, xshape[axes[k]], f"indexing along dimension {axes[k]}"))
        src.extend(idx[axes[0] + b_rank :])
        return self.eval(x, tuple(src))

    # -- row ops
    def _row_len(self) -> IRDim:
        k = self.spec.reduced
        length: IRDim = 1
        for d in self.spec.domain[len(self.spec.domain) - k :]:
            length = simplify(length * d)
        return length

    def reduce_pass(
        self,
        dt: DType,
        kind: str,
        body: Callable[[tuple[sympy.Expr, ...]], str],
        store: Callable[[tuple[sympy.Expr, ...], str], None] | None = None,
    ) -> str:
        """One pass over the current row, combining `body` with `kind` ("sum", "prod", "max", "min");
        returns the C variable holding the result. With `self.simd` the innermost loop carries
        `#pragma omp simd reduction(...)` (max / min track NaN in a separate flag, like torch).
        `store(idx, var)` may also write each element's value (`var`) in the same pass."""
        t = CTYPE[dt]
        dom = self.spec.domain
        k = self.spec.reduced
        inner = [Loop(f"r{len(dom) - k + m}") for m in range(k)]
        saved = self.scopes
        self.scopes = saved[:2]  # passes are emitted at row scope, whatever scope asked for them
        acc = self.fresh("acc")
        floats = dt in _FLOATS
        self.declare(f"{t} {acc} = {reduce_init(kind, dt)};", acc)
        track_nan = kind in ("max", "min") and floats
        if track_nan:
            self.declare(f"int {acc}_nan = 0;", acc + "_nan")
        full = (*self.outer, *inner)
        op = {"sum": "+", "prod": "*", "max": "max", "min": "min"}[kind]

        def innermost() -> None:
            v = body(full)
            if store is not None:
                named = self.fresh("e")
                self.line(f"const {t} {named} = {v};")
                store(full, named)
                v = named
            if kind == "sum":
                self.line(f"{acc} = {acc} + {v};")
            elif kind == "prod":
                self.line(f"{acc} = {acc} * {v};")
            else:
                cmp = ">" if kind == "max" else "<"
                self.line(f"{acc} = {v} {cmp} {acc} ? {v} : {acc};")
                if track_nan:
                    self.line(f"{acc}_nan = {acc}_nan | int({v} != {v});")

        def nest(m: int) -> None:
            sym = inner[m]
            header = [
                f"for (int64_t {sym.name} = 0; {sym.name} < {self.args.ref(dom[len(dom) - k + m])}; ++{sym.name}) {{"
            ]
            if m == k - 1:
                if self.simd:
                    red = f"reduction({op}:{acc})" + (f" reduction(|:{acc}_nan)" if track_nan else "")
                    header.insert(0, f"#pragma omp simd {red}")
                self.loop(header, [sym], innermost)
            else:
                self.loop(header, [sym], lambda: nest(m + 1))

        nest(0)
        if track_nan:
            self.line(f"if ({acc}_nan) {acc} = std::numeric_limits<{t}>::quiet_NaN();")
        self.depth[acc] = 1
        self.scopes = saved
        return acc

    def _stats(self, n: Node) -> dict[str, str]:
        got = self.row_stats.get(n.id)
        if got is not None:
            return got
        x = n.inputs[0]
        xt = self.ctx.types[x].dtype
        acc_t = self.accumulator(n)
        t = CTYPE[acc_t]
        length = self.args.ref(self._row_len())

        def load(idx: tuple[sympy.Expr, ...]) -> str:
            return self._as(self.eval(x, idx), xt, acc_t)

        stats: dict[str, str] = {}
        if n.op in (OpKind.SUM, OpKind.MEAN):
            stats["acc"] = self.reduce_pass(acc_t, "sum", load)
        elif n.op is OpKind.PROD:
            stats["acc"] = self.reduce_pass(acc_t, "prod", load)
        elif n.op in (OpKind.AMAX, OpKind.AMIN):
            stats["acc"] = self.reduce_pass(acc_t, "max" if n.op is OpKind.AMAX else "min", load)
        elif n.op in (OpKind.SOFTMAX, OpKind.LOG_SOFTMAX):
            m = self.reduce_pass(acc_t, "max", load)
            keep = self.softmax_in_place == n.id  # Note [Softmax in place]
            s = self.reduce_pass(
                acc_t, "sum", lambda idx: f"bpk::vexp({load(idx)} - {m})", self._store_root(n.id) if keep else None
            )
            stats["max"] = m
            if n.op is OpKind.SOFTMAX:
                inv = self.fresh("inv")
                self.scopes[1].lines.append(f"const {t} {inv} = {t}(1) / {s};")
                stats["inv"] = inv
            else:
                lse = self.fresh("lse")
                self.scopes[1].lines.append(f"const {t} {lse} = {m} + std::log({s});")
                stats["lse"] = lse
        elif n.op in (OpKind.LAYER_NORM, OpKind.RMS_NORM):
            assert isinstance(n.attrs, NormAttrs)
            eps = literal(n.attrs.eps, acc_t)
            rstd = self.fresh("rstd")
            if n.op is OpKind.LAYER_NORM:
                s = self.reduce_pass(acc_t, "sum", load)
                mean = self.fresh("mean")
                self.scopes[1].lines.append(f"const {t} {mean} = {s} / {t}({length});")
                v = self.reduce_pass(acc_t, "sum", lambda idx: f"(({load(idx)} - {mean}) * ({load(idx)} - {mean}))")
                self.scopes[1].lines.append(f"const {t} {rstd} = {t}(1) / std::sqrt({v} / {t}({length}) + {eps});")
                stats["mean"] = mean
            else:
                s = self.reduce_pass(acc_t, "sum", lambda idx: f"({load(idx)} * {load(idx)})")
                self.scopes[1].lines.append(f"const {t} {rstd} = {t}(1) / std::sqrt({s} / {t}({length}) + {eps});")
            stats["rstd"] = rstd
        else:
            raise ValueError(f"{n.op.value} is not a row op")
        self.row_stats[n.id] = stats
        return stats

    def _store_root(self, v: int) -> Callable[[tuple[sympy.Expr, ...], str], None]:
        dom = self.spec.domain

        def store(idx: tuple[sympy.Expr, ...], var: str) -> None:
            self.line(f"{self.ptr_store(v)}[{self.args.index(_store_offset(dom, idx))}] = {var};")

        return store

    def _row_value(self, n: Node, idx: tuple[sympy.Expr, ...]) -> str:
        st = self._stats(n)
        dt = n.type.dtype
        t = CTYPE[dt]
        if n.op in (OpKind.SUM, OpKind.PROD, OpKind.AMAX, OpKind.AMIN):
            return self._as(st["acc"], self.accumulator(n), dt)
        if n.op is OpKind.MEAN:
            return f"{t}({st['acc']} / double({self.args.ref(self._row_len())}))"
        x = self._as(self.eval(n.inputs[0], idx), self.ctx.types[n.inputs[0]].dtype, dt)
        if n.op is OpKind.SOFTMAX:
            return f"(bpk::vexp({x} - {st['max']}) * {st['inv']})"
        if n.op is OpKind.LOG_SOFTMAX:
            return f"({x} - {st['lse']})"
        assert isinstance(n.attrs, NormAttrs)
        y = f"(({x} - {st['mean']}) * {st['rstd']})" if n.op is OpKind.LAYER_NORM else f"({x} * {st['rstd']})"
        k = n.attrs.num_axes
        trail = idx[len(idx) - k :]
        rest = list(n.inputs[1:])
        if n.attrs.has_weight:
            y = f"({y} * {self._as(self.eval(rest.pop(0), trail), self.ctx.types[n.inputs[1]].dtype, dt)})"
        if n.attrs.has_bias:
            b = rest.pop(0)
            y = f"({y} + {self._as(self.eval(b, trail), self.ctx.types[b].dtype, dt)})"
        return y


# --------------------------------------------------------------------------- kernel bodies


def _store_offset(shape: Sequence[IRDim], idx: Sequence[sympy.Expr]) -> sympy.Expr:
    return sympy.expand(sum((i * s for i, s in zip(idx, contiguous_strides(shape))), sympy.Integer(0)))


def _rows_loop(em: _Emitter, outer_dims: Sequence[IRDim], cost: str, body: Callable[[tuple[Loop, ...]], None]) -> None:
    """parallel_for over the flattened outer dims; `body` runs once per row with the row's symbols.

    The row symbols are split from the chunk's first row once (divisions) and then advanced like an
    odometer in the loop increment, so a short row costs no division (a `continue` in the body is safe)."""
    syms = tuple(Loop(f"i{k}") for k in range(len(outer_dims)))
    rows: IRDim = 1
    for d in outer_dims:
        rows = simplify(rows * d)
    refs = [em.args.ref(d) for d in outer_dims]
    split, advance = [], ""
    if syms:
        names = [s.name for s in syms]
        split.append(f"  int64_t {', '.join(names)};")
        if len(syms) == 1:
            split.append(f"  {names[0]} = lo_;")
        else:
            parts = ["int64_t t_ = lo_;"]
            for k in range(len(syms) - 1, 0, -1):
                parts.append(f"{names[k]} = t_ % {refs[k]}; t_ /= {refs[k]};")
            parts.append(f"{names[0]} = t_;")
            split.append("  { " + " ".join(parts) + " }")
        advance = ", " + _odometer(names, refs)

    em.loop(
        [
            f"bpk::parallel_for(st, {em.args.ref(rows)}, {cost}, [&](int64_t lo_, int64_t hi_) {{",
            _DECLS,
            *split,
            f"  for (int64_t row_ = lo_; row_ < hi_; ++row_{advance}) {{",
        ],
        syms,
        lambda: body(syms),
        ["  }", "});"],
    )


def _odometer(names: Sequence[str], refs: Sequence[str]) -> str:
    """C expression advancing the row symbols (innermost last) by one row."""
    if len(names) == 1:
        return f"++{names[0]}"
    expr = f"++{names[0]}"
    for k in range(1, len(names)):
        expr = f"(++{names[k]} == {refs[k]} && ({names[k]} = 0, {expr}, true))"
    return f"(void){expr}"


# Note [Restrict inside the parallel body]: a lambda reading the kernel's pointers through its
# by-reference captures loses __restrict__ and must reload every argument after each store, which
# blocks vectorization; the parallel body therefore declares its own restrict pointers and int args.
_DECLS = "/*bpk-decls*/"


def _for(em: _Emitter, sym: Loop, extent: IRDim, gen: Callable[[], None]) -> None:
    em.loop([f"for (int64_t {sym.name} = 0; {sym.name} < {em.args.ref(extent)}; ++{sym.name}) {{"], [sym], gen)


def _loop_kernel(em: _Emitter, simd: bool) -> None:
    dom = em.spec.domain
    nodes = [em.ctx.nodes[v] for v in em.spec.nodes]
    if not dom:
        for r in em.spec.roots:
            em.line(f"{em.ptr_store(r)}[0] = {em.eval(r, ())};")
        return
    n_last = em.args.ref(dom[-1])

    def body(outer: tuple[Loop, ...]) -> None:
        j = Loop(f"i{len(dom) - 1}")
        idx = (*outer, j)

        def store() -> None:
            for r in em.spec.roots:
                val = em.eval(r, idx)
                em.line(f"{em.ptr_store(r)}[{em.args.index(_store_offset(dom, idx))}] = {val};")

        header = [f"for (int64_t {j.name} = 0; {j.name} < {n_last}; ++{j.name}) {{"]
        if simd:
            header.insert(0, "#pragma omp simd")
        em.loop(header, [j], store)

    _rows_loop(em, dom[:-1], f"{em.args.ref(dom[-1])} * {_cost(nodes)}", body)


def _same_shape(a: Sequence[IRDim], b: Sequence[IRDim]) -> bool:
    return len(a) == len(b) and all(sym_eq(x, y) for x, y in zip(a, b))


def _row_kernel(em: _Emitter, simd: bool) -> None:
    dom = em.spec.domain
    k = em.spec.reduced
    r = len(dom) - k
    nodes = [em.ctx.nodes[v] for v in em.spec.nodes]
    em.simd = simd
    em.row_ops = {v for v in em.spec.nodes if em.ctx.nodes[v].op in _ROW_OPS}
    full_roots = [v for v in em.spec.roots if _same_shape(em.ctx.types[v].shape, dom)]
    row_roots = [v for v in em.spec.roots if v not in full_roots]
    # Note [Softmax in place]: when the kernel's one full-size result is a softmax, its sum pass stores
    # exp(x - max) into the result and a last pass scales it: two passes over the inputs and one exp
    # per element instead of three passes and two exps.
    soft = full_roots[0] if len(full_roots) == 1 and em.ctx.nodes[full_roots[0]].op is OpKind.SOFTMAX else None
    em.softmax_in_place = soft

    def body(outer: tuple[Loop, ...]) -> None:
        em.outer = outer
        em.row_stats = {}
        if soft is not None:
            em._stats(em.ctx.nodes[soft])
        for v in row_roots:
            shape = em.ctx.types[v].shape
            idx = tuple(outer) + (sympy.Integer(0),) * (len(shape) - len(outer))
            val = em.eval(v, idx)
            em.line(f"{em.ptr_store(v)}[{em.args.index(_store_offset(shape, idx))}] = {val};")
        if not full_roots:
            return
        inner = [Loop(f"r{r + m}") for m in range(k)]
        idx = (*outer, *inner)

        def store() -> None:
            for v in full_roots:
                at = f"{em.ptr_store(v)}[{em.args.index(_store_offset(dom, idx))}]"
                if v == soft:
                    em.line(f"{at} = {at} * {em.row_stats[v]['inv']};")
                    continue
                val = em.eval(v, idx)
                em.line(f"{at} = {val};")

        def nest(m: int) -> None:
            sym = inner[m]
            header = [f"for (int64_t {sym.name} = 0; {sym.name} < {em.args.ref(dom[r + m])}; ++{sym.name}) {{"]
            if m == k - 1 and simd:
                header.insert(0, "#pragma omp simd")
            em.loop(header, [sym], store if m == k - 1 else (lambda: nest(m + 1)))

        nest(0)

    length: IRDim = 1
    for d in dom[r:]:
        length = simplify(length * d)
    _rows_loop(em, dom[:r], f"{em.args.ref(length)} * {_cost(nodes) * 3}", body)


def reduce_init(kind: str, dt: DType) -> str:
    """C text of the identity of a "sum", "prod", "max" or "min" reduction in type `dt`."""
    t = CTYPE[dt]
    if kind in ("max", "min"):
        big = kind == "max"
        if dt in _FLOATS:
            return f"{'-' if big else ''}std::numeric_limits<{t}>::infinity()"
        return f"std::numeric_limits<{t}>::{'lowest' if big else 'max'}()"
    return f"{t}({1 if kind == 'prod' else 0})"


def _accumulator(n: Node) -> DType:
    """Sums and means of float32 accumulate in float64 (a user-visible reduction may cancel); integer
    sums and products in int64 (torch's result type); max / min and the row ops in their own type."""
    dt = n.type.dtype
    if n.op in (OpKind.SUM, OpKind.MEAN):
        return DType.FLOAT64 if dt in _FLOATS else DType.INT64
    if n.op is OpKind.PROD:
        return dt if dt in _FLOATS else DType.INT64
    return dt


_ROW_OPS = (
    OpKind.SUM,
    OpKind.MEAN,
    OpKind.AMAX,
    OpKind.AMIN,
    OpKind.PROD,
    OpKind.SOFTMAX,
    OpKind.LOG_SOFTMAX,
    OpKind.LAYER_NORM,
    OpKind.RMS_NORM,
)


def _reduce_kernel(em: _Emitter) -> None:
    """An anchor reduction over arbitrary axes (or an arg-reduction): one output element per iteration."""
    n = em.ctx.nodes[em.spec.roots[0]]
    x = n.inputs[0]
    xt = em.ctx.types[x]
    rank = xt.rank
    if isinstance(n.attrs, ArgReduceAttrs):
        axes, keep = ([n.attrs.axis % rank] if rank else []), n.attrs.keepdim
    else:
        assert isinstance(n.attrs, ReduceAttrs)
        axes, keep = (sorted(a % rank for a in n.attrs.axes) if rank else []), n.attrs.keepdim
    kept = [d for d in range(rank) if d not in axes]
    dt = n.type.dtype
    arg = n.op in (OpKind.ARGMAX, OpKind.ARGMIN)
    acc_t = xt.dtype if arg else em.accumulator(n)
    t = CTYPE[acc_t]
    big = n.op in (OpKind.ARGMAX, OpKind.AMAX)
    kind = {OpKind.ARGMAX: "max", OpKind.AMAX: "max", OpKind.ARGMIN: "min", OpKind.AMIN: "min"}.get(n.op)
    init = reduce_init(kind or ("prod" if n.op is OpKind.PROD else "sum"), acc_t)

    def body(outer: tuple[Loop, ...]) -> None:
        red = [Loop(f"r{a}") for a in axes]
        full: list[sympy.Expr] = [sympy.Integer(0)] * rank
        for d, s in zip(kept, outer):
            full[d] = s
        for a, s in zip(axes, red):
            full[a] = s
        acc = em.fresh("acc")
        em.declare(
            f"{t} {acc} = {init}; int64_t {acc}_i = 0; bool {acc}_nan = false; (void){acc}_i; (void){acc}_nan;", acc
        )

        def step() -> None:
            v = em._as(em.eval(x, tuple(full)), xt.dtype, acc_t)
            isnan = f"({v} != {v})" if acc_t in _FLOATS else "false"
            if arg:
                pos = red[-1].name if red else "0"
                better = ">" if big else "<"
                em.line(
                    f"if (!{acc}_nan && ({isnan} || {v} {better} {acc})) {{ {acc} = {v}; {acc}_i = {pos}; {acc}_nan = {isnan}; }}"
                )
            elif n.op is OpKind.PROD:
                em.line(f"{acc} = {acc} * {v};")
            elif n.op in (OpKind.AMAX, OpKind.AMIN):
                if acc_t in _FLOATS:
                    em.line(f"{acc} = bpk::{'fmax' if big else 'fmin'}_nan<{t}>({acc}, {v});")
                else:
                    em.line(f"{acc} = ({v} {'>' if big else '<'} {acc} ? {v} : {acc});")
            else:
                em.line(f"{acc} = {acc} + {v};")

        def nest(m: int) -> None:
            if m == len(axes):
                step()
            else:
                _for(em, red[m], xt.shape[axes[m]], lambda: nest(m + 1))

        nest(0)
        count: IRDim = 1
        for a in axes:
            count = simplify(count * xt.shape[a])
        if arg:
            val = f"int64_t({acc}_i)"
        elif n.op is OpKind.MEAN:
            val = f"{CTYPE[dt]}({acc} / {t}({em.args.ref(count)}))"
        else:
            val = em._as(acc, acc_t, dt)
        out_idx = [sympy.Integer(0) if d in axes else full[d] for d in range(rank)] if keep else [full[d] for d in kept]
        em.store(n.id, _store_offset(n.type.shape, out_idx), val)

    em.rows_loop([xt.shape[d] for d in kept], "16", body)


def _scan_kernel(em: _Emitter) -> None:
    n = em.ctx.nodes[em.spec.roots[0]]
    assert isinstance(n.attrs, AxisAttrs)
    x = n.inputs[0]
    shape = n.type.shape
    rank = len(shape)
    if rank == 0:
        em.store(n.id, sympy.Integer(0), em._as(em.eval(x, ()), em.ctx.types[x].dtype, n.type.dtype))
        return
    a = n.attrs.axis % rank
    kept = [d for d in range(rank) if d != a]
    t = CTYPE[n.type.dtype]

    def body(outer: tuple[Loop, ...]) -> None:
        s = Loop(f"r{a}")
        full: list[sympy.Expr] = [sympy.Integer(0)] * rank
        for d, o in zip(kept, outer):
            full[d] = o
        full[a] = s
        acc = em.fresh("acc")
        em.declare(f"{t} {acc} = {t}(0);", acc)

        def step() -> None:
            v = em._as(em.eval(x, tuple(full)), em.ctx.types[x].dtype, n.type.dtype)
            em.line(f"{acc} = {t}({acc} + {v});")
            em.store(n.id, _store_offset(shape, full), acc)

        _for(em, s, shape[a], step)

    em.rows_loop([shape[d] for d in kept], "4", body)


def _pool_kernel(em: _Emitter) -> None:
    """Max / average pooling, one parallel row per (image, channel, output row).

    Note [Separable pooling]: the window is a box, so each output row first combines its input rows
    (max or sum over the valid kernel rows: contiguous, vectorized) into a scratch row, then combines
    columns from that row per output column (constant-trip tap loops for interior columns). Valid
    kernel rows and columns are computed once per row / column: no bounds tests in the inner loops."""
    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, Pool2dAttrs)
    x = n.inputs[0]
    xt = em.ctx.types[x]
    view = em.ctx.view(x)
    assert view is not None
    p = em.ptr_load(view.base)
    nb, c, oh, ow = n.type.shape
    h, w = xt.shape[2], xt.shape[3]
    dt = n.type.dtype
    t = CTYPE[dt]
    is_max = n.op is OpKind.MAX_POOL2D
    floats = dt in _FLOATS
    kh, kw = a.kernel
    sh, sw = a.stride
    ph, pw = a.padding
    dh, dw = a.dilation
    r = em.args.ref
    if is_max:
        init = f"-std::numeric_limits<{t}>::infinity()" if floats else f"std::numeric_limits<{t}>::lowest()"
    else:
        init = f"{t}(0)"

    def comb(acc: str, v: str) -> str:
        if not is_max:
            return f"{acc} + {v}"
        return f"bpk::fmax_nan<{t}>({acc}, {v})" if floats else f"({v} > {acc} ? {v} : {acc})"

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_c, i_h = outer
        off = em.args.index(sympy.expand(view.offset + i_n * view.strides[0] + i_c * view.strides[1]))
        s2, s3 = r(view.strides[2]), r(view.strides[3])
        em.line(f"const {t}* BPK_RESTRICT plane_ = {p} + {off};")
        store_row = em.args.index(_store_offset(n.type.shape, (i_n, i_c, i_h, sympy.Integer(0))))
        em.line(f"{t}* BPK_RESTRICT out_ = {em.ptr_store(n.id)} + {store_row};")
        em.line(f"const int64_t hh0 = {i_h.name} * {sh} - {ph};")
        em.line(f"const int64_t ki0 = hh0 < 0 ? std::min<int64_t>({kh}, (-hh0 + {dh} - 1) / {dh}) : 0;")
        em.line(
            f"const int64_t ki1 = std::max<int64_t>(ki0, std::min<int64_t>({kh}, ({r(h)} - hh0 + {dh} - 1) / {dh}));"
        )
        em.line(f"static thread_local std::vector<{t}> vrow_;")
        em.line(f"if (int64_t(vrow_.size()) < {r(w)}) vrow_.resize({r(w)});")
        em.line(f"{t}* BPK_RESTRICT vm_ = vrow_.data();")
        em.line("#pragma omp simd")
        em.line(f"for (int64_t x = 0; x < {r(w)}; ++x) vm_[x] = {init};")
        em.line("for (int64_t ki = ki0; ki < ki1; ++ki) {")
        em.line(f"  const {t}* BPK_RESTRICT src_ = plane_ + (hh0 + ki * {dh}) * {s2};")
        em.line("  #pragma omp simd")
        em.line(f"  for (int64_t x = 0; x < {r(w)}; ++x) vm_[x] = {comb('vm_[x]', f'src_[x * {s3}]')};")
        em.line("}")
        j = "j"

        def cell(interior: bool) -> None:
            em.line(f"  const int64_t ww0 = {j} * {sw} - {pw};")
            if interior:
                em.line(f"  constexpr int64_t kj0 = 0, kj1 = {kw};")
            else:
                em.line(f"  const int64_t kj0 = ww0 < 0 ? std::min<int64_t>({kw}, (-ww0 + {dw} - 1) / {dw}) : 0;")
                em.line(
                    f"  const int64_t kj1 = std::max<int64_t>(kj0, std::min<int64_t>({kw}, ({r(w)} - ww0 + {dw} - 1) / {dw}));"
                )
            em.line(f"  {t} acc_ = {init};")
            em.line(f"  for (int64_t kj = kj0; kj < kj1; ++kj) acc_ = {comb('acc_', f'vm_[ww0 + kj * {dw}]')};")
            if not is_max:
                if a.count_include_pad and (dh, dw) == (1, 1):  # window cells inside the padded input
                    em.line(
                        f"  const int64_t cnt_ = (std::min<int64_t>(hh0 + {kh}, {r(h)} + {ph}) - std::max<int64_t>(hh0, -{ph}))"
                        f" * (std::min<int64_t>(ww0 + {kw}, {r(w)} + {pw}) - std::max<int64_t>(ww0, -{pw}));"
                    )
                elif a.count_include_pad:
                    hi_h, hi_w = f"{r(h)} + {ph}", f"{r(w)} + {pw}"
                    em.line("  int64_t cnt_ = 0;")
                    em.line(f"  for (int64_t ki = 0; ki < {kh}; ++ki) {{ const int64_t hh = hh0 + ki;")
                    em.line(f"    for (int64_t kj = 0; kj < {kw}; ++kj) {{ const int64_t ww = ww0 + kj;")
                    em.line(f"      cnt_ += (hh >= -{ph} && hh < {hi_h} && ww >= -{pw} && ww < {hi_w}); }} }}")
                else:  # window cells inside the input
                    em.line("  const int64_t cnt_ = (ki1 - ki0) * (kj1 - kj0);")
                em.line(f"  acc_ = acc_ / {t}(cnt_);")
            em.line(f"  out_[{j}] = acc_;")

        # columns whose whole window lies inside the input get a constant-trip (unrolled) tap loop
        em.line(f"const int64_t ja_ = std::min<int64_t>({r(ow)}, ({pw} + {sw} - 1) / {sw});")
        em.line(f"const int64_t jb_num_ = {r(w)} - 1 + {pw} - {(kw - 1) * dw};")
        em.line(
            f"const int64_t jb_ = std::max<int64_t>(ja_, jb_num_ < 0 ? 0 : std::min<int64_t>({r(ow)}, jb_num_ / {sw} + 1));"
        )
        for lo, hi, interior in (("0", "ja_", False), ("ja_", "jb_", True), ("jb_", r(ow), False)):
            em.line(f"for (int64_t {j} = {lo}; {j} < {hi}; ++{j}) {{")
            cell(interior)
            em.line("}")

    _rows_loop(em, [nb, c, oh], f"{em.args.ref(w)} * {kh + kw}", body)


_CONV_PIXELS = 4  # output pixels per register tile of the direct convolution


def _direct_conv_kernel(em: _Emitter) -> None:
    """Note [Direct convolution] (optimize/direct_conv.py): one parallel row per (image, output row);
    per tile of _CONV_PIXELS output pixels, acc[pixel][C_out] stays in registers while the taps
    (c_in, ky, kx) are walked, each tap's C_out packed weights read as one contiguous vector. Taps outside
    the input contribute zero (rows skipped, columns masked)."""
    from bladepack.ir.ops import Conv2dAttrs

    n = em.ctx.nodes[em.spec.roots[0]]
    a = n.attrs
    assert isinstance(a, Conv2dAttrs) and a.weight_layout == "ihwo" and a.out_layout == "nchw"
    xv, wv = em.ctx.view(n.inputs[0]), em.ctx.view(n.inputs[1])
    assert xv is not None and wv is not None and wv.is_contiguous()
    px, pw_ = em.ptr_load(xv.base), em.ptr_load(wv.base)
    nb, oc, oh, ow = n.type.shape
    cin, kh, kw, _ = em.ctx.types[n.inputs[1]].shape
    h, w = em.ctx.types[n.inputs[0]].shape[2:]
    (sh, sw), (ph, pwd), (dh, dw) = a.stride, a.padding, a.dilation
    t = CTYPE[n.type.dtype]
    r = em.args.ref
    tile = _CONV_PIXELS
    out = em.ptr_store(n.id)

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_y = outer
        base = em.args.index(sympy.expand(xv.offset + i_n * xv.strides[0]))
        store = em.args.index(_store_offset(n.type.shape, (i_n, sympy.Integer(0), i_y, sympy.Integer(0))))
        s1, s2, s3 = r(xv.strides[1]), r(xv.strides[2]), r(xv.strides[3])
        plane = r(simplify(oh * ow))
        em.line(f"const {t}* BPK_RESTRICT xn_ = {px} + {base};")
        em.line(f"const {t}* BPK_RESTRICT wp_ = {pw_} + {r(wv.offset)};")
        em.line(f"{t}* BPK_RESTRICT orow_ = {out} + {store};")
        em.line(f"const int64_t iy0 = {i_y.name} * {sh} - {ph};")
        em.line(f"for (int64_t x0 = 0; x0 < {r(ow)}; x0 += {tile}) {{")
        em.line(f"  const int64_t np_ = std::min<int64_t>({tile}, {r(ow)} - x0);")
        em.line(f"  {t} acc[{tile}][{oc}] = {{}};")
        # a tile whose every tap column lies inside the input loads without masks (the common case)
        em.line(
            f"  const bool inside_ = np_ == {tile} && x0 * {sw} - {pwd} >= 0 && "
            f"(x0 + {tile - 1}) * {sw} - {pwd} + {(kw - 1) * dw} < {r(w)};"
        )

        def taps(masked: bool) -> None:
            em.line(f"    for (int64_t ci = 0; ci < {cin}; ++ci) {{")
            em.line(f"      for (int64_t ky = 0; ky < {kh}; ++ky) {{")
            em.line(f"        const int64_t iy = iy0 + ky * {dh};")
            em.line(f"        if (iy < 0 || iy >= {r(h)}) continue;")
            em.line(f"        const {t}* BPK_RESTRICT xr = xn_ + ci * {s1} + iy * {s2};")
            em.line(f"        for (int64_t kx = 0; kx < {kw}; ++kx) {{")
            em.line(f"          const {t}* BPK_RESTRICT wt = wp_ + ((ci * {kh} + ky) * {kw} + kx) * {oc};")
            em.line(f"          {t} xv_[{tile}];")
            em.line(f"          for (int p = 0; p < {tile}; ++p) {{")
            em.line(f"            const int64_t ix = (x0 + p) * {sw} - {pwd} + kx * {dw};")
            if masked:
                em.line(f"            xv_[p] = (p < np_ && ix >= 0 && ix < {r(w)}) ? xr[ix * {s3}] : {t}(0);")
            else:
                em.line(f"            xv_[p] = xr[ix * {s3}];")
            em.line("          }")
            em.line(f"          for (int p = 0; p < {tile}; ++p) {{")
            em.line("            #pragma omp simd")
            em.line(f"            for (int64_t co = 0; co < {oc}; ++co) acc[p][co] += xv_[p] * wt[co];")
            em.line("          }")
            em.line("        }")
            em.line("      }")
            em.line("    }")

        em.line("  if (inside_) {")
        taps(False)
        em.line("  } else {")
        taps(True)
        em.line("  }")
        em.line(f"  for (int64_t co = 0; co < {oc}; ++co)")
        em.line(f"    for (int64_t p = 0; p < np_; ++p) orow_[co * {plane} + x0 + p] = acc[p][co];")
        em.line("}")

    _rows_loop(em, [nb, oh], f"{r(ow)} * {cin * kh * kw * oc // 8 + 1}", body)


def _im2col_kernel(em: _Emitter, conv: Node, x_view: View, cols: int) -> None:
    """cols[n, c*KH*KW + ki*KW + kj, oh*OW + ow] = x[n, c, oh*s - p + ki*d, ...], 0 outside.

    One parallel row per (image, channel); per tap (ki, kj) the valid output columns [j_lo, j_hi) are
    computed once, so the copy loop has no bounds tests (contiguous and vectorized at stride 1) and
    the padding columns are plain zero fills."""
    from bladepack.ir.ops import Conv2dAttrs

    a = conv.attrs
    assert isinstance(a, Conv2dAttrs)
    p = em.ptr_load(x_view.base)
    _nb, c, h, w = em.ctx.types[conv.inputs[0]].shape
    _oc, _cg, kh, kw = em.ctx.types[conv.inputs[1]].shape
    cnhw = a.out_layout == "cnhw"  # Note [Batch-folded convolution]: columns [C*KH*KW, N, OH*OW]
    nb = conv.type.shape[1] if cnhw else conv.type.shape[0]
    oh, ow = conv.type.shape[2], conv.type.shape[3]
    t = CTYPE[conv.type.dtype]
    out = em.ptr_store(cols)
    # element offset of (image, channel, tap 0)'s column plane, and the distance between taps' planes
    tap_stride = simplify(nb * oh * ow) if cnhw else simplify(oh * ow)
    (sh, sw), (ph, pw), (dh, dw) = a.stride, a.padding, a.dilation
    r = em.args.ref

    # Note [Plane copies]: at stride 1 with "same" output size and a dense input plane, a tap's columns
    # are the input plane shifted by (ki - ph, kj - pw): one contiguous copy of the flattened plane,
    # then the few wrapped-around border columns and the padding rows are zeroed.
    plane = (
        (sh, sw, dh, dw) == (1, 1, 1, 1)
        and sym_eq(oh, h)
        and sym_eq(ow, w)
        and sym_eq(x_view.strides[3], 1)
        and sym_eq(x_view.strides[2], w)
    )

    def plane_taps() -> None:
        em.line(f"const int64_t hw = {r(oh)} * {r(ow)};")
        em.line(f"for (int64_t ki = 0; ki < {kh}; ++ki) {{")
        em.line(f"  for (int64_t kj = 0; kj < {kw}; ++kj) {{")
        em.line(f"    {t}* BPK_RESTRICT d = dst_c + (ki * {kw} + kj) * {r(tap_stride)};")
        em.line(f"    const int64_t dy = ki - {ph}, dx = kj - {pw};")
        em.line(f"    const int64_t y0 = std::min<int64_t>({r(oh)}, std::max<int64_t>(0, -dy));")
        em.line(f"    const int64_t y1 = std::max<int64_t>(y0, std::min<int64_t>({r(oh)}, {r(h)} - dy));")
        em.line(f"    const int64_t j0 = std::min<int64_t>({r(ow)}, std::max<int64_t>(0, -dx));")
        em.line(f"    const int64_t j1 = std::max<int64_t>(j0, std::min<int64_t>({r(ow)}, {r(w)} - dx));")
        em.line(f"    for (int64_t f = 0; f < y0 * {r(ow)}; ++f) d[f] = {t}(0);")
        em.line("    if (y1 > y0 && j1 > j0) {")
        em.line(f"      const int64_t f0 = y0 * {r(ow)} + j0, f1 = (y1 - 1) * {r(ow)} + j1, shift = dy * {r(w)} + dx;")
        em.line("      #pragma omp simd")
        em.line("      for (int64_t f = f0; f < f1; ++f) d[f] = src_c[f + shift];")
        em.line("      for (int64_t y = y0; y < y1; ++y) {")
        em.line(f"        for (int64_t j = 0; j < j0; ++j) d[y * {r(ow)} + j] = {t}(0);")
        em.line(f"        for (int64_t j = j1; j < {r(ow)}; ++j) d[y * {r(ow)} + j] = {t}(0);")
        em.line("      }")
        em.line(f"    }} else {{ for (int64_t f = y0 * {r(ow)}; f < y1 * {r(ow)}; ++f) d[f] = {t}(0); }}")
        em.line(f"    for (int64_t f = y1 * {r(ow)}; f < hw; ++f) d[f] = {t}(0);")
        em.line("  }")
        em.line("}")

    def body(outer: tuple[Loop, ...]) -> None:
        i_n, i_c = outer
        base = em.args.index(sympy.expand(x_view.offset + i_n * x_view.strides[0] + i_c * x_view.strides[1]))
        first = (i_c * kh * kw * nb + i_n) * oh * ow if cnhw else (i_n * c + i_c) * kh * kw * oh * ow
        dst = em.args.index(sympy.expand(first))
        sx = r(x_view.strides[3])
        em.line(f"const {t}* src_c = {p} + {base};")
        em.line(f"{t}* BPK_RESTRICT dst_c = {out} + {dst};")
        if plane:
            plane_taps()
            return
        em.line(f"for (int64_t ki = 0; ki < {kh}; ++ki) {{")
        em.line(f"  for (int64_t kj = 0; kj < {kw}; ++kj) {{")
        em.line(f"    {t}* BPK_RESTRICT dst_k = dst_c + (ki * {kw} + kj) * {r(tap_stride)};")
        em.line(f"    const int64_t lo_n = {pw} - kj * {dw}, hi_n = {r(w)} - 1 + {pw} - kj * {dw};")
        em.line(f"    const int64_t j_lo = std::min<int64_t>({r(ow)}, lo_n <= 0 ? 0 : (lo_n + {sw} - 1) / {sw});")
        em.line(
            f"    const int64_t j_hi = std::max<int64_t>(j_lo, hi_n < 0 ? 0 : std::min<int64_t>({r(ow)}, hi_n / {sw} + 1));"
        )
        em.line(f"    for (int64_t y = 0; y < {r(oh)}; ++y) {{")
        em.line(f"      {t}* BPK_RESTRICT d = dst_k + y * {r(ow)};")
        em.line(f"      const int64_t hh = y * {sh} - {ph} + ki * {dh};")
        em.line(
            f"      if (hh < 0 || hh >= {r(h)}) {{ for (int64_t j = 0; j < {r(ow)}; ++j) d[j] = {t}(0); continue; }}"
        )
        em.line(f"      const {t}* s = src_c + hh * {r(x_view.strides[2])};")
        em.line(f"      const int64_t w0 = kj * {dw} - {pw};")
        em.line(f"      for (int64_t j = 0; j < j_lo; ++j) d[j] = {t}(0);")
        em.line("      #pragma omp simd")
        em.line(f"      for (int64_t j = j_lo; j < j_hi; ++j) d[j] = s[(j * {sw} + w0) * {sx}];")
        em.line(f"      for (int64_t j = j_hi; j < {r(ow)}; ++j) d[j] = {t}(0);")
        em.line("    }")
        em.line("  }")
        em.line("}")

    _rows_loop(em, [nb, c], f"{kh * kw} * {r(oh)} * {r(ow)}", body)


# --------------------------------------------------------------------------- entry points


def _function(name: str, em: _Emitter, ptr_types: list[tuple[str, bool]], nints: int) -> str:
    decls = []
    for k, (ct, writable) in enumerate(ptr_types):
        q = "" if writable else "const "
        decls.append(f"{q}{ct}* BPK_RESTRICT p{k} = static_cast<{q}{ct}*>(P[{k}]); (void)p{k};")
    decls.extend(f"const int64_t a{k} = I[{k}]; (void)a{k};" for k in range(nints))
    head = [f"static void {name}(bpk::RunState* st, void* const* P, const int64_t* I) {{", "  (void)st; (void)I;"]
    head.extend("  " + d for d in decls)
    body: list[str] = []
    for ln in em.scopes[0].lines:
        if ln.strip() == _DECLS:
            pad = ln[: len(ln) - len(ln.lstrip())]
            body.extend("  " + pad + d for d in decls)
        else:
            body.append("  " + ln)
    return "\n".join(head + body + ["}", ""])


def emit_kernel(spec: KernelSpec, ctx: KernelContext, conv: tuple[Node, View] | None = None) -> EmittedKernel:
    """All variants of one kernel. `conv` (the convolution and its input view) makes an im2col kernel."""
    args = Args()
    stores = list(spec.roots)
    loads: list[View] = []
    plans: list[tuple[str, Any, Callable[[_Emitter], None]]]
    if conv is not None:
        plans = [("", sympy.true, lambda em: _im2col_kernel(em, conv[0], conv[1], spec.roots[0]))]
    elif spec.kind == "loop":
        last = spec.domain[-1] if spec.domain else 1
        plans = []
        if isinstance(last, int):
            plans.append(("", sympy.true, lambda em: _loop_kernel(em, last >= 8)))
        else:
            plans.append(("_simd", sympy.Ge(last, 8), lambda em: _loop_kernel(em, True)))
            plans.append(("_scalar", sympy.true, lambda em: _loop_kernel(em, False)))
    elif spec.kind == "row":
        length: IRDim = 1
        for d in spec.domain[len(spec.domain) - spec.reduced :]:
            length = simplify(length * d)
        if isinstance(length, int):
            plans = [("", sympy.true, lambda em: _row_kernel(em, length >= 16))]
        else:
            plans = [
                ("_simd", sympy.Ge(length, 16), lambda em: _row_kernel(em, True)),
                ("_scalar", sympy.true, lambda em: _row_kernel(em, False)),
            ]
    elif spec.kind == "reduce":
        plans = [("", sympy.true, _reduce_kernel)]
    elif spec.kind == "scan":
        plans = [("", sympy.true, _scan_kernel)]
    elif spec.kind == "pool":
        plans = [("", sympy.true, _pool_kernel)]
    elif spec.kind == "conv":
        plans = [("", sympy.true, _direct_conv_kernel)]
    else:
        raise ValueError(f"unknown kernel kind {spec.kind}")
    bodies: list[tuple[str, Any, _Emitter]] = []
    errors: list[str] = []
    for suffix, pred, fn in plans:
        em = _Emitter(spec, ctx, args, stores, loads)
        fn(em)
        bodies.append((f"{spec.name}{suffix}", pred, em))
        errors = em.error_sites
    ptr_types = [(CTYPE[ctx.types[v].dtype] if v in ctx.types else "float", True) for v in stores]
    ptr_types += [(CTYPE[ctx.types[v.base].dtype], False) for v in loads]
    lines = [f"// {spec.name}: {spec.kind} kernel{' from ' + spec.loc if spec.loc else ''}"]
    for name, _pred, em in bodies:
        lines.append(_function(name, em, ptr_types, len(args.exprs)))
    return EmittedKernel(spec.name, spec, [(n, p) for n, p, _ in bodies], stores, loads, args, "\n".join(lines), errors)
