"""Shared test helpers: compile with bladepack, compare with torch eager."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

import bladepack
from bladepack.options import CompileOptions

TOL = 1e-5
# Note [Two exports] (export/capture.py): torch before 2.13 keeps guards 2.13 proves away (a parity of a
# strided pool's input, `size != 1`); an artifact then refuses those shapes (`the model was traced where`)
OLD_TORCH = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2]) < (2, 13)


def narrowed_sizes(symbols: Sequence[Any], sizes: dict[str, int]) -> list[str]:
    """The dims of `sizes` below their symbol's range (`symbols`: a signature's or a plan's, with `name`
    and `min`) on a torch before 2.13, which narrows the ranges it cannot prove (Note [Two exports];
    optimize says so in a note, which tests holding the artifact check with `refused_by_torch`). Always
    empty on a newer torch, so that tests stay strict there."""
    if not OLD_TORCH:
        return []
    lows = {sym.name: sym.min for sym in symbols}
    return [k for k, v in sizes.items() if v < lows.get(k, v)]


def narrowed(art: Any, sizes: dict[str, int]) -> bool:
    """Whether a case at `sizes` is below the artifact's ranges on a torch before 2.13 (`narrowed_sizes`),
    each such dim explained by one of optimize's notes (asserted): the test skips that case."""
    below = narrowed_sizes(art.plan.symbols, sizes)
    assert all(any(f"range of {k} " in n for n in art.notes) for k in below), (below, art.notes)
    return bool(below)


def refused_by_torch(notes: Sequence[str], err: BaseException | str) -> bool:
    """Whether `err` (an exception, or a loader's error text) is an artifact refusing a shape this torch
    could not export, so that a test skips that case: a size below a range the export narrowed (a note of
    the artifact names the dim: `... over the declared range of <dim> ...; its range starts at N`), or,
    on a torch before 2.13, a guard torch.export recorded. Anything else stays a failure."""
    text = str(err)
    if "ShapeGuardError" not in f"{type(err).__name__} {text}" and "shape guard" not in text:
        return False
    m = re.search(r"\(symbol '([^']+)'\) is -?\d+; the allowed range is", text)
    if m is not None and any(f"range of {m.group(1)} " in n for n in notes):
        return True
    return OLD_TORCH and "the model was traced where" in text


def all_isas() -> CompileOptions:
    """The environment's compile options, building the library of every x86-64 ISA level."""
    return CompileOptions.from_env(cpu_isas="x86-64,x86-64-v3,x86-64-v4")


def runnable_levels(art: Any) -> list[str]:
    """The ISA levels of `art`'s CPU kernel libraries that this machine can run."""
    from bladepack.cpu_features import cpu_flags

    have = cpu_flags()
    return [isa for isa, requires, _ in art.cpu_libraries if set(requires) <= have]


def eager_outputs(model: torch.nn.Module, inputs: list[np.ndarray]) -> list[list[np.ndarray]]:
    """The model's outputs (a tuple of tensors) per input, by eager."""
    with torch.no_grad():
        return [[o.numpy() for o in model(torch.from_numpy(x))] for x in inputs]


def eager_failures(
    path: Any,
    levels: list[str],
    inputs: list[np.ndarray],
    wants: list[list[np.ndarray]],
    tol: float,
    reference: int = 0,
) -> list[str]:
    """Each (ISA level, 1-3 threads, input, output) where the native kernels of the artifact at `path`
    differ from eager's outputs `wants` by more than `tol` (|y - eager| / (1 + max |eager|)); and, with
    `reference`, each of the first `reference` inputs where the reference executor does (it reads the
    packed weights the kernels read)."""
    from bladepack.options import LoaderOptions

    def check(m: Any, where: str, cases: list[tuple[np.ndarray, list[np.ndarray]]]) -> None:
        for x, want in cases:
            for k, (got, ref) in enumerate(zip(m(x), want, strict=True)):
                err = float(np.abs(np.asarray(got) - ref).max() / (1 + np.abs(ref).max()))
                if not err <= tol:
                    failures.append(f"{where}, input {x.shape}, output {k}: {err:.1e}")

    failures: list[str] = []
    cases = list(zip(inputs, wants))
    for isa in levels:
        for threads in (1, 2, 3):
            m = bladepack.load(path, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=threads))
            check(m, f"{isa}, {threads} threads", cases)
    if reference:
        check(bladepack.load(path, executor="reference"), "reference executor", cases[:reference])
    return failures


