"""Environment knobs, read in one place. Loader-safe.

BLADEPACK_DUMP=dir      write the IR after each pass, the plan and the manifest (text) into dir
BLADEPACK_VERIFY=0      skip the IR verifier between passes (on by default)
BLADEPACK_CACHE_DIR     compiled-kernel cache (default ~/.cache/bladepack)
BLADEPACK_LOG=level     logging level for the `bladepack` logger (unset: as the program configures it,
                        else Python's WARNING; info / debug print
                        each optimize stage and kernel compile to stderr: Note [Progress] in progress.py)
BLADEPACK_PROGRESS      an optimize's progress bar: auto (on a terminal, with tqdm; the default), 1, 0
BLADEPACK_NATIVE=0      build no CPU kernel library (the artifact runs on the reference executor)
BLADEPACK_GEMM_CONFIGS=N  at most N aligned CUTLASS configs per GEMM (default 4; the SIMT fallback is extra)
BLADEPACK_GEMM_TUNING   how CUTLASS configs are chosen: auto (profile when a CUDA device answers, else the
                        cost model; the default), profile (a device is required), model (never profile)
BLADEPACK_NVCC_JOBS=N   nvcc processes at once (default 2; an sm_90a CUTLASS unit takes ~3.3 GB)
BLADEPACK_CUTLASS_UNVERIFIED=1  CUTLASS serves float32 / float64 GEMMs too (default: cuBLAS does; they are not
                        verified on a GPU, and float32 ones returned NaN on an H200: cutlass/configs.py)
BLADEPACK_DENSE_LAYERS=0  CPU linear layers stay BLAS GEMMs with loop-kernel epilogues (default: generated
                        dense kernels, Note [Dense layers] in passes/dense_layers.py; for comparisons)

Toolchains (compile side, `Toolchains`):
CXX                     the C++ compiler (else g++, c++, clang++ on PATH)
NVCC, CUDA_HOME         nvcc (else CUDA_HOME/bin/nvcc, else nvcc on PATH)
BLADEPACK_CUDA_ARCHES   the CUDA images to build, comma-separated (default: all)
BLADEPACK_CPU_ISAS      the CPU ISA levels to build, comma-separated, "host" for this CPU's (default: all)
CUTLASS_PATH            the CUTLASS checkout whose include/ to use (else the nvidia-cutlass wheel's)

Loader (`LoaderOptions`; read when a module loads, never needs the compile side):
BLADEPACK_CACHE_DIR     also where the loader keeps CPU kernel libraries by content hash (lib/)
BLADEPACK_BLAS          the BLAS library for CPU GEMMs ("none": the loader's own loops)
BLADEPACK_CUBLAS        the cuBLAS library (else the nvidia wheels', the system's, CUDA_HOME/lib64)
BLADEPACK_NUM_THREADS=N CPU kernel threads (default: the cores this process may run on)
BLADEPACK_SHAPE_CACHE=N input-shape signatures a loaded module keeps prepared (default 4096, as the C++ runtime)
BLADEPACK_HOPPER_GEMMS=1  dispatch an artifact's sm_90a CUTLASS kernels on compute capability 9.0 (default off
                        until their epilogues and speed are measured, Note [Hopper GEMMs]; the sm80-class
                        kernels run there instead)

Serving (`ServeOptions`; bladepack serve, serving/triton_server.py):
BLADEPACK_TRITONSERVER  the tritonserver binary (else tritonserver on PATH, else the nvidia-pytriton wheel's)
BLADEPACK_TRITON_BACKEND  libtriton_bladepack.so, the C++ backend `serve --backend cpp` links into Triton

No other module reads the environment (tests/test_architecture.py checks it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Options:
    dump_dir: Path | None
    verify: bool
    cache_dir: Path
    log_level: str
    native: bool
    gemm_configs: int = 4
    gemm_tuning: str = "auto"
    nvcc_jobs: int = 2
    progress: str = "auto"
    cutlass_unverified: bool = False
    dense_layers: bool = True

    @staticmethod
    def from_env() -> Options:
        dump = os.environ.get("BLADEPACK_DUMP")
        return Options(
            dump_dir=Path(dump) if dump else None,
            verify=os.environ.get("BLADEPACK_VERIFY", "1") not in ("0", "false", "no"),
            cache_dir=_cache_dir(),
            log_level=os.environ.get("BLADEPACK_LOG", "").upper(),  # "": leave the logger as the program set it
            native=os.environ.get("BLADEPACK_NATIVE", "1") not in ("0", "false", "no"),
            gemm_configs=_positive("BLADEPACK_GEMM_CONFIGS", 4),
            gemm_tuning=_choice("BLADEPACK_GEMM_TUNING", ("auto", "profile", "model")),
            nvcc_jobs=_positive("BLADEPACK_NVCC_JOBS", 2),
            progress=_choice("BLADEPACK_PROGRESS", ("auto", "1", "0")),
            cutlass_unverified=os.environ.get("BLADEPACK_CUTLASS_UNVERIFIED", "0") == "1",
            dense_layers=os.environ.get("BLADEPACK_DENSE_LAYERS", "1") not in ("0", "false", "no"),
        )


@dataclass(frozen=True)
class Toolchains:
    """Where the compilers and headers are; None: search the usual places."""

    cxx: str | None
    nvcc: str | None
    cuda_home: str | None
    cuda_arches: str | None
    cpu_isas: str | None
    cutlass_path: str | None

    @staticmethod
    def from_env() -> Toolchains:
        get = os.environ.get
        return Toolchains(
            cxx=get("CXX") or None,
            nvcc=get("NVCC") or None,
            cuda_home=get("CUDA_HOME") or None,
            cuda_arches=get("BLADEPACK_CUDA_ARCHES") or None,
            cpu_isas=get("BLADEPACK_CPU_ISAS") or None,
            cutlass_path=get("CUTLASS_PATH") or None,
        )


@dataclass(frozen=True)
class LoaderOptions:
    """The loader's knobs; `num_threads` 0 means every core this process may run on."""

    cache_dir: Path
    blas: str | None
    cublas: str | None
    cuda_home: str | None
    num_threads: int
    shape_cache: int = 4096
    cuda_graphs: int = 64  # CUDA graphs kept per stream (Note [CUDA graphs] in loader/cuda_graphs.py)
    hopper_gemms: bool = False  # dispatch sm_90a CUTLASS kernels (Note [Hopper GEMMs])

    @staticmethod
    def from_env() -> LoaderOptions:
        get = os.environ.get
        return LoaderOptions(
            cache_dir=_cache_dir(),
            blas=get("BLADEPACK_BLAS") or None,
            cublas=get("BLADEPACK_CUBLAS") or None,
            cuda_home=get("CUDA_HOME") or None,
            num_threads=int(get("BLADEPACK_NUM_THREADS", "0") or 0),
            shape_cache=_positive("BLADEPACK_SHAPE_CACHE", 4096),
            cuda_graphs=_positive("BLADEPACK_CUDA_GRAPHS", 64),
            hopper_gemms=get("BLADEPACK_HOPPER_GEMMS", "0") == "1",
        )


