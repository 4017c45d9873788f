"""Mamba's selective scan (SelectiveScanAttrs, Note [Selective scan kernel]): a Hugging Face Mamba
and a Mamba-2 (one and two groups) built from configs (random weights, no download) keep a dynamic
batch and sequence length through torch.export (Note [Selective scans through export], Note [Mamba-2
as a selective scan]) and match eager at batch 1 and lengths 1 to 64 on both executors; the CUDA
kernels compile through nvcc."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bladepack
from bladepack.target import PTX_ARCH
from tests.helpers import narrowed

transformers = pytest.importorskip("transformers")


def _matches_eager(
    model: torch.nn.Module, loaded: bladepack.LoadedModule, shapes: list[tuple[int, int]], seed: int, atol: float
) -> None:
    """The loaded artifact against eager on random token ids of each (batch, length)."""
    g = torch.Generator().manual_seed(seed)
    for b, s in shapes:
        ids = torch.randint(0, 100, (b, s), generator=g)
        with torch.no_grad():
            want = model(ids).numpy()
        np.testing.assert_allclose(loaded(ids.numpy()), want, rtol=1e-5, atol=atol, err_msg=f"batch {b}, length {s}")


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
    _matches_eager(
        model, bladepack.load(art.to_bytes(), executor=executor), [(1, 1), (1, 2), (4, 13), (2, 64)], 2, 2e-6
    )


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc")
def test_the_cuda_selective_scan_compiles(tmp_path: Path) -> None:
    from bladepack.codegen.cuda_toolchain import build_images

    torch.manual_seed(0)
    art = bladepack.optimize(_Mamba().eval(), _samples(), targets=("cuda",), reference_cases=False)
    assert art.sources.fusion_text("cuda").count(": selective_scan[") == 2
    assert build_images(art.sources.unit("cuda"), tmp_path, arches=[PTX_ARCH])


class _Mamba2(torch.nn.Module):
    """Mamba-2 (Hugging Face's Mamba2Model from a config): its chunked state-space-duality scan exports as
    one grouped selective scan (Note [Mamba-2 as a selective scan])."""

    def __init__(self, groups: int) -> None:
        super().__init__()
        # one group: 2 heads of 96 channels with a state of 128, so a CPU row holds 48 channels (half a
        # head, four at a time: Note [Selective scan kernel]); two groups: 8 heads of 6, rows of a
        # whole head, two channels at a time
        width = dict(hidden_size=96, state_size=128, head_dim=96, num_heads=2) if groups == 1 else {}
        cfg = transformers.Mamba2Config(**{
            **dict(hidden_size=24, state_size=8, head_dim=6, num_heads=8), **width,
            "vocab_size": 100, "num_hidden_layers": 2, "expand": 2, "n_groups": groups, "chunk_size": 8,
            "use_cache": False,
        })  # fmt: skip
        self.m = transformers.Mamba2Model(cfg)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, use_cache=False).last_hidden_state


def _narrowed(art: bladepack.Artifact, b: int, s: int) -> bool:
    return narrowed(art, {"ids_dim0": b, "ids_dim1": s})


@pytest.fixture(scope="module", params=[1, 2], ids=["one-group", "two-groups"])
def mamba2(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, bladepack.Artifact]:
    torch.manual_seed(request.param)
    model = _Mamba2(request.param).eval()
    g = torch.Generator().manual_seed(3)
    samples = [(torch.randint(0, 100, (b, s), generator=g),) for b, s in ((2, 13), (3, 21))]
    return model, bladepack.optimize(model, samples)


def test_mamba2_scan_is_one_kernel_at_any_batch_and_length(mamba2: tuple[torch.nn.Module, bladepack.Artifact]) -> None:
    """The chunks are gone (no cumsum, no padding to the chunk size), so torch.export no longer guards
    the batch or the length: both ranges start at 1."""
    _, art = mamba2
    plan = art.sources.fusion_text("cpu")
    assert plan.count(": selective_scan[") == 2 and "cumsum" not in plan, plan
    # a torch before 2.13 keeps transformers' `seq_len != 1` guard (Note [Two exports]): a note says so
    first = 2 if narrowed(art, {"ids_dim1": 1}) else 1
    assert not art.notes or first == 2, art.notes
    signature = str(bladepack.load(art.to_bytes()).signature)
    assert "ids_dim0 in [1, " in signature and f"ids_dim1 in [{first}, inf]" in signature, signature


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_mamba2_matches_eager(mamba2: tuple[torch.nn.Module, bladepack.Artifact], executor: str) -> None:
    """Batch 1, lengths within one chunk, at a chunk's end and across several chunks, against the
    chunked computation of Hugging Face's torch path."""
    model, art = mamba2
    shapes = [(b, s) for b, s in [(1, 1), (1, 7), (1, 16), (3, 17), (2, 41), (1, 64)] if not _narrowed(art, b, s)]
    _matches_eager(model, bladepack.load(art.to_bytes(), executor=executor), shapes, 4, 5e-6)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc")
def test_the_cuda_grouped_scan_compiles(tmp_path: Path) -> None:
    from bladepack.codegen.cuda_toolchain import build_images

    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 13))
    art = bladepack.optimize(_Mamba2(2).eval(), [(ids,)], targets=("cuda",), reference_cases=False)
    assert art.sources.fusion_text("cuda").count(": selective_scan[") == 2
    assert build_images(art.sources.unit("cuda"), tmp_path, arches=[PTX_ARCH])


