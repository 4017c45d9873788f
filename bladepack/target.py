"""Compile targets: the user's `targets` parsed once into a frozen `Target`, and what a backend can do.

In: `targets` as given to `optimize` — "cpu", "cuda" (every CUDA image), "cuda:<image>" (one image:
a cubin architecture, the PTX, or "sm_90a" for the Hopper CUTLASS GEMMs). Out: `Target` — the plan
kinds in order and the CUDA images asked for (None: all) — and `Capabilities`, the form in which a
backend (bladepack/backends) says what it computes natively. Imports only dtypes: every compile
stage may use it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bladepack.dtypes import DType

CUBIN_ARCHES = ("sm_80", "sm_86", "sm_89", "sm_90")
PTX_ARCH = "compute_90"  # the newest architecture built: the driver JIT-compiles it for later GPUs
HOPPER_GEMM_ARCH = "sm_90a"  # CUTLASS GEMM kernels only
CUDA_IMAGES = (*CUBIN_ARCHES, PTX_ARCH, HOPPER_GEMM_ARCH)
KINDS = ("cpu", "cuda")


@dataclass(frozen=True)
class Capabilities:
    """What one backend computes natively: what the graph passes and fusion may plan for it. Each
    backend plug-in (bladepack/backends) holds its own; the passes read it without knowing which
    backend it is."""

    kind: str  # the plan kind, as the manifest names it
    title: str  # how messages name the backend
    dtypes: frozenset[DType]  # dtypes with generated kernels
    gemm_dtypes: tuple[DType, ...]  # dtypes its GEMM libraries take
    gemm_title: str  # how messages name its GEMM library
    conv_epilogues: bool  # direct convolutions compute the elementwise chain after them (Note [Convolution epilogue])
    # matmul → chain → softmax → matmul as one kernel (Note [Fused attention]) in these dtypes, head
    # dims up to attention_head_max; no dtypes: attention stays GEMMs and a row kernel
    attention_dtypes: frozenset[DType]
    attention_head_max: int
    conv_input_views: bool  # a direct convolution reads its input through any view of a stored value
    operand_programs: bool  # the plan carries each kernel's operand check (Note [Kernel operand checks])
    host_arena: bool  # its arena is host memory: the artifact's arena figure is this plan's
    layout_passes: frozenset[str] = frozenset()  # graph passes whose layouts suit only its kernels


@dataclass(frozen=True)
class Target:
    """The plan kinds to build, in the order asked, and the CUDA images (None: every image)."""

    kinds: tuple[str, ...] = ("cpu",)
    cuda_images: tuple[str, ...] | None = None

    @staticmethod
    def parse(targets: Sequence[str]) -> Target:
        """The `Target` of `optimize(..., targets=...)`; ValueError naming what is allowed otherwise."""
        if isinstance(targets, str):
            raise TypeError(f"targets must be a sequence such as ('cpu',), not the string {targets!r}")
        allowed = [*KINDS, *(f"cuda:{a}" for a in CUDA_IMAGES)]
        bad = [t for t in targets if t not in allowed]
        if bad or not targets:
            raise ValueError(f"unsupported targets {bad or list(targets)}; this version supports {allowed}")
        images = tuple(dict.fromkeys(t.split(":", 1)[1] for t in targets if t.startswith("cuda:")))
        kinds = tuple(dict.fromkeys("cuda" if t.startswith("cuda") else t for t in targets))
        if images and "cuda" in targets:  # every default image and the named ones (sm_90a: Note [Hopper GEMMs])
            images = tuple(dict.fromkeys((*CUBIN_ARCHES, PTX_ARCH, *images)))
        return Target(kinds, images or None)

    def covers(self, other: Target) -> bool:
        """Whether this target builds every plan kind `other` does (the packed form needs CPU_ONLY's)."""
        return set(other.kinds) <= set(self.kinds)

    def spec(self) -> list[str]:
        """The `targets` list that parses back to this Target."""
        out: list[str] = []
        for kind in self.kinds:
            if kind == "cuda" and self.cuda_images is not None:
                out += [f"cuda:{a}" for a in self.cuda_images]
            else:
                out.append(kind)
        return out


CPU_ONLY = Target()