def _cache_dir() -> Path:
    return Path(os.environ.get("BLADEPACK_CACHE_DIR") or Path.home() / ".cache" / "bladepack")


def _choice(name: str, allowed: tuple[str, ...]) -> str:
    """The variable's value, one of `allowed` (the first when unset)."""
    raw = os.environ.get(name) or allowed[0]
    if raw not in allowed:
        raise ValueError(f"{name}={raw!r}: expected one of {', '.join(allowed)}")
    return raw


def _positive(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r}: expected a positive integer")
    return int(raw)


@dataclass(frozen=True)
class ServeOptions:
    """Where `bladepack serve` finds Triton Inference Server (None: look on PATH, then in the wheel)."""

    tritonserver: str | None
    cpp_backend: str | None  # libtriton_bladepack.so

    @staticmethod
    def from_env() -> ServeOptions:
        get = os.environ.get
        return ServeOptions(get("BLADEPACK_TRITONSERVER") or None, get("BLADEPACK_TRITON_BACKEND") or None)


def child_environment(prepend: dict[str, list[str]]) -> dict[str, str]:
    """This process's environment for a server it starts, with paths put before each named variable's
    own (LD_LIBRARY_PATH, PYTHONPATH)."""
    env = dict(os.environ)
    for name, paths in prepend.items():
        env[name] = os.pathsep.join([*paths, *([env[name]] if env.get(name) else [])])
    return env
