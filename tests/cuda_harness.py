"""Run CUDA artifacts without a GPU: the fake driver and cuBLAS, and the kernels emulated on the CPU.

`FakeGpu.run(artifact, cases)` saves the artifact, builds the host emulation of its CUDA source (the
same CUDA C nvcc compiled into its cubins, compiled by g++ with -DBPK_EMULATE; see
tests/fake_cuda/cuda_emulation.h), and in a fresh process loads it with `device="cuda"` against
tests/fake_cuda/fake_libcuda.c (first on LD_LIBRARY_PATH), fake_libcublas.c and fake_libcublaslt.c, calls it on every case
and returns the outputs and the fake's log (launch grids, blocks, shared memory, parameter bytes).
`FakeGpu.run_cpp(artifact, cases)` does the same through the C++ runtime: `bpk-run --device cuda`
(cpp_runtime, built by tests/cpp_build.py) per case, on the same fake driver, cuBLAS and emulation, with
the same return contract; its error texts are mapped to the Python exception names
(`_CPP_ERRORS`) so that both can be compared as they are.
What this proves: the whole CUDA path — plan, variant choice, geometry, parameter packing, the
generated kernels' arithmetic, GEMM argument mapping — on any machine. What it cannot: timing, and
behaviour that only real hardware has (memory ordering between warps, the driver's JIT).
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bladepack.options import CompileOptions

ROOT = Path(__file__).resolve().parent.parent
FAKE = ROOT / "tests" / "fake_cuda"


@functools.cache
def _gxx_version() -> str:
    return subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True).stdout


_SCRIPT = r"""
import pickle, sys, numpy as np, bladepack
from bladepack.errors import BladepackError
cases = pickle.load(open(sys.argv[2], "rb"))
m = bladepack.load(sys.argv[1], device=sys.argv[4], graphs=sys.argv[5] == "1")
results = []
for args in cases:
    try:
        for _ in range(int(sys.argv[6]) - 1):
            m(*args)
        out = m(*args)
        results.append([np.asarray(o) for o in (out if isinstance(out, tuple) else (out,))])
    except BladepackError as e:
        results.append(f"{type(e).__name__}: {e}")
pickle.dump((m.executor, results), open(sys.argv[3], "wb"))
"""


_PACKED = r"""
import pickle, sys, numpy as np, bladepack
from bladepack.errors import BladepackError
cases = pickle.load(open(sys.argv[2], "rb"))
m = bladepack.load(sys.argv[1], device=sys.argv[4], graphs=sys.argv[5] == "1")
results = []
for args, lengths in cases:
    try:
        results.append([np.asarray(o) for o in m.run_packed(args, lengths)])
    except BladepackError as e:
        results.append(f"{type(e).__name__}: {e}")
