"""Hugging Face encoders (transformers configs, random weights, no downloads) through both front ends:
torch.export, and ONNX files from torch's TorchScript and dynamo exporters. Compared with eager at
unseen shapes, batch 1 and odd lengths, with a padded row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import bladepack

transformers = pytest.importorskip("transformers")


class LastHidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


def _distilbert() -> torch.nn.Module:
    cfg = transformers.DistilBertConfig(
        vocab_size=100, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=128
    )
    return transformers.DistilBertModel(cfg)


def _t5_encoder() -> torch.nn.Module:
    cfg = transformers.T5Config(
        vocab_size=100,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
    )
    return transformers.T5EncoderModel(cfg)


MODELS = {"distilbert": _distilbert, "t5-encoder": _t5_encoder}


def _inputs(g: torch.Generator, b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 100, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.int64)
    mask[0, (t + 1) // 2 :] = 0  # a padded row (never every token: exporters differ from eager there)
    return ids, mask


def _artifact(model: torch.nn.Module, front_end: str, tmp_path: Path) -> Any:
    g = torch.Generator().manual_seed(1)
    samples = [_inputs(g, 2, 9), _inputs(g, 3, 12)]
    if front_end == "torch":
        batch, seq = bladepack.Dim("batch"), bladepack.Dim("seq")
        return bladepack.optimize(
            model, samples, dynamic_shapes={"ids": {0: batch, 1: seq}, "mask": {0: batch, 1: seq}}
        )
    path = tmp_path / "model.onnx"
    if front_end == "onnx-dynamo":
        d = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
        torch.onnx.export(
            model, samples[0], path, dynamo=True, input_names=["ids", "mask"], dynamic_shapes={"ids": d, "mask": d}
        )
    else:
        axes = {0: "batch", 1: "seq"}
        torch.onnx.export(
            model,
            samples[0],
            path,
            dynamo=False,
            input_names=["ids", "mask"],
            output_names=["out"],
            dynamic_axes={"ids": axes, "mask": axes},
        )
    return bladepack.optimize(str(path))


CASES = [
    pytest.param("distilbert", "torch"),
    pytest.param("distilbert", "onnx-torchscript"),
    pytest.param("distilbert", "onnx-dynamo", marks=pytest.mark.slow),
    pytest.param("t5-encoder", "torch"),
    pytest.param("t5-encoder", "onnx-torchscript", marks=pytest.mark.slow),
]


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("name", "front_end"), CASES)
def test_encoder_matches_eager(name: str, front_end: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = LastHidden(MODELS[name]().eval()).eval()
    loaded = bladepack.load(_artifact(model, front_end, tmp_path).to_bytes())
    g = torch.Generator().manual_seed(2)
    for b, t in [(1, 1), (1, 6), (3, 7), (2, 30)]:
        ids, mask = _inputs(g, b, t)
        if b == 1:
            mask[:] = 1
        with torch.no_grad():
            want = model(ids, mask).numpy()
        got = loaded(ids.numpy(), mask.numpy())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} {front_end} {b}x{t}")


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
