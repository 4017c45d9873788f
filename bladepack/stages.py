"""The stages of optimize, in order, each with its name: the one visible pipeline.

In: a front end (a torch model with its samples, or an ONNX model) or a program (`bladepack extend`),
the backends to build for and `CompileOptions`. Out: an `Artifact`. `STAGES` lists every stage; a
per-backend stage runs once for each backend, in registry order, and consecutive ones as a group (the
fusion, lowering and memory plan of one backend, then of the next: `runs`). With BLADEPACK_DUMP=dir
(`CompileOptions.dump_dir`) each stage writes what it produced into dir, named after the stage:

    01-frontend.ir              the program as the front end gave it (torch.export + conversion, ONNX import)
    02-precision.ir             computed in float16 / bfloat16 (dtype=...)
    03-pass-NN-<pass>.ir        after each graph pass (passes/pipeline.PIPELINE)
    04-shape_guards.txt         the shape program so far: input dims bound, constraints and sizes checked
    05-fusion.<kind>.txt        per backend: which values live in memory, which kernel computes each
    06-lowering.<kind>.<ext>    per backend: the kernels' translation unit and the launch records
    07-memory_plan.<kind>.txt   per backend: the arena's buffers and size
    08-plan.txt                 the finished plan, as `bladepack inspect` shows it
    09-build.<kind>.txt         per backend: the images built, their sizes and digests
    10-reference_cases.txt      the reference cases recorded (Note [Reference cases])

With `packed` (optimize(..., packed=True)) a "packed form" stage after the builds compiles the packed
program (Note [Packed sequences]) through the same stages and targets, quietly and without dumps, into
plans the artifact embeds (CPU, and CUDA where it is a target), and checks it against the plan on the
CPU (Note [Packed self-check] in packed_build.py).

Every stage but the front end turns an unexpected exception into a CompileError naming the stage
(Note [No raw tracebacks]); `Progress` reports each as it ends (Note [Progress]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from bladepack.backends import Backend, Built, backends_for
from bladepack.compiled import Artifact
from bladepack.errors import BladepackError, CompileError
from bladepack.library_ops.cutlass.select import GemmPolicy
from bladepack.options import CompileOptions, LoaderOptions
from bladepack.progress import Progress
from bladepack.target import Target

if TYPE_CHECKING:
    from bladepack.ir import Program
    from bladepack.lowering.build_plan import LoweredPlan, PlanBuilder
    from bladepack.lowering.lower_native import Lowerer

log = logging.getLogger("bladepack")


@dataclass
class FrontEnd:
    """What the front-end stage runs (`run(progress)`: the program and its notes; `sample_dims(program)`:
    per sample input, the values of the symbols that are whole input dims, which GEMM selection weighs)
    and, for reference cases, the oracle (`oracle()` builds it: the model itself), its name and the
    sample inputs as arrays. `bladepack extend`'s front end hands on a decoded program."""

    name: str  # "torch" | "onnx": recorded in the producer versions
    run: Callable[[Progress], tuple[Program, list[str]]]
    sample_dims: Callable[[Program], tuple[Mapping[str, int], ...]] = lambda p: ()
    oracle: Callable[[], Any] | None = None
    oracle_name: str = ""
    samples: list[list[np.ndarray | None]] = field(default_factory=list)


@dataclass
class Compilation:
    """The state one optimize carries from stage to stage."""

    front: FrontEnd
    options: CompileOptions
    target: Target
    dtype: str | None
    gemm_library: str
    budget: int = 0  # reference cases: bytes of recorded outputs (0: none)
    producer: dict[str, str] | None = None  # None: the front end's framework versions
    program: Program | None = None
    notes: list[str] = field(default_factory=list)
    sample_dims: tuple[Mapping[str, int], ...] = ()
    backends: tuple[Backend, ...] = ()
    source_program: tuple[dict[str, Any], dict[str, np.ndarray], dict[str, Any]] | None = None
    builder: PlanBuilder | None = None
    policies: dict[str, GemmPolicy] = field(default_factory=dict)
    lowerers: dict[str, Lowerer] = field(default_factory=dict)
    lowered: LoweredPlan | None = None
    built: dict[str, Built] = field(default_factory=dict)
    artifact: Artifact | None = None
    closers: list[Any] = field(default_factory=list)  # GEMM profilers, closed when the plan is done
    packed: bool = False  # build the packed form too (Note [Packed sequences])
    front_program: Program | None = None  # the program as the front end gave it


