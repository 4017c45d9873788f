"""CUDA graphs: driver launches and host time per call, with graphs on and off, in both loaders.

Without a GPU (the default here) it runs on the fake driver of tests/cuda_harness.py with the kernels
emulated, and reports what the fake can count honestly: driver launches per call at a repeated
signature (kernel launches, graph launches, cuBLAS calls) for the Python loader and the C++ runtime,
graphs on and off. The fake's times say nothing about a GPU and are not reported. With `--gpu` (a
CUDA device and torch with CUDA) it measures wall time per call on the GPU instead, calls issued back
to back: the Python loader on torch CUDA tensors, `__cuda_array_interface__` objects and numpy arrays,
`bpk-run --repeat` (whole calls from host memory), graphs on and off, beside torch eager and a
hand-captured `torch.cuda.CUDAGraph` of the eager model (the floor).

`--host` (no GPU) times what bladepack itself does per call on the fake driver — kernels not run,
cuBLAS's arithmetic skipped (FAKE_CUDA_NO_MATH), nothing logged while timed — for the samples and a
chain of 50 kernels (the issue's "50-kernel plan"): the Python loader on numpy arrays, torch CUDA
tensors (tests/fake_torch.py's stand-in; the stand-in's own cost per call is timed alone and
subtracted), DLPack kDLCUDA producers and `__cuda_array_interface__` objects, and the C++ runtime
(`bpk-run --repeat`), with the Python functions of bladepack entered per call and the stream
synchronizations per call (from the fake's log). Thread CPU time, best block of 15 (Note [Rounds]):
this machine switches between a fast and a slow mode. A real driver adds its own cost per call
(a few µs per copy and per graph launch), which only a GPU run measures.

    python -m bench.cuda_graphs [--samples mlp,llama] [--gpu | --host] [--repeat 200]
Out: bench/results/cuda_graphs.md (fake) or cuda_graphs_<device>.md (GPU), and .json.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from bench.machine import describe, title
from samples.registry import SAMPLES

RESULTS = Path(__file__).resolve().parent / "results"


def _npy_inputs(work: Path, stem: str, names: list[str], arrays: tuple[np.ndarray, ...]) -> tuple[list[str], list[str]]:
    """The arrays saved as .npy files: (their paths, bpk-run's --input flags)."""
    files, flags = [], []
    for name, a in zip(names, arrays):
        f = work / f"{stem}-{name}.npy"
        np.save(f, a)
        files.append(str(f))
        flags += ["--input", f"{name}={f}"]
    return files, flags


def _bpk_run_median(
    bpk_run: Path, path: Path, flags: list[str], repeat: int, graphs: bool, env: dict[str, str] | None = None
) -> tuple[float | None, str]:
    """`bpk-run --device cuda --repeat` on the inputs: (its median µs per call or None, its stderr)."""
    r = subprocess.run(
        [str(bpk_run), str(path), "--device", "cuda", *flags, "--repeat", str(repeat)]
        + ([] if graphs else ["--cuda-graphs", "-1"]),
        capture_output=True,
        text=True,
        env=env,
    )
    med = re.search(r"median ([\d.]+)", r.stdout)
    return (float(med.group(1)) if med and r.returncode == 0 else None), r.stderr


def _small_case(name: str, lows: dict[str, int] | None = None) -> dict[str, int]:
    """The sample's smallest test shape (where per-call host cost matters most) inside the artifact's
    ranges `lows` (torch 2.11 starts the CNN's height / width at 2: Note [Two exports])."""
    s = SAMPLES[name]
    cases = [d for d in s.test_cases() if all(v >= (lows or {}).get(k, 1) for k, v in d.items())]
    return min(cases, key=lambda d: sum(d.values()))


def _counts(log: str) -> dict[str, int]:
    """Driver calls in a fake-driver log: kernel launches, graph launches, cuBLAS GEMM calls (a GEMM
    replayed inside a graph is not a call)."""
    counts = {"kernel launches": 0, "graph launches": 0, "cuBLAS calls": 0}
    for ln in log.splitlines():
        if ln.startswith("launch "):
            counts["kernel launches"] += 1
        elif ln.startswith("graph_launch "):
            counts["graph launches"] += 1
        elif ln.startswith("gemm "):
            counts["cuBLAS calls"] += 1
    return counts


def fake(names: list[str], calls: int) -> list[dict[str, Any]]:
    from tests.cuda_harness import FakeGpu

    rows = []
    gpu = FakeGpu(Path(tempfile.mkdtemp(prefix="bpk-graphs-")))
    for name in names:
        s = SAMPLES[name]
        art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=("cpu", "cuda:sm_90"))
        dims = _small_case(name)
        g = torch.Generator().manual_seed(0)
        case = tuple(a.numpy() for a in s.make_inputs(g, **dims))
        plan_kernels = sum(1 for lr in art._parts()[0]["native_cuda"]["launches"] if lr["op"] == "kernel")
        for loader in ("python", "c++"):
            for graphs in (False, True):
                runner = gpu.run if loader == "python" else gpu.run_cpp
                # per call after two warm-up calls: a process making 2 + `calls` calls less one making 2
                _, _, warm = runner(art, [case], graphs=graphs, calls=2)
                _, _, log = runner(art, [case], graphs=graphs, calls=2 + calls)
                base, more = _counts(warm), _counts(log)
                row = {
                    "sample": name,
                    "shape": dims,
                    "loader": loader,
                    "graphs": graphs,
                    "plan kernels": plan_kernels,
                    **{k: round((more[k] - base[k]) / calls, 2) for k in more},
                }
                rows.append(row)
    return rows


