"""The native CPU executor: runs an artifact's generated kernel library in one call per input.

In: the manifest's `native_cpu` plan, the artifact (for the library sections) and the weight arrays.
Out: `NativeCpu`, which picks the library built for the best ISA level this CPU supports, loads it
from memory (memfd; no file is left behind), hands it a BLAS `cblas_?gemm`, and per distinct input
shape signature resolves every launch record into one flat int64 array (`Prepared`). A call then
fills a small pointer table (arena, inputs, outputs, weights) and makes one foreign call; reference
steps (ops without generated kernels) split the launch list into native segments around them.

BLAS: BLADEPACK_BLAS=path (a library exporting cblas_sgemm / cblas_dgemm) wins; else numpy's own
OpenBLAS (scipy_cblas_sgemm64_, ILP64); else a system libopenblas / libcblas / libblas; else (or with
BLADEPACK_BLAS=none) the library's portable blocked GEMM. BLADEPACK_NUM_THREADS sets the kernel thread count (default: the
CPUs this process may run on).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import platform
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bladepack.artifact.format import BpkFile
from bladepack.cpu_features import cpu_flags
from bladepack.dtypes import DType
from bladepack.errors import BladepackError, BpkFormatError
from bladepack.loader.launch_words import LaunchWords, Segment, resolve_word
from bladepack.loader.library_file import open_library
from bladepack.loader.native_prepare import entry_point
from bladepack.loader.plan_check import INT64_MAX
from bladepack.options import LoaderOptions

ABI_VERSION = 1
_ERR_INDEX = 1


class NativeUnavailable(BladepackError, RuntimeError):
    """The artifact's CPU library cannot run here (no matching ISA level, or it fails to load)."""


def _machine_is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def choose_library(libraries: Any, isa: str | None = None) -> dict[str, Any]:
    """The highest ISA level whose CPU features this machine has, or the level `isa` names (LoaderOptions.
    cpu_isa; it must run here); `libraries`: the manifest record, checked."""
    if not isinstance(libraries, list) or not all(
        isinstance(lib, dict)
        and isinstance(lib.get("isa"), str)
        and isinstance(lib.get("section"), str)
        and isinstance(lib.get("requires"), list)
        and all(isinstance(f, str) for f in lib["requires"])
        for lib in libraries
    ):
        raise BpkFormatError("malformed manifest: native_cpu.libraries must list {isa, requires, section} maps")
    have = cpu_flags()
    x86 = _machine_is_x86()
    fits: list[dict[str, Any]] = [
        lib
        for lib in libraries
        if (lib["isa"] == "generic" and not x86) or (lib["isa"] != "generic" and x86 and set(lib["requires"]) <= have)
    ]
    if not fits:
        built = ", ".join(lib["isa"] for lib in libraries) or "none"
        raise NativeUnavailable(f"the artifact's CPU kernels were built for {built}; none runs on this CPU")
    if isa is None:
        return fits[-1]
    for lib in fits:
        if lib["isa"] == isa:
            return lib
    why = "does not run on this CPU" if any(lib["isa"] == isa for lib in libraries) else "is not in the artifact"
    runs = ", ".join(lib["isa"] for lib in fits)
    raise NativeUnavailable(f"cpu_isa={isa!r}: that CPU kernel library {why}; choose one of {runs}")


@dataclass(frozen=True)
class Blas:
    sgemm: int
    dgemm: int
    ilp64: bool
    source: str
    set_threads_local: int | None  # openblas_set_num_threads_local, when the library has it


def _blas_candidates(env: str | None) -> Iterator[tuple[str, str, str, bool]]:
    """(path, sgemm symbol, dgemm symbol, ilp64) in the order of the module docstring. Lazy: the system
    search (ctypes.util.find_library runs ldconfig and the C compiler, ~10 ms) only when numpy's
    OpenBLAS is not there."""
    if env:
        yield env, "cblas_sgemm", "cblas_dgemm", False
    libs_dir = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(glob.glob(str(libs_dir / "libscipy_openblas64_*.so*"))):
        yield path, "scipy_cblas_sgemm64_", "scipy_cblas_dgemm64_", True
    for path in sorted(glob.glob(str(libs_dir / "libscipy_openblas_*.so*"))):
        yield path, "scipy_cblas_sgemm", "scipy_cblas_dgemm", False
    for lib in ("openblas", "cblas", "blas"):
        found = ctypes.util.find_library(lib)
        if found:
            yield found, "cblas_sgemm", "cblas_dgemm", False


