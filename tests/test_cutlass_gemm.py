"""CUTLASS GEMMs without a GPU: the config space, the cost-model dispatch, the generated sources, and an
artifact whose GEMMs run on CUTLASS loaded on the fake driver (tests/cuda_harness.py).

The fake driver cannot run CUTLASS kernels (they are not emulated), so the end-to-end test checks what
the loader hands the driver: the kernel the dispatch table picks per shape, its grid, block and shared
memory, and the Params bytes the packer built (problem size, pointers, split-K semaphores). Numerics
of the CUTLASS kernels need a GPU (bench/cutlass_gemm.py, and the `cuda`-marked test below).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import struct
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sympy
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import bladepack
from bladepack.dtypes import DType
from bladepack.ir import ShapeEnv
from bladepack.library_ops.cpu_gemm import GemmCall
from bladepack.library_ops.cutlass.configs import CATALOGUE, candidates, check, fallback
from bladepack.library_ops.cutlass.emitter import GemmInstance, kernel_source, packer_source
from bladepack.library_ops.cutlass.select import (
    BANDWIDTH,
    LAUNCH_US,
    MACS_PER_SM,
    MMA_SYNC_ON_HOPPER,
    SMS,
    Option,
    _efficiency,
    estimate,
    estimates,
    occupancy,
    select,
    selection_key,
)
from bladepack.options import CompileOptions
from tests.cuda_harness import FakeGpu, needs_nvcc, require_cutlass
from tests.gemm_calls import bmm_call, linear_call


def test_catalogue_configs_instantiate() -> None:
    names = set()
    for (dt, arch), cfgs in CATALOGUE.items():
        for cfg in (*cfgs, *((fallback(dt),) if arch == "sm80" else ())):
            check(cfg)
            assert cfg.name not in names
            names.add(cfg.name)
            assert cfg.dtype is dt and cfg.arch == arch
        assert fallback(dt).align == 1
    assert all(c.math == "tensorop_3xtf32" for c in candidates(DType.FLOAT32))  # float32 accuracy, not TF32
    with pytest.raises(ValueError, match="no CUTLASS GEMM configs for int64"):
        candidates(DType.INT64)


def test_cost_model_prefers_split_k_for_skinny_deep_gemms_and_big_tiles_for_big_ones() -> None:
    cfgs = candidates(DType.FLOAT16)

    def best(m: int, n: int, k: int) -> Option:
        opts = [Option(c, s) for c in cfgs for s in (1, 2, 4, 8, 16)]
        return min(opts, key=lambda o: estimate(o, m, n, k, 1))

    assert best(1, 768, 3072).split > 1  # few output tiles: split K to use the SMs
    big = best(16384, 4096, 4096)
    assert big.split == 1 and big.config.tile[0] * big.config.tile[1] >= 128 * 128


def _wave_by_wave(opt: Option, m: int, n: int, k: int, batch: int, arch: str) -> float:
    """Note [GEMM cost model] as it reads: the busiest SM's CTAs in waves of its occupancy, one by one."""
    cfg, split = opt.config, opt.split
    tm, tn, tk = cfg.tile
    tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch * split
    occ = occupancy(cfg)
    cta_macs = math.ceil(math.ceil(k / split) / tk) * tm * tn * tk
    rate = (
        MACS_PER_SM[cfg.math]
        * _efficiency(cfg)
        * (MMA_SYNC_ON_HOPPER if arch == "sm90" and cfg.math == "tensorop" else 1)
    )
    compute, left = 0.0, math.ceil(tiles / SMS)
    while left > 0:
        now = min(occ, left)
        compute += now * cta_macs / (rate * min(1.0, now * cfg.warps / 8))
        left -= now
    traffic = (
        (math.ceil(n / tn) * m * k + math.ceil(m / tm) * n * k + m * n * (2 * split - 1)) * cfg.dtype.itemsize * batch
    )
    memory = traffic / (BANDWIDTH * min(1.0, 2 * min(tiles, SMS) / SMS))
    return max(compute, memory) + (split - 1) * 2 * tm * tn * 4 / (BANDWIDTH / SMS) + LAUNCH_US


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 8192),
    n=st.integers(1, 4096),
    k=st.integers(1, 1 << 14),
    batch=st.integers(1, 4),
    arch=st.sampled_from(["sm80", "sm90"]),
)
@example(m=16384, n=4096, k=4096, batch=1, arch="sm80")  # many full waves
@example(m=1, n=1, k=1, batch=1, arch="sm90")
def test_cost_model_in_closed_form_matches_it_wave_by_wave(m: int, n: int, k: int, batch: int, arch: str) -> None:
    """`estimates` prices every shape and option at once, the full waves in one product: the same times
    as walking the waves, for every config of every dtype (Hopper, SIMT fallbacks) and split."""
    cfgs = [c for cs in CATALOGUE.values() for c in cs] + [fallback(d) for d in (DType.FLOAT16, DType.FLOAT64)]
    opts = [Option(c, s) for c in cfgs for s in (1, 2, 16)]
    got = estimates(opts, [(m, n, k, batch), (1, n, k, 1)], arch)
    for row, (mm, bb) in zip(got, ((m, batch), (1, 1))):
        want = [_wave_by_wave(o, mm, n, k, bb, arch) for o in opts]
        np.testing.assert_allclose(row, want, rtol=1e-12, atol=0)
    assert estimate(opts[0], m, n, k, batch, arch) == got[0, 0]


