"""Packed execution (Note [Packed sequences] in bladepack/passes/pack_sequences.py): several sequences of
different lengths in one call without padding, checked against each sequence run alone in torch eager.

The packed plan is the model's graph over the concatenated tokens with each attention restricted to the
query's own sequence and positions counted per sequence; the CPU attention kernel walks only each
query block's own keys (Note [Key bounds] in library_ops/cpu_attention.py), which a sliding-window
model written with the same mask exercises too."""

from __future__ import annotations

import math
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import bladepack
from bladepack.errors import CompileError, InputError
from bladepack.export import capture, to_program
from bladepack.inspect import inspect_text, manifest_summary
from bladepack.ir import print_graph
from bladepack.passes.pack_sequences import NotPackable, pack_sequences
from tests import test_padding as padding_tests
from tests.helpers import OLD_TORCH, narrowed

transformers = pytest.importorskip("transformers")

SEQ_MAX = 32
LENGTHS = (1, 7, SEQ_MAX, 2, 13, 1, 9)  # 1, odd, the range's end, several in one call
DIMS = {n: {0: bladepack.Dim("batch", 1, 8), 1: bladepack.Dim("seq", 1, SEQ_MAX)} for n in ("ids", "mask")}


_text = padding_tests._text(96)  # (rows, length) -> token ids in [3, 96) and a mask of ones
_hf = padding_tests._hf  # a transformers model of the padding proof's tests, returning its hidden states


def _packed_inputs(reqs: list[tuple[torch.Tensor, ...]]) -> list[np.ndarray]:
    return [torch.cat([r[k] for r in reqs], 1).numpy() for k in range(len(reqs[0]))]


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.pos_emb = nn.Embedding(16, 4)
        self.register_buffer("pos", torch.arange(16)[None])

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids) + self.pos_emb(self.pos[:, : ids.shape[1]])
        scores = h @ h.transpose(1, 2) + (1.0 - mask[:, None, :]) * torch.finfo(torch.float32).min
        return torch.softmax(scores, -1) @ h


def test_pack_sequences_golden() -> None:
    """Note [Packed sequences]: rows 1 and seq the token count; the two bound inputs; the buffer of
    position ids taken at each token's position in its sequence (t - start); the scores outside each
    query's own sequence -inf before the softmax; the product with the values unchanged."""
    torch.manual_seed(0)
    dims = {n: {0: bladepack.Dim("batch", 1, 4), 1: bladepack.Dim("seq", 1, 16)} for n in ("ids", "mask")}
    samples = [(torch.randint(0, 10, (b, t)), torch.ones(b, t)) for b, t in ((2, 5), (3, 7))]
    packed = pack_sequences(to_program(capture(_Tiny().eval(), samples, dims)))
    q = packed.program
    assert (packed.symbol, packed.rows, packed.tokens) == ("seq", "batch", "tokens")
    assert print_graph(q.graph, q.shape_env) == textwrap.dedent("""\
        symbols { tokens: [1, 64] }
        graph(%0 ids: i64[1, tokens], %1 mask: f32[1, tokens], %2 sequence_starts: i64[tokens], %3 sequence_ends: i64[tokens]) weights(%4 emb.weight: f32[10, 4], %5 pos_emb.weight: f32[16, 4], %6 pos: i64[1, 16]) {
          %7: f32[1, tokens, 4] = take(%4, %0) {axis=0, wrap=False}
          %8: i64[tokens] = arange() {start=0, step=1}
          %9: i64[tokens] = sub(%8, %2)
          %10: i64[1, tokens] = take(%6, %9) {axis=1}
          %11: f32[1, tokens, 4] = take(%5, %10) {axis=0, wrap=False}
          %12: f32[1, tokens, 4] = add(%7, %11)
          %13: f32[1, 4, tokens] = permute(%12) {perm=(0, 2, 1)}
          %14: f32[1, tokens, tokens] = matmul(%12, %13) {transpose_b=False}
          %15: f32[1, 1, tokens] = reshape(%1)
          %16: f32[] = constant() {value=1.0}
          %17: f32[1, 1, tokens] = sub(%16, %15)
          %18: f32[] = constant() {value=-3.4028234663852886e+38}
          %19: f32[1, 1, tokens] = mul(%17, %18)
          %20: f32[1, tokens, tokens] = add(%14, %19)
          %21: i64[tokens] = arange() {start=0, step=1}
          %22: i64[1, 1, tokens] = reshape(%21)
          %23: i64[1, tokens, 1] = reshape(%2)
          %24: bool[1, tokens, tokens] = ge(%22, %23)
          %25: i64[1, tokens, 1] = reshape(%3)
          %26: bool[1, tokens, tokens] = lt(%22, %25)
          %27: bool[1, tokens, tokens] = logical_and(%24, %26)
          %28: f32[] = constant() {value=-inf}
          %29: f32[1, tokens, tokens] = where(%27, %20, %28)
          %30: f32[1, tokens, tokens] = softmax(%29) {axis=2}
          %31: f32[1, tokens, 4] = matmul(%30, %12) {transpose_b=False}
          return %31
        }
        """)


