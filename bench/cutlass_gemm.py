"""GPU benchmark and check: CUTLASS GEMMs with bucketed dispatch against cuBLAS and one fixed config.

Needs a CUDA GPU. For linear layers of the encoder / decoder sizes in float16 and bfloat16, three
artifacts per layer: the bucketed CUTLASS dispatch (gemm_library="cutlass"), the best single config
(BLADEPACK_GEMM_CONFIGS=1), and torch's F.linear (cuBLAS) as the baseline, all in this one process. Over
a sweep of M from 1 to 16384 (odd values included) it checks every result against torch (no further
from a float64 reference than torch in the same dtype, within 2x) and times each call (CUDA events,
median). Out: bench/results/cutlass_gemm_<device>.{md,json} with per-M ratios and geomeans.

    python -m bench.cutlass_gemm [--repeat 50]
    python -m bench.cutlass_gemm --prewarm DIR   # no GPU: compile every unit into the cache DIR

With BLADEPACK_HOPPER_GEMMS=1 the artifacts are built for `cuda:sm_90a` too and, on compute capability
9.0, dispatch their Hopper tables (Note [Hopper GEMMs]); the results are then named
cutlass_gemm_hopper_<device>, and --prewarm compiles those units as well.

Measured on an NVIDIA H200 (bench/results/cutlass_gemm_NVIDIA_H200.md): every result correct, 0.21x of
cuBLAS in geomean, the Python loader's per-call cost dominating up to M = 1024.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

import bladepack
from bench.cuda_samples import _time_us

RESULTS = Path(__file__).resolve().parent / "results"
LAYERS = ((768, 768), (3072, 768), (768, 3072), (4096, 4096))  # (N, K)
SWEEP = (1, 2, 3, 7, 8, 16, 33, 64, 127, 128, 255, 512, 1000, 1024, 2047, 4096, 8191, 16384)
DTYPES = (torch.float16, torch.bfloat16)


def _targets() -> tuple[str, ...]:
    """The CUDA targets of the checks' and benchmark's artifacts: `cuda:sm_90a` too with
    BLADEPACK_HOPPER_GEMMS=1 (Note [Hopper GEMMs])."""
    from bladepack.options import LoaderOptions

    return ("cuda", "cuda:sm_90a") if LoaderOptions.from_env().hopper_gemms else ("cuda",)


def _linear(n: int, k: int, dtype: torch.dtype, configs: int | None) -> tuple[torch.nn.Linear, Any]:
    """A bias-free linear layer and its CUTLASS artifact (at most `configs` configs per GEMM)."""
    lin = torch.nn.Linear(k, n, bias=False).eval()
    m = torch.export.Dim("m", min=1, max=max(SWEEP))
    options = bladepack.CompileOptions.from_env(**({} if configs is None else {"gemm_configs": configs}))
    art = bladepack.optimize(
        lin,
        [(torch.randn(5, k),)],
        ({0: m},),
        targets=_targets(),
        dtype=str(dtype)[6:],
        gemm_library="cutlass",
        options=options,
    )
    return lin, art


def _artifact(n: int, k: int, dtype: torch.dtype, configs: int | None) -> Any:
    lin, art = _linear(n, k, dtype, configs)
    with tempfile.TemporaryDirectory() as d:
        art.save(Path(d) / "g.bpk")
        loaded = bladepack.load(Path(d) / "g.bpk", device="cuda")
    return loaded, lin.weight.detach().to("cuda", dtype)  # the artifact's weight, rounded the same way


def _error(out: torch.Tensor, ref64: torch.Tensor) -> float:
    return float((out.double() - ref64).abs().max() / ref64.abs().max().clamp_min(1e-30))


def check_configs(cache: Path, layers: tuple[tuple[int, int], ...] = LAYERS[:2]) -> list[str]:
    """Every M of the sweep, every dispatch bucket the artifact packages: results against torch."""
    os.environ.setdefault("BLADEPACK_CACHE_DIR", str(cache))
    failures = []
    for dtype in DTYPES:
        for n, k in layers:
            loaded, w = _artifact(n, k, dtype, None)
            for mv in SWEEP:
                x = torch.randn(mv, k, device="cuda", dtype=dtype)
                out = loaded(x)
                out = out[0] if isinstance(out, tuple) else out
                ref64 = x.double() @ w.double().t()
                ours, theirs = _error(out, ref64), _error(x @ w.t(), ref64)
                if not ours <= 2 * theirs + 1e-3:
                    failures.append(f"{dtype} N={n} K={k} M={mv}: error {ours:.3g}, torch {theirs:.3g}")
    return failures


def each_config_cases(
    hopper: bool, dtypes: tuple[str, ...] = ("float16", "bfloat16")
) -> list[tuple[Any, bool, list[Any]]]:
    """check_each_config's cases: (dtype, B stored [N, K], configs); `hopper` adds the sm90 configs."""
    from bladepack.dtypes import DType
    from bladepack.library_ops.cutlass.configs import candidates

    cases = []
    for dt in map(DType, dtypes):
        firsts = [candidates(dt)[0], *(candidates(dt, "sm90")[:1] if hopper else ())]
        every = [*candidates(dt), *(candidates(dt, "sm90") if hopper else ())]
        cases += [(dt, True, every if dt is DType.FLOAT16 else firsts), (dt, False, firsts)]
    return cases


