"""The CUDA toolchain: nvcc builds one translation unit of kernels into a cubin per GPU architecture
plus PTX for newer GPUs. No GPU is needed.

In: CUDA C source (every kernel of a model in one unit: nvcc costs ~0.6 s per process, whatever the
size). Out: `{"sm_80": cubin, "sm_86": ..., "sm_89": ..., "sm_90": ..., "compute_90": PTX}` — the
names `loader.cuda_driver.choose_image` picks from — each cached under
<cache>/cuda/<sha256 of nvcc version, flags, target and source>. Compiles run two at a time unless
CompileOptions.nvcc_jobs (BLADEPACK_NVCC_JOBS) says otherwise (ptxas is memory-hungry);
CompileOptions.cuda_arches (BLADEPACK_CUDA_ARCHES=sm_90,compute_90) limits the targets (tests).
The target "sm_90a" names the Hopper-only CUTLASS GEMM kernels (Note [GEMM config space] in
library_ops/cutlass/configs.py): generated kernels build no sm_90a image (their sm_90 cubin runs there;
asked for alone, it builds sm_90), and it is among the default targets.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bladepack.codegen import c_render
from bladepack.codegen.cuda_emitter import CudaKernel
from bladepack.codegen.toolchain import ToolchainError, cached_build, tree_digest
from bladepack.target import CUBIN_ARCHES, HOPPER_GEMM_ARCH, PTX_ARCH

FLAGS = ("-std=c++17", "-O3", "--expt-relaxed-constexpr", "-DNDEBUG")


def prelude() -> str:
    return c_render.prelude("cuda_runtime.cuh")


def cuda_source(kernels: Sequence[CudaKernel]) -> str:
    """One translation unit: the prelude and every kernel of the model."""
    return "\n".join([prelude(), *(k.source for k in kernels)])


def find_nvcc(nvcc: str | None = None, cuda_home: str | None = None) -> str:
    """`nvcc` (CompileOptions.nvcc), else `cuda_home`/bin/nvcc, else nvcc on PATH."""
    for cand in (nvcc, os.path.join(cuda_home or "", "bin", "nvcc")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("nvcc")
    if found is None:
        raise ToolchainError("nvcc not found (set NVCC or CUDA_HOME, or put nvcc on PATH); CUDA kernels need it")
    return found


def nvcc_version(nvcc: str) -> str:
    r = subprocess.run([nvcc, "--version"], capture_output=True, text=True)
    if r.returncode != 0:
        raise ToolchainError(f"{nvcc} --version failed: {r.stderr.strip()[-400:]}")
    return r.stdout.strip().splitlines()[-1]


def targets(arches: Sequence[str] | None = None, configured: str | None = None) -> list[str]:
    """The images to build: `arches`, else `configured` (CompileOptions.cuda_arches: comma-separated),
    else every cubin architecture and the PTX. The Hopper GEMMs (sm_90a) only when named: Note [Hopper
    GEMMs] in library_ops/cutlass/emitter.py says why they are off by default."""
    every = [*CUBIN_ARCHES, PTX_ARCH, HOPPER_GEMM_ARCH]
    wanted = ",".join(arches) if arches else configured
    if not wanted:
        return [*CUBIN_ARCHES, PTX_ARCH]
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ToolchainError(f"BLADEPACK_CUDA_ARCHES names {unknown}; the CUDA targets are {every}")
    return names


def _target_flags(target: str) -> list[str]:
    if target.startswith("compute_"):
        return ["-ptx", f"-arch={target}"]
    return ["-cubin", f"-gencode=arch=compute_{target[3:]},code={target}"]


# Note [Include directories in keys]: an nvcc unit's cache key holds a digest of each -I directory's
# files instead of its path. The CUTLASS headers' path names the Python environment their wheel is in,
# so keyed by path a clean clone with an environment of its own (CI's) compiled every GEMM again; by
# content it finds the kernels another one built. Hashing the wheel's two directories (871 files,
# 27 MB) takes about 0.2 s, once per process.
@functools.cache
def _include_digest(directory: str) -> str:
    return tree_digest(Path(directory))


def nvcc_cached(nvcc: str, version: str, flags: Sequence[str], source: str, path_stem: Path, what: str) -> bytes:
    """nvcc `flags` on `source`, cached at `path_stem`/<sha256 of version, flags (each -I directory by
    its files: Note [Include directories in keys]), source>.<suffix of the stem's name>; ToolchainError
    with nvcc's message (naming `what`) when it fails."""
    keyed = [f"-I {_include_digest(f[2:])}" if f.startswith("-I") else f for f in flags]
    key = hashlib.sha256("\0".join([version, *keyed, source]).encode()).hexdigest()

    def build() -> bytes:
        with tempfile.TemporaryDirectory() as d:
            src, out = Path(d) / "unit.cu", Path(d) / "unit.out"
            src.write_text(source)
            r = subprocess.run([nvcc, *flags, str(src), "-o", str(out)], capture_output=True, text=True)
            if r.returncode != 0:
                raise ToolchainError(f"nvcc failed building {what}:\n{(r.stderr or r.stdout)[-4000:]}")
            return out.read_bytes()

    return cached_build(path_stem.parent, f"{key}.{path_stem.name}", build, f"nvcc builds ({what})")[0]


def _compile_one(nvcc: str, version: str, target: str, source: str, cache: Path) -> tuple[str, bytes]:
    flags = [*FLAGS, *_target_flags(target)]
    suffix = "ptx" if target.startswith("compute_") else "cubin"
    return target, nvcc_cached(nvcc, version, flags, source, cache / "cuda" / suffix, f"the {target} kernels")


def build_images(
    source: str,
    cache: Path,
    nvcc: str | None = None,
    arches: Sequence[str] | None = None,
    jobs: int = 2,
    configured: str | None = None,
) -> dict[str, bytes]:
    """Every target's image for `source` (from the cache where it is there), `jobs` nvcc at once."""
    nvcc = nvcc or find_nvcc()
    version = nvcc_version(nvcc)
    wanted = kernel_targets(arches, configured)
    with ThreadPoolExecutor(jobs) as pool:
        return dict(pool.map(lambda t: _compile_one(nvcc, version, t, source, cache), wanted))


def kernel_targets(arches: Sequence[str] | None = None, configured: str | None = None) -> list[str]:
    """The images of generated kernels among `targets(...)` (sm_90a alone asks for sm_90)."""
    wanted = targets(arches, configured)
    return [t for t in wanted if t != HOPPER_GEMM_ARCH] or ["sm_90"]


def hopper_gemms(arches: Sequence[str] | None = None, configured: str | None = None) -> bool:
    """Whether the targets include the Hopper-only GEMM kernels."""
    return HOPPER_GEMM_ARCH in targets(arches, configured)


def cubin_arch(image: bytes) -> str:
    """The architecture a cubin was built for ("sm_90"), read from its ELF header (e_flags bits 8-15)."""
    if image[:4] != b"\x7fELF" or len(image) < 0x34:
        raise ValueError("not a cubin (no ELF header)")
    flags = int.from_bytes(image[0x30:0x34], "little")
    return f"sm_{(flags >> 8) & 0xFF}"
