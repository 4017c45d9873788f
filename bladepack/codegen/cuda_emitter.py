"""The CUDA emitter: `__global__` kernel variants from a `KernelSpec`, with their launch geometry.

In: a kernel spec of the fusion plan and the same `KernelContext` the CPU emitter reads. Out:
`CudaKernel` — CUDA C of every variant, the predicate choosing each variant (first true wins), each
variant's grid / block / dynamic shared memory as sympy expressions over the shape symbols (the shape
program computes them per input signature), and the argument list all variants share.

Expressions come from the CPU emitter's `Emitter` (same index algebra, same loop-invariant placement,
same C renderer); this module supplies the GPU schedules and memory access.

Note [CUDA kernel ABI]: every kernel takes `(int64_t* st, p0..pN, a0..aM)` — the launch's status words
(errors; bpk::fail in cuda_runtime.cuh), the pointers (stored values first, then buffers read), then the
int64 shape arguments. Every parameter is 8 bytes, so the loader packs a launch's parameters as one
array of 64-bit words.

Note [Register types]: float16 and bfloat16 live in registers as float (c_render.CTYPE): loads widen,
stores round, a cast rounds explicitly, so a fused kernel accumulates in fp32 and rounds once per
stored element. Sums of float32 accumulate in float32 in tree order (warp / block reductions), as
torch's CUDA kernels do; float64 stays float64.

Schedules and variants:
- loop kernels: each thread computes W consecutive elements of the innermost dim (W in 8 / 4 / 2 / 1,
  W x the widest stored element <= 16 bytes, the innermost extent divisible by W); loads that are
  contiguous across the W lanes become one vector load when the address is aligned (tested per access,
  so misaligned views stay correct), stores likewise; grid-stride over the rest, a large kernel's
  threads taking several vectors each in an unrolled loop (Note [Vectors in flight]). A loop kernel
  with an operand read contiguously along another dim than the last (a permute's source) has a tiled
  variant first: Note [Transpose tiles] in cuda_tiles.py.
- row kernels (reductions over trailing axes, softmax, layer / RMS norm with their fused producers and
  consumers): one warp per row (8 rows per 256-thread block) for rows up to 1024 elements, one
  512-thread block per row above. Note [Row vectors]: where the row is one axis and its length is a
  multiple of W (W x the widest stored element = 16 bytes), each thread takes W consecutive elements
  per step, so its loads of contiguous values are one 16-byte access when aligned (tested per access,
  as in loop kernels) and its results go out in one vector store; other lengths take the scalar walk.
  Note [Rows in registers]: when the kernel has a multi-pass row op (softmax, log-softmax, layer norm,
  RMS norm) whose input is float32 / float16 / bfloat16, each thread computes its part of that input
  row once into a register array (float) and every later pass reads it there: rows up to 1024
  elements in a warp (32 floats a lane), up to 8192 in a block (16 a thread). A thread walks its part
  in a fixed number of fully unrolled steps (the array's indices are constants, so ptxas keeps it in
  registers; tests check for no stack frame and no spills), each step guarded by the row's end where
  the length is dynamic; a static length gets exactly the steps it needs. All of a row's loads are
  in flight before its first reduction, and there is no shared-memory round trip (the shared-memory
  row cache this replaces wrote W consecutive floats per lane, a 4-way bank conflict on every access
  for W = 4). These variants are built with `__launch_bounds__(threads, 1)`: left to its default
  target, ptxas spilled a 512-thread block's row at 40 registers. Longer rows recompute the input per
  pass. Note [Row moments] (cuda_runtime.cuh): layer norm's mean and variance and a softmax's maximum
  and sum take one cross-thread reduction each, merging per-thread statistics.
- reduce kernels (anchor reductions over any axes, arg-reductions): one thread per output element, so
  threads of a warp read adjacent columns when the reduced axes lead (column reductions coalesce).
  Note [Split reductions]: with few outputs (at most 32768: a thread each would leave a large GPU
  idle, a mean over a sequence at batch 1 ran on 3 blocks) and long reductions, a block computes 32
  consecutive outputs with 8 threads each — a warp per share of the reduced positions (strided by 8),
  its lanes on adjacent outputs, so its loads still coalesce — and combines the 8 partial results
  through shared memory in share order; below 32 outputs a block takes one output and all 256
  threads share it (combined as a row reduction). Sums, means, products, max and min; arg-reductions
  keep a thread per output. The combination order is fixed, so results repeat exactly.
- scan kernels: one thread per scanned line.
- attention kernels: a block per (leading index, query rows), its warps splitting the keys
  (Note [Online softmax on CUDA] in library_ops/cuda_attention.py).
- pooling, direct convolutions and im2col: codegen/cuda_conv.py (Note [CUDA convolution]).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy

from bladepack.codegen.anchor_kernels import reduce_kernel, scan_kernel, scatter_kernel, sort_kernel, topk_kernel
from bladepack.codegen.c_render import CTYPE, Args, Loop
from bladepack.codegen.cuda_conv import direct_conv_kernel, im2col_kernel, pool_kernel
from bladepack.codegen.cuda_grid_reduce import combine_variant, grid_variant, grid_workspace
from bladepack.codegen.cuda_loops import (
    BLOCK_SCRATCH,
    MEMTYPE,
    SPLIT_OUTS,
    SPLIT_THREADS,
    CudaEmitter,
    split_index,
    volume,
)
from bladepack.codegen.cuda_tiles import TILE_THREADS, tile_variant
from bladepack.codegen.kernel import ROW_OPS, KernelContext, same_shape, store_offset
from bladepack.codegen.operand_check import add_atoms, operand_buffers
from bladepack.codegen.recurrent_kernel import recurrent_kernel
from bladepack.codegen.selective_scan_kernel import selective_scan_kernel
from bladepack.dtypes import DType
from bladepack.ir import OP_INFO, Node, OpClass, OpKind
from bladepack.ir.fusion_plan import KernelSpec
from bladepack.ir.ops import ReduceAttrs
from bladepack.ir.types import IRDim
from bladepack.ir.views import View, simplify

LOOP_BLOCK = 256
# Note [Vectors in flight]: a loop kernel over more than LOOP_WAVE blocks' worth of vectors (enough to
# fill a large GPU's SMs several times over) gives each thread LOOP_STEPS vectors, its grid-stride loop
# unrolled that many times: the loads of the steps are independent (restrict pointers), so they are
# issued before the first result is needed, instead of one 16-byte load per thread in flight
LOOP_STEPS = 4
LOOP_WAVE = 2048
CONV_BLOCK = 128  # direct convolution: up to 64 accumulators per thread
WARP_ROWS = 8  # rows per block in the warp-per-row schedule (8 warps of 32)
ROW_BLOCK = 512  # threads per block in the block-per-row schedule
RECURRENT_BLOCK = 32  # one thread per sequence: small blocks spread a small batch over SMs
WARP_ROW_MAX = 1024
REG_WARP_MAX = 1024  # Note [Rows in registers]: 32 floats a lane
REG_BLOCK_MAX = 8192  # 16 floats a thread of a 512-thread block
MAX_GRID = 1 << 20  # grid-stride loops cover the rest
SORT_THREAD_MAX = 64  # Note [Block sort]: lines up to this long are one thread's heapsort
SORT_BLOCKS = (256, 1024, 4096)  # longer ones up to each bound a block's bitonic network
SORT_THREADS = 512
# Note [Split reductions]: a reduce kernel with at most SPLIT_ROWS_MAX outputs (a thread each would not
# fill a large GPU) and reductions of at least SPLIT_MIN elements gives each output several threads
SPLIT_ROWS_MAX = 32768
SPLIT_MIN = 64
_MULTI_PASS = (OpKind.SOFTMAX, OpKind.LOG_SOFTMAX, OpKind.LAYER_NORM, OpKind.RMS_NORM)


def _bounded(lo: Any, x: Any, hi: Any) -> Any:
    """max(lo, min(x, hi)): simplified where `x` is a number; else left as built, since sympy's Max and
    Min compare their arguments through the assumptions system (a SegFormer's grids of nested floors
    took 11 s of its optimize) and the shape program evaluates either form alike."""
    evaluate = not sympy.sympify(x).free_symbols
    return sympy.Max(lo, sympy.Min(x, hi, evaluate=evaluate), evaluate=evaluate)


def launch_grid(work: Any, per_block: int) -> Any:
    """Blocks for `work` items at `per_block` a block (grid-stride loops cover what is over MAX_GRID)."""
    return _bounded(1, sympy.ceiling(sympy.sympify(work) / per_block), MAX_GRID)


def loop_grid(threads: Any) -> Any:
    """Note [Vectors in flight]: blocks for a loop kernel's `threads` (one W-wide vector each): one
    block per LOOP_BLOCK threads up to LOOP_WAVE blocks, beyond that LOOP_STEPS vectors a thread, so a
    large kernel's threads each have several independent vector loads to issue before they wait."""
    work = sympy.sympify(threads)
    wave = _bounded(sympy.ceiling(work / (LOOP_BLOCK * LOOP_STEPS)), sympy.ceiling(work / LOOP_BLOCK), LOOP_WAVE)
    return _bounded(1, wave, MAX_GRID)


