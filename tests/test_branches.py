"""Run-time branches: torch.cond (and ONNX If, in test_onnx.py) on predicates optimize time cannot decide.

Note [Run-time branches] (export/control_flow.py): both branches under guards and a `where` merge.
Checked here: numerics against eager on both sides of shape and data predicates (nested, with weights
in a branch, at batch 1, odd sizes and the range ends) on the native, reference, C++ and fake-GPU
executors; that the executors really skip the untaken branch (prepared launch lists, the fake
driver's log); the guard analysis (ir/guards.py) on hand-built graphs; golden IR text; and corrupt
conditions in a manifest refused at load.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import bladepack
from bladepack.dtypes import DType
from bladepack.errors import BpkFormatError
from bladepack.ir import GraphBuilder, Guard, OpKind, TensorType, print_graph
from bladepack.ir.guards import effective_guards
from bladepack.loader.launch_words import OP_KERNEL
from tests.cpp_build import BuildError
from tests.helpers import as_tuple, with_manifest


class _Branchy(nn.Module):
    """batch > 4 (open for batch in [1, 64]) picks a branch; inside the large one, a data predicate
    (mean > 0) picks between a Linear (a weight read in a branch) and an exp; two results."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def small(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x - 1, x.sum(-1)

        def large(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            y = torch.cond(x.mean() > 0, lambda t: self.fc(t).relu(), lambda t: t.exp() * 0.5, (x,))
            return y * 2, y.amax(-1)

        return torch.cond(x.shape[0] > 4, large, small, (x,))


BATCH = bladepack.Dim("batch", 1, 64)
SIZES = (1, 4, 5, 7, 64)


@pytest.fixture(scope="module")
def branchy() -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = _Branchy().eval()
    art = bladepack.optimize(model, [(torch.randn(3, 8),), (torch.randn(6, 8),)], ({0: BATCH},))
    return model, art


def _cases() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [np.abs(rng.standard_normal((n, 8))).astype(np.float32) * sign for n in SIZES for sign in (1.0, -1.0)]


def _eager(model: nn.Module, x: np.ndarray) -> tuple[np.ndarray, ...]:
    with torch.no_grad():
        return tuple(o.numpy() for o in as_tuple(model(torch.from_numpy(x))))


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_cond_matches_eager_on_both_sides(branchy: tuple[nn.Module, Any], executor: str) -> None:
    model, art = branchy
    loaded = bladepack.load(art.to_bytes(), executor=executor)
    for x in _cases():
        for o, w in zip(loaded(x), _eager(model, x)):
            np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6, err_msg=f"{executor} at {x.shape}, sum {x.sum()}")


def _launches(words: np.ndarray) -> int:
    """How many launch records a prepared word list holds (Note [Launch words] in cpu_runtime.h)."""
    pos = count = 0
    while pos < words.size:
        assert words[pos] in (OP_KERNEL, 2)
        pos += 4 + 2 * int(words[pos + 2]) + int(words[pos + 3])
        count += 1
    return count


def test_untaken_branches_are_skipped(branchy: tuple[nn.Module, Any]) -> None:
    """Note [Guarded launches]: at a signature the shape predicate rules a branch out, its launches are
    not in the prepared list at all; the data branches are segments read at run time, one per side."""
    _, art = branchy
    plan = art.plan.native_cpu
    shape_only = [k for k, w in enumerate(plan.when) if w and all("r" in c for c in w)]
    data = [k for k, w in enumerate(plan.when) if any("ptr" in c for c in w)]
    assert shape_only and data, plan.when
    loaded = bladepack.load(art.to_bytes())
    ex = loaded._executor
    total = len(plan.launches)
    for n, dropped in ((3, len(data) + sum(1 for k in shape_only if plan.when[k][0]["is"])), (6, None)):
        prep = ex.prepare(((n, 8),))
        segs = prep.native.segments
        ran = sum(_launches(s.words) if s.words is not None else 1 for s in segs)
        if dropped is not None:  # batch 3: the large branch (and the data cond inside it) is gone
            assert ran == total - dropped and all(not s.when for s in segs), (n, ran, total)
        else:  # batch 6: the small branch is gone; the two data sides are separate segments
            assert ran < total and {tuple(c[2] for c in s.when) for s in segs if s.when} == {(True,), (False,)}


def test_cpp_runtime_matches_python_loader(branchy: tuple[nn.Module, Any], tmp_path: Path) -> None:
    from tests import cpp_build
    from tests.test_cpp_runtime import run_both

    release = cpp_build.build("release")
    _, art = branchy
    path = tmp_path / "branchy.bpk"
    art.save(path)
    for k, x in enumerate(_cases()):
        got, want = run_both(release, path, [x], f"branchy{k}")
        for o, w in zip(got, want):
            assert np.array_equal(o, w), f"C++ and Python differ at {x.shape}, sum {x.sum()}"


@pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("NVCC"), reason="nvcc not found (CUDA targets need it)"
)
def test_fake_gpu_runs_the_taken_branch(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The CUDA plan on the fake driver: outputs match eager on both sides; the data predicate is read
    back (a host read) and the untaken side's kernels are never launched."""
    from tests.cuda_harness import FakeGpu

    gpu = FakeGpu(tmp_path_factory.mktemp("fake_gpu_branches"))
    torch.manual_seed(0)
    model = _Branchy().eval()
    art = bladepack.optimize(
        model, [(torch.randn(3, 8),), (torch.randn(6, 8),)], ({0: BATCH},), targets=("cpu", "cuda:sm_90")
    )
    names = {k.name for k in art.plan.kernels if k.target == "cuda"}
    per_case = []
    for x in [np.full((6, 8), 0.5, np.float32), np.full((6, 8), -0.5, np.float32), np.full((3, 8), 0.5, np.float32)]:
        executor, results, log = gpu.run(art, [(x,)])
        assert "cuda" in executor, executor
        for o, w in zip(results[0], _eager(model, x)):
            np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6)
        per_case.append({n for n in names if f"launch {n}" in log or f"launch {n}_" in log})
    assert per_case[0] != per_case[1] and per_case[0] != per_case[2], per_case
    # the C++ runtime's CUDA path: the same results; a data predicate keeps the plan off CUDA graphs
    # (Note [CUDA graphs]) when the shape condition lets it through (batch > 4), never otherwise
    cases = [(x,) for x in (np.full((6, 8), 0.5, np.float32), np.full((6, 8), -0.5, np.float32))]
    _, py, _ = gpu.run(art, cases)
    try:
        _, cpp, log = gpu.run_cpp(art, cases)
    except BuildError as e:
        pytest.skip(f"cpp_runtime does not build here: {e}")
    assert all(np.array_equal(a, b) for want, got in zip(py, cpp) for a, b in zip(want, got))
    assert "capture_begin" not in log and "graph_launch" not in log
    from bladepack.inspect import inspect_text, manifest_summary

    text = inspect_text(manifest_summary(art._parts()[0]))
    assert re.search(
        r"cuda graphs: some \(a signature that runs launch \d+ \(a run-time branch read on the host\)", text
    )
    _, _, log = gpu.run_cpp(art, [(np.full((3, 8), 0.5, np.float32),)])
    assert log.count("graph_launch") == 2  # the small side has no data predicate
    _, again, log = gpu.run(art, cases, calls=3)  # the Python loader decides the same
    assert all(np.array_equal(a, b) for want, got in zip(py, again) for a, b in zip(want, got))
    assert "capture_begin" not in log and "graph_launch" not in log


def _graph_with_branch(reader_outside: bool) -> Any:
    b = GraphBuilder()
    f32 = TensorType(DType.FLOAT32, (4,))
    x = b.add_input("x", f32)
    p = b.add(OpKind.LOGICAL_NOT, (b.add_input("flag", TensorType(DType.BOOL, ())),), TensorType(DType.BOOL, ()))
    b.guard = (Guard(p, True),)
    t = b.add(OpKind.SIN, (x,), f32)
    b.guard = (Guard(p, False),)
    e = b.add(OpKind.COS, (x,), f32)
    b.guard = ()
    y = b.add(OpKind.WHERE, (p, t, e), f32)
    outs = (y, b.add(OpKind.EXP, (t,), f32)) if reader_outside else (y,)
    return b.finish(outs, tuple(f"y{k}" for k in range(len(outs)))), (p, t, e)


def test_effective_guards() -> None:
    """The merge shares its condition with the operand it selects; a reader outside the branch (a pass
    may have moved one there) drops the guard, so the value is always computed."""
    g, (p, t, e) = _graph_with_branch(reader_outside=False)
    eff = effective_guards(g)
    assert eff[t] == (Guard(p, True),) and eff[e] == (Guard(p, False),)
    g, (p, t, e) = _graph_with_branch(reader_outside=True)
    eff = effective_guards(g)
    assert eff[t] == () and eff[e] == (Guard(p, False),)


