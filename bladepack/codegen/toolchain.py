"""The host C++ toolchain: find a compiler, build one kernel library per ISA level, cache by content.

In: the full C++ source of a model's CPU library. Out: `CompiledLibrary` per ISA level (name, the CPU
features it needs, the shared-object bytes), built from units (Note [Split kernel libraries]) whose
compiles run in parallel (bounded by the core count). Libraries are cached under
BLADEPACK_CACHE_DIR/cpu/<sha256 of source, flags and compiler version>.so, units' objects and the
precompiled prelude under cpu-units/, each entry used only when this user wrote it (Note [Cache ownership] in bladepack/private_files.py: the key is
predictable, so a file another user could plant would be packed, signed and run everywhere).

ISA levels (x86-64 psABI names): "x86-64" (baseline SSE2), "x86-64-v3" (AVX2, FMA, BMI2) and
"x86-64-v4" (AVX-512 F/BW/CD/DQ/VL), each built when the compiler accepts its -march. Other hosts build
one "generic" level. BLADEPACK_CPU_ISAS=a,b limits the levels built (the tests build the host's best).

Note [Self-contained libraries]: libraries link libstdc++ and libgcc statically, use no OpenMP (their
own small thread pool) and call BLAS only through a function pointer the loader hands in, so one
library runs in any process, with or without torch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from bladepack.codegen.cpu_library import LibraryUnits, split_units
from bladepack.cpu_features import cpu_flags
from bladepack.errors import CompileError
from bladepack.private_files import PrivateDir

COMPILE_FLAGS = [
    "-std=c++17",
    "-O3",
    "-fPIC",
    "-pthread",
    "-fno-math-errno",
    "-fno-trapping-math",
    "-ffp-contract=fast",
    "-fopenmp-simd",  # honours `#pragma omp simd` (vector reductions) without any OpenMP runtime
    "-fvisibility=hidden",
    "-fno-gnu-unique",
    "-Wno-unused-variable",
    "-Wno-unused-but-set-variable",
]
LINK_FLAGS = [
    "-shared",
    "-pthread",
    "-static-libstdc++",
    "-static-libgcc",
    # Note [Unloading kernel libraries] (cpp_runtime/src/native_cpu.cpp): no symbol of the static
    # libstdc++ is exported and none is STB_GNU_UNIQUE (-fno-gnu-unique above), which would make dlclose
    # a no-op (glibc never unloads an object with unique symbols, so every load from memory would map
    # another copy)
    "-Wl,--exclude-libs,ALL",
]
BASE_FLAGS = [*COMPILE_FLAGS, *LINK_FLAGS]


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


def _binary(cxx: str) -> tuple[str, int, int]:
    """Note [Compiler probes]: what a probe's answer depends on — the compiler's resolved path, its
    modification time and size. `--version` and whether each ISA level's flags compile are asked once
    per process and binary (they cost 25 ms a probe, three per optimize: half of a small model's
    optimize with a warm kernel cache); a compiler replaced on disk is asked again."""
    real = os.path.realpath(cxx)
    try:
        st = os.stat(real)
    except OSError:
        return (real, 0, 0)
    return (real, st.st_mtime_ns, st.st_size)


def compiler_version(cxx: str) -> str:
    return _version(cxx, _binary(cxx))


@functools.lru_cache(maxsize=64)
def _version(cxx: str, binary: tuple[str, int, int]) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.splitlines()[0] if out else "unknown"


def _accepts(cxx: str, flags: tuple[str, ...]) -> bool:
    return _probe(cxx, _binary(cxx), flags)


@functools.lru_cache(maxsize=64)
def _probe(cxx: str, binary: tuple[str, int, int], flags: tuple[str, ...]) -> bool:
    """Note [Compiler probes]: whether `cxx` (at `binary`) compiles a function with `flags`."""
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


def _run(cmd: list[str], what: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise ToolchainError(f"{cmd[0]} failed building {what}:\n{r.stderr[-4000:]}")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def tree_digest(directory: Path) -> str:
    """A digest of every file under `directory`: its path relative to it, its size and its contents
    (what a cache key holds instead of the directory's path: Note [Include directories in keys])."""
    h = hashlib.sha256()
    for f in sorted(p for p in directory.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(directory)}\0{f.stat().st_size}\0".encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _compile_one(cxx: str, version: str, isa: IsaLevel, source: str, cache: Path) -> CompiledLibrary:
    """The library as one translation unit (a source without `library_source`'s unit markers)."""
    flags = [*BASE_FLAGS, *isa.flags]

    def build() -> bytes:
        with tempfile.TemporaryDirectory() as d:
            src = Path(d) / "kernels.cc"
            src.write_text(source)
            out = Path(d) / "kernels.so"
            _run([cxx, *flags, str(src), "-o", str(out)], f"the {isa.name} kernel library")
            return out.read_bytes()

    data, cached = cached_build(cache / "cpu", f"{_digest(version, *flags, source)}.so", build, "CPU kernel libraries")
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
    """One library per ISA level (`isas` as `isa_levels` takes it), taken from the cache or built from
    units (Note [Split kernel libraries]); `on_done` hears of each as it finishes (Note [Progress] in
    bladepack/progress.py)."""
    version = compiler_version(cxx)
    levels = isa_levels(cxx, isas)
    workers = max(1, os.cpu_count() or 1)
    units = split_units(source)
    start = time.perf_counter()

    def report(lib: CompiledLibrary, how: str) -> CompiledLibrary:
        if on_done is not None:
            on_done(f"{lib.isa.name} kernel library: {len(lib.data) // 1024} KiB, {how}")
        return lib

    if units is None:
        with ThreadPoolExecutor(min(workers, len(levels))) as pool:
            libs = list(pool.map(lambda lv: _compile_one(cxx, version, lv, source, cache), levels))
        return [
            report(lib, "from the cache" if lib.cached else f"compiled in {time.perf_counter() - start:.1f} s")
            for lib in libs
        ]
    with tempfile.TemporaryDirectory() as d, ThreadPoolExecutor(workers) as pool:
        builds = [_SplitBuild(cxx, version, lv, units, source, cache, Path(d) / lv.name) for lv in levels]
        todo = [b for b in builds if not b.from_cache()]
        pchs = {b.isa.name: pool.submit(b.header) for b in todo}
        jobs = sorted(((len(text), b, k) for b in todo for k, text in enumerate(b.texts)), key=lambda j: -j[0])
        objects: dict[str, list[Future[bool]]] = {b.isa.name: [] for b in todo}
        for _, b, k in jobs:
            objects[b.isa.name].append(pool.submit(b.compile, k, pchs[b.isa.name]))
        for b in builds:
            if b not in todo:
                report(b.library(True), "from the cache")

        def link(b: _SplitBuild) -> CompiledLibrary:
            reused = sum(f.result() for f in objects[b.isa.name])
            b.link()
            how = f"compiled in {time.perf_counter() - start:.1f} s"
            return report(b.library(False), how + (f", {reused} of {len(b.texts)} units cached" if reused else ""))

        links = {b.isa.name: pool.submit(link, b) for b in todo}
        return [links[b.isa.name].result() if b.isa.name in links else b.library(True) for b in builds]


class _SplitBuild:
    """Note [Split kernel libraries]: a library built as one translation unit compiles every kernel in
    one compiler process (three ISA levels on two cores: one core idles for a third of the build), and
    again for every model that shares a kernel with an earlier one. Built from units instead
    (`cpu_library.split_units`): the prelude is compiled once per ISA level as a precompiled header
    (parsing it was 0.5-0.7 s of every unit; loading the header takes 0.18 s); each long kernel is an
    object of its own, cached by its text (the compiler's version and flags, the prelude and the
    unit: the functions are named by the code's digest, so the object does not depend on which kernel
    of which model it was), short ones share bundles; the main unit holds the tables and the runtime
    unit the executor and the C entry points (the same for every model with the same GEMM dtypes;
    Pool::run is defined there once, not inline in every unit). The library is linked from them.
    Units of every ISA level run in one pool, largest first. The whole library is still cached by its
    source: a warm build links nothing. bench/results/compile_time.md: a 2-layer BERT's build 23.3 s
    -> 13.6 s, ResNet-18's 22.5 s -> 16.3 s, EfficientNet-B0's 103.4 s -> 88.1 s (39 long kernels)."""

    HEADER = "bpk_prelude.h"

    def __init__(
        self, cxx: str, version: str, isa: IsaLevel, units: LibraryUnits, source: str, cache: Path, where: Path
    ) -> None:
        self.cxx, self.isa, self.cache, self.where = cxx, isa, cache, where
        self.flags = [*COMPILE_FLAGS, *isa.flags]
        self.key = _digest(version, *BASE_FLAGS, *isa.flags, source)
        self.header_text = "#define BPK_KERNEL\n" + units.header
        self.header_key = _digest(version, *self.flags, self.header_text)
        self.texts = [f'#include "{self.HEADER}"\n' + t for t in (*units.kernels, units.main, units.runtime)]
        self.data = b""

    def from_cache(self) -> bool:
        cache = PrivateDir.open(self.cache / "cpu", "CPU kernel libraries")
        if cache is None:
            return False
        with cache:
            self.data = cache.read(f"{self.key}.so") or b""
        return bool(self.data)

    def library(self, cached: bool) -> CompiledLibrary:
        return CompiledLibrary(self.isa, self.data, cached)

    def header(self) -> None:
        self.where.mkdir(parents=True)
        (self.where / self.HEADER).write_text(self.header_text)
        pch = self.where / (self.HEADER + ".gch")

        def build() -> bytes:
            _run(
                [self.cxx, *self.flags, "-x", "c++-header", str(self.where / self.HEADER), "-o", str(pch)],
                "its prelude",
            )
            return pch.read_bytes()

        data, cached = cached_build(self.cache / "cpu-units", f"{self.header_key}.gch", build, "CPU kernel units")
        if cached:
            pch.write_bytes(data)

    def compile(self, k: int, header: Future[None]) -> bool:
        """Unit k's object (True when it came from the cache)."""
        header.result()
        obj = self.where / f"unit{k}.o"

        def build() -> bytes:
            src = self.where / f"unit{k}.cc"
            src.write_text(self.texts[k])
            _run([self.cxx, *self.flags, "-c", str(src), "-o", str(obj)], f"the {self.isa.name} kernel library")
            return obj.read_bytes()

        data, cached = cached_build(
            self.cache / "cpu-units", f"{_digest(self.header_key, self.texts[k])}.o", build, "CPU kernel units"
        )
        if cached:
            obj.write_bytes(data)
        return cached

    def link(self) -> None:
        out = self.where / "kernels.so"
        units = [str(self.where / f"unit{k}.o") for k in range(len(self.texts))]
        _run([self.cxx, *self.flags, *LINK_FLAGS, *units, "-o", str(out)], f"the {self.isa.name} kernel library")
        self.data = out.read_bytes()
        cache = PrivateDir.open(self.cache / "cpu", "CPU kernel libraries")
        if cache is not None:
            with cache:
                cache.write(f"{self.key}.so", self.data)
