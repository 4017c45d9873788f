"""Record reference cases in an artifact at optimize time (Note [Reference cases] in
artifact/reference_cases.py).

In: the artifact's manifest, an oracle (the model itself: torch eager, or onnx's reference evaluator)
and the sample inputs. Out: the `reference_cases` manifest record and its sections. The cases are
chosen from probe shapes — per symbol its range ends, the samples, powers of two and their
neighbours, one symbol varied at a time around the samples and around the all-minimum, plus
all-minimum and all-maximum — by
the coverage items the shape program says each probe exercises: first the all-minimum case (size 1),
the all-maximum case and each bounded symbol at its maximum (the range ends), then greedily the probe
that adds the most items, the smaller first, within `budget` bytes of recorded data. Items no probe
reaches, or only probes over the budget, are listed under `uncovered` with the reason.

Note [Conditioned cases]: a case checks the artifact against the oracle exactly where the model
decides an order (a top-k's indices, an argmax, a sort), so a case whose decisions rest on values a
rounding apart would fail a correct artifact (two channels 3.5e-7 apart after a transposed
convolution and a bicubic resize: the x86-64 library's top-k took them in the other order). The
oracle checks each case against a float64 twin of the model (bladepack/ir/order_margins.py) and
raises IllConditionedCase when an order lies within a few roundings of a tie; the case then draws
new seeds, up to SEED_TRIES times, and is left out with a note when no draw holds. Ties the model makes
itself (equal values in float32 and float64) are fine: every executor breaks them stably.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.artifact.reference_cases import all_items, computed_in, covered, generate
from bladepack.artifact.shape_program import ShapeProgram
from bladepack.dtypes import DType
from bladepack.errors import IllConditionedCase, ShapeGuardError

Oracle = Callable[[list[np.ndarray]], list[np.ndarray]]
DEFAULT_BUDGET = 2 << 20  # bytes of recorded outputs (inputs are seeded)
UNBOUNDED_CAP = 64  # an unbounded symbol is probed up to max(this, 4 x its largest sample)
MAX_CHOICES = 4  # an input whose samples hold at most this many distinct values draws from them
# A case's memory at most (the artifact's arena, inputs and outputs at that shape): the oracle runs at
# every case, and a probe at an unbounded dim's made-up end (batch 64 of 512 x 448 images: 14 GB and
# a minute of eager ResNet-18) tests nothing a smaller one does not.
FOOTPRINT_CAP = 256 << 20
SEED_TRIES = 4  # draws of a case's inputs whose orders depend on rounding (Note [Conditioned cases])
RESEED = 7919  # seed step between draws (a case's seeds are 1000003 apart)


def input_records(m: dict[str, Any], samples: Sequence[Sequence[np.ndarray | None]]) -> list[dict[str, Any]] | str:
    """Per input, how its seeded values are drawn (the seed is set per case), from the samples' values;
    or why inputs cannot be seeded."""
    out = []
    for i, decl in enumerate(m["inputs"]):
        dtype = decl["dtype"]
        if dtype in ("float16", "bfloat16"):
            return f"input '{decl['name']}' is {dtype}: reference cases are recorded for 32- and 64-bit inputs only"
        values = [np.asarray(s[i]).ravel() for s in samples if i < len(s) and s[i] is not None]
        vals = np.concatenate(values) if values else np.zeros(0)
        is_float = DType(dtype).is_floating
        if vals.size == 0:
            out.append({"uniform": [-1.0, 1.0]} if is_float else {"integers": [0, 1]})
            continue
        distinct = np.unique(vals[: 1 << 20])
        if distinct.size <= MAX_CHOICES:
            out.append({"choice": [float(v) if is_float else int(v) for v in distinct]})
        elif is_float:
            finite = vals[np.isfinite(vals)]
            lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (-1.0, 1.0)
            out.append({"uniform": [lo, hi]})
        else:
            out.append({"integers": [int(vals.min()), int(vals.max())]})
    return out


def _candidates(lo: int, hi: int, seen: Sequence[int]) -> list[int]:
    vals = {lo, lo + 1, hi, hi - 1, (lo + hi) // 2, *seen}
    p = 1
    while p <= hi + 1:
        vals |= {p - 1, p, p + 1}
        p *= 2
    return sorted(v for v in vals if lo <= v <= hi)


def _bindings(
    m: dict[str, Any], samples: Sequence[Sequence[np.ndarray | None]], sample_dims: Sequence[Mapping[str, int]]
) -> list[tuple[dict[str, int], bool]]:
    """Probe bindings of the symbols, each with whether it is a range end: all-minimum, all-maximum, and
    each bounded symbol at its maximum with the others at their smallest sample."""
    seen: dict[str, list[int]] = {s["name"]: [] for s in m["symbols"]}
    for sample in samples:
        for decl, x in zip(m["inputs"], sample):
            for d, size in zip(decl["shape"], () if x is None else x.shape):
                if isinstance(d, str) and d in seen:
                    seen[d].append(int(size))
    for binding in sample_dims:
        for name, size in binding.items():
            if name in seen:
                seen[name].append(int(size))
    lo = {s["name"]: int(s["min"]) for s in m["symbols"]}
    hi = {
        s["name"]: int(s["max"]) if s["max"] is not None else max(UNBOUNDED_CAP, 4 * max(seen[s["name"]], default=1))
        for s in m["symbols"]
    }
    base = {name: min(seen[name], default=lo[name]) for name in lo}
    bounded = [s["name"] for s in m["symbols"] if s["max"] is not None]
    ends = [dict(lo), dict(hi), *({**base, name: hi[name]} for name in bounded)]
    probes = [*ends, dict(base)]
    for name in lo:
        probes += [{**base, name: v} for v in _candidates(lo[name], hi[name], seen[name])]
    for name in lo:  # and around the all-minimum: a product of symbols (batch x seq rows) takes every small value
        probes += [{**lo, name: v} for v in _candidates(lo[name], hi[name], seen[name])]
    unique: dict[tuple[tuple[str, int], ...], tuple[dict[str, int], bool]] = {}
    for k, b in enumerate(probes):
        unique.setdefault(tuple(sorted(b.items())), (b, k < len(ends)))
    return list(unique.values())


@dataclass(frozen=True)
class _Probe:
    binding: dict[str, int]
    dims: list[list[int]]  # per input its shape
    items: frozenset[str]  # the coverage items it exercises
    shapes: list[tuple[int, ...]]  # per output its shape
    size: int  # bytes of its outputs
    end: bool  # a range end (taken first, as the budget allows)


def _footprint(m: dict[str, Any], regs: Sequence[int], dims: Sequence[Sequence[int]]) -> int:
    """The artifact's arena (its plan's, the largest of its executors') and input bytes at a shape."""
    arenas = [m.get("arena_bytes"), (m.get("native_cpu") or {}).get("arena_bytes")]
    arena = max((_value(a, regs) for a in arenas if a is not None), default=0)
    inputs = sum(int(np.prod(d, dtype=np.int64)) * DType(t["dtype"]).itemsize for d, t in zip(dims, m["inputs"]))
    return arena + inputs


