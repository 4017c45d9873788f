"""Note [Channel tiles] (codegen/cpu_channel_tiles.py): a CPU loop kernel whose inputs are contiguous along
another axis than its output's last computes blocks of that axis in its inner loop. Against eager at every
ISA level this machine runs, 1-3 threads, at sizes 1, odd, a tile's multiple +- 1 and the range's ends:
SegFormer's decode head (bilinear upsampling of channels-last maps into an NCHW concatenation whose parts
are not multiples of the 16-channel block), one such upsampling alone, and kernels the schedule must not
take (a plain NCHW chain, a concatenation along another axis)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.export import Dim

import bladepack
from bladepack import LoaderOptions
from tests.helpers import all_isas, runnable_levels


class _Head(nn.Module):
    """SegFormer's decode head: per map [B, h * w, C] a projection, an NCHW view, a bilinear upsampling to
    the first map's size; the maps concatenated along channels (24 + 16 + 7 = 47), then a 1 x 1 fusion."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.ModuleList(nn.Linear(8, c) for c in (24, 16, 7))
        self.fuse = nn.Conv2d(47, 5, 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        size = a.shape[1:3]
        maps = []
        for x, proj in zip((a, b, c), self.proj):
            n, h, w, _ = x.shape
            y = proj(x.reshape(n, h * w, 8)).transpose(1, 2).reshape(n, -1, h, w)
            maps.append(F.interpolate(y, size=size, mode="bilinear", align_corners=False))
        cat = torch.cat(maps[::-1], dim=1)
        return cat, self.fuse(cat)


def _head_inputs(g: torch.Generator, n: int, h: int, w: int) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(n, -(-h // s), -(-w // s), 8, generator=g) for s in (1, 2, 4))


def _variants(art: bladepack.api.Artifact) -> list[str]:
    return [v.name for k in art.plan.kernels if k.target == "cpu" for v in k.variants]


def _check(
    model: nn.Module, art: bladepack.api.Artifact, cases: list[tuple[torch.Tensor, ...]], tmp_path: Path
) -> None:
    """Every runnable ISA level at 1-3 threads: each output within 1e-5 of eager (|y - eager| / (1 + max |eager|))."""
    path = tmp_path / "m.bpk"
    art.save(path)
    failures = []
    for isa in runnable_levels(art):
        for threads in (1, 2, 3):
            m = bladepack.load(path, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=threads))
            for x in cases:
                with torch.no_grad():
                    want = model(*x)
                want = want if isinstance(want, tuple) else (want,)
                got = m(*(t.numpy() for t in x))
                got = got if isinstance(got, (tuple, list)) else (got,)
                for k, (o, w) in enumerate(zip(got, want, strict=True)):
                    w = w.numpy()
                    err = float(np.abs(np.asarray(o) - w).max() / (1 + np.abs(w).max()))
                    if not err <= 1e-5:
                        failures.append(
                            f"{isa}, {threads} threads, {[tuple(t.shape) for t in x]}, output {k}: {err:.1e}"
                        )
    assert not failures, failures


def test_decode_head_tiles_its_channels(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _Head().eval()
    g = torch.Generator().manual_seed(1)
    n, h, w = Dim("n", min=1, max=4), Dim("h", min=1, max=64), Dim("w", min=1, max=64)
    dims = ({0: n, 1: h, 2: w}, {0: n, 1: Dim("h2", min=1, max=32), 2: Dim("w2", min=1, max=32)})
    dims += ({0: n, 1: Dim("h4", min=1, max=16), 2: Dim("w4", min=1, max=16)},)
    art = bladepack.optimize(model, [_head_inputs(g, 2, 12, 20)], dims, options=all_isas())
    assert any(v.endswith("_ctile") for v in _variants(art)), _variants(art)
    cases = [_head_inputs(g, *s) for s in ((1, 1, 1), (1, 7, 33), (2, 16, 15), (3, 17, 64), (4, 64, 64))]
    _check(model, art, cases, tmp_path)


class _Upsample(nn.Module):
    """One channels-last map of 40 channels upsampled into NCHW (2.5 blocks of channels), then a ReLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(F.interpolate(x.permute(0, 3, 1, 2), scale_factor=2.0, mode="bilinear"))


def test_one_upsampling_tiles_its_channels(tmp_path: Path) -> None:
    model = _Upsample()
    g = torch.Generator().manual_seed(2)
    dims = ({0: Dim("n", min=1, max=3), 1: Dim("h", min=1, max=40), 2: Dim("w", min=1, max=40)},)
    art = bladepack.optimize(model, [(torch.randn(2, 9, 11, 40, generator=g),)], dims, options=all_isas())
    assert any(v.endswith("_ctile") for v in _variants(art)), _variants(art)
    cases = [(torch.randn(*s, 40, generator=g),) for s in ((1, 1, 1), (1, 5, 8), (3, 40, 17), (2, 40, 40))]
    _check(model, art, cases, tmp_path)


class _Plain(nn.Module):
    """Contiguous NCHW reads along the output's last axis, and a concatenation along it: no tiles."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tanh(x) * 2.0, torch.cat((x, y), dim=3)


def test_kernels_read_along_the_last_axis_keep_the_ordinary_schedule(tmp_path: Path) -> None:
    model = _Plain()
    g = torch.Generator().manual_seed(3)
    dims = ({0: Dim("n", min=1, max=4), 3: Dim("w", min=1, max=64)}, {0: Dim("n", min=1, max=4)})
    sample = (torch.randn(2, 16, 5, 9, generator=g), torch.randn(2, 16, 5, 3, generator=g))
    art = bladepack.optimize(model, [sample], dims, options=all_isas())
    assert not any(v.endswith("_ctile") for v in _variants(art)), _variants(art)
    _check(model, art, [(torch.randn(3, 16, 5, 17, generator=g), torch.randn(3, 16, 5, 3, generator=g))], tmp_path)


class _Exits(nn.Module):
    """Channels-last chains that end at graph outputs (a stem and a depthwise convolution each): the exit
    permutes to NCHW are channel-tile kernels written out in 8 x 8 blocks (Note [Tile write-out]) with
    channel tails of 4, 4 + 8 and 8 (12, 20 and 72 channels)."""

    def __init__(self) -> None:
        super().__init__()
        self.stems = nn.ModuleList(nn.Conv2d(3, c, 3, padding=1) for c in (12, 20, 72))
        self.dws = nn.ModuleList(nn.Conv2d(c, c, 3, padding=1, groups=c) for c in (12, 20, 72))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.relu(dw(torch.relu(s(x)))) for s, dw in zip(self.stems, self.dws))


def test_exit_permutes_write_blocks_and_tails(tmp_path: Path) -> None:
    """Widths below, at and past the 8-position blocks (1, 7, 8, 9, 16, 17, 31) and channel counts past
    the 8-channel blocks, against eager at every ISA level, 1-3 threads."""
    torch.manual_seed(0)
    model = _Exits().eval()
    g = torch.Generator().manual_seed(4)
    dims = ({0: Dim("n", min=1, max=3), 2: Dim("h", min=1, max=32), 3: Dim("w", min=1, max=32)},)
    art = bladepack.optimize(model, [(torch.randn(2, 3, 9, 11, generator=g),)], dims, options=all_isas())
    assert sum(v.endswith("_ctile") for v in _variants(art)) == 3, _variants(art)
    sizes = ((1, 1, 1), (2, 3, 7), (1, 8, 8), (3, 5, 9), (1, 16, 16), (2, 4, 17), (1, 32, 31))
    _check(model, art, [(torch.randn(*s[:1], 3, *s[1:], generator=g),) for s in sizes], tmp_path)
