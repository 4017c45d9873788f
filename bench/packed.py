"""Packed execution against running each request alone and against padding them to one batch, in one
process, on the CPU (Note [Packed sequences]).

In: the mixed serving benchmark's models (a BERT-style encoder and a LLaMA-style decoder's prefill from
transformers configs, hidden 256, 4 layers) optimized with packed=True, and groups of `--group` requests
whose lengths are the mixed workload's (log-normal, median 48, clipped to 8-512). Out: per model, the
median time to serve a group three ways — each request alone (a call per request: merging off), all
padded to the group's longest in one call (padded merging without a budget), and packed in one call
(`run_packed`) — with requests per second and the ratios, printed and written to `--out` (.md, .json).
Each round times every way on the same group, the ways in turn, so drift hits all alike; results are
checked against each other (within 1e-4) before timing.

    python -m bench.packed [--group 16] [--groups 8] [--rounds 5] [--out bench/results/packed]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from bench.cpp_runtime import machine
from bench.serving import _mixed_lengths, _mixed_model


def _ways(m: Any, reqs: list[list[np.ndarray]]) -> dict[str, Any]:
    lengths = [r[0].shape[1] for r in reqs]
    longest = max(lengths)
    padded = [np.zeros((len(reqs), longest), np.int64) for _ in range(2)]
    for i, r in enumerate(reqs):
        for k in range(2):
            padded[k][i, : lengths[i]] = r[k][0]
    packed = [np.concatenate([r[k] for r in reqs], 1) for k in range(2)]
    return {
        "alone": lambda: [m.run(r)[0] for r in reqs],
        "padded": lambda: m.run(padded)[0],
        "packed": lambda: m.run_packed(packed, lengths)[0],
    }


def _check(ways: dict[str, Any], lengths: list[int]) -> None:
    alone = ways["alone"]()
    padded, packed = ways["padded"](), ways["packed"]()
    for i, (n, want) in enumerate(zip(lengths, alone)):
        start = sum(lengths[:i])
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(padded[i, :n] - want[0]).max() <= 1e-4 * scale
        assert np.abs(packed[0, start : start + n] - want[0]).max() <= 1e-4 * scale


def bench(kind: str, group: int, groups: int, rounds: int) -> dict[str, Any]:
    model = _mixed_model(kind)
    batch, seq = bladepack.Dim("batch", 1, 16), bladepack.Dim("seq", 1, 512)
    samples = [(torch.randint(3, 1000, (b, t)), torch.ones(b, t, dtype=torch.int64)) for b, t in ((2, 9), (3, 17))]
    t0 = time.perf_counter()
    art = bladepack.optimize(
        model, samples, {"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}}, reference_cases=False, packed=True
    )
    built = time.perf_counter() - t0
    m = bladepack.load(art.to_bytes())
    lengths = _mixed_lengths(group * groups, seed=1)
    g = torch.Generator().manual_seed(0)
    rows = []
    for j in range(groups):
        lens = lengths[j * group : (j + 1) * group]
        reqs = [[torch.randint(3, 1000, (1, n), generator=g).numpy(), np.ones((1, n), np.int64)] for n in lens]
        ways = _ways(m, reqs)
        _check(ways, lens)
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(rounds):
            for w, fn in ways.items():
                t = time.perf_counter()
                fn()
                times[w].append(time.perf_counter() - t)
        med = {w: statistics.median(v) for w, v in times.items()}
        rows.append(
            {
                "tokens": sum(lens),
                "padded_tokens": len(lens) * max(lens),
                "longest": max(lens),
                **{f"{w}_ms": med[w] * 1e3 for w in ways},
                "packed_vs_alone": med["alone"] / med["packed"],
                "packed_vs_padded": med["padded"] / med["packed"],
            }
        )
        print(f"{kind} group {j}: {rows[-1]}", flush=True)
    total = {w: sum(r[f"{w}_ms"] for r in rows) for w in ("alone", "padded", "packed")}
    return {
        "optimize_s": built,
        "groups": rows,
        "requests_per_s": {w: group * groups / (t / 1e3) for w, t in total.items()},
        "packed_vs_alone": total["alone"] / total["packed"],
        "packed_vs_padded": total["padded"] / total["packed"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--models", default="encoder,decoder")
    ap.add_argument("--out", default="bench/results/packed")
    args = ap.parse_args()
    torch.manual_seed(0)
    results: dict[str, Any] = {"machine": machine(), "group": args.group, "groups": args.groups, "models": {}}
    for kind in args.models.split(","):
        results["models"][kind] = bench(kind, args.group, args.groups, args.rounds)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    lines = [
        "# Packed execution on the CPU (`python -m bench.packed`)",
        "",
        f"Machine: {results['machine']}. Groups of {args.group} requests, lengths log-normal (median 48, 8-512);",
        "per group the median of the rounds; one process, the three ways in turn on the same group.",
        "",
        "| model | group | tokens | padded tokens | alone ms | padded ms | packed ms | packed vs alone | packed vs padded |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, r in results["models"].items():
        for j, g in enumerate(r["groups"]):
            lines.append(
                f"| {kind} | {j} | {g['tokens']} | {g['padded_tokens']} | {g['alone_ms']:.2f} | {g['padded_ms']:.2f} | "
                f"{g['packed_ms']:.2f} | {g['packed_vs_alone']:.2f}x | {g['packed_vs_padded']:.2f}x |"
            )
        rps = r["requests_per_s"]
        lines.append(
            f"| **{kind}, all groups** | | | | {rps['alone']:.0f} req/s | {rps['padded']:.0f} req/s | "
            f"{rps['packed']:.0f} req/s | **{r['packed_vs_alone']:.2f}x** | **{r['packed_vs_padded']:.2f}x** |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