def _hybrid(name: str) -> torch.nn.Module:
    """Bamba (Mamba-2 mixers and attention layers; heads of 5 channels, one at a time in a CPU row) and
    Zamba2 (Mamba-2 mixers and a shared attention block fed the concatenated original embeddings) and
    NemotronH (Mamba-2, attention and squared-ReLU MLP layers) from configs."""
    if name == "bamba":
        cfg = transformers.BambaConfig(
            vocab_size=100, hidden_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, mamba_n_heads=16, mamba_d_head=5, mamba_n_groups=2, mamba_d_state=8,
            mamba_chunk_size=8, mamba_expand=2, attn_layer_indices=[1], use_cache=False,
        )  # fmt: skip
        return transformers.BambaModel(cfg)
    if name == "nemotron_h":
        cfg = transformers.NemotronHConfig(
            vocab_size=100, hidden_size=32, layers_block_type=["mamba", "attention", "mlp"], num_attention_heads=4,
            num_key_value_heads=2, head_dim=8, intermediate_size=64, ssm_state_size=8, mamba_num_heads=8,
            mamba_head_dim=8, n_groups=2, chunk_size=8, expand=2, use_cache=False,
        )  # fmt: skip
        return transformers.NemotronHModel(cfg)
    cfg = transformers.Zamba2Config(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, attention_head_dim=8,
        intermediate_size=64, mamba_d_state=8, mamba_headdim=8, mamba_ngroups=1, n_mamba_heads=8, chunk_size=8,
        layers_block_type=["mamba", "hybrid"], num_mem_blocks=1, use_cache=False,
    )  # fmt: skip
    return transformers.Zamba2Model(cfg)


class _Hidden(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.m(input_ids=ids, use_cache=False).last_hidden_state


@pytest.mark.parametrize("name", ["bamba", "zamba2", "nemotron_h"])
def test_mamba2_hybrids_match_eager(name: str) -> None:
    """Hybrids whose Mamba-2 mixers have their own copy of the chunked scan keep both dims dynamic and
    match eager at batch 1 and unseen lengths."""
    torch.manual_seed(0)
    model = _Hidden(_hybrid(name)).eval()
    g = torch.Generator().manual_seed(5)
    art = bladepack.optimize(model, [(torch.randint(0, 100, (b, s), generator=g),) for b, s in ((2, 13), (3, 21))])
    assert ": selective_scan[" in art.sources.fusion_text("cpu")
    shapes = [(b, s) for b, s in [(1, 1), (1, 16), (2, 29)] if not _narrowed(art, b, s)]
    _matches_eager(model, bladepack.load(art.to_bytes()), shapes, 6, 5e-6)
