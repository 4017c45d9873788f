"""Lower an optimized IR program to an `ExecPlan`: steps, value table, the shape program and a native
plan per backend (`PlanBuilder`, whose steps are stages of optimize; `build_plan` runs them all).

In: an IR `Program` and the backends to plan for. Out: an `ExecPlan` in which every symbolic size or
attribute is a register of the shape program (Note [SymInt encoding]), plus the guards that bind
symbols from input dims: a symbol's first occurrence binds it and checks its range; later
occurrences must agree.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from bladepack.artifact.plan import (
    ExecPlan,
    Step,
    SymbolDecl,
    TensorDecl,
    ValueDecl,
    WeightDecl,
)
from bladepack.artifact.shape_program import Op
from bladepack.artifact.symint import SymIntEnc
from bladepack.backends import Backend, Sources
from bladepack.errors import UnsupportedOpsError
from bladepack.ir import Graph, Guard, OpKind, Program, ShapeEnv, Tri
from bladepack.ir.batch_dims import batch_proofs
from bladepack.ir.guards import effective_guards, pruned, shape_predicate
from bladepack.ir.padding import padding_proofs
from bladepack.ir.types import IRDim, dim_str
from bladepack.library_ops.cutlass.select import CUBLAS, GemmPolicy
from bladepack.lowering.lower_native import Lowerer, NativeLowering, emit_launches, fusion_for, memory_plan
from bladepack.lowering.shape_compiler import ShapeCompileError, ShapeProgramBuilder


def _range_text(lo: int, hi: int | None) -> str:
    return f"[{lo}, {'inf' if hi is None else hi}]"


class _Binder:
    """Emits the guard code that binds every symbol from the input dims."""

    def __init__(self, b: ShapeProgramBuilder, env: ShapeEnv) -> None:
        self.b, self.env = b, env
        self.origin: dict[sympy.Symbol, str] = {}

    def _check_range(self, sym: sympy.Symbol, reg: int, where: str) -> None:
        r = self.env.range_of(sym)
        conds = [self.b.binary(Op.LE, self.b.const(r.min), reg)] if r.min > 0 else []
        if r.max is not None:
            conds.append(self.b.binary(Op.LE, reg, self.b.const(r.max)))
        if conds:
            cond = conds[0] if len(conds) == 1 else self.b.binary(Op.MIN, conds[0], conds[1])
            self.b.check(
                cond,
                reg,
                f"{where} (symbol '{sym.name}') is {{value}}; the allowed range is {_range_text(r.min, r.max)}",
            )

    def bind_inputs(self, g: Graph) -> None:
        deferred: list[tuple[int, str, int, sympy.Expr]] = []
        for i, p in enumerate(g.inputs):
            for axis, d in enumerate(p.type.shape):
                if isinstance(d, int):
                    continue
                where = f"input '{p.name}' dimension {axis}"
                reg = self.b.dim(i, axis)
                if isinstance(d, sympy.Symbol) and not self.b.is_bound(d):
                    self.b.bind(d, reg)
                    self.origin[d] = where
                    self._check_range(d, reg, where)
                elif isinstance(d, sympy.Symbol):
                    self.b.check(
                        self.b.binary(Op.EQ, reg, self.b.expr(d)),
                        reg,
                        f"{where} is {{value}}, but it must equal {self.origin[d]} (symbol '{d.name}'), which is {{other}}",
                        other=self.b.expr(d),
                    )
                else:
                    deferred.append((reg, where, axis, d))
        self._solve(deferred)

    def _solve(self, deferred: list[tuple[int, str, int, sympy.Expr]]) -> None:
        while deferred:
            progress, rest = False, []
            for reg, where, axis, e in deferred:
                free = [s for s in e.free_symbols if not self.b.is_bound(s)]
                if not free:
                    self.b.check(
                        self.b.binary(Op.EQ, reg, self.b.expr(e)),
                        reg,
                        f"{where} is {{value}}, but it must be {dim_str(e)} = {{other}}",
                        other=self.b.expr(e),
                    )
                    progress = True
                elif len(free) == 1 and sympy.Poly(e, free[0]).degree() == 1:
                    s = free[0]
                    a, c = sympy.Poly(e, s).all_coeffs()
                    if not a.is_Integer or a <= 0:
                        rest.append((reg, where, axis, e))
                        continue
                    num = self.b.binary(Op.SUB, reg, self.b.expr(c))
                    ok = self.b.binary(Op.EQ, self.b.binary(Op.MOD, num, self.b.const(int(a))), self.b.const(0))
                    self.b.check(ok, reg, f"{where} is {{value}}, but it must have the form {dim_str(e)}")
                    val = self.b.binary(Op.FLOORDIV, num, self.b.const(int(a)))
                    self.b.bind(s, val)
                    self.origin[s] = where
                    self._check_range(s, val, f"{where} = {dim_str(e)}")
                    progress = True
                else:
                    rest.append((reg, where, axis, e))
            if not progress:
                raise ShapeCompileError(f"cannot determine the symbols of {rest[0][1]} = {rest[0][3]} from the inputs")
            deferred = rest


_WINDOWED = (OpKind.CONV2D, OpKind.MAX_POOL2D, OpKind.AVG_POOL2D)


def _size_guards(b: ShapeProgramBuilder, g: Graph) -> None:
    """Note [Sizes are checked]: a derived dim must never be negative, and a convolution or pooling
    window must fit at least once (torch raises "output size is too small" there): the inputs that
    break either are rejected with the op's source instead of producing an empty or invalid result."""
    zero, one = b.const(0), b.const(1)
    for n in g.nodes:
        for axis, d in enumerate(n.type.shape):
            if isinstance(d, (int, sympy.Symbol)):
                continue
            try:
                reg = b.expr(d)
            except ShapeCompileError as e:
                where = n.loc or f"%{n.id}"
                raise UnsupportedOpsError(
                    [(f"{n.op.value}: a size the shape program cannot compute ({e})", where)]
                ) from e
            lowest = one if n.op in _WINDOWED and axis >= 2 else zero
            what = "output size" if lowest is one else "size"
            b.check(
                b.binary(Op.LE, lowest, reg),
                reg,
                f"the input is too small for {n.op.value} at {n.loc or f'%{n.id}'}: its {what} along "
                f"dimension {axis} would be {{value}}",
            )


