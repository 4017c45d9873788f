"""Note [Compiled CUDA preparation] (bladepack/loader/cuda_prepare.py): at every signature the compiled
preparation of a CUDA plan gives what resolving the plan's records one by one gives — the slot sizes,
each kept launch's function, grid, block, shared memory and data conditions, each GEMM's arguments,
the arena buffers — and where the plan's checks fail it raises their error word for word: the launch
checks (Note [Plan checks]) and the kernels' operand checks (Note [Kernel operand checks]), in the
order the interpreted checks make them. No GPU and no driver: the preparation is host work.
"""

from __future__ import annotations

import copy
import os
import shutil
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import bladepack
from bladepack.artifact import format as bpk_format
from bladepack.errors import BladepackError, BpkFormatError
from bladepack.loader.cuda_prepare import CudaPreparation
from bladepack.loader.gemm_args import gemm_args
from bladepack.loader.launch_words import KernelParams
from bladepack.loader.manifest import Manifest, conditions_hold, resolve
from bladepack.loader.native_cuda import GemmLaunch, KernelLaunch, RefLaunch
from bladepack.loader.plan_check import (
    BYTE_SIZES,
    INT64_MAX,
    check_launches,
    check_operand_programs,
    check_plan,
    operand_programs,
)
from samples.registry import SAMPLES

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("NVCC"), reason="nvcc not found (CUDA targets need it)"
)

TARGETS = ("cpu", "cuda:sm_90")


def _manifest(data: bytes, edit: Callable[[dict[str, Any]], None] | None = None) -> Manifest:
    bpk = bpk_format.read(data)
    if edit is not None:
        sections = [bpk_format.Section(n, bytes(bpk.section(n))) for n in bpk.section_names]
        manifest = copy.deepcopy({k: v for k, v in bpk.manifest.items() if k != "sections"})
        edit(manifest)
        bpk = bpk_format.read(b"".join(bytes(c) for c in bpk_format.encode(manifest, sections)))
    return Manifest.read(bpk)


def _preparation(m: Manifest) -> tuple[CudaPreparation, int]:
    plan = m.native["cuda"]
    assert plan is not None
    status = 1 + len(m.input_ids) + len(plan["outputs"]) + len(m.weight_rows)
    return CudaPreparation(m, KernelParams(plan["launches"], status), operand_programs(m), None), status


def _resolved(m: Manifest, key: Any, regs: Any, outs: Any) -> Any:
    """The oracle: the interpreted checks, then every record resolved on its own."""
    plan = m.native["cuda"]
    assert plan is not None
    slots = check_launches(m, "cuda", key, regs, outs)
    if max(slots) <= INT64_MAX:
        check_operand_programs(m, operand_programs(m), regs, slots)
    launches = []
    for lr in plan["launches"]:
        when = lr.get("when", ())
        if conditions_hold(when, regs) is False:
            continue
        data = tuple((c["ptr"][0], resolve(c["ptr"][1], regs), c["is"]) for c in when if "ptr" in c)
        if lr["op"] == "kernel":
            row = m.kernels["cuda"][lr["k"]]
            v = next(v for v in row["variants"] if regs[v["pred"]])
            launches.append(("kernel", v["fn"], resolve(v["grid"], regs), v["block"], resolve(v["smem"], regs), data))
        elif lr["op"] == "gemm":
            ptrs = tuple((s, resolve(o, regs)) for s, o in lr["ptrs"])
            args = gemm_args([resolve(v, regs) for v in lr["ints"]], BYTE_SIZES[lr["dtype"]])
            launches.append(("gemm", lr["dtype"], ptrs, args, data))
        else:
            launches.append(("ref", lr["node"], data))
    buffers = {
        b["id"]: (resolve(b["offset"], regs), tuple(resolve(b["shape"], regs)), b["dtype"]) for b in plan["buffers"]
    }
    return slots, launches, buffers, resolve(plan["arena_bytes"], regs)


