"""Extend an artifact without the model: new targets, new ranges (`bladepack extend`).

In: a .bpk that kept its front-end program (`source_program`), the targets to build (default: its
own) and symbol ranges to change. Out: a new `Artifact`, built by the same `optimize_program` call a
fresh optimize makes — so the same settings give the same bytes — with reference cases re-chosen.
Needs no torch and no onnx.

Note [Extending an artifact]: optimize keeps the program the front end produced (ir/serialize.py), its
weights, and how it was optimized (targets, dtype, GEMM library, sample dims, notes). A range may
change only where that program stays valid:
- within the front end's limits (`Program.limits`): torch.export traced the model for sizes up to
  the bound its discovery export found (a position table of 512 rows bounds the sequence at 512), so
  no range widens past that — the model itself would have to change;
- keeping every range fact (Note [Range facts] in ir/shape_env.py): an answer the front end took from
  the old ranges (a torch.cond or ONNX If decided at import, a slice clamped, a loop unrolled to its
  maximum) must still be true under the new ones. Narrowing always keeps them; widening is refused
  with every fact it would break.
Reference cases (Note [Reference cases]): the old cases whose dims the new ranges hold are kept (their
outputs came from the model); the items they leave uncovered get new cases whose outputs come from the
new artifact's numpy reference executor (the model is not at hand), marked with that oracle.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from bladepack.api import Artifact, optimize_program
from bladepack.artifact.format import BpkFile, read
from bladepack.errors import BladepackError
from bladepack.ir.serialize import decode_program
from bladepack.ir.shape_env import RangeFact
from bladepack.opset import packed_weights
from bladepack.options import CompileOptions, LoaderOptions
from bladepack.reference_record import record_cases
from bladepack.target import CPU_ONLY, Target

Range = tuple[int, int | None]


class ExtendError(BladepackError, ValueError):
    """The artifact cannot be extended as asked; the message says why and what is possible."""


def parse_range(text: str) -> tuple[str, Range]:
    """`seq=1:2048` (or `seq=1:` for unbounded) as ("seq", (1, 2048))."""
    name, _, spec = text.partition("=")
    lo, sep, hi = spec.partition(":")
    if not name or not sep or not lo.strip().isdigit() or (hi.strip() and not hi.strip().isdigit()):
        raise ExtendError(f"a range reads NAME=MIN:MAX (MAX empty: unbounded), got {text!r}")
    return name.strip(), (int(lo), int(hi) if hi.strip() else None)


def extend(
    source: str | os.PathLike[str] | bytes,
    targets: Sequence[str] | None = None,
    ranges: Mapping[str, Range] | None = None,
    options: CompileOptions | None = None,
) -> Artifact:
    """The artifact rebuilt for `targets` (default: the ones it was built for) with the symbol ranges
    in `ranges` ({name: (min, max or None)}) — Note [Extending an artifact]; `options` as `optimize`
    takes them (None: from the environment, read once here)."""
    options = options or CompileOptions.from_env()
    bpk = read(source, verify=True)
    m = bpk.manifest
    meta = m.get("source_program")
    if meta is None:
        raise ExtendError(
            f"{bpk.source} does not hold its program (it was built by an older bladepack, or its program "
            "had no encoding: `bladepack inspect` says which); optimize the model again"
        )
    try:
        data = msgpack.unpackb(bpk.section(meta["section"]), raw=False, strict_map_key=False)
        weights = {name: _source_weight(bpk, row) for name, row in meta["weights"].items()}
        old = {name: (int(lo), hi) for name, lo, hi in data["symbols"]}
        limits = data.get("limits", {})
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, msgpack.UnpackException) as e:
        raise ExtendError(f"{bpk.source}: malformed source_program ({type(e).__name__}: {e})") from None
    wanted = _check_ranges(dict(ranges or {}), old, limits, bpk.source)
    try:
        program, facts = decode_program(data, weights, wanted)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise ExtendError(f"{bpk.source}: malformed source_program ({type(e).__name__}: {e})") from None
    broken = [f for f in facts if not program.shape_env.holds(f)]
    if broken:
        raise ExtendError(
            f"{bpk.source}: the model was imported relying on facts the new ranges break "
            f"({_ranges_text(wanted)}); keep the ranges within the old ones there, or export the model again:\n"
            + "\n".join(f"  {_fact_text(f)}" for f in broken)
        )
    target = Target.parse(list(targets) if targets is not None else meta["targets"])
    producer = {k: v for k, v in m["producer"].items() if k not in ("cxx", "nvcc")}
    art = optimize_program(
        program,
        meta["notes"],
        meta["frontend"],
        target,
        meta["dtype"],
        meta["gemm_library"],
        [dict(s) for s in meta["samples"]],
        producer=producer,
        options=options,
        packed="packed" in m and target.covers(CPU_ONLY),  # Note [Packed sequences]: rebuilt with the plan
    )
    record = m.get("reference_cases")
    if record is not None:
        _extend_cases(art, bpk, record, meta["samples"], options)
    return art


def _source_weight(bpk: BpkFile, row: dict[str, Any]) -> np.ndarray:
    """A source program's weight: its own bytes, or (Note [Derived source weights] in artifact/
    writer.py) the plan's packed copies of it, unpacked."""
    dtype, shape = np.dtype(row["dtype"]).newbyteorder("<"), tuple(int(d) for d in row["shape"])
    if "packed" not in row:
        return np.frombuffer(bpk.section(row["section"]), dtype=dtype).reshape(shape).copy()
    layout, pieces = row["layout"], [np.frombuffer(bpk.section(s), dtype=dtype) for s in row["packed"]]
    if layout in packed_weights.LINEAR_LAYOUTS:
        return packed_weights.unpack_linear(layout, pieces, shape, bool(row["transposed"]))
    return packed_weights.unpack(layout, pieces[0].reshape(packed_weights.packed_shape(layout, shape)), shape[0])


