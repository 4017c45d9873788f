"""The host C++ toolchain: find a compiler, build one kernel library per ISA level, cache by content.

In: the full C++ source of a model's CPU library. Out: `CompiledLibrary` per ISA level (name, the CPU
features it needs, the shared-object bytes). Compiles run in parallel (bounded by the core count) and
are cached under BLADEPACK_CACHE_DIR/cpu/<sha256 of source, flags and compiler version>.so, an entry
used only when this user wrote it (Note [Cache ownership] in bladepack/private_files.py: the key is
predictable, so a file another user could plant would be packed, signed and run everywhere).

ISA levels (x86-64 psABI names): "x86-64" (baseline SSE2), "x86-64-v3" (AVX2, FMA, BMI2) and
"x86-64-v4" (AVX-512 F/BW/CD/DQ/VL), each built when the compiler accepts its -march. Other hosts build
one "generic" level. BLADEPACK_CPU_ISAS=a,b limits the levels built (the tests build the host's best).

Note [Self-contained libraries]: libraries link libstdc++ and libgcc statically, use no OpenMP (their
own small thread pool) and call BLAS only through a function pointer the loader hands in, so one
library runs in any process, with or without torch.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bladepack.cpu_features import cpu_flags
from bladepack.errors import CompileError
from bladepack.private_files import PrivateDir

BASE_FLAGS = [
    "-std=c++17",
    "-O3",
    "-shared",
    "-fPIC",
    "-pthread",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",
    "-fopenmp-simd",  # honours `#pragma omp simd` (vector reductions) without any OpenMP runtime
    "-fvisibility=hidden",
    "-static-libstdc++",
    "-static-libgcc",
    # Note [Unloading kernel libraries] (cpp_runtime/src/native_cpu.cpp): no symbol of the static
    # libstdc++ is exported and none is STB_GNU_UNIQUE, which would make dlclose a no-op (glibc never
    # unloads an object with unique symbols, so every load from memory would map another copy)
    "-Wl,--exclude-libs,ALL",
    "-fno-gnu-unique",
    "-Wno-unused-variable",
    "-Wno-unused-but-set-variable",
]


@dataclass(frozen=True)
class IsaLevel:
    name: str
    flags: tuple[str, ...]
    requires: tuple[str, ...]  # /proc/cpuinfo flags the loader checks


X86_LEVELS = (
    IsaLevel("x86-64", ("-march=x86-64", "-mtune=generic"), ()),
    IsaLevel("x86-64-v3", ("-march=x86-64-v3", "-mtune=haswell"), ("avx2", "fma", "bmi2")),
    IsaLevel(
        "x86-64-v4",
        ("-march=x86-64-v4", "-mtune=skylake-avx512", "-mprefer-vector-width=512"),
        ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
    ),
)
GENERIC = IsaLevel("generic", (), ())


class ToolchainError(RuntimeError):
    pass


@dataclass(frozen=True)
class CompiledLibrary:
    isa: IsaLevel
    data: bytes
    cached: bool


def find_compiler(preferred: str | None = None) -> str | None:
    """`preferred` (CompileOptions.cxx), else g++, c++, clang++ on PATH."""
    for cand in (preferred, "g++", "c++", "clang++"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


def compiler_version(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0] if out else "unknown"


def _accepts(cxx: str, flags: tuple[str, ...]) -> bool:
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "probe.cc"
        src.write_text("int bpk_probe(int x) { return x + 1; }\n")
        r = subprocess.run(
            [cxx, *flags, "-c", str(src), "-o", str(Path(d) / "probe.o")], capture_output=True, timeout=60
        )
        return r.returncode == 0


def isa_levels(cxx: str, wanted: str | None = None) -> list[IsaLevel]:
    """The levels this compiler builds, limited to `wanted` (CompileOptions.cpu_isas: comma-separated
    names, "host" for this CPU's, "all" for every one) when given."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return [GENERIC]
    levels = [lv for lv in X86_LEVELS if _accepts(cxx, lv.flags)]
    if wanted:
        names = {w.strip() for w in wanted.split(",") if w.strip()}
        if "all" in names:
            names = (names - {"all"}) | {lv.name for lv in levels}
        if "host" in names:
            host = host_level(levels)
            names = (names - {"host"}) | ({host.name} if host else set())
        unknown = names - {lv.name for lv in levels}
        if unknown:
            raise CompileError(
                f"cpu_isas (BLADEPACK_CPU_ISAS) names {', '.join(sorted(unknown))}; allowed: all, host and the "
                f"levels this compiler builds: {', '.join(lv.name for lv in levels)}"
            )
        levels = [lv for lv in levels if lv.name in names]
    return levels or [GENERIC]


def host_level(levels: list[IsaLevel]) -> IsaLevel | None:
    have = cpu_flags()
    ok = [lv for lv in levels if set(lv.requires) <= have]
    return ok[-1] if ok else None


def _compile_one(cxx: str, version: str, isa: IsaLevel, source: str, cache: Path) -> CompiledLibrary:
    flags = [*BASE_FLAGS, *isa.flags]
    key = hashlib.sha256("\0".join([version, *flags, source]).encode()).hexdigest()

    def build() -> bytes:
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "kernels.cc"
            src.write_text(source)
            out = Path(d) / "kernels.so"
            r = subprocess.run([cxx, *flags, str(src), "-o", str(out)], capture_output=True, text=True)
            if r.returncode != 0:
                raise ToolchainError(f"{cxx} failed building the {isa.name} kernel library:\n{r.stderr[-4000:]}")
            return out.read_bytes()

    data, cached = cached_build(cache / "cpu", f"{key}.so", build, "CPU kernel libraries")
    return CompiledLibrary(isa, data, cached)


def cached_build(directory: Path, name: str, build: Callable[[], bytes], what: str) -> tuple[bytes, bool]:
    """(entry `name` of the build cache `directory`, True) when it is there and this user's own (Note
    [Cache ownership]), else (`build()`, False), stored for next time when the directory is private
    (written under a fresh name and renamed, so concurrent builders never see a partial entry)."""
    cache = PrivateDir.open(directory, what)
    if cache is None:
        return build(), False
    with cache:
        held = cache.read(name)
        if held is not None:
            return held, True
        data = build()
        cache.write(name, data)
        return data, False


def build_libraries(
    source: str,
    cache: Path,
    cxx: str,
    isas: str | None = None,
    on_done: Callable[[str], None] | None = None,
) -> list[CompiledLibrary]:
    """One library per ISA level (`isas` as `isa_levels` takes it), compiled in parallel (or taken
    from the cache); `on_done` hears of each as it finishes (Note [Progress] in bladepack/progress.py)."""
    version = compiler_version(cxx)
    levels = isa_levels(cxx, isas)
    workers = max(1, min(len(levels), os.cpu_count() or 1))

    def one(lv: IsaLevel) -> CompiledLibrary:
        start = time.perf_counter()
        lib = _compile_one(cxx, version, lv, source, cache)
        if on_done is not None:
            how = "from the cache" if lib.cached else f"compiled in {time.perf_counter() - start:.1f} s"
            on_done(f"{lv.name} kernel library: {len(lib.data) // 1024} KiB, {how}")
        return lib

    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, levels))
