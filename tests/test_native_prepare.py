"""Note [Native preparation]: a new input-shape signature prepared by the kernel library gives exactly
the Python path's launch words, arena size and output shapes, and is refused (the Python path then
raises) wherever the Python path raises."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from hypothesis import example, given, settings

import bladepack
from bladepack.artifact import format as bpk_format
from bladepack.artifact.shape_program import ShapeProgram
from bladepack.errors import BladepackError, BpkFormatError
from bladepack.loader.executor import physical_memory
from bladepack.loader.manifest import Manifest
from bladepack.loader.native_cpu import NativeCpu
from bladepack.loader.native_executor import NativeExecutor
from bladepack.loader.native_prepare import STAGES, NativePreparation, eligible
from bladepack.loader.signature import check_inputs
from bladepack.options import LoaderOptions
from samples.registry import SAMPLES
from tests.helpers import rel_err
from tests.test_plan_check import EDITS, _rehashed
from tests.test_shape_program import _BIG, _case, _raw_programs

Key = tuple[tuple[int, ...], ...]


def _executor(data: bytes) -> NativeExecutor:
    ex = bladepack.load(data, executor="native")._executor
    assert isinstance(ex, NativeExecutor)
    return ex


@functools.cache
def _mlp_executor_of(data: bytes) -> NativeExecutor:
    return _executor(data)


def _mlp_executor(art: bladepack.api.Artifact) -> NativeExecutor:
    """One loaded executor per artifact for the many examples of a property test."""
    return _mlp_executor_of(art.to_bytes())


def _shaped(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """An array of this shape and dtype holding one element (for the input checks)."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), shape, (0,) * len(shape))


def _both(ex: NativeExecutor, key: Key) -> tuple[Any, Any]:
    """The Python path's (words, arena bytes, output shapes) or its error text, and the library's, or
    the stage that refused the signature."""
    try:
        check_inputs(ex.m.signature, [_shaped(t.dtype, shape) for t, shape in zip(ex.m.signature.inputs, key)])
        full = ex._build(key)
    except BladepackError as e:
        python: Any = str(e)
    else:
        assert all(seg.ref is None and not seg.when for seg in full.native.segments)
        words = np.concatenate([seg.words for seg in full.native.segments if seg.words is not None])
        python = (words.tolist(), full.native.arena_bytes, tuple(s for s, _ in full.ref.outputs))
    prep = ex.fast._prepare if ex.fast is not None else None
    assert prep is not None
    got = prep(key)
    native: Any = STAGES[prep.stage(key)] if got is None else (got.words.tolist(), got.arena_bytes, got.out_shapes)
    return python, native


def _agree(ex: NativeExecutor, keys: Sequence[Key]) -> int:
    """Every key: the same words where the Python path prepares it, a refusal where it raises; the
    number of keys both prepared."""
    prepared = 0
    for key in keys:
        python, native = _both(ex, key)
        if isinstance(python, str):
            assert isinstance(native, str), (key, python)
        else:
            assert native == python, key
            prepared += 1
    return prepared


def test_the_samples_prepare_as_the_python_path_does() -> None:
    """The LLaMA step (GEMMs, attention over the cache, RoPE), the MLP, the CNN and the encoder (an
    embedding, a mask) at the test sizes of their dims (1, odd sizes, the range's ends), past them and
    with a static dim changed (refused: the Python path's guard or input error)."""
    for name in ("llama", "mlp", "cnn", "encoder"):
        s = SAMPLES[name]
        torch.manual_seed(0)
        art = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes)
        ex = _executor(art.to_bytes())
        keys = []
        for k in range(8):
            dims = {d: vals[(k * 3 + j) % len(vals)] for j, (d, vals) in enumerate(s.test_dims.items())}
            keys.append(tuple(tuple(x.shape) for x in s.make_inputs(torch.Generator().manual_seed(k), **dims)))
        first = keys[0]
        too_big = tuple(tuple(d * 9000 if i == 0 else d for i, d in enumerate(shape)) for shape in first)
        keys += [too_big, tuple(shape[:-1] + (shape[-1] + 1,) for shape in first)]  # a static dim changed
        assert _agree(ex, keys) >= 6, name  # torch 2.11 exports some size-1 dims narrower (both refuse)


