"""The C++ runtime's CUDA path without a GPU: `bpk-run --device cuda` and the C ABI on the fake driver,
with the generated kernels emulated (tests/cuda_harness.py: `FakeGpu.run_cpp`), against the Python
loader's CUDA path on the same fake.

What must hold: every sample's outputs bit-identical between the two at shapes including 1, odd sizes
and range ends, with CUDA graphs on (the third call of a signature replays its graph) and off; the
same launches (kernel, grid, block, shared memory) in the same order; the same
error texts (shape guards, input errors, index errors from a kernel, device and image errors); 8
threads on their own streams equal to serial calls bit for bit; ASan + UBSan clean.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import bladepack
from samples.registry import SAMPLES
from tests.cpp_build import BuildError, build
from tests.cuda_harness import FakeGpu
from tests.helpers import narrowed, refused_by_torch
from tests.test_cuda_backend import TARGETS, _ConvPool, _Ops

pytestmark = pytest.mark.skipif(
    os.environ.get("NVCC") is None and subprocess.run(["which", "nvcc"], capture_output=True).returncode != 0,
    reason="nvcc not found (CUDA targets need it)",
)


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> FakeGpu:
    try:
        build("release")
    except BuildError as e:
        pytest.skip(f"cpp_runtime does not build here: {e}")
    return FakeGpu(tmp_path_factory.mktemp("fake_gpu_cpp"))


def _same(a: list[Any], b: list[Any]) -> list[str]:
    """Where two result lists differ (arrays bit for bit, dtype and shape; error texts exactly)."""
    problems = []
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(x, str) or isinstance(y, str):
            if x != y:
                problems.append(f"case {k}: {x!r} != {y!r}")
            continue
        for j, (u, v) in enumerate(zip(x, y, strict=True)):
            if u.dtype != v.dtype or u.shape != v.shape or not np.array_equal(u, v, equal_nan=True):
                problems.append(f"case {k} output {j}: {u.dtype}{u.shape} vs {v.dtype}{v.shape}, not bit-identical")
    return problems


def _launches(log: str) -> list[str]:
    """The fake driver's launch lines without the argument bytes (addresses differ between processes)."""
    return [" ".join(ln.split()[:12]) for ln in log.splitlines() if ln.startswith("launch ")]


