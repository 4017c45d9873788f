"""Native plans as data: what lowering produces for the generated kernels of one plan kind (CPU or CUDA).

In: built by `bladepack.lowering.lower_native`. Out: `NativePlan.to_manifest()`, the manifest's
`native_cpu` / `native_cuda` map that docs/format.md specifies ("Native CPU plan", "Native CUDA
plan") and both loaders read. Plain data: no sympy, no torch; sizes are ints or register references
(Note [SymInt encoding] in symint.py).

A plan is a list of launches over a slot table (slot 0 the arena, then inputs, outputs, weights):
a generated kernel (`KernelLaunch`), a BLAS / cuBLAS GEMM (`GemmLaunch`), a cuBLASLt GEMM with its
epilogue (`CublasLtLaunch`), a CUTLASS GEMM with its dispatch tables (`CutlassLaunch`) or a step left
to the reference executor (`RefLaunch`). Pointers
are `[slot, byte offset]` pairs; before the memory plan places the arena buffers they are
`(slot, value id, element offset)` triples that lowering resolves (`with_ptrs`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Union

from bladepack.artifact.symint import SymIntEnc

ABI = 1


@dataclass(frozen=True)
class KernelVariant:
    """One compiled function of a kernel and the register holding its predicate; CUDA variants carry
    their launch geometry (grid and shared memory may be registers)."""

    name: str
    fn: int
    pred: int
    grid: SymIntEnc | None = None
    block: int | None = None
    smem: SymIntEnc | None = None

    def to_manifest(self) -> dict[str, Any]:
        row: dict[str, Any] = {"name": self.name, "fn": self.fn, "pred": self.pred}
        if self.block is not None:
            row.update(grid=self.grid, block=self.block, smem=self.smem)
        return row


@dataclass(frozen=True)
class KernelRow:
    """A generated kernel of the kernel table (the manifest's `kernels`, and its plan's)."""

    name: str
    target: str  # "cpu" | "cuda"
    kind: str
    loc: str
    nodes: tuple[int, ...]
    variants: tuple[KernelVariant, ...]
    errors: tuple[str, ...]  # per error site: what failed, for messages
    check: dict[str, Any] | None = None  # CUDA: the operand check's shape program (lowering/operand_program.py)

    def to_manifest(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "arch": None,
            "kind": self.kind,
            "loc": self.loc,
            "nodes": list(self.nodes),
            "variants": [v.to_manifest() for v in self.variants],
            "errors": list(self.errors),
            **({"check": self.check} if self.check is not None else {}),
        }


Ptr = Union[tuple[int, int, Any], list[SymIntEnc]]  # (slot, value, element offset) until resolved


@dataclass(frozen=True)
class KernelLaunch:
    k: int  # the kernel's row in its plan's kernel table
    ptrs: tuple[Ptr, ...]
    ints: tuple[SymIntEnc, ...]

    def to_manifest(self) -> dict[str, Any]:
        return {"op": "kernel", "k": self.k, "ptrs": list(self.ptrs), "ints": list(self.ints)}


@dataclass(frozen=True)
class GemmLaunch:
    """A BLAS (CPU) or cuBLAS (CUDA) GEMM: A, B, D pointers and the GEMM's integer record."""

    dtype: str
    ptrs: tuple[Ptr, ...]
    ints: tuple[SymIntEnc, ...]

    def to_manifest(self) -> dict[str, Any]:
        return {"op": "gemm", "dtype": self.dtype, "ptrs": list(self.ptrs), "ints": list(self.ints)}


@dataclass(frozen=True)
class DispatchEntry:
    """A CUTLASS dispatch entry: the first whose predicate register holds runs `kernel` (the plan's
    `gemm_kernels` row) with `split` K slices."""

    kernel: int
    split: int
    pred: int
    align: int

    def to_manifest(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "split": self.split, "pred": self.pred, "align": self.align}


def _gemm_row(op: str, dtype: str, epilogue: tuple[str, str] | None) -> dict[str, Any]:
    """A library GEMM launch's head: op, dtype and the epilogue (source kind, activation) if any."""
    row: dict[str, Any] = {"op": op, "dtype": dtype}
    if epilogue is not None:
        row["epilogue"] = {"source": epilogue[0], "activation": epilogue[1]}
    return row


@dataclass(frozen=True)
class CutlassLaunch:
    """A CUTLASS GEMM (Note [GEMM epilogue]: `epilogue` names its source and activation) with its
    dispatch table, and the compute-capability-9.0 table when the plan targets sm_90a."""

    dtype: str
    epilogue: tuple[str, str] | None  # (source kind, activation)
    entries: tuple[DispatchEntry, ...]
    entries_sm90: tuple[DispatchEntry, ...] | None
    ptrs: tuple[Ptr, ...]
    ints: tuple[SymIntEnc, ...]

    def to_manifest(self) -> dict[str, Any]:
        row = _gemm_row("cutlass", self.dtype, self.epilogue)
        row["entries"] = [e.to_manifest() for e in self.entries]
        if self.entries_sm90 is not None:
            row["entries_sm90"] = [e.to_manifest() for e in self.entries_sm90]
        return {**row, "ptrs": list(self.ptrs), "ints": list(self.ints)}


