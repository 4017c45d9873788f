"""Builds cpp_runtime with CMake for the tests.

In: a variant name. Out: the build directory, with bpk-run, the library and the test programs.

Note [C++ builds by content]: a build is kept in the kernel cache (BLADEPACK_CACHE_DIR/cpp-runtime/)
under a key of every file of cpp_runtime/, the variant's CMake arguments and the versions of CMake and
the compilers, next to a copy of the sources it was configured from (so `cmake --install` of it works
after the checkout that built it is gone). A clean clone whose runtime sources match a build made
before reuses it instead of compiling the sanitizer and fuzzing builds again (2-3 minutes of a 2-core
CI run). System headers and libraries (msgpack-cxx, OpenSSL, OpenBLAS) are not in the key. Editing a
file of cpp_runtime/ makes a new key, and so a whole build; the three most recently used builds of each
variant are kept. A file lock keeps pytest-xdist workers from building the same directory at once.

Variants: "release" (the shipped configuration plus the test programs), "sanitize" (ASan + UBSan),
"fuzz" (clang, libFuzzer, checksums ignored so mutations reach the parser).
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import shutil
import subprocess
from pathlib import Path
from typing import IO

from bladepack.codegen.toolchain import tree_digest
from bladepack.options import CompileOptions

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
    key = _key(variant)
    root = CompileOptions.from_env().cache_dir / "cpp-runtime"
    home = root / f"{variant}-{key}"
    out = home / "build"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{variant}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (home / "complete").exists():
            shutil.rmtree(home, ignore_errors=True)  # a build that stopped half way
            shutil.copytree(SOURCE, home / "src")
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            _run(["cmake", "-S", str(home / "src"), "-B", str(out), *gen, *VARIANTS[variant]], variant)
            _run(["cmake", "--build", str(out), "-j", "2"], variant)
            (home / "complete").touch()
        (home / "used").touch()
    _prune(root, variant)
    return out


def _key(variant: str) -> str:
    parts = [tree_digest(SOURCE), *VARIANTS[variant], *_versions()]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]


@functools.cache
def _versions() -> tuple[str, ...]:
    """The first line of `--version` of CMake and of the compilers a variant may use."""
    lines = []
    for tool in ("cmake", "cc", "c++", "clang-14", "clang++-14"):
        found = shutil.which(tool)
        r = subprocess.run([found, "--version"], capture_output=True, text=True) if found else None
        lines.append(f"{tool}: {r.stdout.splitlines()[0] if r and r.stdout else 'absent'}")
    return tuple(lines)


def _prune(root: Path, variant: str, keep: int = 3) -> None:
    """Removes all but the `keep` most recently used complete builds of `variant`."""
    done = [d for d in root.glob(f"{variant}-*") if (d / "used").exists()]
    for old in sorted(done, key=lambda d: (d / "used").stat().st_mtime, reverse=True)[keep:]:
        with open(root / f".{old.name}.lock", "w") as lock:
            if _try_lock(lock):
                shutil.rmtree(old, ignore_errors=True)


def _try_lock(lock: IO[str]) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _run(cmd: list[str], variant: str) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise BuildError(f"cpp_runtime ({variant}): {' '.join(cmd)} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
