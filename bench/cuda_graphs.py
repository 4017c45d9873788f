"""CUDA graphs: driver launches and host time per call, with graphs on and off, in both loaders.

Without a GPU (the default here) it runs on the fake driver of tests/cuda_harness.py with the kernels
emulated, and reports what the fake can count honestly: driver launches per call at a repeated
signature (kernel launches, graph launches, cuBLAS calls) for the Python loader and the C++ runtime,
graphs on and off. The fake's times say nothing about a GPU and are not reported. With `--gpu` (a
CUDA device and torch with CUDA) it measures host time per call on the GPU instead: the Python loader
on torch tensors (median of `--repeat` calls, wall clock, the stream synchronized once at the end:
enqueue cost) and `bpk-run --repeat` (whole calls from host memory), graphs on and off.

    python -m bench.cuda_graphs [--samples mlp,llama] [--gpu] [--repeat 200]
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


def _small_case(name: str) -> dict[str, int]:
    """The sample's smallest test shape: where per-call host cost matters most."""
    s = SAMPLES[name]
    return min(s.test_cases(), key=lambda d: sum(d.values()))


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
        dims = _small_case(name)
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
            flags = []
            for t, a in zip(art.plan.inputs, host):
                f = work / f"{name}-{t.name}.npy"
                np.save(f, a.numpy())
                flags += ["--input", f"{t.name}={f}"]
            r = subprocess.run(
                [str(bpk_run), str(path), "--device", "cuda", *flags, "--repeat", str(repeat)]
                + ([] if graphs else ["--cuda-graphs", "-1"]),
                capture_output=True,
                text=True,
            )
            med = re.search(r"median ([\d.]+)", r.stdout)
            rows.append(
                {
                    "sample": name,
                    "shape": dims,
                    "graphs": graphs,
                    "python enqueue us/call (torch tensors)": round(enqueue, 1),
                    "c++ whole call us (host tensors)": float(med.group(1)) if med else None,
                    "error": None if r.returncode == 0 else r.stderr.strip()[-300:],
                }
            )
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
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--calls", type=int, default=3, help="fake driver: calls counted after warm-up")
    args = ap.parse_args()
    names = args.samples.split(",")
    RESULTS.mkdir(exist_ok=True)
    if args.gpu:
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