def _enc(b: ShapeProgramBuilder, d: IRDim) -> SymIntEnc:
    if isinstance(d, int):
        return d
    if isinstance(d, sympy.Expr) and d.is_Integer:
        return int(d)
    return {"r": b.expr(d)}


def _encode_attr(b: ShapeProgramBuilder, v: Any) -> Any:
    if isinstance(v, tuple):
        return [_encode_attr(b, x) for x in v]
    if isinstance(v, sympy.Basic):
        return _enc(b, v)
    return v


def _arena_expr(p: Program) -> sympy.Expr:
    """Peak bytes of live intermediate values when steps run in order and each value is freed after
    its last use (what a liveness-based arena needs, before fragmentation)."""
    g = p.graph
    last: dict[int, int] = {}
    for k, n in enumerate(g.nodes):
        for i in n.inputs:
            last[i] = k
    for o in g.outputs:
        last[o] = len(g.nodes)
    live: dict[int, sympy.Expr] = {}
    terms: list[sympy.Expr] = [sympy.Integer(0)]
    for k, n in enumerate(g.nodes):
        live[n.id] = sympy.sympify(n.type.nbytes())
        terms.append(sympy.expand(sum(live.values(), sympy.Integer(0))))
        for vid in [v for v in live if last.get(v, k) <= k]:
            del live[vid]
    return _max_of(p.shape_env, terms)


def _coefficients(
    env: ShapeEnv, term: sympy.Expr, signs: dict[sympy.Expr, bool]
) -> dict[sympy.Expr, sympy.Expr] | None:
    """The coefficient of each monomial of an expanded `term`, where it is a polynomial in factors never
    negative at any shape (shape symbols, and e.g. floor(height / 16) where proven so; `signs` memoizes
    the proofs), so every monomial is too; None for any other term."""
    out = term.as_coefficients_dict()
    for mono in out:
        for base, exp in mono.as_powers_dict().items():
            if base == 1:
                continue
            if base not in signs:
                signs[base] = env.prove_le(0, base) is Tri.YES
            if not (exp.is_Integer and exp > 0 and signs[base]):
                return None
    return dict(out)


def _dominated(small: dict[sympy.Expr, sympy.Expr], big: dict[sympy.Expr, sympy.Expr]) -> bool:
    zero = sympy.Integer(0)
    return all(small.get(mono, zero) <= big.get(mono, zero) for mono in small.keys() | big.keys())