def _value(enc: Any, regs: Sequence[int]) -> int:
    """A SymInt's value: an int, {"r": register}, or a record holding one as its `value`."""
    if isinstance(enc, dict) and "value" in enc:
        return _value(enc["value"], regs)
    return int(regs[enc["r"]]) if isinstance(enc, dict) else int(enc)


def _output_bytes(m: dict[str, Any], regs: Sequence[int]) -> tuple[list[tuple[int, ...]], int]:
    values = {v["id"]: v for v in m["values"]}
    shapes, total = [], 0
    for o in m["outputs"]:
        enc = values[o["id"]]["shape"] if o["id"] in values else []
        shape = tuple(int(regs[d["r"]]) if isinstance(d, dict) else int(d) for d in enc)
        shapes.append(shape)
        total += int(np.prod(shape, dtype=np.int64)) * DType(o["dtype"]).itemsize
    return shapes, total


def record_cases(
    m: dict[str, Any],
    oracle: Oracle,
    oracle_name: str,
    samples: Sequence[Sequence[np.ndarray | None]] = (),
    budget: int = DEFAULT_BUDGET,
    carried: tuple[str, Sequence[tuple[dict[str, Any], list[bytes]]]] | None = None,
    sample_dims: Sequence[Mapping[str, int]] = (),
) -> tuple[tuple[dict[str, Any], dict[str, bytes]] | None, str | None]:
    """(the record and its sections, or None; a note for the user, or None). `carried` (extend): the
    oracle and the cases of an earlier record, each with its output bytes; those whose dims the ranges
    still hold are kept first (their outputs stay valid: the model is the same), and the new cases
    draw their inputs as the first of them did and name their own oracle. `sample_dims`: symbol values
    the samples had, when the samples themselves are not at hand (extend)."""
    old_cases = list(carried[1]) if carried else []
    dists: list[dict[str, Any]] | str
    if old_cases:
        dists = [{k: v for k, v in r.items() if k != "seed"} for r in old_cases[0][0]["inputs"]]
    else:
        dists = input_records(m, samples)
    if isinstance(dists, str):
        return None, f"no reference cases recorded: {dists}"
    program = ShapeProgram.from_manifest(m["shape_program"])
    input_dims = _input_dims(m)
    derived = any(
        isinstance(d, str) and d not in {s["name"] for s in m["symbols"]} for t in m["inputs"] for d in t["shape"]
    )
    probes = []
    too_big: set[str] = set()  # items of probes over FOOTPRINT_CAP
    for b, end in _bindings(m, samples, sample_dims):
        try:
            dims = input_dims(b)
        except ValueError:
            continue  # a derived input dim below 0
        try:
            regs = program.evaluate(dims)
        except ShapeGuardError:
            continue  # the symbols' relations rule this binding out
        shapes, size = _output_bytes(m, regs)
        items = frozenset(covered(m, regs))
        if size + _footprint(m, regs, dims) > FOOTPRINT_CAP:
            too_big |= items
            continue
        probes.append(_Probe(b, dims, items, shapes, size, end))
    chosen: list[_Probe] = []
    have: set[str] = set()
    spent = 0
    kept: list[dict[str, Any]] = []
    sections: dict[str, bytes] = {}
    ranges = {s["name"]: (s["min"], s["max"]) for s in m["symbols"]}
    for case, blobs in old_cases:
        b = case["dims"]
        if set(b) != set(ranges) or any(
            not ranges[k][0] <= v <= (v if ranges[k][1] is None else ranges[k][1]) for k, v in b.items()
        ):
            continue
        try:
            regs = program.evaluate(input_dims(b))
        except (ShapeGuardError, ValueError):
            continue
        if spent + sum(map(len, blobs)) > budget:
            continue
        spent += sum(map(len, blobs))
        ran = covered(m, regs)
        have.update(ran)
        rows = []
        for k, blob in enumerate(blobs):
            name = f"reference/{len(kept)}/output{k}"
            sections[name] = blob
            rows.append({**case["outputs"][k], "section": name})
        kept.append({**case, "outputs": rows, "covers": sorted(ran)})

    def take(p: _Probe) -> None:
        nonlocal spent
        chosen.append(p)
        have.update(p.items)
        spent += p.size

    kept_dims = [c["dims"] for c in kept]
    for p in probes:  # the range ends, as the budget allows
        if p.end and spent + p.size <= budget and p.binding not in kept_dims:
            take(p)
    while True:
        best = max(
            (p for p in probes if p.items - have and spent + p.size <= budget),
            key=lambda p: (len(p.items - have), -p.size),
            default=None,
        )
        if best is None:
            break
        take(best)
    over = {i for p in probes if spent + p.size > budget for i in p.items - have}
    cases = kept
    notes: list[str] = []
    for c, (binding, dims, items, shapes) in enumerate((p.binding, p.dims, p.items, p.shapes) for p in chosen):
        drawn = _draw(m, oracle, dists, dims, 1000003 * (len(old_cases) + c + 1))
        if isinstance(drawn, str):
            notes.append(f"{_dims_text(binding)}: {drawn}")
            continue
        ins, outs = drawn
        want = [(tuple(s), t["dtype"]) for s, t in zip(shapes, m["outputs"])]
        got = [(tuple(o.shape), o.dtype.name) for o in outs]
        if got != want:
            notes.append(f"{_dims_text(binding)}: the oracle gave {got}, the artifact declares {want}")
            continue
        rows = []
        for k, o in enumerate(outs):
            name = f"reference/{len(cases)}/output{k}"
            sections[name] = np.ascontiguousarray(o).astype(o.dtype.newbyteorder("<")).tobytes()
            rows.append({"section": name, "dtype": m["outputs"][k]["dtype"], "shape": list(o.shape)})
        case = {"dims": dict(sorted(binding.items())), "inputs": ins, "outputs": rows, "covers": sorted(items)}
        if derived:  # an input dim is an expression of the symbols: the loaders read the shapes
            case["shapes"] = [list(d) for d in dims]
        cases.append({**case, "oracle": oracle_name} if carried else case)
    reached = {i for c in cases for i in c["covers"]}

    def why(item: str) -> str:
        if item in over:
            return "over the reference-case budget"
        if item in too_big:
            return f"only shapes whose memory exceeds {FOOTPRINT_CAP >> 20} MiB reach it"
        return "no probed shape reaches it"

    uncovered = [{"item": i, "why": why(i)} for i in all_items(m) if i not in reached]
    record = {
        "oracle": carried[0] if carried else oracle_name,
        "budget": budget,
        "cases": cases,
        "uncovered": uncovered,
        "tolerance": computed_in(m),
    }
    note = f"reference cases: {'; '.join(notes)}" if notes else None
    return (record, sections), note


