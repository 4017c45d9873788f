"""A compiled model in memory: `Artifact`, what `optimize` returns and `save` writes as a .bpk.

In: the stages of optimize (stages.py) fill it. Out: `save(path)` / `to_bytes()`, the .bpk container
(artifact/writer.py assembles the manifest and sections). Imports no compiler.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bladepack.artifact import format as bpk_format
from bladepack.artifact.plan import ExecPlan
from bladepack.artifact.writer import assemble, embed_packed

if TYPE_CHECKING:
    from bladepack.lowering.build_plan import KernelSources


@dataclass(repr=False)
class Artifact:
    """A compiled model in memory. `save(path)` writes the .bpk; `to_bytes()` returns its bytes; its repr
    is a one-line summary (`bladepack inspect` on the saved file says the rest)."""

    plan: ExecPlan
    weights: Mapping[str, np.ndarray]
    producer: Mapping[str, str]
    sources: KernelSources
    ir_text: str = ""
    notes: list[str] = field(default_factory=list)
    # (ISA level, CPU flags it needs, shared-object bytes) of the compiled CPU kernel library
    cpu_libraries: list[tuple[str, tuple[str, ...], bytes]] = field(default_factory=list)
    # {"sm_80": cubin, ..., "compute_90": PTX} of the CUDA kernels
    cuda_images: dict[str, bytes] = field(default_factory=dict)
    # {CUTLASS kernel name: fatbin} and the Params packer library of the CUDA plan's GEMMs
    gemm_images: dict[str, bytes] = field(default_factory=dict)
    gemm_packer: bytes = b""
    # Note [Reference cases]: the manifest record and its sections, or None
    reference_cases: tuple[dict[str, Any], dict[str, bytes]] | None = None
    # Note [Extending an artifact]: the front end's program (ir/serialize.py), its weights and how it
    # was optimized, or None
    source_program: tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]] | None = None
    # Note [Packed sequences]: the packed form's record and its own (CPU) artifact, or None
    packed: tuple[dict[str, Any], Artifact] | None = None

    def __repr__(self) -> str:
        def decls(ds: Any) -> str:
            return ", ".join(f"{d.name}: {d.dtype}[{', '.join(str(x) for x in d.shape)}]" for d in ds)

        nbytes = sum(int(np.asarray(w).nbytes) for w in self.weights.values())
        parts = [
            f"inputs ({decls(self.plan.inputs)})",
            f"outputs ({decls(self.plan.outputs)})",
            f"{len(self.weights)} weights ({nbytes / 2**20:.1f} MiB)",
            "cpu kernels: " + (", ".join(isa for isa, _, _ in self.cpu_libraries) or "none"),
        ]
        if self.cuda_images:
            parts.append("cuda images: " + ", ".join(sorted(self.cuda_images)))
        if self.reference_cases is not None:
            parts.append(f"{len(self.reference_cases[0]['cases'])} reference cases")
        if self.notes:
            parts.append(f"{len(self.notes)} notes")
        return f"<bladepack Artifact: {'; '.join(parts)}>"

    def _parts(self) -> tuple[dict[str, Any], list[bpk_format.Section]]:
        manifest, sections = assemble(
            self.plan,
            self.weights,
            self.producer,
            self.cpu_libraries,
            self.cuda_images,
            self.gemm_images,
            self.gemm_packer,
            self.reference_cases,
            self.source_program,
        )
        if self.packed is not None:
            record, form = self.packed
            embed_packed(manifest, sections, record, *form._parts())
        return manifest, sections

    def save(self, path: str | os.PathLike[str]) -> None:
        manifest, sections = self._parts()
        bpk_format.write(path, manifest, sections)

    def to_bytes(self) -> bytes:
        manifest, sections = self._parts()
        return b"".join(bytes(c) for c in bpk_format.encode(manifest, sections))


def save(artifact: Artifact, path: str | os.PathLike[str]) -> None:
    artifact.save(path)
