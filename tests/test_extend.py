"""Extending an artifact without the model (Note [Extending an artifact] in bladepack/extend.py): the
program round-trips exactly; extend with the same settings gives the same bytes as a fresh optimize;
a CUDA target added to a CPU-only artifact verifies on the fake GPU; a narrowed range stays exact; a
range past the model's own bound, or one that breaks a fact the front end relied on, is refused with
the reason; extend runs without torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from torch import nn

import bladepack
from bladepack.artifact.format import read
from bladepack.export import capture, to_program
from bladepack.extend import ExtendError, extend, parse_range
from bladepack.inspect import inspect_text, manifest_summary
from bladepack.ir import print_graph
from bladepack.ir.serialize import decode_program, encode_program
from samples.registry import SAMPLES
from samples.zoo import ZOO
from tests.cuda_harness import FakeGpu, needs_nvcc
from tests.helpers import as_tuple, reachable_items

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_programs_round_trip(name: str) -> None:
    s = SAMPLES[name]
    p = to_program(capture(s.build(), s.export_samples(), s.dynamic_shapes))
    data, weights = encode_program(p)
    back, facts = decode_program(msgpack.unpackb(msgpack.packb(data), strict_map_key=False), weights)
    assert back.graph == p.graph and back.assertions == p.assertions and back.limits == p.limits
    assert print_graph(back.graph, back.shape_env) == print_graph(p.graph, p.shape_env)
    assert tuple(facts) == p.shape_env.facts


def test_zoo_programs_round_trip() -> None:
    """Models with conds, masks, rotary tables and convolutions (a spread of the zoo)."""
    for name in ("distilbert", "qwen2", "mobilenet"):
        z = ZOO[name]
        g = torch.Generator().manual_seed(1)
        p = to_program(capture(z.build().eval(), [z.make(g, s) for s in z.samples], z.dynamic_shapes()))
        data, weights = encode_program(p)
        back, _ = decode_program(msgpack.unpackb(msgpack.packb(data), strict_map_key=False), weights)
        assert back.graph == p.graph, name


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_extend_with_the_same_settings_gives_the_same_bytes(name: str) -> None:
    s = SAMPLES[name]
    art = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes)
    assert extend(art.to_bytes()).to_bytes() == art.to_bytes()


@needs_nvcc
def test_adding_a_cuda_target(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A CPU-only encoder extended with sm_80 kernels is the artifact a fresh optimize with both targets
    gives (byte for byte, reference cases off), and with reference cases it verifies on the fake GPU,
    the new CUDA variants covered by the cases extend added."""
    s = SAMPLES["encoder"]
    model, samples = s.build(), s.export_samples()
    targets = ("cpu", "cuda:sm_80")
    cpu_only = bladepack.optimize(model, samples, s.dynamic_shapes, reference_cases=False)
    fresh = bladepack.optimize(model, samples, s.dynamic_shapes, targets=targets, reference_cases=False)
    assert extend(cpu_only.to_bytes(), targets).to_bytes() == fresh.to_bytes()

    art = extend(bladepack.optimize(model, samples, s.dynamic_shapes).to_bytes(), targets)
    record, _ = art.reference_cases  # type: ignore[misc]
    items = {i for c in record["cases"] for i in c["covers"]}
    reachable = reachable_items(art._parts()[0])
    assert any(i.startswith("cuda ") for i in items) and reachable <= items, sorted(reachable - items)
    # what stays uncovered no shape reaches (the block-per-row softmax wants rows longer than seq's 512)
    assert all(u["why"] == "no probed shape reaches it" for u in record["uncovered"]), record["uncovered"]
    assert not {u["item"] for u in record["uncovered"]} & reachable
    added = [c for c in record["cases"] if c.get("oracle") == "bladepack reference executor"]
    assert record["oracle"] == "torch eager" and len(added) < len(record["cases"])
    text = inspect_text(manifest_summary(read(art.to_bytes()).manifest))
    kept = len(record["cases"]) - len(added)
    if added:  # inspect names each oracle with its cases
        assert (
            f"oracles torch eager ({kept} case" in text and f"bladepack reference executor ({len(added)} case" in text
        )
    else:
        assert "), oracle torch eager; " in text, text
    gpu = FakeGpu(tmp_path_factory.mktemp("fake_gpu_extend"))
    executor, report, log = gpu.verify(art, cc="80")
    assert executor.startswith("cuda") and report["passed"] is True, report
    assert "\nlaunch " in log  # the kernels ran on the (fake) device