class _CaiOf:
    """A torch CUDA tensor seen only through `__cuda_array_interface__` (what a CuPy array offers)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.__cuda_array_interface__ = t.__cuda_array_interface__


def _wall_us(fn: Any, repeat: int) -> float:
    """Wall µs per call of `fn` over `repeat` calls back to back, the device synchronized at the end:
    the rate a caller issuing calls in a loop gets (host-bound or device-bound, whichever is slower);
    the best of five rounds."""
    best = float("inf")
    for _ in range(5):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / repeat * 1e6)
    return best


def gpu_times(names: list[str], repeat: int) -> list[dict[str, Any]]:
    """Per sample at its smallest in-range shape: wall µs per call of the Python loader on torch CUDA
    tensors, CAI objects and numpy arrays (graphs on and off), `bpk-run --repeat` (C++, host tensors),
    torch eager, and a hand-captured `torch.cuda.CUDAGraph` of eager replayed on static inputs (the
    floor a graph of the same model reaches)."""
    from tests import cpp_build

    bpk_run = cpp_build.build("release") / "bpk-run"
    rows = []
    work = Path(tempfile.mkdtemp(prefix="bpk-graphs-"))
    for name in names:
        s = SAMPLES[name]
        model = s.build().eval()
        art = bladepack.optimize(model, s.export_samples(), s.dynamic_shapes, targets=("cpu", "cuda"))
        path = work / f"{name}.bpk"
        art.save(path)
        dims = _small_case(name, {sym.name: sym.min for sym in art.plan.symbols})
        g = torch.Generator().manual_seed(0)
        host = s.make_inputs(g, **dims)
        dev = tuple(t.cuda() for t in host)
        arrays = tuple(t.numpy() for t in host)
        cai = tuple(_CaiOf(t) for t in dev)
        cuda_model = model.cuda()
        row: dict[str, Any] = {"sample": name, "shape": dims}
        with torch.no_grad():
            for _ in range(3):
                cuda_model(*dev)
            row["torch eager"] = round(_wall_us(lambda: cuda_model(*dev), repeat), 1)
            static = tuple(t.clone() for t in dev)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    cuda_model(*static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                cuda_model(*static)
            row["torch CUDA graph (floor)"] = round(_wall_us(graph.replay, repeat), 1)
        for graphs in (True, False):
            m = bladepack.load(path, device="cuda", graphs=graphs)
            tag = "graphs" if graphs else "no graphs"
            for kind, xs in (("torch", dev), ("CAI", cai), ("numpy", arrays)):
                for _ in range(5):
                    m(*xs)
                row[f"bladepack {kind}, {tag}"] = round(_wall_us(lambda: m(*xs), repeat), 1)
            m.close()
            names_ = [t.name for t in art.plan.inputs]
            _, flags = _npy_inputs(work, name, names_, arrays)
            median, err = _bpk_run_median(bpk_run, path, flags, repeat, graphs)
            row[f"bpk-run whole call, {tag}"] = median if median is not None else err.strip()[-200:]
        floor = row["torch CUDA graph (floor)"]
        row["torch path / floor"] = round(row["bladepack torch, graphs"] / floor, 2) if floor else None
        rows.append(row)
    return rows


def _grown(xs: tuple[torch.Tensor, ...], axes: list[tuple[int, int]], k: int) -> tuple[torch.Tensor, ...]:
    """The inputs with every (input, axis) of `axes` k longer (its values repeated cyclically: token ids
    stay valid, masks stay 0 / 1)."""
    out = list(xs)
    for i, axis in axes:
        a = out[i]
        index = torch.arange(a.shape[axis] + k, device=a.device) % a.shape[axis]
        out[i] = torch.index_select(a, axis, index).contiguous()
    return tuple(out)


def walk_times(names: list[str], calls: int, device: str = "cuda") -> list[dict[str, Any]]:
    """A decode loop on the device: per sample, `calls` calls each one longer than the last along its
    walk axes (_WALKS: the LLaMA step's cache, the others' batch), so every call is a signature the
    module has not seen (no CUDA graph can exist for it). Wall µs per call of bladepack on torch tensors
    (graphs on, as loaded by default) and of torch eager over the same inputs, back to back, the device
    synchronized at the end of each pass; the best of three passes over fresh signatures for bladepack
    (a pass over the same ones would replay graphs); the repeated-signature call beside them. `device`
    "cpu" runs the same on the CPU loader (a smoke test of the script; not recorded)."""

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    rows = []
    for name in names:
        s = SAMPLES[name]
        model = s.build().eval()
        targets = ("cpu", "cuda") if device == "cuda" else ("cpu",)
        art = bladepack.optimize(model, s.export_samples(), s.dynamic_shapes, targets=targets)
        dims = _small_case(name, {sym.name: sym.min for sym in art.plan.symbols})
        base = tuple(t.to(device) for t in s.make_inputs(torch.Generator().manual_seed(0), **dims))
        axes = [(int(p.split(":")[0]), int(p.split(":")[1])) for p in _WALKS[name].split(",")]
        passes = [[_grown(base, axes, 1 + r * calls + k) for k in range(calls)] for r in range(4)]
        model = model.to(device)
        m = bladepack.load(art.to_bytes(), device=device)

        def per_call(fn: Any, cases: list[tuple[torch.Tensor, ...]]) -> float:
            sync()
            t0 = time.perf_counter()
            for xs in cases:
                fn(*xs)
            sync()
            return (time.perf_counter() - t0) / len(cases) * 1e6

        with torch.no_grad():
            per_call(model, passes[0][:5])
            eager = min(per_call(model, cases) for cases in passes[1:])
            per_call(m, passes[0][:5])  # warms the loader up (those five signatures are not timed)
            ours = min(per_call(m, cases) for cases in passes[1:])
            last = passes[-1][-1]
            for _ in range(3):
                m(*last)
            repeated = min(per_call(m, [last] * calls) for _ in range(3))
        rows.append(
            {
                "sample": name,
                "walk": _WALKS[name],
                "from shape": dims,
                "calls per pass": calls,
                "bladepack us/call, new signature": round(ours, 1),
                "torch eager us/call": round(eager, 1),
                "bladepack / eager speed": round(eager / ours, 2),
                "bladepack us/call, repeated signature": round(repeated, 1),
            }
        )
        if device == "cuda":
            m.close()
    return rows


class Chain50(torch.nn.Module):
    """50 CUDA kernels that do not fuse: softmax rows alternating with scans."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(50):
            x = torch.softmax(x * (1.0 + 0.01 * i), dim=-1) if i % 2 else torch.cumsum(x, dim=-1) * 0.1
        return x