def test_shape_conditions_drop_launches_from_the_words() -> None:
    """An ONNX Loop over a symbolic trip count unrolls under shape conditions (Note [Guarded launches]):
    each signature's words hold exactly the launches its conditions keep, as the Python path's
    segments do, and the module's results are the reference executor's."""
    from tests.test_onnx import _loop_body, _loop_model

    art = bladepack.optimize(_loop_model("shape", _loop_body()), dynamic_shapes={"x": {0: bladepack.Dim("n", 1, 8)}})
    data = art.to_bytes()
    ex = _executor(data)
    keys = [((n, 4),) for n in range(1, 9)]
    assert _agree(ex, keys) == 8
    assert len({len(_both(ex, k)[1][0]) for k in keys}) == 8  # a different launch list per trip count
    m, ref = bladepack.load(data, executor="native"), bladepack.load(data, executor="reference")
    for n in (1, 2, 5, 8):
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        for a, b in zip(m(x), ref(x)):
            assert rel_err(a, b) <= 1e-6
    assert {k for k in m._executor.fast._plans} == {((n, 4),) for n in (1, 2, 5, 8)}
    assert len(m._executor.prepare) == 0  # none of them took the Python path

    def far(man: dict[str, Any]) -> None:  # the last launch (kept only at n = 8) points past its slot
        lr = man["native_cpu"]["launches"][-1]
        lr["ptrs"][0] = [lr["ptrs"][0][0], 1 << 40]

    edited = _executor(_rehashed(art, far))
    for key in keys:  # every signature checks every launch's pointers, dropped or kept
        python, native = _both(edited, key)
        assert "bytes into slot" in python and native == "pointer", (key, python, native)


def test_every_edit_is_refused_where_the_python_path_raises(mlp_artifact: bladepack.api.Artifact) -> None:
    """Note [Plan checks] at each signature: a plan edited and re-hashed that loads is prepared by the
    library only where the Python path prepares it (with its words), refused wherever that raises."""
    refused = prepared = 0
    for name in sorted(EDITS):
        data = _rehashed(mlp_artifact, EDITS[name][0])
        try:
            ex = _executor(data)
        except BpkFormatError:
            continue  # refused at load: no signature is prepared
        assert ex.fast is not None and ex.fast._prepare is not None, name
        keys = [((b, 64),) for b in (1, 5, 64)]
        both = _agree(ex, keys)
        prepared += both
        refused += len(keys) - both
    assert refused >= 3 * 12 and prepared >= 1, (refused, prepared)


def _without_when_records(words: list[int]) -> list[int]:
    """Launch words with the WHEN records (op 3, seven words: Note [Native preparation]) taken out."""
    out, pos = [], 0
    while pos < len(words):
        size = 4 + 2 * words[pos + 2] + words[pos + 3]
        if words[pos] != 3:
            out += words[pos : pos + size]
        pos += size
    return out


def _with_when_records(segments: Sequence[Any]) -> list[int]:
    """The Python path's segments as one word list: before each segment one WHEN record per data
    condition, skipping the rest of the segment when its byte says otherwise."""
    words: list[int] = []
    for sg in segments:
        for k, (slot, off, taken) in enumerate(sg.when):
            words += [3, int(taken), 1, 1, slot, off, 7 * (len(sg.when) - k - 1) + sg.words.size]
        words += sg.words.tolist()
    return words


def test_run_time_branches_are_prepared_natively() -> None:
    """A plan with a run-time data condition inside a shape condition (torch.cond on the batch, then on
    the values): each signature's words are the Python path's segments with one WHEN record before
    each run under a data condition, skipping exactly that run; the module takes the fast path with
    both outcomes of the data predicate, equal to the reference executor."""
    from bladepack.inspect import inspect_text, manifest_summary
    from tests.test_branches import BATCH, SIZES, _Branchy

    torch.manual_seed(0)
    art = bladepack.optimize(_Branchy().eval(), [(torch.randn(3, 8),), (torch.randn(6, 8),)], ({0: BATCH},))
    data = art.to_bytes()
    ex = _executor(data)
    prep = ex.fast._prepare if ex.fast is not None else None
    assert prep is not None
    whens = 0
    for b in SIZES:
        key = ((b, 8),)
        full = ex._build(key)
        segs = full.native.segments
        got = prep(key)
        assert got is not None
        words = got.words.tolist()
        assert _without_when_records(words) == np.concatenate([sg.words for sg in segs]).tolist(), b
        assert words == _with_when_records(segs), b
        whens += sum(len(sg.when) for sg in segs)
    assert whens > 0  # the large branch's data predicate was met

    def dropped_inside(man: dict[str, Any]) -> None:
        """A launch a shape condition drops between two under the same data condition: the Python path
        reads the predicate again after it (two segments), and so must the WHEN records."""
        runs = [lr for lr in man["native_cpu"]["launches"] if any("ptr" in c for c in lr.get("when", ()))]
        assert len(runs) >= 3
        runs[2]["when"] = [dict(c) for c in runs[0]["when"]]
        runs[1]["when"] = [*runs[1]["when"], {"r": runs[0]["when"][0]["r"], "is": False}]

    edited = _executor(_rehashed(art, dropped_inside))
    segs = edited._build(((64, 8),)).native.segments
    got = edited.fast._prepare(((64, 8),)) if edited.fast is not None and edited.fast._prepare else None
    assert got is not None and got.words.tolist() == _with_when_records(segs)
    assert sum(1 for sg in segs if sg.when) >= 2
    text = inspect_text(manifest_summary(art._parts()[0]))
    assert "new input shapes (Python loader): prepared by the kernel library, one native call each" in text
    m, ref = bladepack.load(data, executor="native"), bladepack.load(data, executor="reference")
    for b in SIZES:
        for sign in (1.0, -1.0):
            x = (np.abs(np.random.default_rng(b).standard_normal((b, 8))) * sign).astype(np.float32)
            for _ in range(2):  # the first call prepares the signature, the second finds it
                for a, w in zip(m(x), ref(x)):
                    assert rel_err(a, w) <= 1e-6, (b, sign)
    assert len(m._executor.prepare) == 0  # no call took the Python path