pickle.dump((m.executor, results), open(sys.argv[3], "wb"))
"""


_VERIFY = r"""
import pickle, sys, bladepack
m = bladepack.load(sys.argv[1], device=sys.argv[4])
pickle.dump((m.executor, m.verify()), open(sys.argv[3], "wb"))
"""


needs_nvcc = pytest.mark.skipif(
    (shutil.which("nvcc") is None and not os.environ.get("NVCC")) or shutil.which("g++") is None,
    reason="nvcc not found (CUTLASS GEMMs need it)",
)


def ptx_entries(src: Path, arch: str, names: list[str]) -> dict[str, str]:
    """nvcc's PTX of CUDA unit `src` for `arch` (sm_80, ...): the body of each named entry."""
    from bladepack.codegen.cuda_toolchain import FLAGS, find_nvcc

    ptx = src.with_suffix(f".{arch}.ptx")
    include = ["-I", str(ROOT / "bladepack" / "codegen")]
    r = subprocess.run(
        [find_nvcc(), *FLAGS, f"-arch={arch}", "-ptx", "-o", str(ptx), *include, "-x", "cu", str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    text = ptx.read_text()
    bodies = {}
    for name in names:
        body = text[text.index(f".entry {name}(") :]
        bodies[name] = body[: body.index("\n}\n")]
    return bodies


def ptxas_reports(src: Path, arch: str) -> dict[str, str]:
    """ptxas's resource report of each entry of CUDA unit `src` built for `arch`: "N bytes stack frame,
    N bytes spill stores, N bytes spill loads" (a spilled value would run from local memory)."""
    from bladepack.codegen.cuda_toolchain import FLAGS, find_nvcc

    include = ["-I", str(ROOT / "bladepack" / "codegen")]
    cubin = src.with_suffix(f".{arch}.cubin")
    r = subprocess.run(
        [find_nvcc(), *FLAGS, f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", str(cubin), *include, "-x", "cu"]
        + [str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    entries = re.findall(
        r"Compiling entry function '(\w+)'.*?\n.*?(\d+ bytes stack frame.*?spill loads)", r.stderr, re.S
    )
    return dict(entries)


def require_cutlass() -> None:
    """Skip unless CUTLASS GEMMs can be built here (the nvidia-cutlass headers and nvcc)."""
    pytest.importorskip("cutlass_library")
    if shutil.which("nvcc") is None and not os.environ.get("NVCC"):
        pytest.skip("nvcc not found")


# bpk-run's "bpk-run: <status>: <reason>" -> the Python loader's exception class for that reason
_CPP_ERRORS = {
    "input error": "InputError",
    "shape guard": "ShapeGuardError",
    "execution error": "ExecutionError",
    "bad index": "IndexRangeError",
    "format error": "BpkFormatError",
    "unsupported": "CudaUnavailable",
    "invalid argument": "InputError",
}
_DRIVER_FAILURE = re.compile(r"^(cu[A-Za-z0-9]+(\(.*?\))?|CUTLASS GEMM \S+:.*) failed: |^CUTLASS GEMM ")


def cpp_error_text(stderr: str) -> str:
    """bpk-run's error line in the Python loader's "ClassName: reason" form."""
    line = stderr.strip().splitlines()[-1] if stderr.strip() else "bpk-run: (no message)"
    status, _, reason = line.removeprefix("bpk-run: ").partition(": ")
    name = _CPP_ERRORS.get(status, status)
    if status == "execution error" and _DRIVER_FAILURE.match(reason):
        name = "CudaError"
    return f"{name}: {reason}"


def _image_hash(image: bytes) -> int:
    """FNV-1a 64 of a CUDA image as the fake driver's module load reads it (an ELF up to its last header
    table; a PTX text up to its NUL)."""
    if image[:4] == b"\x7fELF":
        phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
        image = image[: max(shoff + shentsize * shnum, phoff + phentsize * phnum)]
    else:
        image = image.split(b"\0", 1)[0]
    h = 1469598103934665603
    for b in image:
        h = ((h ^ b) * 1099511628211) & (1 << 64) - 1
    return h


class FakeGpu:
    def __init__(self, root: Path) -> None:
        self.root = root
        cc = shutil.which("cc") or shutil.which("gcc")
        if cc is None or shutil.which("g++") is None:
            pytest.skip("no C/C++ compiler")
        if shutil.which("nvcc") is None and not os.environ.get("NVCC"):
            pytest.skip("nvcc not found")
        pytest.importorskip("cuda.bindings.driver")
        subprocess.run(
            [
                cc,
                "-shared",
                "-fPIC",
                "-O1",
                "-o",
                str(root / "libcuda.so.1"),
                str(FAKE / "fake_libcuda.c"),
                "-ldl",
                "-lpthread",
            ],
            check=True,
        )
        for lib, source in (("libcublas.so", "fake_libcublas.c"), ("libcublasLt.so", "fake_libcublaslt.c")):
            subprocess.run(
                [cc, "-shared", "-fPIC", "-O2", "-o", str(root / lib), str(FAKE / source), "-ldl", "-lm"], check=True
            )

    def emulation(self, source: str) -> Path:
        """The host build of a CUDA translation unit, kept by content (the source, the emulation header,
        the command and the compiler's version) in the kernel cache's cuda-emulation/, so test modules
        and runs that emulate the same kernels build them once."""
        cmd = ["g++", "-std=c++17", "-O1", "-U_FORTIFY_SOURCE", "-DBPK_EMULATE", f"-I{FAKE}", "-x", "c++"]
        key = hashlib.sha256(
            "\0".join([source, (FAKE / "cuda_emulation.h").read_text(), " ".join(cmd[1:]), _gxx_version()]).encode()
        ).hexdigest()[:24]
        cache = CompileOptions.from_env().cache_dir / "cuda-emulation"
        lib = cache / f"emu-{key}.so"
        if lib.exists():
            return lib
        cache.mkdir(parents=True, exist_ok=True)
        src = self.root / f"emu-{key}.cu"
        src.write_text(source)
        tmp = cache / f".{key}.{os.getpid()}.tmp"
        r = subprocess.run([*cmd, "-shared", "-fPIC", str(src), "-o", str(tmp)], capture_output=True, text=True)
        assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-4000:]}{r.stdout[-2000:]}"
        os.replace(tmp, lib)  # whole, whoever finishes first
        return lib

    def run(
        self,
        artifact: Any,
        cases: list[tuple[Any, ...]],
        device: str = "cuda",
        cc: str = "90",
        graphs: bool = True,
        calls: int = 1,
    ) -> tuple[str, list[Any], str]:
        """(executor, per case the output arrays or the error text, the fake's log). Each case is called
        `calls` times (the last call's results; with `graphs`, a signature's third call replays its CUDA
        graph: Note [CUDA graphs] in bladepack/loader/cuda_graphs.py)."""
        return self._launch(artifact, cases, device, cc, _SCRIPT, graphs, calls)

    def run_cpp(
        self,
        artifact: Any,
        cases: list[tuple[Any, ...]],
        device: str = "cuda",
        cc: str = "90",
        graphs: bool = True,
        calls: int = 3,
    ) -> tuple[str, list[Any], str]:
        """`run`'s contract through the C++ runtime: `bpk-run --device DEVICE` per case, each case called
        `calls` times in one process (the results are the last call's: with `graphs`, the third call
        of a signature replays its CUDA graph, Note [CUDA graphs] in cpp_runtime/src/native_cuda.h)."""
        from tests.cpp_build import build

        bpk_run = build("release") / "bpk-run"
        work = self.root / hashlib.sha256(os.urandom(8)).hexdigest()[:12]
        work.mkdir()
        bpk = work / "model.bpk"
        artifact.save(bpk)
        log = work / "cuda.log"
        env = {**self._env(artifact, log, cc)}

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(bpk_run), str(bpk), "--device", device, *args],
                capture_output=True,
                text=True,
                env=env,
                timeout=300,
            )

        head = run()
        if head.returncode:
            raise AssertionError(f"bpk-run could not load the model: {head.stderr.strip()}")
        executor = next(line for line in head.stdout.splitlines() if line.startswith("executor: "))[10:]
        from bladepack.artifact import format as bpk_format

        manifest = bpk_format.read(bpk, verify=False).manifest
        ins = [t["name"] for t in manifest["inputs"]]
        outs = [t["name"] for t in manifest["outputs"]]
        results: list[Any] = []
        for k, args in enumerate(cases):
            flags = []
            for name, a in zip(ins, args):
                f = work / f"case{k}-{name}.npy"
                np.save(f, np.asarray(a))
                flags += ["--input", f"{name}={f}"]
            out_dir = work / f"out{k}"
            out_dir.mkdir()
            extra = ["--repeat", str(calls - 1)] + ([] if graphs else ["--cuda-graphs", "-1"])
            r = run(*flags, "--output-dir", str(out_dir), *extra)
            if r.returncode == 0:
                results.append([np.load(out_dir / f"{name}.npy") for name in outs])
            elif r.returncode == 1:
                results.append(cpp_error_text(r.stderr))
            else:
                raise AssertionError(f"bpk-run exited {r.returncode}: {r.stderr[-4000:]}")
        return executor, results, log.read_text() if log.exists() else ""

    def _env(self, artifact: Any, log: Path, cc: str) -> dict[str, str]:
        """The fake driver's environment: the artifact's emulation, and where its packed form has CUDA
        images, a map from each of them to the packed unit's emulation (FAKE_CUDA_EMU_MAP)."""
        lines = []
        packed = getattr(artifact, "packed", None)
        if packed is not None and packed[1].cuda_images:
            emu = self.emulation(packed[1].sources.unit("cuda"))
            lines = [f"{_image_hash(image):016x} {emu}" for image in packed[1].cuda_images.values()]
        emu_map = log.with_name("emu.map")
        emu_map.write_text("".join(line + "\n" for line in lines))
        return {
            **os.environ,
            "LD_LIBRARY_PATH": str(self.root),
            "FAKE_CUDA_EMU": str(self.emulation(artifact.sources.unit("cuda"))),
            "FAKE_CUDA_EMU_MAP": str(emu_map),
            "FAKE_CUDA_LOG": str(log),
            "FAKE_CUDA_CC": cc,
            "BLADEPACK_CUBLAS": str(self.root / "libcublas.so"),
            "BLADEPACK_CUBLASLT": str(self.root / "libcublasLt.so"),
            "PYTHONPATH": str(ROOT),
        }

    def verify(self, artifact: Any, device: str = "cuda", cc: str = "90") -> tuple[str, dict[str, Any], str]:
        """(executor, `LoadedModule.verify()`'s report on the fake GPU, the fake's log)."""
        executor, report, log = self._launch(artifact, [], device, cc, _VERIFY, True, 1)
        return executor, report, log

    def run_packed(
        self, artifact: Any, cases: list[tuple[list[Any], list[int]]], device: str = "cuda", cc: str = "90"
    ) -> tuple[str, list[Any], str]:
        """`run`'s contract for `LoadedModule.run_packed`: each case is (inputs, lengths)."""
        return self._launch(artifact, cases, device, cc, _PACKED, True, 1)

    def _launch(
        self, artifact: Any, cases: Any, device: str, cc: str, script: str, graphs: bool, calls: int
    ) -> tuple[str, Any, str]:
        work = self.root / hashlib.sha256(os.urandom(8)).hexdigest()[:12]
        work.mkdir()
        bpk = work / "model.bpk"
        artifact.save(bpk)
        ins, outs, log = work / "in.pkl", work / "out.pkl", work / "cuda.log"
        ins.write_bytes(pickle.dumps(cases))
        env = self._env(artifact, log, cc)
        r = subprocess.run(
            [sys.executable, "-c", script, str(bpk), str(ins), str(outs), device, "1" if graphs else "0", str(calls)],
            capture_output=True,
            text=True,
            env=env,
        )
        assert r.returncode == 0, f"exit {r.returncode}: {r.stderr[-4000:]}{r.stdout[-2000:]}"
        executor, results = pickle.loads(outs.read_bytes())
        return executor, results, log.read_text() if log.exists() else ""
