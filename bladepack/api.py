"""The compile-side public API: `optimize` and the in-memory `Artifact`.

In: a torch model and sample inputs. Out: an `Artifact` holding the execution plan and weights, which
`save` writes as a .bpk. Imports torch (through the export front end) only when `optimize` is called.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import platform
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bladepack.artifact import format as bpk_format
from bladepack.artifact.plan import ExecPlan
from bladepack.artifact.writer import assemble
from bladepack.errors import BladepackError, CompileError
from bladepack.options import LoaderOptions, Options
from bladepack.progress import Progress, configure_logging
from bladepack.reference_record import DEFAULT_BUDGET
from bladepack.target import CPU_ONLY, Target
from bladepack.version import __version__

if TYPE_CHECKING:
    from bladepack.ir import Program
    from bladepack.library_ops.cutlass.profile import GemmProfiler
    from bladepack.library_ops.cutlass.select import GemmPolicy
    from bladepack.lowering.build_plan import KernelSources, LoweredPlan

log = logging.getLogger("bladepack")

GEMM_LIBRARIES = ("cublas", "cutlass")


@dataclass
class Artifact:
    """A compiled model in memory. `save(path)` writes the .bpk; `to_bytes()` returns its bytes."""

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

    def _parts(self) -> tuple[dict[str, Any], list[bpk_format.Section]]:
        return assemble(
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


def _build_cuda(plan: LoweredPlan, options: Options, images: tuple[str, ...] | None) -> dict[str, bytes]:
    """nvcc builds the CUDA kernels into a cubin per architecture plus PTX (no GPU needed)."""
    from bladepack.codegen.cuda_toolchain import build_images

    if plan.plan.native_cuda is None:
        return {}
    return build_images(plan.sources.cuda_source, options.cache_dir, arches=images, jobs=options.nvcc_jobs)


def _build_gemms(plan: LoweredPlan, options: Options) -> tuple[dict[str, bytes], bytes]:
    """nvcc builds the CUDA plan's CUTLASS GEMM kernels and their Params packer (no GPU needed)."""
    if not plan.sources.gemm_instances:
        return {}, b""
    from bladepack.library_ops.cutlass.toolchain import build_gemms

    return build_gemms(plan.sources.gemm_instances, options.cache_dir, jobs=options.nvcc_jobs)


def _gemm_policy(
    options: Options,
    library: str,
    target: Target,
    samples: tuple[Mapping[str, int], ...],
    notes: list[str],
) -> tuple[GemmPolicy, GemmProfiler | None]:
    """How the CUDA plan's GEMMs are chosen (Note [GEMM profiling] in library_ops/cutlass/profile.py): with
    CUTLASS, a profiler on the CUDA device present here (returned too: the caller closes it), else the
    cost model; the Hopper table when the CUDA images asked for include sm_90a."""
    from bladepack.codegen.cuda_toolchain import hopper_gemms
    from bladepack.library_ops.cutlass.select import GemmPolicy

    cuda = target.cuda
    hopper = cuda and library == "cutlass" and hopper_gemms(target.cuda_images)
    from bladepack.dtypes import DType
    from bladepack.library_ops.cutlass.configs import VERIFIED_DTYPES

    dtypes = VERIFIED_DTYPES | ({DType.FLOAT32, DType.FLOAT64} if options.cutlass_unverified else set())
    policy = GemmPolicy(library, options.gemm_configs, samples=samples, hopper=hopper, dtypes=frozenset(dtypes))
    if not cuda or library != "cutlass" or options.gemm_tuning == "model":
        return policy, None
    from bladepack.loader.cuda_driver import CudaUnavailable, Device

    try:
        device = Device(0)
    except CudaUnavailable as e:
        if options.gemm_tuning == "profile":
            raise CudaUnavailable(f"BLADEPACK_GEMM_TUNING=profile needs a CUDA device here: {e}") from e
        return policy, None
    from bladepack.library_ops.cutlass.profile import GemmProfiler

    profiler = GemmProfiler(device, options.cache_dir, jobs=options.nvcc_jobs)
    notes.append(f"CUTLASS configs chosen by profiling on {device.info.name} ({device.info.arch})")
    on_hopper = hopper and device.info.compute_capability == (9, 0) and LoaderOptions.from_env().hopper_gemms
    policy = dataclasses.replace(policy, measure=profiler, tuned_on=device.info.name, measure_hopper=on_hopper)
    return policy, profiler


