"""Run an artifact's reference cases where it is loaded (Note [Reference cases] in
artifact/reference_cases.py): `LoadedModule.verify()` and `bladepack verify`.

In: the manifest's `reference_cases` record, its sections, and a function that runs the loaded module.
Out: a report — per case its dims, input shapes, the kernel variants and GEMM dispatch entries it ran
(the loader's own shape-program evaluation, which must agree with the record), per output the max
abs and scaled error against the recorded output and a verdict — and the record's uncovered items.
A malformed record is a BpkFormatError; an error while running a case fails that case.
"""

from __future__ import annotations

import os
import reprlib
from collections.abc import Callable
from typing import Any

import numpy as np

from bladepack.artifact.reference_cases import TOLERANCE, compare, covered, generate
from bladepack.errors import BladepackError, BpkFormatError, ExecutionError
from bladepack.loader.manifest import Manifest, host_dtype


def verify_report(
    raw: dict[str, Any], m: Manifest, section: Callable[[str], memoryview], run: Callable[[list[Any]], list[Any]]
) -> dict[str, Any]:
    record = raw.get("reference_cases")
    if record is None:
        return {"oracle": None, "cases": [], "uncovered": [], "passed": None, "reason": "no reference cases recorded"}
    try:
        cases = [_case(c, raw, m, section) for c in record["cases"]]
        uncovered = [{"item": _text(u["item"]), "why": _text(u["why"])} for u in record["uncovered"]]
        oracle = _text(record["oracle"])
        tolerances = _tolerances(record.get("tolerance"), m)
    except BpkFormatError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise BpkFormatError(
            f"{m.source}: malformed manifest: reference_cases ({type(e).__name__}: {reprlib.repr(str(e))})"
        ) from None
    reports = [_run_case(k, c, raw, m, run, tolerances) for k, c in enumerate(cases)]
    return {
        "oracle": oracle,
        "cases": reports,
        "uncovered": uncovered,
        "passed": all(r["passed"] for r in reports),
    }


def _case_shapes(c: dict[str, Any], dims: dict[str, int], raw: dict[str, Any]) -> list[list[int]]:
    """Each input's shape in a case: static dims, symbols from the case's dims; an input dim that is an
    expression of the symbols (`past+1`) from the case's `shapes`, which must agree with the rest."""
    given = c.get("shapes")
    if given is not None and (
        not isinstance(given, list)
        or len(given) != len(raw["inputs"])
        or any(not isinstance(g, list) or len(g) != len(t["shape"]) for g, t in zip(given, raw["inputs"]))
    ):
        raise ValueError("a case's shapes do not match the inputs' ranks")
    shapes = []
    for k, t in enumerate(raw["inputs"]):
        row = []
        for axis, d in enumerate(t["shape"]):
            size = int(d) if not isinstance(d, str) else dims.get(d)
            if size is None:
                if given is None:
                    raise ValueError(f"input {k} dimension {axis} is {reprlib.repr(d)}, and the case records no shapes")
                size = int(given[k][axis])
            elif given is not None and int(given[k][axis]) != size:
                raise ValueError(f"a case's shapes give input {k} dimension {axis} as {given[k][axis]}, not {size}")
            row.append(size)
        shapes.append(row)
    return shapes


def _case(c: dict[str, Any], raw: dict[str, Any], m: Manifest, section: Callable[[str], memoryview]) -> dict[str, Any]:
    names = [t.name for t in m.signature.inputs]
    dims = {_text(k): int(v) for k, v in c["dims"].items()}
    ranges = {s["name"]: (s["min"], s["max"]) for s in raw["symbols"]}
    if set(dims) != set(ranges) or any(
        not ranges[k][0] <= v <= (ranges[k][1] if ranges[k][1] is not None else v) for k, v in dims.items()
    ):
        raise ValueError(f"a case's dims {dims} are not the symbols inside their ranges")
    shapes = _case_shapes(c, dims, raw)
    if len(c["inputs"]) != len(names) or len(c["outputs"]) != len(m.outputs):
        raise ValueError("a case's inputs or outputs do not match the signature")
    types = []
    for t in raw["inputs"]:
        dt = host_dtype(t["dtype"])
        if dt is None:
            raise ValueError("a bfloat16 input")
        types.append(dt)
    # Note [Reference input sizes]: an unbounded symbol recorded at a size no machine holds
    need = sum(_count(shape) * dt.itemsize for shape, dt in zip(shapes, types))
    have = machine_bytes()
    if have is not None and need > have:
        raise ExecutionError(
            f"{m.source}: cannot allocate a reference input of shape {max(shapes, key=_count)}: "
            f"the case's inputs need {need} bytes, more than this machine's {have} bytes of memory"
        )
    inputs = []
    for rec, shape, dt in zip(c["inputs"], shapes, types):
        try:
            inputs.append(generate(rec, shape, dt))
        except MemoryError:
            raise ExecutionError(f"{m.source}: cannot allocate a reference input of shape {shape}") from None
    outputs = []
    for k, o in enumerate(c["outputs"]):
        dt = host_dtype(o["dtype"])
        if dt is None or o["dtype"] != raw["outputs"][k]["dtype"]:
            raise ValueError(f"output {k}'s dtype {reprlib.repr(o['dtype'])}")
        view = section(o["section"])
        shape = [int(d) for d in o["shape"]]
        count = int(np.prod(shape, dtype=np.int64))
        if view.nbytes != count * dt.itemsize:
            raise ValueError(
                f"section {reprlib.repr(o['section'])} has {view.nbytes} bytes, its shape {shape} needs {count * dt.itemsize}"
            )
        outputs.append(np.frombuffer(view, dtype=dt.newbyteorder("<"), count=count).reshape(shape))
    return {"dims": dims, "inputs": inputs, "outputs": outputs, "covers": [_text(i) for i in c["covers"]]}