_HOST_SCRIPT = r"""
import os, sys, time, numpy as np
path, mode, graphs, n, walk, files = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), sys.argv[5], sys.argv[6:]
if mode == "torch":  # the loader's torch branch, driven by tests/fake_torch.py's stand-in
    from tests import fake_torch
    torch = fake_torch.install()
import bladepack
from bladepack.loader.dlpack import Exported

class Cai:
    # a CuPy-style device array: __cuda_array_interface__ version 3 (fake device memory is host memory)
    def __init__(self, a):
        self.a = a
        self.__cuda_array_interface__ = {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                                         "version": 3, "strides": None, "stream": 1}

m = bladepack.load(path, device="cuda", graphs=graphs)
base = [np.load(f) for f in files]
def kind(xs):
    if mode == "torch":
        return [torch.cuda_tensor(a) for a in xs]
    if mode == "dlpack":  # a kDLCUDA producer of another framework
        return [Exported(a.ctypes.data, (2, 0), a.dtype.name, a.shape, a) for a in xs]
    if mode == "cai":
        return [Cai(a) for a in xs]
    return xs
xs = kind(base)
# --walk: "input:axis,..." grow together by one per call (a decode loop's cache), every call a new signature
axes = [tuple(int(v) for v in p.split(":")) for p in walk.split(",")] if walk else []
def grown(k):
    arrays = list(base)
    for i, axis in axes:
        a = arrays[i]
        arrays[i] = np.ascontiguousarray(np.take(a, np.arange(a.shape[axis] + k) % a.shape[axis], axis=axis))
    return kind(arrays)
walked = iter([grown(k) for k in range(1, 2 * n + 200)]) if axes else None
def call():
    return m(*(next(walked) if walked is not None else xs))
for _ in range(50):
    outs = call()
outs = outs if isinstance(outs, tuple) else (outs,)
if mode == "torch":  # what a replayed call asks of the stand-in, timed alone: torch's own cost, not ours
    dev, specs = torch.device("cuda:0"), [(o.shape, o.dtype) for o in outs]
    def standin():
        torch._C._cuda_getCurrentRawStream(0)
        for x in xs:
            x.dtype; x.get_device(); x.is_contiguous(); x.is_neg(); x.is_conj(); x.shape; x.data_ptr()
        for shape, dt in specs:
            torch.empty(shape, dtype=dt, device=dev).data_ptr()
elif mode == "dlpack":  # the producer's side: a capsule per input (bladepack's Exported stands in for JAX)
    def standin():
        for x in xs:
            x.__dlpack_device__()
            x.__dlpack__(stream=1, max_version=(1, 0))
else:
    def standin():
        pass
# Note [Rounds]-like: blocks of calls, the call and the stand-in alternating, each block's median; the
# best block of each (this machine switches between a fast and a slow mode for seconds at a time)
best_call, best_standin = [], []
for _ in range(15):
    for fn, best in ((call, best_call), (standin, best_standin)):
        ts = []
        for _ in range(max(n // 15, 20)):
            t0 = time.thread_time_ns()
            fn()
            ts.append(time.thread_time_ns() - t0)
        ts.sort()
        best.append(ts[len(ts) // 2] / 1e3)
calls = [0]
def count(frame, event, arg):  # Python functions of bladepack (the stand-ins' own are not ours)
    if event == "call" and "/bladepack/" in frame.f_code.co_filename:
        calls[0] += 1
sys.setprofile(count)
for _ in range(20):
    call()
sys.setprofile(None)
os.environ["FAKE_CUDA_LOG"] = os.environ["BENCH_LOG"]
for _ in range(10):
    call()
log = open(os.environ["BENCH_LOG"]).read()
print(min(best_call), min(best_standin), calls[0] / 20, log.count("stream_sync") / 10)
"""


