"""Compile targets: the user's `targets` parsed once into a frozen `Target`, and each backend's table.

In: `targets` as given to `optimize` — "cpu", "cuda" (every CUDA image), "cuda:<image>" (one image:
a cubin architecture, the PTX, or "sm_90a" for the Hopper CUTLASS GEMMs). Out: `Target` — the plan
kinds in order and the CUDA images asked for (None: all) — and `BACKENDS`, what each plan kind
computes natively (dtypes with generated kernels, GEMM dtypes, the name used in messages).
Imports only dtypes: every compile stage may use it.
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
class Backend:
    """What one plan kind computes natively."""

    name: str  # "cpu" | "cuda": the plan kind, as the manifest names it
    title: str  # how messages name it
    dtypes: frozenset[DType]  # dtypes with generated kernels
    gemm_dtypes: tuple[DType, ...]  # dtypes its GEMM libraries take


_HOST_DTYPES = frozenset(
    {DType.FLOAT32, DType.FLOAT64, DType.INT64, DType.INT32, DType.INT16, DType.INT8, DType.UINT8, DType.BOOL}
)
_DTYPES = _HOST_DTYPES | {DType.FLOAT16, DType.BFLOAT16}
_GEMM_DTYPES = (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)
BACKENDS = {
    # CPU: 16-bit floats stored 16-bit, computed in float registers (Note [16-bit floats on CPU] in
    # codegen/cpu_runtime.h); their GEMMs widen to float32 BLAS (Note [16-bit GEMMs])
    "cpu": Backend("cpu", "CPU", _DTYPES, _GEMM_DTYPES),
    "cuda": Backend("cuda", "CUDA", _DTYPES, _GEMM_DTYPES),
}


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

    def spec(self) -> list[str]:
        """The `targets` list that parses back to this Target."""
        out: list[str] = []
        for kind in self.kinds:
            if kind == "cuda" and self.cuda_images is not None:
                out += [f"cuda:{a}" for a in self.cuda_images]
            else:
                out.append(kind)
        return out

    @property
    def cpu(self) -> bool:
        return "cpu" in self.kinds

    @property
    def cuda(self) -> bool:
        return "cuda" in self.kinds


CPU_ONLY = Target()
