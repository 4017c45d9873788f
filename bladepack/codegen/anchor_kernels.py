"""Anchor kernels both backends share: reductions over arbitrary axes (and arg-reductions), scans,
top-k selection and scatters.

In: an `Emitter` (the CPU's or the CUDA one) whose spec is a "reduce", "scan", "topk" or "scatter" kernel. Out:
the kernel body, one output element (reduce) or one line along the axis (scan, topk) per iteration of
the backend's `rows_loop`.
"""

from __future__ import annotations

import sympy

from bladepack.codegen.c_render import CTYPE, Loop
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import ERR_INDEX_NONNEG, FLOATS, reduce_init, store_offset
from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind
from bladepack.ir.ops import (
    ArgReduceAttrs,
    AxisAttrs,
    ReduceAttrs,
    ScatterAttrs,
    SortAttrs,
    TopkAttrs,
)
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.views import simplify


def reduce_axes(n: Node, rank: int) -> tuple[list[int], bool]:
    """The axes anchor reduction `n` (over an input of `rank` dims) reduces, sorted and non-negative,
    and whether it keeps them as size-1 dims."""
    if isinstance(n.attrs, ArgReduceAttrs):
        return ([n.attrs.axis % rank] if rank else []), n.attrs.keepdim
    assert isinstance(n.attrs, ReduceAttrs)
    return (sorted(a % rank for a in n.attrs.axes) if rank else []), n.attrs.keepdim


def reduce_kind(n: Node) -> str:
    """How a reduction's partial results combine: "sum" (sums and means), "prod", "max" or "min"."""
    return {OpKind.ARGMAX: "max", OpKind.AMAX: "max", OpKind.ARGMIN: "min", OpKind.AMIN: "min"}.get(
        n.op, "prod" if n.op is OpKind.PROD else "sum"
    )


def reduce_kernel(em: Emitter) -> None:
    """An anchor reduction over arbitrary axes (or an arg-reduction): one output element per iteration."""
    n = em.ctx.nodes[em.spec.roots[0]]
    x = n.inputs[0]
    xt = em.ctx.types[x]
    rank = xt.rank
    axes, _keep = reduce_axes(n, rank)
    kept = [d for d in range(rank) if d not in axes]
    arg = n.op in (OpKind.ARGMAX, OpKind.ARGMIN)
    acc_t = xt.dtype if arg else em.accumulator(n)
    t = CTYPE[acc_t]
    big = n.op in (OpKind.ARGMAX, OpKind.AMAX)
    kind = reduce_kind(n)
    init = reduce_init(kind, acc_t)

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
            isnan = f"({v} != {v})" if acc_t in FLOATS else "false"
            if arg:
                pos = red[-1].name if red else "0"
                better = ">" if big else "<"
                em.line(
                    f"if (!{acc}_nan && ({isnan} || {v} {better} {acc})) {{ {acc} = {v}; {acc}_i = {pos}; {acc}_nan = {isnan}; }}"
                )
            elif n.op is OpKind.PROD:
                em.line(f"{acc} = {acc} * {v};")
            elif n.op in (OpKind.AMAX, OpKind.AMIN):
                if acc_t in FLOATS:
                    em.line(f"{acc} = bpk::{'fmax' if big else 'fmin'}_nan<{t}>({acc}, {v});")
                else:
                    em.line(f"{acc} = ({v} {'>' if big else '<'} {acc} ? {v} : {acc});")
            else:
                em.line(f"{acc} = {acc} + {v};")

        em.reduce_loops(red, [xt.shape[a] for a in axes], step)
        if arg:
            em.store(n.id, reduce_offset(n, xt, full), f"int64_t({acc}_i)")
            return
        em.combine_shares(acc, kind, t)
        if not em.store_partial(acc):  # else a part of the output (Note [Grid reductions])
            store_reduced(em, n, xt, acc, acc_t, full)

    em.rows_loop([xt.shape[d] for d in kept], "16", body)


def reduce_offset(n: Node, xt: TensorType, full: list[sympy.Expr]) -> sympy.Expr:
    """The offset in `n`'s output of the element whose input index is `full` (reduced axes: any)."""
    axes, keep = reduce_axes(n, xt.rank)
    kept = [d for d in range(xt.rank) if d not in axes]
    out_idx = [sympy.Integer(0) if d in axes else full[d] for d in range(xt.rank)] if keep else [full[d] for d in kept]
    return store_offset(n.type.shape, out_idx)


def store_reduced(em: Emitter, n: Node, xt: TensorType, acc: str, acc_t: DType, full: list[sympy.Expr]) -> None:
    """Store the output element of (non-arg) reduction `n` at input index `full` from its accumulator
    `acc` of type `acc_t`: a mean divided by its count, then the output's type."""
    dt = n.type.dtype
    if n.op is OpKind.MEAN:
        count: IRDim = 1
        for a in reduce_axes(n, xt.rank)[0]:
            count = simplify(count * xt.shape[a])
        val = f"{CTYPE[dt]}({acc} / {CTYPE[acc_t]}({em.args.ref(count)}))"
    else:
        val = em._as(acc, acc_t, dt)
    em.store(n.id, reduce_offset(n, xt, full), val)


