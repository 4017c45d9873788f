"""masked_scatter, embedding_bag, col2im (F.fold) and pdist (Note [Indexed compositions] in
export/ops_indexed.py) against eager at several batch and bag sizes: empty bags, padding_idx,
per-sample weights, every mode; a source too short for the mask is an IndexRangeError."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import bladepack
from bladepack.errors import IndexRangeError


class _Indexed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sum = nn.EmbeddingBag(20, 4, mode="sum", padding_idx=3)
        self.mean = nn.EmbeddingBag(20, 4, mode="mean", padding_idx=3)
        self.max = nn.EmbeddingBag(20, 4, mode="max", padding_idx=3)
        self.weighted = nn.EmbeddingBag(20, 4, mode="sum", include_last_offset=True)

    def forward(
        self, x: torch.Tensor, idx: torch.Tensor, offs: torch.Tensor, w: torch.Tensor, cols: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        last = torch.cat([offs, torch.full((1,), idx.shape[0], dtype=offs.dtype)])
        return (
            x.masked_scatter(x > 0, x * 10 - 1),
            x.masked_scatter((x[:1] > 0.5), x.flip(0)),
            self.sum(idx, offs),
            self.mean(idx, offs),
            self.max(idx, offs),
            self.weighted(idx, last, per_sample_weights=w),
            F.fold(cols, (5, 6), (2, 3), dilation=(1, 1), padding=(1, 0), stride=(1, 2)),
            F.pdist(x.new_ones(4, 3).cumsum(0) * x[0, :3]),
        )


def _inputs(b: int, length: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    idx = torch.randint(0, 20, (length,), generator=g)
    idx[::3] = 3  # padding entries
    cuts = torch.sort(torch.randint(0, length + 1, (b - 1,), generator=g)).values  # repeats: empty bags
    offs = torch.cat([torch.zeros(1, dtype=torch.int64), cuts])
    cols = torch.randn(b, 2 * 6, 6 * 2, generator=g)  # C = 2, kernel 2x3, 6 x 2 blocks
    return torch.randn(b, 6, generator=g), idx, offs, torch.rand(length, generator=g), cols


@pytest.fixture(scope="module")
def compiled() -> tuple[nn.Module, bladepack.LoadedModule]:
    torch.manual_seed(0)
    model = _Indexed().eval()
    g = torch.Generator().manual_seed(1)
    art = bladepack.optimize(model, [_inputs(2, 7, g), _inputs(3, 11, g)])
    return model, bladepack.load(art.to_bytes())


def test_indexed_compositions_match_eager(compiled: tuple[nn.Module, bladepack.LoadedModule]) -> None:
    model, loaded = compiled
    g = torch.Generator().manual_seed(2)
    for b, length in [(1, 1), (1, 5), (4, 3), (5, 17), (9, 40)]:
        args = _inputs(b, length, g)
        with torch.no_grad():
            want = model(*args)
        got = loaded(*(a.numpy() for a in args))
        for k, (w, o) in enumerate(zip(want, got, strict=True)):
            np.testing.assert_allclose(
                o, w.numpy(), rtol=1e-5, atol=1e-6, err_msg=f"output {k}, batch {b}, {length} indices"
            )


class _Short(nn.Module):
    def forward(self, x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        return x.masked_scatter(x > 0, src)


def test_a_source_shorter_than_the_mask_is_an_error() -> None:
    art = bladepack.optimize(_Short(), [(torch.randn(2, 4), torch.randn(8)), (torch.randn(3, 4), torch.randn(12))])
    loaded = bladepack.load(art.to_bytes())
    x = np.ones((3, 4), np.float32)
    np.testing.assert_array_equal(
        loaded(x, np.arange(12, dtype=np.float32)), np.arange(12, dtype=np.float32).reshape(3, 4)
    )
    with pytest.raises(IndexRangeError):
        loaded(x, np.arange(5, dtype=np.float32))