def test_narrowing_a_range_stays_exact() -> None:
    s = SAMPLES["encoder"]
    model = s.build().eval()
    art = bladepack.optimize(model, s.export_samples(), s.dynamic_shapes)
    narrow = extend(art.to_bytes(), ranges={"seq": (3, 40), "batch": (1, 6)})
    m = bladepack.load(narrow.to_bytes())
    assert "batch in [1, 6]; seq in [3, 40]" in str(m.signature)
    g = torch.Generator().manual_seed(4)
    for b, t in ((1, 3), (5, 17), (6, 40)):
        args = s.make_inputs(g, batch=b, seq=t)
        with torch.no_grad():
            want = as_tuple(model(*args))
        for got, w in zip(as_tuple(m(*args)), want):
            assert torch.allclose(got, w, rtol=1e-4, atol=1e-5)
    with pytest.raises(bladepack.errors.ShapeGuardError, match="allowed range"):
        m(*s.make_inputs(g, batch=2, seq=41))
    assert m.verify()["passed"] is True


def test_widening_past_the_models_bound_is_refused() -> None:
    s = SAMPLES["encoder"]
    data = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes, reference_cases=False).to_bytes()
    with pytest.raises(ExtendError, match=r"seq: the model itself bounds seq at 512 .* \[1, 512\]") as e:
        extend(data, ranges={"seq": (1, 2048), "heads": (1, 2)})
    assert "'heads' is no dynamic dim of the model; its dims are batch, seq" in str(e.value)
    with pytest.raises(ExtendError, match=r"\[0, 9\] is not a range of sizes"):
        extend(data, ranges={"batch": (0, 9)})


def test_widening_an_unbounded_model_keeps_outputs_exact() -> None:
    """An MLP declared for batch [1, 8] is valid for any batch: extend widens it to [1, 1024]."""
    s = SAMPLES["mlp"]
    model = s.build().eval()
    art = bladepack.optimize(model, s.export_samples(), ({0: bladepack.Dim("batch", 1, 8)},))
    wide = bladepack.load(extend(art.to_bytes(), ranges={"batch": (1, 1024)}).to_bytes())
    x = torch.randn(1000, 64)
    with torch.no_grad():
        assert torch.allclose(wide(x), model(x), rtol=1e-4, atol=1e-5)
    assert wide.verify()["passed"] is True


def test_widening_that_breaks_a_range_fact_is_refused() -> None:
    """torch.cond on `x.shape[0] < 10` with batch declared [1, 8]: the import inlined the true branch,
    relying on batch <= 9 (a range fact). Widening batch to 16 would run that branch at batch 12: refused,
    naming the fact; narrowing is fine. With batch declared from 5 and `x.shape[0] > 4`, widening the
    minimum is refused by the export's own limit."""

    class Below10(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.shape[0] < 10, lambda t: t.sin(), lambda t: t.cos(), (x,))

    art = bladepack.optimize(Below10(), [(torch.randn(3, 3),), (torch.randn(5, 3),)], ({0: bladepack.Dim("b", 1, 8)},))
    with pytest.raises(ExtendError, match=r"relying on facts the new ranges break \(b in \[1, 16\]\)") as e:
        extend(art.to_bytes(), ranges={"b": (1, 16)})
    assert "was answered 'yes' over the old ranges" in str(e.value), str(e.value)
    narrow = bladepack.load(extend(art.to_bytes(), ranges={"b": (2, 6)}).to_bytes())
    x = torch.randn(6, 3)
    assert torch.allclose(narrow(x), x.sin())

    class Above4(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cond(x.shape[0] > 4, lambda t: t.sin(), lambda t: t.cos(), (x,))

    art = bladepack.optimize(Above4(), [(torch.randn(6, 3),), (torch.randn(7, 3),)], ({0: bladepack.Dim("b", 5, 16)},))
    with pytest.raises(ExtendError, match=r"b: the model was traced for b >= 5 only"):
        extend(art.to_bytes(), ranges={"b": (1, 16)})
    wide = bladepack.load(extend(art.to_bytes(), ranges={"b": (5, 64)}).to_bytes())
    x = torch.randn(40, 3)
    assert torch.allclose(wide(x), x.sin())


def test_parse_range_and_artifacts_without_a_program() -> None:
    assert parse_range("seq=1:2048") == ("seq", (1, 2048))
    assert parse_range("batch=2:") == ("batch", (2, None))
    with pytest.raises(ExtendError, match="a range reads NAME=MIN:MAX"):
        parse_range("seq=1-2")
    s = SAMPLES["mlp"]
    art = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes, reference_cases=False)
    program = art.source_program
    art.source_program = None
    with pytest.raises(ExtendError, match="does not hold its program"):
        extend(art.to_bytes())
    assert program is not None
    data, weights, meta = program
    for broken in ({**data, "nodes": [[1, "no such op"]]}, {**data, "symbols": 3}, {**data, "schema": 99}):
        art.source_program = (broken, weights, meta)
        with pytest.raises(ExtendError, match="malformed source_program"):
            extend(art.to_bytes())