def _build_cpu(
    plan: LoweredPlan, options: Options, notes: list[str], progress: Progress
) -> list[tuple[str, tuple[str, ...], bytes]]:
    """Compile the CPU kernel library for each ISA level; without a compiler, warn and keep the
    reference executor (the artifact still runs everywhere, only slower)."""
    from bladepack.codegen.toolchain import build_libraries, find_compiler

    if plan.plan.native_cpu is None or not options.native:
        return []
    cxx = find_compiler()
    if cxx is None:
        msg = "no C++ compiler found (set CXX or install g++): the artifact runs on the reference executor"
        log.warning("bladepack: %s", msg)
        notes.append(msg)
        return []
    libs = build_libraries(plan.sources.cpu_source, options.cache_dir, cxx, progress.done)
    return [(lib.isa.name, lib.isa.requires, lib.data) for lib in libs]


def optimize(
    model: Any,
    sample_inputs: Any = None,
    dynamic_shapes: Any = None,
    targets: Sequence[str] = ("cpu",),
    dtype: str | None = None,
    gemm_library: str = "cublas",
    reference_cases: bool | int = True,
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
    libcublas where it runs) or "cutlass" (CUTLASS kernels chosen per shape range and packaged in the
    artifact; needs the nvidia-cutlass headers here).

    `reference_cases`: record inputs and the model's own outputs (torch eager; onnx's reference
    evaluator) at shapes that exercise every kernel variant and GEMM dispatch entry, so
    `bladepack verify` / `LoadedModule.verify()` can check the artifact where it serves (Note
    [Reference cases]). True: within 2 MiB of recorded outputs; an int: that many bytes; False or 0:
    none.
    """
    target = Target.parse(targets)
    if gemm_library not in GEMM_LIBRARIES:
        raise ValueError(f"gemm_library must be one of {list(GEMM_LIBRARIES)}, got {gemm_library!r}")
    if dtype is not None:
        from bladepack.passes.mixed_precision import COMPUTE_DTYPES

        if dtype not in COMPUTE_DTYPES:
            raise ValueError(f"dtype must be one of {list(COMPUTE_DTYPES)} or None, got {dtype!r}")
    from bladepack.onnx_import.model import is_onnx_model

    if isinstance(reference_cases, bool):
        budget = DEFAULT_BUDGET if reference_cases else 0
    elif isinstance(reference_cases, int) and reference_cases >= 0:
        budget = reference_cases
    else:
        raise ValueError(f"reference_cases must be True, False or a byte budget >= 0, got {reference_cases!r}")
    options = Options.from_env()
    configure_logging(options.log_level)
    extra = int(budget > 0)
    if is_onnx_model(model):
        from bladepack.onnx_import import import_onnx

        stages = _stage_count(target, gemm_library) + 1 + extra
        with contextlib.closing(Progress(stages, options.progress)) as progress:
            with progress.stage("ONNX import"):
                program = import_onnx(model, sample_inputs, dynamic_shapes)
            art = optimize_program(
                program,
                frontend="onnx",
                target=target,
                dtype=dtype,
                gemm_library=gemm_library,
                samples=_sample_bindings(program, sample_inputs),
                progress=progress,
            )
            if budget:
                from bladepack.onnx_import.oracle import onnx_oracle

                samples = [] if sample_inputs is None else _numpy_samples(sample_inputs)
                _record(art, lambda: onnx_oracle(model), "onnx reference evaluator", samples, budget, dtype, progress)
            return art
    if sample_inputs is None:
        raise TypeError("optimize(model, sample_inputs): a torch model needs sample inputs to export")
    from bladepack.export import capture, to_program

    progress = Progress(_stage_count(target, gemm_library) + 2 + extra, options.progress)
    try:
        with progress.stage("torch.export (symbolic shapes)"):
            captured = capture(model, sample_inputs, dynamic_shapes)
        for note in captured.notes:
            log.warning("bladepack: %s", note)
        with progress.stage("convert to bladepack IR"):
            program = to_program(captured)
        art = optimize_program(
            program,
            captured.notes,
            target=target,
            dtype=dtype,
            gemm_library=gemm_library,
            samples=_sample_bindings(program, sample_inputs),
            progress=progress,
        )
        if budget:
            from bladepack.export.oracle import torch_oracle

            samples = _numpy_samples(sample_inputs)
            _record(art, lambda: torch_oracle(model), "torch eager", samples, budget, dtype, progress)
        return art
    finally:
        progress.close()


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


def _record(
    art: Artifact,
    oracle: Any,
    oracle_name: str,
    samples: list[list[np.ndarray | None]],
    budget: int,
    dtype: str | None,
    progress: Progress,
) -> None:
    """Note [Reference cases]: record them in `art` (a note says why where none are recorded)."""
    from bladepack.reference_record import record_cases

    with _stage(progress, "reference cases"):
        if dtype is not None:
            note: str | None = (
                f"no reference cases recorded: the model computes in {dtype}, the oracle in its own types"
            )
        else:
            manifest, _ = art._parts()
            art.reference_cases, note = record_cases(manifest, oracle(), oracle_name, samples, budget)
            if art.reference_cases is not None and art.cpu_libraries:
                note = "; ".join(n for n in (note, _self_check(art, oracle_name)) if n) or None
    if note:
        log.warning("bladepack: %s", note)
        art.notes.append(note)


def _self_check(art: Artifact, oracle_name: str) -> str | None:
    """Note [Reference cases]: the new artifact's CPU kernels run the cases it records; a case they fail
    is said at once (it would fail `bladepack verify` everywhere: the artifact differs from the model)."""
    from bladepack.loader import load
    from bladepack.loader.verify import verdict_line

    try:
        report = load(art.to_bytes(), executor="native").verify()
    except BladepackError as e:
        return f"the recorded reference cases could not be run here ({e})"
    bad = [verdict_line(c) for c in report["cases"] if not c["passed"]]
    if not bad:
        return None
    return f"the artifact differs from {oracle_name} in reference cases ({'; '.join(bad)}): please report it"


def _stage_count(target: Target, gemm_library: str) -> int:
    """optimize_program's stages: passes, plan, CPU libraries, then CUDA images and CUTLASS GEMMs."""
    cuda = bool(target.cuda_images)
    return 3 + int(cuda) + int(cuda and gemm_library == "cutlass")


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


