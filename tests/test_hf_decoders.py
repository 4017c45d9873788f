"""Hugging Face decoder families (transformers configs, random weights, no downloads) with padded batches.

Batched generation left-pads: the padded query positions then attend to no key at all (the causal mask
and the padding mask leave their rows empty), which torch's attention answers with 0 for that row
(Note [Safe softmax] in codegen/emitter.py). Every family is compared with eager at unseen shapes with
left padding, right padding and none, on the native and the reference executor: finite, and within
1e-4 relative everywhere, real tokens and padded positions alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import bladepack
from samples.zoo import DECODER
from tests.helpers import narrowed

transformers = pytest.importorskip("transformers")


class LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state


def _family(name: str) -> Callable[[], torch.nn.Module]:
    config, model = {
        "qwen2": ("Qwen2Config", "Qwen2Model"),
        "llama": ("LlamaConfig", "LlamaModel"),
        "mistral": ("MistralConfig", "MistralModel"),
    }[name]
    return lambda: getattr(transformers, model)(getattr(transformers, config)(**DECODER)).eval()


def _batch(g: torch.Generator, b: int, t: int, padding: str) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, DECODER["vocab_size"], (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.int64)
    for row in range(b):
        pad = (row * 3 + 1) % t if b > 1 else 0  # rows padded by different amounts, one not at all
        if padding == "left" and pad:
            mask[row, :pad] = 0
        elif padding == "right" and pad:
            mask[row, t - pad :] = 0
    return ids, mask


FAMILIES = [
    pytest.param("qwen2"),
    pytest.param("llama", marks=pytest.mark.slow),
    pytest.param("mistral", marks=pytest.mark.slow),
]


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_batches_match_eager(family: str, tmp_path: Any) -> None:
    torch.manual_seed(0)
    model = LastHidden(_family(family)())
    g = torch.Generator().manual_seed(0)
    batch, seq = bladepack.Dim("batch", 1, 32), bladepack.Dim("seq", 1, 128)
    art = bladepack.optimize(
        model,
        [_batch(g, 2, 8, "none"), _batch(g, 3, 12, "left")],
        dynamic_shapes={"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}},
    )
    path = tmp_path / f"{family}.bpk"
    art.save(path)
    loaded = {ex: bladepack.load(path, executor=ex) for ex in ("native", "reference")}
    for b, t in [(1, 1), (1, 6), (3, 7), (4, 13)]:
        if narrowed(art, {"batch": b, "seq": t}):
            continue
        for padding in ("left", "right", "none"):
            ids, mask = _batch(g, b, t, padding)
            with torch.no_grad():
                want = model(ids, mask).numpy()
            for ex, m in loaded.items():
                got = m(ids.numpy(), mask.numpy())
                where = f"{family} {ex} batch {b} seq {t} {padding} padding"
                assert np.isfinite(got).all(), f"{where}: non-finite outputs"
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=where)


def test_causal_lm_as_it_is() -> None:
    """A *ForCausalLM given directly: its config asks for a KV cache (a DynamicCache in the output),
    so it is exported without one; the logits keep their name; the config is restored."""
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**{**DECODER, "use_cache": True})).eval()
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(0, DECODER["vocab_size"], (b, t), generator=g) for b, t in ((2, 7), (3, 9))]
    art = bladepack.optimize(model, [(i,) for i in ids])
    assert model.config.use_cache is True
    loaded = bladepack.load(art.to_bytes())
    assert [o.name for o in loaded.signature.outputs] == ["logits"]
    for b, t in [(1, 1), (2, 5), (1, 12)]:
        x = torch.randint(0, DECODER["vocab_size"], (b, t), generator=g)
        if narrowed(art, {"input_ids_dim0": b, "input_ids_dim1": t}):
            continue
        with torch.no_grad():
            want = model(x, use_cache=False).logits.numpy()
        (got,) = loaded(x.numpy())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"batch {b} seq {t}")
