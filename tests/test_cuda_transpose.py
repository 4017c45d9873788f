"""Note [Transpose tiles] (codegen/cuda_tiles.py): a loop kernel reading an operand contiguously along
another dim than the last moves it through shared-memory tiles. On the fake driver (kernels emulated,
the block's threads as fibers with real barriers), against eager at shapes around the tile's 32 (partial
tiles at both edges, one tile, many), in float32 and float16, with the tiled operand fused into other
math and beside an untiled operand; which variant ran is read from the launch log; the C++ runtime
gives the same bits; ptxas reports no spill."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import bladepack
from tests.cuda_harness import FakeGpu, ptxas_reports
from tests.helpers import rel_err

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found (CUDA targets need it)")


class _Permutes(torch.nn.Module):
    """A head split's [b, s, h, d] -> [b, h, s, d] stays contiguous in d (no tile); an NCHW -> NHWC
    conversion fused with a scale and a residual read in the output's order; a 2-D transpose plus bias."""

    def forward(self, x: torch.Tensor, img: torch.Tensor, res: torch.Tensor) -> tuple[torch.Tensor, ...]:
        heads = x.reshape(x.shape[0], x.shape[1], 4, 8).permute(0, 2, 1, 3).contiguous() * 2.0
        nhwc = img.permute(0, 2, 3, 1) * 0.5 + res
        flat = x.reshape(-1, x.shape[-1])
        t = flat.t().contiguous() + 1.0
        return heads, nhwc, t


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("permutes")


def _optimize(dtype: str | None, dump: Path | None = None) -> bladepack.api.Artifact:
    b, s = torch.export.Dim("b", min=1, max=8), torch.export.Dim("s", min=1, max=300)
    n, c = torch.export.Dim("n", min=1, max=4), torch.export.Dim("c", min=1, max=200)
    h, w = torch.export.Dim("h", min=1, max=100), torch.export.Dim("w", min=1, max=100)
    sample = (torch.randn(2, 40, 32), torch.randn(1, 33, 5, 40), torch.randn(1, 5, 40, 33))
    options = bladepack.CompileOptions(dump_dir=dump) if dump is not None else None
    return bladepack.optimize(
        _Permutes(),
        [sample],
        ({0: b, 1: s}, {0: n, 1: c, 2: h, 3: w}, {0: n, 1: h, 2: w, 3: c}),
        targets=("cuda:sm_90",),
        dtype=dtype,
        reference_cases=False,
        options=options,
    )


@pytest.fixture(scope="module")
def permutes(dump: Path) -> bladepack.api.Artifact:
    return _optimize(None, dump)


# (b, s) of x and (n, c, h, w) of img: tiles of 32 with partial edges, exactly one, single rows
_SHAPES = [
    ((2, 40), (1, 33, 5, 40)),
    ((1, 32), (2, 32, 1, 32)),
    ((3, 97), (1, 65, 3, 31)),
    ((1, 1), (1, 1, 1, 1)),
    ((8, 300), (4, 200, 2, 70)),
]


def _cases(dtype: Any) -> list[tuple[Any, ...]]:
    rng = np.random.default_rng(0)
    out = []
    for (b, s), (n, c, h, w) in _SHAPES:
        x = rng.standard_normal((b, s, 32), dtype=np.float32).astype(dtype)
        img = rng.standard_normal((n, c, h, w), dtype=np.float32).astype(dtype)
        res = rng.standard_normal((n, h, w, c), dtype=np.float32).astype(dtype)
        out.append((x, img, res))
    return out


def _check(results: list[Any], cases: list[tuple[Any, ...]], tol: float) -> None:
    for args, got in zip(cases, results):
        assert not isinstance(got, str), got
        want = _Permutes()(*(torch.from_numpy(a.astype(np.float32)) for a in args))
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            assert rel_err(np.asarray(g, dtype=np.float32), w.numpy()) < tol


def test_tiled_transposes_match_eager(gpu: FakeGpu, permutes: bladepack.api.Artifact) -> None:
    """Each case runs alone, so its launch log says which variants ran: the NCHW -> NHWC kernel (k1)
    tiles where w and c reach 32, the 2-D transpose (k2) where b x s does, the head split (k0, read
    contiguously along d) never."""
    expected = [("k1_tile", "k2_tile"), ("k1_tile", "k2_tile"), ("k1_w1", "k2_tile"), ("k1_w1", "k2_w1")]
    expected.append(("k1_tile", "k2_tile"))
    cases = _cases(np.float32)
    for case, want in zip(cases, expected):
        _, results, log = gpu.run(permutes, [case], graphs=False)
        _check(results, [case], 1e-6)
        launched = [line.split()[1] for line in log.splitlines() if line.startswith("launch ")]
        assert launched == ["k0_w4", *want], launched
        assert all("block 256 1 1" in line for line in log.splitlines() if "_tile grid" in line)


def test_float16_transposes(gpu: FakeGpu) -> None:
    art = _optimize("float16")
    cases = _cases(np.float16)
    _, results, log = gpu.run(art, cases, graphs=False)
    _check(results, cases, 2e-3)
    assert any("_tile" in line for line in log.splitlines() if line.startswith("launch"))


def test_the_cpp_runtime_runs_them_alike(gpu: FakeGpu, permutes: bladepack.api.Artifact) -> None:
    cases = _cases(np.float32)
    _, py, _ = gpu.run(permutes, cases, graphs=False)
    _, cpp, _ = gpu.run_cpp(permutes, cases)
    for a, b in zip(py, cpp):
        assert not isinstance(b, str), b
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)


def test_tile_kernels_keep_registers(permutes: bladepack.api.Artifact, dump: Path) -> None:
    (src,) = dump.rglob("*.cu")
    tiles = {name: r for name, r in ptxas_reports(src, "sm_90").items() if name.endswith("_tile")}
    assert len(tiles) == 2, sorted(tiles)
    for name, r in tiles.items():
        assert "0 bytes stack frame" in r and "0 bytes spill stores" in r, (name, r)