def _undominated(env: ShapeEnv, terms: list[sympy.Expr]) -> list[sympy.Expr]:
    """Note [Arena peak]: the terms less each polynomial that another one bounds coefficient by
    coefficient (over monomials of factors never negative, so at every shape); other terms are kept. The
    live sums of a model's steps are such polynomials, mostly comparable this way: a 1.1B decoder's
    1,725 steps gave as many sums, whose sympy.Max took 22 s to build (sympy compares every pair)."""
    kept: list[tuple[sympy.Expr, dict[sympy.Expr, sympy.Expr] | None]] = []
    signs: dict[sympy.Expr, bool] = {}
    for t in terms:
        c = _coefficients(env, t, signs)
        if c is not None and any(k is not None and _dominated(c, k) for _, k in kept):
            continue
        if c is not None:
            kept = [(u, k) for u, k in kept if k is None or not _dominated(k, c)]
        kept.append((t, c))
    return [t for t, _ in kept]


def _corners(env: ShapeEnv, terms: Sequence[sympy.Expr]) -> list[dict[sympy.Symbol, int]]:
    """Bindings of the terms' symbols at the ends and the middle of their ranges (an unbounded range
    stops at 2^16), every combination."""
    syms = sorted({s for t in terms for s in t.free_symbols if isinstance(s, sympy.Symbol)}, key=lambda s: s.name)
    per = []
    for sym in syms:
        r = env.range_of(sym)
        hi = r.max if r.max is not None else max(r.min, 1 << 16)
        per.append(sorted({r.min, (r.min + hi) // 2, hi}))
    return [dict(zip(syms, c)) for c in itertools.product(*per)]


def _max_of(env: ShapeEnv, terms: list[sympy.Expr]) -> sympy.Expr:
    """Max of the terms, dropping each term bounded by another: coefficient by coefficient first, then
    by range proofs against the terms that are largest somewhere (Note [Arena peak])."""
    uniq = _undominated(env, list(dict.fromkeys(terms)))
    if len(uniq) == 1:
        return uniq[0]
    # the terms largest at some corner of the ranges must stay; each other one is tried against them,
    # the one beating it at most corners first (a proof each, not one per pair of terms)
    values = [[t.xreplace(at) for t in uniq] for at in _corners(env, uniq)]
    tops = sorted({max(range(len(uniq)), key=lambda i: (row[i], -i)) for row in values})
    kept: list[sympy.Expr] = []
    for i, t in enumerate(uniq):
        if i not in tops:
            rivals = sorted(tops, key=lambda j: -sum(bool(row[j] >= row[i]) for row in values))
            if any(env.prove_le(t, uniq[j]) is Tri.YES for j in rivals[:_RIVALS]):
                continue
        kept.append(t)
    if len(kept) == 1:
        return kept[0]
    # sympy.Max compares every pair of its arguments again (SegFormer's 46 floor polynomials: 29 s)
    return sympy.Max(*kept, evaluate=len(kept) <= _EVALUATED)


_RIVALS = 3  # range proofs a term gets before it stays in the max
_EVALUATED = 8  # terms sympy.Max may simplify itself


@dataclass(frozen=True)
class KernelSources:
    """What the compile side builds the plan's kernels from, per backend kind (`Sources`: the
    translation unit and the CUTLASS instances), and each backend's fusion plan as text; never written
    to the manifest (the fusion texts are what BLADEPACK_DUMP writes)."""

    units: Mapping[str, Sources] = field(default_factory=dict)
    fusion_texts: Mapping[str, str] = field(default_factory=dict)

    def unit(self, kind: str) -> str:
        return self.units[kind].unit if kind in self.units else ""

    def fusion_text(self, kind: str) -> str:
        return self.fusion_texts.get(kind, "")


@dataclass(frozen=True)
class LoweredPlan:
    plan: ExecPlan  # what the manifest holds
    sources: KernelSources


class PlanBuilder:
    """The plan stages of optimize, in order, over one shape-program builder (registers are allotted in
    the order they run): `guards()` (input dims bound, shape constraints and sizes checked, the
    symbols, values and steps), then per backend `fusion()` (a `Lowerer` for its fusion plan), the
    launches (`lower_native.emit_launches`) and `memory_plan()`, then `finish()`, the `ExecPlan`."""

    def __init__(self, p: Program) -> None:
        self.p = p
        self.b = ShapeProgramBuilder()
        self.natives: dict[str, NativeLowering] = {}

    def enc(self, d: IRDim) -> SymIntEnc:
        return _enc(self.b, d)

    def guards(self) -> None:
        g, env, b = self.p.graph, self.p.shape_env, self.b
        _Binder(b, env).bind_inputs(g)
        for cond, msg in self.p.assertions:
            b.check(b.expr(cond), b.const(0), f"shape constraint recorded at export failed: {msg}")
        _size_guards(b, g)
        self.symbols = tuple(
            SymbolDecl(s.name, env.range_of(s).min, env.range_of(s).max, b.expr(s))
            for s in env.symbols
            if b.is_bound(s)
        )
        self.values = tuple(
            ValueDecl(n.id, n.type.dtype.value, tuple(_enc(b, d) for d in n.type.shape)) for n in g.nodes
        )
        guards = effective_guards(g)
        nodes = {n.id: n for n in g.nodes}

        def condition(c: Guard) -> dict[str, Any]:
            shape = shape_predicate(nodes, c.pred)
            return {"v": c.pred, "is": c.taken} if shape is None else {"r": b.expr(shape), "is": c.taken}

        self.steps = tuple(
            Step(
                n.op.value,
                n.id,
                n.inputs,
                {f.name: _encode_attr(b, getattr(n.attrs, f.name)) for f in dataclasses.fields(n.attrs)},
                n.loc,
                tuple(condition(c) for c in pruned(nodes, guards[n.id])),
            )
            for n in g.nodes
        )

    def fusion(self, backend: Backend, gemm: GemmPolicy = CUBLAS) -> Lowerer:
        return Lowerer(self.p, fusion_for(self.p, backend, gemm), self.enc, self.b.expr, backend, gemm)

    def memory_plan(self, lowerer: Lowerer) -> NativeLowering:
        low = self.natives[lowerer.backend.kind] = memory_plan(lowerer)
        return low

    def finish(self) -> LoweredPlan:
        p, g, b = self.p, self.p.graph, self.b
        natives = self.natives
        host = next((low for low in natives.values() if low.backend.caps.host_arena), None)
        if host is not None:  # the host plan's arena, else the liveness estimate of the reference executor
            arena_text, arena_enc = host.plan.arena_bytes_expr, host.plan.arena_bytes
        else:
            arena = _arena_expr(p)
            arena_text, arena_enc = dim_str(arena), _enc(b, arena)
        program = b.finish().to_manifest()
        types = g.value_types()

        def decl(name: str, vid: int) -> TensorDecl:
            t = types[vid]
            return TensorDecl(name, vid, t.dtype.value, tuple(d if isinstance(d, int) else dim_str(d) for d in t.shape))

        batches = batch_proofs(p)
        plan = ExecPlan(
            symbols=self.symbols,
            inputs=tuple(decl(i.name, i.id) for i in g.inputs),
            outputs=tuple(decl(n, o) for n, o in zip(g.output_names, g.outputs)),
            weights=tuple(
                WeightDecl(w.name, w.id, w.type.dtype.value, tuple(int(d) for d in w.type.shape), k)
                for k, w in enumerate(g.weights)
            ),
            values=self.values,
            steps=self.steps,
            shape_program=program,
            arena_bytes_expr=arena_text,
            arena_bytes=arena_enc,
            output_structure=p.output_structure,
            kernels=tuple(row for low in natives.values() for row in low.kernel_rows),
            gemm_configs=tuple(row for low in natives.values() for row in low.gemm_rows),
            batch_dims={proof.symbol: proof.to_manifest() for proof in batches},
            padding_dims={proof.symbol: proof.to_manifest() for proof in padding_proofs(p, batches)},
            **{f"native_{kind}": low.plan for kind, low in natives.items()},
        )
        sources = KernelSources(
            {kind: low.sources for kind, low in natives.items()},
            {kind: low.fusion.text(g) for kind, low in natives.items()},
        )
        return LoweredPlan(plan, sources)


def build_plan(p: Program, backends: Sequence[Backend] = (), gemm: GemmPolicy = CUBLAS) -> LoweredPlan:
    """The execution plan and the kernel sources it needs built: the shape program, reference steps,
    and a native plan per backend (none: the reference executor runs every step); `gemm` says how the
    backends' GEMMs are served. The plan stages of optimize (PlanBuilder) in one call."""
    builder = PlanBuilder(p)
    builder.guards()
    for backend in backends:
        lowerer = builder.fusion(backend, gemm)
        emit_launches(lowerer)
        builder.memory_plan(lowerer)
    return builder.finish()
