"""Structural mutations of a real manifest, re-hashed, against both loaders: crashes, hangs, stray errors.

    python scripts/mutation_campaign.py [--count 500] [--seed 0] [--sample mlp] [--bpk-run PATH] [--jobs 2]
                                        [--verify]

Each case edits the sample's manifest at random (an integer set to an edge value, a list cut, emptied
or grown, a map key dropped, a value replaced by another type or by a deeply nested list), recomputes
every checksum, and runs one call of the artifact in its own process: the Python loader and, with
--bpk-run, the C++ runtime. Outcomes per loader: `ok` (it ran), `refused` (a BladepackError / exit 1
with the runtime's reason), `stray` (another exception escaped), `crash` (a signal), `hang` (past 30 s).
Prints the counts and the first stray, crash and hang cases (with the mutation that made them).
With --verify the mutations edit only the reference cases (docs/format.md "Reference cases") and each
case runs `verify()` / `bpk-run --verify` instead of a call; a verify that reports failing cases is `ok`.
"""

from __future__ import annotations

import argparse
import copy
import random
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

import bladepack
from bladepack.artifact import format as bpk_format
from samples.registry import SAMPLES

EDGES = [-1, 0, 1, 2, 7, 64, 2**31 - 1, 2**31, 2**40, 2**62, -(2**63), 2**63 - 1, 10**9]
CHILD = """
import sys, numpy as np
import bladepack
try:
    m = bladepack.load(sys.argv[1])
    args = [np.load(f) for f in sys.argv[2:]]
    m(*args)
    print("ok")
except bladepack.BladepackError as e:
    print("refused", type(e).__name__)
"""
VERIFY_CHILD = """
import sys
import bladepack
try:
    bladepack.load(sys.argv[1]).verify()
    print("ok")
except bladepack.BladepackError as e:
    print("refused", type(e).__name__)
"""


