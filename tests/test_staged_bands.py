"""Padded channels-last convolutions read through staged bands (Note [Staged bands] in
bladepack/codegen/cpu_conv_band.py) and window origins (Note [Window origins]), and an image's last
tile of at most half a tile (Note [Tail tiles]): against eager at every ISA level this CPU runs and at
1-3 threads, on images from 1 x 1 to ones whose band holds fewer rows than a chunk's tiles read.

Each model's branches cover the band's three layouts: the model's NCHW input read in place (a plane per
channel), a convolution's channels-last output (row copies) and a transposed input (gathered)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.export import Dim

import bladepack
from bladepack.options import CompileOptions
from tests.helpers import eager_failures, eager_outputs, runnable_levels

TOL = 2e-5


class _Branches(nn.Module):
    """Padded convolutions of several kernels, strides and dilations, each on the input in place, on a
    first convolution's channels-last output, and one on the input with its H and W swapped. Each
    branch ends in a 1x1 convolution, so that it stays channels-last (a convolution whose result is a
    graph output stores NCHW itself: Note [Channels-last chains]) while every pixel's error shows."""

    def __init__(self, cin: int, mid: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(cin, mid, 3, padding=1)  # planar band (the NCHW input read in place)
        self.wide = nn.Conv2d(cin, mid, 7, stride=2, padding=3)  # a ResNet stem: planar, stride 2
        self.dilated = nn.Conv2d(mid, mid, 3, padding=2, dilation=2)  # channels-last band
        self.strided = nn.Conv2d(mid, mid + 8, 3, stride=2, padding=1)
        self.rows = nn.Conv2d(mid, 24, (1, 5), padding=(0, 2))  # padding in one direction only
        self.cols = nn.Conv2d(mid, 24, (5, 1), padding=(2, 0))
        self.swapped = nn.Conv2d(cin, 16, 3, padding=(1, 2))  # the transposed input: a gathered band
        self.heads = nn.ModuleList(nn.Conv2d(c, 8, 1) for c in (mid, mid + 8, 24, 24, mid, 16))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = torch.relu(self.stem(x))
        branches = (
            self.dilated(f),
            torch.relu(self.strided(f)),
            self.rows(f),
            self.cols(f),
            self.wide(x),
            self.swapped(x.transpose(2, 3)),
        )
        return tuple(head(b) for head, b in zip(self.heads, branches, strict=True))


def _build(tmp_path: Path, cin: int, mid: int) -> tuple[Path, nn.Module, str, list[str]]:
    torch.manual_seed(cin * 100 + mid)
    m = _Branches(cin, mid).eval()
    ex = (torch.randn(2, cin, 9, 11),)
    dims = {"x": {0: Dim("batch", min=1, max=64), 2: Dim("h", min=1, max=2048), 3: Dim("w", min=1, max=2048)}}
    dump = tmp_path / "dump"
    art = bladepack.optimize(m, ex, dynamic_shapes=dims, options=CompileOptions.from_env(dump_dir=dump))
    path = tmp_path / f"bands_{cin}_{mid}.bpk"
    path.write_bytes(art.to_bytes())
    return path, m, (dump / "06-lowering.cpu.cc").read_text(), runnable_levels(art)


def _check(tmp_path: Path, cin: int, mid: int, shapes: list[tuple[int, int, int]]) -> None:
    path, m, source, levels = _build(tmp_path, cin, mid)
    # each band layout is made (the module docstring), and the tail tiles
    assert "bsc_ = nr_ * bw_" in source  # planar
    assert "contiguous pixels: one copy" in source  # channels-last
    assert "d_[(" in source and "] = s_[x * " in source  # gathered
    assert "if (np_ <= 4) {" in source
    g = torch.Generator().manual_seed(7)
    inputs = [torch.randn(b, cin, h, w, generator=g).numpy() for b, h, w in shapes]
    assert levels
    failures = eager_failures(path, levels, inputs, eager_outputs(m, inputs), TOL)
    assert not failures, "\n".join(failures)


def test_small_images_and_tails(tmp_path: Path) -> None:
    """Images of 1-13 pixels a side, where every tile is a border tile and many images end in a tail
    tile; 3 input channels (an RGB stem) and 16 / 24 channels inside."""
    _check(tmp_path, 3, 16, [(1, 1, 1), (2, 3, 4), (3, 7, 5), (1, 13, 1), (2, 1, 17), (5, 6, 8)])


def test_bands_smaller_than_a_chunk(tmp_path: Path) -> None:
    """One input channel and 32 channels inside, on images whose channels-last rows (610 x 32 floats)
    leave a band room for a single row, so every tile restages its own rows, and on a batch whose
    chunks cross images."""
    _check(tmp_path, 1, 32, [(1, 5, 610), (7, 9, 3), (2, 40, 33)])


def test_band_reuse_across_calls(tmp_path: Path) -> None:
    """A band is made per chunk and never read in a later call: a second call with other values at the
    same shape and a call at another shape in between get their own results."""
    path, m, _, _ = _build(tmp_path, 3, 16)
    mod = bladepack.load(path)
    g = torch.Generator().manual_seed(3)
    for shape in [(2, 9, 11), (1, 4, 4), (2, 9, 11), (2, 9, 11)]:
        x = torch.randn(*shape[:1], 3, *shape[1:], generator=g)
        with torch.no_grad():
            want = m(x)
        for got, ref in zip(mod(x.numpy()), want, strict=True):
            np.testing.assert_allclose(np.asarray(got), ref.numpy(), rtol=TOL, atol=TOL * (1 + float(ref.abs().max())))
