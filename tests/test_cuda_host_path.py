"""The CUDA loader's per-call host path on the fake driver (tests/cuda_harness.py), for every kind of
device tensor: torch CUDA tensors (tests/fake_torch.py's stand-in drives the torch branch),
`__cuda_array_interface__` objects and DLPack producers.

What is pinned: at a repeated signature a call is its input copies, one graph launch and its output
copies — no kernel launch, no stream synchronization, no allocation but the outputs (Note [Framework
replay] in loader/cuda_module.py); results bit-identical to the host-array path; index errors reported
without a per-call wait and never lost — at the next call, by synchronize(), by close(), at
interpreter exit — and each call's own with cuda_strict_errors (Note [Device errors]).
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import bladepack
from samples.registry import SAMPLES
from tests.cuda_harness import FakeGpu

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("NVCC"), reason="nvcc not found (CUDA targets need it)"
)

TARGETS = ("cpu", "cuda:sm_90")

# argv: artifact, kind, input pickle, output pickle, calls per case, strict
_SCRIPT = r"""
import os, pickle, sys, numpy as np
path, kind, ins, outs, calls, strict = sys.argv[1:7]
if kind == "torch":
    from tests import fake_torch
    torch = fake_torch.install()
import bladepack
from bladepack.errors import BladepackError
from bladepack.options import LoaderOptions
from bladepack.loader.dlpack import Exported

class Cai:
    def __init__(self, a, stream=1):
        self.a = a
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                                         "version": 3, "strides": None, "stream": stream}

def wrap(a):
    if kind == "torch":
        return torch.cuda_tensor(a)
    if kind == "cai":
        return Cai(np.array(a, copy=True))
    if kind == "cai-own-stream":  # a CuPy array made on a non-default stream (a handle the fake accepts)
        return Cai(np.array(a, copy=True), stream=0x5151)
    if kind == "dlpack":
        a = np.array(a, copy=True)
        return Exported(a.ctypes.data, (2, 0), a.dtype.name, a.shape, a)
    return a

def host(o):
    if kind == "torch":
        return o.numpy()
    if kind in ("cai", "cai-own-stream", "dlpack"):
        cai = o.__cuda_array_interface__
        n = int(np.prod(o.shape, dtype=np.int64)) * np.dtype(cai["typestr"]).itemsize
        import ctypes
        return np.frombuffer(ctypes.string_at(o.ptr, n), dtype=cai["typestr"]).reshape(o.shape).copy()
    return np.asarray(o)

m = bladepack.load(path, device="cuda", options=LoaderOptions.from_env(cuda_strict_errors=strict == "1"))
log = os.environ["FAKE_CUDA_LOG"]
results = []
for step in pickle.load(open(ins, "rb")):
    if step == "sync" or step == "close":
        try:
            getattr(m, "synchronize" if step == "sync" else "close")()
            results.append(("ok", []))
        except BladepackError as e:
            results.append((f"{type(e).__name__}: {e}", []))
        continue
    if step == "exit":
        break
    args = [wrap(a) for a in step]
    for _ in range(int(calls)):
        mark = os.path.getsize(log) if os.path.exists(log) else 0
        try:
            out = m(*args)
            got = [host(o) for o in (out if isinstance(out, tuple) else (out,))]
            results.append(("ok", got))
        except BladepackError as e:
            results.append((f"{type(e).__name__}: {e}", []))
        lines = open(log).read()[mark:].splitlines() if os.path.exists(log) else []
        results[-1] = (*results[-1], lines)
pickle.dump(results, open(outs, "wb"))
"""


def _run(
    gpu: FakeGpu, tmp_path: Path, art: Any, kind: str, steps: list[Any], calls: int = 1, strict: bool = False
) -> tuple[list[Any], subprocess.CompletedProcess[str]]:
    """Per call (status, output arrays, the fake's log lines of that call), and the process."""
    path = tmp_path / "m.bpk"
    art.save(path)
    (tmp_path / "in.pkl").write_bytes(pickle.dumps(steps))
    log = tmp_path / f"{kind}.log"
    env = gpu._env(art, log, "90")
    r = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(path), kind, str(tmp_path / "in.pkl"), str(tmp_path / "out.pkl")]
        + [str(calls), "1" if strict else "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return pickle.loads((tmp_path / "out.pkl").read_bytes()), r


def _calls(lines: list[str], prefix: str) -> int:
    return sum(ln.startswith(prefix) for ln in lines)


@pytest.fixture(scope="module")
def mlp() -> Any:
    s = SAMPLES["mlp"]
    return bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS)


