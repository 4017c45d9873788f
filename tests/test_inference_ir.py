"""Note [Training IR as it is] (export/inference_ir.py): a program whose ops are functional and kept by
torch's retrace, or training forms the converters take, is converted as exported; the IR is the same
as after the retrace, and anything else still gets the retrace."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from torch import nn

from bladepack.export import inference_ir
from bladepack.export.capture import capture
from bladepack.export.from_torch import to_program
from bladepack.ir.printer import print_graph


class _TrainingForms(nn.Module):
    """Each training form of `_TRAINING_FORMS` the retrace rewrites, beside kept composites."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(8, 6)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 1.5)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.drop(torch.relu(self.bn(self.conv(x))))  # batch_norm, dropout (eval)
        y = nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)  # flatten
        z = self.fc(y.reshape(y.shape[0], -1).contiguous())  # reshape, contiguous
        scale = torch.tensor([0.5, 2.0, 1.0, 1.0, 3.0, 0.25])  # lift_fresh_copy
        w = z.to(torch.float64).to(torch.float32) * scale  # to.dtype
        return torch.softmax(w, -1), (w @ w.T).to(x.device)  # numpy_T, to.device


def _ir(model: nn.Module, samples: list[tuple[torch.Tensor, ...]], retrace: bool, mp: pytest.MonkeyPatch) -> str:
    """The converted program as text: graph, weights, and source locations without the op's name."""
    with mp.context() as m:
        if retrace:
            m.setattr(inference_ir, "retrace_reason", lambda ep: "forced")
        prog = to_program(capture(model, samples))
    weights = sorted((k, v.dtype.str, v.shape, v.tobytes()) for k, v in prog.weight_data.items())
    locs = [re.sub(r" \[[^\]]*\]$", "", n.loc or "") for n in prog.graph.nodes]
    return f"{print_graph(prog.graph, prog.shape_env)}\n{weights!r}\n{locs!r}"


def _exported(model: nn.Module, *args: Any) -> torch.export.ExportedProgram:
    with torch.no_grad():
        return torch.export.export(model.eval(), args, strict=False)


def test_training_forms_convert_as_the_retrace_does(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _TrainingForms().eval()
    samples = [(torch.randn(2, 3, 8, 8),), (torch.randn(3, 3, 10, 6),)]
    ep = _exported(model, *samples[0])
    names = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    for form in ("batch_norm", "dropout", "flatten", "reshape", "lift_fresh_copy", "detach_", "numpy_T", "to."):
        assert any(f"aten.{form}" in n for n in names), (form, sorted(names))
    assert inference_ir.retrace_reason(ep) is None
    assert _ir(model, samples, False, monkeypatch) == _ir(model, samples, True, monkeypatch)


def test_a_zoo_encoder_converts_as_the_retrace_does(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("transformers")
    from samples.zoo import ZOO

    z = ZOO["bert"]
    g = torch.Generator().manual_seed(0)
    model, samples = z.build(), [z.make(g, s) for s in z.samples]
    with monkeypatch.context() as m:
        m.setattr(inference_ir, "retrace_reason", lambda ep: None)
        fast = to_program(capture(model, samples, z.dynamic_shapes()))
    with monkeypatch.context() as m:
        m.setattr(inference_ir, "retrace_reason", lambda ep: "forced")
        slow = to_program(capture(model, samples, z.dynamic_shapes()))
    assert print_graph(fast.graph, fast.shape_env) == print_graph(slow.graph, slow.shape_env)
    assert sorted(fast.weight_data) == sorted(slow.weight_data)


class _FreshInPlace(nn.Module):
    """Note [Fresh in-place ops]: writes to tensors nothing else reads."""

    def forward(self, x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y += x.flip(0)
        y.relu_().masked_fill_(m, -1.0)
        z = y @ y.transpose(0, 1)
        z.mul_(0.5)
        return torch.softmax(z, -1)


def test_fresh_in_place_ops_convert_as_the_retrace_does(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _FreshInPlace()
    samples = [(torch.randn(4, 6), torch.rand(4, 6) > 0.5), (torch.randn(5, 3), torch.rand(5, 3) > 0.5)]
    ep = _exported(model, *samples[0])
    assert sum(getattr(n.target, "__name__", "").split(".")[0].endswith("_") for n in ep.graph.nodes) == 4
    assert inference_ir.functional_in_place(ep.graph)
    assert inference_ir.retrace_reason(ep) is None
    assert _ir(model, samples, False, monkeypatch) == _ir(model, samples, True, monkeypatch)


class _InPlace(nn.Module):
    """A write through a view of a fresh tensor, read through the tensor: not a fresh in-place op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[0].add_(1)
        return y


class _Buffer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count.add_(1)
        return x + self.count


class _TrainDropout(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(x, 0.5, training=True)


class _Einsum(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.einsum("ij,kj->ik", x, x)


class _AliasingComposite(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=1)
        return a.view_as(b) + b


class _Cond(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda t: t + 1, lambda t: t - 1, (x,))


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (_InPlace(), "aten.add_.Tensor mutates"),
        (_Buffer(), "mutates"),
        (_TrainDropout(), "aten.dropout.default with train=True"),
        (_Einsum(), "aten.einsum.default is decomposed"),
        (_AliasingComposite(), "aten.chunk.default is a composite the retrace decomposes"),
        (_Cond(), "get_attr true_graph_0"),
    ],
    ids=["in-place", "buffer", "train-dropout", "einsum", "aliasing-composite", "cond"],
)
def test_what_needs_the_retrace_gets_it(model: nn.Module, reason: str) -> None:
    ep = _exported(model, torch.randn(4, 6))
    inference_ir.functional_in_place(ep.graph)
    got = inference_ir.retrace_reason(ep)
    assert got is not None and reason in got, got
    out = inference_ir.inference_program(ep)
    assert out is not ep  # the retrace's program


def test_kept_composites_are_torchs() -> None:
    """The composites the Note keeps are those torch's retrace keeps, op for op (where this torch
    exposes its own rule)."""
    utils = pytest.importorskip("torch._export.utils")
    collect = getattr(utils, "_collect_all_valid_cia_ops_for_aten_namespace", None)
    is_cia = getattr(utils, "_is_cia_op", None)
    if collect is None or is_cia is None:
        pytest.skip("this torch does not expose its rule for kept composites")
    kept = collect()
    seen, differ = 0, []
    for name in dir(torch.ops.aten):
        packet = getattr(torch.ops.aten, name, None)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            continue
        for overload in packet.overloads():  # names: torch 2.11's packets have no op_overloads()
            try:
                op = getattr(packet, overload)
                if not is_cia(op):
                    continue
            except (RuntimeError, AttributeError):  # an overload the dispatcher does not hold
                continue
            seen += 1
            if inference_ir._kept_composite(op) != (op in kept):
                differ.append(str(op))
    assert seen > 400 and not differ, differ


class _Movedim(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x.movedim(2, 0)) * 2


def test_a_refused_training_form_is_converted_after_the_retrace(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torch whose retrace decomposes a composite the rule keeps: conversion of the program as
    exported fails, and the retrace's program converts (movedim, which no converter takes, stands in)."""
    model = _Movedim()
    samples = [(torch.randn(2, 3, 4),), (torch.randn(3, 5, 4),)]
    slow = _ir(model, samples, True, monkeypatch)
    monkeypatch.setitem(inference_ir._TRAINING_FORMS, "aten.movedim.int", None)
    cap = capture(model, samples)
    assert cap.as_exported and any(str(n.target) == "aten.movedim.int" for n in cap.program.graph.nodes)
    assert _ir(model, samples, False, monkeypatch) == slow