def test_guards_in_ir_text() -> None:
    g, _ = _graph_with_branch(reader_outside=False)
    assert print_graph(g) == (
        "graph(%0 x: f32[4], %1 flag: bool[]) {\n"
        "  %2: bool[] = logical_not(%1)\n"
        "  %3: f32[4] = sin(%0) if %2\n"
        "  %4: f32[4] = cos(%0) if not %2\n"
        "  %5: f32[4] = where(%2, %3, %4)\n"
        "  return %5\n"
        "}\n"
    )


def test_corrupt_conditions_are_refused(branchy: tuple[nn.Module, Any]) -> None:
    _, art = branchy

    def bad_register(m: dict[str, Any]) -> None:
        lr = next(lr for lr in m["native_cpu"]["launches"] if "when" in lr)
        lr["when"] = [{"r": 10**6, "is": True}]

    def bad_slot(m: dict[str, Any]) -> None:
        lr = next(lr for lr in m["native_cpu"]["launches"] if "when" in lr)
        lr["when"] = [{"ptr": [999, 0], "is": True}]

    def bad_step(m: dict[str, Any]) -> None:
        st = next(st for st in m["plan"]["steps"] if "when" in st)
        st["when"] = [{"v": st["out"], "is": True}]  # its own value: not computed before it

    for edit, what in (
        (bad_register, "register"),
        (bad_slot, "slot"),
        (bad_step, "not a boolean value computed before"),
    ):
        with pytest.raises(BpkFormatError, match=what):
            bladepack.load(with_manifest(art, edit))


def test_cpp_runtime_refuses_corrupt_conditions(branchy: tuple[nn.Module, Any], tmp_path: Path) -> None:
    from tests import cpp_build
    from tests.test_cpp_runtime import bpk_run

    release = cpp_build.build("release")
    _, art = branchy

    def bad_register(m: dict[str, Any]) -> None:
        next(lr for lr in m["native_cpu"]["launches"] if "when" in lr)["when"] = [{"r": 10**6, "is": True}]

    def bad_slot(m: dict[str, Any]) -> None:
        next(lr for lr in m["native_cpu"]["launches"] if "when" in lr)["when"] = [{"ptr": [999, 0], "is": True}]

    x = tmp_path / "x.npy"
    np.save(x, np.ones((6, 8), np.float32))
    for edit, what in ((bad_register, "register 1000000 out of range"), (bad_slot, "reads slot 999")):
        path = tmp_path / f"{edit.__name__}.bpk"
        path.write_bytes(with_manifest(art, edit))
        r = bpk_run(release, str(path), "--input", f"x={x}")
        assert r.returncode != 0 and what in r.stderr, r.stderr


def test_inspect_lists_branches(branchy: tuple[nn.Module, Any]) -> None:
    from bladepack.inspect import inspect_text, manifest_summary

    _, art = branchy
    text = inspect_text(manifest_summary(art._parts()[0]))
    assert "run-time branches: 2\n" in text, text
    assert re.search(
        r"shape predicate \(register \d+; from test_branches.py:\d+ .*\): steps \d+ if true / \d+ if false; cpu launches [1-9]\d* / [1-9]",
        text,
    ), text
    assert re.search(r"data predicate \(%\d+ gt, read on the host; .*cpu launches [1-9]\d* / [1-9]", text), text


def test_mutated_branch_manifests_never_crash_a_loader(branchy: tuple[nn.Module, Any], tmp_path: Path) -> None:
    """The structural fuzzer (tests/test_fuzz.py) on an artifact with shape and data conditions: every
    mutated `when` runs or is refused with a bladepack error, in both loaders."""
    from scripts import mutation_campaign
    from tests import cpp_build

    _, art = branchy
    build = cpp_build.build("release")
    inputs = [np.linspace(-1, 1, 6 * 8, dtype=np.float32).reshape(6, 8)]
    cases = mutation_campaign.make_cases(art.to_bytes(), inputs, 40, 1, tmp_path)
    results = mutation_campaign.run_cases(cases, str(build / "bpk-run"), 2, tmp_path)
    bad = [r for r in results if r[1] in ("stray", "crash", "hang")]
    assert not bad, mutation_campaign.report(results)