def find_blas(env: str | None = None) -> Blas | None:
    """Function pointers of a cblas_sgemm / cblas_dgemm (see the module docstring for the order); `env`:
    LoaderOptions.blas (a library path, or "none")."""
    if env == "none":
        return None
    for path, s, d, ilp64 in _blas_candidates(env):
        try:
            handle = ctypes.CDLL(path)
            sg = ctypes.cast(getattr(handle, s), ctypes.c_void_p).value
            dg = ctypes.cast(getattr(handle, d), ctypes.c_void_p).value
        except (OSError, AttributeError):
            continue
        if sg and dg:
            handle = _KEEP.setdefault(path, handle)  # one handle per library, however many loads
            local = None
            for name in ("openblas_set_num_threads_local", "scipy_openblas_set_num_threads_local64_"):
                if hasattr(handle, name):
                    local = ctypes.cast(getattr(handle, name), ctypes.c_void_p).value
                    break
            return Blas(sg, dg, ilp64, path, local)
    return None


ARENA_KEEP = 64 << 20  # Note [Arena high-water mark]


def arena_fits(held: int, nbytes: int) -> bool:
    """Whether a thread's arena of `held` bytes serves a call needing `nbytes` (Note [Arena high-water
    mark]): large enough with its alignment slack, and not a huge one far above the need."""
    need = nbytes + 64
    return need <= held and (held <= ARENA_KEEP or held <= 4 * need)


_KEEP: dict[str, ctypes.CDLL] = {}  # BLAS handles stay loaded for the process (their pointers are shared)


@dataclass(frozen=True)
class Prepared:
    segments: tuple[Segment, ...]
    arena_bytes: int
    registers: tuple[int, ...]
    plan_buffers: dict[int, dict[str, Any]]  # the plan's arena buffers by value id

    def buffer(self, vid: int) -> tuple[int, tuple[int, ...], np.dtype]:
        """Arena value `vid` at this signature: its byte offset, shape and storage dtype (only reference
        steps and outputs the plan leaves in the arena ask)."""
        b = self.plan_buffers[vid]
        regs = self.registers
        shape = tuple(resolve_word(d, regs) for d in b["shape"])
        return resolve_word(b["offset"], regs), shape, DType(b["dtype"]).storage_numpy()


def _check_features(lib: ctypes.CDLL, isa: str) -> None:
    """Note [Library CPU features]: NativeUnavailable when the library uses an instruction-set feature
    this CPU lacks (a manifest's `requires` may say otherwise; the library's own list decides)."""
    try:
        text = ctypes.c_char_p.in_dll(lib, "bpk_cpu_features").value
    except ValueError:  # libraries from before the list: the manifest's `requires` chose it
        return
    have = cpu_flags()
    missing = [f for f in (text or b"").decode().split() if f not in have]
    if missing:
        raise NativeUnavailable(f"the {isa} CPU kernel library uses {', '.join(missing)}, which this CPU lacks")


