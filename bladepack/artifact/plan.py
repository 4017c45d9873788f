"""The execution plan: the declarative program both loaders interpret.

In: produced by `bladepack.lowering.build_plan` from an IR program. Out: plain data (no sympy, no
torch) that the artifact writer packs into the manifest and the loaders read back.

Sizes and attributes that may be symbolic are `SymIntEnc` (Note [SymInt encoding] in symint.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bladepack.artifact.native_plan import KernelRow, NativePlan
from bladepack.artifact.symint import SymIntEnc


@dataclass(frozen=True)
class TensorDecl:
    """A named tensor of the signature. `shape` entries are ints or symbolic dim text ("batch")."""

    name: str
    id: int
    dtype: str
    shape: tuple[int | str, ...]

    def to_manifest(self) -> dict[str, Any]:
        return {"name": self.name, "id": self.id, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class WeightDecl:
    name: str
    id: int
    dtype: str
    shape: tuple[int, ...]
    section: int

    def to_manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "id": self.id,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "section": self.section,
        }


@dataclass(frozen=True)
class ValueDecl:
    id: int
    dtype: str
    shape: tuple[SymIntEnc, ...]

    def to_manifest(self) -> dict[str, Any]:
        return {"id": self.id, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class Step:
    op: str
    out: int
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    loc: str = ""
    # Note [Guarded steps]: conditions, outermost first, under which the step runs: {"r": register, "is":
    # bool} (a shape predicate) or {"v": value id, "is": bool} (a 0-d bool value read when reached); a
    # skipped step's value is zeros of its shape (only a branch merge reads it, and discards it)
    when: tuple[dict[str, Any], ...] = ()

    def to_manifest(self) -> dict[str, Any]:
        row = {"op": self.op, "out": self.out, "in": list(self.inputs), "attrs": self.attrs, "loc": self.loc}
        if self.when:
            row["when"] = list(self.when)
        return row


@dataclass(frozen=True)
class SymbolDecl:
    name: str
    min: int
    max: int | None
    register: int

    def to_manifest(self) -> dict[str, Any]:
        return {"name": self.name, "min": self.min, "max": self.max, "r": self.register}


@dataclass(frozen=True)
class ExecPlan:
    symbols: tuple[SymbolDecl, ...]
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[TensorDecl, ...]
    weights: tuple[WeightDecl, ...]
    values: tuple[ValueDecl, ...]
    steps: tuple[Step, ...]
    shape_program: dict[str, Any]
    arena_bytes_expr: str
    arena_bytes: SymIntEnc
    output_structure: str = "single"
    kernels: tuple[KernelRow, ...] = field(default_factory=tuple)
    gemm_configs: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    # the native CPU plan (launch records, arena buffers; docs/format.md "Native CPU plan"), or None
    native_cpu: NativePlan | None = None
    # the native CUDA plan (same record format; kernel variants carry grid / block / smem), or None
    native_cuda: NativePlan | None = None
    # per input-bound symbol, Note [Batch-like dims] (ir/batch_dims.py) as the manifest's record
    batch_dims: dict[str, dict[str, Any]] = field(default_factory=dict)
    # per input-bound symbol that is not batch-like, Note [Padding proofs] (ir/padding.py) as its record
    padding_dims: dict[str, dict[str, Any]] = field(default_factory=dict)
