"""Why do the sm_90a (Hopper) CUTLASS GEMMs fault? One probe per suspect (Note [Hopper GEMMs] in
bladepack/library_ops/cutlass/emitter.py).

    hopper_probe.py prepare DIR   # development machine, no GPU: nvcc builds of each probed instance
    hopper_probe.py check DIR     # an H100 / H200: every step in its own process (a fault ends one step)

For each probed config (the first ping-pong one, cluster 1x1x1, and the first cooperative one with a
cluster of 2) `prepare` builds what bladepack ships — the kernel's sm_90a fatbin and the packer — and
a reference library compiled from the same kernel type that does everything the CUTLASS way:
`ref_pack` builds the Params with CUTLASS's own driver entry-point lookup, `ref_run` runs
`GemmUniversalAdapter` (CUTLASS's launch, its own `device_kernel`), and `ref_launch` launches that
`device_kernel` with Params handed in. `check` then runs, on D = A @ B^T (float16, B stored [N, K]):

    cutlass           CUTLASS end to end: do these kernels run at all with this nvcc / driver / CUTLASS?
    params            our packer's Params against CUTLASS's for the same pointers: byte-identical?
    ref_kernel_ours   CUTLASS's device_kernel launched with our packer's Params
    ours_ref_params   our fatbin's kernel launched through the loader with CUTLASS's Params
    ours_kernelparams our fatbin's kernel, CUTLASS's Params, cuLaunchKernel's kernelParams (not `extra`)
    ours              the loader end to end (CutlassGemms, BLADEPACK_HOPPER_GEMMS=1)

and prints one line per step and config: ok with the error against torch, or what failed
(PROBE_STEPS=a,b runs only those). Last, the
`float32` step launches the float32 (3xTF32, sm80-class) catalogue configs alone over bench.cutlass_gemm's
M sweep: a float32 plan's fused epilogues returned NaN on the H200, and this says whether the kernels
themselves do.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = ("cutlass", "params", "ref_kernel_ours", "ours_ref_params", "ours_kernelparams", "ours")
PROBLEMS = ((256, 256, 256), (300, 392, 1000))  # (M, N, K): whole tiles; ragged M, N and K
RAGGED_STEPS = ("cutlass", "ours")  # the steps also run on the ragged problem
PARAMS_CAPACITY = 4096

_REFERENCE = """
#include <cuda_runtime.h>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
{stride_helper}
{types}
using K = {name}_t::Kernel;
using E = {name}_t::Element;

static K::Arguments bpk_args(int64_t m, int64_t n, int64_t k, uint64_t a, uint64_t b, uint64_t d, int sms) {{
  K::Arguments args{{}};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = {{int(m), int(n), int(k), 1}};
  args.mainloop.ptr_A = reinterpret_cast<E const*>(uintptr_t(a));
  args.mainloop.dA = bpk_stride<typename K::StrideA>(k, 0, m, k, false);
  args.mainloop.ptr_B = reinterpret_cast<E const*>(uintptr_t(b));
  args.mainloop.dB = bpk_stride<typename K::StrideB>(k, 0, n, k, false);
  args.epilogue.thread.alpha = 1.0f;
  args.epilogue.ptr_D = reinterpret_cast<E*>(uintptr_t(d));
  args.epilogue.dD = bpk_stride<typename K::StrideD>(n, 0, m, n, false);
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = sms;
  return args;
}}

extern "C" int ref_pack(int64_t m, int64_t n, int64_t k, uint64_t a, uint64_t b, uint64_t d, int sms,
                        void* out, int64_t capacity, int64_t* geometry) {{
  K::Arguments args = bpk_args(m, n, k, a, b, d, sms);
  if (!K::can_implement(args)) return 1;
  K::Params params = K::to_underlying_arguments(args, nullptr);
  if (int64_t(sizeof(params)) > capacity) return 2;
  std::memcpy(out, &params, sizeof(params));
  const dim3 grid = K::get_grid_shape(params);
  geometry[0] = grid.x;
  geometry[1] = grid.y;
  geometry[2] = grid.z;
  geometry[3] = K::MaxThreadsPerBlock;
  geometry[4] = K::SharedStorageSize;
  geometry[5] = int64_t(sizeof(params));
  return 0;
}}