_MODES = {
    "numpy": "numpy arrays",
    "torch": "torch CUDA tensors (stand-in)",
    "dlpack": "DLPack kDLCUDA producer",
    "cai": "__cuda_array_interface__",
}


_BERT12 = "BERT, 12 layers of width 64"
_WALKS = {
    "chain of 50 kernels": "0:0",
    "mlp": "0:0",
    "encoder": "0:0,1:0",
    "llama": "1:2,2:2",
    "cnn": "0:0",
    _BERT12: "0:1,1:1",  # the sequence length, as a server's prefill of requests of every length
}


def host_cost(
    names: list[str],
    repeat: int,
    modes: list[str],
    graphs_off: bool,
    baseline: Path | None = None,
    walk: bool = False,
    gemm_libraries: tuple[str, ...] = ("cublas",),
) -> list[dict[str, Any]]:
    """`gemm_libraries`: the samples' (and the BERT's) GEMMs on each of these (cuBLAS, cuBLASLt: the
    fake's), one model each, labelled with the library unless cuBLAS.
    `baseline`: the root of another checkout whose Python loader runs beside this one, each of its
    rows right before ours (this tree's tests/fake_torch.py is copied into it when it has none).
    `walk`: every timed call at a new signature, one longer than the last along the sample's walk
    axes (_WALKS: the LLaMA step's cache length, the others' batch), the Python loader only."""
    import os
    import sys

    from tests import cpp_build
    from tests.cuda_harness import FakeGpu

    bpk_run = cpp_build.build("release") / "bpk-run"
    work = Path(tempfile.mkdtemp(prefix="bpk-host-"))
    gpu = FakeGpu(work)
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(work),
        "BLADEPACK_CUBLAS": str(work / "libcublas.so"),
        "BLADEPACK_CUBLASLT": str(work / "libcublasLt.so"),
        "FAKE_CUDA_NO_MATH": "1",
    }
    for key in ("FAKE_CUDA_EMU", "FAKE_CUDA_LOG"):
        env.pop(key, None)
    models: list[tuple[str, Any, dict[str, int], tuple[np.ndarray, ...]]] = []
    b = torch.export.Dim("b", min=1, max=4096)
    chain = bladepack.optimize(Chain50(), [(torch.randn(4, 32),)], ({0: b},), targets=("cpu", "cuda:sm_90"))
    models.append(
        (
            "chain of 50 kernels",
            chain,
            {"b": 4},
            (np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32),),
        )
    )
    for name, library in ((n, lib) for n in names for lib in gemm_libraries):
        s = SAMPLES[name]
        art = bladepack.optimize(
            s.build().eval(),
            s.export_samples(),
            s.dynamic_shapes,
            targets=("cpu", "cuda:sm_90"),
            gemm_library=library,
        )
        dims = _small_case(name)
        g = torch.Generator().manual_seed(0)
        label = name + ("" if library == "cublas" else f" [{library}]")
        models.append((label, art, dims, tuple(a.numpy() for a in s.make_inputs(g, **dims))))
    for library in (
        gemm_libraries if walk else ()
    ):  # a real model's depth: a Hugging Face BERT of 12 layers, width 64, random weights (159 launches)
        from transformers import BertConfig, BertModel

        config = BertConfig(
            hidden_size=64,
            num_hidden_layers=12,
            num_attention_heads=4,
            intermediate_size=128,
            vocab_size=500,
            max_position_embeddings=2048,
        )
        ids, mask = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(0)), torch.ones(2, 16).long()
        batch, seq = torch.export.Dim("batch", min=1, max=32), torch.export.Dim("seq", min=1, max=2048)
        bert = bladepack.optimize(
            BertModel(config).eval(),
            [(ids, mask)],
            ({0: batch, 1: seq},) * 2,
            targets=("cpu", "cuda:sm_90"),
            gemm_library=library,
        )
        label = _BERT12 + ("" if library == "cublas" else f" [{library}]")
        models.append((label, bert, {"batch": 2, "seq": 16}, (ids.numpy(), mask.numpy())))
    here = Path(__file__).resolve().parent.parent
    roots: list[tuple[str, Path]] = [("", here)]
    if baseline is not None:
        stand_in = baseline / "tests" / "fake_torch.py"
        if not stand_in.exists():
            shutil.copy(here / "tests" / "fake_torch.py", stand_in)
        roots = [(f" ({_commit(baseline)}, before)", baseline), (f" ({_commit(here)})", here)]
    rows = []
    for label, art, dims, arrays in models:
        path = work / (re.sub(r"\W+", "_", label) + ".bpk")
        art.save(path)
        files, flags = _npy_inputs(work, path.stem, [t.name for t in art.plan.inputs], arrays)
        launches = sum(1 for lr in art._parts()[0]["native_cuda"]["launches"] if lr["op"] != "ref")
        for graphs in (True, False) if graphs_off else (True,):
            for mode, (tree, root) in ((m, t) for m in modes for t in roots):
                log = work / f"{path.stem}-{mode}-{int(graphs)}-{tree}.log"
                py = subprocess.run(
                    [sys.executable, "-c", _HOST_SCRIPT, str(path), mode, "1" if graphs else "0", str(repeat)]
                    + [_WALKS[label.split(" [")[0]] if walk else "", *files],
                    capture_output=True,
                    text=True,
                    env={**env, "BENCH_LOG": str(log), "PYTHONPATH": str(root)},
                    cwd=root,  # `python -c` puts the working directory first on sys.path
                )
                ok = py.returncode == 0
                us, standin, calls, syncs = (float(v) for v in py.stdout.split()[-4:]) if ok else (None,) * 4
                rows.append(
                    {
                        "model": label,
                        "shape": dims,
                        "launches in the plan": launches,
                        "graphs": graphs,
                        "loader": f"python{tree}, {_MODES[mode]}" + (", a new signature every call" if walk else ""),
                        "host us/call": round(us, 1) if us is not None else _last_line(py.stderr),
                        "framework us/call": round(standin, 1) if standin is not None else None,
                        "bladepack + driver us/call": round(us - standin, 1) if us is not None else None,
                        "bladepack python calls/call": calls,
                        "stream syncs/call": syncs,
                    }
                )
            if walk:
                continue  # the C++ rows time repeated signatures
            dl = subprocess.run(
                [str(bpk_run), str(path), "--device", "cuda", *flags, "--repeat", str(repeat), "--dlpack-device"]
                + ([] if graphs else ["--cuda-graphs", "-1"]),
                capture_output=True,
                text=True,
                env=env,
            )
            found = re.search(r"dlpack device latency .*median ([\d.]+)", dl.stdout)
            rows.append(
                {
                    "model": label,
                    "shape": dims,
                    "launches in the plan": launches,
                    "graphs": graphs,
                    "loader": "c++ bpk_model_run_dlpack, device tensors, caller stream (enqueue)",
                    "host us/call": float(found.group(1)) if found else _last_line(dl.stderr),
                    "framework us/call": None,
                    "bladepack + driver us/call": float(found.group(1)) if found else None,
                    "bladepack python calls/call": 0,
                    "stream syncs/call": None,
                }
            )
            median, err = _bpk_run_median(bpk_run, path, flags, repeat, graphs, env)
            rows.append(
                {
                    "model": label,
                    "shape": dims,
                    "launches in the plan": launches,
                    "graphs": graphs,
                    "loader": "c++ bpk-run, host arrays (whole call)",
                    "host us/call": median if median is not None else err[-200:],
                    "framework us/call": None,
                    "bladepack + driver us/call": median,
                    "bladepack python calls/call": 0,
                    "stream syncs/call": None,
                }
            )
    del gpu
    return rows