@pytest.mark.parametrize("kind", ["torch", "cai", "dlpack"])
def test_repeated_signature_replays_without_sync(gpu: FakeGpu, mlp: Any, tmp_path: Path, kind: str) -> None:
    """Per signature: call 1 launches kernels on the tensors in place (Note [First calls on the device]:
    nothing staged, the graph buffer untouched), call 2 captures, calls 3-5 are one graph launch between
    device-to-device copies, with no kernel launch, allocation or stream synchronization; every call's
    results equal the host-array path's bit for bit. Sizes 1, 5 and 17 rows, then 1 again."""
    xs = [np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32) for n in (1, 5, 17, 1)]
    want, _ = _run(gpu, tmp_path, mlp, "numpy", [(x,) for x in xs])
    got, _ = _run(gpu, tmp_path, mlp, kind, [(x,) for x in xs], calls=5)
    for k, x in enumerate(xs):
        for c in range(5):
            status, outs, lines = got[5 * k + c]
            assert status == "ok", status
            assert all(np.array_equal(a, b) for a, b in zip(want[k][1], outs)), f"rows {len(x)}, call {c + 1}"
            # the arena and the graph buffer start at 64 KiB (Note [Device size classes]): these
            # signatures never grow them, so no call waits
            assert _calls(lines, "stream_sync") == 0, (k, c, [ln for ln in lines if "sync" in ln])
            if c == 0 and k < 3:  # a new signature's first call: in place, no staging copy, no graph
                assert _calls(lines, "copy_dtod") == 0 and _calls(lines, "graph_") == 0, lines
            if c >= 2 or k == 3:  # (the fourth case repeats the first's signature: its graph replays)
                assert _calls(lines, "graph_launch") == 1 and _calls(lines, "launch ") == 0, lines
                assert _calls(lines, "mem_alloc") == 0 or kind != "torch", lines
                assert _calls(lines, "copy_dtod") == 2, lines  # the input in, the output out


@pytest.mark.parametrize("kind", ["torch", "cai"])
def test_a_decode_walk_runs_in_place(gpu: FakeGpu, tmp_path: Path, kind: str) -> None:
    """Note [First calls on the device], Note [Device size classes]: the LLaMA step with its cache one
    token longer each call (60 calls, every one a new signature) runs each call on the caller's tensors
    in place — no staging copy, no graph — with results equal to the host-array path's bit for bit, and
    reallocates device memory (each time a wait and a free) only a few times over the walk."""
    s = SAMPLES["llama"]
    art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS)
    rng = np.random.default_rng(0)
    steps = [
        tuple(rng.standard_normal(shape).astype(np.float32) for shape in ((2, 1, 64), (2, 2, p, 8), (2, 2, p, 8)))
        for p in range(300, 360)
    ]
    want, _ = _run(gpu, tmp_path, art, "numpy", steps)
    got, _ = _run(gpu, tmp_path, art, kind, steps)
    waits = allocs = 0
    for k, ((_, w, _), (status, outs, lines)) in enumerate(zip(want, got)):
        assert status == "ok", status
        assert all(np.array_equal(a, b) for a, b in zip(w, outs)), k
        assert _calls(lines, "copy_dtod") == 0 and _calls(lines, "graph_") == 0, (k, lines)
        waits += _calls(lines, "stream_sync")
        allocs += _calls(lines, "mem_alloc") if k else 0
    assert waits <= 6 and allocs <= 12, (waits, allocs)


def test_device_results_pooled_and_ordered(gpu: FakeGpu, mlp: Any, tmp_path: Path) -> None:
    """CAI inputs on a stream of their own: the work runs on that stream (no wait across streams), the
    results equal the host path's, and after the first calls their device memory comes from the pool
    (no allocation per call)."""
    x = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    want, _ = _run(gpu, tmp_path, mlp, "numpy", [(x,)])
    got, _ = _run(gpu, tmp_path, mlp, "cai-own-stream", [(x,)], calls=6)
    for status, outs, lines in got[3:]:
        assert status == "ok"
        assert all(np.array_equal(a, b) for a, b in zip(want[0][1], outs))
        assert _calls(lines, "mem_alloc") == 0, lines
        launches = [ln for ln in lines if ln.startswith("graph_launch")]
        assert len(launches) == 1 and launches[0].endswith(f"stream {0x5151}"), lines


class _Gather(torch.nn.Module):
    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return torch.relu(x[:, idx]) * 2.0


@pytest.fixture(scope="module")
def gather() -> Any:
    b, n = torch.export.Dim("b", min=1, max=64), torch.export.Dim("n", min=4, max=4096)
    x, idx = torch.randn(3, 40), torch.tensor([0, 5, 3])
    return bladepack.optimize(_Gather(), [(x, idx)], ({0: b, 1: n}, None), targets=TARGETS)


_X = np.arange(20, dtype=np.float32).reshape(2, 10)
_GOOD, _BAD = (_X, np.array([0, 9, 1])), (_X, np.array([0, 10, 1]))


@pytest.mark.parametrize("kind", ["torch", "cai"])
def test_index_error_raised_at_the_next_call(gpu: FakeGpu, gather: Any, tmp_path: Path, kind: str) -> None:
    """Note [Device errors]: a replayed call with a bad index returns without waiting; the next call on
    the stream raises IndexRangeError naming the kernel's gather and the index, before it runs anything;
    the call after that runs again and is right."""
    got, _ = _run(gpu, tmp_path, gather, kind, [_GOOD, _GOOD, _GOOD, _BAD, _GOOD, _GOOD])
    statuses = [g[0] for g in got]
    assert statuses[:4] == ["ok"] * 4, statuses
    assert statuses[4].startswith("IndexRangeError: index out of range in"), statuses[4]
    assert "10 is not in [-10, 9]" in statuses[4] and "earlier call on this stream" in statuses[4]
    assert _calls(got[4][2], "graph_launch") == 0  # the call that raised ran nothing
    assert statuses[5] == "ok"
    np.testing.assert_array_equal(got[5][1][0], np.maximum(_X[:, [0, 9, 1]], 0) * 2)
    assert all(_calls(g[2], "stream_sync") == 0 for g in got[:4])