def _check(m: bladepack.LoadedModule, model: nn.Module, lengths: tuple[int, ...], make: Any = _text) -> None:
    torch.manual_seed(1)
    reqs = [make(1, n) for n in lengths]
    (out,) = m.run_packed(_packed_inputs(reqs), list(lengths))
    assert out.shape[:2] == (1, sum(lengths))
    with torch.no_grad():
        for piece, r in zip(np.split(out, np.cumsum(lengths)[:-1], axis=1), reqs):
            np.testing.assert_allclose(piece, model(*r).numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["bert", "roberta", "distilbert", "llama", "qwen2"])
def test_hugging_face_models_packed_match_each_sequence_alone(name: str) -> None:
    """The padding proof's acceptance models, optimized with packed=True: the sequences of one call
    (lengths 1 .. the range's end, repeated, in any order) each equal eager run on that sequence alone;
    RoBERTa's position ids (a cumulative sum of the mask) restart per sequence, LLaMA's and Qwen2's
    rotary angles and causal masks count within it."""
    torch.manual_seed(0)
    model = _hf(name)
    art = bladepack.optimize(model, [_text(2, 5), _text(3, 9)], DIMS, packed=True)
    # a torch before 2.13 may narrow the batch to start at 2 (optimize says so): a sequence alone is then
    # two copies of it, in the self-check and the loader's checks (rows_min)
    assert art.packed is not None and (not art.notes or (OLD_TORCH and narrowed(art, {"batch": 1}))), art.notes
    m = bladepack.load(art.to_bytes())
    assert m.packed is not None and m.packed["inputs"] == {"ids": [0, 1], "mask": [0, 1]}
    # ... and the length at 2 (a length of 1 is then refused, packed or not)
    least = 2 if narrowed(art, {"seq": 1}) else 1
    _check(m, model, tuple(max(n, least) for n in LENGTHS))
    _check(m, model, (SEQ_MAX,) * 8)  # the token range's end: 8 rows of the longest
    if name == "bert":  # the packed plan on the reference executor, and the artifact's own plan unchanged
        _check(bladepack.load(art.to_bytes(), executor="reference"), model, (5, 1, 12))
        ids, mask = _text(3, 11)
        with torch.no_grad():
            np.testing.assert_allclose(m(ids.numpy(), mask.numpy()), model(ids, mask).numpy(), rtol=1e-5, atol=1e-5)


def test_a_mask_with_zeros_inside_a_sequence_is_that_sequences_own() -> None:
    """A sequence's own mask values travel with its tokens (left padding inside a request stays masked)."""
    torch.manual_seed(0)
    model = _hf("bert")
    art = bladepack.optimize(model, [_text(2, 5), _text(3, 9)], DIMS, packed=True, reference_cases=False)
    m = bladepack.load(art.to_bytes())

    def make(b: int, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = _text(b, t)
        mask[:, : t // 3] = 0
        mask[:, -1] = 1
        return ids, mask

    _check(m, model, (4, 9, 1, 17), make)


class _Pooled(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.emb = nn.Embedding(96, 16)
        self.mode = mode

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids) * mask[..., None]
        if self.mode == "sum":
            return h + h.sum(1, keepdim=True)  # a masked sum over the sequence: paddable, not packable
        if self.mode == "first two":
            return h[:, :2] * 2  # two positions of each sequence
        if self.mode == "first to all":
            return h + h[:, :1]  # each sequence's first token added to its every token
        if self.mode == "gram":
            return h @ (h.transpose(1, 2) @ h)  # a product summed over the sequence's (zeroed) tokens
        return h + torch.cumsum(h, 1)  # a float running sum


@pytest.mark.parametrize(
    "model, reason",
    [
        (lambda: _Pooled("first two"), "it reads 2 positions of each sequence"),  # (sequences of 2 or more)
        (lambda: _Pooled("first to all"), "it combines values of one row per sequence with the tokens' values"),
        (
            lambda: _Pooled("sum"),
            "it runs sum along the sequence: in a packed batch it would mix the sequences' tokens",
        ),
        (lambda: _Pooled("cumsum"), "it runs cumsum along the sequence"),
        (lambda: _Pooled("gram"), "it contracts over the sequence outside attention"),
    ],
)
def test_models_without_a_packed_form_are_refused_with_the_op(model: Any, reason: str) -> None:
    """Two positions of each sequence, its first token added back to its tokens, a masked sum over the
    sequence, a float running sum, a product contracting the sequence outside attention: each has a
    padding proof but no packed form, and optimize(packed=True) says which op stops it."""
    torch.manual_seed(0)
    net = model().eval()
    dims = {n: {0: bladepack.Dim("batch", 1, 8), 1: bladepack.Dim("seq", 2, SEQ_MAX)} for n in ("ids", "mask")}
    cap = capture(net, [_text(2, 5), _text(3, 9)], dims)
    with pytest.raises(NotPackable) as e:
        pack_sequences(to_program(cap))
    assert reason in str(e.value), str(e.value)
    with pytest.raises(CompileError, match="packed=True: this model has no packed form"):
        bladepack.optimize(net, [_text(2, 5), _text(3, 9)], dims, packed=True, reference_cases=False)


def _bpk_run(
    build: Path, path: Path, arrays: list[np.ndarray], lengths: list[int], tmp: Path
) -> subprocess.CompletedProcess[str]:
    """bpk-run --lengths on the packed inputs `arrays` (ids, mask); its outputs land in `tmp`."""
    args = []
    for name, x in zip(("ids", "mask"), arrays):
        np.save(tmp / f"{name}.npy", x)
        args += ["--input", f"{name}={tmp / name}.npy"]
    cmd = [str(build / "bpk-run"), str(path), *args, "--output-dir", str(tmp), "--lengths", ",".join(map(str, lengths))]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


class _Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        tf: Any = transformers
        self.m = tf.BertForSequenceClassification(
            tf.BertConfig(
                vocab_size=96,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=96,
                num_labels=3,
            )
        ).eval()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.m.bert(input_ids=ids, attention_mask=mask)
        return self.m.classifier(out.pooler_output), out.last_hidden_state


@pytest.fixture(scope="module")
def classifier() -> tuple[Any, nn.Module]:
    """BertForSequenceClassification's logits (one row per sequence) and hidden states, packed=True."""
    torch.manual_seed(0)
    model = _Classifier().eval()
    return bladepack.optimize(model, [_text(2, 5), _text(3, 9)], DIMS, packed=True), model


def test_a_classifier_head_gives_one_row_per_sequence(
    classifier: tuple[Any, nn.Module], release: Path, tmp_path: Path
) -> None:
    """Note [Packed sequences]: BERT's pooler reads each sequence's first token, so its logits come back
    one row per sequence (output axis -1) beside the tokens' hidden states; against eager per sequence,
    in both loaders (bpk-run --lengths), and merged by a server."""
    from bladepack.serving.batching import BatchLayout, run_requests

    art, model = classifier
    assert not art.notes, art.notes
    path = tmp_path / "cls.bpk"
    art.save(path)
    m = bladepack.load(path)
    assert m.packed is not None and m.packed["outputs"] == {"output0": [0, -1], "output1": [0, 1]}
    assert m.packed["firsts"] == "sequence_firsts"
    lengths = (1, 7, SEQ_MAX, 2, 13)
    reqs = [_text(1, n) for n in lengths]
    arrays = _packed_inputs(reqs)
    logits, hidden = m.run_packed(arrays, list(lengths))
    assert logits.shape == (len(lengths), 3) and hidden.shape == (1, sum(lengths), 64)
    with torch.no_grad():
        for i, (n, r) in enumerate(zip(lengths, reqs)):
            wl, wh = model(*r)
            np.testing.assert_allclose(logits[i : i + 1], wl.numpy(), rtol=1e-5, atol=1e-5)
            at = sum(lengths[:i])
            np.testing.assert_allclose(hidden[:, at : at + n], wh.numpy(), rtol=1e-5, atol=1e-5)
    r = _bpk_run(release, path, arrays, list(lengths), tmp_path)
    assert r.returncode == 0, r.stderr
    assert np.abs(np.load(tmp_path / "output0.npy") - logits).max() <= 1e-6
    layout = BatchLayout.from_manifest(m.manifest, True, 1.0, packed=True)
    requests = [[x.numpy() for x in _text(b, n)] for b, n in [(2, 4), (1, 9), (1, 1)]]
    for req, got in zip(requests, run_requests(layout, m.run, requests, m.run_packed)):
        assert not isinstance(got, Exception)
        for g, w in zip(got, m.run(req)):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def distil() -> tuple[Any, nn.Module]:
    """A DistilBERT optimized with packed=True, and the model."""
    torch.manual_seed(0)
    model = _hf("distilbert")
    return bladepack.optimize(model, [_text(2, 5), _text(3, 9)], DIMS, packed=True, reference_cases=False), model


def test_run_packed_errors_name_what_is_wrong(distil: tuple[Any, nn.Module]) -> None:
    art, model = distil
    m = bladepack.load(art.to_bytes())
    ids, mask = _packed_inputs([_text(1, 5), _text(1, 40)])
    with pytest.raises(InputError, match=r"a sequence of length 40: input 'ids' dimension 1 \(symbol 'seq'\) is 40"):
        m.run_packed([ids, mask], [5, 40])
    with pytest.raises(InputError, match="axis 1 the sum of the lengths, 44"):
        m.run_packed([ids, mask], [5, 39])
    with pytest.raises(InputError, match="lengths must be whole numbers >= 0"):
        m.run_packed([ids, mask], [50, -5])
    with pytest.raises(InputError, match="run_packed takes 2 inputs"):
        m.run_packed([ids], [45])
    with pytest.raises(InputError, match="axis 0 \\(the rows\\) must be 1"):
        m.run_packed([np.concatenate([ids, ids]), np.concatenate([mask, mask])], [5, 40])
    plain = bladepack.optimize(model, [_text(2, 5), _text(3, 9)], DIMS, reference_cases=False)
    with pytest.raises(ValueError, match="has no packed form: optimize the model with packed=True"):
        bladepack.load(plain.to_bytes()).run_packed([ids, mask], [5, 40])
    # bladepack extend rebuilds the packed form with the plan: a sequence of 40 is in the new range
    from bladepack.extend import extend

    wider = bladepack.load(extend(art.to_bytes(), ranges={"seq": (1, 48)}).to_bytes())
    assert wider.packed is not None
    _check(wider, model, (5, 40, 1))
    summary = manifest_summary(bladepack.load(art.to_bytes()).manifest)
    assert summary["packed"]["tokens"] == {"min": 1, "max": 8 * SEQ_MAX}
    assert "packed form: sequences along seq concatenated (batch 1), [1, 256] tokens" in inspect_text(summary)


class _Window(nn.Module):
    """Sliding-window attention written with the mask Note [Key bounds] reads: key k is seen by query
    q when q - W < k <= q (bounds from the query's position, broadcast along the keys)."""

    def __init__(self, window: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(96, 32)
        self.qkv = nn.Linear(32, 96)
        self.window = window

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, s = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, s, 3, 2, 16).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / 4
        pos = torch.arange(s)
        lo, hi = (pos - self.window + 1)[:, None], (pos + 1)[:, None]
        keys = torch.arange(s)
        inside = (keys >= lo) & (keys < hi)
        p = torch.softmax(torch.where(inside, scores, -math.inf), -1)
        return (p @ v).transpose(1, 2).reshape(b, s, 32) * mask[..., None]


def test_key_bounds_walk_only_each_blocks_keys_and_stay_exact() -> None:
    """Note [Key bounds]: a window of 5 keys, query blocks of 1 .. 64 rows (every attention variant),
    against eager; and the generated attention kernel walks the bounded keys."""
    torch.manual_seed(0)
    model = _Window(5).eval()
    dims = {n: {0: bladepack.Dim("batch", 1, 4), 1: bladepack.Dim("seq", 1, 200)} for n in ("ids", "mask")}
    art = bladepack.optimize(model, [_text(2, 5), _text(1, 9)], dims, reference_cases=False)
    assert "klo_" in art.sources.units["cpu"].unit, "the window's bounds were not read"
    m = bladepack.load(art.to_bytes())
    with torch.no_grad():
        for b, s in [(1, 1), (2, 3), (1, 4), (3, 17), (1, 64), (2, 130), (1, 200)]:
            ids, mask = _text(b, s)
            np.testing.assert_allclose(m(ids.numpy(), mask.numpy()), model(ids, mask).numpy(), rtol=1e-5, atol=1e-5)


def test_the_packed_self_check_catches_a_wrong_packed_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note [Packed self-check]: a packed plan whose results differ from the unpacked plan's fails
    optimize (here: the loader's packed call made to return shifted results)."""
    from bladepack.loader.packed import PackedRunner

    run = PackedRunner.run
    monkeypatch.setattr(PackedRunner, "run", lambda self, xs, n: [o + 1e-2 for o in run(self, xs, n)])
    torch.manual_seed(0)
    model = _hf("distilbert")
    with pytest.raises(CompileError, match="the packed form differs from the unpacked plan"):
        bladepack.optimize(model, [_text(2, 5), _text(3, 9)], DIMS, packed=True, reference_cases=False)


def test_servers_merge_requests_of_any_lengths_packed(distil: tuple[Any, nn.Module]) -> None:
    """Note [Packed merging]: on a CPU instance, requests of different lengths (and several rows each)
    merge into packed calls, each getting its own rows back as its own call gives them; a request
    above the range gets its own error; the Triton config lets the batcher hand them over together."""
    from bladepack.serving.batching import BatchLayout, run_requests
    from bladepack.serving.triton_config import TritonModelConfig

    art, _ = distil
    m = bladepack.load(art.to_bytes())
    layout = BatchLayout.from_manifest(m.manifest, True, 1.0, packed=True)
    assert layout.packed is not None and layout.packed.tokens == 8 * SEQ_MAX
    reqs = [[x.numpy() for x in _text(b, n)] for b, n in [(1, 1), (2, 7), (1, SEQ_MAX), (1, 40), (3, 5), (1, 7)]]
    calls: list[list[int]] = []

    def packed_call(xs: list[np.ndarray], lengths: list[int]) -> list[Any]:
        calls.append(list(lengths))
        return m.run_packed(xs, lengths)

    results = run_requests(layout, m.run, reqs, packed_call)
    assert calls == [[1, 7, 7, SEQ_MAX, 5, 5, 5, 7]]  # one packed call, every row a sequence
    for req, got in zip(reqs, results):
        if req[0].shape[1] > SEQ_MAX:
            assert isinstance(got, InputError) and "is 40; the allowed range is [1, 32]" in str(got)
            continue
        assert not isinstance(got, Exception)
        np.testing.assert_allclose(got[0], m.run(req)[0], rtol=1e-5, atol=1e-5)
    text = TritonModelConfig.build(m.manifest, "enc", "cpu").text()
    assert "merge packed, with no padding" in text and "allow_ragged_batch: true" in text
    assert "merge packed" in TritonModelConfig.build(m.manifest, "enc", "cpu", backend="cpp").text()


def test_cpp_runtime_runs_the_packed_form_as_python_does(
    distil: tuple[Any, nn.Module], release: Path, tmp_path: Path
) -> None:
    """bpk_model_run_packed (bpk-run --lengths): the Python loader's results (the same kernels) and
    its error texts, through a view of the artifact's packed sections."""
    art, _ = distil
    path = tmp_path / "m.bpk"
    art.save(path)
    m = bladepack.load(path)

    torch.manual_seed(2)
    lengths = [1, 7, SEQ_MAX, 5, 1]
    arrays = _packed_inputs([_text(1, n) for n in lengths])
    r = _bpk_run(release, path, arrays, lengths, tmp_path)
    assert r.returncode == 0, r.stderr
    (want,) = m.run_packed(arrays, lengths)
    got = np.load(tmp_path / "output0.npy")
    assert got.shape == want.shape and np.abs(got - want).max() <= 1e-6 * max(1.0, float(np.abs(want).max()))
    for lens, xs in (([5, 40], _packed_inputs([_text(1, 5), _text(1, 40)])), ([5, 39], arrays), ([50, -5], arrays)):
        with pytest.raises(InputError) as e:
            m.run_packed(xs, lens)
        r = _bpk_run(release, path, xs, lens, tmp_path)
        assert r.returncode == 1 and str(e.value) in r.stderr, (str(e.value), r.stderr)


def test_a_batch_starting_at_two_still_runs_packed(release: Path, tmp_path: Path) -> None:
    """A batch range that starts at 2 (what torch 2.11 leaves a Hugging Face decoder: Note [Two
    exports]): a sequence alone is then two copies of it (the rows are proven independent), in the
    self-check (which runs: no note) and in both loaders' checks of each length; results as each
    sequence in a batch of two, and a length out of range still refused by both."""
    torch.manual_seed(0)
    model = _hf("distilbert")
    dims = {n: {0: bladepack.Dim("batch", 2, 8), 1: bladepack.Dim("seq", 1, SEQ_MAX)} for n in ("ids", "mask")}
    art = bladepack.optimize(model, [_text(2, 5), _text(3, 9)], dims, packed=True)
    assert not art.notes, art.notes
    path = tmp_path / "m.bpk"
    art.save(path)
    m = bladepack.load(path)
    torch.manual_seed(3)
    lengths = [1, 7, SEQ_MAX, 2]
    reqs = [_text(1, n) for n in lengths]
    arrays = _packed_inputs(reqs)
    (out,) = m.run_packed(arrays, lengths)
    with torch.no_grad():
        for piece, r in zip(np.split(out, np.cumsum(lengths)[:-1], axis=1), reqs, strict=True):
            np.testing.assert_allclose(piece, model(*r).numpy(), rtol=1e-5, atol=1e-5)
    r = _bpk_run(release, path, arrays, lengths, tmp_path)
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "output0.npy"), out, rtol=1e-6, atol=1e-6)
    far = _packed_inputs([_text(1, 5), _text(1, 40)])
    with pytest.raises(InputError, match="a sequence of length 40") as e:
        m.run_packed(far, [5, 40])
    r = _bpk_run(release, path, far, [5, 40], tmp_path)
    assert r.returncode == 1 and str(e.value) in r.stderr, (str(e.value), r.stderr)


def test_bfloat16_packed_matches_each_sequence_alone() -> None:
    """A model computed in bfloat16 (dtype=...): its packed form passes the self-check at bfloat16's
    tolerance (bit patterns compared as numbers) and matches the plan per sequence."""
    torch.manual_seed(0)
    model = _hf("distilbert")
    art = bladepack.optimize(model, [_text(2, 5), _text(3, 9)], DIMS, packed=True, dtype="bfloat16")
    m = bladepack.load(art.to_bytes())
    lengths = [3, 1, 17]
    reqs = [[x.numpy() for x in _text(1, n)] for n in lengths]

    def floats(x: np.ndarray) -> np.ndarray:
        return (np.asarray(x).astype(np.uint32) << 16).view(np.float32)

    (out,) = m.run_packed([np.concatenate([r[k] for r in reqs], 1) for k in range(2)], lengths)
    for piece, r in zip(np.split(floats(out), np.cumsum(lengths)[:-1], axis=1), reqs):
        want = floats(m.run(r)[0])
        assert np.abs(piece - want).max() <= 4e-2 * max(1.0, float(np.abs(want).max()))


def test_cpp_triton_backend_merges_packed(classifier: tuple[Any, nn.Module], release: Path, tmp_path: Path) -> None:
    """Note [Packed merging] in the C++ backend (a fake Triton server, cpp_runtime/tests/triton_fake.cpp):
    a CPU instance runs requests of lengths 4, 9, 1 and 7 (7 rows) as one packed call of 7 sequences,
    each request answered with its tokens' and its sequences' rows, bit for bit the Python backend's
    rule on the Python loader and within 1e-5 of each request alone; a request above the range runs
    alone with the loader's error."""
    from bladepack.serving.batching import BatchLayout, run_requests
    from bladepack.serving.triton_repo import write_repository
    from tests.test_serving import _fake_triton

    art, _ = classifier
    path = tmp_path / "cls.bpk"
    art.save(path)
    write_repository(path, tmp_path, "m", backend="cpp")
    assert "merge packed" in (tmp_path / "m" / "config.pbtxt").read_text()
    torch.manual_seed(3)
    dims = [(2, 4), (1, 9), (1, SEQ_MAX + 1), (1, 1), (3, 7)]
    reqs = [list(zip(("ids", "mask"), (x.numpy() for x in _text(b, n)))) for b, n in dims]
    proc, got = _fake_triton(release, tmp_path / "m", reqs, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "executions 1: batch sizes 7", proc.stdout  # the failed one reports none
    m = bladepack.load(path)
    layout = BatchLayout.from_manifest(m.manifest, True, 1.0, packed=True)
    want = run_requests(layout, m.run, [[a for _, a in r] for r in reqs], m.run_packed)
    for k, r in enumerate(reqs):
        if k == 2:
            with pytest.raises(InputError) as e:
                m.run([a for _, a in r])
            assert got[k] == f"INVALID_ARG {e.value}"
            continue
        alone = m.run([a for _, a in r])
        for g, w, a in zip(got[k], want[k], alone):
            np.testing.assert_array_equal(g, w)
            np.testing.assert_allclose(g, a, rtol=1e-5, atol=1e-5)