def _line_index(rank: int, axis: int, kept: list[int], outer: tuple[Loop, ...], along: Loop) -> list[sympy.Expr]:
    """The index of one element of a line along `axis`: the row loop's symbols on the other axes."""
    full: list[sympy.Expr] = [sympy.Integer(0)] * rank
    for d, o in zip(kept, outer):
        full[d] = o
    full[axis] = along
    return full


def scan_kernel(em: Emitter) -> None:
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
        full = _line_index(rank, a, kept, outer, s)
        acc = em.fresh("acc")
        em.declare(f"{t} {acc} = {t}(0);", acc)

        def step() -> None:
            v = em._as(em.eval(x, tuple(full)), em.ctx.types[x].dtype, n.type.dtype)
            em.line(f"{acc} = {t}({acc} + {v});")
            em.store(n.id, store_offset(shape, full), acc)

        em.for_loop(s, shape[a], step)

    em.rows_loop([shape[d] for d in kept], "4", body)


def _line_anchor(em: Emitter) -> tuple[Node, int, TensorType, int, list[int]]:
    """The kernel's root node, its input x and x's type, the axis its lines run along and the other
    axes (the rows)."""
    n = em.ctx.nodes[em.spec.roots[0]]
    assert isinstance(n.attrs, (TopkAttrs, SortAttrs))
    x = n.inputs[0]
    xt = em.ctx.types[x]
    a = n.attrs.axis % xt.rank
    return n, x, xt, a, [d for d in range(xt.rank) if d != a]


def topk_kernel(em: Emitter) -> None:
    """The k best positions of each line: one pass over the line keeping the best k so far sorted in a
    register array (insertion, so ties keep the earlier position), then k stores. k is a compile-time
    constant (the front ends refuse a symbolic k, and more than `ir.ops.MAX_TOPK`)."""
    n, x, xt, a, kept = _line_anchor(em)
    assert isinstance(n.attrs, TopkAttrs)
    rank, k = xt.rank, n.attrs.k
    t = CTYPE[xt.dtype]
    floating = xt.dtype in FLOATS
    # better(u, w): u ranks before w. NaN is the largest value, as in torch.topk.
    if n.attrs.largest:
        better = "(({u} != {u}) && !({w} != {w})) || {u} > {w}" if floating else "{u} > {w}"
    else:
        better = "(!({u} != {u}) && ({w} != {w})) || {u} < {w}" if floating else "{u} < {w}"

    def body(outer: tuple[Loop, ...]) -> None:
        s = Loop(f"r{a}")
        full = _line_index(rank, a, kept, outer, s)
        vals, ids, cnt = em.fresh("tv"), em.fresh("ti"), em.fresh("tn")
        em.declare(f"{t} {vals}[{k}]; int64_t {ids}[{k}]; int64_t {cnt} = 0;", vals)

        def step() -> None:
            v = em.fresh("x")
            em.line(f"const {t} {v} = {em.eval(x, tuple(full))};")
            last = f"{vals}[{k - 1}]"
            em.line(f"if ({cnt} < {k} || ({better.format(u=v, w=last)})) {{")
            em.line(f"  int64_t j = {cnt} < {k} ? {cnt}++ : {k - 1};")
            em.line(f"  while (j > 0 && ({better.format(u=v, w=f'{vals}[j - 1]')})) {{")
            em.line(f"    {vals}[j] = {vals}[j - 1]; {ids}[j] = {ids}[j - 1]; --j;")
            em.line("  }")
            em.line(f"  {vals}[j] = {v}; {ids}[j] = {s.name};")
            em.line("}")

        em.for_loop(s, xt.shape[a], step)
        j = Loop(f"o{a}")
        out_idx = list(full)
        out_idx[a] = j
        em.for_loop(j, k, lambda: em.store(n.id, store_offset(n.type.shape, out_idx), f"{ids}[{j.name}]"))

    em.rows_loop([xt.shape[d] for d in kept], "4", body)