def test_cpp_runtime_runs_unrolled_loops(tmp_path: Path) -> None:
    """ONNX Loops unrolled under chains of conditions (Note [Unrolled loops]): a symbolic trip count
    (shape conditions only) and a while loop (a data condition per iteration) give the Python loader's
    outputs bit for bit in the C++ runtime."""
    import onnx
    from onnx import helper, numpy_helper

    from tests import cpp_build
    from tests.test_cpp_runtime import run_both
    from tests.test_onnx import _loop_body, _loop_model

    release = cpp_build.build("release")
    cond = [
        helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0),
        helper.make_node("Constant", [], ["limit"], value=numpy_helper.from_array(np.array(2.0, np.float32))),
        helper.make_node("Less", ["total", "limit"], ["cond_out"]),
    ]
    for tag, body in (("for", _loop_body()), ("while", _loop_body(cond))):
        model: onnx.ModelProto = _loop_model("shape", body)
        path = tmp_path / f"{tag}.bpk"
        bladepack.optimize(model, dynamic_shapes={"x": {0: bladepack.Dim("n", 1, 8)}}).save(path)
        for n in (1, 3, 8):
            for scale in (0.1, 3.0):
                x = (np.random.default_rng(n).standard_normal((n, 4)) * scale).astype(np.float32)
                got, want = run_both(release, path, [x], f"{tag}{n}{scale}")
                for o, w in zip(got, want):
                    assert np.array_equal(o, w), (tag, n, scale)


def test_pruned_keeps_the_strongest_trip_condition() -> None:
    """An unrolled iteration's conditions "n > 0", "n > 1", "n > 2" (chained) encode as "n > 2" alone;
    data conditions and other shape conditions stay, in order; a front end's shape assumption under the
    guard holds only where it does."""
    import sympy

    from bladepack.ir.guards import pruned, under_guard
    from bladepack.ir.ops import ConstantAttrs

    n = sympy.Symbol("n", integer=True, positive=True)
    b = GraphBuilder()
    b.add_input("x", TensorType(DType.FLOAT32, (n,)))
    flag = b.add_input("flag", TensorType(DType.BOOL, ()))
    preds = [b.add(OpKind.FULL, (), TensorType(DType.BOOL, ()), ConstantAttrs(sympy.Gt(n, i))) for i in (1, 2, 3)]
    even = b.add(OpKind.FULL, (), TensorType(DType.BOOL, ()), ConstantAttrs(sympy.Eq(n % 2, 0)))
    guard = (Guard(preds[0], True), Guard(flag, True), Guard(preds[1], True), Guard(even, True), Guard(preds[2], True))
    nodes = {nd.id: nd for nd in b.nodes}
    assert pruned(nodes, guard) == (Guard(flag, True), Guard(even, True), Guard(preds[2], True))
    assert pruned(nodes, guard[:2]) == guard[:2]
    b.guard = guard
    cond = under_guard(b, sympy.Ge(n, 7))
    assert cond.subs(n, 2) and cond.subs(n, 5) and not cond.subs(n, 4) and cond.subs(n, 8), cond