def _last_line(text: str) -> str:
    """A failed run's error, for a table cell (its last line, without the cell separator)."""
    lines = text.strip().splitlines()
    return "failed: " + (lines[-1].replace("|", "/")[-160:] if lines else "no output")


def _commit(root: Path) -> str:
    r = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True
    )
    return r.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return "\n".join(out)


def _device_tag() -> str:
    """The GPU's name as a file name part (NVIDIA_H200)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", torch.cuda.get_device_name()).strip("_")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", default="mlp,encoder,llama,cnn")
    ap.add_argument("--gpu", action="store_true", help="measure on a real GPU (else: count on the fake driver)")
    ap.add_argument("--host", action="store_true", help="no GPU: bladepack's own host time per call on the fake")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--modes", default="numpy,torch,dlpack,cai", help="--host: the kinds of tensors passed")
    ap.add_argument("--graphs-off", action="store_true", help="--host: also without CUDA graphs")
    ap.add_argument("--baseline", type=Path, help="--host: another checkout's loader, measured beside this one")
    ap.add_argument("--calls", type=int, default=3, help="fake driver: calls counted after warm-up")
    ap.add_argument("--walk", action="store_true", help="--host / --gpu: a new signature every call (a decode loop)")
    ap.add_argument(
        "--gemm-library",
        default="cublas",
        help="--host: the samples' GEMM libraries, comma-separated (cublas, cublaslt)",
    )
    args = ap.parse_args()
    names = args.samples.split(",")
    RESULTS.mkdir(exist_ok=True)
    libraries = tuple(args.gemm_library.split(","))
    if args.host:
        rows = host_cost(
            names, args.repeat, args.modes.split(","), args.graphs_off, args.baseline, args.walk, libraries
        )
        tag = ("cuda_host_walk" if args.walk else "cuda_host_cost") + (
            "" if libraries == ("cublas",) else "_" + "_".join(libraries)
        )
        walk_head = (
            "# Host time per call on the fake driver at a new signature every call (a decode loop)\n\n"
            "`python -m bench.cuda_graphs --host --walk --samples mlp,llama,encoder --modes numpy,torch --repeat 600\n"
            "--baseline <checkout>`. Every timed call's inputs are one longer than the last call's along the walk\n"
            "axes (the LLaMA step's cache length, the BERT's sequence length, the others' batch), so no call\n"
            "meets a signature it has seen:\n"
            "each prepares its signature and launches its kernels one by one (no graph can exist yet). Python\n"
            "loader only, CUDA graphs on, kernels not run, cuBLAS's arithmetic skipped. Thread CPU time per\n"
            "call, the best of 15 blocks' medians; the torch stand-in's own work (tests/fake_torch.py) timed\n"
            "alone and subtracted in `bladepack + driver`. Python calls: bladepack's functions entered per\n"
            "call; stream syncs: cuStreamSynchronize per call in the fake's log."
            + (" The baseline rows are the other checkout's loader." if args.baseline else "")
            + f"\nMachine: {title(describe())}, no GPU.\n\n"
        )
        head = (
            walk_head
            if args.walk
            else (
                "# Host time per call on the fake driver: bladepack's own work per call, by kind of tensor\n\n"
                "`python -m bench.cuda_graphs --host --samples mlp,llama,encoder --repeat 1500 --baseline <checkout>`.\n"
                "Each sample at its smallest test shape, a repeated signature with CUDA graphs on (the replay\n"
                "paths), on the fake driver: kernels not run, cuBLAS's arithmetic skipped, nothing logged while\n"
                "timed. Thread CPU time per call, the best of 15 blocks' medians (the machine switches between a\n"
                "fast and a slow mode). The caller's framework is not ours: torch tensors are tests/fake_torch.py's\n"
                "stand-in, whose per-call work (the attribute reads, the current stream, torch.empty) is timed\n"
                "alone in the same process and subtracted; the DLPack producer is bladepack's Exported (a capsule\n"
                "per input), timed the same way. `bladepack + driver` is what remains: bladepack's Python and the\n"
                "fake driver's calls through cuda-python (~0.4 µs each plus the fake's own work; a real driver's\n"
                "copy or graph launch costs a few µs of CPU, which only a GPU run measures). Python calls: the\n"
                "functions of bladepack entered per call. Stream syncs: cuStreamSynchronize per call in the fake's\n"
                "log."
                + (
                    " The baseline rows are the other checkout's loader, run in the same process order."
                    if args.baseline
                    else ""
                )
                + f"\nMachine: {title(describe())}, no GPU.\n\n"
            )
        )
        if libraries != ("cublas",):
            head = head.replace(
                "\nMachine:",
                f"\nWith `--gemm-library {args.gemm_library}`: a row marked [cublaslt] is the same model with every"
                " GEMM on cuBLASLt (the fake's; Note [cuBLASLt GEMMs]), the unmarked one with cuBLAS, side by side.\nMachine:",
                1,
            )
    elif args.gpu and args.walk:
        rows = walk_times(names, args.repeat)
        tag = "cuda_walk_" + _device_tag()
        head = (
            f"# A decode loop on {torch.cuda.get_device_name()}: wall time per call at a new signature (µs)\n\n"
            "`python -m bench.cuda_graphs --gpu --walk`: each call one longer than the last along the\n"
            "sample's walk axes (the LLaMA step's cache length, the others' batch), torch CUDA tensors, the\n"
            "device synchronized at the end of each pass; best of three passes over fresh signatures.\n\n"
        )
    elif args.gpu:
        rows = gpu_times(names, args.repeat)
        tag = "cuda_graphs_" + _device_tag()
        head = (
            f"# CUDA graphs on {torch.cuda.get_device_name()}: wall time per call (µs)\n\n"
            "Calls issued back to back, the device synchronized at the end, best of five rounds; each\n"
            "sample at its smallest in-range shape. The floor is a torch.cuda.CUDAGraph of the eager model\n"
            "replayed on static inputs.\n\n"
        )
    else:
        rows = fake(names, args.calls)
        tag = "cuda_graphs"
        head = (
            "# CUDA graphs on the fake driver: driver calls per call at a repeated signature\n\n"
            "Counted by tests/fake_cuda (no GPU): kernel launches, graph launches and cuBLAS calls per call after\n"
            "two warm-up calls. Times on the fake say nothing about a GPU and are not reported.\n\n"
        )
    text = head + _table(rows) + "\n"
    (RESULTS / f"{tag}.md").write_text(text)
    (RESULTS / f"{tag}.json").write_text(json.dumps(rows, indent=1))
    print(text)


if __name__ == "__main__":
    main()
