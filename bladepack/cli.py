"""The `bladepack` command line (also `python -m bladepack`). `inspect` is loader-safe; `optimize` needs
the export extra. Every error is one line on stderr, `bladepack: error: ...`, exit status 1 (2 for a
command line argparse refuses).

bladepack optimize MODEL.onnx -o MODEL.bpk [--dim INPUT:AXIS=NAME[:MIN:MAX]] ... [--reference-cases BYTES]
bladepack inspect FILE [--json]
bladepack run FILE --input NAME=FILE.npy ... [--output-dir DIR] [--sha256 HEX] [--trusted-key KEY ...]
bladepack verify FILE [--device cpu|cuda[:N]] [--json]   (Note [Reference cases]; exit 1 on a failure)
bladepack extend FILE -o OUT [--targets cpu,cuda:sm_90a] [--range NAME=MIN:MAX ...]   (no torch needed)
bladepack keygen KEY                      (an Ed25519 key pair: KEY, private, and KEY.pub)
bladepack sign FILE --key KEY [-o OUT]    (Note [Trust model] in artifact/trust.py)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from bladepack.artifact.format import read
from bladepack.errors import BladepackError
from bladepack.inspect import inspect_text, manifest_summary
from bladepack.version import __version__


class UsageError(Exception):
    """A command-line value the command cannot use (printed as `bladepack: error: ...`)."""


def _inspect(args: argparse.Namespace) -> int:
    bpk = read(args.file, verify=not args.no_verify)
    summary = manifest_summary(bpk.manifest)
    sig = bpk.signature
    summary["signature"] = None if sig is None else {"key_id": sig.key_id, "public_key": sig.public_key.hex()}
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(inspect_text(summary), end="")
    return 0


def _mmap_options(p: argparse.ArgumentParser) -> None:
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--mmap", action="store_true", default=None, help="map the file (shared pages; it must not change)"
    )
    how.add_argument(
        "--no-mmap",
        dest="mmap",
        action="store_false",
        help="read it once into private memory (default for --sha256 / --trusted-key loads)",
    )


def _run(args: argparse.Namespace) -> int:
    from bladepack.loader import load

    m = load(args.file, sha256=args.sha256, trusted_keys=args.trusted_key or None, mmap=args.mmap)
    given = {}
    for item in args.input:
        name, _, path = item.partition("=")
        if not path:
            raise UsageError(f"--input takes NAME=FILE.npy, got {item!r}")
        given[name] = np.load(path)
    names = [t.name for t in m.signature.inputs]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise UsageError(f"unknown --input {', '.join(unknown)}; the inputs are {', '.join(names)}")
    outs = m.run([given[t.name] if t.name in given else _missing(t.name) for t in m.signature.inputs])
    out_dir = Path(args.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for spec, arr in zip(m.signature.outputs, outs):
        np.save(out_dir / f"{spec.name}.npy", arr)
        print(f"{spec.name}: {arr.dtype}{list(arr.shape)} -> {out_dir / (spec.name + '.npy')}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    from bladepack.loader import load
    from bladepack.loader.verify import report_text

    m = load(args.file, device=args.device, sha256=args.sha256, trusted_keys=args.trusted_key or None, mmap=args.mmap)
    report = m.verify()
    if args.json:
        print(json.dumps({"file": str(args.file), "executor": m.executor, **report}, indent=2, sort_keys=True))
    else:
        print(report_text(str(args.file), m.executor, report), end="")
    return 0 if report["passed"] is not False else 1


def _extend(args: argparse.Namespace) -> int:
    from bladepack.extend import extend, parse_range

    ranges = dict(parse_range(r) for r in args.range)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()] if args.targets else None
    art = extend(args.file, targets, ranges)
    art.save(args.output)
    print(inspect_text(manifest_summary(read(args.output).manifest)), end="")
    print(f"wrote {args.output}")
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
            raise UsageError(f"--dim takes INPUT:AXIS=NAME or INPUT:AXIS=NAME:MIN:MAX, got {item!r}")
        lo = int(parts[1]) if len(parts) == 3 and parts[1] else 1
        hi = int(parts[2]) if len(parts) == 3 and parts[2] else None
        out.setdefault(name_, {})[int(axis)] = Dim(parts[0], lo, hi)
    return out


def _optimize(args: argparse.Namespace) -> int:
    from bladepack.api import optimize

    if not str(args.model).lower().endswith(".onnx"):
        raise UsageError(
            f"bladepack optimize takes an .onnx file (torch models go through the Python API), got {args.model}"
        )
    budget = True if args.reference_cases is None else args.reference_cases
    art = optimize(args.model, dynamic_shapes=_parse_dims(args.dim) or None, reference_cases=budget)
    art.save(args.output)
    summary = manifest_summary(read(args.output).manifest)
    print(inspect_text(summary), end="")
    print(f"wrote {args.output}")
    return 0


def _keygen(args: argparse.Namespace) -> int:
    from bladepack.artifact.signing import generate_key
    from bladepack.artifact.trust import key_id

    public = generate_key(args.key)
    print(f"wrote {args.key} (private, mode 0600) and {args.key}.pub; key {key_id(public)}, public key {public.hex()}")
    return 0


def _sign(args: argparse.Namespace) -> int:
    from bladepack.artifact.signing import sign_file

    kid = sign_file(args.file, args.key, args.output)
    print(f"signed {args.output or args.file} with Ed25519 key {kid}")
    return 0


def _missing(name: str) -> np.ndarray:
    raise UsageError(f"missing --input {name}=FILE.npy")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bladepack", description="Ahead-of-time packaging of dynamic-shape models.")
    p.add_argument("--version", action="version", version=f"bladepack {__version__}")
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
    po.add_argument(
        "--reference-cases",
        type=int,
        metavar="BYTES",
        help="the byte budget of recorded reference outputs (default 2 MiB; 0: record none)",
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
    pr.add_argument("--sha256", help="refuse the file unless its SHA-256 is this (hex)")
    pr.add_argument(
        "--trusted-key",
        action="append",
        default=[],
        metavar="KEY",
        help="refuse the file unless signed by this Ed25519 public key (hex or .pub file; repeatable)",
    )
    _mmap_options(pr)
    pr.set_defaults(fn=_run)
    pv = sub.add_parser("verify", help="run an artifact's reference cases here and compare with the recorded outputs")
    pv.add_argument("file")
    pv.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    pv.add_argument("--json", action="store_true", help="machine-readable report")
    pv.add_argument("--sha256", help="refuse the file unless its SHA-256 is this (hex)")
    pv.add_argument("--trusted-key", action="append", default=[], metavar="KEY", help="as for run")
    _mmap_options(pv)
    pv.set_defaults(fn=_verify)
    pe = sub.add_parser("extend", help="rebuild an artifact for new targets or ranges, without the model")
    pe.add_argument("file")
    pe.add_argument("-o", "--output", required=True, help="the .bpk file to write")
    pe.add_argument("--targets", help="comma-separated targets, e.g. cpu,cuda:sm_90a (default: the artifact's own)")
    pe.add_argument(
        "--range", action="append", default=[], metavar="NAME=MIN:MAX", help="a dim's new range (MAX empty: unbounded)"
    )
    pe.set_defaults(fn=_extend)
    pk = sub.add_parser("keygen", help="make an Ed25519 key pair for signing artifacts")
    pk.add_argument("key", help="the private key file to write (KEY.pub gets the public key)")
    pk.set_defaults(fn=_keygen)
    ps = sub.add_parser("sign", help="sign an artifact with an Ed25519 private key")
    ps.add_argument("file")
    ps.add_argument("--key", required=True, help="the private key (PEM, from `bladepack keygen`)")
    ps.add_argument("-o", "--output", help="write the signed artifact here (default: in place)")
    ps.set_defaults(fn=_sign)
    from bladepack.serving.cli import add_commands

    add_commands(sub)
    args = p.parse_args(argv)
    try:
        return int(args.fn(args))
    except (BladepackError, UsageError, OSError, ValueError) as e:
        if isinstance(e, BrokenPipeError):  # the reader went away (`bladepack verify --json | head`)
            _quiet_stdout()
            return 1
        print(f"bladepack: error: {e}", file=sys.stderr)
        return 1


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again on the closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
