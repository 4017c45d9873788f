"""Hopper (sm_90a) CUTLASS GEMMs: config space, the compute-capability-9.0 dispatch table, kernel and
packer sources, the packer's TMA descriptors through a recording encoder, and launches (clusters,
descriptors, per-arch dispatch) on the fake driver. Note [Hopper GEMMs] in library_ops/cutlass/emitter.py.
Numerics and speed need an H100 / H200 (`bench/cutlass_gemm.py`)."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import os
import struct
import subprocess
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
from bladepack.library_ops.cutlass.configs import candidates, check, fallback
from bladepack.library_ops.cutlass.emitter import GemmInstance, kernel_source, packer_source
from bladepack.library_ops.cutlass.select import Option, estimate, select
from tests.cuda_harness import FakeGpu, needs_nvcc, require_cutlass
from tests.gemm_calls import bmm_call, linear_call


def test_hopper_configs() -> None:
    names = set()
    for dt in (DType.FLOAT16, DType.BFLOAT16):
        cfgs = candidates(dt, "sm90")
        assert len(cfgs) >= 4
        for c in cfgs:
            check(c)
            assert c.arch == "sm90" and c.align == 8 and c.threads == 384 and c.name not in names
            names.add(c.name)
        assert {c.schedule for c in cfgs} == {"cooperative", "pingpong"}
        assert any(c.cluster != (1, 1, 1) for c in cfgs)
    assert candidates(DType.FLOAT32, "sm90") == ()  # no 3xTF32 wgmma: float32 stays on the sm80 configs
    bad = candidates(DType.FLOAT16, "sm90")[0]
    with pytest.raises(ValueError, match="not a Hopper config"):
        check(dataclasses.replace(bad, tile=(128, 128, 32)))  # 64 bytes of K: not one swizzle atom
    with pytest.raises(ValueError, match="arch 'sm75'"):
        candidates(DType.FLOAT16, "sm75")


def test_hopper_cost_model() -> None:
    """wgmma beats mma.sync where the tensor cores are the limit; skinny deep problems still split K."""
    both = (*candidates(DType.FLOAT16, "sm90"), *candidates(DType.FLOAT16))

    def best(m: int, n: int, k: int) -> Option:
        opts = [Option(c, s) for c in both for s in (1, 2, 4, 8, 16) if s == 1 or c.arch == "sm80"]
        return min(opts, key=lambda o: estimate(o, m, n, k, 1, "sm90"))

    assert best(8192, 4096, 4096).config.arch == "sm90"
    small = best(1, 768, 8192)
    assert small.config.arch == "sm80" and small.split > 1
    env = ShapeEnv()
    m = env.create_symbol("m", 1, 16384)
    d = select(linear_call(m, 4096, 4096), env, arch="sm90")
    assert d.entries[-1].config == fallback(DType.FLOAT16)
    assert d.entries[-2].config.arch == "sm90"  # the largest M bucket
    assert all(e.split == 1 for e in d.entries if e.config.arch == "sm90")
    assert select(linear_call(m, 4096, 4096), env).entries[0].config.arch == "sm80"  # the table for every GPU


def test_broadcast_batched_operands_stay_off_hopper() -> None:
    env = ShapeEnv()
    b, s = env.create_symbol("b", 1, 64), env.create_symbol("s", 1, 2048)
    ok = select(bmm_call(b, s, 64, broadcast_b=False), env, arch="sm90")
    assert any(e.config.arch == "sm90" for e in ok.entries)
    broadcast = select(bmm_call(b, s, 64, broadcast_b=True), env, arch="sm90")
    assert all(e.config.arch == "sm80" for e in broadcast.entries)


@settings(max_examples=20, deadline=None)
@given(
    n=st.sampled_from([8, 64, 768, 4096, 4100]),
    k=st.sampled_from([16, 64, 1024, 8192]),
    hi=st.integers(1, 20000),
    max_configs=st.integers(1, 4),
    dtype=st.sampled_from([DType.FLOAT16, DType.BFLOAT16, DType.FLOAT32]),
)
@example(n=4096, k=8192, hi=16384, max_configs=4, dtype=DType.FLOAT16)
def test_hopper_dispatch_table(n: int, k: int, hi: int, max_configs: int, dtype: DType) -> None:
    env = ShapeEnv()
    m = env.create_symbol("m", 1, hi)
    d = select(linear_call(m, n, k, dtype), env, max_configs=max_configs, arch="sm90")
    *aligned, last = d.entries
    assert last.config == fallback(dtype) and last.pred is sympy.true
    assert len({e.config for e in aligned}) <= max_configs
    allowed = {*candidates(dtype, "sm90"), *candidates(dtype)}
    assert all(e.config in allowed for e in aligned)
    assert all(e.split == 1 for e in aligned if e.config.arch == "sm90")  # serial split-K is sm80's
    if dtype is DType.FLOAT32:
        assert all(e.config.arch == "sm80" for e in aligned)
    if aligned:
        assert aligned[0].lo == 0 and aligned[-1].hi is None
        for a, b in itertools.pairwise(aligned):
            assert a.hi is not None and b.lo == a.hi + 1


def test_hopper_kernel_and_packer_text() -> None:
    cfg = next(c for c in candidates(DType.FLOAT16, "sm90") if c.cluster != (1, 1, 1))
    bias = GemmInstance(cfg, False, True, "gelu", "bias")
    residual = GemmInstance(cfg, False, False, "none", "residual")
    assert bias.name.endswith("_nt_gelu_bias") and residual.name.endswith("_nn_none_residual")
    k = kernel_source(bias)
    assert f"CUTLASS_GRID_CONSTANT {bias.name}_t::Kernel::Params const params" in k  # TMA descriptors in param space
    assert "KernelTmaWarpSpecializedCooperative" in k and "LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU" in k
    assert "cute::Shape<cute::_2, cute::_1, cute::_1>" in k
    assert "void, cutlass::layout::RowMajor, 8" in k  # no C is read: the bias is a vector
    r = kernel_source(residual)
    assert "LinCombEltAct<cutlass::epilogue::thread::Identity, cutlass::half_t, float, cutlass::half_t, float>" in r
    p = packer_source([bias, residual, GemmInstance(candidates(DType.FLOAT16)[0], False, True)])
    assert p.startswith("#define CUTLASS_ENABLE_DIRECT_CUDA_DRIVER_CALL 1")
    assert 'extern "C" CUresult CUDAAPI cuTensorMapEncodeTiled(' in p
    assert p.count('extern "C" int bpk_pack_') == 3
    assert "args.epilogue.thread.bias_ptr" in p and "args.epilogue.ptr_C" in p
    sm80_only = packer_source([GemmInstance(candidates(DType.FLOAT16)[0], False, True)])
    assert "cuTensorMapEncodeTiled" not in sm80_only  # an sm80-only packer is what it was


class _Mlp(torch.nn.Module):
    """x + W2 gelu(W1 x + b1): a bias + GELU epilogue and a residual one."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(128, 512)
        self.down = torch.nn.Linear(512, 128, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.fixture(scope="module")
def hopper_artifact() -> bladepack.api.Artifact:
    require_cutlass()
    b = torch.export.Dim("b", min=64, max=16384)
    # two configs per table + the fallback (CI compile time): each GEMM's sm90 table then has a wgmma
    # config for its large-M bucket, one of them with a 2-CTA cluster (the cost model's choice)
    from bladepack.options import CompileOptions

    return bladepack.optimize(
        _Mlp().eval(),
        [(torch.randn(80, 128),)],
        ({0: b},),
        targets=("cuda:sm_80", "cuda:sm_90", "cuda:sm_90a"),
        dtype="float16",
        gemm_library="cutlass",
        options=CompileOptions.from_env(gemm_configs=2),
    )


def _sections(art: bladepack.api.Artifact) -> tuple[dict[str, Any], dict[str, bytes]]:
    manifest, sections = art._parts()
    return manifest, {s.name: bytes(s.data) for s in sections}


@needs_nvcc
def test_hopper_plan_and_inspect(hopper_artifact: bladepack.api.Artifact) -> None:
    from bladepack.inspect import inspect_text, manifest_summary

    manifest, data = _sections(hopper_artifact)
    plan = manifest["native_cuda"]
    kernels = plan["gemm_kernels"]
    hopper = [r for r in kernels if r["arch"] == "sm_90a"]
    assert hopper and all(r["threads"] == 384 and "_wgmma_" in r["name"] for r in hopper)
    assert {r["source"] for r in hopper} == {"bias", "residual"}
    for r in kernels:
        assert data[r["section"]][:4] == b"\x50\xed\x55\xba"  # fatbin magic
    for lr in plan["launches"]:
        if lr["op"] != "cutlass":
            continue
        assert all(kernels[e["kernel"]]["arch"] == "sm_80" for e in lr["entries"])  # runs on every GPU
        table = [kernels[e["kernel"]] for e in lr["entries_sm90"]]
        assert table[-1]["name"].startswith("bpk_gemm_f16_simt_")  # any alignment, any GPU
        assert any(t["arch"] == "sm_90a" for t in table)
        source = lr["epilogue"]["source"]
        assert all(t["source"] == source for t in table if t["arch"] == "sm_90a")
    text = inspect_text(manifest_summary(manifest))
    assert text.count("on compute capability 9.0:") == 2
    assert "_wgmma_" in text


def _encoder() -> tuple[Any, list[tuple[int, list[int], list[int], list[int]]]]:
    calls: list[tuple[int, list[int], list[int], list[int]]] = []
    u64p, u32p = ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32)
    proto = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
        ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    )  # fmt: skip

    def encode(tmap: int, dtype: int, rank: int, addr: int, dims: Any, strides: Any, box: Any, *rest: int) -> int:
        calls.append((addr or 0, [dims[i] for i in range(rank)], [strides[i] for i in range(rank - 1)], [box[0]]))
        ctypes.memset(tmap, 0x5A, 128)
        return 0

    return proto(encode), calls