Run = Callable[[Compilation, Backend, Progress], None]
Dump = Callable[[Compilation, Backend], Mapping[str, str]]


@dataclass(frozen=True)
class Stage:
    """A stage: its name (progress lines, dump files), what it runs, what it dumps, whether it runs once
    per backend, and whether it applies to this compilation at all."""

    name: str
    run: Run
    dump: Dump = lambda c, b: {}
    per_backend: bool = False
    applies: Callable[[Compilation], bool] = lambda c: True


# --------------------------------------------------------------------------- the stages


def _front_end(c: Compilation, _: Backend, progress: Progress) -> None:
    c.program, notes = c.front.run(progress)
    c.front_program = c.program
    c.notes += notes
    c.sample_dims = c.front.sample_dims(c.program)
    from bladepack.ir.serialize import NotSerializable, encode_program

    try:  # Note [Extending an artifact]: the program as the front end gave it
        data, weights = encode_program(c.program)
        meta = {
            "frontend": c.front.name,
            "targets": c.target.spec(),
            "dtype": c.dtype,
            "gemm_library": c.gemm_library,
            "samples": [dict(sorted(s.items())) for s in c.sample_dims],
            "notes": list(c.notes),
        }
        c.source_program = (data, weights, meta)
    except NotSerializable as e:
        c.notes.append(f"bladepack extend cannot rebuild this artifact: {e}")


def _precision(c: Compilation, _: Backend, progress: Progress) -> None:
    from bladepack.passes.mixed_precision import to_precision

    assert c.dtype is not None
    c.program = to_precision(_program(c), c.dtype)


def _graph_passes(c: Compilation, _: Backend, progress: Progress) -> None:
    from bladepack.passes.pipeline import run_pipeline

    dump = None if c.options.dump_dir is None else (c.options.dump_dir, "03-pass-")
    c.program = run_pipeline(_program(c), c.options, [b.caps for b in c.backends], dump)


def _shape_guards(c: Compilation, _: Backend, progress: Progress) -> None:
    from bladepack.lowering.build_plan import PlanBuilder

    c.builder = PlanBuilder(_program(c))
    c.builder.guards()


def _fusion(c: Compilation, b: Backend, progress: Progress) -> None:
    base = GemmPolicy(c.gemm_library, c.options.gemm_configs, samples=c.sample_dims)
    policy, closer = b.gemm_policy(base, c.target, c.options, c.notes)
    if closer is not None:
        c.closers.append(closer)
    c.policies[b.kind] = policy
    assert c.builder is not None
    c.lowerers[b.kind] = c.builder.fusion(b, policy)


def _lowering(c: Compilation, b: Backend, progress: Progress) -> None:
    from bladepack.lowering.lower_native import emit_launches

    emit_launches(c.lowerers[b.kind])


def _memory_plan(c: Compilation, b: Backend, progress: Progress) -> None:
    assert c.builder is not None
    c.builder.memory_plan(c.lowerers[b.kind])


def _plan(c: Compilation, _: Backend, progress: Progress) -> None:
    """The ExecPlan, and the artifact it starts (the builds add their images to it)."""
    from bladepack.ir import print_graph

    assert c.builder is not None
    while c.closers:
        c.closers.pop().close()
    c.lowered = low = c.builder.finish()
    p = _program(c)
    producer = dict(c.producer) if c.producer is not None else _producer(c.front.name)
    c.artifact = Artifact(
        low.plan,
        dict(p.weight_data),
        producer,
        low.sources,
        print_graph(p.graph, p.shape_env),
        c.notes,
        source_program=c.source_program,
    )
    for b in c.backends:
        policy = c.policies[b.kind]
        off = sorted({r["dtype"] for r in c.builder.natives[b.kind].gemm_rows if r["library"] == "cublas"})
        if policy.library == "cutlass" and off:  # library_ops/cutlass/configs.VERIFIED_DTYPES
            c.notes.append(
                f"CUTLASS serves {' / '.join(sorted(d.value for d in policy.dtypes))} GEMMs; the {' / '.join(off)} "
                "ones run on cuBLAS (not verified on a GPU with CUTLASS; BLADEPACK_CUTLASS_UNVERIFIED=1 puts them there)"
            )
            log.warning("bladepack: %s", c.notes[-1])