def sort_kernel(em: Emitter, block: int = 0) -> None:
    """Note [Sort kernel]: the positions of one line in stable sorted order per iteration, for any
    length (constant or symbolic). The kernel hands the backend's `bpk::sort_line` two accessors: the
    input's value at a position along the line (the producers computed inline, as any anchor's) and
    a reference to the output's k-th position; the CPU sorts (value, position) pairs with std::sort,
    a CUDA thread heapsorts its line in place. `block` (CUDA, lines of at most that many elements,
    a power of two): a block sorts each line in shared memory instead (Note [Block sort] in
    codegen/cuda_runtime.cuh)."""
    n, x, xt, a, kept = _line_anchor(em)
    assert isinstance(n.attrs, SortAttrs)
    rank = xt.rank
    t = CTYPE[xt.dtype]
    out = em.ptr_store(n.id)
    desc = "true" if n.attrs.descending else "false"

    def body(outer: tuple[Loop, ...]) -> None:
        g = Loop(em.fresh("g"))
        scope = em.push([g])  # the value at runtime position g: its definitions form the accessor's body
        value = em.eval(x, tuple(_line_index(rank, a, kept, outer, g)))
        em.pop()
        key, at = em.fresh("key"), em.fresh("at")
        em.line(f"auto {key} = [&](int64_t {g.name}) -> {t} {{")
        em.scopes[-1].lines.extend([*("  " + ln for ln in scope.lines), f"  return {value};", "};"])
        p = Loop(em.fresh("p"))
        off = em.args.index(store_offset(n.type.shape, _line_index(rank, a, kept, outer, p)))
        em.line(f"auto {at} = [&](int64_t {p.name}) -> int64_t& {{ return {out}[{off}]; }};")
        if block:
            em.line(f"bpk::block_sort_line<{t}, {block}>({length}, {desc}, {key}, {at}, bpk_keys, bpk_pos);")
        else:
            em.line(f"bpk::sort_line<{t}>({length}, {desc}, {key}, {at});")

    length = em.args.ref(xt.shape[a])
    if block:
        em.line(f"__shared__ {t} bpk_keys[{block}];")
        em.line(f"__shared__ int bpk_pos[{block}];")
        em.block_rows_loop([xt.shape[d] for d in kept], body)
    else:
        em.rows_loop([xt.shape[d] for d in kept], f"16 * {length}", body)


def scatter_kernel(em: Emitter) -> None:
    """Note [Scatter kernel]: one output line along the scatter axis per iteration, so every element is
    written by one thread and duplicates resolve in index order, as the reference does (the last
    assignment wins; reductions combine in order). The line is self's (pass 1); with include_self
    False the elements an index reaches are reset to the reduction's identity (pass 2); then each index
    position of the line, where the line lies inside index's extent, combines its source value into
    the element it names (pass 3). An index outside [0, size) reports an error and is skipped."""
    n = em.ctx.nodes[em.spec.roots[0]]
    assert isinstance(n.attrs, ScatterAttrs)
    x, index, src = n.inputs
    shape, dt = n.type.shape, n.type.dtype
    rank = len(shape)
    a = n.attrs.axis % max(rank, 1)
    kept = [d for d in range(rank) if d != a]
    it = em.ctx.types[index]
    t = CTYPE[dt]
    reduce, include_self = n.attrs.reduce, n.attrs.include_self
    kind = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}.get(reduce)
    out = em.ptr_store(n.id)
    where = f"scatter along dimension {a} at {n.loc}" if n.loc else f"scatter along dimension {a}"

    def combine(old: str, new: str) -> str:
        if reduce == "sum":
            return f"{t}({old} + {new})"
        if reduce == "prod":
            return f"{t}({old} * {new})"
        if reduce == "amax":
            return f"bpk::fmax_nan<{t}>({old}, {new})" if dt in FLOATS else f"({old} > {new} ? {old} : {new})"
        if reduce == "amin":
            return f"bpk::fmin_nan<{t}>({old}, {new})" if dt in FLOATS else f"({old} < {new} ? {old} : {new})"
        return new

    def body(outer: tuple[Loop, ...]) -> None:
        s = Loop(f"r{a}")
        full = _line_index(rank, a, kept, outer, s)
        em.for_loop(
            s,
            shape[a],
            lambda: em.store(
                n.id, store_offset(shape, full), em._as(em.eval(x, tuple(full)), em.ctx.types[x].dtype, dt)
            ),
        )
        inside = [f"{o.name} < {em.args.ref(it.shape[d])}" for d, o in zip(kept, outer) if it.shape[d] != shape[d]]
        em.line(f"if ({' && '.join(inside) or 'true'}) {{")

        def target(j: Loop) -> tuple[sympy.Expr, ...]:
            pos = _line_index(rank, a, kept, outer, j)
            raw = em.eval(index, tuple(pos))
            em.line(f"int64_t {j.name}_g = int64_t({raw});")
            sz = em.args.ref(shape[a])
            em.error_sites.append(where)
            report = em.fail(f"{ERR_INDEX_NONNEG} + 16 * {len(em.error_sites) - 1}", f"{j.name}_g", sz)
            em.line(f"if ({j.name}_g < 0 || {j.name}_g >= {sz}) {{ {report} continue; }}")
            g = Loop(f"{j.name}_g")
            em.scopes[-1].syms.add(g)
            return tuple(_line_index(rank, a, kept, outer, g))

        if kind is not None and not include_self:
            j0 = Loop(f"j{a}")

            def reset() -> None:
                dst = target(j0)
                em.store(n.id, store_offset(shape, dst), reduce_init(kind, dt))

            em.for_loop(j0, it.shape[a], reset)
        j = Loop(f"s{a}")

        def scatter() -> None:
            dst = target(j)
            pos = _line_index(rank, a, kept, outer, j)
            v = em._as(em.eval(src, tuple(pos)), em.ctx.types[src].dtype, dt)
            off = em.args.index(store_offset(shape, dst))
            new = combine(f"{t}({out}[{off}])", v) if kind is not None else v
            em.line(f"{out}[{off}] = {new};")

        em.for_loop(j, it.shape[a], scatter)
        em.line("}")

    em.rows_loop([shape[d] for d in kept], "8", body)