extern "C" int ref_run(int64_t m, int64_t n, int64_t k, uint64_t a, uint64_t b, uint64_t d, int sms) {{
  cutlass::gemm::device::GemmUniversalAdapter<K> gemm;
  K::Arguments args = bpk_args(m, n, k, a, b, d, sms);
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return 1;
  if (gemm.initialize(args, nullptr) != cutlass::Status::kSuccess) return 2;
  if (gemm.run() != cutlass::Status::kSuccess) return 1000 + int(cudaGetLastError());
  return int(cudaDeviceSynchronize());
}}

extern "C" int ref_launch(const void* params, const int64_t* geometry) {{
  const K::Params& p = *reinterpret_cast<const K::Params*>(params);
  const int smem = K::SharedStorageSize;
  cudaError_t e = cudaFuncSetAttribute(cutlass::device_kernel<K>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return 2000 + int(e);
  const dim3 grid{{unsigned(geometry[0]), unsigned(geometry[1]), unsigned(geometry[2])}};
  const int cluster = {cluster_size};
  if (cluster == 1) {{
    cutlass::device_kernel<K><<<grid, K::MaxThreadsPerBlock, smem>>>(p);
  }} else {{
    const dim3 cdims({cx}, {cy}, {cz});
    cutlass::ClusterLaunchParams lp{{grid, dim3(K::MaxThreadsPerBlock, 1, 1), cdims, smem}};
    if (cutlass::launch_kernel_on_cluster(lp, (void const*)cutlass::device_kernel<K>, p) != cutlass::Status::kSuccess)
      return 3000 + int(cudaGetLastError());
  }}
  e = cudaGetLastError();
  if (e != cudaSuccess) return 1000 + int(e);
  return int(cudaDeviceSynchronize());
}}
"""


def _instances() -> list[Any]:
    from bladepack.dtypes import DType
    from bladepack.library_ops.cutlass.configs import candidates
    from bladepack.library_ops.cutlass.emitter import GemmInstance

    cfgs = candidates(DType.FLOAT16, "sm90")
    pingpong = next(c for c in cfgs if c.schedule == "pingpong" and c.cluster == (1, 1, 1))
    cooperative = next(c for c in cfgs if c.schedule == "cooperative" and c.cluster != (1, 1, 1))
    return [GemmInstance(c, False, True) for c in (pingpong, cooperative)]


def prepare(out: Path) -> None:
    from bladepack.codegen.cuda_toolchain import find_nvcc, nvcc_cached, nvcc_version
    from bladepack.library_ops.cutlass import emitter
    from bladepack.library_ops.cutlass.toolchain import (
        FLAGS,
        HOPPER_TARGETS,
        PACKER_FLAGS,
        build_gemms,
        cutlass_include,
    )
    from bladepack.options import CompileOptions

    out.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("BLADEPACK_CACHE_DIR", "/tmp/bladepack-cache"))
    tools = CompileOptions.from_env()
    nvcc = find_nvcc(tools.nvcc, tools.cuda_home)
    version = nvcc_version(nvcc)
    insts = _instances()
    images, packer = build_gemms(insts, cache, nvcc, cutlass_path=tools.cutlass_path)
    (out / "packer.so").write_bytes(packer)
    for inst in insts:
        (out / f"{inst.name}.fatbin").write_bytes(images[inst.name])
        cx, cy, cz = inst.config.cluster
        source = (
            emitter._HEADERS
            + emitter._HOPPER_HEADERS
            + _REFERENCE.format(
                stride_helper=emitter._STRIDE_HELPER,
                types=emitter._types(inst),
                name=inst.name,
                cluster_size=cx * cy * cz,
                cx=cx,
                cy=cy,
                cz=cz,
            )
        )
        flags = [*FLAGS, *cutlass_include(tools.cutlass_path), *HOPPER_TARGETS, *PACKER_FLAGS]
        lib = nvcc_cached(nvcc, version, flags, source, cache / "probe" / "so", f"the reference {inst.name}")
        (out / f"ref_{inst.name}.so").write_bytes(lib)
        print(f"prepared {inst.name}", flush=True)
    from bench.cutlass_gemm import each_config_cases

    for _dt, tb, cfgs in each_config_cases(False, ("float32",)):
        build_gemms([emitter.GemmInstance(c, False, tb) for c in cfgs], cache, nvcc, cutlass_path=tools.cutlass_path)
    (out / "instances.json").write_text(json.dumps([[i.name, list(i.config.cluster)] for i in insts]))


def _error(d: Any, a: Any, b: Any) -> float:
    ref = a.double() @ b.double().t()
    return float((d.double() - ref).abs().max() / ref.abs().max())


def step(out: Path, name: str, which: str, m: int, n: int, k: int) -> str:
    """One probe step in this process; returns its report line (a fault raises or kills the process)."""
    import torch

    from bladepack.loader.cuda_driver import Device

    torch.manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    device = Device(torch.cuda.current_device())
    sms = device.info.sm_count
    ref = ctypes.CDLL(str(out / f"ref_{name}.so"))
    ref.ref_pack.argtypes = (
        [ctypes.c_int64] * 3
        + [ctypes.c_uint64] * 3
        + [ctypes.c_int, ctypes.c_void_p]
        + [
            ctypes.c_int64,
            ctypes.c_void_p,
        ]
    )
    ref.ref_run.argtypes = [ctypes.c_int64] * 3 + [ctypes.c_uint64] * 3 + [ctypes.c_int]
    ref.ref_launch.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    ptrs = (a.data_ptr(), b.data_ptr(), d.data_ptr())

    def ref_params() -> tuple[Any, Any]:
        params, geometry = (ctypes.c_uint8 * PARAMS_CAPACITY)(), (ctypes.c_int64 * 10)()
        rc = ref.ref_pack(m, n, k, *ptrs, sms, params, PARAMS_CAPACITY, geometry)
        if rc:
            raise RuntimeError(f"ref_pack returned {rc}")
        return params, geometry

    def our_params() -> tuple[Any, Any]:
        lib = ctypes.CDLL(str(out / "packer.so"))
        lib.bpk_set_tensor_map_encoder.argtypes = [ctypes.c_void_p]
        lib.bpk_set_tensor_map_encoder(device.entry_point("cuTensorMapEncodeTiled"))
        pack = getattr(lib, f"bpk_pack_{name}")
        pack.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int32, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
        ins = (ctypes.c_int64 * 13)(m, n, k, 1, k, k, n, n, 0, 0, 0, 0, 0)
        cptrs = (ctypes.c_uint64 * 5)(*ptrs[:2], ptrs[2], ptrs[2], 0)
        scalars = (ctypes.c_double * 2)(1.0, 0.0)
        params, geometry = (ctypes.c_uint8 * PARAMS_CAPACITY)(), (ctypes.c_int64 * 10)()
        rc = pack(ins, cptrs, scalars, sms, params, PARAMS_CAPACITY, geometry)
        if rc:
            raise RuntimeError(f"bpk_pack returned {rc}")
        return params, geometry

    def our_function() -> Any:
        return device.load_module((out / f"{name}.fatbin").read_bytes()).function(name)

    cluster = tuple(next(c for nm, c in json.loads((out / "instances.json").read_text()) if nm == name))
    if which == "cutlass":
        rc = ref.ref_run(m, n, k, *ptrs, sms)
        if rc:
            return f"ref_run returned {rc}"
    elif which == "params":
        (rp, rg), (op, og) = ref_params(), our_params()
        size = int(rg[5])
        if list(rg[:6]) != list(og[:6]):
            return f"geometry differs: CUTLASS {list(rg[:6])}, ours {list(og[:6])}"
        diff = [i for i in range(size) if rp[i] != op[i]]
        if diff:
            return f"{len(diff)} of {size} Params bytes differ, at {diff[:16]}{' ...' if len(diff) > 16 else ''}"
        return f"identical ({size} bytes, grid {list(rg[:3])}, {rg[3]} threads, {rg[4]} B shared)"
    elif which == "ref_kernel_ours":
        params, geometry = our_params()
        rc = ref.ref_launch(params, geometry)
        if rc:
            return f"ref_launch returned {rc}"
    elif which in ("ours_ref_params", "ours_kernelparams"):
        params, g = ref_params()
        fn = our_function()
        grid, block = (int(g[0]), int(g[1]), int(g[2])), (int(g[3]), 1, 1)
        if which == "ours_ref_params":
            fn.launch_packed(grid, block, ctypes.addressof(params), int(g[5]), int(g[4]), 0, cluster)
        else:
            drv = fn._drv
            fn.prepare_shared(int(g[4]))
            if cluster != (1, 1, 1):
                return "skipped (cluster launch goes through cuLaunchKernelEx)"
            argv = (ctypes.c_void_p * 1)(ctypes.addressof(params))
            err = drv.cuLaunchKernel(fn.handle, *grid, *block, int(g[4]), drv.CUstream(0), ctypes.addressof(argv), 0)
            if int(err[0] if isinstance(err, tuple) else err):
                return f"cuLaunchKernel: {err}"
        torch.cuda.synchronize()
    elif which == "ours":
        from bladepack.dtypes import DType
        from bladepack.loader.cutlass_gemm import HOPPER, CutlassGemms
        from bladepack.options import LoaderOptions

        kernel = [(name, (out / f"{name}.fatbin").read_bytes(), HOPPER)]
        options = LoaderOptions.from_env(hopper_gemms=True)
        gemms = CutlassGemms(device, (out / "packer.so").read_bytes(), kernel, "probe", options)
        ints = (1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, m, n, k, 0, 1, k, k, n)
        entry = {"kernel": 0, "split": 1, "pred": 0, "align": 8}
        launch = gemms.prepare({"dtype": DType.FLOAT16.value, "entries": [entry]}, [1], ((0, 0),) * 3, ints)
        gemms.launch(launch, *ptrs, None, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    err = _error(d, a, b)
    theirs = _error(a @ b.t(), a, b)
    verdict = "ok" if err <= 2 * theirs + 1e-3 else "WRONG"
    return f"{verdict}: error {err:.3g} (torch {theirs:.3g})"


def check(out: Path, timeout: int) -> int:
    names = [nm for nm, _ in json.loads((out / "instances.json").read_text())]
    only = os.environ.get("PROBE_STEPS", ",".join(STEPS)).split(",")
    bad = 0
    for name in names:
        for m, n, k in PROBLEMS:
            for which in STEPS if (m, n, k) == PROBLEMS[0] else RAGGED_STEPS:
                if which not in only:
                    continue
                cmd = [sys.executable, __file__, "step", str(out), name, which, str(m), str(n), str(k)]
                try:
                    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                    lines = (r.stdout + r.stderr).strip().splitlines()
                    line = lines[-1] if lines else f"exit {r.returncode}, no output"
                    if r.returncode:
                        line = f"FAILED (exit {r.returncode}): {line}"
                except subprocess.TimeoutExpired:
                    line = f"FAILED: no answer in {timeout} s"
                bad += not (line.startswith("ok") or line.startswith("identical"))
                print(f"{name} {m}x{n}x{k} {which}: {line}", flush=True)
    cmd = [sys.executable, __file__, "float32", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=4 * timeout)
    lines = (r.stdout + r.stderr).strip().splitlines()
    print(f"float32 configs: {lines[-1] if lines else f'exit {r.returncode}, no output'}", flush=True)
    return bad + (r.returncode != 0)


def float32_configs() -> str:
    from bench.cutlass_gemm import check_each_config

    failures = check_each_config(
        Path(os.environ.get("BLADEPACK_CACHE_DIR", "/tmp/bladepack-cache")), dtypes=("float32",)
    )
    return f"WRONG: {len(failures)} failures: {failures[:6]}" if failures else "ok: every float32 config, M 1 to 16384"


def main() -> None:
    verb, out = sys.argv[1], Path(sys.argv[2])
    if verb == "prepare":
        prepare(out)
    elif verb == "check":
        sys.exit(1 if check(out, int(os.environ.get("PROBE_STEP_TIMEOUT", "60"))) else 0)
    elif verb == "float32":
        line = float32_configs()
        print(line, flush=True)
        sys.exit(0 if line.startswith("ok") else 1)
    elif verb == "step":
        name, which, m, n, k = sys.argv[3], sys.argv[4], *map(int, sys.argv[5:8])
        print(step(out, name, which, m, n, k), flush=True)
    else:
        raise SystemExit(f"unknown verb {verb!r}: prepare DIR | check DIR")


if __name__ == "__main__":
    main()
