"""A BERT-style encoder written with plain ops; dynamic batch and sequence.

The 512-row position table bounds the sequence: bladepack discovers [1, 512] from the model itself.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from bladepack import Dim
from samples.common import Sample

VOCAB, HIDDEN, HEADS, FFN, LAYERS, MAX_POS = 1000, 64, 4, 256, 2, 512


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.ln1 = nn.LayerNorm(HIDDEN)
        self.ff1 = nn.Linear(HIDDEN, FFN)
        self.ff2 = nn.Linear(FFN, HIDDEN)
        self.ln2 = nn.LayerNorm(HIDDEN)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(HIDDEN, dim=-1)
        q, k, v = (t.view(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2) for t in (q, k, v))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HIDDEN // HEADS)
        scores = scores.masked_fill(mask[:, None, None, :] == 0, torch.finfo(scores.dtype).min)
        attn = self.drop(F.softmax(scores, dim=-1))
        ctx = torch.matmul(attn, v).transpose(1, 2).reshape(b, s, HIDDEN)
        x = self.ln1(x + self.out(ctx))
        return self.ln2(x + self.ff2(self.drop(F.gelu(self.ff1(x)))))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, HIDDEN)
        self.pos = nn.Parameter(torch.randn(MAX_POS, HIDDEN) * 0.02)
        self.ln = nn.LayerNorm(HIDDEN)
        self.layers = nn.ModuleList(EncoderLayer() for _ in range(LAYERS))
        self.pool = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = input_ids.shape[1]
        x = self.ln(self.tok(input_ids) + self.pos[:s])
        for layer in self.layers:
            x = layer(x, attention_mask)
        pooled = torch.tanh(self.pool(x[:, 0]))
        return x, pooled


def make_inputs(g: torch.Generator, batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    ids = torch.randint(0, VOCAB, (batch, seq), generator=g)
    lengths = torch.randint(1, seq + 1, (batch,), generator=g)
    mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
    return ids, mask


SAMPLE = Sample(
    name="encoder",
    build=lambda: Encoder().eval(),
    make_inputs=make_inputs,
    export_dims=[{"batch": 2, "seq": 8}, {"batch": 4, "seq": 16}],
    test_dims={"batch": [1, 3, 7, 16, 33], "seq": [1, 5, 77, 300, 512]},
    base_dims={"batch": 2, "seq": 9},
    dynamic_shapes={"input_ids": {0: Dim("batch"), 1: Dim("seq")}, "attention_mask": {0: Dim("batch"), 1: Dim("seq")}},
)
