"""Lower a fusion plan to one backend's native plan: kernel sources, launch records, arena layout.

In: the optimized `Program`, the backend (bladepack/backends), its `FusionPlan` (`fusion_for`) and the
shape-program builder of `build_plan`. Three stages of optimize: fusion (`fusion_for`), lowering
(`emit_launches`: the backend emits each kernel) and the memory plan (`memory_plan`: arena offsets,
pointers resolved). Out: `NativeLowering` — the source of every kernel (variants included; variants
with a launch geometry also carry their grid, block and shared-memory size as registers), what the
backend builds (`Sources`), and the manifest part the loaders read: the kernel table (variant
functions with their predicates), one launch record per step (pointer arguments as (slot, byte
offset), int arguments), the arena buffers and the arena size. Every
size, offset, stride and predicate is a shape-program register (Note [SymInt encoding] in
artifact/symint.py), so a loader resolves the whole launch list once per input-shape signature.

Note [Guarded launches]: a launch that stores a value under an effective guard (ir/guards.py) carries
its conditions, outermost first: {"r": register, "is": bool} for a shape predicate, {"ptr": [slot,
byte offset], "is": bool} for a data predicate (one byte, 0 or 1, that an earlier launch stored or an
input holds; its buffer stays live through the last launch that reads it). A launch the backend
runs at some shapes only (the combining kernel of Note [Split keys]) carries that predicate's register
too.

Note [Slots]: pointer arguments name a slot — 0 the arena, then the inputs, the outputs and the weights
in signature order — plus a byte offset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from bladepack.artifact.native_plan import (
    ArenaBuffer,
    CublasLtLaunch,
    CutlassLaunch,
    DispatchEntry,
    GemmKernel,
    GemmLaunch,
    KernelLaunch,
    KernelRow,
    KernelVariant,
    Launch,
    NativePlan,
    Ptr,
    RefLaunch,
    with_ptrs,
)
from bladepack.artifact.symint import SymIntEnc
from bladepack.backends import Backend, Sources
from bladepack.codegen.kernel import KernelContext, KernelEmitError
from bladepack.codegen.operand_check import operand_buffers
from bladepack.errors import CompileError
from bladepack.ir import Node, OpKind, Program
from bladepack.ir.fusion_plan import (
    Attention,
    ConvEpilogue,
    FusionPlan,
    GemmEpilogue,
    KernelSpec,
    LibraryStep,
    ReferenceStep,
)
from bladepack.ir.graph import Guard
from bladepack.ir.guards import effective_guards, pruned, shape_predicate
from bladepack.ir.ops import Conv2dAttrs, generated_conv
from bladepack.ir.shape_env import Tri
from bladepack.ir.types import IRDim, TensorType, dim_str
from bladepack.ir.views import View, simplify, view_of
from bladepack.library_ops.cpu_gemm import GemmCall, lower_conv, lower_matmul, operand_ok
from bladepack.library_ops.cutlass.emitter import GemmInstance
from bladepack.library_ops.cutlass.select import CUBLAS, GemmDispatch, GemmPolicy, Measure, select, selection_key
from bladepack.lowering.memory_plan import Buffer, plan_memory
from bladepack.lowering.operand_program import operand_program
from bladepack.passes.fusion import plan_fusion

Enc = Callable[[Any], SymIntEnc]


@dataclass
class NativeLowering:
    """One backend's plan: its fusion plan, emitted kernels, the native plan the manifest holds and
    what the backend builds."""

    backend: Backend
    fusion: FusionPlan
    kernels: list[Any]
    plan: NativePlan
    kernel_rows: list[KernelRow] = field(default_factory=list)
    gemm_rows: list[dict[str, Any]] = field(default_factory=list)
    gemm_instances: list[GemmInstance] = field(default_factory=list)  # CUTLASS kernels (CUDA plans)
    sources: Sources = field(default_factory=Sources)


def gemm_dtypes(launches: Sequence[Any]) -> set[str]:
    """The dtypes of the library GEMM launches (Note [GEMM dtypes of a library] in codegen/cpu_library.py)."""
    return {launch.dtype for launch in launches if isinstance(launch, GemmLaunch)}


def fusion_for(p: Program, backend: Backend, gemm: GemmPolicy = CUBLAS) -> FusionPlan:
    """The fusion plan for `backend`: what its kernels compute, with its capabilities (convolution
    epilogues, fused attention) and its GEMM library's epilogues."""
    types = p.graph.value_types()
    return plan_fusion(
        p,
        lambda node, k, view: operand_ok(p.shape_env, node, k, view),
        backend.caps,
        lambda node: backend.can_emit(node, types),
        backend.gemm_epilogues(gemm),
    )