def _compiled(prep: CudaPreparation, key: Any, regs: Any, outs: Any) -> Any:
    slots, cp = prep(key, regs, outs)
    launches: list[Any] = []
    start = 0
    for k, launch in enumerate(cp.launches):
        data = cp.when[k] if cp.when else ()
        if isinstance(launch, KernelLaunch):
            assert launch.start == start  # the kept kernels' words follow one another
            start += launch.words
            launches.append(("kernel", launch.fn, launch.grid, launch.block, launch.smem, data))
        elif isinstance(launch, GemmLaunch):
            launches.append(("gemm", launch.dtype, launch.ptrs, launch.args, data))
        else:
            assert isinstance(launch, RefLaunch)
            launches.append(("ref", launch.node, data))
    assert start == cp.words.size
    return slots, launches, cp.buffers, cp.arena_bytes


def _outcome(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except BpkFormatError as e:
        return f"BpkFormatError: {e}"


def _agree(m: Manifest, keys: list[Any], what: str = "") -> list[Any]:
    """Both outcomes, asserted equal, at each key whose shape program passes."""
    prep, _ = _preparation(m)
    outcomes = []
    for key in keys:
        try:
            regs = m.registers(key)
        except BladepackError:
            continue
        outs = [s for s, _ in m.output_specs(regs)]
        want = _outcome(lambda: _resolved(m, key, regs, outs))
        got = _outcome(lambda: _compiled(prep, key, regs, outs))
        assert got == want, (what, key)
        outcomes.append(got)
    return outcomes


@pytest.fixture(scope="module")
def artifacts() -> dict[str, bytes]:
    out = {}
    for name in ("mlp", "llama", "encoder", "cnn"):
        s = SAMPLES[name]
        out[name] = bladepack.optimize(
            s.build().eval(), s.export_samples(), s.dynamic_shapes, targets=TARGETS
        ).to_bytes()
    return out


def _keys(name: str) -> list[Any]:
    if name == "mlp":
        return [((b, 64),) for b in (1, 2, 7, 64, 65, 333)]
    if name == "llama":
        return [((b, 1, 64), (b, 2, p, 8), (b, 2, p, 8)) for b in (1, 3) for p in (1, 2, 17, 300)]
    if name == "encoder":
        return [((b, s), (b, s)) for b in (1, 2, 5) for s in (1, 3, 16, 77)]
    return [((b, 3, h, w),) for b in (1, 2) for h, w in ((24, 24), (31, 17), (64, 48), (33, 90))]


@pytest.mark.parametrize("name", ["mlp", "llama", "encoder", "cnn"])
def test_samples_prepare_as_their_records_resolve(artifacts: dict[str, bytes], name: str) -> None:
    m = _manifest(artifacts[name])
    check_plan(m, "cuda", None)
    outcomes = _agree(m, _keys(name))
    assert len(outcomes) == len(_keys(name)) and not any(isinstance(o, str) for o in outcomes)


def test_dropped_launches_and_data_conditions() -> None:
    """A plan whose launches a shape condition drops at some sizes (the kept kernels' words renumbered)
    and whose run-time branch reads a predicate byte."""
    from tests.test_branches import BATCH, SIZES, _Branchy

    torch.manual_seed(0)
    art = bladepack.optimize(
        _Branchy().eval(), [(torch.randn(3, 8),), (torch.randn(6, 8),)], ({0: BATCH},), targets=TARGETS
    )
    m = _manifest(art.to_bytes())
    plan = m.native["cuda"]
    assert plan is not None
    assert any(any("r" in c for c in lr.get("when", ())) for lr in plan["launches"])
    outcomes = _agree(m, [((n, 8),) for n in SIZES])
    assert len(outcomes) == len(SIZES) and not any(isinstance(o, str) for o in outcomes)


def _cuda(m: dict[str, Any]) -> dict[str, Any]:
    return m["native_cuda"]  # type: ignore[no-any-return]


def _nth(op: str, n: int = 0) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda m: [lr for lr in _cuda(m)["launches"] if lr["op"] == op][n]


def _arena_register(m: dict[str, Any]) -> Any:
    return _cuda(m)["arena_bytes"]


# edits of the MLP's CUDA plan, each breaking one check at some or every signature
EDITS: dict[str, Callable[[dict[str, Any]], None]] = {
    "GEMM lda 2**30": lambda m: _nth("gemm")(m)["ints"].__setitem__(17, 1 << 30),
    "GEMM batch 2**31": lambda m: _nth("gemm")(m)["ints"].__setitem__(0, 1 << 31),
    "GEMM M huge": lambda m: _nth("gemm", 1)(m)["ints"].__setitem__(12, 1 << 40),
    "GEMM negative stride": lambda m: _nth("gemm")(m)["ints"].__setitem__(3, -5),
    "GEMM transpose flag 7": lambda m: _nth("gemm")(m)["ints"].__setitem__(15, 7),
    "GEMM ldc too short": lambda m: _nth("gemm", 2)(m)["ints"].__setitem__(19, 1),
    "GEMM output offset past its room": lambda m: _nth("gemm")(m)["ptrs"][2].__setitem__(1, _arena_register(m)),
    "GEMM M from the arena size": lambda m: _nth("gemm")(m)["ints"].__setitem__(12, _arena_register(m)),
    "pointer offset -64": lambda m: _nth("kernel")(m)["ptrs"].__setitem__(0, [0, -64]),
    "pointer past the arena": lambda m: _nth("kernel")(m)["ptrs"].__setitem__(0, [0, 1 << 40]),
    "pointer at the arena size": lambda m: _nth("kernel", 1)(m)["ptrs"].__setitem__(0, [0, _arena_register(m)]),
    "arena 0 bytes": lambda m: _cuda(m).__setitem__("arena_bytes", 0),
    "arena -8 bytes": lambda m: _cuda(m).__setitem__("arena_bytes", -8),
    "buffer past the arena": lambda m: _cuda(m)["buffers"][0].__setitem__("offset", 1 << 40),
    "buffer at -256": lambda m: _cuda(m)["buffers"][-1].__setitem__("offset", -256),
    "buffer with a negative dim": lambda m: _cuda(m)["buffers"][0]["shape"].__setitem__(-1, -3),
    "kernel integer -1": lambda m: _nth("kernel")(m)["ints"].__setitem__(0, -1),
    "kernel integer 2**62": lambda m: _nth("kernel")(m)["ints"].__setitem__(0, 1 << 62),
    "kernel integer from the arena size": lambda m: _nth("kernel", 1)(m)["ints"].__setitem__(0, _arena_register(m)),
    "output shape [-1, 64]": lambda m: next(v for v in m["values"] if v["id"] == m["outputs"][0]["id"]).__setitem__(
        "shape", [-1, 64]
    ),
    "output shape [1, 1]": lambda m: next(v for v in m["values"] if v["id"] == m["outputs"][0]["id"]).__setitem__(
        "shape", [1, 1]
    ),
}


def test_edited_plans_fail_in_the_same_words(artifacts: dict[str, bytes]) -> None:
    """Every edit above, at sizes 1, 5, 64 and 333: the compiled preparation raises the interpreted
    checks' error word for word where they fail (the first in plan order), and equals them where they
    pass. At least one signature of every edit is refused."""
    never: list[str] = []
    for name, edit in EDITS.items():
        m = _manifest(artifacts["mlp"], edit)
        check_plan(m, "cuda", None)
        outcomes = _agree(m, [((b, 64),) for b in (1, 5, 64, 333)], name)
        if not any(isinstance(o, str) for o in outcomes):
            never.append(name)
    assert not never, never


def test_the_source_holds_no_manifest_text(artifacts: dict[str, bytes]) -> None:
    """Kernel names, dtypes and launch ops of a hostile manifest never reach the compiler: a kernel
    named like a statement and a GEMM dtype that is code change nothing but the error texts."""
    marker = "__import__('os').system('exit 7')"

    def edit(m: dict[str, Any]) -> None:
        for row in m["kernels"]:
            row["name"] = marker

    m = _manifest(artifacts["mlp"], edit)
    prep, _ = _preparation(m)
    seen: list[str] = []
    real = compile

    def spy(source: str, *args: Any, **kwargs: Any) -> Any:
        seen.append(source)
        return real(source, *args, **kwargs)

    import bladepack.loader.cuda_prepare as module

    module.compile = spy  # type: ignore[attr-defined]
    try:
        key = ((5, 64),)
        regs = m.registers(key)
        prep(key, regs, [s for s, _ in m.output_specs(regs)])
    finally:
        del module.compile  # type: ignore[attr-defined]
    assert seen and all(marker not in s and "float32" not in s and "'kernel'" not in s for s in seen)
    assert np.all([("import" not in s) for s in seen])


@settings(max_examples=400, deadline=None)
@given(
    batch=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    strides=st.lists(st.integers(-2, 70), min_size=12, max_size=12),
    mnk=st.lists(st.integers(0, 9), min_size=3, max_size=3),
    source=st.booleans(),
    item=st.sampled_from([2, 4, 8]),
)
def test_gemm_arguments_cover_every_batch_once(
    batch: list[int], strides: list[int], mnk: list[int], source: bool, item: int
) -> None:
    """gemm_args splits a record's three batch dims into host steps and the library's own batch: the
    byte offsets of A, B, D and the epilogue source over (step, library batch index) are those of the
    record's (b0, b1, b2) loop, each once, in order (a decode loop's records go through it at every new
    signature)."""
    sa, sb, sc, ss = strides[0:3], strides[3:6], strides[6:9], strides[9:12]
    m, n, k = mnk
    ints = [*batch, *sa, *sb, *sc, m, n, k, 0, 0, max(k, 1), max(n, 1), max(n, 1)]
    if source:
        ints += [*ss, n]
    g = gemm_args(ints, item)
    if m == 0 or n == 0 or 0 in batch:
        assert g.steps == ()
        return
    src = ss if source else [0, 0, 0]
    want = [
        tuple((i * s[0] + j * s[1] + h * s[2]) * item for s in (sa, sb, sc, src))
        for i in range(batch[0])
        for j in range(batch[1])
        for h in range(batch[2])
    ]
    strides_lib = (g.stride_a, g.stride_b, g.stride_c, g.stride_src)
    got = [tuple(off + h * s * item for off, s in zip(step, strides_lib)) for step in g.steps for h in range(g.batch)]
    assert got == want
    assert (g.m, g.n, g.k) == (m, n, k)


def test_gemm_batches_merge_where_strides_chain() -> None:
    """The library runs the innermost batch dim that is not 1 with every dim outside it whose strides
    chain into it: a contiguous [b, h] pair is one call of b x h, a lone batch dim (padded with 1s after
    it) is the library's, and a dim whose strides do not chain stays on the host."""
    mnk = [5, 7, 3, 0, 0, 3, 7, 7]  # m, n, k, ta, tb, lda, ldb, ldc

    def args(batch: list[int], sa: list[int], sb: list[int], sc: list[int]) -> tuple[int, tuple[int, int, int], int]:
        g = gemm_args([*batch, *sa, *sb, *sc, *mnk], 4)
        return g.batch, (g.stride_a, g.stride_b, g.stride_c), len(g.steps)

    b, h = 2, 12
    assert args([b, h, 1], [h * 15, 15, 0], [h * 21, 21, 0], [h * 35, 35, 0]) == (b * h, (15, 21, 35), 1)
    assert args([b, 1, 1], [15, 0, 0], [0, 0, 0], [35, 0, 0]) == (b, (15, 0, 35), 1)  # a shared weight
    assert args([b, h, 1], [15, 15 * b, 0], [0, 0, 0], [35, 35 * b, 0]) == (h, (15 * b, 0, 35 * b), b)
    assert args([1, h, 1], [0, 15, 0], [0, 21, 0], [0, 35, 0]) == (h, (15, 21, 35), 1)
    assert args([1, 1, 1], [0] * 3, [0] * 3, [0] * 3) == (1, (0, 0, 0), 1)
