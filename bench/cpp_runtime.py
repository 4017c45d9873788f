"""The C++ runtime's host overhead per call and its load time, next to the Python loader's.

In: the 50-kernel chain and the samples at small shapes (host overhead), the samples at large shapes
(whole calls), and an MLP with 100 MB of float32 weights (load time). Out: a markdown table (printed) and bench/results/cpp_runtime.{json,md}.

    python -m bench.cpp_runtime [--repeat 2000]

Host overhead: `call` is a whole `bpk_model_run` at a repeated shape (caller-owned outputs, as a
server reuses them); `native` is the kernel library's run of the same prepared launch list with
nothing around it; both are measured interleaved, call by call, in one process (cpp_runtime/bench/
bench_runtime.cpp); the overhead is the median of the per-pair differences. The Python loader's figures come from
bench.host_overhead.measure on the same artifacts, in this process. Load: `bpk_model_load` of a file in
the page cache (memory-mapped), with and without section checksums, against `bladepack.load`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from bench.host_overhead import Chain, measure
from bench.machine import describe
from samples.registry import SAMPLES
from tests import cpp_build

RESULTS = Path(__file__).resolve().parent / "results"


class Wide(torch.nn.Module):
    """Four 2560 x 2560 float32 layers: 100 MiB of weights."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(2560, 2560, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def _bench(build: Path, *args: str) -> dict[str, Any]:
    r = subprocess.run([str(build / "bench_runtime"), *args], capture_output=True, text=True, check=True)
    return dict(json.loads(r.stdout))


def host_rows(build: Path, tmp: Path, repeat: int) -> list[dict[str, Any]]:
    rows = []
    cases: list[tuple[str, torch.nn.Module, Any, Any, tuple[torch.Tensor, ...]]] = [
        ("chain of 50 kernels", Chain(50), [(torch.randn(2, 5),), (torch.randn(3, 9),)], None, (torch.randn(1, 8),))
    ]
    for name, dims in (("mlp", {"batch": 1}), ("encoder", {"batch": 1, "seq": 1}), ("llama", {"batch": 1, "past": 7})):
        s = SAMPLES[name]
        x = s.make_inputs(torch.Generator().manual_seed(1), **dims)
        cases.append((name, s.build(), s.export_samples(), s.dynamic_shapes, x))
    with torch.no_grad():
        for name, model, samples, dyn, x in cases:
            path = tmp / f"{name.split()[0]}.bpk"
            bladepack.optimize(model, samples, dyn).save(path)
            m = bladepack.load(path)
            shapes = [f"{t.name}={','.join(str(d) for d in a.shape)}" for t, a in zip(m.signature.inputs, x)]
            cpp = _bench(
                build, "host", str(path), *(a for s in shapes for a in ("--shape", s)), "--repeat", str(repeat)
            )
            py = measure(m, x, repeat)
            rows.append(
                {
                    "model": name,
                    "shapes": " ".join(shapes),
                    "launches": cpp["launches"],
                    "cpp_call_us": cpp["call_us"],
                    "cpp_native_us": cpp["native_us"],
                    "cpp_overhead_us": cpp["overhead_us"],
                    "python_overhead_us": py["overhead_us"],
                    "isa": cpp["isa"],
                    "blas": cpp["blas"],
                }
            )
    return rows


