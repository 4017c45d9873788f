"""Every sample against torch eager at >= 5 values per dynamic dim (1, odd, range ends, unseen)."""

from __future__ import annotations

import pytest
import torch

import bladepack
from bladepack.errors import ShapeGuardError
from samples.registry import SAMPLES
from tests.helpers import check_against_eager, refused_by_torch


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_sample_matches_eager(name: str) -> None:
    s = SAMPLES[name]
    model = s.build()
    art = bladepack.optimize(model, s.export_samples(), s.dynamic_shapes)
    loaded = bladepack.load(art.to_bytes())
    for dim, values in s.test_dims.items():
        assert len(values) >= 5, f"{name}: fewer than 5 test values for {dim}"
        assert 1 in values, f"{name}: size 1 not tested for {dim}"
    g = torch.Generator().manual_seed(7)
    for case in s.test_cases():
        try:
            check_against_eager(model, loaded, s.make_inputs(g, **case))
        except ShapeGuardError as e:
            if not refused_by_torch(art.notes, e):
                raise


def test_sample_ranges() -> None:
    """The ranges users expect: size 1 allowed, the model's own bounds discovered."""
    enc = SAMPLES["encoder"]
    sig = bladepack.load(bladepack.optimize(enc.build(), enc.export_samples(), enc.dynamic_shapes).to_bytes()).signature
    ranges = {s.name: (s.min, s.max) for s in sig.symbols}
    assert ranges == {"batch": (1, None), "seq": (1, 512)}
    llama = SAMPLES["llama"]
    sig = bladepack.load(
        bladepack.optimize(llama.build(), llama.export_samples(), llama.dynamic_shapes).to_bytes()
    ).signature
    assert {s.name: (s.min, s.max) for s in sig.symbols} == {"batch": (1, None), "past": (1, 1023)}
