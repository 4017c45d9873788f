"""Fusion planning: which values live in memory, and which generated kernel computes each of them.

In: an optimized IR `Program`. Out: a `FusionPlan` — the materialized values and, in execution order,
one step per materialized value: a generated kernel (`KernelSpec`), a library call (GEMM, convolution)
or a reference step (an op the code generator does not cover, run by the loader's numpy executor).

How it decides (BladeDISC's kinds, decided from shape facts only, so every shape in range is legal):
- kLoop: a materialized value and the cone of non-materialized producers it inlines (elementwise,
  broadcast, injective). Layout ops (reshape / permute / slice / expand) never copy: they become index
  maps of the reads (views.py proves when a chain is a plain strided view).
- kInput / kStitch ("row" kernels): reductions over trailing axes (sum, mean, max, min, prod) and the
  composite row ops (softmax, log-softmax, layer norm, RMS norm) with their producers and consumers in
  one kernel, one row per iteration; several reductions over the same rows share the kernel (e.g.
  residual add + layer norm, or the attention mask + scale + softmax).
- Anchors: reductions over other axes, arg-reductions, cumsum and pooling get a kernel of their own
  (their producers are still inlined).
- GEMM epilogues: with CUTLASS GEMMs, a bias or residual add and an activation after a matmul run in
  the GEMM's epilogue (Note [GEMM epilogue] in gemm_epilogue.py); BLAS cannot take them, so on CPU
  and with cuBLAS they fuse into the kernel that consumes the GEMM output.
- Convolution epilogues: on CPU, the elementwise chain after a direct convolution (bias, batch norm,
  residual, activation) runs in the convolution kernel before its store (Note [Convolution epilogue]
  in conv_epilogue.py).
- Fused attention: on CPU, matmul → elementwise chain → softmax → matmul is one step whose kernel
  never stores the scores (Note [Fused attention] in fuse_attention.py); where its output only becomes
  another layout (the heads merged back: a permute and reshapes), it stores that layout directly
  (Note [Attention stores] in attention_store.py).

Note [Materialize or recompute]: a non-materialized value used by several kernels is recomputed in
each when it is cheap (a few arithmetic ops over loads: ops of `Cost.CHEAP` in the op table); an
expensive one (a transcendental or an indexed load, a row op, or a long cone) is materialized once
instead.

Note [Broadcast side values]: a fused attention evaluates its side inputs per score, so a value of
the side cone whose shape broadcasts to the scores' (T5's relative-position bias, [1, heads, q, k],
under a [batch, heads, q, k] score grid) would be recomputed for every sequence of the batch, in every
attention that reads it. When its cone holds a transcendental (Cost.HEAVY / LIBM: T5's log-spaced
buckets) it is materialized instead: one loop kernel stores it, each attention loads it. Cones of
comparisons and lookups (padding masks, causal masks, packed key bounds) stay inline, where they cost
less than a load and Note [Key bounds] can read them. T5's encoder at 16 x 64 tokens: each attention
585 -> 155 µs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from enum import Enum

from bladepack.ir import Node, OpKind, Program
from bladepack.ir.fusion_plan import (
    Attention,
    ConvEpilogue,
    EpilogueForms,
    FusionPlan,
    GemmEpilogue,
    KernelSpec,
    LibraryStep,
    PlanStep,
    ReferenceStep,
)
from bladepack.ir.guards import data_predicates, effective_guards
from bladepack.ir.ops import OP_INFO, AxisAttrs, IndexAttrs, NormAttrs, OpClass, ReduceAttrs, generated_conv
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.views import LAYOUT_OPS, View, head_view, sym_eq, view_of
from bladepack.opset.table import Cost
from bladepack.passes.attention_store import find_attention_store
from bladepack.passes.conv_epilogue import find_conv_epilogue
from bladepack.passes.fuse_attention import find_attention, side_inputs
from bladepack.passes.gemm_epilogue import find_epilogue
from bladepack.target import Capabilities

CanEmit = Callable[[Node], str | None]  # why a backend cannot compute this node in a kernel, or None


class Role(Enum):
    FUSIBLE = "fusible"
    ROW = "row"  # a reduction over trailing axes or a row op: fuses into a row kernel
    ANCHOR = "anchor"  # gets its own kernel; producers inline
    LIBRARY = "library"
    REFERENCE = "reference"


# anchors with kernels of their own (codegen/anchor_kernels.py, recurrent_kernel.py, selective_scan_kernel.py); pools and
# scans are named in the planner, other anchors are reductions
_ANCHOR_KINDS = {
    OpKind.TOPK: "topk",
    OpKind.SORT: "sort",
    OpKind.SCATTER: "scatter",
    OpKind.RECURRENT: "recurrent",
    OpKind.SELECTIVE_SCAN: "selective_scan",
}
_CHEAP_CONE = 6  # a shared cone up to this many nodes (all of Cost.CHEAP) is recomputed per use

# Note [Scan operands in memory]: a selective scan reads Bm and Cm at every step of every channel, and
# the channels of a sequence (of a group, for Mamba-2) share them: computed inline, each element's cone
# (Mamba-2's convolution bias and SiLU, say) would run D (or D / G) times over, two sigmoids per state
# update. So the value under their layout ops (transposes, reshapes, slices) is stored, and the scan
# reads it through those ops: Hugging Face's layouts keep the state axis N contiguous there, where
# storing Bm itself ([B, N, L] or [B, G, N, L]) would put L between two state elements.


def _broadcasts(shape: Sequence[IRDim], full: Sequence[IRDim]) -> bool:
    """Whether a value of `shape`, broadcast to `full` (aligned from the right), is repeated: it lacks a
    dim of `full` or holds 1 where `full` has a dim that is not 1."""
    lead = len(full) - len(shape)
    if lead < 0:
        return False
    if any(not sym_eq(d, 1) for d in full[:lead]):
        return True
    return any(sym_eq(a, 1) and not sym_eq(b, 1) for a, b in zip(shape, full[lead:]))


# --------------------------------------------------------------------------- classification


def row_reduced_axes(n: Node, in_type: TensorType) -> int | None:
    """How many trailing axes a row op spans, or None when it is not a trailing-axes reduction."""
    rank = in_type.rank
    if n.op in (OpKind.SUM, OpKind.MEAN, OpKind.AMAX, OpKind.AMIN, OpKind.PROD):
        assert isinstance(n.attrs, ReduceAttrs)
        axes = sorted(a % rank for a in n.attrs.axes) if rank else []
        if rank == 0 or not axes or axes != list(range(rank - len(axes), rank)):
            return None
        return len(axes)
    if n.op in (OpKind.SOFTMAX, OpKind.LOG_SOFTMAX):
        assert isinstance(n.attrs, AxisAttrs)
        return 1 if rank and n.attrs.axis % rank == rank - 1 else None
    if n.op in (OpKind.LAYER_NORM, OpKind.RMS_NORM):
        assert isinstance(n.attrs, NormAttrs)
        return n.attrs.num_axes if 0 < n.attrs.num_axes <= rank else None
    return None


def classify(
    n: Node, types: dict[int, TensorType], caps: Capabilities, can_emit: CanEmit = lambda n: None
) -> tuple[Role, str]:
    dts = [types[i].dtype for i in n.inputs] + [n.type.dtype]
    where = caps.title
    bad = sorted({d.value for d in dts if d not in caps.dtypes})
    if bad:
        return Role.REFERENCE, f"dtype {', '.join(bad)} has no {where} kernels yet"
    why = can_emit(n)
    if why is not None:
        return Role.REFERENCE, why
    if n.op in (OpKind.MATMUL, OpKind.CONV2D):
        if n.type.dtype not in caps.gemm_dtypes or any(types[i].dtype != n.type.dtype for i in n.inputs):
            return Role.REFERENCE, f"{n.op.value} on {n.type.dtype.value} has no {caps.gemm_title} routine"
        return Role.LIBRARY, ""
    if n.op in (
        OpKind.MAX_POOL2D,
        OpKind.AVG_POOL2D,
        OpKind.CUMSUM,
        OpKind.ARGMAX,
        OpKind.ARGMIN,
        OpKind.TOPK,
        OpKind.SORT,
        OpKind.SCATTER,
        OpKind.RECURRENT,
        OpKind.SELECTIVE_SCAN,
    ):
        return Role.ANCHOR, ""
    if OP_INFO[n.op].op_class is OpClass.REDUCTION:
        if row_reduced_axes(n, types[n.inputs[0]]) is not None:
            return Role.ROW, ""
        if n.op in (OpKind.SUM, OpKind.MEAN, OpKind.AMAX, OpKind.AMIN, OpKind.PROD):
            return Role.ANCHOR, ""
        return Role.REFERENCE, f"{n.op.value} over a leading axis has no {where} kernel yet"
    if n.op is OpKind.INDEX:
        assert isinstance(n.attrs, IndexAttrs)
        axes = list(n.attrs.axes)
        if axes != list(range(axes[0], axes[0] + len(axes))):
            return Role.REFERENCE, f"advanced indexing on non-adjacent axes has no {where} kernel yet"
    return Role.FUSIBLE, ""


# --------------------------------------------------------------------------- planning


class _Planner:
    def __init__(
        self,
        p: Program,
        gemm_operand_ok: Callable[[Node, int, View], bool],
        caps: Capabilities,
        can_emit: CanEmit,
        gemm_epilogues: EpilogueForms | None,
    ) -> None:
        self.gemm_epilogues, self.caps = gemm_epilogues, caps
        self.attention: dict[int, Attention] = {}  # second matmul -> Note [Fused attention]
        self.in_attention: set[int] = set()  # the scores' matmuls, chains and softmaxes of those
        # stored value -> (matmul or convolution, its epilogue)
        self.epilogues: dict[int, tuple[int, GemmEpilogue | ConvEpilogue]] = {}
        self.g = p.graph
        self.env = p.shape_env
        self.nodes = {n.id: n for n in self.g.nodes}
        self.order = {n.id: k for k, n in enumerate(self.g.nodes)}
        self.types = self.g.value_types()
        self.roles: dict[int, Role] = {}
        self.reasons: dict[int, str] = {}
        for n in self.g.nodes:
            self.roles[n.id], self.reasons[n.id] = classify(n, self.types, caps, can_emit)
        self.params = {p_.id for p_ in self.g.inputs + self.g.weights}
        self.users = self.g.users()
        self.mat: set[int] = set(self.params) | set(self.g.outputs)
        self.gemm_operand_ok = gemm_operand_ok
        self.guards = effective_guards(self.g)

    def is_mat(self, v: int) -> bool:
        return v in self.mat

    def view(self, v: int) -> View | None:
        return view_of(self.nodes, self.types, v, self.is_mat)

    def _layout_root(self, v: int) -> int:
        while v in self.nodes and v not in self.mat and self.nodes[v].op in LAYOUT_OPS:
            v = self.nodes[v].inputs[0]
        return v

    def find_attention(self) -> None:
        """Note [Fused attention]: record each attention; its inner values are never materialized."""
        outputs = set(self.g.outputs)
        for n in self.g.nodes:
            if n.op is not OpKind.MATMUL or self.roles[n.id] is not Role.LIBRARY:
                continue
            att = find_attention(
                n,
                self.nodes,
                self.users,
                self.types,
                lambda v: self.roles[v] is Role.FUSIBLE,
                outputs,
                lambda a, b: self.guards[a] == self.guards[b],
                self.caps.attention_dtypes,
                self.caps.attention_head_max,
            )
            if att is None or self.roles[att.scores] is not Role.LIBRARY:
                continue
            # attentions chained through their matmuls (one's output the other's scores): the first fuses
            if att.scores in self.in_attention or att.scores in self.attention or n.id in self.in_attention:
                continue
            self.attention[n.id] = att
            self.in_attention.update((att.scores, att.probs, *att.chain))

    def seed(self) -> None:
        if self.caps.attention_dtypes:
            self.find_attention()
        # Note [Guarded kernels]: a kernel computes inline only values skipped under the guard of the value
        # it stores, so a value read across a guard boundary is stored; data predicates are stored too
        # (the executor reads them)
        self.mat.update(v for v in data_predicates(self.g, self.guards) if v in self.nodes)
        for n in self.g.nodes:
            self.mat.update(i for i in n.inputs if i in self.nodes and self.guards[i] != self.guards[n.id])
        for n in self.g.nodes:
            role = self.roles[n.id]
            if n.id in self.in_attention:
                continue
            if n.id in self.attention:
                self.mat.add(n.id)
                att = self.attention[n.id]
                for v in (att.q, att.k, att.v):  # read in place where a head view exists
                    self.mat.add(self._layout_root(v))
                    if head_view(self.nodes, self.types, v, self.is_mat) is None:
                        self.mat.add(v)
                continue
            if role in (Role.LIBRARY, Role.ANCHOR, Role.REFERENCE):
                self.mat.add(n.id)
            if role is Role.REFERENCE:
                self.mat.update(n.inputs)
            if n.op in (OpKind.MAX_POOL2D, OpKind.AVG_POOL2D, OpKind.CUMSUM):
                self.mat.add(n.inputs[0])
            if n.op is OpKind.SELECTIVE_SCAN:  # Note [Scan operands in memory]
                self.mat.update(self._layout_root(v) for v in n.inputs[3:5])
            if role is Role.LIBRARY and n.op is OpKind.CONV2D:
                self.mat.update(n.inputs[1:])
                x = n.inputs[0]
                a = n.attrs
                # a direct convolution on the CPU reads its input through any view of a stored value
                # (Note [Channels-last chains]: an NCHW input of a channels-last one, or the reverse)
                if generated_conv(a) and self.caps.conv_input_views:
                    self.mat.add(self._layout_root(x))
                    if self.view(x) is None:
                        self.mat.add(x)
                else:
                    self.mat.add(x)
            if role is Role.LIBRARY and n.op is OpKind.MATMUL:
                for k, v in enumerate(n.inputs):
                    self.mat.add(self._layout_root(v))
                    view = self.view(v)
                    if view is None or not self.gemm_operand_ok(n, k, view):
                        self.mat.add(v)

    def cone(self, root: int) -> list[int]:
        """Nodes computed inline by the kernel that stores `root` (root first excluded from stops)."""
        seen: set[int] = set()
        stack = [root]
        while stack:
            v = stack.pop()
            if v in seen or v not in self.nodes:
                continue
            seen.add(v)
            n = self.nodes[v]
            if v != root and v in self.mat:
                seen.discard(v)
                continue
            if v != root and self.roles[v] is not Role.FUSIBLE and self.roles[v] is not Role.ROW:
                continue
            stack.extend(n.inputs)
        return sorted((v for v in seen if v == root or v not in self.mat), key=self.order.__getitem__)

    def attention_nodes(self, att: Attention) -> tuple[list[int], int | None]:
        """The nodes the attention kernel computes, in order, and a value its side inputs need in
        memory (a row op or anchor the chain's masks are computed from), if any."""
        inline = {att.scores, *att.chain, att.probs, att.out}
        stack = side_inputs(att, self.nodes)
        while stack:
            v = stack.pop()
            if v in inline or v not in self.nodes or v in self.mat:
                continue
            if self.roles[v] is not Role.FUSIBLE:
                return [], v
            inline.add(v)
            stack.extend(self.nodes[v].inputs)
        return sorted(inline, key=self.order.__getitem__), None

    def kernel_roots(self) -> list[int]:
        return [
            v
            for v in sorted(self.mat & set(self.nodes), key=self.order.__getitem__)
            if self.roles[v] in (Role.FUSIBLE, Role.ROW, Role.ANCHOR)
        ]

    def _broadcast_side_value(self, att: Attention, inline: Sequence[int]) -> int | None:
        """Note [Broadcast side values]: of the values the attention kernel computes inline (`inline`, in
        graph order), the last of its side cone that it would recompute for many scores (its shape
        broadcasts to the scores') and whose cone holds a transcendental, or None. The last: no other
        such value is downstream of it, so storing it takes its whole cone out of the kernel."""
        scores = self.types[att.scores].shape
        own = {att.scores, *att.chain, att.probs, att.out}
        for v in reversed(inline):
            if (
                v not in own
                and _broadcasts(self.types[v].shape, scores)
                and any(OP_INFO[self.nodes[u].op].cost in (Cost.HEAVY, Cost.LIBM) for u in self.cone(v))
            ):
                return v
        return None

    def _expensive(self, v: int) -> bool:
        c = self.cone(v)
        return len(c) > _CHEAP_CONE or any(
            not OP_INFO[self.nodes[u].op].cost.recompute or self.roles[u] is Role.ROW for u in c
        )

    def _row_problem(self, root: int, cone: list[int]) -> int | None:
        """A row op whose output must be materialized for this kernel to be one legal row kernel."""
        rows = [v for v in cone if self.roles[v] is Role.ROW]
        if self.roles[root] is Role.ANCHOR:
            return rows[-1] if rows else None
        if not rows:
            return None
        last = self.nodes[rows[-1]]
        dom = self.types[last.inputs[0]].shape
        k = row_reduced_axes(last, self.types[last.inputs[0]])
        assert k is not None
        outer = dom[: len(dom) - k]
        row_shapes = (tuple(outer) + (1,) * k, tuple(outer))

        def same(a: Sequence[IRDim], b: Sequence[IRDim]) -> bool:
            return len(a) == len(b) and all(sym_eq(x, y) for x, y in zip(a, b))

        for v in rows[:-1]:
            n = self.nodes[v]
            kv = row_reduced_axes(n, self.types[n.inputs[0]])
            if kv != k or not same(self.types[n.inputs[0]].shape, dom):
                return v
        # every node downstream of a row op must sit on the rows (full or per-row shape), elementwise
        cone_set = set(cone)
        depends: dict[int, int] = {}  # node -> the latest row op it depends on inside the kernel
        for v in cone:
            n = self.nodes[v]
            deps = [depends[i] for i in n.inputs if i in cone_set and i in depends]
            if deps:
                latest = max(deps, key=self.order.__getitem__)
                if self.roles[v] is Role.ROW:
                    if not same(self.types[n.inputs[0]].shape, dom):
                        return latest
                else:
                    shape = n.type.shape
                    on_rows = (
                        same(shape, dom) or same(shape, row_shapes[0]) or (v == root and same(shape, row_shapes[1]))
                    )
                    op_ok = (
                        OP_INFO[n.op].op_class in (OpClass.ELEMENTWISE, OpClass.BROADCAST) and n.op is not OpKind.EXPAND
                    )
                    if n.op is OpKind.RESHAPE and (same(shape, row_shapes[0]) or same(shape, row_shapes[1])):
                        op_ok = True
                    if not (on_rows and op_ok):
                        return latest
                depends[v] = latest
            if self.roles[v] is Role.ROW:
                depends[v] = v
        rshape = self.types[root].shape
        if root in depends and not (same(rshape, dom) or same(rshape, row_shapes[0]) or same(rshape, row_shapes[1])):
            return depends[root]
        return None

    def solve(self) -> None:
        self.seed()
        changed = True
        while changed:
            changed = False
            uses: dict[int, set[int]] = {}
            for r in self.kernel_roots():
                c = self.cone(r)
                bad = self._row_problem(r, c)
                if bad is not None:
                    self.mat.add(bad)
                    changed = True
                    break
                for v in c:
                    if v != r:
                        uses.setdefault(v, set()).add(r)
            if changed:
                continue
            for att in self.attention.values():
                inline, need = self.attention_nodes(att)
                if need is None:
                    need = self._broadcast_side_value(att, inline)
                if need is not None:
                    self.mat.add(need)
                    changed = True
            if changed:
                continue
            for v, rs in sorted(uses.items()):
                if len(rs) > 1 and self._expensive(v):
                    self.mat.add(v)
                    changed = True

    def absorb_attention_stores(self) -> None:
        """Note [Attention stores]: an attention whose output only becomes, through a permute and
        reshapes, the value a copy kernel stores writes that value instead (the copy kernel goes)."""
        outputs = set(self.g.outputs)
        for v, att in list(self.attention.items()):
            chain = find_attention_store(att, self.nodes, self.users, outputs)
            if chain is None:
                continue
            end = chain[-1]
            if end not in self.mat or set(self.cone(end)) != set(chain):
                continue
            if any(self.guards[u] != self.guards[v] for u in chain):
                continue
            self.mat.discard(v)
            self.attention[v] = dataclasses.replace(att, store=chain)

    def absorb_epilogues(self) -> None:
        """Note [GEMM epilogue] / Note [Convolution epilogue]: each matmul (with CUTLASS) or direct
        convolution (on CPU) stores the end of its epilogue chain instead of its product."""
        sources: set[int] = set()  # values epilogues read: they stay materialized
        outputs = set(self.g.outputs)
        for v in sorted(self.mat & set(self.nodes), key=self.order.__getitem__):
            n = self.nodes[v]
            if self.roles[v] is not Role.LIBRARY or v in sources:
                continue
            ep: GemmEpilogue | ConvEpilogue | None = None
            if self.gemm_epilogues is not None and n.op is OpKind.MATMUL:
                ep = find_epilogue(
                    n, self.nodes, self.users, self.types, self.view, self.is_mat, outputs, self.gemm_epilogues
                )
                if ep is not None and any(self.guards[u] != self.guards[v] for u in ep.nodes):
                    ep = None
            elif self.caps.conv_epilogues and n.op is OpKind.CONV2D:
                ep = find_conv_epilogue(
                    n,
                    self.nodes,
                    self.users,
                    self.types,
                    self.view,
                    self.is_mat,
                    outputs,
                    lambda a, b: self.guards[a] == self.guards[b],
                )
            if ep is None:
                continue
            self.mat.discard(v)
            self.mat.add(ep.out)
            self.epilogues[ep.out] = (v, ep)
            reads = [ep.source] if isinstance(ep, GemmEpilogue) and ep.source is not None else []
            if isinstance(ep, ConvEpilogue):
                chain = set(ep.nodes)
                reads = [i for u in ep.nodes for i in self.nodes[u].inputs if i != v and i not in chain]
            for r in reads:
                src = self.view(r)
                if src is not None:
                    sources.add(src.base)

    def plan(self) -> FusionPlan:
        self.solve()
        self.absorb_attention_stores()
        if self.gemm_epilogues is not None or self.caps.conv_epilogues:
            self.absorb_epilogues()
        steps: list[PlanStep] = []
        count = 0
        stored_by = {a.stored: mm for mm, a in self.attention.items()}
        for v in sorted(self.mat & set(self.nodes), key=self.order.__getitem__):
            n = self.nodes[v]
            role = self.roles[v]
            if v in stored_by:  # the value an attention writes: its output, or its store chain's end
                a = self.attention[stored_by[v]]
                att = dataclasses.replace(a, nodes=tuple(self.attention_nodes(a)[0]))
                steps.append(LibraryStep(a.out, "attention", self.nodes[a.out].loc, attention=att))
            elif v in self.epilogues:
                mm, ep = self.epilogues[v]
                steps.append(LibraryStep(mm, self.nodes[mm].op.value, self.nodes[mm].loc, ep))
            elif role is Role.LIBRARY:
                steps.append(LibraryStep(v, n.op.value, n.loc))
            elif role is Role.REFERENCE:
                steps.append(ReferenceStep(v, self.reasons[v], n.loc))
            else:
                c = self.cone(v)
                rows = [u for u in c if self.roles[u] is Role.ROW]
                if role is Role.ANCHOR:
                    kinds = {OpKind.MAX_POOL2D: "pool", OpKind.AVG_POOL2D: "pool", OpKind.CUMSUM: "scan"}
                    kind = {**kinds, **_ANCHOR_KINDS}.get(n.op, "reduce")
                    domain = n.type.shape
                    reduced = 0
                elif rows:
                    last = self.nodes[rows[-1]]
                    kind = "row"
                    domain = self.types[last.inputs[0]].shape
                    reduced = row_reduced_axes(last, self.types[last.inputs[0]]) or 0
                else:
                    kind, domain, reduced = "loop", n.type.shape, 0
                steps.append(KernelSpec(f"k{count}", kind, (v,), tuple(c), tuple(domain), reduced, n.loc))
                count += 1
        return FusionPlan(tuple(steps), frozenset(self.mat))


def plan_fusion(
    p: Program,
    gemm_operand_ok: Callable[[Node, int, View], bool],
    caps: Capabilities,
    can_emit: CanEmit = lambda n: None,
    gemm_epilogues: EpilogueForms | None = None,
) -> FusionPlan:
    """`gemm_operand_ok(node, k, view)`: can the library read operand k of `node` as this view; `caps`:
    what the backend computes natively (dtypes and GEMMs with kernels, convolution epilogues — Note
    [Convolution epilogue] —, fused attention — Note [Fused attention]); `can_emit(node)`: why the
    backend's kernels cannot compute a node (a reference step then computes it), or None;
    `gemm_epilogues`: what the GEMM library's epilogue computes after a matmul — bias / residual adds and
    activations, for which dtypes (Note [GEMM epilogue]; None: nothing)."""
    return _Planner(p, gemm_operand_ok, caps, can_emit, gemm_epilogues).plan()