# a variant to emit: (name suffix, predicate, body emitter, grid, block size, dynamic shared bytes)
CudaPlan = tuple[str, Any, Callable[[CudaEmitter], None], Any, int, Any]


@dataclass(frozen=True)
class CudaVariant:
    name: str
    pred: Any  # sympy boolean
    grid: Any  # sympy expression: blocks in x
    block: int
    smem: Any  # sympy expression: dynamic shared memory bytes


@dataclass
class CudaKernel:
    name: str
    spec: KernelSpec
    variants: list[CudaVariant]
    stores: list[int]
    loads: list[View]
    args: Args
    source: str
    error_sites: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- kernel bodies


def _loop_kernel(em: CudaEmitter, width: int) -> None:
    dom = em.spec.domain
    if not dom:
        em.line("if (blockIdx.x == 0 && threadIdx.x == 0) {")
        for r in em.spec.roots:
            em.store(r, sympy.Integer(0), em.eval(r, ()))
        em.line("}")
        return
    outer = tuple(Loop(f"i{k}") for k in range(len(dom) - 1))
    j = Loop(f"i{len(dom) - 1}")
    lane = Loop("l0")
    em.lane, em.width = lane, width
    total = volume(dom[:-1])
    chunks = simplify(sympy.sympify(dom[-1]) / width) if width > 1 else dom[-1]
    threads = em.args.ref(simplify(total * chunks))
    header = [
        f"#pragma unroll {LOOP_STEPS}",  # Note [Vectors in flight]
        "for (int64_t t_ = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; "
        f"t_ < {threads}; t_ += int64_t(gridDim.x) * blockDim.x) {{",
    ]
    # Note [Narrow index division]: the thread's position split into the last dim's vector and the rest
    narrow = em.narrow(dom)
    prologue = split_index("t_", (Loop("u_"), Loop("c_")), (total, chunks), em.args, narrow)
    prologue.append(f"const int64_t {j.name} = c_ * {width};")
    prologue += split_index("u_", outer, dom[:-1], em.args, narrow)

    def body() -> None:
        idx = (*outer, j + lane)
        outs = {r: em.fresh("o") for r in em.spec.roots}
        for r, o in outs.items():
            em.line(f"{CTYPE[em.ctx.types[r].dtype]} {o}[{width}];")

        def lanes() -> None:
            for r, o in outs.items():
                em.line(f"{o}[{lane.name}] = {em.eval(r, idx)};")

        em.loop(
            ["#pragma unroll", f"for (int {lane.name} = 0; {lane.name} < {width}; ++{lane.name}) {{"],
            [lane],
            lanes,
        )
        base = store_offset(dom, (*outer, j))
        for r, o in outs.items():
            em.line(f"bpk::stv<{width}>({em.ptr_store(r)} + {em.args.index(base)}, {o});")

    em.loop(header, (*outer, j), body, prologue=prologue)


