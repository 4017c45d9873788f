"""optimize(..., packed=True): the packed form of a model built beside its plan, and checked against it.

In: the front end's program, how the model is being built (target, dtype, GEMM library, options) and
the sample inputs. Out: the packed form's record (Note [Packed sequences] in passes/pack_sequences.py)
and its own `Artifact` (a plan of every kind the model's has: CPU, and CUDA where it is a target),
which the model's artifact embeds (artifact/writer.py
`embed_packed`); or a CompileError saying why the model has none.

Note [Packed self-check]: the packed plan is the unpacked one's graph with three changes, so it is
checked against it before the artifact is returned: the sample inputs' rows, cut to different lengths
(the longest, then one shorter per row, never under the dim's minimum), run once packed and once each
alone on the unpacked plan, on the CPU kernels of this machine; they must agree within float rounding
of GEMMs over more rows: the reference cases' tolerance of the output's dtype (float32 1e-4 of the
output's magnitude, bfloat16 4e-2; Note [Verdict tolerance]), integers exactly. A difference is a bladepack bug: a
CompileError, unless options.self_check is "warn". Where the unpacked plan's batch starts above 1 (a
torch before 2.13 that could not export a batch of 1: Note [Two exports]), a sequence alone is that
many copies of it, its first row kept (the batch dim is proven batch-like), here and in the loader's
check of each length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from bladepack.artifact.reference_cases import TOLERANCE
from bladepack.compiled import Artifact
from bladepack.errors import BladepackError, CompileError
from bladepack.loader.packed import rows_min
from bladepack.options import CompileOptions, LoaderOptions
from bladepack.target import CPU_ONLY, Target

if TYPE_CHECKING:
    from bladepack.ir import Program


def build_packed(
    program: Program, target: Target, compile_packed: Callable[[Program], Artifact]
) -> tuple[dict[str, Any], Artifact]:
    """The packed form's record and its artifact, which `compile_packed` builds from the packed program
    (stages.py: the same stages and target, quiet, no dumps); CompileError when the model has none. The
    target must hold the CPU plan: Note [Packed self-check] runs it."""
    from bladepack.passes.pack_sequences import NotPackable, pack_sequences

    if not target.covers(CPU_ONLY):
        raise CompileError("packed=True checks its packed plan on the CPU: add 'cpu' to the targets")
    try:
        packed = pack_sequences(program)
    except NotPackable as e:
        raise CompileError(f"packed=True: this model has no packed form ({e})") from None
    return packed.to_manifest(), compile_packed(packed.program)


def _requests(
    record: dict[str, Any], names: list[str], sample: Sequence[np.ndarray | None], smin: int
) -> tuple[list[list[Any]], list[int]] | None:
    """Note [Packed self-check]: each row of the sample cut to its own length, and the lengths."""
    inputs: dict[str, list[int]] = record["inputs"]
    ragged = [k for k, n in enumerate(names) if n in inputs]
    if len(sample) != len(names) or not ragged or any(sample[k] is None for k in ragged):
        return None
    first = sample[ragged[0]]
    assert first is not None
    rows_axis, seq_axis = inputs[names[ragged[0]]]
    rows, full = first.shape[rows_axis], first.shape[seq_axis]
    out, lengths = [], []
    for i in range(rows):
        n = max(smin, full - i)
        req = []
        for k, x in enumerate(sample):
            if k in ragged:
                assert x is not None
                ra, sa = inputs[names[k]]
                x = np.take(np.take(x, [i], axis=ra), range(n), axis=sa)
            req.append(x)
        out.append(req)
        lengths.append(n)
    return out, lengths


def _alone(m: Any, record: dict[str, Any], names: list[str], outs: list[str], req: list[Any], least: int) -> list[Any]:
    """One sequence's outputs on the unpacked plan: a batch of it alone, or, where the batch starts at
    `least` > 1 (rows_min), of it repeated that many times (rows are independent: the packed form's
    batch dim is proven batch-like), its first row kept."""
    if least == 1:
        return list(m.run(req))
    ins = record["inputs"]
    rep = [np.repeat(x, least, axis=int(ins[n][0])) if n in ins else x for n, x in zip(names, req, strict=True)]
    return [np.take(o, [0], axis=int(record["outputs"][n][0])) for n, o in zip(outs, m.run(rep), strict=True)]


def _values(x: Any, dtype: str) -> np.ndarray:
    """An output as float64 numbers (bfloat16 comes back as its uint16 bit patterns)."""
    a = np.asarray(x)
    if dtype == "bfloat16" and a.dtype == np.uint16:
        a = (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float64)


def self_check(data: bytes, samples: list[list[np.ndarray | None]], options: CompileOptions) -> str | None:
    """Note [Packed self-check] on the artifact's bytes; a note when it cannot run, None when it passed."""
    from bladepack.loader import load

    try:
        m = load(data, executor="native", options=LoaderOptions(cache_dir=options.cache_dir))
    except BladepackError as e:
        return f"the packed form was not checked here ({e})"
    record = m.manifest["packed"]
    names = [t.name for t in m.signature.inputs]
    outs = [t.name for t in m.signature.outputs]
    smin = int(next(s["min"] for s in m.manifest["symbols"] if s["name"] == record["symbol"]))
    least = rows_min(m.signature, record)
    bad = []
    for sample in samples:
        cut = _requests(record, names, sample, smin)
        if cut is None:
            continue
        reqs, lengths = cut
        wants = [_alone(m, record, names, outs, r, least) for r in reqs]
        packed_in = [
            np.concatenate([r[k] for r in reqs], axis=record["inputs"][n][1]) if n in record["inputs"] else reqs[0][k]
            for k, n in enumerate(names)
        ]
        got = m.run_packed(packed_in, lengths)
        cuts = np.cumsum(lengths)[:-1]
        for k, name in enumerate(outs):
            rows, axis = record["outputs"][name]
            dtype = m.signature.outputs[k].dtype
            o = _values(got[k], dtype)
            pieces = np.split(o, len(lengths), axis=rows) if axis < 0 else np.split(o, cuts, axis=axis)
            for n, piece, want in zip(lengths, pieces, wants):
                w = _values(want[k], dtype)
                scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
                err = float(np.max(np.abs(piece - w))) if w.size else 0.0
                if not err <= TOLERANCE.get(dtype, 0.0) * scale:
                    bad.append(f"output '{name}' of a sequence of {n}: max abs error {err:.3g}")
    if not bad:
        return None
    what = "the packed form differs from the unpacked plan (" + "; ".join(bad[:4]) + ")"
    if options.self_check == "warn":
        return f"{what}: please report it"
    raise CompileError(f"{what}: a bladepack bug, please report it with the model")
