"""The torch front end against PyTorch's core ATen opset: every op torch tags `core` converts, is
evaluated by the shape program, is ignored at inference, or is listed with its reason in
bladepack/export/core_aten.py (and docs/ops.md); an op none of these explains fails this test."""

from __future__ import annotations

from pathlib import Path

import torch

from bladepack.export.core_aten import BY_DESIGN, NOT_YET, REASONS, SYMBOLIC
from bladepack.export.from_torch import _IGNORED, TABLE

DOCS = Path(__file__).resolve().parent.parent / "docs" / "ops.md"


def _core_ops() -> set[str]:
    """Every registered aten overload tagged core (from the schema registry: `dir(torch.ops.aten)`
    lists only the ops loaded so far)."""
    ops = set()
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        try:
            op = getattr(getattr(torch.ops.aten, schema.name[6:]), schema.overload_name or "default")
        except (AttributeError, RuntimeError):
            continue
        if torch.Tag.core in op.tags:
            ops.add(str(op))
    return ops


def test_every_core_aten_op_is_converted_or_explained() -> None:
    core = _core_ops()
    assert len(core) > 150, "torch's core tags were not found"
    unexplained = sorted(core - set(TABLE) - _IGNORED - SYMBOLIC - set(REASONS))
    assert not unexplained, f"core ATen ops with no converter and no reason: {unexplained}"
    stale = sorted(op for op in REASONS if op in TABLE)
    assert not stale, f"listed as not converted, but a converter exists: {stale}"
    assert not set(BY_DESIGN) & set(NOT_YET)
    converted = len(core & set(TABLE)) + len(core & (_IGNORED | SYMBOLIC))
    assert converted >= len(core) - len(REASONS)


def test_the_docs_list_every_op_not_converted() -> None:
    text = DOCS.read_text()
    missing = [op for op in REASONS if f"`{op.removeprefix('aten.').removesuffix('.default')}`" not in text]
    assert not missing, f"docs/ops.md does not list {missing}"


def test_an_op_not_converted_says_why() -> None:
    import pytest

    import bladepack
    from bladepack.errors import UnsupportedOpsError

    class Sorts(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.kthvalue(x, 2, dim=-1).values + torch.nonzero(x > 0).sum()

    with pytest.raises(UnsupportedOpsError) as e:
        bladepack.optimize(Sorts(), [(torch.randn(2, 5),), (torch.randn(3, 7),)])
    text = str(e.value)
    assert "aten.nonzero.default (its result's shape depends on the input's values)" in text, text
    assert "aten.kthvalue.default" in text, text