@pytest.mark.parametrize("how", ["sync", "close", "exit"])
def test_index_error_never_lost(gpu: FakeGpu, gather: Any, tmp_path: Path, how: str) -> None:
    """The bad call is the last: synchronize() and close() raise its error; at interpreter exit, with
    nothing asked, it is printed to stderr."""
    got, proc = _run(gpu, tmp_path, gather, "torch", [_GOOD, _GOOD, _BAD, how])
    if how == "exit":
        assert len(got) == 3
        assert "a CUDA call reported an error that nothing raised" in proc.stderr, proc.stderr
        assert "10 is not in [-10, 9]" in proc.stderr
    else:
        assert got[3][0].startswith("IndexRangeError:") and "10 is not in [-10, 9]" in got[3][0], got[3][0]
        assert "found by synchronize()" in got[3][0]  # close() synchronizes first
        assert "nothing raised" not in proc.stderr


def test_strict_errors_raise_in_the_call(gpu: FakeGpu, gather: Any, tmp_path: Path) -> None:
    """cuda_strict_errors: the bad call itself raises (it waits for its kernels), the next one is fine."""
    got, _ = _run(gpu, tmp_path, gather, "torch", [_GOOD, _GOOD, _GOOD, _BAD, _GOOD], strict=True)
    statuses = [g[0] for g in got]
    assert statuses[3].startswith("IndexRangeError:") and "earlier" not in statuses[3], statuses
    assert statuses[4] == "ok" and statuses[:3] == ["ok"] * 3


def test_host_arrays_raise_their_own_error(gpu: FakeGpu, gather: Any, tmp_path: Path) -> None:
    """Host results make the call wait anyway: it raises its own error, from the replay path too, with
    one stream synchronization per call."""
    got, _ = _run(gpu, tmp_path, gather, "numpy", [_GOOD, _GOOD, _GOOD, _BAD, _GOOD])
    statuses = [g[0] for g in got]
    assert statuses[3].startswith("IndexRangeError:") and "earlier" not in statuses[3], statuses
    assert statuses[4] == "ok" and statuses[:3] == ["ok"] * 3
    assert _calls(got[2][2], "stream_sync") == 1


@pytest.mark.cuda
def test_replay_paths_on_a_real_gpu() -> None:
    """On a GPU machine: the MLP on torch CUDA tensors, on a side stream and on the default one, and on
    CAI views of them, five calls per signature (the replay path from the third), equal to the host
    path bit for bit at 1, 5 and 17 rows; a gather's bad index raised by the next call on the stream
    and by synchronize(), never by the call that made it."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from bladepack.errors import IndexRangeError

    s = SAMPLES["mlp"]
    art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=("cpu", "cuda"))

    class CaiOf:
        def __init__(self, t: torch.Tensor) -> None:
            self.t, self.__cuda_array_interface__ = t, t.__cuda_array_interface__

    with bladepack.load(art.to_bytes(), device="cuda") as m:
        side = torch.cuda.Stream()
        for n in (1, 5, 17):
            x = torch.randn(n, 64)
            want = m(x.numpy())
            dev = x.cuda()
            for stream in (side, torch.cuda.current_stream()):
                with torch.cuda.stream(stream):
                    for _ in range(5):
                        got = m(dev)
                    assert torch.equal(got.cpu(), torch.from_numpy(want))
            for _ in range(5):
                out = m(CaiOf(dev))
            assert torch.equal(torch.from_dlpack(out).cpu(), torch.from_numpy(want))

    b, n = torch.export.Dim("b", min=1, max=64), torch.export.Dim("n", min=4, max=4096)
    gather = bladepack.optimize(
        _Gather(), [(torch.randn(3, 40), torch.tensor([0, 5, 3]))], ({0: b, 1: n}, None), targets=("cpu", "cuda")
    )
    x = torch.arange(20, dtype=torch.float32).reshape(2, 10).cuda()
    good, bad = torch.tensor([0, 9, 1]).cuda(), torch.tensor([0, 10, 1]).cuda()
    with bladepack.load(gather.to_bytes(), device="cuda") as m:
        for _ in range(3):
            m(x, good)
        m(x, bad)  # returns without waiting for its kernels
        with pytest.raises(IndexRangeError, match="earlier call on this stream"):
            m(x, good)
        assert torch.equal(m(x, good).cpu(), torch.relu(x[:, good]).cpu() * 2)
        m(x, bad)
        with pytest.raises(IndexRangeError, match="by synchronize"):
            m.synchronize()