@needs_nvcc
def test_hopper_packer_builds_tma_descriptors(hopper_artifact: bladepack.api.Artifact, tmp_path: Path) -> None:
    """The packer encodes A, B, (C,) D through the loader's encoder with byte strides from the leading dims
    (an unbatched problem's batch stride is the matrix size, never 0) and refuses what TMA cannot do."""
    manifest, data = _sections(hopper_artifact)
    plan = manifest["native_cuda"]
    (tmp_path / "packer.so").write_bytes(data[plan["gemm_packer"]["section"]])
    lib = ctypes.CDLL(str(tmp_path / "packer.so"))
    by_source = {r["source"]: r for r in plan["gemm_kernels"] if r["arch"] == "sm_90a"}
    a, b, c, d = 0x7A0000, 0x7B0000, 0x7C0000, 0x7D0000

    def pack(name: str, ins: tuple[int, ...], encoder: Any) -> tuple[int, list[int], bytes]:
        lib.bpk_set_tensor_map_encoder(encoder)
        fn = getattr(lib, f"bpk_pack_{name}")
        out, geometry = (ctypes.c_uint8 * 4096)(), (ctypes.c_int64 * 10)()
        rc = fn(
            (ctypes.c_int64 * 13)(*ins),
            (ctypes.c_uint64 * 5)(a, b, c, d, 0),
            (ctypes.c_double * 2)(1.0, 1.0),
            132,
            out,
            4096,
            geometry,
        )
        return rc, list(geometry), bytes(out[: geometry[5]])

    encoder, calls = _encoder()
    m = 1000
    up = by_source["bias"]  # x [m, 128] @ W1[512, 128]^T + b1
    rc, geo, params = pack(up["name"], (m, 512, 128, 1, 128, 128, 0, 512, 0, 0, 0, 0, 0), encoder)
    assert rc == 0, rc
    assert struct.unpack_from("<5i", params) == (0, m, 512, 128, 1)  # mode kGemm, then the problem shape
    assert [call[0] for call in calls] == [a, b, d]  # no C descriptor: the bias is read as a vector
    assert calls[0][1:3] == ([128, m, 1], [256, 256 * m])  # A: K contiguous, ld 128 halves
    assert calls[1][1:3] == ([128, 512, 1], [256, 256 * 512])  # B stored [N, K]
    assert calls[2][1:3] == ([512, m, 1], [1024, 1024 * m])  # D [m, 512]
    assert struct.pack("<Q", c) in params  # the bias pointer
    tiles = -(-m // up["tile"][0]) * -(-512 // up["tile"][1])
    cluster = up["cluster"]
    assert geo[3] == 384 and geo[4] > 48 * 1024 and geo[7:10] == cluster
    assert geo[0] * geo[1] * geo[2] <= max(tiles, 132) and geo[0] % cluster[0] == 0 and geo[1] % cluster[1] == 0
    down = by_source["residual"]  # 12 batches of [m, 512] @ [128, 512]^T + residual, batched this time
    assert down["tb"]
    calls.clear()
    ins = (m, 128, 512, 12, 512, 512, 128, 128, m * 512, 128 * 512, m * 128, m * 128, 1)
    rc, geo, params = pack(down["name"], ins, encoder)
    assert rc == 0, rc
    assert struct.unpack_from("<5i", params) == (2, m, 128, 512, 12)  # kBatched
    assert [call[0] for call in calls] == [a, b, c, d]
    assert calls[0][1:3] == ([512, m, 12], [1024, 1024 * m])  # the batch strides as given, in bytes
    assert calls[1][1:3] == ([512, 128, 12], [1024, 1024 * 128])
    assert calls[2][1:3] == ([128, m, 12], [256, 256 * m])  # C, the residual
    # refused: serial split-K, a broadcast batch, a leading dim off 16 bytes; no encoder handed over
    assert pack(down["name"], (m, 128, 512, 2, 512, 128, 128, 128, 0, 0, 0, 0, 0), encoder)[0] == 1
    assert pack(down["name"], (*ins[:9], 0, *ins[10:]), encoder)[0] == 1
    assert pack(up["name"], (m, 512, 128, 1, 130, 128, 0, 512, 0, 0, 0, 0, 0), encoder)[0] == 1
    assert pack(up["name"], (m, 512, 128, 1, 128, 128, 0, 512, 0, 0, 0, 0, 0), None)[0] == 3


@needs_nvcc
def test_hopper_launches_on_the_fake_driver(
    hopper_artifact: bladepack.api.Artifact, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On compute capability 9.0 with BLADEPACK_HOPPER_GEMMS=1 the Hopper entries run: the driver's encoder
    builds the descriptors, a cluster launches through cuLaunchKernelEx; without it (the default: Note
    [Hopper GEMMs]) and on 8.0 the sm_90a kernels are not even loaded."""
    gpu = FakeGpu(tmp_path_factory.mktemp("fake_gpu_hopper"))
    batches = [64, 77, 4096, 16384]
    cases = [(np.random.default_rng(b).standard_normal((b, 128)).astype(np.float16),) for b in batches]
    manifest, _ = _sections(hopper_artifact)
    kernels = {r["name"]: r for r in manifest["native_cuda"]["gemm_kernels"]}
    monkeypatch.delenv("BLADEPACK_HOPPER_GEMMS", raising=False)
    for cc in ("90", "80"):
        _, results, log = gpu.run(hopper_artifact, cases, cc=cc)
        assert all(not isinstance(r, str) for r in results), results
        ran = {ln.split()[1] for ln in log.splitlines() if ln.startswith("launch bpk_gemm_")}
        assert ran and all(kernels[n]["arch"] == "sm_80" for n in ran)
        assert "tensor_map" not in log and "_wgmma_" not in log  # nothing Hopper was loaded
    monkeypatch.setenv("BLADEPACK_HOPPER_GEMMS", "1")
    _, results, log = gpu.run(hopper_artifact, cases, cc="90")
    assert all(not isinstance(r, str) for r in results), results
    launches = [ln.split() for ln in log.splitlines() if ln.startswith("launch bpk_gemm_")]
    assert len(launches) == 2 * len(batches)
    hopper_launches = [ln for ln in launches if kernels[ln[1]]["arch"] == "sm_90a"]
    assert hopper_launches, "no Hopper kernel ran on compute capability 9.0"
    assert any(kernels[ln[1]]["cluster"] != [1, 1, 1] for ln in hopper_launches)  # a 2-CTA cluster ran
    maps = [ln.split() for ln in log.splitlines() if ln.startswith("tensor_map ")]
    assert len(maps) >= 3 * len(hopper_launches)  # A, B, D (and C) per launch, packed anew
    for ln in maps:
        strides = [int(v) for v in ln[ln.index("strides") + 1 : ln.index("box")]]
        assert all(s > 0 and s % 16 == 0 for s in strides), ln
    for ln in hopper_launches:
        cluster = kernels[ln[1]]["cluster"]
        grid = [int(v) for v in ln[3:6]]
        assert int(ln[7]) == 384 and all(g % c == 0 for g, c in zip(grid, cluster))
        if cluster != [1, 1, 1]:
            assert f"launch_ex {ln[1]} cluster {cluster[0]} {cluster[1]} {cluster[2]}" in log
        assert f"func_attribute {ln[1]} 8" in log  # the mainloop's stages exceed 48 KiB
    for ln in launches:  # Note [Grid-constant parameters]: the Hopper Params go through kernelParams
        assert ln[ln.index("params") + 1] == ("array" if ln in hopper_launches else "none"), ln
    _, results, log = gpu.run(hopper_artifact, cases, cc="80")
    assert all(not isinstance(r, str) for r in results), results
    assert "tensor_map" not in log and "_wgmma_" not in log  # 8.0 ignores the switch


@needs_nvcc
def test_hopper_launches_from_the_cpp_runtime(
    hopper_artifact: bladepack.api.Artifact, tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The C++ runtime on compute capability 9.0 (Hopper GEMMs switched on, and off) and 8.0: the same
    kernels, geometry, cluster launches and TMA descriptors (but their addresses) as the Python loader,
    call for call, and the same shared-memory opt-ins."""
    from tests.cpp_build import BuildError

    gpu = FakeGpu(tmp_path_factory.mktemp("fake_gpu_hopper_cpp"))
    batches = [64, 77, 4096, 16384]
    cases = [(np.random.default_rng(b).standard_normal((b, 128)).astype(np.float16),) for b in batches]

    def driver_calls(log: str) -> list[str]:
        out = []
        for ln in log.splitlines():
            f = ln.split()
            if ln.startswith("launch bpk_gemm_"):
                out.append(" ".join(f[:12] + f[14:16]))  # with how the parameters were passed
            elif ln.startswith("launch_ex "):
                out.append(ln)
            elif ln.startswith("tensor_map "):
                out.append(" ".join(f[:5] + f[7:]))  # without "addr N"
        return out

    for cc, switch in (("90", "1"), ("90", "0"), ("80", "1")):
        monkeypatch.setenv("BLADEPACK_HOPPER_GEMMS", switch)
        _, _, py_log = gpu.run(hopper_artifact, cases, cc=cc, graphs=False)
        try:
            _, cpp_results, cpp_log = gpu.run_cpp(hopper_artifact, cases, cc=cc, graphs=False, calls=1)
        except BuildError as e:
            pytest.skip(f"cpp_runtime does not build here: {e}")
        assert all(not isinstance(r, str) for r in cpp_results), cpp_results
        assert driver_calls(cpp_log) == driver_calls(py_log), cc
        opt_in = {ln for ln in py_log.splitlines() if ln.startswith("func_attribute ")}  # once per process
        assert {ln for ln in cpp_log.splitlines() if ln.startswith("func_attribute ")} == opt_in
        hopper = cc == "90" and switch == "1"
        assert ("launch_ex" in cpp_log) == hopper and ("tensor_map" in cpp_log) == hopper, (cc, switch)


@pytest.mark.cuda
def test_hopper_gemms_on_a_real_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On compute capability 9.0 with BLADEPACK_HOPPER_GEMMS=1 (Note [Hopper GEMMs]): artifacts built
    for cuda:sm_90a too dispatch their Hopper tables — the bucketed linear layers and every fused
    epilogue form (bias + ReLU / GELU, SiLU, residual, bias) against torch over the M sweep through the
    Python loader, and the C++ runtime's bpk-run on the float16 epilogue artifact equal to the Python
    loader."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a GPU of compute capability 9.0")
    from bench.cutlass_gemm import check_configs, check_epilogues, epilogue_block
    from tests.cpp_build import BuildError, build
    from tests.helpers import rel_err

    monkeypatch.setenv("BLADEPACK_HOPPER_GEMMS", "1")
    cache = Path(os.environ.get("BLADEPACK_CACHE_DIR", "/tmp/bladepack-cache"))
    failures = check_configs(cache) + check_epilogues(cache)
    assert not failures, failures
    _, art = epilogue_block(torch.float16)
    manifest, _ = _sections(art)
    assert any(r["arch"] == "sm_90a" for r in manifest["native_cuda"]["gemm_kernels"])
    path = tmp_path / "e.bpk"
    art.save(path)
    try:
        bpk_run = build("release") / "bpk-run"
    except BuildError as e:
        pytest.skip(f"cpp_runtime does not build here: {e}")
    m = bladepack.load(path, device="cuda", graphs=False)
    name, out_name = art.plan.inputs[0].name, art.plan.outputs[0].name
    for rows in (1, 77, 4096):
        x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float16)
        np.save(tmp_path / f"x{rows}.npy", x)
        out = tmp_path / f"out{rows}"
        out.mkdir()
        r = subprocess.run(
            [
                str(bpk_run),
                str(path),
                "--device",
                "cuda",
                "--input",
                f"{name}={tmp_path / f'x{rows}.npy'}",
                "--output-dir",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        want = m(x)
        want = want[0] if isinstance(want, (tuple, list)) else want
        assert rel_err(np.load(out / f"{out_name}.npy").astype(np.float32), np.asarray(want).astype(np.float32)) <= 1e-6