def _row_kernel(em: CudaEmitter, warp: bool, steps: int = 0, width: int = 1, ragged: bool = True) -> None:
    """A row kernel (one warp or one block per row); `steps` > 0 keeps the row in registers (Note
    [Rows in registers]: that many unrolled steps of `width` elements per thread, `ragged` where the
    last step may pass the row's end)."""
    dom = em.spec.domain
    em.row_width = width
    k = em.spec.reduced
    r = len(dom) - k
    em.row_ops = {v for v in em.spec.nodes if em.ctx.nodes[v].op in ROW_OPS}
    em.softmax_in_place = None  # registers (or L2) serve the last pass instead
    em.block_reduce = not warp
    full_roots = [v for v in em.spec.roots if same_shape(em.ctx.types[v].shape, dom)]
    row_roots = [v for v in em.spec.roots if v not in full_roots]
    rows = volume(dom[:r])
    outer = tuple(Loop(f"i{m}") for m in range(r))
    if warp:
        em.line("const int64_t lane_ = threadIdx.x & 31, warp_ = threadIdx.x >> 5;")
        em.thread, em.stride = "lane_", "32"
        first, step = f"int64_t(blockIdx.x) * {WARP_ROWS} + warp_", f"int64_t(gridDim.x) * {WARP_ROWS}"
    else:
        # block_all: one value per warp, up to 32 warps of Note [Row moments]' three 8-byte fields
        em.line(BLOCK_SCRATCH)
        em.thread, em.stride = "int64_t(threadIdx.x)", "int64_t(blockDim.x)"
        first, step = "int64_t(blockIdx.x)", "int64_t(gridDim.x)"
    em.steps, em.ragged = steps, ragged
    cache_vid = _cache_value(em.spec, em.ctx) if steps else None
    header = [f"for (int64_t row_ = {first}; row_ < {em.args.ref(rows)}; row_ += {step}) {{"]

    def body() -> None:
        em.outer = outer
        em.row_stats = {}
        em.cache_ready = False
        if cache_vid is not None:
            x_t = em.ctx.types[cache_vid].dtype
            em.line(f"float bpk_row[{steps * width}];  // Note [Rows in registers]")

            def fill(inner: tuple[sympy.Expr, ...]) -> None:
                val = em._as(em.eval(cache_vid, (*outer, *inner)), x_t, DType.FLOAT32)
                em.line(f"bpk_row[{em.position}] = {val};")

            em.cache = (cache_vid, tuple(sympy.sympify(s) for s in (*outer, *em.row_index())), "bpk_row")
            em._elements(fill)
            em.cache_ready = True
        for v in row_roots:
            shape = em.ctx.types[v].shape
            idx = tuple(outer) + (sympy.Integer(0),) * (len(shape) - len(outer))
            val = em.eval(v, idx)
            em.line(f"if ({em.thread} == 0) {{")
            em.store(v, store_offset(shape, idx), val)
            em.line("}")
        if not full_roots:
            return

        if width == 1:

            def store(inner: tuple[sympy.Expr, ...]) -> None:
                idx = (*outer, *inner)
                for v in full_roots:
                    em.store(v, store_offset(dom, idx), em.eval(v, idx))

            em._elements(store)
            return
        # Note [Row vectors]: each step's W results of a root go out in one vector store
        outs = {v: em.fresh("o") for v in full_roots}

        def lane_values(inner: tuple[sympy.Expr, ...]) -> None:
            for v, o in outs.items():
                em.line(f"{o}[l0] = {em.eval(v, (*outer, *inner))};")

        def vector_stores(first: sympy.Expr) -> None:
            for v, o in outs.items():
                at = em.args.index(store_offset(dom, (*outer, first)))
                em.line(f"bpk::stv<{width}>({em.ptr_store(v)} + {at}, {o});")

        for v, o in outs.items():
            em.line(f"{CTYPE[em.ctx.types[v].dtype]} {o}[{width}];")
        em._elements(lane_values, vector_stores)

    em.loop(header, outer, body, prologue=split_index("row_", outer, dom[:r], em.args, em.narrow(dom[:r])))