def _paths(x: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(x, dict):
        for k, v in x.items():
            out += _paths(v, (*at, k))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            out += _paths(v, (*at, i))
    return out


def _get(x: Any, path: tuple[Any, ...]) -> Any:
    for k in path:
        x = x[k]
    return x


def mutate(manifest: dict[str, Any], rng: random.Random, under: str = "") -> tuple[dict[str, Any], str]:
    m = copy.deepcopy(manifest)
    paths = [p for p in _paths(m) if p and (not under or (p[0] == under and len(p) > 1))]
    path = rng.choice(paths)
    parent, key = _get(m, path[:-1]), path[-1]
    value = parent[key]
    kind = rng.random()
    if isinstance(value, int) and not isinstance(value, bool) and kind < 0.7:
        new: Any = rng.choice([*EDGES, value + rng.choice([-1, 1])])
        what = f"{path} = {new}"
    elif isinstance(value, list) and kind < 0.6:
        op = rng.choice(["cut", "empty", "grow"])
        new = value[: len(value) // 2] if op == "cut" else [] if op == "empty" else value + value[-1:]
        what = f"{path}: {op} list"
    elif isinstance(parent, dict) and kind < 0.8:
        del parent[key]
        return m, f"{path}: key dropped"
    else:
        depth = rng.choice([1, 3, 1000])
        nested: Any = 1
        for _ in range(depth):
            nested = [nested]
        choices = {"text": "text", "nil": None, "float": 1.5, "[]": [], "{}": {}, f"list nested {depth} deep": nested}
        label = rng.choice([*choices, "register 10**6"])
        new = choices.get(label, {"r": 10**6})
        what = f"{path} = {label}"
    parent[key] = new
    return m, what


def _run(cmd: list[str]) -> tuple[str, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "hang", ""
    if r.returncode < 0:
        return "crash", f"signal {-r.returncode}"
    out = r.stdout.strip().splitlines()
    if r.returncode == 0 and out and out[-1] in ("ok",):
        return "ok", ""
    if r.returncode == 0 and out and out[-1].startswith("refused"):
        return "refused", out[-1]
    if cmd[0].endswith("bpk-run") and r.returncode == 0:
        return "ok", ""
    if cmd[0].endswith("bpk-run") and r.returncode == 1 and "\nverify: FAILED (" in r.stdout:
        return "ok", ""
    if cmd[0].endswith("bpk-run") and r.returncode == 1 and r.stderr.startswith("bpk-run: "):
        return "refused", r.stderr.strip()[:200]
    return "stray", (r.stderr.strip().splitlines() or ["?"])[-1][:300]


@dataclass(frozen=True)
class Cases:
    """Mutated artifacts on disk (`files[k]` made by `mutations[k]`) and the input files one call reads."""

    files: list[Path]
    mutations: list[str]
    input_names: list[str]
    input_files: list[Path]


def make_cases(
    artifact: bytes, inputs: Sequence[np.ndarray], count: int, seed: int, work: Path, under: str = ""
) -> Cases:
    """`count` structural mutations of `artifact`'s manifest (of its `under` entry only, when given),
    every checksum recomputed."""
    bpk = bpk_format.read(artifact)
    sections = [bpk_format.Section(n, bytes(bpk.section(n))) for n in bpk.section_names]
    base = {k: v for k, v in bpk.manifest.items() if k != "sections"}
    names = [t.name for t in bladepack.load(artifact).signature.inputs]
    in_files = []
    for name, a in zip(names, inputs):
        np.save(work / f"{name}.npy", a)
        in_files.append(work / f"{name}.npy")
    rng = random.Random(seed)
    files, mutations = [], []
    for k in range(count):
        manifest, what = mutate(base, rng, under)
        path = work / f"{k}.bpk"
        path.write_bytes(b"".join(bytes(c) for c in bpk_format.encode(manifest, sections)))
        files.append(path)
        mutations.append(what)
    return Cases(files, mutations, names, in_files)


def run_cases(
    cases: Cases, bpk_run: str | None, jobs: int, work: Path, verify: bool = False
) -> list[tuple[str, str, str, str]]:
    """Each case in its own process, per loader: rows (loader, outcome, detail, mutation)."""

    def one(k: int) -> list[tuple[str, str, str, str]]:
        path, what = cases.files[k], cases.mutations[k]
        if verify:
            rows = [("python", *_run([sys.executable, "-c", VERIFY_CHILD, str(path)]), what)]
            if bpk_run:
                rows.append(("bpk-run", *_run([bpk_run, str(path), "--verify"]), what))
            return rows
        rows = [("python", *_run([sys.executable, "-c", CHILD, str(path), *map(str, cases.input_files)]), what)]
        if bpk_run:
            flags = [x for n, f in zip(cases.input_names, cases.input_files) for x in ("--input", f"{n}={f}")]
            rows.append(("bpk-run", *_run([bpk_run, str(path), *flags, "--output-dir", str(work)]), what))
        return rows

    with ThreadPoolExecutor(jobs) as pool:
        return [row for rows in pool.map(one, range(len(cases.files))) for row in rows]


def report(results: Sequence[tuple[str, str, str, str]]) -> str:
    lines = []
    for loader in ("python", "bpk-run"):
        got = [r for r in results if r[0] == loader]
        if not got:
            continue
        counts = Counter(r[1] for r in got)
        lines.append(
            f"{loader}: {len(got)} cases: "
            + ", ".join(f"{k} {counts[k]}" for k in ("ok", "refused", "stray", "crash", "hang"))
        )
        for outcome in ("stray", "crash", "hang"):
            for r in [r for r in got if r[1] == outcome][:5]:
                lines.append(f"  {outcome}: {r[3]} -> {r[2]}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample", default="mlp", choices=sorted(SAMPLES))
    p.add_argument("--bpk-run", help="also run each case with this bpk-run")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--verify", action="store_true", help="mutate the reference cases and run verify")
    args = p.parse_args()
    s = SAMPLES[args.sample]
    torch.manual_seed(0)
    art = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes)
    work = Path(tempfile.mkdtemp(prefix="bladepack-mutations-"))
    inputs = [t.numpy() for t in s.make_inputs(torch.Generator().manual_seed(1), **s.base_dims)]
    under = "reference_cases" if args.verify else ""
    cases = make_cases(art.to_bytes(), inputs, args.count, args.seed, work, under)
    results = run_cases(cases, args.bpk_run, args.jobs, work, args.verify)
    print(report(results))
    return 1 if any(r[1] in ("stray", "crash", "hang") for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