def _build(c: Compilation, b: Backend, progress: Progress) -> None:
    assert c.lowered is not None
    art = _artifact(c)
    built = c.built[b.kind] = b.build(c.lowered.sources.units[b.kind], c.target, c.options, progress, c.notes)
    for name, value in built.fields.items():
        setattr(art, name, value)
    art.producer = {**art.producer, **built.producer}


def _packed_form(c: Compilation, _: Backend, progress: Progress) -> None:
    """Note [Packed sequences]: the packed form's plans (every kind the artifact has: the CPU's, and
    the CUDA one's where CUDA is a target), embedded in the artifact and checked on the CPU."""
    from bladepack.packed_build import build_packed, self_check

    art = _artifact(c)
    assert c.front_program is not None

    def compile_packed(program: Program) -> Artifact:
        front = FrontEnd(c.front.name, lambda progress: (program, []), lambda p: ())
        sub = Compilation(front, dataclasses.replace(c.options, dump_dir=None), c.target, c.dtype, c.gemm_library)
        sub.producer = dict(art.producer)
        return compile_model(sub, Progress(len(runs(sub)), "0", quiet=True))

    art.packed = build_packed(c.front_program, c.target, compile_packed)
    if art.cpu_libraries and art.packed[1].cpu_libraries and c.front.samples:
        note = self_check(art.to_bytes(), c.front.samples, c.options)
        if note:
            log.warning("bladepack: %s", note)
            art.notes.append(note)