def no_dense_layers() -> CompileOptions:
    """The environment's compile options, linear layers kept as BLAS GEMMs (Note [Dense layers])."""
    return CompileOptions.from_env(dense_layers=False)


def rel_err(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref| (normwise relative error); exact match required for non-floats."""
    o = np.asarray(out.detach() if isinstance(out, torch.Tensor) else out)
    r = np.asarray(ref.detach() if isinstance(ref, torch.Tensor) else ref)
    assert o.shape == r.shape, f"shape {o.shape} != reference {r.shape}"
    assert o.dtype == r.dtype, f"dtype {o.dtype} != reference {r.dtype}"
    if o.dtype.kind not in "fc":
        return 0.0 if np.array_equal(o, r) else float("inf")
    if not np.array_equal(np.isnan(o), np.isnan(r)) or not np.array_equal(np.isinf(o), np.isinf(r)):
        return float("inf")
    fin = np.isfinite(r)
    if not fin.any():
        return 0.0
    diff = np.abs(o[fin].astype(np.float64) - r[fin].astype(np.float64)).max(initial=0.0)
    scale = np.abs(r[fin].astype(np.float64)).max(initial=0.0)
    return float(diff / scale) if scale > 0 else float(diff)


def as_tuple(x: Any) -> tuple[Any, ...]:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def compile_model(model: torch.nn.Module, samples: Any, dynamic_shapes: Any = None) -> bladepack.LoadedModule:
    art = bladepack.optimize(model, samples, dynamic_shapes)
    return bladepack.load(art.to_bytes())


def check_against_eager(
    model: torch.nn.Module, loaded: bladepack.LoadedModule, args: tuple[Any, ...], tol: float = TOL
) -> float:
    with torch.no_grad():
        ref = as_tuple(model(*args))
    out = as_tuple(loaded(*args))
    assert len(out) == len(ref)
    worst = 0.0
    for o, r in zip(out, ref):
        assert isinstance(o, torch.Tensor), "torch in must give torch out"
        e = rel_err(o, r)
        assert e <= tol, f"relative error {e:.3g} > {tol} at input shapes {[tuple(a.shape) for a in args]}"
        worst = max(worst, e)
    return worst


def with_manifest(art: Any, edit: Any) -> bytes:
    """The artifact's bytes with `edit(manifest)` applied to a copy of its manifest (checksums recomputed)."""
    import copy

    from bladepack.artifact import format as bpk_format

    manifest, sections = art._parts()
    manifest = copy.deepcopy(manifest)
    edit(manifest)
    return b"".join(bytes(c) for c in bpk_format.encode(manifest, sections))


def reachable_items(m: dict[str, Any], count: int = 300) -> set[str]:
    """Note [Reference cases]: the coverage items some shape of the range reaches — the range ends and
    `count` random bindings (log-uniform per symbol, unbounded symbols up to 4096), each through the
    shape program. Independent of how optimize chose its cases."""
    import random

    from bladepack.artifact.reference_cases import covered
    from bladepack.artifact.shape_program import ShapeProgram
    from bladepack.errors import ShapeGuardError

    program = ShapeProgram.from_manifest(m["shape_program"])
    rng = random.Random(7)
    syms = m["symbols"]

    def pick(s: dict[str, Any]) -> int:
        hi = s["max"] if s["max"] is not None else 4096
        return round(float(np.exp(rng.uniform(np.log(s["min"]), np.log(hi)))))

    bindings = [{s["name"]: s["min"] for s in syms}, {s["name"]: s["max"] or 4096 for s in syms}]
    bindings += [{s["name"]: pick(s) for s in syms} for _ in range(count)]
    seen: set[str] = set()
    for b in bindings:
        dims = [[b[d] if isinstance(d, str) else d for d in t["shape"]] for t in m["inputs"]]
        try:
            seen |= set(covered(m, program.evaluate(dims)))
        except ShapeGuardError:
            continue
    return seen


def free_ports(n: int) -> list[int]:
    """n TCP ports on 127.0.0.1 that were free a moment ago (for servers tests and benchmarks start)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports
