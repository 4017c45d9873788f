"""Dims that belong together (Note [Related dims] in bladepack/export/related_dims.py): derived dims
declared the torch.export way (`past + 1`, `2 * seq`) or with bladepack.Dim, relations torch's guards
give, relations only the traced graph knows (a mask indexed at the cache's positions), dims that stay
independent, and a declared-dynamic dim the model fixes. Decode steps of Hugging Face GPT-2 and T5 with
their inputs related build, verify in both loaders and match eager at unseen shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.export import Dim as TorchDim

import bladepack
from bladepack.errors import ExportError
from bladepack.export.capture import capture
from bladepack.export.related_dims import Relation, fits, resized
from tests.helpers import check_against_eager
from tests.test_cpp_runtime import bpk_run


def _input_dims(cap: Any) -> dict[str, str]:
    """Each user input's dims as text over bladepack's names ("past+1")."""
    names = {s: info.name for s, info in cap.symbols.items()}
    out = {}
    user = [
        s.arg.name
        for s in cap.program.graph_signature.input_specs
        if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]
    nodes = {n.name: n for n in cap.program.graph.nodes if n.op == "placeholder"}
    for k, u in enumerate(user):
        dims = []
        for d in nodes[u].meta["val"].shape:
            text = str(d)
            for s, n in sorted(names.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(s, n)
            dims.append(text.replace(" ", ""))
        out[cap.input_names[k]] = ",".join(dims)
    return out


# -- pieces


@given(st.lists(st.integers(1, 50), min_size=1, max_size=4), st.integers(1, 4), st.integers(0, 9))
def test_fits_finds_the_relation_every_sample_has(roots: list[int], coeff: int, offset: int) -> None:
    deps = [coeff * r + offset for r in roots]
    found = fits(deps, roots)
    assert found, (deps, roots)
    for c, o in found:
        assert all(d == c * r + o for r, d in zip(roots, deps))
    if len(set(roots)) > 1:
        assert found == [(coeff, offset)]


def test_fits_refuses_what_no_sample_supports() -> None:
    assert fits([5, 9], [2, 3]) == []  # slope 4 but offset -3
    assert fits([3, 4], [5, 7]) == []  # slope 1/2
    assert fits([6, 7], [5, 5]) == []  # one root size, two dependent sizes
    assert fits([4], [5]) == []  # smaller than the root: the other dim is the root


def test_resized_keeps_values_and_relation_text() -> None:
    t = torch.arange(6).reshape(2, 3)
    grown = resized((t,), {(0, 1): 5})[0]
    assert grown.tolist() == [[0, 1, 2, 2, 2], [3, 4, 5, 5, 5]]
    assert resized((t,), {(0, 0): 1})[0].tolist() == [[0, 1, 2]]
    assert Relation("s", 1, 1).text("past") == "past + 1"
    assert Relation("s", 2, 0).text("seq") == "2*seq"
    assert (bladepack.Dim("past") + 1).name == "past + 1"
    assert (2 * bladepack.Dim("seq", 1, 8) - 1).name == "2*seq - 1"
    assert (2 * bladepack.Dim("seq", 1, 8)).max == 16
    with pytest.raises(TypeError, match="a Dim \\+ an integer"):
        bladepack.Dim("past") + 1.5  # type: ignore[operator]


# -- models


class CachedStep(nn.Module):
    """One decode step: the new key joins the cache (a cat torch guards on), a mask of the cache's
    length + 1 is read at the positions 0 .. past (no guard: only the traced graph needs the length)."""

    def forward(self, q: torch.Tensor, past: torch.Tensor, new: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([past, new], dim=1)  # [b, past + 1, d]
        scores = torch.einsum("bd,btd->bt", q, keys)
        pos = torch.arange(keys.shape[1])
        return torch.softmax(scores + mask[:, pos], dim=-1)


def _step_sample(b: int, past: int, d: int = 4) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(b * 100 + past)
    return (
        torch.randn(b, d, generator=g),
        torch.randn(b, past, d, generator=g),
        torch.randn(b, 1, d, generator=g),
        torch.randn(b, past + 1, generator=g),
    )


def test_a_mask_read_at_the_caches_positions_is_related_by_the_traced_graph() -> None:
    cap = capture(CachedStep(), [_step_sample(2, 5), _step_sample(3, 7)])
    dims = _input_dims(cap)
    assert dims["mask"] == "q_dim0,past_dim1+1", dims
    assert dims["new"] == "q_dim0,1,4"
    assert any(n.startswith("related dims, made one: mask_dim1 = past_dim1 + 1") for n in cap.notes), cap.notes


@pytest.mark.parametrize("kind", ["torch", "bladepack"])
def test_derived_dims_declared_in_dynamic_shapes(kind: str) -> None:
    if kind == "torch":
        batch, past = TorchDim("batch", min=1, max=16), TorchDim("past", min=1, max=100)
    else:
        batch, past = bladepack.Dim("batch", 1, 16), bladepack.Dim("past", 1, 100)
    shapes = ({0: batch}, {0: batch, 1: past}, {0: batch}, {0: batch, 1: past + 1})
    cap = capture(CachedStep(), [_step_sample(2, 5)], shapes)
    assert _input_dims(cap)["mask"] == "batch,past+1"
    assert not any("related dims" in n for n in cap.notes)  # declared, not inferred
    info = next(i for i in cap.symbols.values() if i.name == "past")
    assert (info.min, info.max) == (1, 100)


class Upsampled(nn.Module):
    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(x, 2, dim=1) + skip


def test_a_multiple_declared_and_found() -> None:
    seq = bladepack.Dim("seq", 1, 32)
    cap = capture(Upsampled(), [(torch.randn(2, 5), torch.randn(2, 10))], ({1: seq}, {1: 2 * seq}))
    assert _input_dims(cap)["skip"] == "2,2*seq"  # the batch: one size, not declared
    found = capture(Upsampled(), [(torch.randn(2, 5), torch.randn(2, 10)), (torch.randn(3, 7), torch.randn(3, 14))])
    assert _input_dims(found)["skip"] == "x_dim0,2*x_dim1", found.notes


class Independent(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.sum(1, keepdim=True) * b.mean()


def test_dims_that_only_happen_to_fit_stay_independent() -> None:
    """batch 2, 3 and length 5, 7 fit length = 2 * batch + 1, but the model does not need it."""
    cap = capture(Independent(), [(torch.randn(2, 3), torch.randn(5)), (torch.randn(3, 3), torch.randn(7))])
    assert _input_dims(cap) == {"a": "a_dim0,3", "b": "b_dim0"}
    assert not cap.notes


def test_declared_relations_that_the_samples_or_the_model_break() -> None:
    past = bladepack.Dim("past", 1, 100)
    shapes = (None, {1: past}, None, {1: past + 2})
    with pytest.raises(
        ExportError, match=r"sample 0: input 'mask' dimension 1 is 6, but dynamic_shapes declares it past \+ 2 = 7"
    ):
        capture(CachedStep(), [_step_sample(2, 5)], shapes)
    with pytest.raises(ExportError, match=r"'mask' dimension 1 is past \+ 1, but no input dimension is past itself"):
        capture(CachedStep(), [_step_sample(2, 5)], (None, None, None, {1: past + 1}))

    class Doubled(nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.cat([a, a]) + b

    n = bladepack.Dim("n", 1, 64)  # at n = 5, 2 * n is n + 5: the samples allow both
    with pytest.raises(ExportError, match=r"declares input 'b' dimension 0 n \+ 5, but the model makes it 2\*n"):
        capture(Doubled(), [(torch.randn(5), torch.randn(10))], ({0: n}, {0: n + 5}))


class FixesSeq(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(x.shape[0], 16, -1) * 2  # fixes dim 1


def test_a_declared_dynamic_dim_the_model_fixes_names_the_line() -> None:
    shapes = ({0: bladepack.Dim("batch", 1, 64), 1: bladepack.Dim("seq", 1, 64)},)
    with pytest.raises(ExportError) as e:
        capture(FixesSeq(), [(torch.randn(2, 16, 3),)], shapes)
    text = str(e.value)
    assert "input 'x' dimension 1 is declared dynamic (seq in [1, 64]), but the model fixes it to 16" in text
    assert "at test_related_dims.py:" in text and "x.reshape(x.shape[0], 16, -1)" in text, text
    auto = ({0: bladepack.Dim("batch", 1, 64), 1: TorchDim.AUTO},)
    cap = capture(FixesSeq(), [(torch.randn(2, 16, 3),)], auto)  # AUTO lets the export decide
    assert _input_dims(cap)["x"] == "batch,16,3"


def test_the_cached_step_builds_verifies_and_matches_eager(release: Path, tmp_path: Path) -> None:
    model = CachedStep()
    art = bladepack.optimize(model, [_step_sample(2, 5), _step_sample(3, 7)])
    path = tmp_path / "step.bpk"
    art.save(path)
    loaded = bladepack.load(path)
    assert "mask: float32[q_dim0, past_dim1+1]" in str(loaded.signature)
    report = loaded.verify()
    assert report["passed"] and len(report["cases"]) >= 2, report  # at least the two range ends
    r = bpk_run(release, str(path), "--verify")
    assert r.returncode == 0 and "verify: passed" in r.stdout, r.stdout + r.stderr
    for b, past in [(1, 1), (1, 2), (4, 1), (5, 33), (2, 64)]:
        check_against_eager(model, loaded, _step_sample(b, past))
    with pytest.raises(bladepack.InputError, match=r"input 'mask' dimension 1 is 5, but it must be past_dim1\+1 = 6"):
        loaded(*_step_sample(2, 5)[:3], torch.randn(2, 5))


# -- Hugging Face decode steps

transformers = pytest.importorskip("transformers")


class Gpt2Step(nn.Module):
    """A GPT-2 decode step with the KV cache as inputs (transformers' cache object is built inside)."""

    def __init__(self) -> None:
        super().__init__()
        config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=128)
        self.model = transformers.GPT2Model(config).eval()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, *kv: torch.Tensor) -> torch.Tensor:
        cache = transformers.DynamicCache()
        for layer in range(2):
            cache.update(kv[2 * layer], kv[2 * layer + 1], layer)
        return self.model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=False).last_hidden_state


def _gpt2_sample(b: int, past: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(b * 1000 + past)
    ids = torch.randint(0, 100, (b, 1), generator=g)
    return (
        ids,
        torch.ones(b, past + 1, dtype=torch.int64),
        *(torch.randn(b, 4, past, 16, generator=g) for _ in range(4)),
    )


def _verified(art: bladepack.api.Artifact, release: Path, path: Path) -> bladepack.LoadedModule:
    art.save(path)
    loaded = bladepack.load(path)
    report = loaded.verify()
    assert report["passed"], report
    r = bpk_run(release, str(path), "--verify")
    assert r.returncode == 0 and "verify: passed" in r.stdout, r.stdout + r.stderr
    return loaded


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_gpt2_step_relates_the_mask_and_the_cache(release: Path, tmp_path: Path) -> None:
    model = Gpt2Step()
    art = bladepack.optimize(model, [_gpt2_sample(2, 5), _gpt2_sample(3, 7)])
    assert any("mask_dim1 = input2_dim2 + 1" in n for n in art.notes), art.notes
    loaded = _verified(art, release, tmp_path / "gpt2.bpk")
    for b, past in [(1, 1), (2, 9), (4, 30)]:
        check_against_eager(model, loaded, _gpt2_sample(b, past), tol=1e-4)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_gpt2_step_with_the_relation_declared(release: Path, tmp_path: Path) -> None:
    batch, past = TorchDim("batch", min=1, max=8), TorchDim("past", min=1, max=100)
    kv = {0: batch, 2: past}
    shapes = ({0: batch}, {0: batch, 1: past + 1}, kv, kv, kv, kv)
    model = Gpt2Step()
    art = bladepack.optimize(model, [_gpt2_sample(2, 5)], dynamic_shapes=shapes)
    loaded = _verified(art, release, tmp_path / "gpt2.bpk")
    assert "mask: int64[batch, past+1]" in str(loaded.signature), loaded.signature
    check_against_eager(model, loaded, _gpt2_sample(3, 100), tol=1e-4)


class T5DecoderStep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        config = transformers.T5Config(
            vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4
        )
        self.decoder = transformers.T5Model(config).eval().decoder

    def forward(self, ids: torch.Tensor, enc: torch.Tensor, enc_mask: torch.Tensor) -> torch.Tensor:
        out = self.decoder(input_ids=ids, encoder_hidden_states=enc, encoder_attention_mask=enc_mask, use_cache=False)
        return out.last_hidden_state


def _t5_sample(b: int, q: int, s: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(b * 10000 + q * 100 + s)
    mask = torch.ones(b, s, dtype=torch.int64)
    mask[0, s // 2 :] = 0  # one row padded
    return torch.randint(0, 100, (b, q), generator=g), torch.randn(b, s, 32, generator=g), mask


@pytest.mark.slow
def test_t5_decoder_step_relates_the_encoder_mask_and_the_batch(release: Path, tmp_path: Path) -> None:
    model = T5DecoderStep()
    art = bladepack.optimize(model, [_t5_sample(2, 3, 5), _t5_sample(3, 4, 7)])
    assert any("enc_mask_dim0 = ids_dim0" in n for n in art.notes), art.notes
    loaded = _verified(art, release, tmp_path / "t5.bpk")
    assert "enc_mask: int64[ids_dim0, enc_dim1]" in str(loaded.signature), loaded.signature
    for b, q, s in [(1, 1, 1), (4, 2, 9), (2, 6, 3)]:
        check_against_eager(model, loaded, _t5_sample(b, q, s), tol=1e-4)