class NativeCpu:
    def __init__(
        self, bpk: BpkFile, native: dict[str, Any], weights: Sequence[np.ndarray], options: LoaderOptions
    ) -> None:
        """`weights`: the weight arrays in manifest order (their slots follow the outputs'); `options`:
        the library cache, the BLAS and the thread count."""
        self.plan = native
        if native.get("abi") != ABI_VERSION:
            raise BpkFormatError(f"{bpk.source}: native CPU plan ABI {native.get('abi')} is not {ABI_VERSION}")
        lib_row = choose_library(native.get("libraries"), options.cpu_isa)  # its shape is checked there
        self.isa = lib_row["isa"]
        try:
            self.lib = open_library(
                bpk.section(lib_row["section"]),
                bpk.section_digest(lib_row["section"]),
                f"{bpk.source}: the {self.isa} CPU kernel library",
                options.cache_dir,
            )
        except OSError as e:
            raise NativeUnavailable(f"the {self.isa} CPU kernel library failed to load: {e}") from None
        lib = self.lib
        _check_features(lib, self.isa)
        lib.bpk_abi_version.restype = ctypes.c_int
        if lib.bpk_abi_version() != ABI_VERSION:
            raise NativeUnavailable("the CPU kernel library has a different ABI version")
        lib.bpk_ctx_create.restype = ctypes.c_void_p
        lib.bpk_ctx_create.argtypes = [ctypes.c_int]
        lib.bpk_ctx_destroy.argtypes = [ctypes.c_void_p]
        lib.bpk_ctx_set_blas.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_void_p,
        ]
        lib.bpk_num_functions.restype = ctypes.c_int64
        lib.bpk_run.restype = ctypes.c_int64
        lib.bpk_run.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_int64,
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]
        nfn = lib.bpk_num_functions()
        threads = options.num_threads or len(os.sched_getaffinity(0))
        self.threads = threads
        ctx = lib.bpk_ctx_create(threads)
        if not ctx:
            raise NativeUnavailable("the CPU kernel library could not start its thread pool")
        self._ctx = ctypes.c_void_p(ctx)
        self._destroy: Callable[[Any], None] = lib.bpk_ctx_destroy
        self.blas = find_blas(options.blas)
        if self.blas is not None:
            lib.bpk_ctx_set_blas(
                self._ctx, self.blas.sgemm, self.blas.dgemm, int(self.blas.ilp64), self.blas.set_threads_local
            )
        self._run = lib.bpk_run
        self._check: Any = None  # Note [Kernel operand checks]; libraries from before it lack the entry point
        if hasattr(lib, "bpk_check"):
            lib.bpk_check.restype = ctypes.c_int64
            lib.bpk_check.argtypes = [
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_void_p,
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_void_p,
            ]
            self._check = lib.bpk_check
        self.prepare_entry = entry_point(lib)  # Note [Native preparation]; None in libraries from before it
        self.nfn = int(nfn)
        self._words: LaunchWords | None = None  # Note [Launch word template], at the first signature
        self._buffers: dict[int, dict[str, Any]] = {}
        self.weight_slots = np.array([w.__array_interface__["data"][0] for w in weights], dtype=np.uint64)
        self.arenas = threading.local()  # per thread: `arena`, the buffer and its aligned base (arena())

    def __del__(self) -> None:
        ctx = getattr(self, "_ctx", None)
        if ctx is not None and ctx.value:
            self._destroy(ctx)

    # -- per shape signature
    def launch_words(self, kernels: Sequence[dict[str, Any]]) -> LaunchWords:
        """The plan's word template (Note [Launch word template]), laid out at its first use."""
        if self._words is None:
            self._words = LaunchWords(self.plan["launches"], kernels, self.nfn)
            self._buffers = {int(b["id"]): b for b in self.plan["buffers"]}
        return self._words

    def prepare(self, regs: Sequence[int], kernels: Sequence[dict[str, Any]]) -> Prepared:
        """The launch list at one signature (Note [Launch word template]), after the plan checks."""
        words = self.launch_words(kernels)
        regs = tuple(regs)
        return Prepared(words.segments(regs), resolve_word(self.plan["arena_bytes"], regs), regs, self._buffers)

    def check_operands(self, prep: Prepared, slot_bytes: Sequence[int], writable: np.ndarray) -> np.ndarray | None:
        """Note [Kernel operand checks]: None when every native launch passes its kernel's check, else
        the status words [launch (in the plan), code, value, extra] of the first that fails. Per slot:
        the bytes its tensor holds and whether a launch may write it (uint8)."""
        if self._check is None or max(slot_bytes) > INT64_MAX:
            return None  # a slot of 2^63 bytes or more: the call's memory check refuses it before any launch
        sizes = np.array(slot_bytes, dtype=np.int64)
        status = np.zeros(4, dtype=np.int64)
        for seg in prep.segments:
            if seg.words is None:
                continue
            words = seg.words.ctypes.data
            if self._check(
                words, seg.words.size, sizes.ctypes.data, writable.ctypes.data, sizes.size, status.ctypes.data
            ):
                status[0] += seg.first_launch
                return status
        return None

    # -- per call
    def arena(self, nbytes: int) -> tuple[np.ndarray, int]:
        """This thread's arena (at least `nbytes`) and its 64-byte aligned base address. Note [Arena
        high-water mark]: the arena grows to the largest call's need and is kept for later calls, but
        one above ARENA_KEEP bytes and more than four times what the current call needs is released
        and made again at this call's size: one huge call does not pin its memory for the thread's life."""
        got: tuple[np.ndarray, int] | None = getattr(self.arenas, "arena", None)
        if got is None or not arena_fits(got[0].nbytes, nbytes):
            got = None  # the old buffer goes before the new one is made
            self.arenas.arena = None
            buf = np.empty(max(nbytes, 1) + 64, dtype=np.uint8)
            addr = int(buf.ctypes.data)
            got = (buf, addr + (-addr) % 64)
            self.arenas.arena = got
        return got

    @property
    def foreign_run(self) -> tuple[Any, Any]:
        """The library's bpk_run and the context it takes (Note [Fast path] calls it directly); its
        arguments: context, words, word count, slots, status, per-launch times or None."""
        return self._run, self._ctx

    def run_words(self, words: int, n_words: int, slots: int, status: int, times: int | None = None) -> int:
        """One foreign call over a prepared launch list (addresses of the words, slots, status and, when
        profiling, the per-launch time array)."""
        return int(self._run(self._ctx, words, n_words, slots, status, times))

    def run_segment(self, seg: Segment, slots: np.ndarray, status: np.ndarray, times: np.ndarray | None = None) -> int:
        """Run one native segment; with `times`, each launch's wall time (ns) lands at its index."""
        words = seg.words
        assert words is not None
        return self.run_words(
            words.ctypes.data,
            words.size,
            slots.ctypes.data,
            status.ctypes.data,
            None if times is None else times[seg.first_launch :].ctypes.data,
        )
