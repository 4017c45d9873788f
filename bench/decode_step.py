"""Decode-step benchmark: the LLaMA sample at batch x KV-cache length where attention over the cache
dominates (per-head GEMMs with M = 1, K = head dim), against the same peers as bench.cpu_samples.

    python -m bench.decode_step [--peers eager,compile,ort] [--repeat 20]

Writes bench/results/decode_step.{md,json}. Runners interleave per shape (Note [Rounds] in
bench/cpu_samples.py); ratios are peer time / bladepack time.

`--walk` measures what a decode loop does instead: the cache grows by one token a call, so every call
is a shape the runner has not seen (bladepack prepares each signature once, Note [Prepared plans]).
Each runner walks the same `--steps` consecutive cache lengths per round, rounds on fresh lengths with
the runners' order rotated, best round kept; the table gives µs per step, and bladepack's time at one
repeated shape of the walk for scale. Writes bench/results/decode_walk.{md,json}.

    python -m bench.decode_step --walk [--peers eager,ort,aoti] [--steps 100]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import bladepack
from bench.cpu_samples import RESULTS, build_peers, geomean, measure
from samples.registry import SAMPLES

SHAPES = (
    {"batch": 1, "past": 1023},
    {"batch": 4, "past": 1023},
    {"batch": 8, "past": 512},
    {"batch": 16, "past": 200},
    {"batch": 16, "past": 1023},
)


WALKS = ({"batch": 1, "past": 32}, {"batch": 4, "past": 32}, {"batch": 1, "past": 600}, {"batch": 16, "past": 300})
WALK_ROUNDS = 3


def walk(runners: dict[str, Any], make: Callable[[int], Any], start: int, steps: int) -> dict[str, float]:
    """µs per step of each runner over `steps` consecutive cache lengths (fresh ones each round)."""
    row: dict[str, float] = {}
    order = list(runners)
    for rnd in range(WALK_ROUNDS):
        cases = [make(start + rnd * steps + i) for i in range(steps)]
        for peer in order[rnd % len(order) :] + order[: rnd % len(order)]:
            fn = runners[peer]
            t0 = time.perf_counter()
            for x in cases:
                fn(x)
            row[peer] = min(row.get(peer, float("inf")), (time.perf_counter() - t0) / steps * 1e6)
    return row


def _cpp_walk(path: Path, s: Any, dims: dict[str, int], steps: int, errors: dict[str, str]) -> float | None:
    """The C++ runtime's median µs per call over the same walk (`bench_runtime walk`), None where the
    runtime does not build here."""
    from tests import cpp_build

    try:
        build = cpp_build.build("release")
    except cpp_build.BuildError as e:
        errors["C++ runtime"] = str(e)[:300]
        return None
    x = s.make_inputs(torch.Generator().manual_seed(0), **dims)
    names = [t.name for t in bladepack.load(path).signature.inputs]
    cmd = [str(build / "bench_runtime"), "walk", str(path), "--repeat", str(steps)]
    for name, a in zip(names, x):
        cmd += ["--shape", f"{name}={','.join(str(n) for n in a.shape)}"]
    cmd += [a for name in ("past_k", "past_v") for a in ("--grow", f"{name}:2")]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return float(json.loads(out)["median_us"])


def walks(args: argparse.Namespace) -> None:
    torch.manual_seed(0)
    s = SAMPLES["llama"]
    model = s.build()
    with torch.no_grad():
        runners, errors, _ = build_peers("llama", args.peers.split(","), model, s.export_samples())
        runners = {p: r for p, r in runners.items() if p not in errors}
        art_path = Path(tempfile.mkdtemp()) / "llama.bpk"
        bladepack.optimize(model, s.export_samples(), s.dynamic_shapes).save(art_path)
        g = torch.Generator().manual_seed(1)
        rows = []
        for d in WALKS:

            def make(past: int, d: dict[str, int] = d) -> Any:
                return s.make_inputs(g, **{**d, "past": past})

            row: dict[str, float | None] = dict(walk(runners, make, d["past"], args.steps))
            fixed = make(d["past"] + WALK_ROUNDS * args.steps)
            row["repeated"] = measure({"bladepack": runners["bladepack"]}, fixed, 200, errors, "repeated")["bladepack"]
            row["C++ runtime"] = _cpp_walk(art_path, s, d, args.steps, errors)
            rows.append({"dims": d, **row})
            print(d, row, flush=True)
    peers = [p for p in runners if p != "bladepack"] + ["C++ runtime"]
    head = [
        f"# LLaMA decode loop, the cache one token longer each call, {platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads",
        "",
        f"µs per step over {args.steps} consecutive cache lengths from `past` (every call a new shape), best of "
        f"{WALK_ROUNDS} rounds on fresh lengths; `repeated`: bladepack at one shape of the walk, called again; "
        "`C++ runtime`: the same artifact in `bench_runtime walk` (its own process, the median call of the "
        "walk, outputs allocated per call).",
    ]
    _write("decode_walk", head, peers, rows, errors, ["repeated"])


def _write(
    name: str, head: list[str], peers: list[str], rows: list[dict[str, Any]], errors: dict[str, str], extra: list[str]
) -> None:
    """The table (bladepack's µs, the `extra` columns as they are, each peer's µs and ratio), the
    geomean ratios, and bench/results/`name`.{md,json}."""
    lines = [
        *head,
        "",
        "| dims | bladepack µs | "
        + "".join(f"{c} µs | " for c in extra)
        + " | ".join(f"{p} µs (x)" for p in peers)
        + " |",
        "|---|---|" + "---|" * (len(extra) + len(peers)),
    ]
    for r in rows:
        cells = ["n/a" if r.get(p) is None else f"{r[p]:.0f} ({r[p] / r['bladepack']:.2f}x)" for p in peers]
        fixed = "".join(f"{r[c]:.0f} | " for c in extra)
        lines.append(f"| {r['dims']} | {r['bladepack']:.0f} | {fixed}" + " | ".join(cells) + " |")
    gm = {p: geomean([r[p] / r["bladepack"] for r in rows if r.get(p)]) for p in peers}
    lines += ["", "geomean speedup: " + ", ".join(f"vs {p} {v:.2f}x" for p, v in gm.items())]
    lines += [f"\n{p} unavailable: {e}" for p, e in errors.items()]
    text = "\n".join(lines) + "\n"
    print(text)
    (RESULTS / f"{name}.md").write_text(text)
    (RESULTS / f"{name}.json").write_text(json.dumps({"rows": rows, "errors": errors}, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default="eager")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--walk", action="store_true", help="a decode loop: every call one token longer")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    if args.walk:
        walks(args)
        return
    torch.manual_seed(0)
    s = SAMPLES["llama"]
    model = s.build()
    with torch.no_grad():
        runners, errors, _ = build_peers("llama", args.peers.split(","), model, s.export_samples())
        g = torch.Generator().manual_seed(1)
        rows = [{"dims": d, **measure(runners, s.make_inputs(g, **d), args.repeat, errors, f"at {d}")} for d in SHAPES]
    peers = [p for p in runners if p != "bladepack"]
    head = [f"# LLaMA decode step, {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"]
    _write("decode_step", head, peers, rows, errors, [])


if __name__ == "__main__":
    main()
