"""Mamba's selective scan (SelectiveScanAttrs, Note [Selective scan kernel]): a Hugging Face Mamba
built from a config (random weights, no download) keeps a dynamic sequence length through
torch.export (Note [Selective scans through export]) and matches eager at lengths 1 to 64 on both
executors; the CUDA kernel compiles through nvcc."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bladepack
from bladepack.target import PTX_ARCH

transformers = pytest.importorskip("transformers")


class _Mamba(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        cfg = transformers.MambaConfig(
            vocab_size=100, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, use_cache=False
        )
        self.m = transformers.MambaModel(cfg)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids).last_hidden_state


def _samples() -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 100, (b, s), generator=g),) for b, s in ((2, 7), (3, 11))]


@pytest.fixture(scope="module")
def mamba() -> tuple[torch.nn.Module, bladepack.Artifact]:
    torch.manual_seed(0)
    model = _Mamba().eval()
    return model, bladepack.optimize(model, _samples())


def test_the_scan_is_one_kernel_and_the_length_stays_dynamic(mamba: tuple[torch.nn.Module, bladepack.Artifact]) -> None:
    _, art = mamba
    plan = art.sources.fusion_text("cpu")
    assert plan.count(": selective_scan[") == 2 and "0 reference steps" in plan, plan
    assert "ids_dim1 in [1, inf]" in str(bladepack.load(art.to_bytes()).signature)


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_mamba_matches_eager(mamba: tuple[torch.nn.Module, bladepack.Artifact], executor: str) -> None:
    model, art = mamba
    loaded = bladepack.load(art.to_bytes(), executor=executor)
    g = torch.Generator().manual_seed(2)
    for b, s in [(1, 1), (1, 2), (4, 13), (2, 64)]:
        ids = torch.randint(0, 100, (b, s), generator=g)
        with torch.no_grad():
            want = model(ids).numpy()
        np.testing.assert_allclose(loaded(ids.numpy()), want, rtol=1e-5, atol=2e-6, err_msg=f"batch {b}, length {s}")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc")
def test_the_cuda_selective_scan_compiles(tmp_path: Path) -> None:
    from bladepack.codegen.cuda_toolchain import build_images

    torch.manual_seed(0)
    art = bladepack.optimize(_Mamba().eval(), _samples(), targets=("cuda",), reference_cases=False)
    assert art.sources.fusion_text("cuda").count(": selective_scan[") == 2
    assert build_images(art.sources.unit("cuda"), tmp_path, arches=[PTX_ARCH])


class _Mamba2(torch.nn.Module):
    """Mamba-2's state-space duality (the chunked scan of Hugging Face's torch path: cumsums, segment
    sums, einsums and repeat_interleave over chunks of 8)."""

    def __init__(self) -> None:
        super().__init__()
        cfg = transformers.Mamba2Config(
            vocab_size=100, hidden_size=32, state_size=8, num_hidden_layers=1, head_dim=8, num_heads=8,
            expand=2, n_groups=1, chunk_size=8, use_cache=False,
        )  # fmt: skip
        self.m = transformers.Mamba2Model(cfg)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, use_cache=False).last_hidden_state


def test_mamba2_chunked_scan_matches_eager() -> None:
    """Lengths across chunk boundaries (9, 17, 23, 41) at batch 2 and 3. torch.export cannot prove this
    model at batch or length 1 (its reshapes of the padded chunks add `!= 1` guards even in
    size-oblivious mode), so both ranges start at 2, and its trace holds where the length is padded
    to two chunks or more (guards `8 < len + pad`, `pad > 0`: Note [Input guards]); other lengths are
    refused with those guards."""
    torch.manual_seed(0)
    model = _Mamba2().eval()
    g = torch.Generator().manual_seed(2)
    art = bladepack.optimize(model, [(torch.randint(0, 100, (b, s), generator=g),) for b, s in ((2, 13), (3, 21))])
    assert any("its range starts at 2" in n for n in art.notes), art.notes
    loaded = bladepack.load(art.to_bytes())
    for b, s in [(2, 9), (3, 17), (2, 23), (2, 41)]:
        ids = torch.randint(0, 100, (b, s), generator=g)
        want = model(ids).detach().numpy()
        np.testing.assert_allclose(loaded(ids.numpy()), want, rtol=1e-5, atol=1e-5, err_msg=f"batch {b}, length {s}")
    with pytest.raises(bladepack.ShapeGuardError, match="the allowed range is"):
        loaded(torch.randint(0, 100, (1, 12)).numpy())
    for s in (7, 16):
        with pytest.raises(bladepack.ShapeGuardError, match="torch.export's guard"):
            loaded(torch.randint(0, 100, (2, s)).numpy())
