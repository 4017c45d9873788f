"""CUTLASS GEMMs of a CUDA plan: load their kernels and packer, build Params, launch.

In: the manifest's `native_cuda.gemm_kernels` (one fatbin section per kernel) and `gemm_packer` (the
host library of Note [GEMM packer] in library_ops/cutlass/emitter.py), the device. Out: `CutlassGemms`,
whose `launch` runs one `cutlass` launch record: the dispatch entry the shape program chose (or the
SIMT fallback when an operand address is not aligned to the entry's vector width), the Params built by
the packer for this call's pointers, and the kernel launched with the Params as its one parameter. A
launch with an epilogue source (a bias row or a residual: Note [GEMM epilogue] in
passes/gemm_epilogue.py) passes it as CUTLASS's C with beta 1.

On a GPU of compute capability 9.0, with BLADEPACK_HOPPER_GEMMS=1, an artifact built for sm_90a loads its
Hopper kernels too, hands the packer the driver's `cuTensorMapEncodeTiled` (Note [Hopper GEMMs] in
library_ops/cutlass/emitter.py) and dispatches with each record's `entries_sm90`; otherwise the Hopper
kernels are not loaded (their sm_90a cubins run nowhere else, and their epilogues and speed are not
measured yet) and `entries` dispatch. Hopper kernels take their Params as `__grid_constant__` and launch
through kernelParams (Note [Grid-constant parameters] in loader/cuda_driver.py).

Everything that depends on the shape only (dispatch entry, packer inputs, batch folding: loader/
gemm_args.py) is resolved in `prepare`; a call adds its addresses and packs. Serial split-K slices share
one semaphore buffer per stream (CUTLASS leaves it zeroed after every launch); when a larger one is
needed the smaller stays allocated until `close`, since a CUDA graph captured before may address it.
"""

from __future__ import annotations

import ctypes
import hashlib
import platform
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bladepack.artifact.format import BpkFile
from bladepack.dtypes import DType
from bladepack.errors import BpkFormatError
from bladepack.loader.cuda_driver import CudaError, CudaUnavailable, Device, Function, StreamBuffers
from bladepack.loader.gemm_args import gemm_args
from bladepack.options import LoaderOptions

PARAMS_CAPACITY = 4096
_INT_MAX = (1 << 31) - 1


@dataclass(frozen=True)
class CutlassLaunch:
    kernel: int  # the chosen dispatch entry's kernel
    fallback: int  # the last entry's kernel (any alignment)
    align_bytes: int  # the chosen kernel's vector width
    ptrs: tuple[tuple[int, int], ...]  # (slot, byte offset) of A, B, D and the epilogue source if any
    ins: tuple[int, ...]  # the packer's `in` words (Note [GEMM packer])
    split: int
    steps: tuple[tuple[int, int, int, int], ...]  # byte offsets of A, B, D, source per host-loop step (gemm_args)


HOPPER = "sm_90a"  # the kernel arch of Hopper-only instances
_PACK_ERRORS = {
    1: "cannot run this problem",
    2: "its Params do not fit",
    3: "the driver refused a TMA descriptor",
}


