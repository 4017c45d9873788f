"""CUDA graphs: driver launches and host time per call, with graphs on and off, in both loaders.

Without a GPU (the default here) it runs on the fake driver of tests/cuda_harness.py with the kernels
emulated, and reports what the fake can count honestly: driver launches per call at a repeated
signature (kernel launches, graph launches, cuBLAS calls) for the Python loader and the C++ runtime,
graphs on and off. The fake's times say nothing about a GPU and are not reported. With `--gpu` (a
CUDA device and torch with CUDA) it measures host time per call on the GPU instead: the Python loader
on torch tensors (median of `--repeat` calls, wall clock, the stream synchronized once at the end:
enqueue cost) and `bpk-run --repeat` (whole calls from host memory), graphs on and off.

`--host` (no GPU) times what bladepack itself does per call — on the fake driver with the kernels
not run and nothing logged, so the driver's calls cost next to nothing — for the samples and a chain of
50 kernels (the issue's "50-kernel plan"): Python loader and C++ runtime (`bpk-run --repeat`), graphs on
and off, host tensors in and out. A real driver adds its own cost per launch (a few µs each, one
graph launch with graphs), which only a GPU run measures.

    python -m bench.cuda_graphs [--samples mlp,llama] [--gpu | --host] [--repeat 200]
Out: bench/results/cuda_graphs.md (fake) or cuda_graphs_<device>.md (GPU), and .json.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
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


def gpu_times(names: list[str], repeat: int) -> list[dict[str, Any]]:
    from tests import cpp_build

    bpk_run = cpp_build.build("release") / "bpk-run"
    rows = []
    work = Path(tempfile.mkdtemp(prefix="bpk-graphs-"))
    for name in names:
        s = SAMPLES[name]
        art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=("cpu", "cuda"))
        path = work / f"{name}.bpk"
        art.save(path)
        dims = _small_case(name, {sym.name: sym.min for sym in art.plan.symbols})
        g = torch.Generator().manual_seed(0)
        host = s.make_inputs(g, **dims)
        dev = tuple(t.cuda() for t in host)
        for graphs in (False, True):
            m = bladepack.load(path, device="cuda", graphs=graphs)
            for _ in range(5):
                m(*dev)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(repeat):
                m(*dev)
            enqueue = (time.perf_counter() - t0) / repeat * 1e6
            torch.cuda.synchronize()
            names = [t.name for t in art.plan.inputs]
            _, flags = _npy_inputs(work, name, names, tuple(a.numpy() for a in host))
            median, err = _bpk_run_median(bpk_run, path, flags, repeat, graphs)
            rows.append(
                {
                    "sample": name,
                    "shape": dims,
                    "graphs": graphs,
                    "python enqueue us/call (torch tensors)": round(enqueue, 1),
                    "c++ whole call us (host tensors)": median,
                    "error": None if median is not None else err.strip()[-300:],
                }
            )
    return rows


class Chain50(torch.nn.Module):
    """50 CUDA kernels that do not fuse: softmax rows alternating with scans."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(50):
            x = torch.softmax(x * (1.0 + 0.01 * i), dim=-1) if i % 2 else torch.cumsum(x, dim=-1) * 0.1
        return x


_HOST_SCRIPT = r"""
import sys, time, numpy as np, bladepack
m = bladepack.load(sys.argv[1], device="cuda", graphs=sys.argv[2] == "1")
xs = [np.load(f) for f in sys.argv[4:]]
for _ in range(50):
    m(*xs)
n = int(sys.argv[3])
times = []
for _ in range(n):
    t0 = time.perf_counter()
    m(*xs)
    times.append(time.perf_counter() - t0)
times.sort()
print(times[len(times) // 2] * 1e6)
"""


