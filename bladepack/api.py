"""The compile-side public API: `optimize`, `optimize_program` and the in-memory `Artifact`.

In: a torch model and sample inputs, or an ONNX model; or an IR program (`optimize_program`, what
`bladepack extend` rebuilds from). Out: an `Artifact` holding the execution plan, weights and built
kernels, which `save` writes as a .bpk. The arguments are checked here, the environment read here once
(`CompileOptions.from_env`, when no options are passed), and the stages of stages.py run. Imports torch
(through the export front end) only when `optimize` is called on a torch model.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bladepack.compiled import Artifact, save
from bladepack.options import CompileOptions
from bladepack.progress import Progress, configure_logging
from bladepack.reference_record import DEFAULT_BUDGET
from bladepack.stages import Compilation, FrontEnd, compile_model, runs
from bladepack.target import CPU_ONLY, Target

if TYPE_CHECKING:
    from bladepack.ir import Program

log = logging.getLogger("bladepack")

GEMM_LIBRARIES = ("cublas", "cublaslt", "cutlass")

__all__ = ["GEMM_LIBRARIES", "Artifact", "optimize", "optimize_program", "save"]


def optimize(
    model: Any,
    sample_inputs: Any = None,
    dynamic_shapes: Any = None,
    targets: Sequence[str] = ("cpu",),
    dtype: str | None = None,
    gemm_library: str = "cublas",
    reference_cases: bool | int = True,
    options: CompileOptions | None = None,
    packed: bool = False,
) -> Artifact:
    """Export `model` with symbolic shapes, optimize it and return an `Artifact`.

    `model` is a torch `nn.Module`, or an ONNX model (a path to a .onnx file or an `onnx.ModelProto`).
    For torch, `sample_inputs` is one tuple of arguments or a list of tuples; every dim whose size
    differs between samples becomes dynamic. `dynamic_shapes` follows torch.export's structure, with
    `torch.export.Dim` or `bladepack.Dim(name, min, max)` leaves. For ONNX, the model's dims are its
    own (`dim_param` names become symbols); `dynamic_shapes` ({input name: {axis: bladepack.Dim}})
    names and bounds them, and `sample_inputs` are optional (checked against the declared ranges).

    `targets`: "cpu" and / or "cuda" (cubins for sm_80, sm_86, sm_89, sm_90 and PTX for newer GPUs;
    "cuda:sm_90" builds one image). `dtype`: "float16" or "bfloat16" computes the model in that type
    (inputs, weights and outputs included; reductions and GEMMs accumulate in float32), None keeps the
    model's own types. `gemm_library` serves the CUDA plan's GEMMs: "cublas" (the artifact needs
    libcublas where it runs), "cublaslt" (libcublasLt where it runs, each GEMM with its bias / residual
    add and ReLU or tanh-GELU fused into the library call, its algorithm chosen by cuBLASLt's heuristic
    per shape at load) or "cutlass" (CUTLASS kernels chosen per shape range and packaged in the
    artifact; needs the nvidia-cutlass headers here).

    `reference_cases`: record inputs and the model's own outputs (torch eager; onnx's reference
    evaluator) at shapes that exercise every kernel variant and GEMM dispatch entry, so
    `bladepack verify` / `LoadedModule.verify()` can check the artifact where it serves (Note
    [Reference cases]). True: within 2 MiB of recorded outputs; an int: that many bytes; False or 0:
    none.

    `options`: how to build (`CompileOptions`; docs/configuration.md); None reads them from the
    environment, once, here.
    `packed`: also build the packed form (Note [Packed sequences]): plans for the same targets that
    run several sequences of different lengths concatenated, without padding (`LoadedModule.run_packed`,
    on the CPU or a GPU); a CompileError says why a model has none.
    """
    target = Target.parse(targets)
    _check_choices(gemm_library, dtype)
    if isinstance(reference_cases, bool):
        budget = DEFAULT_BUDGET if reference_cases else 0
    elif isinstance(reference_cases, int) and reference_cases >= 0:
        budget = reference_cases
    else:
        raise ValueError(f"reference_cases must be True, False or a byte budget >= 0, got {reference_cases!r}")
    if _is_onnx(model):
        front = _onnx_front_end(model, sample_inputs, dynamic_shapes)
    elif sample_inputs is None:
        raise TypeError("optimize(model, sample_inputs): a torch model needs sample inputs to export")
    else:
        front = _torch_front_end(model, sample_inputs, dynamic_shapes)
    c = Compilation(front, options or CompileOptions.from_env(), target, dtype, gemm_library, budget)
    c.packed = bool(packed)
    return _compile(c)


def _is_onnx(model: Any) -> bool:
    """An onnx.ModelProto or a .onnx path; a torch model is told apart without importing the ONNX front
    end (70 ms)."""
    if not isinstance(model, (str, os.PathLike)) and type(model).__module__.split(".")[0] != "onnx":
        return False
    from bladepack.onnx_import.model import is_onnx_model

    return is_onnx_model(model)


def optimize_program(
    program: Program,
    notes: Sequence[str] = (),
    frontend: str = "torch",
    target: Target = CPU_ONLY,
    dtype: str | None = None,
    gemm_library: str = "cublas",
    samples: Sequence[Mapping[str, int]] = (),
    producer: Mapping[str, str] | None = None,
    options: CompileOptions | None = None,
    packed: bool = False,
) -> Artifact:
    """Optimize an IR `Program` from any front end ("torch" or "onnx", recorded in the producer
    versions) into an `Artifact` for `target` (plan kinds and CUDA images), with no reference cases;
    `samples` are the sample inputs' symbol values. `producer` (extend) keeps the versions of what
    first produced the program instead of asking the front end's framework; `packed` builds the packed
    form too (as `optimize`'s)."""
    _check_choices(gemm_library, dtype)
    front = FrontEnd(frontend, lambda progress: (program, list(notes)), lambda p: tuple(samples))
    c = Compilation(front, options or CompileOptions.from_env(), target, dtype, gemm_library)
    c.producer = dict(producer) if producer is not None else None
    c.packed = packed
    return _compile(c)


def _compile(c: Compilation) -> Artifact:
    configure_logging(c.options.log_level)
    with contextlib.closing(Progress(len(runs(c)), c.options.progress, quiet=c.options.quiet)) as progress:
        return compile_model(c, progress)


def _check_choices(gemm_library: str, dtype: str | None) -> None:
    if gemm_library not in GEMM_LIBRARIES:
        raise ValueError(f"gemm_library must be one of {list(GEMM_LIBRARIES)}, got {gemm_library!r}")
    if dtype is not None:
        from bladepack.passes.mixed_precision import COMPUTE_DTYPES

        if dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype must be one of {list(COMPUTE_DTYPES)} or None, got {dtype!r}")


# --------------------------------------------------------------------------- front ends


def _torch_front_end(model: Any, sample_inputs: Any, dynamic_shapes: Any) -> FrontEnd:
    def run(progress: Progress) -> tuple[Program, list[str]]:
        from bladepack.export import capture, to_program

        start = time.perf_counter()
        captured = capture(model, sample_inputs, dynamic_shapes)
        progress.done(f"torch.export (symbolic shapes): {time.perf_counter() - start:.1f} s")
        for note in captured.notes:
            log.warning("bladepack: %s", note)
        program = to_program(captured)
        progress.done(f"converted to bladepack IR: {len(program.graph.nodes)} nodes")
        return program, list(captured.notes)

    def oracle() -> Any:
        from bladepack.export.oracle import torch_oracle

        return torch_oracle(model)

    return FrontEnd(
        "torch", run, lambda p: _sample_bindings(p, sample_inputs), oracle, "torch eager", _numpy_samples(sample_inputs)
    )


def _onnx_front_end(model: Any, sample_inputs: Any, dynamic_shapes: Any) -> FrontEnd:
    def run(progress: Progress) -> tuple[Program, list[str]]:
        from bladepack.onnx_import import import_onnx

        program = import_onnx(model, sample_inputs, dynamic_shapes)
        progress.done(f"ONNX import: {len(program.graph.nodes)} nodes")
        return program, []

    def oracle() -> Any:
        from bladepack.onnx_import.oracle import onnx_oracle

        return onnx_oracle(model)

    samples = [] if sample_inputs is None else _numpy_samples(sample_inputs)
    return FrontEnd(
        "onnx", run, lambda p: _sample_bindings(p, sample_inputs), oracle, "onnx reference evaluator", samples
    )


def _sample_tuples(sample_inputs: Any) -> list[tuple[Any, ...]]:
    """`optimize`'s sample inputs as a list of argument tuples (one tuple, or a list of them)."""

    def as_tuple(x: Any) -> tuple[Any, ...]:
        return tuple(x) if isinstance(x, (tuple, list)) else (x,)

    many = isinstance(sample_inputs, list) and all(isinstance(s, (tuple, list)) for s in sample_inputs)
    return [as_tuple(s) for s in sample_inputs] if many else [as_tuple(sample_inputs)]


def _numpy_samples(sample_inputs: Any) -> list[list[np.ndarray | None]]:
    """The sample inputs as arrays, by position (torch tensors or numpy arrays; None for anything else;
    bfloat16 tensors widened to float32, which numpy can hold)."""

    def array(x: Any) -> np.ndarray | None:
        if hasattr(x, "detach"):
            x = x.detach().cpu()
            held: np.ndarray = (x.float() if str(x.dtype) == "torch.bfloat16" else x).numpy()
            return held
        a = np.asarray(x)
        return None if a.dtype == object else a

    return [[array(x) for x in sample] for sample in _sample_tuples(sample_inputs)]


def _sample_bindings(program: Program, sample_inputs: Any) -> tuple[dict[str, int], ...]:
    """Per sample, the values of the symbols that are whole input dims (GEMM selection weighs them)."""
    if sample_inputs is None:
        return ()
    import sympy

    out = []
    for sample in _sample_tuples(sample_inputs):  # torch tensors or numpy arrays (ONNX); checked already
        if len(sample) != len(program.graph.inputs):
            continue
        binding: dict[str, int] = {}
        for prm, value in zip(program.graph.inputs, sample):
            shape = getattr(value, "shape", ())
            for dim, size in zip(prm.type.shape, shape):
                if isinstance(dim, sympy.Symbol):
                    binding[dim.name] = int(size)
        out.append(binding)
    return tuple(out)
