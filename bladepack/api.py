"""The compile-side public API: `optimize` and the in-memory `Artifact`.

In: a torch model and sample inputs. Out: an `Artifact` holding the execution plan and weights, which
`save` writes as a .bpk. Imports torch (through the export front end) only when `optimize` is called.
"""

from __future__ import annotations

import logging
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bladepack.artifact import format as bpk_format
from bladepack.artifact.plan import ExecPlan
from bladepack.artifact.writer import assemble
from bladepack.options import Options
from bladepack.version import __version__

if TYPE_CHECKING:
    from bladepack.ir import Program

log = logging.getLogger("bladepack")

SUPPORTED_TARGETS = ("cpu",)


@dataclass
class Artifact:
    """A compiled model in memory. `save(path)` writes the .bpk; `to_bytes()` returns its bytes."""

    plan: ExecPlan
    weights: Mapping[str, np.ndarray]
    producer: Mapping[str, str]
    ir_text: str = ""
    notes: list[str] = field(default_factory=list)
    # (ISA level, CPU flags it needs, shared-object bytes) of the compiled CPU kernel library
    cpu_libraries: list[tuple[str, tuple[str, ...], bytes]] = field(default_factory=list)

    def _parts(self) -> tuple[dict[str, Any], list[bpk_format.Section]]:
        return assemble(self.plan, self.weights, self.producer, self.cpu_libraries)

    def save(self, path: str | os.PathLike[str]) -> None:
        manifest, sections = self._parts()
        bpk_format.write(path, manifest, sections)

    def to_bytes(self) -> bytes:
        manifest, sections = self._parts()
        return b"".join(bytes(c) for c in bpk_format.encode(manifest, sections))


def save(artifact: Artifact, path: str | os.PathLike[str]) -> None:
    artifact.save(path)


def _producer(frontend: str) -> dict[str, str]:
    """Versions of what produced the artifact: bladepack, the front end's framework, numpy, Python."""
    if frontend == "onnx":
        import onnx

        framework = {"onnx": onnx.__version__}
    else:
        import torch

        framework = {"torch": torch.__version__.split("+")[0]}
    return {"bladepack": __version__, **framework, "numpy": np.__version__, "python": platform.python_version()}


def _check_targets(targets: Sequence[str]) -> None:
    if isinstance(targets, str):
        raise TypeError(f"targets must be a sequence such as ('cpu',), not the string {targets!r}")
    bad = [t for t in targets if t not in SUPPORTED_TARGETS]
    if bad or not targets:
        raise ValueError(f"unsupported targets {bad or list(targets)}; this version supports {list(SUPPORTED_TARGETS)}")


def _build_cpu(plan: ExecPlan, options: Options, notes: list[str]) -> list[tuple[str, tuple[str, ...], bytes]]:
    """Compile the CPU kernel library for each ISA level; without a compiler, warn and keep the
    reference executor (the artifact still runs everywhere, only slower)."""
    from bladepack.codegen.toolchain import build_libraries, find_compiler

    if plan.native_cpu is None or not options.native:
        return []
    cxx = find_compiler()
    if cxx is None:
        msg = "no C++ compiler found (set CXX or install g++): the artifact runs on the reference executor"
        log.warning("bladepack: %s", msg)
        notes.append(msg)
        return []
    libs = build_libraries(plan.cpu_source, options.cache_dir, cxx)
    return [(lib.isa.name, lib.isa.requires, lib.data) for lib in libs]


def optimize(
    model: Any, sample_inputs: Any = None, dynamic_shapes: Any = None, targets: Sequence[str] = ("cpu",)
) -> Artifact:
    """Export `model` with symbolic shapes, optimize it and return an `Artifact`.

    `model` is a torch `nn.Module`, or an ONNX model (a path to a .onnx file or an `onnx.ModelProto`).
    For torch, `sample_inputs` is one tuple of arguments or a list of tuples; every dim whose size
    differs between samples becomes dynamic. `dynamic_shapes` follows torch.export's structure, with
    `torch.export.Dim` or `bladepack.Dim(name, min, max)` leaves. For ONNX, the model's dims are its
    own (`dim_param` names become symbols); `dynamic_shapes` ({input name: {axis: bladepack.Dim}})
    names and bounds them, and `sample_inputs` are optional (checked against the declared ranges).
    """
    _check_targets(targets)
    from bladepack.onnx_import.model import is_onnx_model

    if is_onnx_model(model):
        from bladepack.onnx_import import import_onnx

        return optimize_program(import_onnx(model, sample_inputs, dynamic_shapes), frontend="onnx")
    if sample_inputs is None:
        raise TypeError("optimize(model, sample_inputs): a torch model needs sample inputs to export")
    from bladepack.export import capture, to_program

    captured = capture(model, sample_inputs, dynamic_shapes)
    for note in captured.notes:
        log.warning("bladepack: %s", note)
    return optimize_program(to_program(captured), captured.notes)


def optimize_program(program: Program, notes: Sequence[str] = (), frontend: str = "torch") -> Artifact:
    """Optimize an IR `Program` from any front end ("torch" or "onnx", recorded in the producer
    versions) into an `Artifact` (the half of `optimize` after export)."""
    from bladepack.ir import print_graph
    from bladepack.optimize.build_plan import build_plan
    from bladepack.optimize.pipeline import run_pipeline

    options = Options.from_env()
    program = run_pipeline(program, options)
    plan = build_plan(program)
    notes = list(notes)
    libraries, producer = _build_cpu(plan, options, notes), _producer(frontend)
    if libraries:
        from bladepack.codegen.toolchain import compiler_version, find_compiler

        producer["cxx"] = compiler_version(find_compiler() or "")
    art = Artifact(
        plan,
        dict(program.weight_data),
        producer,
        print_graph(program.graph, program.shape_env),
        notes,
        libraries,
    )
    if options.dump_dir is not None:
        (options.dump_dir / "fusion_plan.txt").write_text(plan.fusion_text)
        (options.dump_dir / "kernels_cpu.cc").write_text(plan.cpu_source)
        from bladepack.inspect import inspect_text, manifest_summary

        manifest, _ = art._parts()
        (options.dump_dir / "plan.txt").write_text(inspect_text(manifest_summary(manifest)))
    return art