@pytest.mark.parametrize("name", ["mlp", "encoder", "llama", "cnn"])
def test_samples_match_the_python_cuda_path(gpu: FakeGpu, name: str) -> None:
    s = SAMPLES[name]
    art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS)
    g = torch.Generator().manual_seed(5)
    cases = [tuple(a.numpy() for a in s.make_inputs(g, **d)) for d in s.test_cases() if not narrowed(art, d)]
    py_exe, py_out, py_log = gpu.run(art, cases, graphs=False)
    cpp_exe, cpp_out, cpp_log = gpu.run_cpp(art, cases, graphs=False, calls=1)
    assert cpp_exe == py_exe
    assert not [r for r in cpp_out if isinstance(r, str)], cpp_out
    assert _same(py_out, cpp_out) == []
    assert _launches(cpp_log) == _launches(py_log)
    # graphs: call 1 launches, call 2 captures and launches the graph, call 3 only launches it (on the
    # smaller half of the cases, size 1 and odd sizes among them: three emulated calls of the largest
    # would take minutes)
    small = sorted(sorted(range(len(cases)), key=lambda k: sum(a.size for a in cases[k]))[: max(3, len(cases) // 2)])
    cases = [cases[k] for k in small]
    py_out = [py_out[k] for k in small]
    _, _, py_log = gpu.run(art, cases, graphs=False)
    _, graph_out, graph_log = gpu.run_cpp(art, cases, graphs=True, calls=3)
    assert _same(py_out, graph_out) == []
    kernels = len(_launches(py_log))
    lines = graph_log.splitlines()
    assert sum(ln.startswith("launch ") for ln in lines) == kernels
    assert sum(ln.startswith("capture_launch ") for ln in lines) == kernels
    assert sum(ln.startswith("graph_launch ") for ln in lines) == 2 * len(cases)
    assert sum(ln.startswith("graph_instantiate ") for ln in lines) == len(cases)


def test_op_table_and_errors_match(gpu: FakeGpu) -> None:
    """Every CUDA schedule (loops, warp / block rows, the row cache, scans, gathers, concat / pad), a
    kernel's index error, shape guards and input errors: the same results and texts."""
    b, n = torch.export.Dim("b", min=1, max=64), torch.export.Dim("n", min=2, max=20000)
    art = bladepack.optimize(
        _Ops(), [(torch.randn(3, 40), torch.tensor([0, 5, 39]))], ({0: b, 1: n}, None), targets=TARGETS
    )
    rng = np.random.default_rng(1)
    cases: list[tuple[Any, ...]] = []
    for rows, cols in [(1, 2), (3, 7), (5, 33), (3, 1025), (2, 9001), (64, 20000)]:
        x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
        cases.append((x, np.array([0, cols - 1, cols // 2])))
    x = rng.standard_normal((2, 10)).astype(np.float32)
    cases += [
        (x, np.array([0, 10, 1])),  # a kernel reports the index: ExecutionError naming it
        (x, np.array([0, -10, 1])),  # wraps to 0
        (rng.standard_normal((65, 10)).astype(np.float32), np.array([0, 1, 2])),  # b above its range
        (rng.standard_normal((2, 1)).astype(np.float32), np.array([0, 0, 0])),  # n below its range
        (x.astype(np.float64), np.array([0, 1, 2])),  # wrong dtype
        (x[None], np.array([0, 1, 2])),  # wrong rank
    ]
    # one plain call per case on both sides (two cases share a signature: in one Python process the
    # second would replay a graph)
    _, py_out, py_log = gpu.run(art, cases, graphs=False)
    _, cpp_out, cpp_log = gpu.run_cpp(art, cases, graphs=False, calls=1)
    assert _same(py_out, cpp_out) == []
    _, replayed, _ = gpu.run_cpp(art, cases)  # three calls per case, the third a graph replay
    assert _same(py_out, replayed) == []
    errors = [r for r in cpp_out if isinstance(r, str)]
    assert len(errors) == 5, errors
    assert errors[0].startswith("IndexRangeError: index out of range in ") and "10 is not in [-10, 9]" in errors[0]
    assert errors[1].startswith("ShapeGuardError: ") and errors[3].startswith("InputError: input 'x' has dtype")
    assert _launches(cpp_log) == _launches(py_log)


def test_convolutions_and_pooling_match(gpu: FakeGpu) -> None:
    b, h, w = (torch.export.Dim(d, min=1, max=64) for d in ("b", "h", "w"))
    model = _ConvPool().eval()
    art = bladepack.optimize(model, [(torch.randn(2, 6, 9, 11),)], ({0: b, 2: h, 3: w},), targets=TARGETS)
    rng = np.random.default_rng(2)
    cases = [(rng.standard_normal(s).astype(np.float32),) for s in [(1, 6, 5, 7), (2, 6, 9, 11), (3, 6, 16, 8)]]
    _, py_out, _ = gpu.run(art, cases, graphs=False)
    # a torch before 2.13 keeps a parity guard of the pools' input (Note [Two exports]): those refused
    cases = [
        c for c, r in zip(cases, py_out, strict=True) if not (isinstance(r, str) and refused_by_torch(art.notes, r))
    ]
    _, py_out, py_log = gpu.run(art, cases, graphs=False)
    _, cpp_out, cpp_log = gpu.run_cpp(art, cases, graphs=False, calls=1)
    assert not [r for r in cpp_out if isinstance(r, str)], cpp_out
    assert _same(py_out, cpp_out) == []
    assert _launches(cpp_log) == _launches(py_log)


def test_device_and_image_errors_match(gpu: FakeGpu) -> None:
    class Mul(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    x = torch.randn(2, 3)
    cpu_only = bladepack.optimize(Mul(), [(x,)])
    art = bladepack.optimize(Mul(), [(x,)], targets=TARGETS)
    for artifact, device, cc, want in [
        (cpu_only, "cuda", "90", "has no CUDA kernels; optimize it with targets=('cpu', 'cuda') to run it on a GPU"),
        (art, "cuda:1", "90", "cuda:1 requested; this machine has 1 CUDA device(s)"),
        (art, "cuda", "80", "no kernel image runs on sm_80: the artifact has sm_90"),
    ]:
        with pytest.raises(Exception, match=re.escape(want)) as py:
            gpu.run(artifact, [], device=device, cc=cc)
        with pytest.raises(AssertionError, match=re.escape(want)) as cpp:
            gpu.run_cpp(artifact, [], device=device, cc=cc)
        assert "unsupported" in str(cpp.value) and want in str(py.value)
    assert gpu.run_cpp(art, [], device="cuda:0")[0] == "cuda (sm_90 image on Fake GPU 0 (sm_90), sm_90)"


def test_bpk_run_graphs_on_and_off(gpu: FakeGpu, tmp_path: Path) -> None:
    """bpk-run --cuda-graphs: -1 never captures; the default captures at the second call; a bound is
    checked by test_api (below) through the C ABI's cuda_graphs field."""
    s = SAMPLES["llama"]
    art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS)
    g = torch.Generator().manual_seed(2)
    cases = [tuple(a.numpy() for a in s.make_inputs(g, batch=3, past=9))]
    _, off, log_off = gpu.run_cpp(art, cases, graphs=False, calls=4)
    _, on, log_on = gpu.run_cpp(art, cases, graphs=True, calls=4)
    assert _same(off, on) == []
    assert "capture_begin" not in log_off and "graph_launch" not in log_off
    assert log_on.count("graph_launch ") == 3 and log_on.count("capture_begin ") == 1


def test_verify_report_matches_python(gpu: FakeGpu, tmp_path: Path) -> None:
    """`bpk-run --device cuda --verify` prints the Python loader's report on the same device, text for text."""
    from bladepack.loader.verify import report_text

    s = SAMPLES["llama"]
    art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS)
    path = tmp_path / "llama.bpk"
    art.save(path)
    executor, report, _ = gpu.verify(art)
    r = subprocess.run(
        [str(build("release") / "bpk-run"), str(path), "--device", "cuda", "--verify"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_fake_env(gpu, art, tmp_path / "cuda.log"),
    )
    assert r.returncode == 0, r.stderr
    assert report["passed"] is True
    assert r.stdout == report_text(str(path), executor, report)


def _fake_env(gpu: FakeGpu, artifact: Any, log: Path) -> dict[str, str]:
    return gpu._env(artifact, log, "90")


def test_c_api_threads_on_their_own_streams(gpu: FakeGpu, tmp_path: Path) -> None:
    """test_api's device checks: results against the CPU model, errors, the bad device text, and 8 threads
    running mixed batches at once equal to serial calls bit for bit; each call on its own stream."""
    s = SAMPLES["mlp"]
    art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS)
    path = tmp_path / "mlp.bpk"
    art.save(path)
    log = tmp_path / "cuda.log"
    r = subprocess.run(
        [str(build("release") / "test_api"), str(path), "cuda"],
        capture_output=True,
        text=True,
        timeout=600,
        env=_fake_env(gpu, art, log),
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert "checks passed" in r.stdout
    lines = log.read_text().splitlines()
    streams = {ln.split()[13] for ln in lines if ln.startswith("launch ")}
    assert len(streams) >= 2 and "0" not in streams  # the runtime's own streams, never the legacy default
    # with cuda_graphs = 1 (one graph per stream) alternating batches drop graphs as they go
    assert sum(ln.startswith("graph_exec_destroy") for ln in lines) > 0
    assert sum(ln.startswith("graph_launch ") for ln in lines) > 0


def test_c_api_large_device_tensors_skip_graphs(gpu: FakeGpu, tmp_path: Path) -> None:
    """Note [Graph staging cost] in the C++ runtime: test_api's staging mode calls an elementwise model
    four times with a device input on a caller stream; small tensors replay a graph from the third call,
    16 MiB ones run plain launches in place every time, as in the Python loader. Results equal the CPU
    model's."""
    from tests.test_cuda_backend import elementwise_artifact

    art = elementwise_artifact()
    path = tmp_path / "ew.bpk"
    art.save(path)
    for rows, graphs in (("16", True), (str(1 << 16), False)):
        log = tmp_path / f"cuda{rows}.log"
        r = subprocess.run(
            [str(build("release") / "test_api"), str(path), "cuda", rows],
            capture_output=True,
            text=True,
            timeout=600,
            env=_fake_env(gpu, art, log),
        )
        assert r.returncode == 0, r.stderr[-4000:]
        lines = log.read_text().splitlines()
        assert (sum(ln.startswith("graph_launch ") for ln in lines) > 0) == graphs, rows
        assert sum(ln.startswith("launch k") for ln in lines) == (1 if graphs else 4), rows


@pytest.mark.parametrize("strict", [False, True])
def test_c_api_device_errors(gpu: FakeGpu, tmp_path: Path, strict: bool) -> None:
    """Note [Device errors] in the C++ runtime (cpp_runtime/tests/test_device_errors.cpp): on the caller's stream with
    device results a bad index is raised by the next call (which runs nothing) or by
    bpk_model_synchronize, and one nothing raised is printed when the model is freed; no call waits for
    its kernels; with BLADEPACK_CUDA_STRICT_ERRORS=1 the bad call raises its own."""
    from tests.test_cuda_host_path import _Gather

    b, n = torch.export.Dim("b", min=1, max=64), torch.export.Dim("n", min=4, max=4096)
    art = bladepack.optimize(
        _Gather(), [(torch.randn(3, 40), torch.tensor([0, 5, 3]))], ({0: b, 1: n}, None), targets=TARGETS
    )
    path = tmp_path / "gather.bpk"
    art.save(path)
    log = tmp_path / "cuda.log"
    env = {**_fake_env(gpu, art, log), **({"BLADEPACK_CUDA_STRICT_ERRORS": "1"} if strict else {})}
    r = subprocess.run(
        [str(build("release") / "test_device_errors"), str(path), "cuda", *(["strict"] if strict else [])],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert ("a CUDA call reported an error that nothing raised" in r.stderr) == (not strict), r.stderr
    lines = log.read_text().splitlines()
    if not strict:  # calls on the caller's stream never wait, but to report an error
        events = [ln.split()[0] for ln in lines if ln.startswith(("stream_sync", "graph_launch ", "launch ", "mem_"))]
        events = events[events.index("launch") + 1 :]  # after the first call (it allocates the buffers)
        # Note [Output pool]: no device memory is allocated or freed by a later call, only by the free
        assert "mem_alloc" not in events, events
        frees = [k for k, e in enumerate(events) if e == "mem_free"]
        assert frees and min(frees) > max(k for k, e in enumerate(events) if e == "graph_launch"), events
        events = [e for e in events if e != "mem_free"]
        # good x3 and bad enqueue without a wait; the next call waits to report (twice: the words read,
        # then cleared) and runs nothing; good, bad; synchronize (waits, reads, clears); bad; the free
        assert events == ["graph_launch", "graph_launch", "graph_launch", "stream_sync", "stream_sync"] + [
            "graph_launch",
            "graph_launch",
            "stream_sync",
            "stream_sync",
            "stream_sync",
            "graph_launch",
            "stream_sync",
            "stream_sync",
            "stream_sync",
        ], events


@pytest.mark.slow
def test_cuda_path_under_sanitizers(gpu: FakeGpu, tmp_path: Path) -> None:
    """ASan + UBSan: bpk-run --device cuda on the LLaMA step (GEMMs, cooperative row kernels) and the
    threads of test_api on the MLP, with no report."""
    try:
        sanitize = build("sanitize")
    except BuildError as e:
        pytest.skip(f"no sanitizer build here: {e}")
    s = SAMPLES["llama"]
    art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS)
    path = tmp_path / "llama.bpk"
    art.save(path)
    g = torch.Generator().manual_seed(9)
    arrays = [a.numpy() for a in s.make_inputs(g, batch=3, past=31)]
    names = [t.name for t in art.plan.inputs]
    flags = []
    for n, a in zip(names, arrays):
        np.save(tmp_path / f"{n}.npy", a)
        flags += ["--input", f"{n}={tmp_path / f'{n}.npy'}"]
    env = {
        **_fake_env(gpu, art, tmp_path / "cuda.log"),
        "ASAN_OPTIONS": "detect_leaks=1",
        "UBSAN_OPTIONS": "print_stacktrace=1",
    }
    out = tmp_path / "out"
    out.mkdir()
    r = subprocess.run(
        [str(sanitize / "bpk-run"), str(path), "--device", "cuda", *flags, "--output-dir", str(out), "--repeat", "3"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-4000:]
    _, py_out, _ = gpu.run(art, [tuple(arrays)])
    got = [np.load(out / f"{t.name}.npy") for t in art.plan.outputs]
    assert _same(py_out, [got]) == []
    mlp = SAMPLES["mlp"]
    small = bladepack.optimize(mlp.build().eval(), mlp.export_samples(), mlp.dynamic_shapes, targets=TARGETS)
    small.save(tmp_path / "mlp.bpk")
    r = subprocess.run(
        [str(sanitize / "test_api"), str(tmp_path / "mlp.bpk"), "cuda"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, **_fake_env(gpu, small, tmp_path / "mlp.log")},
    )
    assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-4000:]


@pytest.mark.cuda
def test_cpp_runtime_on_a_real_gpu(tmp_path: Path) -> None:
    """On a GPU machine: every sample through bpk-run --device cuda (graphs on, the third call's results)
    against the Python loader on the same GPU (graphs off) within float32 rounding, and eager within 1e-4.
    A shape below the artifact's range (torch 2.11 narrows the CNN's height / width to start at 2: Note
    [Two exports] in export/capture.py) must be refused, naming the symbol."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        bpk_run = build("release") / "bpk-run"
    except BuildError as e:
        pytest.skip(f"cpp_runtime does not build here: {e}")
    from tests.helpers import as_tuple, rel_err

    for name in ("mlp", "encoder", "llama", "cnn"):
        s = SAMPLES[name]
        model = s.build().eval()
        art = bladepack.optimize(model, s.export_samples(), s.dynamic_shapes, targets=("cpu", "cuda"))
        path = tmp_path / f"{name}.bpk"
        art.save(path)
        m = bladepack.load(path, device="cuda", graphs=False)
        lows = {sym.name: sym.min for sym in art.plan.symbols}
        g = torch.Generator().manual_seed(0)
        for k, dims in enumerate(s.test_cases()):
            below = [d for d, v in dims.items() if v < lows.get(d, 1)]
            args = s.make_inputs(g, **dims)
            flags = []
            for t, a in zip(art.plan.inputs, args):
                np.save(tmp_path / f"{name}{k}-{t.name}.npy", a.numpy())
                flags += ["--input", f"{t.name}={tmp_path / f'{name}{k}-{t.name}.npy'}"]
            out = tmp_path / f"{name}{k}"
            out.mkdir()
            r = subprocess.run(
                [str(bpk_run), str(path), "--device", "cuda", *flags, "--output-dir", str(out), "--repeat", "2"],
                capture_output=True,
                text=True,
                timeout=300,
            )
            if below:
                assert r.returncode != 0 and f"symbol '{below[0]}'" in r.stderr, (name, dims, r.stderr)
                continue
            assert r.returncode == 0, r.stderr
            want = m(*[a.numpy() for a in args])
            with torch.no_grad():
                ref = as_tuple(model(*args))
            for t, w, e in zip(art.plan.outputs, as_tuple(want), ref):
                got = np.load(out / f"{t.name}.npy")
                assert rel_err(got, w) <= 1e-6, f"{name} at {dims}: C++ vs Python"
                assert rel_err(got, e.numpy()) <= 1e-4, f"{name} at {dims}: C++ vs eager"


class _Lookups(torch.nn.Module):
    """An embedding (a negative id is out of range, as eager says) beside advanced indexing (a negative
    index counts from the end): Note [Negative indices] in bladepack/opset/attrs.py."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)

    def forward(self, ids: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.emb(ids) * 2.0, self.emb.weight[idx] + 1.0


def test_negative_indices_on_the_gpu(gpu: FakeGpu) -> None:
    """The CUDA kernels check indices as the CPU's do, and both loaders say the same: -1 to an
    embedding is out of [0, 9]; -10 in advanced indexing is row 0, -11 is out of [-10, 9]."""
    model = _Lookups().eval()
    samples = [
        (torch.tensor([[1, 2, 3]]), torch.tensor([1, 2])),
        (torch.tensor([[4, 5, 6, 7]]), torch.tensor([0, 3, 9])),
    ]
    art = bladepack.optimize(model, samples, targets=TARGETS)
    good = (np.array([[0, 9, 3]]), np.array([-10, -1, 9]))
    cases = [good, (np.array([[1, -1, 3]]), good[1]), (good[0], np.array([2, -11]))]
    _, py_out, _ = gpu.run(art, cases, graphs=False)
    _, cpp_out, _ = gpu.run_cpp(art, cases, graphs=False, calls=1)
    assert _same(py_out, cpp_out) == []
    with torch.no_grad():
        want = model(*(torch.from_numpy(a) for a in good))
    for o, r in zip(py_out[0], want):
        assert np.allclose(o, r.numpy(), rtol=1e-6, atol=0)
    assert isinstance(py_out[1], str) and "-1 is not in [0, 9]" in py_out[1] and "emb(ids)" in py_out[1], py_out[1]
    assert isinstance(py_out[2], str) and "-11 is not in [-10, 9]" in py_out[2], py_out[2]


def test_a_decode_walk_grows_its_device_memory_by_class(gpu: FakeGpu, tmp_path: Path) -> None:
    """Note [Device size classes] in the C++ runtime: 300 calls of the LLaMA step on the fake driver,
    the cache one token longer each call (every call a new signature, its inputs copied in), reallocate
    the call's device memory — a wait for the stream, the graphs dropped, a free — once per size class
    passed, not once per call as at exact sizes."""
    import json

    s = SAMPLES["llama"]
    art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS)
    path = tmp_path / "llama.bpk"
    art.save(path)
    log = tmp_path / "cuda.log"
    cmd = [str(build("release") / "bench_runtime"), "walk", str(path), "--repeat", "300", "--device", "cuda"]
    cmd += ["--shape", "x=4,1,64", "--shape", "past_k=4,2,100,8", "--shape", "past_v=4,2,100,8"]
    cmd += ["--grow", "past_k:2", "--grow", "past_v:2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_fake_env(gpu, art, log))
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["calls"] == 300
    lines = log.read_text().splitlines()
    allocs = [ln for ln in lines if ln.startswith("mem_alloc ")]
    # the memory grows about 4x over the walk: two doublings of eight classes each, and the first call's
    # allocations (at exact sizes: one per call)
    assert 1 <= len(allocs) <= 24, (len(allocs), allocs[:20])
    assert sum(ln.startswith("launch ") for ln in lines) >= 300  # every call a new signature: plain launches
