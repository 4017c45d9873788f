"""Note [cuBLASLt GEMMs] (loader/cublaslt.py): optimize(..., gemm_library="cublaslt") runs each GEMM with
its bias / residual add and ReLU or tanh-GELU through cublasLtMatmul. On the fake driver and the fake
cuBLASLt (tests/fake_cuda/fake_libcublaslt.c: strict about attribute ids and sizes, layouts that chain,
the bias pointer, the workspace and the alignment the heuristic query promised), in both loaders,
against eager at dynamic shapes including 1 and odd sizes; the plan and the fake's log say which
epilogues were fused."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest
import torch

import bladepack
from bladepack.loader.cublaslt import alignment, epilogue_code
from tests.cuda_harness import FakeGpu
from tests.helpers import rel_err

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found (CUDA targets need it)")


class _Block(torch.nn.Module):
    """Every epilogue form cuBLASLt takes, one it must not (erf GELU), a batched product of two
    activations and a GEMM whose output is the model's."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(24, 40)  # bias + ReLU
        self.mid = torch.nn.Linear(40, 40)  # bias + tanh GELU
        self.gate = torch.nn.Linear(40, 40, bias=False)  # + residual, then ReLU
        self.erf = torch.nn.Linear(40, 24)  # bias, then an erf GELU the kernel computes
        self.out = torch.nn.Linear(24, 24, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.up(x))
        g = torch.nn.functional.gelu(self.mid(h), approximate="tanh")
        r = torch.relu(self.gate(g) + h)
        e = torch.nn.functional.gelu(self.erf(r))
        scores = e @ e.transpose(-1, -2)  # [b, s, s]: activation x activation, library-batched
        return self.out(e), scores


@pytest.fixture(scope="module")
def model() -> _Block:
    torch.manual_seed(0)
    return _Block().eval()


@pytest.fixture(scope="module")
def artifact(model: _Block) -> bladepack.api.Artifact:
    b, s = torch.export.Dim("b", min=1, max=16), torch.export.Dim("s", min=1, max=128)
    return bladepack.optimize(
        model,
        [(torch.randn(2, 9, 24),)],
        ({0: b, 1: s},),
        targets=("cuda:sm_90",),
        gemm_library="cublaslt",
        reference_cases=False,
    )


_SHAPES = ((1, 1), (2, 9), (3, 17), (1, 128), (16, 5))


def _cases() -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(1)
    return [(rng.standard_normal((b, s, 24), dtype=np.float32),) for b, s in _SHAPES]


def _launches(a: bladepack.api.Artifact) -> list[dict[str, Any]]:
    manifest, _ = a._parts()
    return [lr for lr in manifest["native_cuda"]["launches"] if lr["op"] in ("gemm", "cublaslt", "cutlass")]


def test_the_plan_fuses_what_cublaslt_computes(artifact: bladepack.api.Artifact) -> None:
    """Bias + ReLU, bias + tanh GELU and residual + ReLU become epilogues; the erf GELU does not (only
    its bias does); every GEMM is a cublaslt launch."""
    launches = _launches(artifact)
    assert {lr["op"] for lr in launches} == {"cublaslt"}
    forms = sorted(
        (lr["epilogue"]["source"], lr["epilogue"]["activation"]) if "epilogue" in lr else ("none", "none")
        for lr in launches
    )
    assert forms == sorted(
        [
            ("bias", "relu"),
            ("bias", "gelu_tanh"),
            ("residual", "relu"),
            ("bias", "none"),
            ("none", "none"),
            ("none", "none"),
        ]
    )
    from bladepack.inspect import inspect_text, manifest_summary

    text = inspect_text(manifest_summary(artifact._parts()[0]))
    assert text.count(" via cublaslt float32") == 6
    assert text.count("chosen by: cuBLASLt's heuristic") == 6
    assert "epilogue: bias %" in text and "+ gelu_tanh ->" in text and "epilogue: residual %" in text
    for lr in launches:
        sourced = "epilogue" in lr and lr["epilogue"]["source"] != "none"
        assert len(lr["ptrs"]) == (4 if sourced else 3) and len(lr["ints"]) == (24 if sourced else 20)


