"""Hugging Face models given as they are (no wrapper): their ModelOutput's field names name the
artifact's outputs. The architectures themselves, through every front end, are the model zoo's
(tests/test_zoo.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bladepack

transformers = pytest.importorskip("transformers")


def _distilbert() -> torch.nn.Module:
    cfg = transformers.DistilBertConfig(
        vocab_size=100, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=128
    )
    return transformers.DistilBertModel(cfg)


def _inputs(g: torch.Generator, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 100, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.int64)
    mask[0, (t + 1) // 2 :] = 0  # a padded row (never every token: exporters differ from eager there)
    return ids, mask


def test_model_output_names_are_kept() -> None:
    """A Hugging Face model given as it is: its ModelOutput's field names name the artifact's outputs."""
    torch.manual_seed(0)
    model = _distilbert().eval()
    g = torch.Generator().manual_seed(1)
    samples = [(_inputs(g, 2, 9)[0],), (_inputs(g, 3, 12)[0],)]
    art = bladepack.optimize(model, samples)
    loaded = bladepack.load(art.to_bytes())
    assert [o.name for o in loaded.signature.outputs] == ["last_hidden_state"]
    ids = samples[0][0]
    with torch.no_grad():
        want = model(input_ids=ids).last_hidden_state.numpy()
    (got,) = loaded(ids.numpy())  # a ModelOutput comes back as the tuple of its fields
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
