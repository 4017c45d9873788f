"""The `bladepack` command line. `inspect` is loader-safe; `optimize` needs the export extra.

bladepack optimize MODEL.onnx -o MODEL.bpk [--dim INPUT:AXIS=NAME[:MIN:MAX]] ...
bladepack inspect FILE [--json]
bladepack run FILE --input NAME=FILE.npy ... [--output-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bladepack.artifact.format import read
from bladepack.errors import BladepackError
from bladepack.inspect import inspect_text, manifest_summary


def _inspect(args: argparse.Namespace) -> int:
    summary = manifest_summary(read(args.file, verify=not args.no_verify).manifest)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(inspect_text(summary), end="")
    return 0


def _run(args: argparse.Namespace) -> int:
    from bladepack.loader import load

    m = load(args.file)
    given = {}
    for item in args.input:
        name, _, path = item.partition("=")
        if not path:
            raise SystemExit(f"--input takes NAME=FILE.npy, got {item!r}")
        given[name] = np.load(path)
    outs = m.run([given[t.name] if t.name in given else _missing(t.name) for t in m.signature.inputs])
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for spec, arr in zip(m.signature.outputs, outs):
        np.save(out_dir / f"{spec.name}.npy", arr)
        print(f"{spec.name}: {arr.dtype}{list(arr.shape)} -> {out_dir / (spec.name + '.npy')}")
    return 0


def _parse_dims(items: list[str]) -> dict[str, dict[int, Any]]:
    """--dim INPUT:AXIS=NAME[:MIN:MAX] → {input: {axis: Dim}}; MIN / MAX may be empty."""
    from bladepack.dims import Dim

    out: dict[str, dict[int, Any]] = {}
    for item in items:
        where, _, spec = item.rpartition("=")
        name_, _, axis = where.rpartition(":")
        parts = spec.split(":")
        if not name_ or not axis.lstrip("-").isdigit() or len(parts) not in (1, 3):
            raise SystemExit(f"--dim takes INPUT:AXIS=NAME or INPUT:AXIS=NAME:MIN:MAX, got {item!r}")
        lo = int(parts[1]) if len(parts) == 3 and parts[1] else 1
        hi = int(parts[2]) if len(parts) == 3 and parts[2] else None
        out.setdefault(name_, {})[int(axis)] = Dim(parts[0], lo, hi)
    return out


def _optimize(args: argparse.Namespace) -> int:
    from bladepack.api import optimize

    if not str(args.model).lower().endswith(".onnx"):
        raise SystemExit(
            f"bladepack optimize takes an .onnx file (torch models go through the Python API), got {args.model}"
        )
    art = optimize(args.model, dynamic_shapes=_parse_dims(args.dim) or None)
    art.save(args.output)
    summary = manifest_summary(read(args.output).manifest)
    print(inspect_text(summary), end="")
    print(f"wrote {args.output}")
    return 0


def _missing(name: str) -> np.ndarray:
    raise SystemExit(f"missing --input {name}=FILE.npy")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bladepack", description="Ahead-of-time packaging of dynamic-shape models.")
    sub = p.add_subparsers(dest="command", required=True)
    po = sub.add_parser("optimize", help="optimize an ONNX model into a .bpk artifact")
    po.add_argument("model", help="a .onnx file (external-data files beside it are read)")
    po.add_argument("-o", "--output", required=True, help="the .bpk file to write")
    po.add_argument(
        "--dim",
        action="append",
        default=[],
        metavar="INPUT:AXIS=NAME[:MIN:MAX]",
        help="name a dynamic axis and bound it (default: the model's dim_param, range [1, unbounded))",
    )
    po.set_defaults(fn=_optimize)
    pi = sub.add_parser("inspect", help="summarize a .bpk artifact")
    pi.add_argument("file")
    pi.add_argument("--json", action="store_true", help="machine-readable output (a stable contract)")
    pi.add_argument("--no-verify", action="store_true", help="skip section checksums")
    pi.set_defaults(fn=_inspect)
    pr = sub.add_parser("run", help="run an artifact on .npy inputs")
    pr.add_argument("file")
    pr.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy")
    pr.add_argument("--output-dir", default=".")
    pr.set_defaults(fn=_run)
    args = p.parse_args(argv)
    try:
        return int(args.fn(args))
    except (BladepackError, FileNotFoundError) as e:
        print(f"bladepack: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