def _reference_cases(c: Compilation, _: Backend, progress: Progress) -> None:
    """Note [Reference cases]: record them in the artifact (a note says why where none are recorded),
    then run them on the new artifact's CPU kernels."""
    from bladepack.reference_record import record_cases

    art, front = _artifact(c), c.front
    assert front.oracle is not None
    if c.dtype is not None:
        note: str | None = f"no reference cases recorded: the model computes in {c.dtype}, the oracle in its own types"
    else:
        manifest = art._parts()[0]
        try:
            oracle = front.oracle()
        except Exception as e:  # an oracle without one of the model's ops (onnx's evaluator has no Scatter)
            oracle, note = (
                None,
                f"no reference cases recorded: the {front.oracle_name} cannot run this model "
                + (f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"),
            )
        if oracle is not None:
            art.reference_cases, note = record_cases(manifest, oracle, front.oracle_name, front.samples, c.budget)
        if art.reference_cases is not None and art.cpu_libraries:
            note = "; ".join(n for n in (note, _self_check(art, front.oracle_name, c.options)) if n) or None
    if note:
        log.warning("bladepack: %s", note)
        art.notes.append(note)


def _self_check(art: Artifact, oracle_name: str, options: CompileOptions) -> str | None:
    """Note [Self-check]: the new artifact's CPU kernels run the cases it records, in the library of
    every ISA level this CPU runs (the loader's defaults otherwise, this build's cache). A case one fails
    would fail `bladepack verify` on such machines: the artifact differs from the model, a bladepack
    bug. That is a CompileError naming the cases, unless options.self_check is "warn" (the artifact is
    kept, the failure in its notes, for debugging). Each output is judged at the tolerance of the
    precision it is computed in (Note [Verdict tolerance]), so a correct mixed-precision artifact
    passes. Cases that cannot run here are a note."""
    from bladepack.cpu_features import cpu_flags
    from bladepack.loader import load
    from bladepack.loader.verify import verdict_line

    have = cpu_flags()
    levels: list[str | None] = [isa for isa, requires, _ in art.cpu_libraries if set(requires) <= have] or [None]
    data = art.to_bytes()
    failed: dict[str, list[str]] = {}  # a failing case's verdict -> the ISA levels it failed in
    for isa in levels:
        loader_options = LoaderOptions(cache_dir=options.cache_dir, cpu_isa=isa)
        try:
            report = load(data, executor="native", options=loader_options).verify()
        except BladepackError as e:
            return f"the recorded reference cases could not be run here ({e})"
        for case in report["cases"]:
            if not case["passed"]:
                failed.setdefault(verdict_line(case), []).append(str(isa))
    if not failed:
        return None
    bad = [line + (f" ({', '.join(isas)} kernels)" if len(levels) > 1 else "") for line, isas in failed.items()]
    what = f"the artifact differs from {oracle_name} in reference cases ({'; '.join(bad)})"
    if options.self_check == "warn":
        return f"{what}: please report it"
    raise CompileError(
        f"{what}: a bladepack bug, please report it with the model. BLADEPACK_SELF_CHECK=warn "
        "(CompileOptions(self_check='warn')) keeps such an artifact, with this in its notes, for debugging"
    )


STAGES: tuple[Stage, ...] = (
    Stage("front end", _front_end, lambda c, b: {"01-frontend.ir": _ir(c)}),
    Stage("precision", _precision, lambda c, b: {"02-precision.ir": _ir(c)}, applies=lambda c: c.dtype is not None),
    Stage("graph passes", _graph_passes),  # dumps each pass itself: 03-pass-NN-<pass>.ir
    Stage("shape guards", _shape_guards, lambda c, b: {"04-shape_guards.txt": _guards_text(c)}),
    Stage("fusion", _fusion, lambda c, b: {f"05-fusion.{b.kind}.txt": _fusion_text(c, b)}, per_backend=True),
    Stage("lowering", _lowering, lambda c, b: _lowering_dump(c, b), per_backend=True),
    Stage(
        "memory plan", _memory_plan, lambda c, b: {f"07-memory_plan.{b.kind}.txt": _arena_text(c, b)}, per_backend=True
    ),
    Stage("plan", _plan, lambda c, b: {"08-plan.txt": _plan_text(c)}),
    Stage("build", _build, lambda c, b: {f"09-build.{b.kind}.txt": _build_text(c, b)}, per_backend=True),
    Stage("packed form", _packed_form, applies=lambda c: c.packed),
    Stage(
        "reference cases",
        _reference_cases,
        lambda c, b: {"10-reference_cases.txt": _cases_text(c)},
        applies=lambda c: c.budget > 0 and c.front.oracle is not None,
    ),
)


# --------------------------------------------------------------------------- running them


def compile_model(c: Compilation, progress: Progress) -> Artifact:
    """Run every stage that applies to `c`, in order, reporting each to `progress`; the artifact."""
    c.backends = backends_for(c.target)
    try:
        for stage, backend in runs(c):
            name = stage.name if backend is None else f"{stage.name} ({backend.kind})"
            with _reported(progress, name, internal=stage.run is not _front_end):
                stage.run(c, backend, progress)  # type: ignore[arg-type]
            if c.options.dump_dir is not None:
                c.options.dump_dir.mkdir(parents=True, exist_ok=True)
                for file, text in stage.dump(c, backend).items():  # type: ignore[arg-type]
                    (c.options.dump_dir / file).write_text(text)
        return _artifact(c)
    finally:
        while c.closers:
            c.closers.pop().close()


def runs(c: Compilation) -> list[tuple[Stage, Backend | None]]:
    """The stage runs of `c`, in order. Consecutive per-backend stages run as a group for one backend
    after the other (fusion, lowering and memory plan of the first backend, then of the next: the
    shape program's registers are allotted in that order)."""
    backends = c.backends or backends_for(c.target)
    out: list[tuple[Stage, Backend | None]] = []
    group: list[Stage] = []
    for stage in [s for s in STAGES if s.applies(c)] + [None]:
        if stage is not None and stage.per_backend:
            group.append(stage)
            continue
        out += [(g, b) for b in backends for g in group]
        group = []
        if stage is not None:
            out.append((stage, None))
    return out


@contextlib.contextmanager
def _reported(progress: Progress, name: str, internal: bool) -> Iterator[None]:
    """A stage, reported by `progress`; where `internal`, an exception that is not a BladepackError (an
    internal failure) leaves as a CompileError naming the stage (Note [No raw tracebacks])."""
    with progress.stage(name):
        try:
            yield
        except BladepackError:
            raise
        except Exception as e:
            if not internal:
                raise
            raise CompileError(
                f"internal error in optimize's stage '{name}': {type(e).__name__}: {e} "
                "(a bladepack bug: please report it with the model; the cause is chained below)"
            ) from e


def _program(c: Compilation) -> Program:
    assert c.program is not None
    return c.program


def _artifact(c: Compilation) -> Artifact:
    assert c.artifact is not None
    return c.artifact


def _producer(frontend: str) -> dict[str, str]:
    """Versions of what produced the artifact: bladepack, the front end's framework, numpy, Python."""
    import platform

    from bladepack.version import __version__

    if frontend == "onnx":
        import onnx

        framework = {"onnx": onnx.__version__}
    else:
        import torch

        framework = {"torch": torch.__version__.split("+")[0]}
    return {"bladepack": __version__, **framework, "numpy": np.__version__, "python": platform.python_version()}


# --------------------------------------------------------------------------- what each stage dumps


def _ir(c: Compilation) -> str:
    from bladepack.ir import print_graph

    p = _program(c)
    return print_graph(p.graph, p.shape_env, with_loc=True)


def _guards_text(c: Compilation) -> str:
    assert c.builder is not None
    return c.builder.b.program().text()


def _fusion_text(c: Compilation, b: Backend) -> str:
    return c.lowerers[b.kind].plan.text(_program(c).graph)


def _lowering_dump(c: Compilation, b: Backend) -> dict[str, str]:
    from bladepack.lowering.lower_native import gemm_dtypes

    low = c.lowerers[b.kind]
    launches = "\n".join(f"{k:4d} {launch}" for k, launch in enumerate(low.launches))
    return {
        f"06-lowering.{b.kind}.{b.source_suffix}": b.source(low.kernels, gemm_dtypes(low.launches)),
        f"06-lowering.{b.kind}.launches.txt": launches + "\n",
    }


def _arena_text(c: Compilation, b: Backend) -> str:
    assert c.builder is not None
    plan = c.builder.natives[b.kind].plan
    lines = [f"arena: {plan.arena_bytes_expr} bytes, {plan.arena_slots} slots"]
    lines += [f"  %{buf.id} {buf.dtype}{list(buf.shape)} at {buf.offset}" for buf in plan.buffers]
    return "\n".join(lines) + "\n"


def _plan_text(c: Compilation) -> str:
    from bladepack.inspect import inspect_text, manifest_summary

    manifest, _ = _artifact(c)._parts()
    return inspect_text(manifest_summary(manifest))


def _build_text(c: Compilation, b: Backend) -> str:
    built = c.built.get(b.kind, Built())
    lines = [f"{k}: {v}" for k, v in sorted(built.producer.items())]
    for name, value in built.fields.items():
        items = value.items() if isinstance(value, dict) else [(name, value)] if isinstance(value, bytes) else []
        if isinstance(value, list):  # (ISA level, CPU flags, bytes) per kernel library
            items = [(str(row[0]), row[-1]) for row in value]
        lines += [
            f"{name} {key}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}" for key, data in items
        ]
    return "\n".join(lines) + "\n"


def _cases_text(c: Compilation) -> str:
    art = _artifact(c)
    if art.reference_cases is None:
        return "no reference cases\n"
    record, blobs = art.reference_cases
    lines = [
        f"oracle: {record.get('oracle')}, {len(record.get('cases', []))} cases, {sum(map(len, blobs.values()))} bytes"
    ]
    lines += [f"  case {k}: dims {case.get('dims')}" for k, case in enumerate(record.get("cases", []))]
    return "\n".join(lines) + "\n"
