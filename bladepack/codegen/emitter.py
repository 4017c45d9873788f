"""The emitter machinery the CPU and CUDA backends share: `Emitter`.

In: a `KernelSpec`, its `KernelContext`, the argument list being built. Out: C-like statements in
nested scopes. A value is evaluated at an index (a tuple of sympy expressions over the loop symbols):
materialized values and layout chains over them are strided loads; elementwise ops evaluate their
operands at the broadcast-adjusted index; permute / slice / expand / reshape transform the index
(Note [Reshape of a strided view] in ir/views.py); concat and pad branch; take / gather load an index
and check it; row ops read the statistics their row passes computed (`reduce_pass`). Every (value,
index) pair is computed once and placed in the outermost scope where all its symbols are defined
(loop-invariant code motion by construction). Backends subclass it for their loop schedule
(`rows_loop`) and their reduction passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import sympy

from bladepack.codegen.c_render import CTYPE, Args, Loop, binary, literal, promote, unary, where
from bladepack.codegen.kernel import (
    ERR_INDEX,
    ERR_INDEX_NONNEG,
    KernelContext,
    accumulator_type,
)
from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import KernelSpec
from bladepack.ir.ops import (
    OP_INFO,
    ArangeAttrs,
    AxisAttrs,
    ConstantAttrs,
    IndexAttrs,
    OpClass,
    PadAttrs,
    PermuteAttrs,
    SliceAttrs,
    TakeAttrs,
)
from bladepack.ir.types import IRDim
from bladepack.ir.views import LAYOUT_OPS, View, reshape_groups, simplify
from bladepack.opset import COMPARISONS

_VAR = re.compile(r"\b[a-z]+\d+\b")
RowBody = Callable[[tuple[Loop, ...]], None]  # what a row of `rows_loop` emits, given the row's symbols


def _site(what: str, n: Node) -> str:
    """An index check's description with the user's source line of the op it guards (a fused kernel's
    own location is its root's: a layer norm after the embedding lookup that failed)."""
    return f"{what} at {n.loc}" if n.loc else what


def _zero(n: Node | None) -> bool:
    """A constant 0 (a scalar or a filled tensor)."""
    if n is None or n.op not in (OpKind.CONSTANT, OpKind.FULL) or not isinstance(n.attrs, ConstantAttrs):
        return False
    v = n.attrs.value
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0


_SOURCE_OPS = (OpKind.ARANGE, OpKind.CONSTANT, OpKind.FULL)  # ops of no input that read no tensor


def _nonneg_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0


def _wraps(n: Node) -> bool:
    """Whether a take / gather counts a negative index from the end (Note [Negative indices])."""
    return not isinstance(n.attrs, TakeAttrs) or n.attrs.wrap


class Scope:
    def __init__(self, syms: Sequence[sympy.Symbol] = (), barrier: bool = False) -> None:
        self.syms = set(syms)
        self.barrier = barrier
        self.lines: list[str] = []
        self.memo: dict[Any, str] = {}


class Emitter:
    def __init__(self, spec: KernelSpec, ctx: KernelContext, args: Args, stores: list[int], loads: list[View]) -> None:
        self.spec, self.ctx, self.args = spec, ctx, args
        self.stores, self.loads = stores, loads
        self.inside = set(spec.nodes)
        self.scopes: list[Scope] = [Scope()]
        self.tmp = 0
        self.row_stats: dict[int, dict[str, str]] = {}
        self.outer: tuple[sympy.Expr, ...] = ()
        self.simd = False
        self.error_sites: list[str] = []
        self.row_ops: set[int] = set()
        self.softmax_in_place: int | None = None  # Note [Softmax in place]
        self.depth: dict[str, int] = {}  # scope depth of each C variable defined so far
        self.data_free: dict[int, bool] = {}  # values computed from sizes and constants alone

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

    def bind(self, vid: int, idx: tuple[sympy.Expr, ...], expr: str) -> None:
        """In the current scope, value `vid` at `idx` is the C expression `expr` (a register the kernel
        computed itself, e.g. a convolution's accumulator: Note [Convolution epilogue])."""
        self.scopes[-1].memo[(vid, tuple(sympy.sympify(i) for i in idx))] = expr

    def push(self, syms: Sequence[sympy.Symbol] = (), barrier: bool = False) -> Scope:
        s = Scope(syms, barrier)
        self.scopes.append(s)
        return s

    def pop(self) -> Scope:
        return self.scopes.pop()

    def branch(self, guard: str, gen: Callable[[], None]) -> None:
        """`gen`'s code after the preprocessor line `guard` (#if / #elif / #else), in a block whose
        scope nothing is hoisted out of: another branch never reads a value this one defines."""
        self.line(guard)
        s = self.push(barrier=True)
        gen()
        self.pop()
        self.scopes[-1].lines.extend(["{", *("  " + ln for ln in s.lines), "}"])

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

    def rows_loop(self, outer_dims: Sequence[IRDim], cost: str, body: RowBody, chunk_setup: Sequence[str] = ()) -> None:
        """Run `body` once per row of `outer_dims` (the schedule's parallel loop; each backend's own);
        `chunk_setup`: statements a CPU chunk of rows runs first (Note [Chunk scratch] in cpu_loops.py)."""
        raise NotImplementedError

    def block_rows_loop(self, outer_dims: Sequence[IRDim], body: RowBody) -> None:
        """Run `body` once per row of `outer_dims` with a block of threads per row (CUDA: Note [Block
        sort]); backends without blocks have none."""
        raise NotImplementedError

    def _row_value(self, n: Node, idx: tuple[sympy.Expr, ...]) -> str:
        """A row op's value at `idx` from its row statistics (row_emitter.RowEmitter)."""
        raise NotImplementedError

    def for_loop(self, sym: Loop, extent: IRDim, gen: Callable[[], None]) -> None:
        """A sequential loop of `sym` over [0, extent) around what `gen` emits."""
        self.loop([f"for (int64_t {sym.name} = 0; {sym.name} < {self.args.ref(extent)}; ++{sym.name}) {{"], [sym], gen)

    def reduce_loops(self, syms: Sequence[Loop], extents: Sequence[IRDim], gen: Callable[[], None]) -> None:
        """The loops of one output's reduction over `syms` (nested, outermost first) around what `gen`
        emits; CUDA's split reductions share them among a block's threads (Note [Split reductions])."""

        def nest(m: int) -> None:
            if m == len(syms):
                gen()
            else:
                self.for_loop(syms[m], extents[m], lambda: nest(m + 1))

        nest(0)

    def combine_shares(self, acc: str, kind: str, ctype: str) -> None:
        """After `reduce_loops`: combine accumulator `acc` (a `kind` reduction: sum, prod, max, min) over
        the threads that shared the output's loops; nothing where one thread ran them all."""

    def store_partial(self, acc: str) -> bool:
        """After `combine_shares`: where the kernel computes a part of each output's reduction (CUDA's
        grid reductions: Note [Grid reductions] in cuda_grid_reduce.py), store accumulator `acc` as that
        part and say so (True): the output is stored by the kernel that combines the parts."""
        return False

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
        if expr in self.depth:  # another value's variable (a reshape, expand or permute of it): no copy
            self.scopes[-1].memo[key] = expr
            return expr
        return self.define(CTYPE[t.dtype], expr, syms, key)

    def load(self, base: int, dt: DType, off: sympy.Expr, syms: set[sympy.Symbol], key: Any) -> str:
        """A C variable holding element `off` of the materialized buffer `base`."""
        return self.define(CTYPE[dt], f"{self.ptr_load(base)}[{self.args.index(off)}]", syms, key)

    def select(self, c: str, a: str, b: str, dt: DType) -> str:
        """`where(c, a, b)` in C, the operands already rendered."""
        return where(c, a, b, dt)

    def invariant(self, c: str, *others: str) -> bool:
        """Whether variable `c` is defined outside a loop that a variable of `others` is defined in."""
        if c not in self.depth:
            return False
        inner = [self.depth.get(v, 0) for x in others for v in _VAR.findall(x)]
        return max(inner, default=0) > self.depth[c]

    def fail(self, code: str, value: str, size: str) -> str:
        """C statement reporting an error (the kernel goes on with a safe value)."""
        return f"st->fail({code}, {value}, {size});"

    def accumulator(self, n: Node) -> DType:
        return accumulator_type(n)

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
        if dst is DType.FLOAT16:  # a cast to a 16-bit float rounds as torch's would (registers are float)
            return f"bpk::round_f16(float({x}))"
        if dst is DType.BFLOAT16:
            return f"bpk::round_bf16(float({x}))"
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
            return self.select(c, a, b, dt)
        if op in COMPARISONS:
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
        parts = self.concat_parts(n, idx)
        dt = n.type.dtype
        cases = [(cond, self._thunk(v, at, dt)) for cond, v, at in parts[:-1]]
        _, last, at = parts[-1]
        return self._branch(CTYPE[dt], cases, self._thunk(last, at, dt))

    def concat_parts(self, n: Node, idx: tuple[sympy.Expr, ...]) -> list[tuple[str, int, tuple[sympy.Expr, ...]]]:
        """Per input of concat `n` at `idx`: the C condition that selects it (after the earlier ones
        failed; the last input's is unused), the input, and `idx` shifted to the input's own index."""
        assert isinstance(n.attrs, AxisAttrs)
        a = n.attrs.axis % len(idx)
        ia = self.args.index(idx[a])
        parts = []
        start: IRDim = 0
        for v in n.inputs:
            end = simplify(start + self.ctx.types[v].shape[a])
            at = list(idx)
            at[a] = sympy.expand(idx[a] - start)
            parts.append((f"{ia} < {self.args.ref(end)}", v, tuple(at)))
            start = end
        return parts

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

    def _checked_index(self, raw: str, size: IRDim, what: str, wrap: bool = True, proven: bool = False) -> Loop:
        """A runtime index symbol holding `raw`, bounds-checked unless `proven` in range; `wrap`:
        negative counts from the end (else it is out of range: Note [Negative indices] in
        opset/attrs.py).

        Note [Index checks]: the symbol and its check go where `raw` is defined, not into the innermost
        loop: a token id read once per row is checked once per row, and the loop over the row keeps no
        call (a `st->fail` call inside an `omp simd` loop keeps it scalar). An index that is a position
        or clamped into range (`_in_range`) is never checked."""
        sym = Loop(self.fresh("g"))
        stmts = [f"int64_t {sym.name} = int64_t({raw});"]
        if not proven:
            sz = self.args.ref(size)
            self.error_sites.append(what)
            site = len(self.error_sites) - 1
            if wrap:
                stmts.append(f"if ({sym.name} < 0) {sym.name} += {sz};")
            report = self.fail(f"{ERR_INDEX if wrap else ERR_INDEX_NONNEG} + 16 * {site}", f"int64_t({raw})", sz)
            stmts.append(f"if ({sym.name} < 0 || {sym.name} >= {sz}) {{ {report} {sym.name} = 0; }}")
        # a C variable goes to its own scope (not above a barrier); any other expression stays here
        k = max(self._target(set()), self.depth[raw]) if raw in self.depth else len(self.scopes) - 1
        self.scopes[k].lines.extend(stmts)
        self.scopes[k].syms.add(sym)
        self.depth[sym.name] = k
        return sym

    def _in_range(self, v: int, size: IRDim) -> bool:
        """Note [Index checks]: every value of index `v` is provably in [0, size): positions
        (`arange(size)` through reshapes, expands, permutes, slices, casts to int64 and adding 0: the
        row numbers Hugging Face's mask builders index their masks with), and indices clamped into
        range (`min(floor(max(x, 0)), size - 1)`: the taps of an interpolation, ir/interpolate.py)."""
        return self._nonneg(v) and self._at_most(v, simplify(sympy.sympify(size) - 1))

    def _at_most(self, v: int, hi: IRDim) -> bool:
        """Every value of `v` is <= hi, for every shape in range."""
        n = self.ctx.nodes.get(v)
        if n is None:
            return False
        if n.op is OpKind.ARANGE:
            a = n.attrs
            assert isinstance(a, ArangeAttrs)
            return a.start == 0 and a.step == 1 and self.ctx.proven_le(simplify(n.type.shape[0] - 1), hi)
        if n.op is OpKind.CONSTANT and isinstance(n.attrs, ConstantAttrs) and not isinstance(n.attrs.value, float):
            value = n.attrs.value
            return not isinstance(value, bool) and self.ctx.proven_le(value, hi)
        if n.op is OpKind.MINIMUM:
            return any(self._at_most(i, hi) for i in n.inputs)
        if n.op is OpKind.MAXIMUM:
            return all(self._at_most(i, hi) for i in n.inputs)
        if n.op in LAYOUT_OPS or (n.op is OpKind.CAST and n.type.dtype is DType.INT64 and self._integer(n.inputs[0])):
            return self._at_most(n.inputs[0], hi)
        if n.op in (OpKind.ADD, OpKind.SUB) and len(n.inputs) == 2:
            zero = [i for i in n.inputs if _zero(self.ctx.nodes.get(i))]
            rest = [i for i in n.inputs if i not in zero]
            return len(rest) == 1 and (n.op is OpKind.ADD or rest[0] == n.inputs[0]) and self._at_most(rest[0], hi)
        return False

    def _nonneg(self, v: int) -> bool:
        """Every value of integer `v` is >= 0, for every shape in range. Integer ops only: a float
        cast to an integer may be a NaN's (INT64_MIN), so a clamp in float proves nothing."""
        n = self.ctx.nodes.get(v)
        if n is None or not self._integer(v):
            return False
        if n.op is OpKind.ARANGE:
            a = n.attrs
            assert isinstance(a, ArangeAttrs)
            return _nonneg_number(a.start) and _nonneg_number(a.step)
        if n.op is OpKind.CONSTANT and isinstance(n.attrs, ConstantAttrs):
            value = n.attrs.value
            return not isinstance(value, bool) and (
                _nonneg_number(value) or (isinstance(value, sympy.Expr) and self.ctx.proven_le(0, value))
            )
        if n.op is OpKind.MINIMUM:
            return all(self._nonneg(i) for i in n.inputs)
        if n.op in (OpKind.ADD, OpKind.MUL):  # no wrap-around: both terms are sizes' functions
            return all(self._nonneg(i) and self._data_free(i) for i in n.inputs)
        if n.op is OpKind.MAXIMUM:
            return any(self._nonneg(i) for i in n.inputs)
        if n.op in LAYOUT_OPS or (n.op is OpKind.CAST and n.type.dtype is DType.INT64):
            return self._nonneg(n.inputs[0])
        return False

    def _integer(self, v: int) -> bool:
        return self.ctx.types[v].dtype in (DType.INT64, DType.INT32)

    def _data_free(self, v: int) -> bool:
        """`v` is computed from sizes and constants alone (no input, weight or loaded value), so its
        magnitude is bounded by the shapes'."""
        if v not in self.data_free:
            n = self.ctx.nodes.get(v)
            free = n is not None and (all(self._data_free(i) for i in n.inputs) if n.inputs else n.op in _SOURCE_OPS)
            self.data_free[v] = free
        return self.data_free[v]

    def _gather(self, n: Node, idx: tuple[sympy.Expr, ...]) -> str:
        x = n.inputs[0]
        xshape = self.ctx.types[x].shape
        if n.op is OpKind.TAKE:
            assert isinstance(n.attrs, AxisAttrs)
            a = n.attrs.axis % len(xshape)
            r = self.ctx.types[n.inputs[1]].rank
            raw = self.eval(n.inputs[1], idx[a : a + r])
            proven = self._in_range(n.inputs[1], xshape[a])
            g = self._checked_index(raw, xshape[a], _site(f"take along dimension {a}", n), _wraps(n), proven)
            return self.eval(x, (*idx[:a], g, *idx[a + r :]))
        if n.op is OpKind.GATHER:
            assert isinstance(n.attrs, AxisAttrs)
            a = n.attrs.axis % len(xshape)
            raw = self.eval(n.inputs[1], idx)
            proven = self._in_range(n.inputs[1], xshape[a])
            g = self._checked_index(raw, xshape[a], _site(f"gather along dimension {a}", n), _wraps(n), proven)
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
            what = _site(f"indexing along dimension {axes[k]}", n)
            src.append(self._checked_index(raw, xshape[axes[k]], what, proven=self._in_range(t, xshape[axes[k]])))
        src.extend(idx[axes[0] + b_rank :])
        return self.eval(x, tuple(src))
