"""Note [Split kernel libraries] (codegen/toolchain.py) and Note [GEMM dtypes of a library]
(codegen/cpu_library.py): a CPU library is built from units (a precompiled prelude, one object per
distinct kernel code, the tables, the runtime), a second model reuses the objects of the kernels it
shares with the first, the one-unit text a dump shows still compiles, and the executor refuses GEMM
records of a dtype it was not built for."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import bladepack
from bladepack.codegen.cpu_library import library_source, split_units
from bladepack.codegen.toolchain import BASE_FLAGS, COMPILE_FLAGS, build_libraries, find_compiler, isa_levels

CXX = find_compiler()
pytestmark = pytest.mark.skipif(CXX is None, reason="no C++ compiler")


class _Block(torch.nn.Module):
    def __init__(self, head: bool) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 48)
        self.norm = torch.nn.LayerNorm(48)
        self.head = torch.nn.Linear(48, 8) if head else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.norm(torch.nn.functional.gelu(self.fc(x)))
        if self.head is None:
            return y
        out: torch.Tensor = torch.tanh(self.head(y)) + y[..., :8]
        return out


def _source(head: bool) -> str:
    torch.manual_seed(int(head))
    model = _Block(head).eval()
    art = bladepack.optimize(
        model, [(torch.randn(3, 32),), (torch.randn(5, 32),)], options=bladepack.CompileOptions(native=False)
    )
    return art.sources.unit("cpu")


def test_a_second_model_reuses_the_objects_of_the_kernels_it_shares(tmp_path: Path) -> None:
    first, second = _source(False), _source(True)
    a, b = split_units(first), split_units(second)
    assert a is not None and b is not None
    shared = set(a.kernels) & set(b.kernels)
    assert shared, "the dense layer and its GELU are the same code in both models"
    assert a.runtime == b.runtime  # neither plan has a GEMM record
    assert all("BPK_KERNEL void kernel_" in t for t in b.kernels)  # named by their code, not by kernel
    said: list[str] = []
    assert CXX is not None
    build_libraries(first, tmp_path, CXX, "host")
    (lib,) = build_libraries(second, tmp_path, CXX, "host", said.append)
    assert not lib.cached
    units = len(b.kernels) + 2  # the kernels, the tables and the runtime
    assert said == [said[0]] and f", {len(shared) + 1} of {units} units cached" in said[0], (said, len(shared))
    (again,) = build_libraries(second, tmp_path, CXX, "host")
    assert again.cached and again.data == lib.data


def test_the_prelude_is_a_precompiled_header_the_units_use(tmp_path: Path) -> None:
    """The cached header is a real PCH for the unit flags: a unit compiled beside it reads it (GCC's -H
    marks a used PCH with "!") instead of parsing the prelude."""
    assert CXX is not None
    if "g++" not in Path(CXX).name and "c++" not in Path(CXX).name:
        pytest.skip("GCC's precompiled headers")
    source = _source(False)
    build_libraries(source, tmp_path, CXX, "host")
    units = split_units(source)
    assert units is not None
    (pch,) = list((tmp_path / "cpu-units").glob("*.gch"))
    (level,) = isa_levels(CXX, "host")
    work = tmp_path / "work"
    work.mkdir()
    (work / "bpk_prelude.h").write_text("#define BPK_KERNEL\n" + units.header)
    (work / "bpk_prelude.h.gch").write_bytes(pch.read_bytes())
    (work / "unit.cc").write_text('#include "bpk_prelude.h"\n' + units.kernels[0])
    r = subprocess.run(
        [
            CXX,
            *COMPILE_FLAGS,
            *level.flags,
            "-H",
            "-Winvalid-pch",
            "-c",
            str(work / "unit.cc"),
            "-o",
            str(work / "u.o"),
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.splitlines()[0].startswith("! ") and "bpk_prelude.h.gch" in r.stderr.splitlines()[0], r.stderr[:500]


def test_the_prelude_parses_none_of_the_thread_library(tmp_path: Path) -> None:
    """Note [A slim prelude]: the header every unit loads holds no threads, locks or clocks (their
    headers made it 47 MB and 0.16 s to load per unit); the runtime unit, which defines the pool's
    threads, includes them itself."""
    assert CXX is not None
    units = split_units(_source(False))
    assert units is not None
    (tmp_path / "prelude.h").write_text("#define BPK_KERNEL\n" + units.header)
    (level,) = isa_levels(CXX, "host")
    r = subprocess.run(
        [CXX, *COMPILE_FLAGS, *level.flags, "-H", "-fsyntax-only", "-x", "c++", str(tmp_path / "prelude.h")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    parsed = {Path(line.split()[-1]).name for line in r.stderr.splitlines() if line.startswith(".")}
    assert parsed, r.stderr[:500]
    assert not parsed & {"thread", "mutex", "condition_variable", "chrono", "memory", "std_thread.h", "std_mutex.h"}
    assert "ThreadPool" in units.runtime and "#include <thread>" in units.runtime


def test_the_one_unit_text_compiles(tmp_path: Path) -> None:
    """What a dump shows (BLADEPACK_DUMP's 06-lowering.cpu.cc) is one translation unit that builds."""
    assert CXX is not None
    src = tmp_path / "kernels.cc"
    src.write_text(_source(True))
    (level,) = isa_levels(CXX, "host")
    r = subprocess.run(
        [CXX, *BASE_FLAGS, *level.flags, str(src), "-o", str(tmp_path / "k.so")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr[-2000:]


def _library(tmp_path: Path, dtypes: set[str]) -> ctypes.CDLL:
    assert CXX is not None
    (lib,) = build_libraries(library_source([], dtypes), tmp_path / "cache", CXX, "host")
    path = tmp_path / f"lib{len(dtypes)}.so"
    path.write_bytes(lib.data)
    return ctypes.CDLL(str(path))


def test_gemm_records_of_a_dtype_the_library_lacks_are_refused(tmp_path: Path) -> None:
    """Note [GEMM dtypes of a library]: a float32-only library checks a float32 record, refuses a
    float64 one in bpk_check (code 1, nothing run) and returns 2 from bpk_run for it."""
    lib = _library(tmp_path, {"float32"})
    i64p = ctypes.POINTER(ctypes.c_int64)
    lib.bpk_check.restype = lib.bpk_run.restype = ctypes.c_int64
    lib.bpk_ctx_create.restype = ctypes.c_void_p
    lib.bpk_check.argtypes = [i64p, ctypes.c_int64, i64p, ctypes.c_char_p, ctypes.c_int64, i64p]
    lib.bpk_run.argtypes = [ctypes.c_void_p, i64p, ctypes.c_int64, ctypes.c_void_p, i64p, i64p]
    lib.bpk_ctx_destroy.argtypes = [ctypes.c_void_p]
    status = np.zeros(4, np.int64)
    slot_bytes = np.full(4, 1 << 20, np.int64)
    for a, want in ((0, 0), (1, 1), (2, 1), (3, 1)):
        # one 1x1x1 GEMM record: A, B, D in slots 1-3 (its ints do not matter to the dtype check)
        words = np.array([2, a, 3, 0, 1, 0, 2, 0, 3, 0], np.int64)
        got = lib.bpk_check(
            words.ctypes.data_as(i64p),
            words.size,
            slot_bytes.ctypes.data_as(i64p),
            b"\x01" * 4,
            4,
            status.ctypes.data_as(i64p),
        )
        assert got == want, (a, got)
    ctx = lib.bpk_ctx_create(1)
    try:
        words = np.array([2, 1, 3, 0, 1, 0, 2, 0, 3, 0], np.int64)
        slots = (ctypes.c_void_p * 4)()
        got = lib.bpk_run(ctx, words.ctypes.data_as(i64p), words.size, slots, status.ctypes.data_as(i64p), None)
        assert got == 2 and status[0] == 0
    finally:
        lib.bpk_ctx_destroy(ctx)