@settings(max_examples=25, deadline=None)
@given(
    n=st.sampled_from([8, 64, 96, 768, 3072, 4099]),
    k=st.sampled_from([8, 63, 64, 1024, 4096]),
    hi=st.integers(1, 20000),
    max_configs=st.integers(1, 4),
)
@example(n=96, k=64, hi=16384, max_configs=3)  # equal estimates for two options (once a TypeError)
def test_dispatch_table(n: int, k: int, hi: int, max_configs: int) -> None:
    env = ShapeEnv()
    m = env.create_symbol("m", 1, hi)
    d = select(linear_call(m, n, k), env, max_configs=max_configs)
    *aligned, last = d.entries
    assert last.config == fallback(DType.FLOAT16) and last.pred is sympy.true
    assert len({e.config for e in aligned}) <= max_configs
    if k % 8 or n % 8:  # no vector access is possible: only the fallback
        assert aligned == []
        return
    assert aligned and all(e.config in candidates(DType.FLOAT16) for e in aligned)
    # key ranges tile [0, inf) in order; each entry's predicate is its alignment and its upper bound
    assert aligned[0].lo == 0 and aligned[-1].hi is None
    for a, b in itertools.pairwise(aligned):
        assert a.hi is not None and b.lo == a.hi + 1
    for mv in sorted({1, 2, hi // 2 + 1, hi}):
        chosen = next(e for e in d.entries if bool(e.pred.subs(m, mv)))
        key = mv * n
        assert chosen in aligned and chosen.lo <= key and (chosen.hi is None or key <= chosen.hi)


@needs_nvcc
def test_float32_gemms_of_a_cutlass_plan_run_on_cublas() -> None:
    """CUTLASS serves the dtypes verified on a GPU (configs.VERIFIED_DTYPES: float16, bfloat16); a float32
    plan's GEMMs go to cuBLAS and take no epilogue (on an H200 the float32 epilogue artifact returned
    NaN), unless BLADEPACK_CUTLASS_UNVERIFIED=1 asks for them."""
    from bladepack.backends import backend
    from bladepack.library_ops.cutlass.select import GemmPolicy
    from bladepack.options import CompileOptions
    from bladepack.target import Target

    options = CompileOptions.from_env(cutlass_unverified=False)
    lin = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU()).eval()
    m = torch.export.Dim("m", min=1, max=512)
    art = bladepack.optimize(
        lin, [(torch.randn(5, 64),)], ({0: m},), targets=("cuda:sm_90",), gemm_library="cutlass", options=options
    )
    manifest, _ = art._parts()
    assert [g["library"] for g in manifest["gemm_configs"]] == ["cublas"]
    assert not manifest["native_cuda"].get("gemm_kernels") and "epilogue" not in manifest["gemm_configs"][0]
    assert any("the float32 ones run on cuBLAS" in n for n in art.notes), art.notes
    target = Target.parse(("cuda:sm_90",))
    cuda = backend("cuda")
    policy, profiler = cuda.gemm_policy(GemmPolicy("cutlass"), target, options, [])
    if profiler is not None:
        profiler.close()
    assert policy.dtypes == {DType.FLOAT16, DType.BFLOAT16}
    unverified = CompileOptions.from_env(cutlass_unverified=True, gemm_tuning="model")
    policy, _ = cuda.gemm_policy(GemmPolicy("cutlass"), target, unverified, [])
    assert DType.FLOAT32 in policy.dtypes and DType.FLOAT64 in policy.dtypes


def test_static_gemm_gets_one_config() -> None:
    env = ShapeEnv()
    d = select(linear_call(4096, 4096, 4096), env)
    assert len(d.entries) == 2 and d.entries[0].pred is sympy.true  # the config, then the fallback


def test_kernel_source_instantiates_the_config() -> None:
    cfg = candidates(DType.FLOAT16)[0]
    inst = GemmInstance(cfg, False, True, "relu")
    src = kernel_source(inst)
    expected = (
        "using Gemm = cutlass::gemm::device::GemmUniversal<\n"
        "    cutlass::half_t, cutlass::layout::RowMajor, cutlass::half_t, cutlass::layout::ColumnMajor, "
        "cutlass::half_t, cutlass::layout::RowMajor, float,\n"
        "    cutlass::arch::OpClassTensorOp, cutlass::arch::Sm80,\n"
        "    cutlass::gemm::GemmShape<128, 256, 32>, cutlass::gemm::GemmShape<64, 64, 32>, "
        "cutlass::gemm::GemmShape<16, 8, 16>,\n"
        "    cutlass::epilogue::thread::LinearCombinationRelu<cutlass::half_t, 8, float, float>,\n"
        "    cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<4>, 3,\n"
        "    8, 8, cutlass::arch::OpMultiplyAdd>;\n"
    )
    assert expected in src
    assert f'extern "C" __global__ void __launch_bounds__({inst.name}_t::Kernel::kThreadCount, 1) {inst.name}(' in src
    assert f'extern "C" int bpk_pack_{inst.name}(' in packer_source([inst])


# --------------------------------------------------------------------------- on the fake driver


class _Mlp(torch.nn.Module):
    """Every GEMM with a different epilogue (Note [GEMM epilogue]): bias + ReLU, SiLU alone, a residual,
    a bias alone."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(64, 128)  # aligned: tensor cores
        self.deep = torch.nn.Linear(128, 2048, bias=False)
        self.down = torch.nn.Linear(2048, 64, bias=False)  # K = 2048: split-K when M is small
        self.odd = torch.nn.Linear(64, 63)  # N = 63: only the SIMT fallback

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = x + self.down(torch.nn.functional.silu(self.deep(torch.relu(self.up(x)))))
        return h, self.odd(h)


_EPILOGUES = {128: ("bias", "relu"), 2048: ("none", "silu"), 64: ("residual", "none"), 63: ("bias", "none")}


@pytest.fixture(scope="module")
def cutlass_artifact() -> bladepack.api.Artifact:
    require_cutlass()
    b = torch.export.Dim("b", min=1, max=8192)
    return bladepack.optimize(
        _Mlp().eval(),
        [(torch.randn(5, 64),)],
        ({0: b},),
        targets=("cpu", "cuda:sm_90"),
        dtype="float16",
        gemm_library="cutlass",
        options=CompileOptions.from_env(gemm_configs=1),  # one tensor-op config + the fallback: CI compile time
    )


@needs_nvcc
def test_cutlass_plan_and_inspect(cutlass_artifact: bladepack.api.Artifact) -> None:
    from bladepack.inspect import inspect_text, manifest_summary

    manifest, sections = cutlass_artifact._parts()
    rows = manifest["native_cuda"]["gemm_kernels"]
    names = {r["name"] for r in rows}
    assert any("tensorop" in n for n in names) and any("simt" in n for n in names)
    by_section = {s.name: s for s in sections}
    for r in rows:
        assert bytes(by_section[r["section"]].data[:4]) == b"\x50\xed\x55\xba"  # fatbin magic
    assert bytes(by_section[manifest["native_cuda"]["gemm_packer"]["section"]].data[:4]) == b"\x7fELF"
    text = inspect_text(manifest_summary(manifest))
    assert "via cutlass float16: M=b N=128 K=64" in text
    assert "otherwise: f16_simt_128x128x8_32x64x8_s2_a1" in text
    # the CPU plan's float16 GEMMs are listed too (library "blas")
    odd = next(g for g in manifest["gemm_configs"] if g["n"] == "63" and g["library"] == "cutlass")
    assert [e["config"] for e in odd["dispatch"]] == ["f16_simt_128x128x8_32x64x8_s2_a1"]
    # Note [GEMM epilogue]: every GEMM's add and activation run in its epilogue, no generated kernel is left
    for lr in manifest["native_cuda"]["launches"]:
        assert lr["op"] == "cutlass", lr
        n = int(lr["ints"][13])
        source, activation = _EPILOGUES[n]
        assert lr["epilogue"] == {"source": source, "activation": activation}
        assert len(lr["ptrs"]) == (3 if source == "none" else 4) and len(lr["ints"]) == (20 if source == "none" else 24)
        assert lr["ints"][20:] == ([] if source == "none" else [0, 0, 0, 0] if source == "bias" else [0, 0, 0, 64])
        kernels = manifest["native_cuda"]["gemm_kernels"]
        assert all(kernels[e["kernel"]]["activation"] == activation for e in lr["entries"])
    assert "epilogue: bias %" in text and " + relu -> %" in text


@needs_nvcc
def test_cutlass_launches_on_the_fake_driver(
    cutlass_artifact: bladepack.api.Artifact, tmp_path_factory: pytest.TempPathFactory
) -> None:
    gpu = FakeGpu(tmp_path_factory.mktemp("fake_gpu_cutlass"))
    batches = [1, 7, 300, 8192]
    cases = [(np.random.default_rng(b).standard_normal((b, 64)).astype(np.float16),) for b in batches]
    _, results, log = gpu.run(cutlass_artifact, cases)
    assert all(not isinstance(r, str) for r in results), results
    assert [r[0].shape for r in results] == [(b, 64) for b in batches]  # type: ignore[index]
    assert cutlass_artifact.plan.native_cuda is not None
    kernels = {r.name: r.to_manifest() for r in cutlass_artifact.plan.native_cuda.gemm_kernels}
    launches = [ln.split() for ln in log.splitlines() if ln.startswith("launch bpk_gemm_")]
    assert len(launches) == 4 * len(batches)  # four GEMMs per call
    seen_split = False
    for ln in launches:
        name = ln[1]
        grid, block, smem = [int(v) for v in ln[3:6]], int(ln[7]), int(ln[11])
        params = bytes.fromhex(ln[-1])
        m, n, k = struct.unpack_from("<3i", params)  # problem_size, then the tiled grid
        row = kernels[name]
        tm, tn, _ = row["tile"]
        assert m in batches and (n, k) in ((128, 64), (2048, 128), (64, 2048), (63, 64))
        tiles_m, tiles_n, slices = struct.unpack_from("<3i", params, 12)  # grid_tiled_shape
        assert (tiles_m, tiles_n) == (math.ceil(m / tm), math.ceil(n / tn))
        assert grid[0] * grid[1] == tiles_m * tiles_n and grid[2] == slices
        assert block == row["threads"] and smem > 0
        assert row["activation"] == _EPILOGUES[n][1]
        if n == 63:
            assert "simt" in name  # N = 63 is not a multiple of 8 halves
        if slices > 1:
            seen_split = True
            assert k == 2048 and m < 8192  # the deep GEMM, not at the largest M
    assert seen_split, "no GEMM ran split-K (K = 2048 at M = 1 should)"
    assert f"func_attribute {next(n for n in kernels if 'tensorop' in n)} 8" in log  # > 48 KiB shared memory


@needs_nvcc
def test_cutlass_launches_from_the_cpp_runtime(
    cutlass_artifact: bladepack.api.Artifact, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The C++ runtime's CUTLASS path (src/cuda_gemm.cpp) hands the driver what the Python loader does:
    per call the same kernels in the same order, grids, blocks, shared memory, Params sizes and problem /
    tiling words (the rest of the Params are addresses), the shared-memory opt-in, the same results."""
    from tests.cpp_build import BuildError

    gpu = FakeGpu(tmp_path_factory.mktemp("fake_gpu_cutlass_cpp"))
    batches = [1, 7, 300, 8192]
    cases = [(np.random.default_rng(b).standard_normal((b, 64)).astype(np.float16),) for b in batches]
    _, _, py_log = gpu.run(cutlass_artifact, cases)
    try:
        _, results, cpp_log = gpu.run_cpp(cutlass_artifact, cases)
    except BuildError as e:
        pytest.skip(f"cpp_runtime does not build here: {e}")
    assert all(not isinstance(r, str) for r in results), results

    def launches(log: str) -> list[tuple[str, ...]]:
        out = []
        for ln in log.splitlines():
            if ln.startswith("launch bpk_gemm_"):
                f = ln.split()
                params = bytes.fromhex(f[-1])
                out.append((*f[1:12], str(len(params)), params[:24].hex()))
        return out

    assert launches(cpp_log) == launches(py_log) and len(launches(py_log)) == 4 * len(batches)
    opt_in = sorted({ln for ln in py_log.splitlines() if ln.startswith("func_attribute")})
    assert opt_in and sorted({ln for ln in cpp_log.splitlines() if ln.startswith("func_attribute")}) == opt_in


@needs_nvcc
def test_cutlass_packer_takes_the_epilogue_source(cutlass_artifact: bladepack.api.Artifact, tmp_path: Path) -> None:
    """The packer puts C (the bias / residual) and beta into the Params: without a source C is D, beta 0."""
    import ctypes

    manifest, sections = cutlass_artifact._parts()
    plan = manifest["native_cuda"]
    data = next(s.data for s in sections if s.name == plan["gemm_packer"]["section"])
    (tmp_path / "packer.so").write_bytes(bytes(data))
    lib = ctypes.CDLL(str(tmp_path / "packer.so"))
    name = next(r["name"] for r in plan["gemm_kernels"] if r["activation"] == "relu" and "tensorop" in r["name"])
    pack = getattr(lib, f"bpk_pack_{name}")
    a, b, c, d = 0x7A0000, 0x7B0000, 0x7C0000, 0x7D0000

    def params(ldc: int, c_ptr: int, beta: float) -> bytes:
        ins = (ctypes.c_int64 * 13)(300, 128, 64, 1, 64, 64, ldc, 128, 0, 0, 0, 0, 0)
        ptrs = (ctypes.c_uint64 * 5)(a, b, c_ptr, d, 0)
        out, geometry = (ctypes.c_uint8 * 4096)(), (ctypes.c_int64 * 10)()
        rc = pack(ins, ptrs, (ctypes.c_double * 2)(1.0, beta), 132, out, 4096, geometry)
        assert rc == 0
        return bytes(out[: geometry[5]])

    def has(raw: bytes, ptr: int) -> bool:
        return struct.pack("<Q", ptr) in raw

    with_bias, plain = params(0, c, 1.0), params(128, d, 0.0)
    assert has(with_bias, c) and has(with_bias, d) and has(with_bias, a) and has(with_bias, b)
    assert not has(plain, c) and has(plain, d)
    one = struct.pack("<f", 1.0)
    assert with_bias.count(one) == plain.count(one) + 1  # beta 1 next to alpha 1


@pytest.mark.cuda
def test_cutlass_gemms_on_a_real_gpu() -> None:
    """Every catalogue config (Hopper ones on compute capability 9.0) and every packaged dispatch against
    torch.matmul over M from 1 to 16384 (odd values included), and every fused epilogue form against torch."""
    torch_cuda = pytest.importorskip("torch.cuda")
    if not torch_cuda.is_available():
        pytest.skip("no GPU")
    from bench.cutlass_gemm import check_configs, check_each_config, check_epilogues

    cache = Path(os.environ.get("BLADEPACK_CACHE_DIR", "/tmp/bladepack-cache"))
    failures = check_each_config(cache) + check_configs(cache) + check_epilogues(cache)
    assert not failures, failures


class _RecordingPack:
    """A packer entry that records what it was given and answers like CUTLASS."""

    def __init__(self, calls: list[tuple[str, list[int], list[int], float]], name: str, refuse: bool = False) -> None:
        self.calls, self.name, self.refuse = calls, name, refuse

    def __call__(self, cin: Any, cptrs: Any, scalars: Any, sms: int, params: Any, cap: int, geometry: Any) -> int:
        self.calls.append((self.name, list(cin), list(cptrs), float(scalars[1])))
        if self.refuse:
            return 1
        geometry[:] = [1, 1, 1, 128, 0, 64, 0, 1, 1, 1]
        return 0


def _stub_gemms(refuse_first: bool = False) -> tuple[Any, list[Any], list[str]]:
    from types import SimpleNamespace

    from bladepack.loader.cutlass_gemm import CutlassGemms

    calls: list[tuple[str, list[int], list[int], float]] = []
    launched: list[str] = []
    g = CutlassGemms.__new__(CutlassGemms)
    g.device = SimpleNamespace(info=SimpleNamespace(sm_count=132))  # type: ignore[assignment]
    g.names = ["tensorop", "simt"]
    g.hopper = False
    g.grid_constant = [False, False]
    g.pack = [_RecordingPack(calls, "tensorop", refuse_first), _RecordingPack(calls, "simt")]
    g.functions = [
        SimpleNamespace(launch_packed=lambda *a, n=n: launched.append(n))  # type: ignore[misc]
        for n in ("tensorop", "simt")
    ]
    g._local = threading.local()
    return g, calls, launched


def _launch_record(source: bool) -> dict[str, Any]:
    entries = [{"kernel": 0, "split": 1, "pred": 0, "align": 8}, {"kernel": 1, "split": 1, "pred": 1, "align": 1}]
    # batch (3, 2): A's and B's strides chain, D's outer dim is inner in memory, so the library runs the
    # 2 and the host loops over the 3 (loader/gemm_args.py)
    ints = [3, 2, 1, 200 * 64, 200 * 32, 0, 0, 0, 0, 200 * 64, 200 * 64 * 3, 0, 200, 64, 32, 0, 1, 32, 32, 64]
    if source:
        ints += [0, 0, 0, 0]  # a bias row
    return {"op": "cutlass", "dtype": "float16", "entries": entries, "ints": ints}


def test_cutlass_launch_falls_back_on_unaligned_addresses() -> None:
    """Alignment is proven for shapes, not for addresses: an operand address off the vector width runs
    the SIMT entry; the epilogue source goes in as C with beta 1, D as C with beta 0 without one."""
    lr = _launch_record(source=True)
    ptrs = ((1, 0), (2, 0), (0, 0), (3, 0))
    g, calls, launched = _stub_gemms()
    launch = g.prepare(lr, [1, 1], ptrs, tuple(lr["ints"]))
    assert launch.kernel == 0 and launch.fallback == 1 and launch.align_bytes == 16
    assert [s[2] for s in launch.steps] == [0, 200 * 64 * 2, 2 * 200 * 64 * 2] and {s[3] for s in launch.steps} == {0}
    g.launch(launch, 0x1000, 0x2000, 0x3000, 0x4000, stream=0)  # all 16-byte aligned
    assert launched == ["tensorop"] * 3
    assert calls[0][2][:4] == [0x1000, 0x2000, 0x4000, 0x3000] and calls[0][3] == 1.0
    assert calls[1][2][3] == 0x3000 + 200 * 64 * 2 and calls[1][2][2] == 0x4000  # D steps, the bias stays
    assert calls[0][1][6] == 0 and calls[0][1][7] == 64  # ldc 0 (bias row), ldd N
    for bad in ((0x1002, 0x2000, 0x3000, 0x4000), (0x1000, 0x2000, 0x3000, 0x4008)):  # A, then C, off by halves
        g, calls, launched = _stub_gemms()
        g.launch(launch, *bad, stream=0)
        assert launched == ["simt"] * 3, bad
    lr = _launch_record(source=False)
    g, calls, launched = _stub_gemms()
    launch = g.prepare(lr, [1, 1], ptrs[:3], tuple(lr["ints"]))
    g.launch(launch, 0x1000, 0x2000, 0x3000, None, stream=0)
    assert calls[0][2][2] == calls[0][2][3] == 0x3000 and calls[0][3] == 0.0
    g, calls, launched = _stub_gemms(refuse_first=True)  # CUTLASS refuses the problem: SIMT runs it
    g.launch(launch, 0x1000, 0x2000, 0x3000, None, stream=0)
    assert launched == ["simt"] * 3 and calls[0][0] == "tensorop" and calls[1][0] == "simt"


def test_measured_times_replace_the_cost_model() -> None:
    """Note [GEMM profiling]: `select` chooses from what `measure` reports; shapes no option ran at drop out;
    the samples' values are among the shapes weighed."""
    env = ShapeEnv()
    m = env.create_symbol("m", 1, 4096)
    call = linear_call(m, 128, 64)
    seen: list[int] = []
    slowest_model_pick = select(call, env, max_configs=1).entries[0].config

    def measure(c: GemmCall, options: Any, bindings: Any) -> list[list[float]]:
        seen.extend(int(b[m]) for b in bindings)
        return [[1.0 if o.config == slowest_model_pick else 9.0 for o in options] for _ in bindings]

    d = select(call, env, [{"m": 777}], max_configs=4, measure=measure)
    assert [e.config for e in d.entries] == [slowest_model_pick, fallback(DType.FLOAT16)]
    assert 777 in seen and len(seen) <= 24 and min(seen) == 1 and max(seen) == 4096
    other = next(c for c in candidates(DType.FLOAT16) if c != slowest_model_pick)
    d = select(
        call,
        env,
        max_configs=4,
        measure=lambda c, options, bindings: [[1.0 if o.config == other else 2.0 for o in options] for _ in bindings],
    )
    assert d.entries[0].config == other
    d = select(call, env, measure=lambda c, options, bindings: [[math.inf] * len(options) for _ in bindings])
    assert [e.config for e in d.entries] == [fallback(DType.FLOAT16)]  # nothing ran: the fallback alone


_PROFILE_SCRIPT = r"""
import json, sys, torch, bladepack
torch.manual_seed(0)
lin = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 128), torch.nn.Linear(128, 128)).eval()
m = torch.export.Dim("m", min=1, max=4096)
targets = tuple(f"cuda:{a}" for a in sys.argv[1:])
art = bladepack.optimize(lin, [(torch.randn(5, 64),)], ({0: m},), targets=targets, gemm_library="cutlass")
manifest, _ = art._parts()
print(json.dumps({"gemms": manifest["gemm_configs"], "notes": art.notes}))
"""


@needs_nvcc
def test_profiling_on_the_fake_driver(tmp_path: Path) -> None:
    """Note [GEMM profiling] end to end: the fake driver's simulated clock makes the 128x128 float32 config
    the fastest; the artifact's dispatch follows the measurement, not the cost model."""
    import json
    import subprocess
    import sys

    pytest.importorskip("cutlass_library")
    gpu = FakeGpu(tmp_path)
    fast = "f32_tensorop_3xtf32_128x128x16_64x64x16_s4_a4"  # the cost model picks 64x64 tiles for N = 128
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(tmp_path),
        "FAKE_CUDA_LOG": str(tmp_path / "cuda.log"),
        "FAKE_CUDA_KERNEL_US": "3xtf32_128x128=3,simt=1000",
        "BLADEPACK_GEMM_TUNING": "profile",
        "BLADEPACK_GEMM_CONFIGS": "4",
        "BLADEPACK_HOPPER_GEMMS": "1",  # the sm90 table is timed too (Note [Hopper GEMMs])
        "BLADEPACK_CUTLASS_UNVERIFIED": "1",  # float32 GEMMs on CUTLASS (configs.VERIFIED_DTYPES)
        "PYTHONPATH": str(Path(__file__).resolve().parent.parent),
    }
    script = [sys.executable, "-c", _PROFILE_SCRIPT, "sm_90", "sm_90a"]  # both tables (float32: sm80 configs)
    r = subprocess.run(script, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout.splitlines()[-1])
    for gemm in out["gemms"]:
        assert gemm["tuned_on"] == gemm["tuned_on_sm90"] == "Fake GPU 0 (sm_90)"
        assert [e["config"] for e in gemm["dispatch"]] == [fast, "f32_simt_128x128x8_32x64x8_s2_a1"]
        assert gemm["dispatch_sm90"] == gemm["dispatch"]
    assert any("profiling on Fake GPU 0" in n for n in out["notes"])
    log = (tmp_path / "cuda.log").read_text().splitlines()
    timed = [ln.split()[1] for ln in log if ln.startswith("launch bpk_gemm_")]
    assert len(set(timed)) == 3  # every float32 candidate ran
    # the two 128x128 layers are one problem, timed once: 24 shapes x (1 + 5 runs) x (3 configs at K = 64,
    # 3 configs x split-K 1 and 2 at K = 128); timing both would add 864 launches
    assert len(timed) == 24 * 6 * (3 + 6)
    assert log.count("module_unload") == 3 and log[-1] == "ctx_release 0"  # the profiler let everything go
    # on compute capability 8.0 the Hopper table is not profiled (it would hold sm_90a kernels): cost model
    r = subprocess.run(script, capture_output=True, text=True, env={**env, "FAKE_CUDA_CC": "80"})
    assert r.returncode == 0, r.stderr[-4000:]
    gemm = json.loads(r.stdout.splitlines()[-1])["gemms"][0]
    assert gemm["tuned_on"] == "Fake GPU 0 (sm_80)" and gemm["tuned_on_sm90"] == "cost model"
    env.pop("BLADEPACK_GEMM_TUNING")
    env["LD_LIBRARY_PATH"] = "/nonexistent"  # no driver: auto falls back to the cost model
    r = subprocess.run(script[:4], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    gemm = json.loads(r.stdout.splitlines()[-1])["gemms"][0]
    assert gemm["tuned_on"] == "cost model"
    assert fast not in [e["config"] for e in gemm["dispatch"]]
    del gpu


def test_dispatch_segments() -> None:
    """Note [GEMM dispatch segments]: noise-level alternation between options is one interval, a real
    crossover is two, no shape loses more than SHAPE_SLACK, equal keys stay together; a batched GEMM over
    two symbols gets a bounded table (it had ~90 entries alternating between two configs)."""
    from bladepack.library_ops.cutlass.select import MAX_SEGMENTS, _segments

    cfgs = candidates(DType.FLOAT16)
    a, b = Option(cfgs[0], 1), Option(cfgs[1], 1)
    keys = list(range(1, 101))
    jitter = [[1.0, 0.995] if k % 2 else [0.995, 1.0] for k in keys]
    assert _segments(keys, jitter, [a, b]) == [(1, 100, a)]
    step = [[1.0, 2.0] if k <= 40 else [2.0, 1.0] for k in keys]
    assert _segments(keys, step, [a, b]) == [(1, 40, a), (41, 100, b)]
    tied = [1, 1, 2, 2]  # the crossover falls inside key 1: both of its shapes take one option
    runs = _segments(tied, [[1.0, 2.0], [2.0, 1.0], [2.0, 1.0], [2.0, 1.0]], [a, b])
    assert [r[:2] for r in runs] in ([(1, 2)], [(1, 1), (2, 2)])
    env = ShapeEnv()
    bs, s = env.create_symbol("b", 1, 64), env.create_symbol("s", 1, 2048)
    table = select(bmm_call(bs, s, 64), env)
    assert 2 <= len(table.entries) <= MAX_SEGMENTS + 1


class _Layers(torch.nn.Module):
    """Four alike linear layers and one of another width."""

    def __init__(self) -> None:
        super().__init__()
        self.alike = torch.nn.ModuleList(torch.nn.Linear(64, 64) for _ in range(4))
        self.wide = torch.nn.Linear(64, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.alike:
            x = torch.relu(layer(x))
        return self.wide(x)


def test_a_plan_chooses_configs_once_per_distinct_gemm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [GEMM cost model]: the lowering selects each distinct GEMM's dispatch table once (a model's
    layers repeat theirs: BERT-base's 72 GEMMs are 4), and every layer gets that table. Stops after the
    plan: nothing is compiled."""
    from bladepack import stages
    from bladepack.lowering import lower_native

    seen: list[GemmCall] = []
    real = lower_native.select

    def spy(call: GemmCall, *args: Any, **kwargs: Any) -> Any:
        seen.append(call)
        return real(call, *args, **kwargs)

    monkeypatch.setattr(lower_native, "select", spy)
    monkeypatch.setattr(
        stages,
        "STAGES",
        tuple(
            s
            for s in stages.STAGES
            if s.name
            in ("front end", "precision", "graph passes", "shape guards", "fusion", "lowering", "memory plan", "plan")
        ),
    )
    b = torch.export.Dim("b", min=1, max=4096)
    art = bladepack.optimize(
        _Layers().eval(),
        [(torch.randn(5, 64),)],
        ({0: b},),
        targets=("cuda:sm_90",),
        dtype="float16",
        gemm_library="cutlass",
        options=CompileOptions.from_env(gemm_configs=2, gemm_tuning="model"),
    )
    assert sorted(c.n for c in seen) == [64, 128]
    # the key leaves out only which values the operands and the result are
    c = seen[0]
    assert selection_key(dataclasses.replace(c, a=dataclasses.replace(c.a, base=7), out=9)) == selection_key(c)
    assert selection_key(dataclasses.replace(c, a=dataclasses.replace(c.a, offset=4))) != selection_key(c)
    assert selection_key(c, "sm90") != selection_key(c)
    rows = art._parts()[0]["gemm_configs"]
    assert len(rows) == 5
    assert all(r["dispatch"] == rows[0]["dispatch"] for r in rows[:4])
    env = ShapeEnv()
    m = env.create_symbol("b", 1, 4096)
    for r, n in zip(rows, (64, 64, 64, 64, 128)):
        want = select(linear_call(m, n, 64), env, [{"b": 5}], max_configs=2)
        assert [e["config"] for e in r["dispatch"]] == [e.config.name for e in want.entries]
