"""The fusion plan: plain data passed from fusion planning (passes/) to lowering and the emitters.

A `FusionPlan` lists, in execution order, one step per materialized value: a generated kernel
(`KernelSpec`), a library call (`LibraryStep`, with its `GemmEpilogue` when the GEMM's epilogue
computes a chain after it) or a reference step (`ReferenceStep`). Node ids refer to the IR graph the
plan was made for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from bladepack.dtypes import DType
from bladepack.ir.graph import Graph
from bladepack.ir.ops import generated_conv
from bladepack.ir.types import IRDim, dim_str


@dataclass(frozen=True)
class EpilogueForms:
    """What a GEMM library's epilogue computes (Note [GEMM epilogue] in passes/gemm_epilogue.py): the
    matmul dtypes it serves with one, and the activations it evaluates as the model does."""

    dtypes: frozenset[DType]
    activations: frozenset[str]


EPILOGUE_DTYPES = frozenset({DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32})
CUTLASS_ACTIVATIONS = frozenset({"relu", "gelu", "silu"})
CUBLASLT_FORMS = EpilogueForms(EPILOGUE_DTYPES, frozenset({"relu", "gelu_tanh"}))


@dataclass(frozen=True)
class GemmEpilogue:
    out: int  # the value the GEMM stores: the chain's last op
    nodes: tuple[int, ...]  # the chain after the matmul, in order
    source: int | None  # the add's other operand (C), None without an add
    source_kind: str  # "none" | "bias" | "residual"
    activation: str  # "none" | "relu" | "gelu" | "silu" | "gelu_tanh"

    def describe(self) -> str:
        parts = [] if self.source is None else [f"{self.source_kind} %{self.source}"]
        if self.activation != "none":
            parts.append(self.activation)
        return " + ".join(parts)


@dataclass(frozen=True)
class ConvEpilogue:
    """Note [Convolution epilogue] (passes/conv_epilogue.py): the elementwise chain after a direct
    convolution that its kernel computes on the accumulators before storing `out`."""

    out: int  # the value the convolution kernel stores: the chain's last op
    nodes: tuple[int, ...]  # the chain after the convolution and the constants it reads, in order

    def describe(self) -> str:
        return "inline"


@dataclass(frozen=True)
class Attention:
    """Note [Fused attention] (passes/fuse_attention.py): softmax(chain(q @ k)) @ v computed by one
    kernel that never stores the scores. Target-neutral: which values, not how a backend runs them."""

    out: int  # the second matmul: [*lead, Sq, Dv]
    scores: int  # the first matmul: [*lead, Sq, Skv]
    probs: int  # the softmax over the scores' last axis
    chain: tuple[int, ...]  # the elementwise ops from the scores to the softmax's input, in order
    q: int
    k: int  # read as [*lead, Skv, D] when the first matmul has transpose_b, else [*lead, D, Skv]
    v: int
    nodes: tuple[int, ...] = ()  # every node the kernel computes (the chain's side inputs too), in order
    # Note [Attention stores] (passes/attention_store.py): a permute of `out` and reshapes of it, in order;
    # the kernel writes the last one's buffer at the element each of out's elements becomes there
    store: tuple[int, ...] = ()

    @property
    def stored(self) -> int:
        """The value the kernel writes: `out`, or the end of its store chain."""
        return self.store[-1] if self.store else self.out


@dataclass(frozen=True)
class KernelSpec:
    """A generated kernel: it stores `roots` and computes every node of `nodes` inline."""

    name: str
    kind: str  # "loop" | "row" | "reduce" | "scan" | "pool"
    roots: tuple[int, ...]
    nodes: tuple[int, ...]  # topological; includes the roots that are nodes
    domain: tuple[IRDim, ...]  # loop / row: the iteration space; anchors: their output shape
    reduced: int = 0  # row kernels: how many trailing axes of the domain each row spans
    loc: str = ""
    reads: tuple[int, ...] = ()  # values read besides the nodes' inputs (a workspace: Note [Split keys])


@dataclass(frozen=True)
class LibraryStep:
    node: int
    op: str  # "matmul" | "conv2d"
    loc: str = ""
    # Note [GEMM epilogue] / Note [Convolution epilogue]: the library call (or direct convolution kernel)
    # stores epilogue.out
    epilogue: GemmEpilogue | ConvEpilogue | None = None
    attention: Attention | None = None  # op "attention": Note [Fused attention]


@dataclass(frozen=True)
class ReferenceStep:
    node: int
    reason: str
    loc: str = ""


PlanStep = Union[KernelSpec, LibraryStep, ReferenceStep]


@dataclass(frozen=True)
class FusionPlan:
    steps: tuple[PlanStep, ...]
    materialized: frozenset[int]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def kernels(self) -> tuple[KernelSpec, ...]:
        return tuple(s for s in self.steps if isinstance(s, KernelSpec))

    def text(self, graph: Graph) -> str:
        """Deterministic text (BLADEPACK_DUMP's fusion_plan.txt and golden tests)."""
        nodes = {n.id: n for n in graph.nodes}

        def direct(s: PlanStep) -> bool:  # a convolution run by a generated kernel (passes/direct_conv.py)
            a = nodes[s.node].attrs if isinstance(s, LibraryStep) else None
            return generated_conv(a)

        def fused(s: PlanStep) -> bool:
            return isinstance(s, LibraryStep) and s.attention is not None

        n_direct = sum(direct(s) for s in self.steps)
        n_fused = sum(fused(s) for s in self.steps)
        lines = [
            f"fusion plan: {len(self.kernels)} kernels, "
            f"{sum(isinstance(s, LibraryStep) and not direct(s) and not fused(s) for s in self.steps)} library calls, "
            + (f"{n_direct} direct convolutions, " if n_direct else "")
            + (f"{n_fused} fused attentions, " if n_fused else "")
            + f"{sum(isinstance(s, ReferenceStep) for s in self.steps)} reference steps"
        ]
        for s in self.steps:
            if isinstance(s, KernelSpec):
                ops = " ".join(f"{nodes[i].op.value}%{i}" for i in s.nodes)
                dom = ", ".join(dim_str(d) for d in s.domain)
                red = f" rows of {s.reduced}" if s.kind == "row" else ""
                roots = ", ".join(f"%{r}" for r in s.roots)
                lines.append(f"  {s.name}: {s.kind}[{dom}]{red} -> {roots} = {{{ops}}}")
            elif isinstance(s, LibraryStep):
                if s.attention is not None:
                    ops = " ".join(f"{nodes[i].op.value}%{i}" for i in s.attention.nodes)
                    via = "".join(f" {nodes[i].op.value}%{i}" for i in s.attention.store)
                    store = f" stored as{via}" if via else ""
                    lines.append(f"  attention -> %{s.attention.stored} = {{{ops}}}{store}")
                elif s.epilogue is not None:
                    ops = " ".join(f"{nodes[i].op.value}%{i}" for i in s.epilogue.nodes)
                    lines.append(
                        f"  {s.op}%{s.node}{' (direct kernel)' if direct(s) else ''} -> %{s.epilogue.out} = {{{ops}}} "
                        f"(epilogue: {s.epilogue.describe()})"
                    )
                else:
                    lines.append(f"  {s.op}{' (direct kernel)' if direct(s) else ''} -> %{s.node}")
            else:
                lines.append(f"  reference {nodes[s.node].op.value} -> %{s.node} ({s.reason})")
        for note in self.notes:
            lines.append(f"  note: {note}")
        return "\n".join(lines) + "\n"