def _cache_value(spec: KernelSpec, ctx: KernelContext) -> int | None:
    """Note [Rows in registers]: the value a row kernel keeps in registers — the input of its first
    multi-pass row op; or, where its first row op takes one pass (a sum, mean, max, ...) and the kernel
    then stores full rows (a second pass), that op's input followed down through elementwise ops of one
    row-shaped operand (x in x * rsqrt(mean(x * x)), which the second pass reads again). Float rows only."""
    inside = set(spec.nodes)

    def float_row(v: int) -> bool:
        t = ctx.types[v]
        return t.dtype in (DType.FLOAT32, DType.FLOAT16, DType.BFLOAT16) and same_shape(t.shape, spec.domain)

    for v in spec.nodes:
        n = ctx.nodes[v]
        if n.op in _MULTI_PASS:
            return n.inputs[0] if float_row(n.inputs[0]) else None
        if n.op in ROW_OPS:
            if not any(same_shape(ctx.types[r].shape, spec.domain) for r in spec.roots):
                return None  # one pass: nothing reads the row again
            x = n.inputs[0]
            while x in inside and OP_INFO[ctx.nodes[x].op].op_class <= OpClass.BROADCAST:
                rows = {u for u in ctx.nodes[x].inputs if same_shape(ctx.types[u].shape, spec.domain)}
                if len(rows) != 1:
                    break
                (x,) = rows
            return x if float_row(x) else None
    return None