class CutlassGemms:
    """The kernels (name, fatbin, arch: "sm_80" or "sm_90a") and their packer library; `source` names
    where they came from."""

    def __init__(
        self,
        device: Device,
        packer: bytes | memoryview,
        kernels: Sequence[tuple[str, bytes, str]],
        source: str,
        options: LoaderOptions,
        packer_sha256: str | None = None,
    ) -> None:
        """`packer_sha256`: the digest the manifest gives the packer (None: bytes built here); `options`:
        where the packer is kept (cache_dir) and whether sm_90a kernels dispatch (hopper_gemms)."""
        from bladepack.loader.library_file import open_library

        machine = platform.machine().lower()
        if machine not in ("x86_64", "amd64") or platform.system() != "Linux":
            raise CudaUnavailable(
                f"{source}: its CUTLASS GEMM packer is built for x86_64 Linux; this machine is "
                f"{platform.system()} {platform.machine()} (optimize with gemm_library='cublas' for it)"
            )
        self.device = device
        self.names = [name for name, _, _ in kernels]
        packer = memoryview(packer)
        digest = packer_sha256 or hashlib.sha256(packer).hexdigest()
        self._lib = open_library(packer, digest, f"{source}: the CUTLASS packer", options.cache_dir)
        self.pack: list[Any] = []
        self.functions: list[Function | None] = []  # None: a Hopper kernel on another GPU
        self.grid_constant = [arch == HOPPER for _, _, arch in kernels]  # Params passed as __grid_constant__
        self._modules = []
        # dispatch with `entries_sm90`: compute capability 9.0 and BLADEPACK_HOPPER_GEMMS=1 (Note [Hopper GEMMs])
        self.hopper = device.info.compute_capability == (9, 0) and options.hopper_gemms
        if self.hopper and any(arch == HOPPER for _, _, arch in kernels):
            try:
                setter = self._lib.bpk_set_tensor_map_encoder
            except AttributeError as e:
                raise BpkFormatError(f"{source}: the GEMM packer cannot take a TMA encoder (corrupt artifact)") from e
            setter.argtypes, setter.restype = [ctypes.c_void_p], None
            setter(device.entry_point("cuTensorMapEncodeTiled"))
        for name, image, arch in kernels:
            try:
                fn = getattr(self._lib, f"bpk_pack_{name}")
            except AttributeError as e:
                raise BpkFormatError(f"{source}: the GEMM packer has no entry for {name}") from e
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
            self.pack.append(fn)
            if arch == HOPPER and not self.hopper:
                self.functions.append(None)
                continue
            module = device.load_module(image)
            self._modules.append(module)
            self.functions.append(module.function(name))
        self._local = threading.local()
        # split-K semaphores; one outgrown stays: a graph captured earlier on the stream addresses it
        self._workspaces = StreamBuffers(device, 256, zeroed=True, keep=True)

    @classmethod
    def from_artifact(cls, bpk: BpkFile, plan: dict[str, Any], device: Device, options: LoaderOptions) -> CutlassGemms:
        """The plan's `gemm_kernels` and `gemm_packer` sections."""
        kernels = [
            (row["name"], bpk.section_copy(row["section"]), row.get("arch", "sm_80")) for row in plan["gemm_kernels"]
        ]
        section = plan["gemm_packer"]["section"]
        return cls(device, bpk.section(section), kernels, str(bpk.source), options, bpk.section_digest(section))

    def close(self) -> None:
        """Free the split-K semaphores and unload the kernels (the packer library stays mapped: ctypes
        cannot unload it)."""
        self._workspaces.free()
        for module in self._modules:
            module.unload()
        self._modules.clear()

    def prepare(
        self, lr: dict[str, Any], regs: Sequence[int], ptrs: tuple[tuple[int, int], ...], ints: tuple[int, ...]
    ) -> CutlassLaunch:
        entries = lr["entries_sm90"] if self.hopper and "entries_sm90" in lr else lr["entries"]
        chosen = next((e for e in entries if regs[e["pred"]]), None)
        if chosen is None:
            raise BpkFormatError("a CUTLASS GEMM launch has no dispatch entry for this shape (corrupt plan)")
        if not all(0 <= int(e["kernel"]) < len(self.functions) for e in (chosen, entries[-1])):
            raise BpkFormatError(f"a CUTLASS GEMM dispatch entry names no packaged kernel (corrupt plan): {chosen}")
        itemsize = DType(lr["dtype"]).itemsize
        g = gemm_args(ints, itemsize)
        if max(g.m, g.n, g.k, g.batch) > _INT_MAX:
            raise CudaError(f"GEMM {g.m}x{g.n}x{g.k} (batch {g.batch}) exceeds CUTLASS's 32-bit problem sizes")
        batched = g.batch > 1
        split = 1 if batched else int(chosen["split"])
        if len(ptrs) not in (3, 4) or (len(ptrs) == 4) != (len(ints) == 24):
            raise BpkFormatError("a CUTLASS GEMM launch has the wrong number of operands (corrupt plan)")
        ins = (
            *(g.m, g.n, g.k, g.batch if batched else split),
            *(g.lda, g.ldb, g.ld_src, g.ldc),
            *(g.stride_a, g.stride_b, g.stride_src, g.stride_c),
            int(batched),
        )
        kernel, fallback = int(chosen["kernel"]), int(entries[-1]["kernel"])
        return CutlassLaunch(kernel, fallback, int(chosen["align"]) * itemsize, ptrs, ins, split, g.steps)

    def _buffers(self) -> tuple[Any, Any, Any, Any, Any]:
        """This thread's packer arguments and Params buffer (launches copy the Params)."""
        loc = self._local
        if not hasattr(loc, "params"):
            loc.params = (ctypes.c_uint8 * PARAMS_CAPACITY)()
            loc.geometry = (ctypes.c_int64 * 10)()
            loc.ins = (ctypes.c_int64 * 13)()
            loc.ptrs = (ctypes.c_uint64 * 5)()
            loc.scalars = (ctypes.c_double * 2)(1.0, 0.0)
        return loc.params, loc.geometry, loc.ins, loc.ptrs, loc.scalars

    def launch(
        self,
        launch: CutlassLaunch,
        a: int,
        b: int,
        d: int,
        c: int | None,
        stream: int,
        workspace_stream: int | None = None,
    ) -> None:
        """D = act(A.B [+ C]) for one launch record (A, B, D, C: device addresses of the operand views;
        C None without an epilogue source). The split-K semaphores are those of `workspace_stream`
        (default `stream`): a CUDA graph captured on another stream uses its caller stream's."""
        ws = stream if workspace_stream is None else workspace_stream
        if not launch.steps:
            return
        kernel = launch.kernel
        if (a | b | d | (c or 0)) % launch.align_bytes:
            kernel = launch.fallback  # an operand address is not aligned to the vector width
        params, geometry, cin, cptrs, scalars = self._buffers()
        cin[:] = launch.ins
        scalars[1] = 0.0 if c is None else 1.0
        sms = self.device.info.sm_count

        def pack(k: int) -> int:
            return int(self.pack[k](cin, cptrs, scalars, sms, params, PARAMS_CAPACITY, geometry))

        semaphores = self._workspaces.get(0, ws) if launch.split > 1 else 0
        for da, db, dd, dc in launch.steps:
            cptrs[:] = [a + da, b + db, d + dd if c is None else c + dc, d + dd, semaphores]
            rc = pack(kernel)
            if rc == 1 and kernel != launch.fallback:  # CUTLASS refused the shape: the SIMT fallback runs any
                kernel = launch.fallback
                rc = pack(kernel)
            if rc == 0 and launch.split > 1 and geometry[6] > 0:
                cptrs[4] = semaphores = self._workspaces.get(int(geometry[6]), ws)
                rc = pack(kernel)
            function = self.functions[kernel]
            if rc != 0 or function is None:
                why = _PACK_ERRORS.get(rc, f"packer error {rc}") if rc else "its sm_90a kernel is not loaded"
                raise CudaError(f"CUTLASS GEMM {self.names[kernel]}: {why} (in = {list(launch.ins)})")
            grid = (int(geometry[0]), int(geometry[1]), int(geometry[2]))
            block = (int(geometry[3]), 1, 1)
            cluster = (int(geometry[7]), int(geometry[8]), int(geometry[9]))
            if self.grid_constant[kernel]:  # Note [Grid-constant parameters] in loader/cuda_driver.py
                function.launch_grid_constant(grid, block, ctypes.addressof(params), int(geometry[4]), stream, cluster)
            else:
                function.launch_packed(
                    grid, block, ctypes.addressof(params), int(geometry[5]), int(geometry[4]), stream, cluster
                )