@dataclass(frozen=True)
class CublasLtLaunch:
    """A cuBLASLt GEMM (Note [cuBLASLt GEMMs] in loader/cublaslt.py) with its epilogue (Note [GEMM
    epilogue]: source kind and activation, None without one); A, B, D and the epilogue source if any,
    with the GEMM record's integers (and the source's four when it has one). No dispatch table: the
    loader asks cuBLASLt's heuristic for an algorithm once per shape."""

    dtype: str
    epilogue: tuple[str, str] | None  # (source kind, activation)
    ptrs: tuple[Ptr, ...]
    ints: tuple[SymIntEnc, ...]

    def to_manifest(self) -> dict[str, Any]:
        return {**_gemm_row("cublaslt", self.dtype, self.epilogue), "ptrs": list(self.ptrs), "ints": list(self.ints)}


@dataclass(frozen=True)
class RefLaunch:
    """A step the reference executor runs (by the value it computes), and why."""

    node: int
    reason: str

    def to_manifest(self) -> dict[str, Any]:
        return {"op": "ref", "node": self.node, "reason": self.reason}


Launch = Union[KernelLaunch, GemmLaunch, CublasLtLaunch, CutlassLaunch, RefLaunch]


def with_ptrs(launch: Launch, ptrs: tuple[Ptr, ...]) -> Launch:
    """The launch with its pointers replaced (resolution after the memory plan)."""
    return launch if isinstance(launch, RefLaunch) else dataclasses.replace(launch, ptrs=ptrs)


@dataclass(frozen=True)
class ArenaBuffer:
    id: int
    dtype: str
    shape: tuple[SymIntEnc, ...]
    offset: SymIntEnc  # bytes from the arena's start

    def to_manifest(self) -> dict[str, Any]:
        return {"id": self.id, "dtype": self.dtype, "shape": list(self.shape), "offset": self.offset}


@dataclass(frozen=True)
class GemmKernel:
    """A CUTLASS kernel the CUDA plan's launches dispatch to (built into a fatbin section)."""

    name: str
    config: str
    dtype: str
    math: str
    tile: tuple[int, ...]
    warp: tuple[int, ...]
    threads: int
    stages: int
    align: int
    ta: bool
    tb: bool
    activation: str
    arch: str
    cluster: tuple[int, ...]
    schedule: str
    source: str

    def to_manifest(self) -> dict[str, Any]:
        row = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in row.items()}


@dataclass(frozen=True)
class NativePlan:
    kernels: tuple[KernelRow, ...]
    launches: tuple[Launch, ...]
    buffers: tuple[ArenaBuffer, ...]
    arena_bytes: SymIntEnc
    arena_bytes_expr: str
    arena_slots: int
    outputs: tuple[int, ...]  # per graph output, the slot it is written to (-1: copied after the run)
    gemm_kernels: tuple[GemmKernel, ...] = ()
    # per launch, its conditions (Note [Guarded launches] in lowering/lower_native.py); () when none has any
    when: tuple[tuple[dict[str, Any], ...], ...] = ()

    def to_manifest(self) -> dict[str, Any]:
        launches = [lr.to_manifest() for lr in self.launches]
        for row, conds in zip(launches, self.when):
            if conds:
                row["when"] = list(conds)
        m: dict[str, Any] = {
            "abi": ABI,
            "kernels": [k.to_manifest() for k in self.kernels],
            "launches": launches,
            "buffers": [b.to_manifest() for b in self.buffers],
            "arena_bytes": self.arena_bytes,
            "arena_bytes_expr": self.arena_bytes_expr,
            "arena_slots": self.arena_slots,
            "outputs": list(self.outputs),
        }
        if self.gemm_kernels:
            m["gemm_kernels"] = [g.to_manifest() for g in self.gemm_kernels]
        return m


def declined(plan: dict[str, Any], n_inputs: int) -> str | None:
    """Why a CPU plan (the manifest's `native_cpu` record) leaves its new signatures to the Python
    loader's own path, or None: the kernel library prepares them, where it exports bpk_prepare (Note
    [Native preparation] in bladepack/loader/native_prepare.py)."""
    if any(slot != 1 + n_inputs + k for k, slot in enumerate(plan["outputs"])):
        return "an output the plan does not write"
    if any(lr["op"] not in ("kernel", "gemm") for lr in plan["launches"]):
        return "a reference step"
    return None