# --------------------------------------------------------------------------- entry points


def _function(name: str, em: CudaEmitter, ptr_types: list[tuple[str, bool]], nints: int, block: int) -> str:
    params = ["int64_t* __restrict__ st"]
    for k, (mt, writable) in enumerate(ptr_types):
        params.append(f"{'' if writable else 'const '}{mt}* __restrict__ p{k}")
    params += [f"const int64_t a{k}" for k in range(nints)]
    # Note [Rows in registers]: one block a multiprocessor is enough, so ptxas may give a thread up to
    # 128 registers (left to its own target, it spilled a 512-thread block's row at 40)
    bounds = f"{block}, 1" if em.steps else f"{block}"
    head = [f'extern "C" __global__ void __launch_bounds__({bounds}) {name}({", ".join(params)}) {{', "  (void)st;"]
    head += [f"  (void)p{k};" for k in range(len(ptr_types))]
    head += [f"  (void)a{k};" for k in range(nints)]
    body = ["  " + ln for ln in em.scopes[0].lines]
    emu = [
        "#ifdef BPK_EMULATE",
        f'extern "C" void bpk_emu_{name}(const uint64_t* w) {{',
        f"  {name}(" + ", ".join(_emu_args(ptr_types, nints)) + ");",
        "}",
        f'extern "C" const int bpk_emu_coop_{name} = {int(em.uses_barriers)};',
        "#endif",
    ]
    return "\n".join([*head, *body, "}", *emu, ""])


def _emu_args(ptr_types: list[tuple[str, bool]], nints: int) -> list[str]:
    out = ["reinterpret_cast<int64_t*>(w[0])"]
    for k, (mt, writable) in enumerate(ptr_types):
        out.append(f"reinterpret_cast<{'' if writable else 'const '}{mt}*>(w[{1 + k}])")
    out += [f"static_cast<int64_t>(w[{1 + len(ptr_types) + k}])" for k in range(nints)]
    return out