def test_cublaslt_gemms_match_eager(gpu: FakeGpu, model: _Block, artifact: bladepack.api.Artifact) -> None:
    cases = _cases()
    executor, results, log = gpu.run(artifact, cases, graphs=False)
    assert executor.startswith("cuda")
    for (x,), got in zip(cases, results):
        assert not isinstance(got, str), got
        with torch.no_grad():
            want = model(torch.from_numpy(x))
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            assert rel_err(g, w.numpy()) < 1e-5
    lines = [line for line in log.splitlines() if line.startswith("ltmatmul")]
    assert len(lines) == 6 * len(cases)
    # bias + ReLU is epilogue 6, bias + GELU 36, a residual is beta 1 with ReLU (2)
    assert any(" epilogue 6 beta 0 " in line for line in lines)
    assert any(" epilogue 36 beta 0 " in line for line in lines)
    assert any(" epilogue 2 beta 1 " in line for line in lines)
    assert not any(" epilogue 32 " in line or " epilogue 34 " in line for line in lines)


def test_graph_replays_match_the_first_call(gpu: FakeGpu, artifact: bladepack.api.Artifact) -> None:
    """The third call of a signature replays its CUDA graph (cuBLASLt calls captured with the caller
    stream's workspace)."""
    cases = _cases()[:3]
    _, first, _ = gpu.run(artifact, cases, graphs=False)
    _, replayed, log = gpu.run(artifact, cases, graphs=True, calls=3)
    for a, b in zip(first, replayed):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert "graph_launch" in log


def test_the_cpp_runtime_runs_them_alike(gpu: FakeGpu, artifact: bladepack.api.Artifact) -> None:
    cases = _cases()
    _, py, _ = gpu.run(artifact, cases, graphs=False)
    executor, cpp, log = gpu.run_cpp(artifact, cases)
    assert executor.startswith("cuda")
    for a, b in zip(py, cpp):
        assert not isinstance(b, str), b
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    assert "ltmatmul" in log


def test_half_precision_epilogues(gpu: FakeGpu, model: _Block) -> None:
    """A float16 plan: act(A.B + bias) in float32, rounded once, within float16's tolerance of eager."""
    b, s = torch.export.Dim("b", min=1, max=16), torch.export.Dim("s", min=1, max=128)
    art = bladepack.optimize(
        model,
        [(torch.randn(2, 9, 24),)],
        ({0: b, 1: s},),
        targets=("cuda:sm_90",),
        dtype="float16",
        gemm_library="cublaslt",
        reference_cases=False,
    )
    assert {lr["op"] for lr in _launches(art)} == {"cublaslt"}
    assert sum("epilogue" in lr for lr in _launches(art)) == 4
    cases = [(x.astype(np.float16),) for (x,) in _cases()[:3]]
    _, results, log = gpu.run(art, cases, graphs=False)
    assert " type 2 " in log  # CUDA_R_16F operands
    for (x,), got in zip(cases, results):
        assert not isinstance(got, str), got
        with torch.no_grad():
            want = model(torch.from_numpy(x.astype(np.float32)))
        for g, w in zip(got, want):
            assert g.dtype == np.float16
            assert rel_err(g.astype(np.float32), w.numpy()) < 5e-3