def _draw(
    m: dict[str, Any], oracle: Oracle, dists: list[dict[str, Any]], dims: list[list[int]], seed: int
) -> tuple[list[dict[str, Any]], list[np.ndarray]] | str:
    """A case's input records and the oracle's outputs, from the first of SEED_TRIES draws whose
    orders do not rest on rounding (Note [Conditioned cases]); else why there is none."""
    why = ""
    for attempt in range(SEED_TRIES):
        ins = [{**dist, "seed": seed + attempt * RESEED + i} for i, dist in enumerate(dists)]
        arrays = [generate(r, d, DType(t["dtype"]).to_numpy()) for r, d, t in zip(ins, dims, m["inputs"])]
        try:
            return ins, oracle(arrays)
        except IllConditionedCase as e:
            why = str(e)
        except Exception as e:  # the user's model on generated data: anything may go wrong
            return f"the oracle failed ({type(e).__name__}: {e})"
    return f"left out: in each of {SEED_TRIES} draws of its inputs an order rests on rounding (last: {why})"


def _input_dims(m: dict[str, Any]) -> Callable[[Mapping[str, int]], list[list[int]]]:
    """Each input's shape for a binding of the symbols; a dim that is an expression of them (`past+1`,
    from a derived dim) is evaluated. ValueError when one comes out negative."""
    import sympy

    names = {s["name"]: sympy.Symbol(s["name"], integer=True) for s in m["symbols"]}
    exprs = [
        [d if not isinstance(d, str) or d in names else sympy.sympify(d, locals=names) for d in t["shape"]]
        for t in m["inputs"]
    ]

    def shapes(b: Mapping[str, int]) -> list[list[int]]:
        out = []
        for row in exprs:
            dims = []
            for d in row:
                v = (
                    b[d]
                    if isinstance(d, str)
                    else int(d.subs({names[k]: b[k] for k in b}))
                    if isinstance(d, sympy.Basic)
                    else int(d)
                )
                if v < 0:
                    raise ValueError(f"a dim is {v}")
                dims.append(v)
            out.append(dims)
        return out

    return shapes


def _dims_text(binding: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(binding.items())) or "static shapes"