@contextlib.contextmanager
def _stage(progress: Progress, name: str) -> Iterator[None]:
    """A stage of optimize, reported by `progress`; an exception that is not a BladepackError (an
    internal failure) leaves as a CompileError naming the stage (Note [No raw tracebacks])."""
    with progress.stage(name):
        try:
            yield
        except BladepackError:
            raise
        except Exception as e:
            raise CompileError(
                f"internal error in optimize's stage '{name}': {type(e).__name__}: {e} "
                "(a bladepack bug: please report it with the model; the cause is chained below)"
            ) from e


def optimize_program(
    program: Program,
    notes: Sequence[str] = (),
    frontend: str = "torch",
    target: Target = CPU_ONLY,
    dtype: str | None = None,
    gemm_library: str = "cublas",
    samples: Sequence[Mapping[str, int]] = (),
    progress: Progress | None = None,
    producer: Mapping[str, str] | None = None,
) -> Artifact:
    """Optimize an IR `Program` from any front end ("torch" or "onnx", recorded in the producer
    versions) into an `Artifact` (the half of `optimize` after export) for `target` (plan kinds and
    CUDA images), `samples` are the sample inputs' symbol values. `producer` (extend) keeps the
    versions of what first produced the program instead of asking the front end's framework."""
    from bladepack.ir import print_graph
    from bladepack.ir.serialize import NotSerializable, encode_program
    from bladepack.lowering.build_plan import build_plan
    from bladepack.passes.pipeline import run_pipeline

    options = Options.from_env()
    if progress is None:  # called directly (the ONNX path): this call owns the progress report
        configure_logging(options.log_level)
        with contextlib.closing(Progress(_stage_count(target, gemm_library), options.progress)) as own:
            return optimize_program(program, notes, frontend, target, dtype, gemm_library, samples, own, producer)
    source: tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]] | None = None
    try:  # Note [Extending an artifact]: the program as the front end gave it
        data, weights = encode_program(program)
        meta = {
            "frontend": frontend,
            "targets": target.spec(),
            "dtype": dtype,
            "gemm_library": gemm_library,
            "samples": [dict(sorted(s.items())) for s in samples],
            "notes": list(notes),
        }
        source = (data, weights, meta)
    except NotSerializable as e:
        notes = [*notes, f"bladepack extend cannot rebuild this artifact: {e}"]
    with _stage(progress, "graph passes (fusion, layouts, shape constraints)"):
        if dtype is not None:
            from bladepack.passes.mixed_precision import to_precision

            program = to_precision(program, dtype)
        program = run_pipeline(program, options, frozenset(target.kinds))
    notes = list(notes)
    with _stage(progress, "plan: kernels, GEMMs, memory, shape program"):
        gemm, profiler = _gemm_policy(options, gemm_library, target, tuple(samples), notes)
        try:
            lowered = build_plan(program, target=target, gemm=gemm)
        finally:
            if profiler is not None:
                profiler.close()
        cutlass = gemm.library == "cutlass"
        off = sorted({r["dtype"] for r in lowered.plan.gemm_configs if r["library"] == "cublas"}) if cutlass else []
        if off:  # library_ops/cutlass/configs.VERIFIED_DTYPES
            notes.append(
                f"CUTLASS serves {' / '.join(sorted(d.value for d in gemm.dtypes))} GEMMs; the {' / '.join(off)} ones "
                "run on cuBLAS (not verified on a GPU with CUTLASS; BLADEPACK_CUTLASS_UNVERIFIED=1 puts them there)"
            )
            log.warning("bladepack: %s", notes[-1])
    with _stage(progress, "CPU kernel libraries"):
        libraries = _build_cpu(lowered, options, notes, progress)
        producer = dict(producer) if producer is not None else _producer(frontend)
    if libraries:
        from bladepack.codegen.toolchain import compiler_version, find_compiler

        producer["cxx"] = compiler_version(find_compiler() or "")
    with _stage(progress, "CUDA kernels") if target.cuda_images else contextlib.nullcontext():
        images = _build_cuda(lowered, options, target.cuda_images)
    with _stage(progress, "CUTLASS GEMMs") if lowered.plan.native_cuda is not None else contextlib.nullcontext():
        gemm_images, gemm_packer = _build_gemms(lowered, options)
    if images:
        from bladepack.codegen.cuda_toolchain import find_nvcc, nvcc_version

        producer["nvcc"] = nvcc_version(find_nvcc())
    plan, sources = lowered.plan, lowered.sources
    art = Artifact(
        plan,
        dict(program.weight_data),
        producer,
        sources,
        print_graph(program.graph, program.shape_env),
        notes,
        libraries,
        images,
        gemm_images,
        gemm_packer,
        source_program=source,
    )
    if options.dump_dir is not None:
        (options.dump_dir / "fusion_plan.txt").write_text(sources.fusion_text)
        (options.dump_dir / "kernels_cpu.cc").write_text(sources.cpu_source)
        if plan.native_cuda is not None:
            (options.dump_dir / "fusion_plan_cuda.txt").write_text(sources.cuda_fusion_text)
            (options.dump_dir / "kernels_cuda.cu").write_text(sources.cuda_source)
        from bladepack.inspect import inspect_text, manifest_summary

        manifest, _ = art._parts()
        (options.dump_dir / "plan.txt").write_text(inspect_text(manifest_summary(manifest)))
    return art