class Lowerer:
    """Lowers one backend's fusion plan: `lower()` emits every kernel and launch record, `place()` then
    lays out the arena (the memory plan) and resolves every pointer into it."""

    def __init__(
        self,
        p: Program,
        plan: FusionPlan,
        enc: Enc,
        pred: Callable[[Any], int],
        backend: Backend,
        gemm: GemmPolicy,
    ) -> None:
        self.gemm = gemm
        self.p, self.plan, self.enc, self.pred, self.backend = p, plan, enc, pred, backend
        self.gemm_library = backend.gemm_library(gemm)
        self.instances: dict[GemmInstance, int] = {}
        self.dispatches: dict[tuple[GemmCall, str], GemmDispatch] = {}  # Note [GEMM cost model]: per distinct GEMM
        g = p.graph
        self.nodes = {n.id: n for n in g.nodes}
        self.types: dict[int, TensorType] = g.value_types()
        self.mat = set(plan.materialized)
        self.slot: dict[int, int] = {}
        for k, prm in enumerate(g.inputs):
            self.slot[prm.id] = 1 + k
        self.n_in = len(g.inputs)
        self.output_slot: dict[int, int] = {}
        for k, o in enumerate(g.outputs):
            if o in self.nodes and o not in self.output_slot:
                self.output_slot[o] = 1 + self.n_in + k
        for k, w in enumerate(g.weights):
            self.slot[w.id] = 1 + self.n_in + len(g.outputs) + k
        self.slot.update(self.output_slot)
        self.temp_id = max(self.types) + 1
        self.launches: list[Launch] = []
        self.kernels: list[Any] = []
        self.kernel_rows: list[KernelRow] = []
        self.touch: dict[int, list[int]] = {}  # arena value -> launch indices that touch it
        self.sizes: dict[int, IRDim] = {}
        self.fn_count = 0
        self.gemm_rows: list[dict[str, Any]] = []
        self.guards = effective_guards(g)
        self.when: list[tuple[Guard, ...]] = []  # per launch, Note [Guarded launches]
        self.shape_when: dict[int, Any] = {}  # launch -> the shapes it runs at (sympy), besides `when`

    def view(self, v: int) -> View | None:
        return view_of(self.nodes, self.types, v, self.mat.__contains__)

    def _use(self, v: int) -> None:
        if v not in self.slot:
            self.touch.setdefault(v, []).append(len(self.launches))

    def _ptr(self, base: int, elem_offset: IRDim = 0) -> Ptr:
        """(slot, value id, element offset); arena values get their byte offset added later."""
        self._use(base)
        return (self.slot.get(base, 0), base, elem_offset)

    def _context(self) -> KernelContext:
        env = self.p.shape_env
        return KernelContext(self.nodes, self.types, self.view, lambda a, b: env.prove_le(a, b) is Tri.YES)

    def _temp(self, t: TensorType) -> int:
        """A value of the plan that no node computes (an im2col matrix, a kernel's workspace)."""
        v = self.temp_id
        self.temp_id += 1
        self.types[v] = t
        return v

    def _kernel(self, spec: KernelSpec, conv: tuple[Any, View] | None = None, att: Attention | None = None) -> None:
        ctx = self._context()
        try:
            ek = self.backend.emit(spec, ctx, len(self.kernels), conv, att)
        except (ValueError, AssertionError, KeyError) as e:
            culprits = frozenset(v for v in spec.nodes if v in self.nodes) or frozenset(spec.roots)
            raise KernelEmitError(f"{spec.name}: {e}", culprits) from e
        variants = []
        for v in self.backend.variants(ek):
            if v.grid is None:
                variants.append(KernelVariant(v.name, self.fn_count, self.pred(v.pred)))
            else:
                variants.append(
                    KernelVariant(v.name, self.fn_count, self.pred(v.pred), self.enc(v.grid), v.block, self.enc(v.smem))
                )
            self.fn_count += 1
        ptrs = [self._ptr(v) for v in ek.stores] + [self._ptr(v.base) for v in ek.loads]
        check = None
        if self.backend.caps.operand_programs:  # Note [Kernel operand checks]: else the library checks its own
            check = operand_program(ek.args.exprs, operand_buffers(ctx, ek.stores, ek.loads)).to_manifest()
        self.kernel_rows.append(
            KernelRow(
                spec.name,
                self.backend.kind,
                spec.kind,
                spec.loc,
                spec.nodes,
                tuple(variants),
                tuple(ek.error_sites),
                check,
            )
        )
        self.launches.append(KernelLaunch(len(self.kernels), tuple(ptrs), tuple(self.enc(e) for e in ek.args.exprs)))
        self.kernels.append(ek)

    def _gemm(self, call: GemmCall, epilogue: GemmEpilogue | None = None) -> None:
        n = self.nodes[call.out]
        library = self.gemm_library
        if library == "cutlass" and call.dtype not in self.gemm.dtypes:
            library = "cublas"  # GemmPolicy.dtypes: CUTLASS serves the dtypes verified on a GPU
        row: dict[str, Any] = {
            "node": call.out,
            "op": n.op.value,
            "library": library,
            "dtype": call.dtype.value,
            "m": dim_str(call.m),
            "n": dim_str(call.n),
            "k": dim_str(call.k),
            "batch": [dim_str(d) for d in call.batch if d != 1],
            "loc": n.loc,
        }
        self.gemm_rows.append(row)
        out = call.out if epilogue is None else epilogue.out
        ptrs: list[Ptr] = [self._ptr(call.a.base, call.a.offset), self._ptr(call.b.base, call.b.offset)]
        ptrs.append(self._ptr(out))
        ints = [self.enc(e) for e in call.ints()]
        if library not in ("cutlass", "cublaslt"):
            assert epilogue is None, "GEMM epilogues are planned for CUTLASS and cuBLASLt only"
            self.launches.append(GemmLaunch(call.dtype.value, tuple(ptrs), tuple(ints)))
            return
        activation, source = "none", "none"
        tagged: tuple[str, str] | None = None
        if epilogue is not None:  # Note [GEMM epilogue] in passes/gemm_epilogue.py
            activation = epilogue.activation
            source = epilogue.source_kind if epilogue.source is not None else "none"
            tagged = (source, activation)
            row["out"] = out
            row["epilogue"] = epilogue.describe()
            if epilogue.source is not None:
                src = self.view(epilogue.source)
                assert src is not None, "an epilogue source is a view of a materialized value"
                ptrs.append(self._ptr(src.base, src.offset))
                bias = epilogue.source_kind == "bias"
                ints += [self.enc(e) for e in ((0, 0, 0, 0) if bias else (*call.sc, call.ldc))]
        if library == "cublaslt":  # Note [cuBLASLt GEMMs] in loader/cublaslt.py: chosen where it runs
            self.launches.append(CublasLtLaunch(call.dtype.value, tagged, tuple(ptrs), tuple(ints)))
            return
        # Note [GEMM cost model] in library_ops/cutlass/select.py: configs and their dispatch ranges
        g = self.gemm
        dispatch = self._select(call, g.measure, "sm80")
        row["key"] = dim_str(dispatch.key)
        row["tuned_on"] = g.tuned_on
        row["dispatch"] = self._dispatch_rows(dispatch)
        entries = self._entries(dispatch, call, activation, source)
        entries_sm90 = None
        if g.hopper:  # the table for compute capability 9.0 (Note [GEMM cost model])
            hopper = self._select(call, g.measure if g.measure_hopper else None, "sm90")
            row["tuned_on_sm90"] = g.tuned_on if g.measure_hopper else "cost model"
            row["dispatch_sm90"] = self._dispatch_rows(hopper)
            entries_sm90 = self._entries(hopper, call, activation, source)
        self.launches.append(CutlassLaunch(call.dtype.value, tagged, entries, entries_sm90, tuple(ptrs), tuple(ints)))

    def _select(self, call: GemmCall, measure: Measure | None, arch: str) -> GemmDispatch:
        """Note [GEMM cost model]: the dispatch table of `call` for `arch`, chosen once per distinct GEMM
        of the plan (a model's layers repeat theirs)."""
        key = selection_key(call, arch)
        if key not in self.dispatches:
            g = self.gemm
            self.dispatches[key] = select(call, self.p.shape_env, g.samples, g.configs, measure, arch)
        return self.dispatches[key]

    @staticmethod
    def _dispatch_rows(dispatch: GemmDispatch) -> list[dict[str, Any]]:
        return [{"config": e.config.name, "split": e.split, "key_min": e.lo, "key_max": e.hi} for e in dispatch.entries]

    def _entries(
        self, dispatch: GemmDispatch, call: GemmCall, activation: str, source: str
    ) -> tuple[DispatchEntry, ...]:
        """The launch record's dispatch entries: kernel index, split-K slices, predicate register, vector width."""
        entries = []
        for e in dispatch.entries:
            hopper = e.config.arch == "sm90"  # Note [Hopper GEMMs]: the epilogue source is compiled in
            inst = GemmInstance(e.config, call.ta, call.tb, activation, source if hopper else "none")
            k = self.instances.setdefault(inst, len(self.instances))
            entries.append(DispatchEntry(k, e.split, self.pred(e.pred), e.config.align))
        return tuple(entries)

    def _conv(self, step: LibraryStep) -> None:
        n = self.nodes[step.node]
        a = n.attrs
        assert isinstance(a, Conv2dAttrs)
        x = self.view(n.inputs[0])
        w = self.view(n.inputs[1])
        assert x is not None and w is not None
        if generated_conv(a):  # Note [Direct convolution] in passes/direct_conv.py, Note [Dense layers]
            # Note [Convolution epilogue]: the kernel stores the chain's end, computing it inline
            ep = step.epilogue
            assert ep is None or isinstance(ep, ConvEpilogue)
            out, chain = (n.id, ()) if ep is None else (ep.out, ep.nodes)
            spec = KernelSpec(f"k{len(self.kernels)}", "conv", (out,), (n.id, *chain), n.type.shape, 0, n.loc)
            self._kernel(spec)
            return
        kh, kw = self.types[n.inputs[1]].shape[2:]
        if a.stride == (1, 1) and a.padding == (0, 0) and a.groups == 1 and (kh, kw) == (1, 1) and x.is_contiguous():
            self._gemm(lower_conv(n, x, w, None))
            return
        nb, c = self.types[n.inputs[0]].shape[:2]
        oh, ow = n.type.shape[2:]
        if a.out_layout == "cnhw":  # Note [Batch-folded convolution]: columns [C*KH*KW, N, OH*OW]
            shape = (simplify(c * kh * kw), nb, simplify(oh * ow))
        else:
            shape = (nb, simplify(c * kh * kw), simplify(oh * ow))
        cols = self._temp(TensorType(n.type.dtype, shape))
        spec = KernelSpec(f"k{len(self.kernels)}_im2col", "im2col", (cols,), (), shape, 0, n.loc)
        self._kernel(spec, (n, x))
        self._gemm(lower_conv(n, x, w, cols))

    def _stored(self, step: Any) -> int:
        if isinstance(step, KernelSpec):
            return step.roots[0]
        if isinstance(step, LibraryStep):
            if step.attention is not None:
                return step.attention.stored
            return step.epilogue.out if step.epilogue is not None else step.node
        return int(step.node)

    def _guard_launches(self, first: int, guard: tuple[Guard, ...]) -> None:
        """The launches from `first` on run under `guard`; data predicates stay live through them."""
        for k in range(first, len(self.launches)):
            self.when.append(guard)
            for c in guard:
                if shape_predicate(self.nodes, c.pred) is None and c.pred not in self.slot:
                    self.touch.setdefault(c.pred, []).append(k)

    def _cond(self, c: Guard, arena: dict[int, IRDim]) -> dict[str, Any]:
        shape = shape_predicate(self.nodes, c.pred)
        if shape is not None:
            return {"r": self.pred(shape), "is": c.taken}
        return {"ptr": self._resolve_ptr(self.slot.get(c.pred, 0), c.pred, 0, arena), "is": c.taken}

    def lower(self) -> None:
        """Every step's kernels, GEMMs and reference steps as launch records (pointers unresolved)."""
        for step in self.plan.steps:
            first = len(self.launches)
            self._run_step(step)
            self._guard_launches(first, pruned(self.nodes, self.guards.get(self._stored(step), ())))

    def place(self) -> NativePlan:
        """The memory plan: arena buffers for every materialized value that is neither a parameter nor
        an output, then every pointer resolved to (slot, byte offset)."""
        g = self.p.graph
        buffers = []
        for v, uses in sorted(self.touch.items()):
            t = self.types[v]
            buffers.append(Buffer(v, t.nbytes(), min(uses), max(uses)))
        mem = plan_memory(self.p.shape_env, buffers)
        launches = tuple(
            lr if isinstance(lr, RefLaunch) else with_ptrs(lr, self._resolved(lr.ptrs, mem.offsets))
            for lr in self.launches
        )
        values = {v: self.types[v] for v in mem.offsets}
        when = tuple(
            tuple(self._cond(c, mem.offsets) for c in guard)
            + (({"r": self.pred(self.shape_when[k]), "is": True},) if k in self.shape_when else ())
            for k, guard in enumerate(self.when)
        )
        return NativePlan(
            kernels=tuple(self.kernel_rows),
            launches=launches,
            buffers=tuple(
                ArenaBuffer(
                    v, values[v].dtype.value, tuple(self.enc(d) for d in values[v].shape), self.enc(mem.offsets[v])
                )
                for v in sorted(mem.offsets)
            ),
            arena_bytes=self.enc(mem.total),
            arena_bytes_expr=dim_str(mem.total),
            arena_slots=len(mem.slots),
            outputs=tuple(self.output_slot.get(o, -1) for o in g.outputs),
            when=when if any(when) else (),
        )

    def _run_step(self, step: Any) -> None:
        if isinstance(step, KernelSpec):
            spec = dataclasses.replace(step, name=f"k{len(self.kernels)}")
            if spec.kind in ("reduce", "row"):
                self._reduce(spec)
            else:
                self._kernel(spec)
        elif isinstance(step, LibraryStep):
            n = self.nodes[step.node]
            if step.attention is not None:  # Note [Fused attention]
                self._attention(n, step.attention)
            elif n.op is OpKind.CONV2D:
                self._conv(step)
            else:
                va, vb = self.view(n.inputs[0]), self.view(n.inputs[1])
                assert va is not None and vb is not None
                call = lower_matmul(self.p.shape_env, n, va, vb)
                assert call is not None, f"matmul %{n.id}: operands were planned as BLAS views"
                assert step.epilogue is None or isinstance(step.epilogue, GemmEpilogue)
                self._gemm(call, step.epilogue)
        else:
            assert isinstance(step, ReferenceStep)
            n = self.nodes[step.node]
            for i in n.inputs:
                self._ptr(i)
            self._ptr(n.id)
            self.launches.append(RefLaunch(n.id, step.reason))

    def _reduce(self, spec: KernelSpec) -> None:
        """A reduce or row kernel; or two where the backend splits its outputs' reductions over blocks
        (Note [Grid reductions] in codegen/cuda_grid_reduce.py): the second combines the first's parts,
        launched only at the shapes where the first splits."""
        split = self.backend.split_reduction(spec, self._context())
        if split is None:
            self._kernel(spec)
            return
        workspace = self._temp(split[0])
        self._kernel(dataclasses.replace(spec, roots=(*spec.roots, workspace)))
        self.shape_when[len(self.launches)] = split[1]
        self._kernel(
            KernelSpec(
                f"k{len(self.kernels)}", "reduce_combine", spec.roots, (), spec.domain, 0, spec.loc, (workspace,)
            )
        )

    def _attention(self, n: Node, att: Attention) -> None:
        """One kernel, or two where the backend splits the keys over blocks (Note [Split keys]): the
        second combines the first's workspace, launched only at the shapes where the first splits."""
        split = self.backend.split_attention(att, self._context())
        roots = (att.stored,) if split is None else (att.stored, self._temp(split[0]))
        self._kernel(
            KernelSpec(f"k{len(self.kernels)}", "attention", roots, att.nodes, n.type.shape, 0, n.loc), att=att
        )
        if split is not None:
            self.shape_when[len(self.launches)] = split[1]
            spec = KernelSpec(
                f"k{len(self.kernels)}", "attention_combine", (att.stored,), (), n.type.shape, 0, n.loc, roots[1:]
            )
            self._kernel(spec, att=att)

    def _resolved(self, ptrs: tuple[Ptr, ...], arena: dict[int, IRDim]) -> tuple[Ptr, ...]:
        out: list[Ptr] = []
        for ptr in ptrs:
            assert isinstance(ptr, tuple), "pointers are resolved once, after the memory plan"
            slot, v, off = ptr
            out.append(self._resolve_ptr(slot, v, off, arena))
        return tuple(out)

    def _resolve_ptr(self, slot: int, v: int, elem_off: IRDim, arena: dict[int, IRDim]) -> list[SymIntEnc]:
        item = self.types[v].dtype.itemsize
        off = simplify(elem_off * item)
        if slot == 0:
            off = simplify(arena[v] + off)
        return [slot, self.enc(off)]


