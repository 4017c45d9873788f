"""A LLaMA-style decoder step with a KV cache: dynamic batch and past length.

RMSNorm via pow / mean / rsqrt, rotary embeddings via neg / cat / slice, a SiLU-gated MLP,
grouped-query attention (repeat_kv with expand / reshape) and the KV-cache concatenation. The rotary
tables hold 1024 positions, which bounds the past length: bladepack discovers the range from the model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bladepack import Dim
from samples.common import Sample

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, MAX_POS, NEW = 64, 8, 2, 8, 172, 1024, 1


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


class DecoderStep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = RMSNorm(HIDDEN)
        self.q = nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False)
        self.k = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.v = nn.Linear(HIDDEN, KV_HEADS * HEAD_DIM, bias=False)
        self.o = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.norm2 = RMSNorm(HIDDEN)
        self.gate = nn.Linear(HIDDEN, FFN, bias=False)
        self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
        freqs = torch.outer(torch.arange(MAX_POS).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(
        self, x: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        past = past_k.shape[2]
        h = self.norm1(x)
        q = self.q(h).view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
        k = self.k(h).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v(h).view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        cos, sin = self.cos[past : past + t][None, None], self.sin[past : past + t][None, None]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_all = torch.cat([past_k, k], dim=2)
        v_all = torch.cat([past_v, v], dim=2)
        attn = F.scaled_dot_product_attention(
            q, repeat_kv(k_all, HEADS // KV_HEADS), repeat_kv(v_all, HEADS // KV_HEADS)
        )
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, HEADS * HEAD_DIM))
        h = self.norm2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        return x, k_all, v_all


def make_inputs(g: torch.Generator, batch: int, past: int) -> tuple[torch.Tensor, ...]:
    x = torch.randn(batch, NEW, HIDDEN, generator=g)
    pk = torch.randn(batch, KV_HEADS, past, HEAD_DIM, generator=g)
    pv = torch.randn(batch, KV_HEADS, past, HEAD_DIM, generator=g)
    return x, pk, pv


SAMPLE = Sample(
    name="llama",
    build=lambda: DecoderStep().eval(),
    make_inputs=make_inputs,
    export_dims=[{"batch": 2, "past": 5}, {"batch": 3, "past": 12}],
    test_dims={"batch": [1, 2, 5, 9, 16], "past": [1, 2, 31, 200, 1023]},
    base_dims={"batch": 2, "past": 7},
    dynamic_shapes={
        "x": {0: Dim("batch")},
        "past_k": {0: Dim("batch"), 2: Dim("past")},
        "past_v": {0: Dim("batch"), 2: Dim("past")},
    },
)
