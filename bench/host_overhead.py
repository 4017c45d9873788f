"""Host overhead of a call at a repeated input shape: the whole Python call minus the native run.

In: a 50-kernel chain (alternating cumsum and softmax rows, so nothing fuses), a run-time branch on
the values (torch.cond) and the samples at small shapes. Out: a markdown table (printed) and
bench/results/host_overhead.{json,md}.

    python -m bench.host_overhead [--repeat 2000]

`call` is `m(*inputs)` (torch tensors in and out, through the fast path); `native` is the library's
run of the same prepared launch list with no Python around it but the one foreign call; both are
measured interleaved, call by call, and the medians are compared.

The second table is the first call at a shape the module has not seen (Note [Prepared plans]): what
preparing one input-shape signature costs (registers, launch words, checks), timed alone at
`--shapes` distinct shapes — in the kernel library (Note [Native preparation], what a call does) and
in Python (the path of plans the library does not prepare) — and a first call at each new shape
against a second call at it (median of the differences; the arena already grown to the largest shape
first, so no allocation is timed). A server fed sequences of every length pays this on most calls.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from samples.registry import SAMPLES

RESULTS = Path(__file__).resolve().parent / "results"


class Chain(torch.nn.Module):
    """`n` kernels that cannot fuse: a scan, then a row softmax, alternating."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for k in range(self.n):
            x = torch.cumsum(x, -1) * 0.5 if k % 2 == 0 else torch.softmax(x, -1)
        return x


class Branch(torch.nn.Module):
    """A run-time branch on the values (torch.cond on the mean's sign): a Linear + ReLU or an exp."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.mean() > 0, lambda t: self.fc(t).relu(), lambda t: t.exp() * 0.5, (x,))


def measure(m: bladepack.LoadedModule, inputs: tuple[torch.Tensor, ...], repeat: int) -> dict[str, Any]:
    for _ in range(20):
        m(*inputs)
    fast = getattr(m._executor, "fast", None)
    native = getattr(m._executor, "native", None)
    assert fast is not None and native is not None, "the module must run natively with a fast path"
    plan = fast._plans[tuple(tuple(t.shape) for t in inputs)]
    st = fast._state(plan.arena_bytes)
    calls, runs = [], []
    for _ in range(repeat):
        t0 = time.perf_counter_ns()
        out = m(*inputs)  # held: the native run below writes into the same output memory
        t1 = time.perf_counter_ns()
        native.run_words(plan.words_arg.value, plan.words.size, st.slots_arg.value, st.status_arg.value)
        t2 = time.perf_counter_ns()
        del out
        calls.append(t1 - t0)
        runs.append(t2 - t1)
    call, run = statistics.median(calls) / 1e3, statistics.median(runs) / 1e3
    launches = int(sum(1 for lr in native.plan["launches"] if lr["op"] != "ref"))
    return {"launches": launches, "call_us": call, "native_us": run, "overhead_us": call - run}


def new_shapes(m: bladepack.LoadedModule, make: Any, sizes: list[int]) -> dict[str, Any]:
    """Per-signature build time and the first call's extra time at shapes `make(size)`."""
    ex = m._executor
    m(*make(max(sizes)))
    prepare = ex.fast._prepare
    assert prepare is not None, "the plan must be one the kernel library prepares"
    builds, natives, extra, calls = [], [], [], []
    for size in sizes:
        x = make(size)
        key = tuple(tuple(t.shape) for t in x)
        t0 = time.perf_counter_ns()
        ex._build(key)
        t1 = time.perf_counter_ns()
        assert prepare(key) is not None
        t2 = time.perf_counter_ns()
        m(*x)
        t3 = time.perf_counter_ns()
        m(*x)
        t4 = time.perf_counter_ns()
        builds.append(t1 - t0)
        natives.append(t2 - t1)
        extra.append((t3 - t2) - (t4 - t3))
        calls.append(t4 - t3)
    med = statistics.median
    return {
        "shapes": len(sizes),
        "native_us": med(natives) / 1e3,
        "build_us": med(builds) / 1e3,
        "first_extra_us": med(extra) / 1e3,
        "call_us": med(calls) / 1e3,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--shapes", type=int, default=60, help="distinct shapes for the first-call table")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows: list[dict[str, Any]] = []
    fresh: list[dict[str, Any]] = []
    sizes = list(range(2, 2 + args.shapes))
    with torch.no_grad():
        chain = Chain(50)
        art = bladepack.optimize(chain, [(torch.randn(2, 5),), (torch.randn(3, 9),)])
        m = bladepack.load(art.to_bytes())
        rows.append(
            {"model": "chain of 50 kernels", "dims": "x: 1 x 8", **measure(m, (torch.randn(1, 8),), args.repeat)}
        )
        fresh.append(
            {"model": "chain of 50 kernels", "dims": "x: n x 8", **new_shapes(m, lambda n: (torch.randn(n, 8),), sizes)}
        )
        branch = Branch().eval()
        batch = bladepack.Dim("batch", 1, 4096)
        art = bladepack.optimize(branch, [(torch.randn(3, 8),), (torch.randn(6, 8),)], ({0: batch},))
        m = bladepack.load(art.to_bytes())
        rows.append({"model": "run-time branch", "dims": "x: 32 x 8", **measure(m, (torch.rand(32, 8),), args.repeat)})
        fresh.append(
            {"model": "run-time branch", "dims": "x: n x 8", **new_shapes(m, lambda n: (torch.rand(n, 8),), sizes)}
        )
        for name, dims in (("encoder", {"batch": 1, "seq": 1}), ("llama", {"batch": 1, "past": 7})):
            s = SAMPLES[name]
            art = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes)
            m = bladepack.load(art.to_bytes())
            x = s.make_inputs(torch.Generator().manual_seed(1), **dims)
            rows.append({"model": name, "dims": str(dims), **measure(m, x, args.repeat)})
            axis = "seq" if name == "encoder" else "past"
            g = torch.Generator().manual_seed(2)
            fresh.append(
                {
                    "model": name,
                    "dims": f"{axis} = n",
                    **new_shapes(m, lambda n, s=s, axis=axis, dims=dims: s.make_inputs(g, **{**dims, axis: n}), sizes),
                }
            )
    lines = [
        "| model | shape | launches | call µs | native run µs | host overhead µs |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['dims']} | {r['launches']} | {r['call_us']:.1f} | {r['native_us']:.1f} "
            f"| {r['overhead_us']:.1f} |"
        )
    lines += [
        "",
        f"First call at a new shape ({args.shapes} shapes, n = 2..{1 + args.shapes}; medians):",
        "",
        "| model | shapes | launches | prepared natively µs | in Python µs | first call's extra µs | call µs |",
        "|---|---|---|---|---|---|---|",
    ]
    for r, base in zip(fresh, rows):
        lines.append(
            f"| {r['model']} | {r['dims']} | {base['launches']} | {r['native_us']:.1f} | {r['build_us']:.1f} "
            f"| {r['first_extra_us']:.1f} | {r['call_us']:.1f} |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "host_overhead.md").write_text(md)
    report = {
        "machine": platform.processor() or platform.machine(),
        "numpy": np.__version__,
        "rows": rows,
        "new_shapes": fresh,
    }
    (RESULTS / "host_overhead.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