def latency_rows(build: Path, tmp: Path, repeat: int) -> list[dict[str, Any]]:
    """Whole calls at a large shape per sample: the C++ runtime against the Python loader (numpy in and
    out), alternating blocks of calls."""
    rows = []
    for name in sorted(SAMPLES):
        s = SAMPLES[name]
        dims = {k: max(v for v in vals if v <= 300) for k, vals in s.test_dims.items()}
        x = [t.numpy() for t in s.make_inputs(torch.Generator().manual_seed(2), **{**s.base_dims, **dims})]
        path = tmp / f"large-{name}.bpk"
        bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes).save(path)
        m = bladepack.load(path)
        shapes = [f"{t.name}={','.join(str(d) for d in a.shape)}" for t, a in zip(m.signature.inputs, x)]
        cpp, py = [], []
        for _ in range(3):
            r = _bench(
                build, "host", str(path), *(a for s_ in shapes for a in ("--shape", s_)), "--repeat", str(repeat)
            )
            cpp.append(r["call_us"])
            for _ in range(5):
                m.run(x)
            t = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                m.run(x)
                t.append((time.perf_counter() - t0) * 1e6)
            py.append(statistics.median(t))
        c, p_ = statistics.median(cpp), statistics.median(py)
        rows.append(
            {"model": name, "shapes": " ".join(shapes), "cpp_us": c, "python_us": p_, "python_over_cpp": p_ / c}
        )
    return rows


def load_rows(build: Path, tmp: Path, repeat: int) -> list[dict[str, Any]]:
    path = tmp / "wide.bpk"
    torch.manual_seed(0)
    with torch.no_grad():
        bladepack.optimize(Wide(), [(torch.randn(2, 2560),), (torch.randn(3, 2560),)]).save(path)
    size = path.stat().st_size
    rows = []
    for verify in (False, True):
        cpp = _bench(build, "load", str(path), "--repeat", str(repeat), *([] if verify else ["--no-verify"]))
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            m = bladepack.load(path, verify=verify)
            times.append((time.perf_counter() - t0) * 1e3)
            del m
        py = statistics.median(times)
        rows.append(
            {
                "artifact_mb": size / 2**20,
                "verify": verify,
                "cpp_ms": cpp["median_ms"],
                "python_ms": py,
                "python_over_cpp": py / cpp["median_ms"],
            }
        )
    return rows


def machine() -> str:
    """The CPU model and the number of CPUs this process may use."""
    m = describe()
    return f"{m['cpu']}, {m['cpus']} CPUs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    args = ap.parse_args()
    build = cpp_build.build("release")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        host = host_rows(build, tmp, args.repeat)
        load = load_rows(build, tmp, 20)
        latency = latency_rows(build, tmp, 30)
    lines = [
        f"Machine: {machine()}; kernels {host[0]['isa']}, BLAS {host[0]['blas']}.",
        "",
        "Host overhead per call at a repeated shape (median; target <= 5 µs):",
        "",
        "| model | input shapes | launches | C++ call µs | kernels alone µs | C++ host overhead µs | Python host overhead µs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in host:
        lines.append(
            f"| {r['model']} | {r['shapes']} | {r['launches']} | {r['cpp_call_us']:.1f} | {r['cpp_native_us']:.1f} "
            f"| {r['cpp_overhead_us']:.2f} | {r['python_overhead_us']:.2f} |"
        )
    lines += [
        "",
        "Whole calls at a large shape (median of three alternating blocks of 30 calls):",
        "",
        "| model | input shapes | C++ µs | Python µs | Python / C++ |",
        "|---|---|---|---|---|",
    ]
    for r in latency:
        lines.append(
            f"| {r['model']} | {r['shapes']} | {r['cpp_us']:.0f} | {r['python_us']:.0f} | {r['python_over_cpp']:.2f}x |"
        )
    lines += [
        "",
        "Load time of a 100 MiB-weight artifact, file in the page cache (median of 20; target <= 20 ms):",
        "",
        "| artifact MiB | section checksums | C++ ms | Python ms | Python / C++ |",
        "|---|---|---|---|---|",
    ]
    for r in load:
        lines.append(
            f"| {r['artifact_mb']:.1f} | {'verified' if r['verify'] else 'skipped'} | {r['cpp_ms']:.2f} "
            f"| {r['python_ms']:.2f} | {r['python_over_cpp']:.2f}x |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cpp_runtime.md").write_text(md)
    report = {
        "machine": machine(),
        "numpy": np.__version__,
        "host": host,
        "latency": latency,
        "load": load,
    }
    (RESULTS / "cpp_runtime.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
