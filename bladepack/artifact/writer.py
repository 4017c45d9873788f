"""Assemble the manifest and sections of a .bpk from an `ExecPlan` and weight arrays.

In: the plan, the weight arrays (by name) and producer versions. Out: `(manifest, sections)` ready for
`format.write` / `format.encode`. Deterministic: the same inputs give the same bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from bladepack.artifact.format import FORMAT_MAJOR, FORMAT_MINOR, Section
from bladepack.artifact.plan import ExecPlan
from bladepack.opset import packed_weights


def weight_section_name(name: str) -> str:
    return f"weight/{name}"


def library_section_name(isa: str) -> str:
    return f"cpu/{isa}.so"


GEMM_PACKER_SECTION = "cutlass/packer-x86_64-linux.so"


def cuda_image_section_name(arch: str) -> str:
    return f"cuda/{arch}.{'ptx' if arch.startswith('compute_') else 'cubin'}"


def assemble(
    plan: ExecPlan,
    weights: Mapping[str, np.ndarray],
    producer: Mapping[str, str],
    cpu_libraries: Sequence[tuple[str, Sequence[str], bytes]] = (),
    cuda_images: Mapping[str, bytes] | None = None,
    gemm_images: Mapping[str, bytes] | None = None,
    gemm_packer: bytes = b"",
    reference_cases: tuple[dict[str, Any], Mapping[str, bytes]] | None = None,
    source_program: tuple[dict[str, Any], Mapping[str, np.ndarray], Mapping[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[Section]]:
    """`cpu_libraries`: (ISA level, CPU flags it needs, shared-object bytes) per built level;
    `cuda_images`: {"sm_80": cubin, ..., "compute_90": PTX} for the native CUDA plan; `gemm_images`:
    {CUTLASS kernel name: fatbin} and `gemm_packer` (its Params packer library) for that plan's GEMMs;
    `reference_cases`: the manifest record and the sections of Note [Reference cases]; `source_program`:
    the front end's program (ir/serialize.py), its weights and how it was optimized (Note [Extending an
    artifact])."""
    sections = []
    for w in plan.weights:
        given = np.asarray(weights[w.name])
        arr = np.ascontiguousarray(given).reshape(given.shape)  # ascontiguousarray makes a 0-d array 1-d
        # bfloat16 weights travel as their uint16 bit patterns (numpy has no bfloat16)
        held = "bfloat16" if arr.dtype == np.uint16 and w.dtype == "bfloat16" else arr.dtype.name
        if held != w.dtype or tuple(arr.shape) != w.shape:
            raise ValueError(f"weight {w.name}: array {arr.dtype}{arr.shape} does not match {w.dtype}{w.shape}")
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        sections.append(Section(weight_section_name(w.name), memoryview(arr.data).cast("B")))
    manifest: dict[str, Any] = {
        "format_version": [FORMAT_MAJOR, FORMAT_MINOR],
        "producer": dict(sorted(producer.items())),
        "output_structure": plan.output_structure,
        "symbols": [s.to_manifest() for s in plan.symbols],
        "inputs": [t.to_manifest() for t in plan.inputs],
        "outputs": [t.to_manifest() for t in plan.outputs],
        "weights": [w.to_manifest() for w in plan.weights],
        "shape_program": dict(plan.shape_program),
        "values": [v.to_manifest() for v in plan.values],
        "plan": {"steps": [s.to_manifest() for s in plan.steps]},
        "arena_bytes": {"expr": plan.arena_bytes_expr, "value": plan.arena_bytes},
        "kernels": [k.to_manifest() for k in plan.kernels],
        "gemm_configs": list(plan.gemm_configs),
    }
    if plan.batch_dims:
        manifest["batch_dims"] = dict(sorted(plan.batch_dims.items()))
    manifest["padding_dims"] = dict(sorted(plan.padding_dims.items()))  # empty: no dim to pad (format 1.5)
    if plan.native_cpu is not None and cpu_libraries:
        libs = []
        for isa, requires, data in cpu_libraries:
            sections.append(Section(library_section_name(isa), memoryview(data)))
            libs.append({"isa": isa, "requires": list(requires), "section": library_section_name(isa)})
        manifest["native_cpu"] = {**plan.native_cpu.to_manifest(), "libraries": libs}
    if plan.native_cuda is not None and cuda_images:
        images = []
        for arch, data in sorted(cuda_images.items()):
            sections.append(Section(cuda_image_section_name(arch), memoryview(data)))
            images.append({"arch": arch, "section": cuda_image_section_name(arch)})
        manifest["native_cuda"] = {**plan.native_cuda.to_manifest(), "images": images}
        if plan.native_cuda.gemm_kernels:
            if not gemm_images or not gemm_packer:
                raise ValueError("the CUDA plan runs CUTLASS GEMMs, and their kernels or packer were not built")
            rows = []
            for kernel in plan.native_cuda.gemm_kernels:
                name = f"cutlass/{kernel.name}.fatbin"
                sections.append(Section(name, memoryview(gemm_images[kernel.name])))
                rows.append({**kernel.to_manifest(), "section": name})
            sections.append(Section(GEMM_PACKER_SECTION, memoryview(gemm_packer)))
            manifest["native_cuda"]["gemm_kernels"] = rows
            manifest["native_cuda"]["gemm_packer"] = {"section": GEMM_PACKER_SECTION, "platform": "x86_64-linux"}
    if source_program is not None:
        manifest["source_program"] = _source_program(source_program, sections)
    if reference_cases is not None:
        record, blobs = reference_cases
        manifest["reference_cases"] = record
        sections += [Section(name, memoryview(blob)) for name, blob in sorted(blobs.items())]
    return manifest, sections


PACKED_PREFIX = "packed/"
PACKED_OMITS = ("format_version", "producer", "padding_dims", "batch_dims")


def embed_packed(
    manifest: dict[str, Any],
    sections: list[Section],
    record: Mapping[str, Any],
    plan: Mapping[str, Any],
    plan_sections: Sequence[Section],
) -> None:
    """Note [Packed sequences]: the packed form's plan (its own manifest, less what the artifact's says)
    as `manifest["packed"]["plan"]`; each of its sections the artifact does not hold byte for byte
    under the same name (its kernel library; a weight a pass made differently) is added under
    "packed/<name>", and `manifest["packed"]["sections"]` maps the plan's names to those."""
    held = {s.name: s.data for s in sections}
    renamed = {}
    for s in plan_sections:
        same = held.get(s.name)
        if same is not None and memoryview(same).cast("B") == memoryview(s.data).cast("B"):
            continue
        renamed[s.name] = PACKED_PREFIX + s.name
        sections.append(Section(PACKED_PREFIX + s.name, s.data))
    body = {k: v for k, v in plan.items() if k not in PACKED_OMITS}
    manifest["packed"] = {**record, "plan": body, "sections": dict(sorted(renamed.items()))}