def check_each_config(
    cache: Path, n: int = 392, k: int = 1000, dtypes: tuple[str, ...] = ("float16", "bfloat16")
) -> list[str]:
    """Every catalogue config launched on its own (the sm80 ones on any GPU, the sm90 ones where the
    compute capability is 9.0; float16 on a linear layout, and the first config of each arch also in
    bfloat16 and with B row-major), split-K 2 at small M, against torch over the M sweep."""
    from bladepack.dtypes import DType
    from bladepack.library_ops.cutlass.emitter import GemmInstance
    from bladepack.library_ops.cutlass.toolchain import build_gemms
    from bladepack.loader.cuda_driver import Device
    from bladepack.loader.cutlass_gemm import CutlassGemms
    from bladepack.options import LoaderOptions

    device = Device(torch.cuda.current_device())
    loader = LoaderOptions.from_env()
    hopper = device.info.compute_capability == (9, 0) and loader.hopper_gemms
    jobs = bladepack.CompileOptions.from_env().nvcc_jobs
    failures = []
    for dt, tb, cfgs in each_config_cases(hopper, dtypes):
        tdt = {DType.FLOAT16: torch.float16, DType.BFLOAT16: torch.bfloat16, DType.FLOAT32: torch.float32}[dt]
        insts = [GemmInstance(c, False, tb) for c in cfgs]
        images, packer = build_gemms(insts, cache, jobs=jobs)
        kernels = [(i.name, images[i.name], i.arch) for i in insts]
        gemms = CutlassGemms(device, packer, kernels, "check_each_config", loader)
        stream = torch.cuda.current_stream().cuda_stream
        w = torch.randn((n, k) if tb else (k, n), device="cuda", dtype=tdt)
        for mv in SWEEP:
            x = torch.randn(mv, k, device="cuda", dtype=tdt)
            wt = w.t() if tb else w
            ref64 = x.double() @ wt.double()
            theirs = _error(x @ wt, ref64)
            ints = (1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, mv, n, k, 0, int(tb), k, k if tb else n, n)
            for j, c in enumerate(cfgs):
                for split in (1, 2) if c.arch == "sm80" and mv <= 64 else (1,):
                    d = torch.full((mv, n), float("nan"), device="cuda", dtype=tdt)
                    entry = {"kernel": j, "split": split, "pred": 0, "align": c.align}
                    launch = gemms.prepare({"dtype": dt.value, "entries": [entry]}, [1], ((0, 0),) * 3, ints)
                    gemms.launch(launch, x.data_ptr(), w.data_ptr(), d.data_ptr(), None, stream)
                    ours = _error(d, ref64)
                    if not ours <= 2 * theirs + 1e-3:  # NaN (a tile never written) fails too
                        failures.append(f"{insts[j].name} split {split} M={mv}: error {ours:.3g}, torch {theirs:.3g}")
        torch.cuda.synchronize()
        gemms.close()
    return failures


class EpilogueBlock(torch.nn.Module):
    """Every fused epilogue form (Note [GEMM epilogue]): bias + ReLU, bias + GELU, SiLU, a residual, a bias."""

    def __init__(self, d: int = 256) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(d, 2 * d), torch.nn.Linear(2 * d, d)
        self.c, self.r = torch.nn.Linear(d, 4 * d, bias=False), torch.nn.Linear(4 * d, d, bias=False)
        self.o = torch.nn.Linear(d, 24)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.b(torch.relu(self.a(x))))
        h = h + self.r(torch.nn.functional.silu(self.c(h)))
        return self.o(h)