def _split_reduce(em: CudaEmitter, outs: int) -> None:
    em.shares = (outs, SPLIT_THREADS // outs)
    reduce_kernel(em)


def _split_reduce_plans(n: Node, x_t: Any, outputs: IRDim) -> list[CudaPlan]:
    """Note [Split reductions]: a reduce kernel's variants for few outputs over long reductions, ahead
    of the thread-per-output one: 32 outputs a block, 8 threads sharing each (`_split32`), or, below 32
    outputs, one output a block shared by all its threads (`_split1`)."""
    assert isinstance(n.attrs, ReduceAttrs)
    rank = len(x_t.shape)
    length = sympy.sympify(volume([x_t.shape[a % rank] for a in n.attrs.axes]) if rank else 1)
    rows = sympy.sympify(outputs)
    plans: list[CudaPlan] = []
    for suffix, outs, pred in (
        ("_split1", 1, sympy.And(sympy.Lt(rows, SPLIT_OUTS), sympy.Ge(length, SPLIT_THREADS))),
        ("_split32", SPLIT_OUTS, sympy.And(sympy.Le(rows, SPLIT_ROWS_MAX), sympy.Ge(length, SPLIT_MIN))),
    ):
        if pred is sympy.false:
            continue
        body = functools.partial(_split_reduce, outs=outs)
        plans.append((suffix, pred, body, launch_grid(outputs, outs), SPLIT_THREADS, 0))
        if pred is sympy.true:
            break
    return plans


def _widths(spec: KernelSpec, ctx: KernelContext) -> list[int]:
    widest = max((ctx.types[v].dtype.itemsize for v in spec.roots), default=4)
    return [w for w in (8, 4, 2, 1) if w * widest <= 16]


def emit_cuda_kernel(
    spec: KernelSpec,
    ctx: KernelContext,
    index: int,
    conv: tuple[Node, View] | None = None,
    library: Sequence[CudaPlan] = (),
) -> CudaKernel:
    """All variants of kernel `index` of the CUDA plan (raises ValueError for kernel kinds without a
    CUDA schedule). Its error codes carry `index` (Note [CUDA error codes]). `conv` (the convolution and
    its input view) makes an im2col kernel (Note [CUDA convolution] in codegen/cuda_conv.py); `library`
    gives a library op's variants (library_ops/cuda_attention.py: fused attention)."""
    args = Args()
    plans: list[CudaPlan] = []
    workspace = grid_workspace(spec, ctx)
    if workspace is not None:  # Note [Grid reductions]: the "_grid" variant first, given its parts' workspace
        spec = dataclasses.replace(spec, roots=spec.roots[:-1])
        pred, body, blocks = grid_variant(ctx.nodes[spec.roots[0]], ctx, workspace)
        plans.append(("_grid", pred, body, launch_grid(blocks, 1), SPLIT_THREADS, 0))
    stores = [*spec.roots, *([] if workspace is None else [workspace])]
    loads: list[View] = []
    if library:  # a library op's own variants
        plans.extend(library)
    elif conv is not None:
        cols = spec.roots[0]
        body = functools.partial(im2col_kernel, conv=conv[0], x_view=conv[1], cols=cols)
        plans.append(("", sympy.true, body, launch_grid(volume(ctx.types[cols].shape), LOOP_BLOCK), LOOP_BLOCK, 0))
    elif spec.kind == "pool":
        n = ctx.nodes[spec.roots[0]]
        plans.append(("", sympy.true, pool_kernel, launch_grid(volume(n.type.shape), LOOP_BLOCK), LOOP_BLOCK, 0))
    elif spec.kind == "conv":
        nb, _oc, oh, ow = ctx.nodes[spec.roots[0]].type.shape
        plans.append(("", sympy.true, direct_conv_kernel, launch_grid(volume((nb, oh, ow)), CONV_BLOCK), CONV_BLOCK, 0))
    elif spec.kind == "loop":
        dom = spec.domain
        last = dom[-1] if dom else 1
        total = volume(dom)
        tiled = tile_variant(spec, ctx, index)  # Note [Transpose tiles] in cuda_tiles.py
        if tiled is not None:
            plans.append(("_tile", tiled[0], tiled[1], launch_grid(tiled[2], 1), TILE_THREADS, 0))
        for w in _widths(spec, ctx) if dom else [1]:
            if isinstance(last, int) and last % w:
                continue
            pred = sympy.true if w == 1 or isinstance(last, int) else sympy.Eq(sympy.Mod(last, w), 0)
            plans.append(
                (
                    f"_w{w}",
                    pred,
                    functools.partial(_loop_kernel, width=w),
                    loop_grid(sympy.sympify(total) / w),
                    LOOP_BLOCK,
                    0,
                )
            )
            if isinstance(last, int):
                break
    elif spec.kind == "row":
        r = len(spec.domain) - spec.reduced
        rows, length = volume(spec.domain[:r]), volume(spec.domain[r:])
        cacheable = _cache_value(spec, ctx) is not None
        # (suffix, length bound, one warp per row, registers a thread may hold the row in)
        candidates: list[tuple[str, int | None, bool, int]] = []
        if cacheable:  # Note [Rows in registers]
            candidates.append(("_warp_reg", REG_WARP_MAX, True, REG_WARP_MAX // 32))
            candidates.append(("_block_reg", REG_BLOCK_MAX, False, REG_BLOCK_MAX // ROW_BLOCK))
        else:
            candidates.append(("_warp", WARP_ROW_MAX, True, 0))
        candidates.append(("_block", None, False, 0))
        # Note [Row vectors]: a one-axis row whose length the vector width divides is walked in vectors
        vec = _widths(spec, ctx)[0] if spec.reduced == 1 else 1
        widths = [(vec, sympy.Eq(sympy.Mod(sympy.sympify(length), vec), 0))] if vec > 1 else []
        widths.append((1, sympy.true))
        for suffix, bound, warp, held in candidates:
            pred = sympy.true if bound is None else sympy.Le(length, bound)
            threads = 32 if warp else ROW_BLOCK
            for width, fits in widths:
                both = sympy.And(pred, fits)
                both = sympy.simplify(both) if isinstance(length, int) else both
                if both is sympy.false:
                    continue
                steps, ragged = held // width, True
                if held and isinstance(length, int):  # a known length: exactly the steps it needs
                    steps, ragged = -(-length // (threads * width)), length % (threads * width) != 0
                plans.append(
                    (
                        suffix + (f"_v{width}" if width > 1 else ""),
                        both,
                        functools.partial(_row_kernel, warp=warp, steps=steps, width=width, ragged=ragged),
                        launch_grid(rows, WARP_ROWS if warp else 1),
                        LOOP_BLOCK if warp else ROW_BLOCK,
                        0,
                    )
                )
                if both is sympy.true:
                    break
            if plans and plans[-1][1] is sympy.true:
                break
    elif spec.kind == "recurrent":  # Note [Recurrent kernel]: one thread per sequence
        batch = ctx.nodes[spec.roots[0]].type.shape[1]
        plans.append(("", sympy.true, recurrent_kernel, launch_grid(batch, RECURRENT_BLOCK), RECURRENT_BLOCK, 0))
    elif spec.kind == "selective_scan":  # Note [Selective scan kernel]: one thread per channel
        rows = volume(ctx.nodes[spec.roots[0]].type.shape[:2])
        plans.append(("", sympy.true, selective_scan_kernel, launch_grid(rows, LOOP_BLOCK), LOOP_BLOCK, 0))
    elif spec.kind == "reduce_combine":  # Note [Grid reductions]: the parts in spec.reads[0]
        body, outputs = combine_variant(ctx.nodes[spec.roots[0]], ctx, spec.reads[0])
        plans.append(("", sympy.true, body, launch_grid(outputs, LOOP_BLOCK), LOOP_BLOCK, 0))
    elif spec.kind in ("reduce", "scan", "topk", "sort", "scatter"):
        n = ctx.nodes[spec.roots[0]]
        x_t = ctx.types[n.inputs[0]]
        fn: Callable[[CudaEmitter], None] = {
            "reduce": reduce_kernel,
            "scan": scan_kernel,
            "topk": topk_kernel,
            "sort": sort_kernel,
            "scatter": scatter_kernel,
        }[spec.kind]
        if spec.kind == "reduce":
            outputs = volume(n.type.shape)
            if n.op not in (OpKind.ARGMAX, OpKind.ARGMIN):
                plans.extend(_split_reduce_plans(n, x_t, outputs))
        else:  # one thread per scanned (or selected-from) line
            axis = getattr(n.attrs, "axis", 0) % max(len(n.type.shape), 1)
            outputs = volume([d for k, d in enumerate(x_t.shape) if k != axis])
        if spec.kind == "sort":  # Note [Block sort]: a block per line where the line fits its network
            length = sympy.sympify(x_t.shape[axis])
            low = SORT_THREAD_MAX
            for bound in SORT_BLOCKS:
                pred = sympy.And(sympy.Gt(length, low), sympy.Le(length, bound))
                low = bound
                if pred is sympy.false:
                    continue
                kernel = functools.partial(sort_kernel, block=bound)
                plans.append((f"_b{bound}", pred, kernel, launch_grid(outputs, 1), min(bound // 2, SORT_THREADS), 0))
                if pred is sympy.true:
                    break
        if not plans or plans[-1][1] is not sympy.true:
            plans.append(("", sympy.true, fn, launch_grid(outputs, LOOP_BLOCK), LOOP_BLOCK, 0))
    else:
        raise ValueError(f"{spec.kind} kernels have no CUDA schedule yet")
    bodies: list[tuple[CudaVariant, CudaEmitter]] = []
    errors: list[str] = []
    for suffix, pred, fn, grid, block, smem in plans:
        em = CudaEmitter(spec, ctx, args, stores, loads, index)
        fn(em)
        bodies.append((CudaVariant(f"{spec.name}{suffix}", pred, grid, block, sympy.sympify(smem)), em))
        errors = em.error_sites
    ptr_types = [(MEMTYPE[ctx.types[v].dtype], True) for v in stores]
    ptr_types += [(MEMTYPE[ctx.types[v.base].dtype], False) for v in loads]
    add_atoms(args, operand_buffers(ctx, stores, loads))  # Note [Kernel operand checks]
    lines = [f"// {spec.name}: {spec.kind} kernel{' from ' + spec.loc if spec.loc else ''}"]
    for var, em in bodies:
        lines.append(_function(var.name, em, ptr_types, len(args.exprs), var.block))
    return CudaKernel(spec.name, spec, [v for v, _ in bodies], stores, loads, args, "\n".join(lines), errors)