def test_plans_the_library_does_not_prepare() -> None:
    """A plan with a reference step (an integer matmul: no BLAS routine) keeps the Python path, says so
    in inspect, and runs."""
    from bladepack.inspect import inspect_text, manifest_summary

    class IntMatmul(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return (x @ w) + 1

    w = torch.ones(4, 2, dtype=torch.int64)
    art = bladepack.optimize(
        IntMatmul(), [(torch.ones(3, 4, dtype=torch.int64), w), (torch.ones(5, 4, dtype=torch.int64), w)]
    )
    m = Manifest.read(bpk_format.read(art.to_bytes()))
    assert eligible(m) == "a reference step"
    ex = _executor(art.to_bytes())
    assert ex.fast is None or ex.fast._prepare is None
    text = inspect_text(manifest_summary(art._parts()[0]))
    assert "new input shapes (Python loader): prepared in Python (a reference step)" in text
    x = np.arange(28, dtype=np.int64).reshape(7, 4)
    np.testing.assert_array_equal(bladepack.load(art.to_bytes())(x, w.numpy()), x @ w.numpy() + 1)


def test_when_records_are_checked(mlp_artifact: bladepack.api.Artifact) -> None:
    """The library's operand checks refuse a WHEN record whose byte lies outside its slot, whose skip
    runs past the list or lands inside a record, or whose expected value is not 0 / 1; a well-formed one
    passes."""
    ex = _executor(mlp_artifact.to_bytes())
    lib = ex.native
    assert lib._check is not None
    slots = np.array([64, 8, 40], dtype=np.int64)
    writable = np.ones(3, dtype=np.uint8)

    def check(words: list[int]) -> int:
        w = np.array(words, dtype=np.int64)
        status = np.zeros(4, dtype=np.int64)
        return int(lib._check(w.ctypes.data, w.size, slots.ctypes.data, writable.ctypes.data, 3, status.ctypes.data))

    fine = [3, 1, 1, 1, 1, 7, 0]
    assert check(fine + [3, 0, 1, 1, 0, 63, 0]) == 0
    bad = {
        "byte past its slot": [3, 1, 1, 1, 1, 8, 0],
        "skip past the list": [3, 1, 1, 1, 1, 0, 8],
        "skip into the next WHEN record": [3, 1, 1, 1, 1, 0, 3] + fine,
        "expected 2": [3, 2, 1, 1, 1, 0, 0],
        "two pointers": [3, 1, 2, 1, 1, 0, 1, 0, 0],
    }
    for name, words in bad.items():
        assert check(words) != 0, name


def test_int64_limits_are_refused_not_wrapped(mlp_artifact: bladepack.api.Artifact) -> None:
    """A constant of the plan outside int64 leaves the plan to the Python path; an input dim whose
    derived sizes overflow int64 is refused by the library (the Python path raises its guard error)."""
    big = _rehashed(mlp_artifact, lambda m: m["native_cpu"]["buffers"][0].__setitem__("offset", (1 << 63) + 5))
    m = Manifest.read(bpk_format.read(big))
    native = NativeCpu(
        bpk_format.read(big), m.native["cpu"], [m.weights[w["id"]] for w in m.weight_rows], LoaderOptions()
    )
    words = native.launch_words(m.kernels["cpu"])
    assert NativePreparation.build(m, native.prepare_entry, words, physical_memory()) is None
    ex = _executor(mlp_artifact.to_bytes())
    prep = ex.fast._prepare if ex.fast is not None else None
    assert prep is not None
    assert STAGES[prep.stage(((1 << 62, 64),))] == "slot bytes"  # the input's bytes overflow int64
    assert STAGES[prep.stage(((65, 64),))] == "shape program"  # past the range: the guard refuses
    assert prep.stage(((64, 64),)) == 0
    m = ex.m
    small = NativePreparation.build(
        m, ex.native.prepare_entry, ex.native.launch_words(m.kernels["cpu"]), 64 * 10 * 4 + 2000
    )  # bytes a call may need
    assert small is not None and small.stage(((1, 64),)) == 0 and STAGES[small.stage(((64, 64),))] == "memory"


def _program_only(prog: ShapeProgram) -> np.ndarray:
    """A preparation program holding only `prog` over two inputs of rank 2 (item size 0, so no input's
    bytes overflow), no outputs, buffers or launches: what bpk_prepare leaves in its registers is the
    shape program's result."""
    from bladepack.loader.native_prepare import HEADER, MAGIC

    code = [w for op, d, a, b, c in prog.code for w in (op, d, 2 * a + b if op == 1 else a, 0 if op == 1 else b, c)]
    inputs = [0, 2, 0, -1, -1, 2, 2, 0, -1, -1]
    head = dict.fromkeys(HEADER, 0)
    body: list[int] = []
    for name, words in (("inputs", inputs), ("constants", [0]), ("code", code), ("writable", [1])):
        head[name + "_at"] = len(HEADER) + len(body)
        body += words
    head.update(magic=MAGIC, inputs=2, registers=prog.num_registers, constants=1, arena=prog.num_registers)
    head.update(instructions=len(prog.code), memory=1 << 40)
    return np.array([head[k] for k in HEADER] + body, dtype=np.int64)


@settings(max_examples=400, deadline=None)
@given(case=_raw_programs())
@example(case=_case((0, 0, -(1 << 63), 0, 0), (0, 1, 2, 0, 0), (6, 2, 0, 1, 0)))  # INT64_MIN rounded up: fits
@example(case=_case((0, 0, -(1 << 63), 0, 0), (0, 1, -1, 0, 0), (6, 2, 0, 1, 0)))  # ... by -1: past int64
@example(case=_case((0, 0, -(1 << 63), 0, 0), (0, 1, -1, 0, 0), (5, 2, 0, 1, 0)))  # INT64_MIN // -1
@example(case=_case((0, 0, -(1 << 63), 0, 0), (0, 1, -1, 0, 0), (7, 2, 0, 1, 0)))  # INT64_MIN % -1 is 0
@example(case=_case((0, 0, -7, 0, 0), (0, 1, 2, 0, 0), (6, 2, 0, 1, 0), (5, 3, 0, 1, 0), (7, 4, 0, 1, 0)))
@example(case=_case((0, 0, 7, 0, 0), (0, 1, -2, 0, 0), (6, 2, 0, 1, 0), (5, 3, 0, 1, 0), (7, 4, 0, 1, 0)))
@example(case=_case((0, 0, _BIG, 0, 0), (0, 1, 4, 0, 0), (4, 2, 0, 1, 0)))  # a product past int64
@example(case=_case((1, 0, 1, 0, 0), (5, 1, 3, 0, 0)))  # a zero divisor
@example(case=_case((1, 0, 1, 0, 0), (10, 1, 0, 3, 0), (15, 2, 1, 0, 1)))  # a failing assert
def test_the_library_evaluates_shape_programs_as_python_does(
    mlp_artifact: bladepack.api.Artifact, case: tuple[ShapeProgram, list[list[int]]]
) -> None:
    """The interpreter's shape program (cpu_prepare.h) gives the Python evaluator's registers, and
    declines exactly where that raises: int64's ends, zero divisors, rounding toward negative infinity,
    failing asserts, registers read before written."""
    from bladepack.errors import ShapeGuardError

    prog, dims = case
    prog.validate([2, 2])
    ex = _mlp_executor(mlp_artifact)
    assert ex.native.prepare_entry is not None
    program = _program_only(prog)
    flat = np.array([d for shape in dims for d in shape], dtype=np.int64)
    regs = np.zeros(prog.num_registers + 1, dtype=np.int64)
    scratch = np.zeros(16, dtype=np.int64)
    stage = ex.native.prepare_entry(
        program.ctypes.data,
        flat.ctypes.data,
        regs.ctypes.data,
        scratch.ctypes.data,
        scratch.ctypes.data,
        scratch.ctypes.data,
        scratch.ctypes.data,
    )
    try:
        want: list[int] | None = prog.evaluate(dims)
    except ShapeGuardError:
        want = None
    assert (STAGES[stage] == "shape program") == (want is None), (stage, want, prog.text())
    if want is not None:
        assert stage == 0 and regs[: prog.num_registers].tolist() == want, prog.text()
