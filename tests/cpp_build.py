"""Builds cpp_runtime with CMake for the tests.

In: a variant name. Out: the build directory, with bpk-run, the library and the test programs. One
directory per variant under build/ is reused between runs (CMake rebuilds what changed); a file lock
keeps pytest-xdist workers from building the same directory at once.

Variants: "release" (the shipped configuration plus the test programs), "sanitize" (ASan + UBSan),
"fuzz" (clang, libFuzzer, checksums ignored so mutations reach the parser).
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "cpp_runtime"

VARIANTS: dict[str, list[str]] = {
    "release": ["-DCMAKE_BUILD_TYPE=Release", "-DBPK_BUILD_TESTS=ON"],
    "sanitize": [
        "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
        "-DBPK_BUILD_TESTS=ON",
        "-DBPK_SANITIZE=ON",
        "-DBPK_BUILD_TRITON_BACKEND=OFF",
    ],
    "fuzz": [
        "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
        "-DBPK_FUZZ=ON",
        "-DBPK_BUILD_TOOLS=OFF",
        "-DBPK_BUILD_TRITON_BACKEND=OFF",
        "-DCMAKE_C_COMPILER=clang-14",
        "-DCMAKE_CXX_COMPILER=clang++-14",
    ],
}


class BuildError(RuntimeError):
    pass


def build(variant: str) -> Path:
    out = ROOT / "build" / f"cpp-{variant}"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".cpp-{variant}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "CMakeCache.txt").exists():
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            _run(["cmake", "-S", str(SOURCE), "-B", str(out), *gen, *VARIANTS[variant]], variant)
        _run(["cmake", "--build", str(out), "-j", "2"], variant)
    return out


def _run(cmd: list[str], variant: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise BuildError(f"cpp_runtime ({variant}): {' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