@pytest.mark.parametrize("name", ["mlp", "encoder", "llama", "cnn"])
def test_samples_with_cublaslt(gpu: FakeGpu, name: str) -> None:
    """The project's samples (an MLP, a transformer encoder, a LLaMA decode step, a CNN whose im2col
    convolutions are GEMMs too) with every GEMM on cuBLASLt: eager within 1e-4 at their test shapes."""
    from samples.registry import SAMPLES
    from tests.helpers import as_tuple, refused_by_torch

    s = SAMPLES[name]
    model = s.build().eval()
    art = bladepack.optimize(
        model, s.export_samples(), s.dynamic_shapes, targets=("cuda:sm_90",), gemm_library="cublaslt"
    )
    assert {lr["op"] for lr in _launches(art)} <= {"cublaslt"}
    g = torch.Generator().manual_seed(7)
    cases = [s.make_inputs(g, **dims) for dims in s.test_cases()]
    _, results, log = gpu.run(art, [tuple(a.numpy() for a in c) for c in cases])
    assert "ltmatmul" in log or not _launches(art)
    for dims, args, out in zip(s.test_cases(), cases, results):
        if isinstance(out, str) and refused_by_torch(art.notes, out):
            continue
        assert not isinstance(out, str), f"{dims}: {out}"
        with torch.no_grad():
            want = [o.numpy() for o in as_tuple(model(*args))]
        for o, r in zip(out, want):
            assert rel_err(o, r) <= 1e-4, f"{name} at {dims}: relative error {rel_err(o, r):.3g}"