PROGRAM_SECTION = "program.msgpack"


def _packed_copy(name: str, arr: np.ndarray, final: Mapping[str, Any]) -> dict[str, Any] | None:
    """Note [Derived source weights]: where the plan holds `arr` only as a kernel's packed copy, the
    row fields that name it ({packed: [sections], layout, and for a linear layer's weight
    `transposed`}), else None. A copy counts only if unpacking it gives `arr`'s bytes."""
    want = memoryview(arr.data).cast("B")
    if arr.ndim == 4:
        for layout in packed_weights.EXACT_LAYOUTS:
            section = weight_section_name(f"{name}.{layout}")
            held = final.get(section)
            if held is not None and memoryview(held).cast("B") == memoryview(
                packed_weights.pack(layout, arr).data
            ).cast("B"):
                return {"packed": [section], "layout": layout}
        return None
    if arr.ndim != 2:
        return None
    for layout in packed_weights.LINEAR_LAYOUTS:
        if layout == "panels":  # one piece, or pieces of K numbered from 0 (Note [Dense K pieces])
            sections = [weight_section_name(f"{name}.panels")]
            if sections[0] not in final:
                sections = []
                while weight_section_name(f"{name}.panels{len(sections)}") in final:
                    sections.append(weight_section_name(f"{name}.panels{len(sections)}"))
        else:
            sections = [weight_section_name(f"{name}.{layout}")]
        if not sections or any(s not in final for s in sections):
            continue
        for transposed in (True, False):
            try:  # a copy of another dtype (a dtype= conversion) or size does not unpack to arr
                pieces = [np.frombuffer(final[s], dtype=arr.dtype) for s in sections]
                back = packed_weights.unpack_linear(layout, pieces, arr.shape, transposed)
            except ValueError:
                continue
            if memoryview(back.data).cast("B") == want:
                return {"packed": sections, "layout": layout, "transposed": transposed}
    return None


def _source_program(
    source: tuple[dict[str, Any], Mapping[str, np.ndarray], Mapping[str, Any]], sections: list[Section]
) -> dict[str, Any]:
    """Note [Extending an artifact]: the program as a msgpack section, and its weights — a weight the
    optimized plan also holds, byte for byte, under the same name shares that section.

    Note [Derived source weights]: a weight the plan holds only packed for a kernel — a convolution's
    NAME.ihwo / NAME.blocks, a linear layer's NAME.dense / NAME.panels[i] / NAME.kn (opset/
    packed_weights.py) — is not stored a second time as the front end had it; its row names the packed
    sections and their `layout`, and `extend` unpacks them. ResNet-18's artifact: 95 -> 51 MB."""
    data, weights, meta = source
    final = {s.name: s.data for s in sections}
    rows: dict[str, dict[str, Any]] = {}
    for name, arr in sorted(weights.items()):
        arr = np.ascontiguousarray(arr).reshape(np.shape(arr))  # a 0-d weight stays 0-d
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        blob = memoryview(arr.data).cast("B")
        row: dict[str, Any] = {"dtype": arr.dtype.name, "shape": list(arr.shape)}
        section = weight_section_name(name)
        held = final.get(section)
        if held is None or memoryview(held).cast("B") != blob:
            derived = _packed_copy(name, arr, final)
            if derived is not None:  # under its own key: a 1.8 reader refuses the row, never misreads it
                rows[name] = {**derived, **row}
                continue
            section = f"program/weight/{name}"
            sections.append(Section(section, blob))
        rows[name] = {"section": section, **row}
    sections.append(Section(PROGRAM_SECTION, msgpack.packb(data, use_bin_type=True)))
    return {**meta, "section": PROGRAM_SECTION, "weights": rows}
