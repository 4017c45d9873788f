"""Decode-step benchmark: the LLaMA sample at batch x KV-cache length where attention over the cache
dominates (per-head GEMMs with M = 1, K = head dim), against the same peers as bench.cpu_samples.

    python -m bench.decode_step [--peers eager,compile,ort] [--repeat 20]

Writes bench/results/decode_step.{md,json}. Runners interleave per shape (Note [Rounds] in
bench/cpu_samples.py); ratios are peer time / bladepack time.
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from bench.cpu_samples import RESULTS, build_peers, geomean, measure
from samples.registry import SAMPLES

SHAPES = (
    {"batch": 1, "past": 1023},
    {"batch": 4, "past": 1023},
    {"batch": 8, "past": 512},
    {"batch": 16, "past": 200},
    {"batch": 16, "past": 1023},
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default="eager")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    s = SAMPLES["llama"]
    model = s.build()
    with torch.no_grad():
        runners, errors, _ = build_peers("llama", args.peers.split(","), model, s.export_samples())
        g = torch.Generator().manual_seed(1)
        rows = [{"dims": d, **measure(runners, s.make_inputs(g, **d), args.repeat, errors, f"at {d}")} for d in SHAPES]
    peers = [p for p in runners if p != "bladepack"]
    lines = [
        f"# LLaMA decode step, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads",
        "",
        "| dims | bladepack µs | " + " | ".join(f"{p} µs (x)" for p in peers) + " |",
        "|---|---|" + "---|" * len(peers),
    ]
    for r in rows:
        cells = ["n/a" if r.get(p) is None else f"{r[p]:.0f} ({r[p] / r['bladepack']:.2f}x)" for p in peers]
        lines.append(f"| {r['dims']} | {r['bladepack']:.0f} | " + " | ".join(cells) + " |")
    gm = {p: geomean([r[p] / r["bladepack"] for r in rows if r.get(p)]) for p in peers}
    lines += ["", "geomean speedup: " + ", ".join(f"vs {p} {v:.2f}x" for p, v in gm.items())]
    lines += [f"\n{p} unavailable: {e}" for p, e in errors.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    (RESULTS / "decode_step.md").write_text(text)
    (RESULTS / "decode_step.json").write_text(json.dumps({"rows": rows, "errors": errors}, indent=1, default=str))


if __name__ == "__main__":
    main()
