"""The CPU emitter: one C++ function per kernel variant, from a `KernelSpec`.

In: a kernel spec of the fusion plan, the graph, and a function giving the strided view of each
materialized value. Out: `EmittedKernel` — the C++ source of every variant, the predicate (sympy) that
selects each variant at run time, and the argument list all variants share: pointers (stored values
first, then the buffers read), then int64 arguments (shape expressions; see c_render.Args).

How a kernel reads: a value is evaluated at an index (a tuple of sympy expressions over the loop
symbols). Materialized values and layout chains over them are strided loads; elementwise ops evaluate
their operands at the broadcast-adjusted index; permute / slice / expand / reshape transform the index
(Note [Reshape of a strided view] in ir/views.py says when that stays affine); concat and pad
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

import functools
from collections.abc import Callable
from typing import Any

import sympy

from bladepack.codegen.anchor_kernels import reduce_kernel, scan_kernel, scatter_kernel, sort_kernel, topk_kernel
from bladepack.codegen.c_render import CPU_MEMTYPE, Args, Loop
from bladepack.codegen.cpu_channel_tiles import channel_tile_kernel, tile_axis
from bladepack.codegen.cpu_conv import direct_conv_kernel, im2col_kernel, pool_kernel
from bladepack.codegen.cpu_conv_nhwc import nhwc_spatial_reduce_kernel, spatial_reduction
from bladepack.codegen.cpu_conv_winograd import paired_winograd, winograd_conv_kernel
from bladepack.codegen.cpu_dense import dense_body, dense_tiles
from bladepack.codegen.cpu_loops import DECLS, CpuEmitter
from bladepack.codegen.emitter import Emitter
from bladepack.codegen.kernel import ROW_OPS, EmittedKernel, KernelContext, kernel_cost, same_shape, store_offset
from bladepack.codegen.operand_check import add_atoms, operand_buffers, operand_check
from bladepack.codegen.recurrent_kernel import recurrent_kernel
from bladepack.codegen.row_emitter import RowEmitter
from bladepack.codegen.selective_scan_kernel import selective_scan_kernel
from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import KernelSpec
from bladepack.ir.ops import AxisAttrs, is_dense_conv
from bladepack.ir.types import IRDim
from bladepack.ir.views import View, simplify


def _loop_kernel(em: Emitter, simd: bool) -> None:
    dom = em.spec.domain
    nodes = [em.ctx.nodes[v] for v in em.spec.nodes]
    if not dom:
        for r in em.spec.roots:
            em.line(f"{em.ptr_store(r)}[0] = {em.eval(r, ())};")
        return
    n_last = em.args.ref(dom[-1])

    split = _outer_concat(em)

    def body(outer: tuple[Loop, ...]) -> None:
        j = Loop(f"i{len(dom) - 1}")
        idx = (*outer, j)
        header = [f"for (int64_t {j.name} = 0; {j.name} < {n_last}; ++{j.name}) {{"]
        if simd:
            header.insert(0, "#pragma omp simd")

        def store() -> None:
            for r in em.spec.roots:
                val = em.eval(r, idx)
                em.line(f"{em.ptr_store(r)}[{em.args.index(store_offset(dom, idx))}] = {val};")

        if split is None:
            em.loop(header, [j], store)
            return
        # Note [Concatenation along an outer axis]: the kernel's one result is a concat along an axis
        # the row loop fixes, so which input a row reads is decided once per row: one inner loop per
        # input under an if-chain, each free of the branch and with its row-invariant work (an
        # interpolation's source row and weights) hoisted out of the loop, not recomputed per
        # element behind a per-element branch. Each branch is a barrier scope: nothing a branch
        # computes (a load at its own offset) runs for another branch's rows.
        parts = em.concat_parts(split, idx)
        offset = em.args.index(store_offset(dom, idx))
        for k, (cond, v, at) in enumerate(parts):
            em.line("else {" if k == len(parts) - 1 else f"{'if' if k == 0 else 'else if'} ({cond}) {{")

            value = em._thunk(v, at, split.type.dtype)
            scope = em.push(barrier=True)
            em.loop(header, [j], lambda: em.line(f"{em.ptr_store(split.id)}[{offset}] = {value()};"))
            em.pop()
            em.scopes[-1].lines.extend("  " + ln for ln in scope.lines)
            em.line("}")

    em.rows_loop(dom[:-1], f"{em.args.ref(dom[-1])} * {kernel_cost(nodes)}", body)


def _outer_concat(em: Emitter) -> Node | None:
    """The concat, when a loop kernel's one result is a concat along an axis other than its innermost
    (Note [Concatenation along an outer axis])."""
    if len(em.spec.roots) != 1:
        return None
    n = em.ctx.nodes.get(em.spec.roots[0])
    dom = em.spec.domain
    if n is None or n.op is not OpKind.CONCAT or len(n.inputs) < 2 or not same_shape(n.type.shape, dom):
        return None
    assert isinstance(n.attrs, AxisAttrs)
    return n if n.attrs.axis % len(dom) < len(dom) - 1 else None


def _row_kernel(em: Emitter, simd: bool) -> None:
    assert isinstance(em, RowEmitter), "row kernels need the row-op statistics"
    dom = em.spec.domain
    k = em.spec.reduced
    r = len(dom) - k
    nodes = [em.ctx.nodes[v] for v in em.spec.nodes]
    em.simd = simd
    em.row_ops = {v for v in em.spec.nodes if em.ctx.nodes[v].op in ROW_OPS}
    full_roots = [v for v in em.spec.roots if same_shape(em.ctx.types[v].shape, dom)]
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
            em.line(f"{em.ptr_store(v)}[{em.args.index(store_offset(shape, idx))}] = {val};")
        if not full_roots:
            return
        inner = [Loop(f"r{r + m}") for m in range(k)]
        idx = (*outer, *inner)

        def store() -> None:
            for v in full_roots:
                at = f"{em.ptr_store(v)}[{em.args.index(store_offset(dom, idx))}]"
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
    em.rows_loop(dom[:r], f"{em.args.ref(length)} * {kernel_cost(nodes) * 3}", body)


def _function(name: str, em: Emitter, ptr_types: list[tuple[str, bool]], nints: int) -> str:
    decls = []
    for k, (ct, writable) in enumerate(ptr_types):
        q = "" if writable else "const "
        decls.append(f"{q}{ct}* BPK_RESTRICT p{k} = static_cast<{q}{ct}*>(P[{k}]); (void)p{k};")
    decls.extend(f"const int64_t a{k} = I[{k}]; (void)a{k};" for k in range(nints))
    head = [f"BPK_KERNEL void {name}(bpk::RunState* st, void* const* P, const int64_t* I) {{", "  (void)st; (void)I;"]
    head.extend("  " + d for d in decls)
    body: list[str] = []
    for ln in em.scopes[0].lines:
        if ln.strip() == DECLS:
            pad = ln[: len(ln) - len(ln.lstrip())]
            body.extend("  " + pad + d for d in decls)
        else:
            body.append("  " + ln)
    return "\n".join(head + body + ["}", ""])


def _dense(ctx: KernelContext, v: int) -> bool:
    n = ctx.nodes[v]
    return is_dense_conv(n.attrs, ctx.types[n.inputs[1]].shape)


Plans = list[tuple[str, Any, Callable[[Emitter], None]]]  # (name suffix, predicate, body) per variant


def emit_kernel(
    spec: KernelSpec, ctx: KernelContext, conv: tuple[Node, View] | None = None, library: Plans | None = None
) -> EmittedKernel:
    """All variants of one kernel. `conv` (the convolution and its input view) makes an im2col kernel;
    `library` gives a library op's variants (library_ops/: fused attention)."""
    args = Args()
    stores = list(spec.roots)
    loads: list[View] = []
    plans: Plans
    if library is not None:
        plans = library
    elif conv is not None:
        plans = [("", sympy.true, lambda em: im2col_kernel(em, conv[0], conv[1], spec.roots[0]))]
    elif spec.kind == "loop" and (axis := tile_axis(spec, ctx)) is not None:
        plans = [("_ctile", sympy.true, functools.partial(channel_tile_kernel, axis=axis))]  # Note [Channel tiles]
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
        nhwc = spatial_reduction(ctx.nodes, ctx.types, spec.roots[0])  # Note [Channels-last chains]
        plans = [("", sympy.true, nhwc_spatial_reduce_kernel if nhwc else reduce_kernel)]
    elif spec.kind == "scan":
        plans = [("", sympy.true, scan_kernel)]
    elif spec.kind == "topk":
        plans = [("", sympy.true, topk_kernel)]
    elif spec.kind == "sort":
        plans = [("", sympy.true, sort_kernel)]
    elif spec.kind == "scatter":
        plans = [("", sympy.true, scatter_kernel)]
    elif spec.kind == "recurrent":
        plans = [("", sympy.true, functools.partial(recurrent_kernel, team=True))]
    elif spec.kind == "selective_scan":
        plans = [("", sympy.true, functools.partial(selective_scan_kernel, blocked=True))]
    elif spec.kind == "pool":
        plans = [("", sympy.true, pool_kernel)]
    elif spec.kind == "conv" and _dense(ctx, spec.nodes[0]):  # Note [Dense layers]
        plans = [(f"_t{tile}", pred, dense_body(tile)) for tile, pred in dense_tiles(ctx.nodes[spec.nodes[0]])]
    elif spec.kind == "conv" and (pred := paired_winograd(ctx.nodes[spec.nodes[0]], ctx.types)) is not None:
        plans = [("_winograd", pred, winograd_conv_kernel), ("_direct", sympy.true, direct_conv_kernel)]
        plans = plans[:1] if pred == sympy.true else plans[1:] if pred == sympy.false else plans
    elif spec.kind == "conv":
        plans = [("", sympy.true, direct_conv_kernel)]
    else:
        raise ValueError(f"unknown kernel kind {spec.kind}")
    bodies: list[tuple[str, Any, Emitter]] = []
    errors: list[str] = []
    for suffix, pred, fn in plans:
        em = CpuEmitter(spec, ctx, args, stores, loads)
        fn(em)
        bodies.append((f"{spec.name}{suffix}", pred, em))
        errors = em.error_sites
    ptr_types = [(CPU_MEMTYPE[ctx.types[v].dtype], True) for v in stores]
    ptr_types += [(CPU_MEMTYPE[ctx.types[v.base].dtype], False) for v in loads]
    buffers = operand_buffers(ctx, stores, loads)
    add_atoms(args, buffers)  # Note [Kernel operand checks]: before the functions fix their operand count
    lines = [f"// {spec.name}: {spec.kind} kernel{' from ' + spec.loc if spec.loc else ''}"]
    for name, _pred, body in bodies:
        lines.append(_function(name, body, ptr_types, len(args.exprs)))
    check = f"{spec.name}_check"
    lines.append(operand_check(check, args, buffers))
    variants = [(n, p) for n, p, _ in bodies]
    return EmittedKernel(spec.name, spec, variants, stores, loads, args, "\n".join(lines), errors, check)
