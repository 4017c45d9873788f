"""Resident memory over many loads and many shapes: both loaders must stay flat.

In: the samples. Out: a markdown table (printed) and bench/results/memory_soak.{json,md}.

    python -m bench.memory_soak [--cycles 1000] [--shapes 2000]

Each phase runs in a fresh process and reads its resident set (/proc/self/statm) at checkpoints:
- `python load/unload`: the MLP loaded from a file, called once, dropped; `--cycles` times.
- `python shapes`: the encoder with BLADEPACK_SHAPE_CACHE=256 called at 256 + `--shapes` distinct
  (batch, seq) signatures, so every call past the 256th evicts one prepared signature.
- `C++ load/unload` and `C++ shapes`: the same through the C API (ctypes over libbladepack_runtime),
  whose cache holds 4096 signatures: 4096 + `--shapes` of them.
Growth is the last checkpoint minus the first after warm-up (the first checkpoint absorbs one-time
costs: the kernel library, BLAS, thread pools, allocator arenas).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import ctypes, gc, json, os, sys
import numpy as np

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

phase, path, n, lib = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
marks = {}

def shapes(count):
    # distinct (batch, seq) in a fixed box, the largest first: the arena and the allocator reach their
    # high-water marks on the first call, so later growth is what the caches keep
    box = [(b, s) for b in range(1, 33) for s in range(1, 257)]
    rng = np.random.default_rng(0)
    order = [box[-1]] + [box[k] for k in rng.permutation(len(box) - 1)]
    assert count <= len(order)
    yield from order[:count]

if phase.startswith("cpp"):
    rt = ctypes.CDLL(lib)
    class Tensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("shape", ctypes.c_int64 * 16), ("ndim", ctypes.c_int32),
                    ("dtype", ctypes.c_int32)]
    rt.bpk_model_load.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    rt.bpk_model_free.argtypes = [ctypes.c_void_p]
    rt.bpk_model_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64]
    rt.bpk_free.argtypes = [ctypes.c_void_p]
    class Signature(ctypes.Structure):
        _fields_ = [("num_inputs", ctypes.c_int64), ("inputs", ctypes.c_void_p), ("num_outputs", ctypes.c_int64),
                    ("outputs", ctypes.c_void_p)]
    rt.bpk_model_signature.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.POINTER(Signature))]

    def tensor(a, dtype):
        t = Tensor()
        t.data = a.ctypes.data
        for k, d in enumerate(a.shape):
            t.shape[k] = d
        t.ndim, t.dtype = a.ndim, dtype
        return t

    def call(model, arrays, dtypes):
        sig = ctypes.POINTER(Signature)()
        assert rt.bpk_model_signature(model, ctypes.byref(sig)) == 0
        n_out = sig.contents.num_outputs
        ins = (Tensor * len(arrays))(*[tensor(a, d) for a, d in zip(arrays, dtypes)])
        out = (Tensor * n_out)()
        assert rt.bpk_model_run(model, ins, len(arrays), out, n_out) == 0
        for o in out:
            rt.bpk_free(o.data)

if phase == "python-cycles":
    import bladepack
    x = np.ones((5, 64), np.float32)
    for k in range(1, n + 1):
        m = bladepack.load(path)
        m(x)
        del m
        gc.collect()
        if k in (10, 100, n // 4, n // 2, n):
            marks[k] = rss_mib()
elif phase == "python-shapes":
    import bladepack
    m = bladepack.load(path)
    for k, (b, s) in enumerate(shapes(n), 1):
        m(np.ones((b, s), np.int64), np.ones((b, s), np.int64))
        if k in (256, 256 + (n - 256) // 4, 256 + (n - 256) // 2, n):
            marks[k] = rss_mib()
elif phase == "cpp-cycles":
    x = np.ones((5, 64), np.float32)
    for k in range(1, n + 1):
        model = ctypes.c_void_p()
        assert rt.bpk_model_load(path.encode(), None, ctypes.byref(model)) == 0
        call(model, [x], [0])
        rt.bpk_model_free(model)
        if k in (10, 100, n // 4, n // 2, n):
            marks[k] = rss_mib()
elif phase == "cpp-shapes":
    model = ctypes.c_void_p()
    assert rt.bpk_model_load(path.encode(), None, ctypes.byref(model)) == 0
    for k, (b, s) in enumerate(shapes(n), 1):
        ids = np.ones((b, s), np.int64)
        call(model, [ids, ids], [4, 4])
        if k in (4096, 4096 + (n - 4096) // 4, 4096 + (n - 4096) // 2, n):
            marks[k] = rss_mib()
print(json.dumps(marks))
"""


def _phase(phase: str, path: Path, n: int, lib: str, env: dict[str, str]) -> dict[int, float]:
    r = subprocess.run(
        [sys.executable, "-c", CHILD, phase, str(path), str(n), lib],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
        timeout=3600,
    )
    if r.returncode:
        raise RuntimeError(f"{phase}: {r.stderr[-3000:]}")
    return {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}


def main() -> None:
    import torch

    import bladepack
    from samples.registry import SAMPLES
    from tests import cpp_build

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cycles", type=int, default=1000)
    p.add_argument("--shapes", type=int, default=2000, help="distinct signatures past each cache's bound")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bladepack-soak-"))
    paths = {}
    for name in ("mlp", "encoder"):
        s = SAMPLES[name]
        torch.manual_seed(0)
        paths[name] = work / f"{name}.bpk"
        bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes).save(paths[name])
    lib = str(cpp_build.build("release") / "libbladepack_runtime.so")
    phases = [
        ("python load/unload", "python-cycles", "mlp", args.cycles, {}),
        ("python shapes (cache 256)", "python-shapes", "encoder", 256 + args.shapes, {"BLADEPACK_SHAPE_CACHE": "256"}),
        ("C++ load/unload", "cpp-cycles", "mlp", args.cycles, {}),
        ("C++ shapes (cache 4096)", "cpp-shapes", "encoder", 4096 + args.shapes, {}),
    ]
    rows: list[dict[str, Any]] = []
    for label, phase, sample, n, env in phases:
        marks = _phase(phase, paths[sample], n, lib, env)
        first, last = min(marks), max(marks)
        rows.append(
            {
                "phase": label,
                "rss_mib": {str(k): round(v, 1) for k, v in sorted(marks.items())},
                "growth_mib": round(marks[last] - marks[first], 2),
                "from": first,
                "to": last,
            }
        )
        print(rows[-1], flush=True)
    lines = [
        f"# Resident memory over loads and shapes ({platform.node()}, {platform.processor() or platform.machine()})",
        "",
        "`python -m bench.memory_soak`: RSS (MiB) at checkpoints (call or cycle number); growth is the last",
        "checkpoint minus the first.",
        "",
        "| phase | RSS at checkpoints (MiB) | growth | over |",
        "|---|---|---|---|",
    ]
    for r in rows:
        marks_text = ", ".join(f"{k}: {v}" for k, v in r["rss_mib"].items())
        lines.append(f"| {r['phase']} | {marks_text} | {r['growth_mib']:+.2f} MiB | {r['from']} to {r['to']} |")
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "memory_soak.md").write_text(text)
    (RESULTS / "memory_soak.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