def machine_bytes() -> int | None:
    """The machine's physical memory in bytes, None where the platform does not say.

    Note [Reference input sizes]: a case's inputs are made from its dims, and a symbol without an upper
    bound can be recorded (or edited) at any size. Inputs that need more than the machine's memory are
    refused before any is made: with memory overcommit such an allocation can succeed and the machine
    then swaps or kills the process while the generator fills it. bpk-run checks the same bound."""
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _count(shape: list[int]) -> int:
    return int(np.prod(shape, dtype=object))


def _tolerances(v: Any, m: Manifest) -> list[float]:
    """The record's tolerance per output (Note [Verdict tolerance]; format 1.4 records may lack it: then
    TOLERANCE of each output's dtype)."""
    if v is None:
        return [TOLERANCE.get(spec.dtype, 0.0) for spec in m.signature.outputs]
    if not isinstance(v, list) or len(v) != len(m.signature.outputs):
        raise ValueError("tolerance is not a list with one number per output")
    out = []
    for t in v:
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0.0 <= float(t) < 1.0:
            raise ValueError(f"tolerance {reprlib.repr(t)} is not a number in [0, 1)")
        out.append(float(t))
    return out


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected a string, got {type(v).__name__}")
    return v


def _run_case(
    k: int,
    c: dict[str, Any],
    raw: dict[str, Any],
    m: Manifest,
    run: Callable[[list[Any]], list[Any]],
    tolerances: list[float],
) -> dict[str, Any]:
    report: dict[str, Any] = {
        "case": k,
        "dims": c["dims"],
        "shapes": [list(x.shape) for x in c["inputs"]],
        "ran": c["covers"],
        "outputs": [],
        "passed": False,
        "error": None,
    }
    try:
        regs = m.registers(tuple(tuple(x.shape) for x in c["inputs"]))
        try:
            ran = covered(raw, regs)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:
            raise BpkFormatError(
                f"{m.source}: malformed manifest: reference_cases ({type(e).__name__}: {reprlib.repr(str(e))})"
            ) from None
        if sorted(ran) != sorted(c["covers"]):
            report["error"] = f"the shape program picks {sorted(ran)}, the record says {sorted(c['covers'])}"
            return report
        got = run(c["inputs"])
    except BpkFormatError:
        raise
    except BladepackError as e:
        report["error"] = f"{type(e).__name__}: {e}"
        return report
    ok = True
    for spec, g, w, tol in zip(m.signature.outputs, got, c["outputs"], tolerances):
        passed, err, scaled = compare(np.asarray(g), w, spec.dtype, tol)
        report["outputs"].append(
            {"name": spec.name, "max_abs": err, "scaled": scaled, "tolerance": tol, "passed": passed}
        )
        ok = ok and passed
    report["passed"] = ok
    return report


def report_text(source: str, executor: str, r: dict[str, Any]) -> str:
    """The report as `bladepack verify` prints it (`bpk-run --verify` prints the same verdict lines)."""
    if r["oracle"] is None:
        return f"{source}: no reference cases recorded (optimize with reference_cases=True)\n"
    items = sorted({i for c in r["cases"] for i in c["ran"]})
    lines = [
        f"{source}: {len(r['cases'])} reference cases (oracle: {r['oracle']}) on {executor}; "
        f"{len(items)} variants and dispatch entries ran, {len(r['uncovered'])} not covered"
    ]
    for c in r["cases"]:
        lines.append(verdict_line(c))
        for o in c["outputs"]:
            lines.append(
                f"  {o['name']}: max abs {o['max_abs']:.3g}, scaled {o['scaled']:.3g} (tolerance {o['tolerance']:.0e})"
                + ("" if o["passed"] else "  FAIL")
            )
        if c["ran"]:
            lines.append("  ran: " + ", ".join(c["ran"]))
    lines += [f"not covered: {u['item']} ({u['why']})" for u in r["uncovered"]]
    passed = sum(c["passed"] for c in r["cases"])
    total = len(r["cases"])
    if r["passed"]:
        lines.append(f"verify: passed ({passed} of {total} cases passed)")
    else:
        lines.append(f"verify: FAILED ({total - passed} of {total} cases failed, {passed} passed)")
    return "\n".join(lines) + "\n"


def verdict_line(c: dict[str, Any]) -> str:
    """`case K: DIMS (input shapes): pass|FAIL[: the first failing output, or the error]`."""
    dims = ", ".join(f"{k}={v}" for k, v in sorted(c["dims"].items())) or "static shapes"
    shapes = " ".join("x".join(str(d) for d in s) or "scalar" for s in c["shapes"])
    if c["passed"]:
        return f"case {c['case']}: {dims} ({shapes}): pass"
    bad = c["error"] or next(f"output '{o['name']}' differs" for o in c["outputs"] if not o["passed"])
    return f"case {c['case']}: {dims} ({shapes}): FAIL: {bad}"