def lower_native(
    p: Program, enc: Enc, pred: Callable[[Any], int], backend: Backend, gemm: GemmPolicy = CUBLAS
) -> NativeLowering:
    """`backend`'s whole plan (fusion, lowering, memory plan: `lower` and `place` in one); `enc` encodes a
    size for the manifest, `pred` compiles a sympy boolean to a register, `gemm` says how the GEMMs are
    served."""
    lowerer = Lowerer(p, fusion_for(p, backend, gemm), enc, pred, backend, gemm)
    emit_launches(lowerer)
    return memory_plan(lowerer)


def emit_launches(lowerer: Lowerer) -> None:
    """Emit the plan's kernels and launches; an emission failure is a bladepack bug (fusion asked the
    backend's `can_emit` of every node it gave a kernel), said with the kernel and its source."""
    try:
        lowerer.lower()
    except KernelEmitError as e:
        n = next((lowerer.nodes[v] for v in sorted(e.nodes) if v in lowerer.nodes), None)
        where = f" at {n.loc}" if n is not None and n.loc else ""
        raise CompileError(
            f"internal error: the {lowerer.backend.caps.title} backend could not generate kernel {e}{where} "
            "(a bladepack bug: please report it with the model)"
        ) from e


def memory_plan(lowerer: Lowerer) -> NativeLowering:
    """The memory plan and the finished native plan, with the CUTLASS kernels it dispatches to."""
    native = lowerer.place()
    instances = list(lowerer.instances)
    native = dataclasses.replace(
        native,
        gemm_kernels=tuple(
            GemmKernel(
                i.name,
                i.config.name,
                i.config.dtype.value,
                i.config.math,
                tuple(i.config.tile),
                tuple(i.config.warp),
                i.config.threads,
                i.config.stages,
                i.config.align,
                i.ta,
                i.tb,
                i.activation,
                i.arch,
                tuple(i.config.cluster),
                i.config.schedule,
                i.source,
            )
            for i in instances
        ),
    )
    sources = Sources(lowerer.backend.source(lowerer.kernels, gemm_dtypes(lowerer.launches)), tuple(instances))
    return NativeLowering(
        lowerer.backend,
        lowerer.plan,
        lowerer.kernels,
        native,
        lowerer.kernel_rows,
        lowerer.gemm_rows,
        instances,
        sources,
    )
