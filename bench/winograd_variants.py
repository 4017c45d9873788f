"""The paired convolutions of Note [Winograd at few channels] (codegen/cpu_conv_winograd.py) against the
direct kernel alone, per convolution, over image sizes and batches.

In: the CNN sample (16- and 32-channel 3x3 convolutions after a stride-4 stem) built twice in this
process, as optimize builds it and with `CompileOptions(winograd=False)` (the direct kernels only).
Out: per input shape, the time of each pair of paired convolutions (the 16-channel block, the
32-channel block) in both artifacts, which variant the plan chose, and the whole call; printed, and
bench/results/winograd_variants_<isa>.{json,md}. Per-launch medians from `profile`, best of `--rounds`
rounds, the two artifacts interleaved (Note [Rounds] in bench/cpu_samples.py).

    python -m bench.winograd_variants [--isa x86-64-v3] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from bench.cpu_samples import geomean
from bench.machine import describe, title
from bladepack.artifact import read
from bladepack.artifact.reference_cases import covered
from bladepack.artifact.shape_program import ShapeProgram
from bladepack.options import CompileOptions
from samples.registry import SAMPLES

RESULTS = Path(__file__).resolve().parent / "results"
BATCHES = (1, 2, 4, 8)
SIZES = ((8, 8), (12, 12), (16, 16), (12, 24), (24, 24), (24, 30), (32, 32), (48, 48))


def _out(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def _images(h: int, w: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """The 16-channel block's image (after the stride-2 stem and pool) and the 32-channel block's."""
    h1, w1 = (_out(_out(s, 3, 2, 1), 3, 2, 1) for s in (h, w))
    return (h1, w1), (_out(h1, 1, 2, 0), _out(w1, 1, 2, 0))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--isa", default=None, help="the CPU kernel library to load (default: the best this CPU runs)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    sample = SAMPLES["cnn"]
    modules, manifests = {}, {}
    for tag, winograd in (("paired", True), ("direct", False)):
        torch.manual_seed(0)
        art = bladepack.optimize(
            sample.build(),
            sample.export_samples(),
            dynamic_shapes=sample.dynamic_shapes,
            options=CompileOptions.from_env(winograd=winograd),
        )
        data = art.to_bytes()
        modules[tag] = bladepack.load(data, options=bladepack.LoaderOptions(cpu_isa=args.isa))
        manifests[tag] = read(data).manifest
    kernels = manifests["paired"]["kernels"]
    paired = [k["name"] for k in kernels if any(str(v["name"]).endswith("_winograd") for v in k["variants"])]
    if len(paired) != 4:
        raise SystemExit(f"expected the CNN sample's four 3x3 block convolutions paired, got {paired}")
    program = ShapeProgram.from_manifest(manifests["paired"]["shape_program"])
    g = torch.Generator().manual_seed(1)
    rows: list[dict[str, Any]] = []
    for b in BATCHES:
        for h, w in SIZES:
            x = [t.numpy() for t in sample.make_inputs(g, batch=b, height=h, width=w)]
            ran = {v.split()[-1] for v in covered(manifests["paired"], program.evaluate([list(x[0].shape)]))}
            best: dict[str, dict[str, float]] = {}
            for r in range(args.rounds):
                for tag in ("paired", "direct") if r % 2 == 0 else ("direct", "paired"):
                    prof = modules[tag].profile(*x, repeat=20)
                    times = {p["what"].split()[0]: p["us"] for p in prof}
                    times["call"] = sum(p["us"] for p in prof)
                    best[tag] = {k: min(v, best.get(tag, {}).get(k, np.inf)) for k, v in times.items()}
            (img1, img2) = _images(h, w)
            row: dict[str, Any] = {"batch": b, "height": h, "width": w, "images": [list(img1), list(img2)]}
            for label, names in (("c16", paired[:2]), ("c32", paired[2:])):
                row[label] = {
                    "direct_us": sum(best["direct"][k] for k in names),
                    "paired_us": sum(best["paired"][k] for k in names),
                    "variant": "winograd" if f"{names[0]}_winograd" in ran else "direct",
                }
            row["call"] = {"direct_us": best["direct"]["call"], "paired_us": best["paired"]["call"]}
            rows.append(row)
            print(
                f"{b} x {h} x {w}: 16 ch {b}x{img1[0]}x{img1[1]} {row['c16']['variant']:8s}"
                f" {row['c16']['direct_us'] / row['c16']['paired_us']:.2f}x, 32 ch {b}x{img2[0]}x{img2[1]}"
                f" {row['c32']['variant']:8s} {row['c32']['direct_us'] / row['c32']['paired_us']:.2f}x,"
                f" call {row['call']['direct_us'] / row['call']['paired_us']:.2f}x",
                flush=True,
            )
    isa = args.isa or "native"
    machine = describe(modules["paired"].executor)
    lines = [
        f"# Paired Winograd / direct convolutions against the direct kernel alone ({isa})",
        "",
        f"{time.strftime('%Y-%m-%d')}, `python -m bench.winograd_variants --isa {isa}`. {title(machine)}.",
        "",
        "Per input shape of the CNN sample: the time of its two 16-channel and its two 32-channel 3x3",
        "convolutions (per-launch medians, best of the rounds) with the direct kernel alone and with the",
        "paired kernel, the variant the plan chose, and the whole call (sum of launches). Ratio: direct /",
        "paired (above 1, the pair is faster).",
        "",
        "| input | 16-ch image | variant | direct µs | paired µs | x | 32-ch image | variant | direct µs | paired µs | x |"
        " call x |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [f"{row['batch']}x{row['height']}x{row['width']}"]
        for label, img in (("c16", row["images"][0]), ("c32", row["images"][1])):
            c = row[label]
            cells += [
                f"{row['batch']}x{img[0]}x{img[1]}",
                c["variant"],
                f"{c['direct_us']:.1f}",
                f"{c['paired_us']:.1f}",
                f"{c['direct_us'] / c['paired_us']:.2f}",
            ]
        cells.append(f"{row['call']['direct_us'] / row['call']['paired_us']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    ratios = {k: [r[k]["direct_us"] / r[k]["paired_us"] for r in rows] for k in ("c16", "c32", "call")}
    lines += [
        "",
        "geomean direct / paired: 16 channels {:.2f}x, 32 channels {:.2f}x, whole call {:.2f}x".format(
            *(geomean(ratios[k]) for k in ("c16", "c32", "call"))
        ),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    stem = Path(args.out) if args.out else RESULTS / f"winograd_variants_{isa}"
    stem.with_suffix(".md").write_text(text)
    stem.with_suffix(".json").write_text(json.dumps({"machine": machine, "isa": isa, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
