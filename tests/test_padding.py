"""Padding proofs (Note [Padding proofs] in bladepack/ir/padding.py): which models may run requests of
different lengths padded to one, checked against the models themselves.

Each proven model is run in torch eager on inputs padded with the proof's pad values and compared with
the unpadded call at the valid positions, so a proof that claims too much fails here. Models that mix
positions are refused with the op and source line that does; the serving tests run padded merging
end to end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import bladepack
from bladepack.backends.cpu import CpuBackend
from bladepack.export import capture, to_program
from bladepack.ir.batch_dims import batch_proofs
from bladepack.ir.padding import PaddingProof, padding_proofs
from bladepack.options import CompileOptions
from bladepack.passes.pipeline import run_pipeline

transformers = pytest.importorskip("transformers")

SEQ_MAX = 32
LENGTHS = (1, 2, 7, 13, SEQ_MAX)  # 1, odd, and the range's end


def _prove(model: nn.Module, samples: list[tuple[torch.Tensor, ...]], names: tuple[str, ...]) -> PaddingProof:
    batch, seq = bladepack.Dim("batch", 1, 8), bladepack.Dim("seq", 1, SEQ_MAX)
    cap = capture(model, samples, {n: {0: batch, 1: seq} for n in names})
    p = run_pipeline(to_program(cap), CompileOptions.from_env(), [CpuBackend().caps])
    batch_like = batch_proofs(p)
    assert {b.symbol: b.proven for b in batch_like}["batch"], batch_like
    (proof,) = padding_proofs(p, batch_like)
    return proof


def _padded(x: torch.Tensor, length: int, pad: float) -> torch.Tensor:
    out = torch.full((x.shape[0], length, *x.shape[2:]), pad, dtype=x.dtype)
    out[:, : x.shape[1]] = x
    return out


def _check_against_eager(
    model: nn.Module,
    proof: PaddingProof,
    make: Callable[[int, int], tuple[torch.Tensor, ...]],
    names: tuple[str, ...] = ("ids", "mask"),
) -> None:
    """Every request length padded to every longer length: eager's outputs at the valid positions
    equal the unpadded call's (the proof's claim), rows of different lengths in one batch included.
    `make(b, n)` gives inputs (named `names`) whose padded dim is n."""

    def pad(inputs: tuple[torch.Tensor, ...], total: int) -> list[torch.Tensor]:
        return [_padded(x, total, proof.pads[name][1]) if name in proof.pads else x for name, x in zip(names, inputs)]

    def valid(out: torch.Tensor, n: int, first: int = 0) -> torch.Tensor:
        (axes,) = proof.outputs.values()
        return out[tuple(slice(0, n) if a + first in axes else slice(None) for a in range(out.dim()))]

    torch.manual_seed(0)
    with torch.no_grad():
        for n in LENGTHS:
            inputs = make(2, n)
            want = model(*inputs)
            for total in sorted({n + 1, SEQ_MAX} - {SEQ_MAX + 1}):
                if total > n:
                    torch.testing.assert_close(valid(model(*pad(inputs, total)), n), want, rtol=1e-5, atol=1e-5)
        # one batch: rows of lengths 1 .. SEQ_MAX together, each against its own call
        rows = [make(1, n) for n in LENGTHS]
        padded = [pad(r, SEQ_MAX) for r in rows]
        out = model(*[torch.cat([p[i] for p in padded]) for i in range(len(names))])
        for k, (n, r) in enumerate(zip(LENGTHS, rows)):
            torch.testing.assert_close(valid(out[k], n, 1), model(*r)[0], rtol=1e-5, atol=1e-5)


def _text(vocab: int) -> Callable[[int, int], tuple[torch.Tensor, ...]]:
    def make(b: int, t: int) -> tuple[torch.Tensor, ...]:
        return torch.randint(3, vocab, (b, t)), torch.ones(b, t, dtype=torch.int64)

    return make


class _Field(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state  # type: ignore[no-any-return]


def _hf(name: str) -> nn.Module:
    tf: Any = transformers
    small = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    if name == "bert":
        m = tf.BertModel(tf.BertConfig(**small), add_pooling_layer=False)
    elif name == "roberta":
        m = tf.RobertaModel(tf.RobertaConfig(**small, pad_token_id=1), add_pooling_layer=False)
    elif name == "distilbert":
        m = tf.DistilBertModel(tf.DistilBertConfig(vocab_size=96, dim=64, n_layers=2, n_heads=4, hidden_dim=96))
    elif name == "llama":
        m = tf.LlamaModel(tf.LlamaConfig(**small, num_key_value_heads=2, use_cache=False))
    else:
        m = tf.Qwen2Model(tf.Qwen2Config(**small, num_key_value_heads=2, use_cache=False))
    return _Field(m.eval()).eval()


@pytest.mark.parametrize("name", ["bert", "roberta", "distilbert", "llama", "qwen2"])
def test_hugging_face_encoders_and_decoder_prefill_are_proven(name: str) -> None:
    """The acceptance models, built from transformers configs: proven with the attention mask as the
    mask, rows of the batch each with their own length, every input padded with 0, the output trimmed
    along the sequence axis; and eager agrees at every padded length."""
    model = _hf(name)
    make = _text(96)
    proof = _prove(model, [make(2, 5), make(3, 9)], ("ids", "mask"))
    assert proof.proven, proof.reason
    assert proof.masks == ("mask",) and proof.rows == "batch"
    assert proof.pads == {"ids": (1, 0.0), "mask": (1, 0.0)} and proof.outputs == {"output0": (1,)}
    _check_against_eager(model, proof, make)


class _Seq2Seq(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, dec: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, decoder_input_ids=dec, use_cache=False)
        return out.last_hidden_state  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["t5", "bart"])
def test_encoder_decoders_are_proven_along_both_sequences(name: str) -> None:
    """T5 and BART: the encoder's length is paddable (the decoder's cross-attention keys are masked by
    the encoder mask; the decoder's output holds no encoder position), and the decoder's length too
    with no mask input of its own: its self-attention is causal, so a valid query never reads a padded
    key (Note [Padding proofs]); both checked against eager."""
    tf: Any = transformers
    small = dict(vocab_size=96, d_model=64, num_layers=2, num_heads=4, d_ff=96, d_kv=16)
    if name == "t5":
        net = tf.T5Model(tf.T5Config(**small, relative_attention_num_buckets=8, decoder_start_token_id=0))
    else:
        net = tf.BartModel(
            tf.BartConfig(
                vocab_size=96,
                d_model=64,
                encoder_layers=2,
                decoder_layers=2,
                encoder_attention_heads=4,
                decoder_attention_heads=4,
                encoder_ffn_dim=96,
                decoder_ffn_dim=96,
                max_position_embeddings=64,
            )
        )
    model = _Seq2Seq(net.eval()).eval()

    def make(seq: int, tgt: int) -> Callable[[int, int], tuple[torch.Tensor, ...]]:
        def inputs(b: int, n: int) -> tuple[torch.Tensor, ...]:
            s, t = (n, tgt) if seq < 0 else (seq, n)
            return torch.randint(3, 96, (b, s)), torch.ones(b, s, dtype=torch.int64), torch.randint(3, 96, (b, t))

        return inputs

    batch, dim = bladepack.Dim("batch", 1, 8), {k: bladepack.Dim(k, 1, SEQ_MAX) for k in ("seq", "tgt")}
    samples = [make(5, 3)(2, 4), make(9, 6)(3, 7)]  # seq 4 / 7, tgt 3 / 6
    samples = [(a, m, d) for a, m, d in samples]
    cap = capture(
        model,
        samples,
        {"ids": {0: batch, 1: dim["seq"]}, "mask": {0: batch, 1: dim["seq"]}, "dec": {0: batch, 1: dim["tgt"]}},
    )
    p = run_pipeline(to_program(cap), CompileOptions.from_env(), [CpuBackend().caps])
    proofs = {pr.symbol: pr for pr in padding_proofs(p, batch_proofs(p))}
    seq, tgt = proofs["seq"], proofs["tgt"]
    assert seq.proven and tgt.proven, (seq.reason, tgt.reason)
    assert seq.pads == {"ids": (1, 0.0), "mask": (1, 0.0)} and seq.outputs == {"output0": ()} and seq.masks == ("mask",)
    assert tgt.pads == {"dec": (1, 0.0)} and tgt.outputs == {"output0": (1,)} and tgt.masks == ()
    names = ("ids", "mask", "dec")
    _check_against_eager(model, seq, make(-1, 5), names)
    _check_against_eager(model, tgt, make(6, -1), names)


class _Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.lstm = nn.LSTM(8, 8, batch_first=True, bidirectional=True)


class _MeanPool(_Embed):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.emb(ids).mean(1)


class _Conv(_Embed):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.conv(self.emb(ids).transpose(1, 2)).transpose(1, 2) * mask[..., None]


class _Unmasked(_Embed):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        return torch.softmax(h @ h.transpose(1, 2), -1) @ h


class _Last(_Embed):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.emb(ids)[:, -1]


class _Reverse(_Embed):
    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.lstm(self.emb(ids))[0]


@pytest.mark.parametrize(
    "model, reason",
    [
        (
            _MeanPool,
            "mean at test_padding.py:{line} in forward: return self.emb(ids).mean(1) [aten.mean.dim]: a mean over the dim counts the padded positions",
        ),
        (_Conv, "a convolution over the dim mixes neighbouring positions"),
        (
            _Unmasked,
            "it runs softmax along the dim, whose padded positions hold anything, not a masked (large negative) score",
        ),
        (_Last, "it reads positions counted from the dim's end"),
        (_Reverse, "a reverse recurrence reads the padded steps before the valid ones"),
    ],
)
def test_models_that_mix_positions_are_refused_with_the_op(model: type[_Embed], reason: str) -> None:
    """A mean over the sequence without the mask, a convolution over it, attention whose keys are not
    masked, the last position, a reverse recurrence: refused, naming the op and the model's line."""
    torch.manual_seed(0)
    samples = [(torch.randint(0, 20, (b, t)), torch.ones(b, t, dtype=torch.int64)) for b, t in ((2, 5), (3, 7))]
    proof = _prove(model().eval(), samples, ("ids", "mask"))
    assert not proof.proven
    line = _MeanPool.forward.__code__.co_firstlineno + 1
    assert reason.format(line=line) in proof.reason, proof.reason
    assert proof.to_manifest() == {"padding": False, "reason": proof.reason}


class _Additive(_Embed):
    """An additive float mask (0 valid, the dtype's minimum padded), a forward LSTM and a masked sum."""

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        a = torch.softmax(h @ h.transpose(1, 2) / 4 + mask[:, None, :], -1) @ h
        return a + torch.cumsum(h, 1) * (mask == 0)[..., None]


def test_an_additive_mask_is_padded_with_its_minimum() -> None:
    torch.manual_seed(0)

    def make(b: int, t: int) -> tuple[torch.Tensor, ...]:
        return torch.randint(0, 20, (b, t)), torch.zeros(b, t)

    model = _Additive().eval()
    proof = _prove(model, [make(2, 5), make(3, 7)], ("ids", "mask"))
    assert proof.proven, proof.reason
    minimum = float(np.finfo(np.float32).min)
    assert proof.pads == {"ids": (1, 0.0), "mask": (1, minimum)} and proof.masks == ("mask",)
    _check_against_eager(model, proof, make)
