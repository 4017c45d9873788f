"""The knobs: every setting bladepack takes from the environment, read in one place. Loader-safe.

In: the environment, read only by the `from_env` constructors, which the public entry points call once
(`optimize`, `extend`, `load`, the CLI, the serving entry points) when the caller passes no options.
Out: `CompileOptions` (optimize and its toolchains), `LoaderOptions` (a loaded module), `ServeOptions`
(bladepack serve), each a frozen dataclass passed down explicitly, and `KNOBS`, the table of every
variable, which docs/configuration.md is generated from (scripts/generate.py). Nothing else in
bladepack reads the environment (tests/test_architecture.py checks it), so two models built in one
process with different options never see each other's.

    bladepack.optimize(model, samples, options=CompileOptions.from_env(dense_layers=False))
    bladepack.load("m.bpk", options=LoaderOptions.from_env(num_threads=4))
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

Environ = Mapping[str, str]


def _default_cache() -> Path:
    return Path.home() / ".cache" / "bladepack"


# --------------------------------------------------------------------------- parsers: (variable, raw) -> value


def _on(name: str, raw: str | None) -> bool:
    """On unless the variable says 0 / false / no."""
    return (raw or "1") not in ("0", "false", "no")


def _flag(name: str, raw: str | None) -> bool:
    """Off unless the variable is 1."""
    return raw == "1"


def _text(name: str, raw: str | None) -> str | None:
    return raw or None


def _path(name: str, raw: str | None) -> Path | None:
    return Path(raw) if raw else None


def _cache(name: str, raw: str | None) -> Path:
    return Path(raw) if raw else _default_cache()


def _level(name: str, raw: str | None) -> str:
    return (raw or "").upper()  # "": leave the logger as the program set it


def _count(name: str, raw: str | None) -> int:
    """A count of at least 0 (0 when unset)."""
    if not raw:
        return 0
    if not raw.isdigit():
        raise ValueError(f"{name}={raw!r}: expected a whole number")
    return int(raw)


def _positive(default: int) -> Callable[[str, str | None], int]:
    def parse(name: str, raw: str | None) -> int:
        if raw is None or raw == "":
            return default
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{name}={raw!r}: expected a positive integer")
        return int(raw)

    return parse


def _choice(*allowed: str) -> Callable[[str, str | None], str]:
    """One of `allowed` (the first when unset)."""

    def parse(name: str, raw: str | None) -> str:
        value = raw or allowed[0]
        if value not in allowed:
            raise ValueError(f"{name}={raw!r}: expected one of {', '.join(allowed)}")
        return value

    return parse


@dataclass(frozen=True)
class Knob:
    """One environment variable: which options field it sets, how it is read, and what it means."""

    env: str
    group: str  # "compile", "loader" or "serve": the options class that holds it
    field: str
    parse: Callable[[str, str | None], Any]
    default: str  # the default, as docs/configuration.md shows it
    doc: str

    def read(self, environ: Environ) -> Any:
        return self.parse(self.env, environ.get(self.env))


_C, _L, _S = "compile", "loader", "serve"
KNOBS: tuple[Knob, ...] = (
    Knob("BLADEPACK_DUMP", _C, "dump_dir", _path, "unset", "write the program after each stage of optimize into this directory (docs/architecture.md \"The pipeline\")"),
    Knob("BLADEPACK_VERIFY", _C, "verify", _on, "1", "0 skips the IR verifier between graph passes"),
    Knob("BLADEPACK_CACHE_DIR", _C, "cache_dir", _cache, "~/.cache/bladepack", "the compiled-kernel cache (cpu/ libraries, cpu-units/ kernel objects and precompiled preludes, cuda/, cutlass/; by content hash)"),
    Knob("BLADEPACK_LOG", _C, "log_level", _level, "unset", "the `bladepack` logger's level; info / debug print each optimize stage and kernel compile to stderr (Note [Progress])"),
    Knob("BLADEPACK_PROGRESS", _C, "progress", _choice("auto", "1", "0"), "auto", "optimize's progress bar: auto (on a terminal, with tqdm), 1, 0"),
    Knob("BLADEPACK_QUIET", _C, "quiet", _flag, "0", "1: no line on stderr for an optimize stage that runs over 5 s (Note [Progress])"),
    Knob("BLADEPACK_NATIVE", _C, "native", _on, "1", "0 builds no CPU kernel library (the artifact runs on the reference executor)"),
    Knob("BLADEPACK_GEMM_CONFIGS", _C, "gemm_configs", _positive(4), "4", "at most this many aligned CUTLASS configs per GEMM (the SIMT fallback is extra)"),
    Knob("BLADEPACK_GEMM_TUNING", _C, "gemm_tuning", _choice("auto", "profile", "model"), "auto", "how CUTLASS configs are chosen: auto (profile where a CUDA device answers, else the cost model), profile (a device is required), model"),
    Knob("BLADEPACK_NVCC_JOBS", _C, "nvcc_jobs", _positive(2), "2", "nvcc processes at once (an sm_90a CUTLASS unit takes ~3.3 GB)"),
    Knob("BLADEPACK_CUTLASS_UNVERIFIED", _C, "cutlass_unverified", _flag, "0", "1: CUTLASS serves float32 / float64 GEMMs too (default: cuBLAS does; not verified on a GPU)"),
    Knob("BLADEPACK_SELF_CHECK", _C, "self_check", _choice("error", "warn"), "error", "a reference case the new artifact's CPU kernels fail: error (CompileError naming it), warn (keep the artifact, the failure in its notes; for debugging)"),
    Knob("BLADEPACK_DENSE_LAYERS", _C, "dense_layers", _on, "1", "0: CPU linear layers stay BLAS GEMMs with loop-kernel epilogues (Note [Dense layers]; for comparisons)"),
    Knob("BLADEPACK_WINOGRAD", _C, "winograd", _on, "1", "0: 3x3 convolutions of 16 channels and more run the direct kernels only, not Winograd's F(2x2, 3x3) (Note [Winograd convolutions], Note [Winograd at few channels]; for comparisons)"),
    Knob("BLADEPACK_HOPPER_GEMMS", _C, "hopper_gemms", _flag, "0", "1: GEMM profiling at optimize times the sm_90a kernels on compute capability 9.0 (the loader's switch of the same name dispatches them)"),
    Knob("CXX", _C, "cxx", _text, "g++, c++, clang++ on PATH", "the C++ compiler of the CPU kernel libraries"),
    Knob("NVCC", _C, "nvcc", _text, "CUDA_HOME/bin/nvcc, nvcc on PATH", "nvcc"),
    Knob("CUDA_HOME", _C, "cuda_home", _text, "unset", "where nvcc is looked for (bin/nvcc)"),
    Knob("BLADEPACK_CUDA_ARCHES", _C, "cuda_arches", _text, "all", "the CUDA images to build, comma-separated"),
    Knob("BLADEPACK_CPU_ISAS", _C, "cpu_isas", _text, "all", "the CPU ISA levels to build, comma-separated; host: this CPU's"),
    Knob("CUTLASS_PATH", _C, "cutlass_path", _text, "the nvidia-cutlass wheel's", "the CUTLASS checkout whose include/ to use"),
    Knob("BLADEPACK_CACHE_DIR", _L, "cache_dir", _cache, "~/.cache/bladepack", "where the loader keeps CPU kernel libraries by content hash (lib/)"),
    Knob("BLADEPACK_BLAS", _L, "blas", _text, "numpy's OpenBLAS, then the system's", "the BLAS library for CPU GEMMs; none: the kernel library's own loops"),
    Knob("BLADEPACK_CUBLAS", _L, "cublas", _text, "the nvidia wheels', the system's, CUDA_HOME/lib64", "the cuBLAS library"),
    Knob("BLADEPACK_CUBLASLT", _L, "cublaslt", _text, "the nvidia wheels', the system's, CUDA_HOME/lib64", "the cuBLASLt library (artifacts optimized with gemm_library=\"cublaslt\")"),
    Knob("CUDA_HOME", _L, "cuda_home", _text, "unset", "where cuBLAS and cuBLASLt are looked for last (lib64)"),
    Knob("BLADEPACK_CPU_ISA", _L, "cpu_isa", _text, "the highest level this CPU runs", "the CPU kernel library to run, by ISA level (x86-64, x86-64-v3, ...; it must run on this CPU): for comparing levels on one machine"),
    Knob("BLADEPACK_NUM_THREADS", _L, "num_threads", _count, "0 (every core this process may run on)", "CPU kernel threads"),
    Knob("BLADEPACK_SHAPE_CACHE", _L, "shape_cache", _positive(4096), "4096", "input-shape signatures a loaded module keeps prepared (as the C++ runtime)"),
    Knob("BLADEPACK_CUDA_GRAPHS", _L, "cuda_graphs", _positive(64), "64", "CUDA graphs kept per stream (Note [CUDA graphs])"),
    Knob("BLADEPACK_HOPPER_GEMMS", _L, "hopper_gemms", _flag, "0", "1: dispatch an artifact's sm_90a CUTLASS kernels on compute capability 9.0 (off until their epilogues and speed are measured; Note [Hopper GEMMs])"),
    Knob("BLADEPACK_CUDA_STRICT_ERRORS", _L, "cuda_strict_errors", _flag, "0", "1: a CUDA call whose kernels check indices waits for them and raises its own error (else an index error is raised at the stream's next call, synchronize() or close(): Note [Device errors])"),
    Knob("BLADEPACK_TRITONSERVER", _S, "tritonserver", _text, "tritonserver on PATH, then the nvidia-pytriton wheel's", "the tritonserver binary `bladepack serve` starts"),
    Knob("BLADEPACK_TRITON_BACKEND", _S, "cpp_backend", _text, "unset", "libtriton_bladepack.so, the C++ backend `serve --backend cpp` links into Triton"),
)  # fmt: skip

T = TypeVar("T")


def _from_env(cls: type[T], group: str, environ: Environ | None, changes: dict[str, Any]) -> T:
    env = os.environ if environ is None else environ
    values = {k.field: k.read(env) for k in KNOBS if k.group == group}
    return cls(**{**values, **changes})


def _paths(options: object, *fields: str) -> None:
    """A directory given as a string (`cache_dir="/tmp/cache"`) is held as a Path, `~` expanded."""
    for name in fields:
        value = getattr(options, name)
        if isinstance(value, (str, os.PathLike)):
            object.__setattr__(options, name, Path(value).expanduser())


@dataclass(frozen=True)
class CompileOptions:
    """How `optimize` builds (KNOBS names each field's variable). `from_env(**changes)`: the
    environment's settings, with some changed."""

    dump_dir: Path | None = None
    verify: bool = True
    cache_dir: Path = dataclasses.field(default_factory=_default_cache)
    log_level: str = ""
    progress: str = "auto"
    quiet: bool = False
    native: bool = True
    gemm_configs: int = 4
    gemm_tuning: str = "auto"
    nvcc_jobs: int = 2
    cutlass_unverified: bool = False
    dense_layers: bool = True
    winograd: bool = True
    self_check: str = "error"
    hopper_gemms: bool = False
    # toolchains: None searches the usual places
    cxx: str | None = None
    nvcc: str | None = None
    cuda_home: str | None = None
    cuda_arches: str | None = None
    cpu_isas: str | None = None
    cutlass_path: str | None = None

    def __post_init__(self) -> None:
        _paths(self, "cache_dir", "dump_dir")

    @classmethod
    def from_env(cls, environ: Environ | None = None, **changes: Any) -> CompileOptions:
        return _from_env(cls, _C, environ, changes)


@dataclass(frozen=True)
class LoaderOptions:
    """How a loaded module runs; `num_threads` 0 means every core this process may run on."""

    cache_dir: Path = dataclasses.field(default_factory=_default_cache)
    blas: str | None = None
    cublas: str | None = None
    cublaslt: str | None = None
    cuda_home: str | None = None
    cpu_isa: str | None = None
    num_threads: int = 0
    shape_cache: int = 4096
    cuda_graphs: int = 64
    hopper_gemms: bool = False
    cuda_strict_errors: bool = False

    def __post_init__(self) -> None:
        _paths(self, "cache_dir")

    @classmethod
    def from_env(cls, environ: Environ | None = None, **changes: Any) -> LoaderOptions:
        return _from_env(cls, _L, environ, changes)


@dataclass(frozen=True)
class ServeOptions:
    """Where `bladepack serve` finds Triton Inference Server (None: look on PATH, then in the wheel)."""

    tritonserver: str | None = None
    cpp_backend: str | None = None  # libtriton_bladepack.so

    @classmethod
    def from_env(cls, environ: Environ | None = None, **changes: Any) -> ServeOptions:
        return _from_env(cls, _S, environ, changes)


def child_environment(prepend: dict[str, list[str]]) -> dict[str, str]:
    """This process's environment for a server it starts, with paths put before each named variable's
    own (LD_LIBRARY_PATH, PYTHONPATH)."""
    env = dict(os.environ)
    for name, paths in prepend.items():
        env[name] = os.pathsep.join([*paths, *([env[name]] if env.get(name) else [])])
    return env


def knob_page() -> str:
    """docs/configuration.md: every knob, by the options class that holds it."""
    titles = {
        _C: "Compiling (`CompileOptions`: `optimize`, `extend`)",
        _L: "Loading (`LoaderOptions`: `load`, the CLI's run / verify, serving)",
        _S: "Serving (`ServeOptions`: `bladepack serve`)",
    }
    out = [
        "# Configuration",
        "",
        "<!-- Generated from KNOBS in bladepack/options.py by scripts/generate.py: do not edit. -->",
        "",
        "Every setting has an environment variable, read once where a public entry point starts (`optimize`,",
        "`extend`, `load`, the CLI, serving) when the caller passes no options object. In Python, pass the",
        "options instead: `optimize(..., options=CompileOptions.from_env(dense_layers=False))`,",
        "`load(..., options=LoaderOptions.from_env(num_threads=4))` — the environment's settings with some",
        "changed; two models built in one process with different options never see each other's.",
    ]
    for group, title in titles.items():
        out += ["", f"## {title}", "", "| variable | field | default | what it does |", "| --- | --- | --- | --- |"]
        out += [f"| `{k.env}` | `{k.field}` | {k.default} | {k.doc} |" for k in KNOBS if k.group == group]
    return "\n".join(out) + "\n"
