"""Backends as plug-ins (bladepack/backends): the registry, capabilities read instead of names, the
one-time `can_emit` decision, and an emission failure said as an internal error naming the kernel."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from bladepack.backends import REGISTRY, backend, backends_for
from bladepack.backends.cpu import CpuBackend
from bladepack.errors import CompileError
from bladepack.export import capture, to_program
from bladepack.ir import OpKind, Program
from bladepack.lowering.build_plan import build_plan
from bladepack.lowering.lower_native import fusion_for
from bladepack.options import CompileOptions
from bladepack.passes.pipeline import LAYOUT_PASSES, run_pipeline, runs
from bladepack.target import KINDS, Target


class _ExpAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x) + 1.0


def _program() -> Program:
    p = to_program(capture(_ExpAdd(), [(torch.randn(2, 8),), (torch.randn(3, 8),)], None))
    return run_pipeline(p, CompileOptions.from_env(), [backend("cpu").caps])


def test_registry_and_order() -> None:
    """Every plan kind Target.parse accepts has a backend; plans are lowered in registry order,
    whatever order the targets were given in (the shape program's registers depend on it)."""
    assert set(REGISTRY) == set(KINDS)
    assert [b.kind for b in backends_for(Target.parse(["cuda", "cpu"]))] == ["cpu", "cuda"]
    assert [b.kind for b in backends_for(Target.parse(["cuda:sm_90"]))] == ["cuda"]


def test_layout_passes_run_only_where_every_backend_asks() -> None:
    options = CompileOptions.from_env()
    cpu, cuda = backend("cpu").caps, backend("cuda").caps
    for fn in LAYOUT_PASSES:
        assert runs(fn, options, [cpu]) and not runs(fn, options, [cpu, cuda]) and not runs(fn, options, [cuda])
    dense = next(fn for fn in LAYOUT_PASSES if fn.__name__ == "dense_layers")
    assert not runs(dense, CompileOptions.from_env(dense_layers=False), [cpu])


class _NoExp(CpuBackend):
    def can_emit(self, n: Any, types: Any) -> str | None:
        return "exp has no kernel on this backend" if n.op is OpKind.EXP else None


def test_can_emit_makes_reference_steps_up_front() -> None:
    p = _program()
    text = fusion_for(p, _NoExp()).text(p.graph)
    assert "1 reference steps" in text.splitlines()[0], text
    assert "exp has no kernel on this backend" in text, text
    plan = build_plan(p, [_NoExp()]).plan
    assert plan.native_cpu is not None
    refs = [lr for lr in plan.native_cpu.launches if type(lr).__name__ == "RefLaunch"]
    assert [r.reason for r in refs] == ["exp has no kernel on this backend"]


class _Broken(CpuBackend):
    def emit(self, spec: Any, ctx: Any, index: int, conv: Any, attention: Any) -> Any:
        raise ValueError("no schedule for this kernel")


def test_an_emission_failure_is_an_internal_error_naming_the_kernel() -> None:
    """What fusion gave a kernel must emit: a failure is a bladepack bug, said with the kernel and the
    model's source line, never retried on the reference executor in silence."""
    with pytest.raises(
        CompileError, match=r"the CPU backend could not generate kernel k0: no schedule .* at .*test_backends.py"
    ):
        build_plan(_program(), [_Broken()])
