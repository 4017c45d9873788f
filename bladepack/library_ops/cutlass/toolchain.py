"""Build CUTLASS GEMM instances with nvcc: a fatbin per kernel and one host packer library.

In: `GemmInstance`s (library_ops/cutlass/emitter.py). Out: `{instance name: fatbin}` — sm_80 and sm_90
cubins plus compute_90 PTX for sm80 configs, one sm_90a cubin for sm90 ones (Note [GEMM config space]
in library_ops/cutlass/configs.py) — and the
packer shared library (Note [GEMM packer]; x86-64 Linux, libstdc++ and the CUDA runtime linked
statically, so it needs nothing at run time beyond glibc). Every output is cached under
<cache>/cutlass/<sha256 of nvcc version, flags and source> (the headers by content: Note [Include
directories in keys] in codegen/cuda_toolchain.py); a warm optimize compiles nothing. At most
`jobs` nvcc processes run at once (CompileOptions.nvcc_jobs, default 2: an sm_80 + sm_90 GEMM unit
takes ~7 s and ~0.7 GB, an sm_90a one ~30 s and ~3.3 GB).

The CUTLASS headers come from the `nvidia-cutlass` wheel (`cutlass_library.source_path`), or from a
CUTLASS checkout (CompileOptions.cutlass_path, CUTLASS_PATH); neither is needed where the artifact runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bladepack.codegen.cuda_toolchain import find_nvcc, nvcc_cached, nvcc_version
from bladepack.codegen.toolchain import ToolchainError
from bladepack.library_ops.cutlass.emitter import GemmInstance, kernel_source, packer_source

FLAGS = ("-std=c++17", "-O3", "--expt-relaxed-constexpr", "-DNDEBUG", "-w")
KERNEL_TARGETS = (
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90,code=[sm_90,compute_90]",
)
HOPPER_TARGETS = ("-gencode=arch=compute_90a,code=sm_90a",)  # runs on compute capability 9.0 only
PACKER_FLAGS = (
    "-shared",
    "-Xcompiler=-fPIC,-static-libstdc++,-static-libgcc",
    "-cudart=static",
    "-Xlinker=-Bsymbolic,--strip-all",
)


def cutlass_include(root: str | None = None) -> list[str]:
    """-I flags for the CUTLASS headers of `root` (CompileOptions.cutlass_path: a CUTLASS checkout),
    else of the nvidia-cutlass wheel; ToolchainError naming how to get them when absent."""
    if root:
        src = Path(root)
    else:
        try:
            import cutlass_library
        except ImportError as e:
            raise ToolchainError(
                "CUTLASS GEMMs need the CUTLASS headers: pip install nvidia-cutlass (or set CUTLASS_PATH to a "
                "CUTLASS checkout), or optimize with gemm_library='cublas'"
            ) from e
        src = Path(cutlass_library.source_path)
    inc = src / "include"
    if not (inc / "cutlass" / "cutlass.h").is_file():
        raise ToolchainError(f"no CUTLASS headers under {inc} (cutlass/cutlass.h is missing)")
    return [f"-I{inc}", f"-I{src / 'tools' / 'util' / 'include'}"]


def build_gemms(
    instances: Sequence[GemmInstance],
    cache: Path,
    nvcc: str | None = None,
    jobs: int = 2,
    cutlass_path: str | None = None,
) -> tuple[dict[str, bytes], bytes]:
    """({instance name: fatbin}, packer library) for `instances` (from the cache where built before),
    `jobs` nvcc at once."""
    nvcc = nvcc or find_nvcc()
    version = nvcc_version(nvcc)
    inc = cutlass_include(cutlass_path)
    kflags = [*FLAGS, *inc, "-fatbin"]
    pflags = [*FLAGS, *inc, *PACKER_FLAGS]
    out = cache / "cutlass"
    ordered = sorted(instances, key=lambda i: not i.hopper)  # the long sm_90a units first, then the packer
    units = [
        (i.name, [*kflags, *(HOPPER_TARGETS if i.hopper else KERNEL_TARGETS)], kernel_source(i), out / "fatbin")
        for i in ordered
    ]
    packer = ("the GEMM packer", pflags, packer_source(instances), out / "so")
    units.insert(sum(i.hopper for i in instances), packer)
    with ThreadPoolExecutor(jobs) as pool:
        built = dict(
            zip((u[0] for u in units), pool.map(lambda u: nvcc_cached(nvcc, version, u[1], u[2], u[3], u[0]), units))
        )
    return {i.name: built[i.name] for i in instances}, built[packer[0]]