def _check_ranges(
    wanted: dict[str, Range], old: dict[str, Range], limits: Mapping[str, Any], source: str
) -> dict[str, Range]:
    problems = []
    for name, (lo, hi) in wanted.items():
        if name not in old:
            problems.append(f"{name!r} is no dynamic dim of the model; its dims are {', '.join(sorted(old)) or 'none'}")
            continue
        if lo < 1 or (hi is not None and hi < lo):
            problems.append(f"{name}: [{lo}, {_inf(hi)}] is not a range of sizes (min >= 1, max >= min)")
            continue
        if name in limits:
            lim_lo, lim_hi = limits[name]
            widest = f"the widest range extend can give is [{lim_lo}, {_inf(lim_hi)}]"
            if lo < lim_lo:
                problems.append(
                    f"{name}: the model was traced for {name} >= {lim_lo} only (the minimum declared at export; "
                    f"torch.export may have specialized the model's code below it), so [{lo}, {_inf(hi)}] "
                    f"cannot be given; {widest}, or export again with a lower minimum"
                )
            elif lim_hi is not None and (hi is None or hi > lim_hi):
                problems.append(
                    f"{name}: the model itself bounds {name} at {lim_hi} (torch.export found it valid for no "
                    f"larger size, e.g. a table of {lim_hi} rows), so [{lo}, {_inf(hi)}] cannot be given; {widest}"
                )
    if problems:
        raise ExtendError(f"{source}: cannot change the ranges as asked:\n" + "\n".join(f"  {p}" for p in problems))
    return {**old, **wanted}


def _extend_cases(
    art: Artifact, bpk: BpkFile, record: dict[str, Any], sample_dims: list[dict[str, int]], options: CompileOptions
) -> None:
    """Note [Extending an artifact]: keep the old cases the new ranges hold, add cases for the rest."""
    from bladepack.loader import load

    carried = [(c, [bytes(bpk.section(o["section"])) for o in c["outputs"]]) for c in record["cases"]]
    reference = load(art.to_bytes(), executor="reference", options=LoaderOptions(cache_dir=options.cache_dir))
    manifest, _ = art._parts()

    def oracle(arrays: list[np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(o) for o in reference.run(arrays)]

    art.reference_cases, note = record_cases(
        manifest,
        oracle,
        "bladepack reference executor",
        budget=int(record["budget"]),
        carried=(str(record["oracle"]), carried),
        sample_dims=sample_dims,
    )
    if note:
        art.notes.append(note)


def _inf(v: int | None) -> str:
    return "inf" if v is None else str(v)


def _ranges_text(ranges: Mapping[str, Range]) -> str:
    return ", ".join(f"{k} in [{lo}, {_inf(hi)}]" for k, (lo, hi) in sorted(ranges.items()))


def _fact_text(f: RangeFact) -> str:
    if f.kind == "bounds":
        assert isinstance(f.answer, tuple)
        return f"{f.a} was taken to lie in [{_inf(f.answer[0])}, {_inf(f.answer[1])}]"
    rel = "<=" if f.kind == "le" else "=="
    answer = getattr(f.answer, "value", f.answer)
    return f"{f.a} {rel} {f.b} was answered {answer!r} over the old ranges; the new ones leave it open or reverse it"