def test_cond_through_the_dynamo_onnx_exporter() -> None:
    """torch.cond exported by torch's dynamo ONNX exporter is an If on `Shape > 4` (the shape comparison
    a shape predicate) with a nested If on data: the same run-time branches from the ONNX front end."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    model = _Branchy().eval()
    exported = torch.onnx.export(
        model, (torch.randn(6, 8),), dynamo=True, dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},)
    )
    assert exported is not None
    art = bladepack.optimize(exported.model_proto)
    conds = [c for st in art.plan.steps for c in st.when]
    assert any("r" in c for c in conds) and any("v" in c for c in conds), conds
    loaded = bladepack.load(art.to_bytes())
    for x in _cases():
        for o, w in zip(loaded(x), _eager(model, x)):
            np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-6, err_msg=f"at {x.shape}, sum {x.sum()}")


def _words_by_record(plan: dict[str, Any], kernels: list[dict[str, Any]], regs: tuple[int, ...]) -> list[Any]:
    """The prepared launch list written out record by record (Note [Launch words] in cpu_runtime.h):
    per segment its words (None for a reference step), first launch and data conditions."""

    def word(v: Any) -> int:
        return int(regs[v["r"]]) if isinstance(v, dict) else int(v)

    out: list[Any] = []
    run: list[int] = []
    first, cur = 0, ()
    for k, lr in enumerate(plan["launches"]):
        when = lr.get("when", ())
        hold = all(bool(regs[c["r"]]) == c["is"] for c in when if "r" in c)
        data = tuple((c["ptr"][0], word(c["ptr"][1]), c["is"]) for c in when if "ptr" in c)
        if not hold or lr["op"] == "ref" or data != cur:
            if run:
                out.append((run, first, cur))
            run, first, cur = [], k + (not hold or lr["op"] == "ref"), data
        if not hold:
            continue
        if lr["op"] == "ref":
            out.append((None, k, data))
            continue
        if lr["op"] == "kernel":
            head = [OP_KERNEL, next(v["fn"] for v in kernels[lr["k"]]["variants"] if regs[v["pred"]])]
        else:
            head = [2, {"float32": 0, "float64": 1}[lr["dtype"]]]
        run += [*head, len(lr["ptrs"]), len(lr["ints"])]
        for slot, off in lr["ptrs"]:
            run += [slot, word(off)]
        run += [word(v) for v in lr["ints"]]
    if run or not out:
        out.append((run, first, cur))
    return out


class _Gather(nn.Module):
    """Advanced indexing on two non-adjacent axes: a reference step between native launches."""

    def forward(self, x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return (x.exp()[:, i, :, j] * 2).sum(-1)


def test_the_launch_template_gives_each_records_words(branchy: tuple[nn.Module, Any]) -> None:
    """Note [Launch word template]: the segments a new signature gets from the template are those of
    resolving every launch record on its own — across shape-dropped launches, data conditions, kernel
    variants and reference steps — and a native plan's first call at a shape resolves only the
    reference steps it runs."""
    _, art = branchy
    b, n = bladepack.Dim("b", 1, 8), bladepack.Dim("n", 1, 16)
    x, idx = torch.randn(2, 5, 3, 7), torch.tensor([0, 2, 4])
    gather = bladepack.optimize(
        _Gather(), [(x, idx, idx), (torch.randn(3, 6, 3, 9), idx[:2], idx[:2])], ({0: b, 3: n}, None, None)
    )
    cases = {"branchy": (art, [((n, 8),) for n in SIZES]), "gather": (gather, [((1, 5, 3, 4), (3,), (3,))])}
    cases["gather"][1].append(((8, 5, 3, 16), (3,), (3,)))
    for name, (a, keys) in cases.items():
        loaded = bladepack.load(a.to_bytes())
        ex = loaded._executor
        plan, kernels = ex.m.native["cpu"], ex.m.kernels["cpu"]
        refs = [lr["node"] for lr in plan["launches"] if lr["op"] == "ref"]
        assert (name == "gather") == bool(refs), refs
        for key in keys:
            prep = ex.prepare(key)
            got = [
                (None if s.words is None else s.words.tolist(), s.first_launch, s.when) for s in prep.native.segments
            ]
            assert got == _words_by_record(plan, kernels, prep.ref.registers), (name, key)
            assert sorted(st.out for st in prep.ref.steps) == sorted(refs), (name, key)
    xs = (torch.randn(3, 5, 3, 11), torch.tensor([4, 0, 1]), torch.tensor([6, 6, 10]))
    np.testing.assert_allclose(bladepack.load(gather.to_bytes())(*xs), _Gather()(*xs).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("NVCC"), reason="nvcc not found (CUDA targets need it)"
)
def test_cuda_kernel_parameters_from_the_template() -> None:
    """Note [Launch word template] on CUDA: at each signature, the kernel launches' parameter words and
    pointer (position, slot, offset) arrays from the template are those of resolving each kept launch's
    record on its own — the status word, then the pointers (zero), then the integers as 64-bit words —
    with shape-dropped launches cut out."""
    from bladepack.loader.launch_words import KernelParams
    from bladepack.loader.manifest import Manifest, conditions_hold

    torch.manual_seed(0)
    art = bladepack.optimize(
        _Branchy().eval(), [(torch.randn(3, 8),), (torch.randn(6, 8),)], ({0: BATCH},), targets=("cpu", "cuda:sm_90")
    )
    from bladepack.artifact import format as bpk_format

    m = Manifest.read(bpk_format.read(art.to_bytes()))
    plan = m.native["cuda"]
    assert plan is not None
    status = 99
    params = KernelParams(plan["launches"], status)
    dropped_somewhere = False
    for n in SIZES:
        regs = m.registers(((n, 8),))
        kept = [
            k
            for k, lr in enumerate(plan["launches"])
            if lr["op"] == "kernel" and conditions_hold(lr.get("when", ()), regs) is not False
        ]
        dropped_somewhere |= len(kept) < len(params.ranges)
        words: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        offs: list[int] = []
        for k in kept:
            lr = plan["launches"][k]
            for slot, off in ((status, 0), *lr["ptrs"]):
                pos.append(len(words))
                slots.append(slot)
                offs.append(int(regs[off["r"]]) if isinstance(off, dict) else off)
                words.append(0)
            words += [(int(regs[v["r"]]) if isinstance(v, dict) else v) & 0xFFFFFFFFFFFFFFFF for v in lr["ints"]]
        got = params.kept(params.at(regs), kept) if len(kept) < len(params.ranges) else params.at(regs)
        assert [a.tolist() for a in got] == [words, pos, slots, offs], n
        assert got[0].dtype == np.uint64 and got[3].dtype == np.uint64
    assert dropped_somewhere
