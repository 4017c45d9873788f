"""Note [Index checks] (codegen/emitter.py): an index that is a position (arange(size) through layout
ops, casts and adding 0) is never bounds-checked; a data index (a token id) still is, once where it
is read; both compute as eager does and a bad id still raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bladepack
from bladepack import Dim


class _MaskGrid(torch.nn.Module):
    """An embedding of token ids, scaled by a padding mask read through a (row, position) grid as
    Hugging Face's mask builders index it."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 24)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(ids.shape[0])
        cols = torch.arange(ids.shape[1]) + 0
        grid = mask[rows[:, None], cols[None, :]]
        return torch.nn.functional.layer_norm(self.emb(ids), (24,)) * grid[..., None].to(torch.float32)


def test_position_indices_are_not_checked_and_ids_are() -> None:
    torch.manual_seed(0)
    model = _MaskGrid().eval()
    dims = {"ids": {0: Dim("b", 1, 8), 1: Dim("s", 1, 64)}, "mask": {0: Dim("b", 1, 8), 1: Dim("s", 1, 64)}}

    def inputs(b: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randint(0, 50, (b, s)), (torch.rand(b, s) > 0.3).to(torch.int64)

    art = bladepack.optimize(model, [inputs(2, 5), inputs(3, 9)], dims)
    m = bladepack.load(art.to_bytes())
    sites = [e for k in m._manifest.kernels["cpu"] for e in k["errors"]]
    assert sites and all("take along dimension 0" in e for e in sites), sites
    for b, s in [(1, 1), (1, 7), (2, 5), (8, 64), (3, 33)]:
        ids, mask = inputs(b, s)
        with torch.no_grad():
            want = model(ids, mask).numpy()
        np.testing.assert_allclose(np.asarray(m(ids.numpy(), mask.numpy())), want, rtol=1e-5, atol=1e-5)
    ids, mask = inputs(2, 6)
    ids[1, 4] = 50
    with pytest.raises(bladepack.IndexRangeError, match="50 is not in"):
        m(ids.numpy(), mask.numpy())


class _Resize(torch.nn.Module):
    """Bilinear and bicubic resizes to another input's size (a SegFormer's decode head), beside an
    index clamped only in float: a NaN's floor cast to an integer is INT64_MIN, so it stays checked."""

    def forward(self, x: torch.Tensor, like: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        size = like.shape[2:]
        up = torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
        cub = torch.nn.functional.interpolate(x, size=size, mode="bicubic", align_corners=True)
        near = torch.nn.functional.interpolate(x, size=size, mode="nearest")
        idx = pos.clamp(min=0).floor().to(torch.int64)
        return up + cub + near, x[..., 0].index_select(2, idx)


def test_clamped_indices_are_not_checked() -> None:
    """Note [Index checks]: the taps of an interpolation are clamped into [0, d - 1] in integers, so
    they are proven in range at every size (no check, the kernels' inner loops stay vector loops);
    an index clamped in float is not proven and is checked."""
    torch.manual_seed(0)
    model = _Resize().eval()
    dims = {
        "x": {2: Dim("h", 1, 64), 3: Dim("w", 1, 64)},
        "like": {2: Dim("H", 1, 256), 3: Dim("W", 1, 256)},
        "pos": {0: Dim("n", 1, 16)},
    }

    def inputs(h: int, w: int, hh: int, ww: int, n: int) -> tuple[torch.Tensor, ...]:
        return torch.randn(2, 3, h, w), torch.zeros(1, 1, hh, ww), torch.rand(n) * h

    art = bladepack.optimize(model, [inputs(5, 7, 11, 13, 3), inputs(8, 6, 16, 9, 4)], dims)
    m = bladepack.load(art.to_bytes())
    sites = [e for k in m._manifest.kernels["cpu"] for e in k["errors"]]
    assert sites and all("index" in e or "take" in e for e in sites), sites
    assert len(sites) == 1, sites  # the float-clamped index only
    for size in [(1, 1, 1, 1, 1), (5, 7, 11, 13, 3), (3, 64, 256, 1, 16), (64, 2, 7, 200, 5)]:
        args = inputs(*size)
        with torch.no_grad():
            want = model(*args)
        for got, ref in zip(m(*[a.numpy() for a in args]), want):
            np.testing.assert_allclose(np.asarray(got), ref.numpy(), rtol=1e-4, atol=1e-4)