def _epilogue_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes CUTLASS serves (configs.VERIFIED_DTYPES; float32 too with BLADEPACK_CUTLASS_UNVERIFIED=1)."""
    unverified = bladepack.CompileOptions.from_env().cutlass_unverified
    return (torch.float16, torch.bfloat16, *((torch.float32,) if unverified else ()))


def epilogue_block(dtype: torch.dtype, d: int = 256) -> tuple[EpilogueBlock, Any]:
    """EpilogueBlock and its CUTLASS artifact in `dtype` (built for `_targets()`)."""
    torch.manual_seed(0)
    model = EpilogueBlock(d).eval()
    m = torch.export.Dim("m", min=1, max=max(SWEEP))
    art = bladepack.optimize(
        model, [(torch.randn(5, d),)], ({0: m},), targets=_targets(), dtype=str(dtype)[6:], gemm_library="cutlass"
    )
    return model, art


def prewarm(cache: Path) -> None:
    """Build, without a GPU, every CUTLASS unit the checks and the benchmark ask for into `cache` (the
    compile cache is keyed by nvcc's version, flags and source: a GPU machine with the same nvcc and the
    same CUTLASS_PATH reuses it). BLADEPACK_HOPPER_GEMMS=1 adds the sm90 configs (~35 s each)."""
    from bladepack.library_ops.cutlass.emitter import GemmInstance
    from bladepack.library_ops.cutlass.toolchain import build_gemms
    from bladepack.options import LoaderOptions

    os.environ["BLADEPACK_CACHE_DIR"] = str(cache)  # the epilogue artifacts' optimize reads it
    jobs = bladepack.CompileOptions.from_env().nvcc_jobs
    for _dt, tb, cfgs in each_config_cases(LoaderOptions.from_env().hopper_gemms):
        build_gemms([GemmInstance(c, False, tb) for c in cfgs], cache, jobs=jobs)
    for dtype in _epilogue_dtypes():
        epilogue_block(dtype, 256)
    for dtype in DTYPES:
        for n, k in LAYERS:
            for configs in (None, 1):
                _linear(n, k, dtype, configs)


def check_epilogues(cache: Path, d: int = 256) -> list[str]:
    """The fused epilogues against torch in the same dtype (float64 reference) over the M sweep."""
    os.environ.setdefault("BLADEPACK_CACHE_DIR", str(cache))
    failures = []
    for dtype in _epilogue_dtypes():
        model, art = epilogue_block(dtype, d)
        kind = str(dtype)[6:]
        with tempfile.TemporaryDirectory() as tmp:
            art.save(Path(tmp) / "e.bpk")
            loaded = bladepack.load(Path(tmp) / "e.bpk", device="cuda")
        ours_model = model.to("cuda", dtype).requires_grad_(False)
        ref_model = EpilogueBlock(d).eval().to("cuda", torch.float64)
        ref_model.load_state_dict({k: v.double() for k, v in ours_model.state_dict().items()})
        for mv in SWEEP:
            x = torch.randn(mv, d, device="cuda", dtype=dtype)
            out = loaded(x)
            out = out[0] if isinstance(out, tuple) else out
            ref64 = ref_model(x.double())
            ours, theirs = _error(out, ref64), _error(ours_model(x), ref64)
            limit = 1e-4 if dtype == torch.float32 else 2 * theirs + 1e-3
            if not ours <= limit:
                failures.append(f"epilogues {kind} M={mv}: error {ours:.3g}, torch {theirs:.3g}")
    return failures


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument(
        "--prewarm", type=Path, help="build every CUTLASS unit into this cache dir (no GPU needed) and stop"
    )
    args = ap.parse_args()
    if args.prewarm:
        prewarm(args.prewarm)
        return
    from bladepack.options import LoaderOptions

    device = torch.cuda.get_device_name().replace(" ", "_")
    name = f"cutlass_gemm_hopper_{device}" if LoaderOptions.from_env().hopper_gemms else f"cutlass_gemm_{device}"
    rows = []
    for dtype in DTYPES:
        for n, k in LAYERS:
            bucketed, w = _artifact(n, k, dtype, None)
            fixed, _ = _artifact(n, k, dtype, 1)
            for mv in SWEEP:
                x = torch.randn(mv, k, device="cuda", dtype=dtype)
                t_cublas = _time_us(lambda x=x: torch.nn.functional.linear(x, w), args.repeat)
                t_ours = _time_us(lambda x=x: bucketed(x), args.repeat)
                t_fixed = _time_us(lambda x=x: fixed(x), args.repeat)
                tflops = 2 * mv * n * k / t_ours / 1e6
                rows.append(
                    {
                        "dtype": str(dtype)[6:],
                        "n": n,
                        "k": k,
                        "m": mv,
                        "cublas_us": t_cublas,
                        "bladepack_us": t_ours,
                        "fixed_us": t_fixed,
                        "vs_cublas": t_cublas / t_ours,
                        "vs_fixed": t_fixed / t_ours,
                        "tflops": tflops,
                    }
                )
                print(f"{rows[-1]['dtype']} N={n} K={k} M={mv}: {t_ours:.1f} us, x{t_cublas / t_ours:.2f} vs cuBLAS")

    def geo(key: str) -> float:
        return math.exp(statistics.fmean(math.log(r[key]) for r in rows))

    lines = [
        f"# CUTLASS GEMMs on {device}" + (" (Hopper tables: BLADEPACK_HOPPER_GEMMS=1)" if "hopper" in name else ""),
        "",
        f"geomean vs cuBLAS {geo('vs_cublas'):.2f}x, vs one fixed config {geo('vs_fixed'):.2f}x, "
        f"min vs cuBLAS {min(r['vs_cublas'] for r in rows):.2f}x",
        "",
        "| dtype | N | K | M | cuBLAS us | bladepack us | fixed us | vs cuBLAS | vs fixed | TFLOP/s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['dtype']} | {r['n']} | {r['k']} | {r['m']} | {r['cublas_us']:.1f} | {r['bladepack_us']:.1f} | "
            f"{r['fixed_us']:.1f} | {r['vs_cublas']:.2f} | {r['vs_fixed']:.2f} | {r['tflops']:.1f} |"
        )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    (RESULTS / f"{name}.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines[:3]))


if __name__ == "__main__":
    main()
