"""The backend interface: what a plan kind plugs into the compiler.

In: the fusion plan's kernel specs, the lowered plan's sources, the options. Out: `Backend`, which
says what the backend computes (`caps`, read by the graph passes and fusion; `can_emit`, asked once
per node before fusion), emits each kernel and its launch variants, assembles its translation unit
and builds it into the images the artifact carries. The compile side (passes, lowering, the stages
of optimize) asks the chosen backends and never names one; they are registered in backends/__init__.py.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bladepack.codegen.kernel import KernelContext
from bladepack.dtypes import DType
from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import Attention, EpilogueForms, KernelSpec
from bladepack.ir.types import TensorType
from bladepack.ir.views import View
from bladepack.library_ops.cutlass.emitter import GemmInstance
from bladepack.library_ops.cutlass.select import GemmPolicy
from bladepack.options import CompileOptions
from bladepack.progress import Progress
from bladepack.target import Capabilities, Target


@dataclass(frozen=True)
class Variant:
    """One variant of an emitted kernel: its function, the predicate that picks it (first true wins)
    and, for a backend whose launches have a geometry, the grid and dynamic shared memory (sympy
    expressions over the shape symbols) and the block size."""

    name: str
    pred: Any
    grid: Any = None
    block: int = 0
    smem: Any = None


@dataclass(frozen=True)
class Sources:
    """What a backend builds: the translation unit of its kernels (empty: the plan has no kernels to
    build) and the CUTLASS GEMM kernels its plan dispatches to."""

    unit: str = ""
    gemm_instances: tuple[GemmInstance, ...] = ()


@dataclass
class Built:
    """What a backend's build adds to the artifact: `Artifact` fields by name, and the versions of
    the tools that built them (the manifest's producer)."""

    fields: dict[str, Any] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)


class Backend(ABC):
    caps: Capabilities
    source_suffix: str  # the file suffix of its translation unit (BLADEPACK_DUMP)

    @property
    def kind(self) -> str:
        """The plan kind, as the manifest names it."""
        return self.caps.kind

    def can_emit(self, n: Node, types: Mapping[int, TensorType]) -> str | None:
        """Why this backend's kernels cannot compute `n` (a reference step computes it then), or None.
        Fusion asks once per node; what it accepts must then emit. The shared emitter (codegen/emitter.py)
        indexes with integer tensors only."""
        if n.op is OpKind.INDEX and any(types[i].dtype is DType.BOOL for i in n.inputs[1:]):
            return "boolean mask indexing has a data-dependent shape"
        return None

    def gemm_library(self, policy: GemmPolicy) -> str:
        """The library that serves this backend's GEMMs: "blas", "cublas", "cublaslt" or "cutlass"."""
        return policy.library

    def gemm_epilogues(self, policy: GemmPolicy) -> EpilogueForms | None:
        """What this backend's GEMM library computes after a GEMM — bias / residual, activations, for which
        dtypes (Note [GEMM epilogue] in passes/gemm_epilogue.py); None: nothing."""
        return None

    def gemm_policy(
        self,
        policy: GemmPolicy,
        target: Target,
        options: CompileOptions,
        notes: list[str],
    ) -> tuple[GemmPolicy, Any]:
        """How this backend's GEMMs are chosen, and a resource to close when the plan is done (None)."""
        return policy, None

    def split_attention(self, att: Attention, ctx: KernelContext) -> tuple[TensorType, Any] | None:
        """A fused attention computed by two kernels (Note [Split keys] in library_ops/cuda_attention.py):
        the type of the workspace the first ("attention") writes and the second ("attention_combine")
        reads, and the shapes at which the second runs (a sympy boolean). None: one kernel."""
        return None

    def split_reduction(self, spec: KernelSpec, ctx: KernelContext) -> tuple[TensorType, Any] | None:
        """A reduce or row kernel whose reduction is computed by two kernels (Note [Grid reductions] in
        codegen/cuda_grid_reduce.py): the type of the workspace of parts the first (`spec`) writes after
        its root and the second ("reduce_combine") reads, and the shapes at which the second runs (a
        sympy boolean). None: one kernel."""
        return None

    @abstractmethod
    def emit(
        self,
        spec: KernelSpec,
        ctx: KernelContext,
        index: int,
        conv: tuple[Node, View] | None,
        attention: Attention | None,
    ) -> Any:
        """Every variant of one kernel (the `index`-th of the plan): an object with `variants`, `stores`,
        `loads`, `args`, `source` and `error_sites`; `conv` asks for an im2col kernel, `attention` for a
        fused attention (spec.kind "attention", or "attention_combine" reading the workspace
        `spec.reads[0]`: Note [Split keys])."""

    @abstractmethod
    def variants(self, kernel: Any) -> Sequence[Variant]:
        """The launch variants of an emitted kernel."""

    @abstractmethod
    def source(self, kernels: Sequence[Any], gemm_dtypes: Collection[str]) -> str:
        """The translation unit of every kernel of the plan, in launch order (`gemm_dtypes`: those of
        the plan's library GEMM launches)."""

    @abstractmethod
    def build(
        self, sources: Sources, target: Target, options: CompileOptions, progress: Progress, notes: list[str]
    ) -> Built:
        """Compile the plan's sources (cached by content) into what the artifact carries; `notes` hears
        of what the artifact lacks for it."""