def test_cli_extend_runs_without_torch(tmp_path: Path) -> None:
    s = SAMPLES["mlp"]
    src = tmp_path / "mlp.bpk"
    bladepack.optimize(s.build(), s.export_samples(), ({0: bladepack.Dim("batch", 1, 8)},)).save(src)
    out = tmp_path / "wide.bpk"
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['onnx'] = None\n"
        "from bladepack.cli import main\n"
        f"sys.exit(main(['extend', {str(src)!r}, '-o', {str(out)!r}, '--range', 'batch=1:64']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "batch in [1, 64]" in r.stdout and f"wrote {out}" in r.stdout
    m = bladepack.load(out)
    x = np.random.default_rng(0).standard_normal((50, 64)).astype(np.float32)
    assert m(x).shape == (50, 10) and m.verify()["passed"] is True


def test_inspect_counts_the_cases_of_each_oracle() -> None:
    """After extend, carried cases keep the record's oracle and new ones name their own: inspect counts each."""
    from bladepack.inspect import _reference_cases

    record = {
        "oracle": "torch eager",
        "budget": 1,
        "uncovered": [],
        "cases": [
            {"dims": {"b": 1}, "covers": ["k0"]},
            {"dims": {"b": 2}, "covers": ["k0"]},
            {"dims": {"b": 9}, "covers": ["k1"], "oracle": "bladepack reference executor"},
        ],
    }
    rc = _reference_cases({"reference_cases": record})
    assert rc is not None and rc["oracles"] == {"torch eager": 2, "bladepack reference executor": 1}


class _Packed(nn.Module):
    """A weight in each packed form a kernel reads: a small linear layer ("dense"), one over 512 KB
    (one "panels" copy), one whose K is split (two "panels" pieces), a small convolution ("ihwo") and
    a wide one ("tap_panels")."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Linear(64, 48)
        self.wide = nn.Linear(48, 4608)
        self.deep = nn.Linear(4608, 96)
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.big = nn.Conv2d(16, 80, 3, padding=1)

    def forward(self, x: torch.Tensor, img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.deep(torch.relu(self.wide(torch.relu(self.small(x))))), self.big(torch.relu(self.conv(img)))


@pytest.mark.parametrize("dense_layers", [True, False])
def test_source_weights_are_the_plans_packed_copies(dense_layers: bool) -> None:
    """Note [Derived source weights] (artifact/writer.py): no weight is stored a second time as the front
    end had it when the plan holds a packed copy ("dense", "panels" in pieces, "kn" with dense layers
    off, "ihwo", "tap_panels"); `extend` unpacks them and rebuilds the artifact byte for byte."""
    from bladepack.options import CompileOptions

    torch.manual_seed(0)
    model = _Packed().eval()
    samples = [(torch.randn(3, 64), torch.randn(1, 3, 6, 5)), (torch.randn(5, 64), torch.randn(2, 3, 7, 9))]
    options = CompileOptions.from_env(dense_layers=dense_layers)
    art = bladepack.optimize(model, samples, options=options)
    rows = read(art.to_bytes()).manifest["source_program"]["weights"]
    layouts = {name: (row.get("layout"), len(row.get("packed", ()))) for name, row in rows.items()}
    want_linear = (
        {"small.weight": ("dense", 1), "wide.weight": ("panels", 1), "deep.weight": ("panels", 2)}
        if dense_layers
        else {"small.weight": ("kn", 1), "wide.weight": ("kn", 1), "deep.weight": ("kn", 1)}
    )
    assert {k: layouts[k] for k in want_linear} == want_linear, layouts
    assert layouts["conv.weight"] == ("ihwo", 1) and layouts["big.weight"] == ("tap_panels", 1), layouts
    assert not [r for r in rows.values() if r.get("section", "").startswith("program/")], rows
    assert extend(art.to_bytes(), options=options).to_bytes() == art.to_bytes()