def test_the_descriptor_cache_is_bounded(gpu: FakeGpu, monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Prepared shapes beyond PLANS_MAX empty the cache; a plan a prepared launch still holds keeps its
    descriptors, and every one is destroyed once nothing holds it (a prefill over many lengths must
    not grow the loader without bound)."""
    import gc

    from bladepack.loader import cublaslt
    from bladepack.loader.gemm_args import gemm_args
    from bladepack.options import LoaderOptions

    log = tmp_path / "lt.log"
    monkeypatch.setenv("FAKE_CUDA_LOG", str(log))
    monkeypatch.setattr(cublaslt, "PLANS_MAX", 8)
    # no workspace is asked for (nothing launches), so no device is needed
    lt = cublaslt.CublasLt(None, LoaderOptions(cublaslt=str(gpu.root / "libcublasLt.so")))  # type: ignore[arg-type]
    lr = {"dtype": "float32", "ptrs": [[0, 0]] * 3}

    def record(m: int) -> list[int]:
        return [1, 1, 1, *([0] * 9), m, 16, 8, 0, 0, 8, 16, 16]

    held = [lt.prepare(lr, gemm_args(record(m), 4)) for m in range(1, 21)]
    assert len(lt._plans) <= 8
    assert lt.prepare(lr, gemm_args(record(20), 4)).plan is held[-1].plan  # a cached shape: the same plan
    lines = log.read_text().splitlines()
    assert lines.count("lt_desc_create") == 20 and "lt_desc_destroy" not in lines
    del held
    gc.collect()
    lines = log.read_text().splitlines()
    assert lines.count("lt_desc_destroy") == 20 - len(lt._plans)
    lt.close()
    gc.collect()
    assert log.read_text().splitlines().count("lt_desc_destroy") == 20


def test_epilogue_codes_and_alignment() -> None:
    """cublasLtEpilogue_t of each form (cublasLt.h: DEFAULT 1, RELU 2, BIAS 4, RELU_BIAS 6, GELU 32,
    GELU_BIAS 36) and the alignment an address promises."""
    assert [epilogue_code(s, a) for s in ("none", "bias", "residual") for a in ("none", "relu", "gelu_tanh")] == [
        1,
        2,
        32,
        4,
        6,
        36,
        1,
        2,
        32,
    ]
    assert [alignment(x) for x in (0, 1, 2, 6, 16, 48, 256, 512, 4096 + 128)] == [256, 1, 2, 2, 16, 16, 256, 256, 128]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cublaslt_gemms_on_a_real_gpu(model: _Block, dtype: str, tmp_path: Any) -> None:
    """On a GPU with libcublasLt: the block against a float64 reference, no further than torch in the same
    dtype (within 2x), at the shapes above and a large one, from torch tensors (graphs on) and numpy."""
    torch_cuda = pytest.importorskip("torch.cuda")
    if not torch_cuda.is_available():
        pytest.skip("no GPU")
    b, s = torch.export.Dim("b", min=1, max=16), torch.export.Dim("s", min=1, max=512)
    tdt = getattr(torch, dtype)
    art = bladepack.optimize(
        model,
        [(torch.randn(2, 9, 24),)],
        ({0: b, 1: s},),
        targets=("cuda",),
        dtype=None if dtype == "float32" else dtype,
        gemm_library="cublaslt",
        reference_cases=False,
    )
    art.save(tmp_path / "lt.bpk")
    loaded = bladepack.load(tmp_path / "lt.bpk", device="cuda")
    ours_model = _Block().eval().to("cuda", tdt).requires_grad_(False)
    ours_model.load_state_dict(model.state_dict())
    ref = _Block().eval().to("cuda", torch.float64).requires_grad_(False)
    ref.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    for bb, ss in (*_SHAPES, (16, 512)):
        x = torch.randn(bb, ss, 24, device="cuda", dtype=tdt)
        for _ in range(3):  # the third call replays the signature's CUDA graph
            got = loaded(x)
        for g, w, t in zip(got, ref(x.double()), ours_model(x)):
            scale = w.abs().max().clamp_min(1e-30)
            ours, theirs = float((g.double() - w).abs().max() / scale), float((t.double() - w).abs().max() / scale)
            assert ours <= 2 * theirs + (1e-5 if dtype == "float32" else 1e-3), (bb, ss, ours, theirs)


def _edit(art: bladepack.api.Artifact, edit: Any) -> bytes:
    import copy

    from bladepack.artifact import format as bpk_format

    bpk = bpk_format.read(art.to_bytes())
    sections = [bpk_format.Section(n, bytes(bpk.section(n))) for n in bpk.section_names]
    manifest = copy.deepcopy({k: v for k, v in bpk.manifest.items() if k != "sections"})
    edit(next(lr for lr in manifest["native_cuda"]["launches"] if lr["op"] == "cublaslt" and "epilogue" in lr))
    return b"".join(bytes(c) for c in bpk_format.encode(manifest, sections))


_CORRUPT = {
    "activation swish": (lambda lr: lr["epilogue"].__setitem__("activation", "swish"), "has epilogue"),
    "activation exact gelu": (lambda lr: lr["epilogue"].__setitem__("activation", "gelu"), "cuBLASLt computes no gelu"),
    "source dropped": (lambda lr: lr["ptrs"].pop(), "a cuBLASLt GEMM has a fourth operand and four more integers"),
    "epilogue dropped": (lambda lr: lr.pop("epilogue"), "a cuBLASLt GEMM has a fourth operand and four more integers"),
}


@pytest.mark.parametrize("name", sorted(_CORRUPT))
def test_corrupt_cublaslt_records_are_refused(gpu: FakeGpu, artifact: bladepack.api.Artifact, name: str) -> None:
    """Both loaders refuse, at load, a cublaslt record whose epilogue cuBLASLt cannot compute or whose
    operands do not match it, in the same words (the Python plan check; the C++ runtime's manifest
    parser)."""
    import subprocess

    from bladepack.artifact import format as bpk_format
    from bladepack.errors import BpkFormatError
    from bladepack.loader.manifest import Manifest
    from bladepack.loader.plan_check import check_plan
    from tests.cpp_build import build

    edit, message = _CORRUPT[name]
    data = _edit(artifact, edit)
    with pytest.raises(BpkFormatError, match=message):
        check_plan(Manifest.read(bpk_format.read(data)), "cuda", None)
    path = gpu.root / f"corrupt-{name.replace(' ', '_')}.bpk"
    path.write_bytes(data)
    env = gpu._env(artifact, gpu.root / "corrupt.log", "90")
    r = subprocess.run(
        [str(build("release") / "bpk-run"), str(path), "--device", "cuda"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 1 and "corrupt plan: launch 0" in r.stderr, r.stderr
    assert message in r.stderr, r.stderr