def host_cost(names: list[str], repeat: int) -> list[dict[str, Any]]:
    import os
    import sys

    from tests import cpp_build
    from tests.cuda_harness import FakeGpu

    bpk_run = cpp_build.build("release") / "bpk-run"
    work = Path(tempfile.mkdtemp(prefix="bpk-host-"))
    gpu = FakeGpu(work)
    env = {**os.environ, "LD_LIBRARY_PATH": str(work), "BLADEPACK_CUBLAS": str(work / "libcublas.so")}
    for key in ("FAKE_CUDA_EMU", "FAKE_CUDA_LOG"):
        env.pop(key, None)
    models: list[tuple[str, Any, dict[str, int], tuple[np.ndarray, ...]]] = []
    b = torch.export.Dim("b", min=1, max=64)
    chain = bladepack.optimize(Chain50(), [(torch.randn(4, 32),)], ({0: b},), targets=("cpu", "cuda:sm_90"))
    models.append(
        (
            "chain of 50 kernels",
            chain,
            {"b": 4},
            (np.random.default_rng(0).standard_normal((4, 32)).astype(np.float32),),
        )
    )
    for name in names:
        s = SAMPLES[name]
        art = bladepack.optimize(s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=("cpu", "cuda:sm_90"))
        dims = _small_case(name)
        g = torch.Generator().manual_seed(0)
        models.append((name, art, dims, tuple(a.numpy() for a in s.make_inputs(g, **dims))))
    rows = []
    for label, art, dims, arrays in models:
        path = work / f"{label.split()[0]}.bpk"
        art.save(path)
        files, flags = _npy_inputs(work, path.stem, [t.name for t in art.plan.inputs], arrays)
        launches = sum(1 for lr in art._parts()[0]["native_cuda"]["launches"] if lr["op"] != "ref")
        for graphs in (False, True):
            py = subprocess.run(
                [sys.executable, "-c", _HOST_SCRIPT, str(path), "1" if graphs else "0", str(repeat), *files],
                capture_output=True,
                text=True,
                env={**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
            )
            median, err = _bpk_run_median(bpk_run, path, flags, repeat, graphs, env)
            rows.append(
                {
                    "model": label,
                    "shape": dims,
                    "launches in the plan": launches,
                    "graphs": graphs,
                    "python us/call": round(float(py.stdout.strip().splitlines()[-1]), 1)
                    if py.returncode == 0
                    else py.stderr[-200:],
                    "c++ us/call": median if median is not None else err[-200:],
                }
            )
    del gpu
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", default="mlp,encoder,llama,cnn")
    ap.add_argument("--gpu", action="store_true", help="measure on a real GPU (else: count on the fake driver)")
    ap.add_argument("--host", action="store_true", help="no GPU: bladepack's own host time per call on the fake")
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--calls", type=int, default=3, help="fake driver: calls counted after warm-up")
    args = ap.parse_args()
    names = args.samples.split(",")
    RESULTS.mkdir(exist_ok=True)
    if args.host:
        rows = host_cost(names, args.repeat)
        tag = "cuda_host_cost"
        head = (
            "# Host time per call on the fake driver (kernels not run, nothing logged): bladepack's own work\n\n"
            "Median of the calls after 50 warm-up calls, one process per loader and setting, host tensors in\n"
            "and out. A real driver adds its per-launch cost (one graph launch per call with graphs), which\n"
            "only a GPU run measures. Without graphs the fake's own launch (it formats each launch's\n"
            "arguments) inflates the figures; the samples' GEMMs run on the fake cuBLAS on the host, inside\n"
            "the graph too, so only the chain and the CNN show bladepack's own cost. Machine: the 2-core\n"
            "CPU box (noisy).\n\n"
        )
    elif args.gpu:
        rows = gpu_times(names, args.repeat)
        tag = "cuda_graphs_" + re.sub(r"[^A-Za-z0-9]+", "_", torch.cuda.get_device_name()).strip("_")
        head = f"# CUDA graphs on {torch.cuda.get_device_name()}: host time per call\n\n"
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
