"""Note [Concatenation along an outer axis] (codegen/cpu_emitter.py): a loop kernel whose result is a
concat along an axis its row loop fixes picks the input once per row, one inner loop per input; the
values are eager's at every size, including inputs of one row and odd lengths."""

from __future__ import annotations

import re

import numpy as np
import torch

import bladepack
from bladepack import Dim


class _Head(torch.nn.Module):
    """A SegFormer-style decode head: stage outputs of different sizes resized to the first one's and
    concatenated along channels, beside a cache-style concat along the sequence axis."""

    def forward(
        self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, past: torch.Tensor, new: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        size = a.shape[2:]
        up_b = torch.nn.functional.interpolate(b, size=size, mode="bilinear", align_corners=False)
        up_c = torch.nn.functional.interpolate(c, size=size, mode="nearest")
        fused = torch.cat([torch.relu(a), up_b * 2, up_c - 1], dim=1)
        return fused, torch.cat([past, torch.tanh(new)], dim=2)


def test_concat_along_an_outer_axis_matches_eager() -> None:
    model = _Head().eval()
    dims = {
        "a": {2: Dim("h", 1, 64), 3: Dim("w", 1, 64)},
        "b": {2: Dim("hb", 1, 32), 3: Dim("wb", 1, 32)},
        "c": {1: Dim("cc", 1, 8)},
        "past": {2: Dim("p", 1, 64)},
        "new": {2: Dim("t", 1, 16)},
    }

    def inputs(h: int, w: int, hb: int, wb: int, cc: int, p: int, t: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(h * 7 + w)
        return (
            torch.randn(2, 3, h, w, generator=g),
            torch.randn(2, 5, hb, wb, generator=g),
            torch.randn(2, cc, 3, 2, generator=g),
            torch.randn(1, 4, p, 6, generator=g),
            torch.randn(1, 4, t, 6, generator=g),
        )

    art = bladepack.optimize(model, [inputs(8, 6, 4, 3, 2, 5, 1), inputs(12, 9, 5, 7, 3, 9, 2)], dims)
    kernels = re.findall(r"BPK_KERNEL void k\d+_simd.*?\n}\n", art.sources.unit("cpu"), re.S)
    # the three-input concat: a vector loop per input, chosen by an if / else-if / else per row
    assert any(k.count("#pragma omp simd") == 3 and k.count("else if (") == 1 for k in kernels), kernels
    m = bladepack.load(art.to_bytes())
    for size in [(1, 1, 1, 1, 1, 1, 1), (8, 6, 4, 3, 2, 5, 1), (13, 17, 5, 32, 1, 64, 16), (64, 1, 32, 1, 8, 3, 7)]:
        args = inputs(*size)
        with torch.no_grad():
            want = model(*args)
        for got, ref in zip(m(*[x.numpy() for x in args]), want):
            np.testing.assert_allclose(np.asarray(got), ref.numpy(), rtol=1e-5, atol=1e-5, err_msg=str(size))
