"""Fused attention on CUDA (Note [Online softmax on CUDA]) without a GPU: the generated kernels run on
the fake driver, emulated on the CPU (tests/cuda_harness.py), against eager.

Every model must plan its attention as one CUDA "attention" kernel. Query and key lengths cover 1, odd,
a 32-key tile and one more, several tiles per warp (four and eight warps split the keys), and the
declared maximum; masks boolean, additive, causal and padding; grouped-query heads; fully masked rows,
NaN and infinite scores, no keys at all; float32, float64, float16 and bfloat16; head dims that are
not multiples of a warp. Both variants ("_rows" below eight query rows, "_tile" from eight) are
checked in the fake driver's launch log; the C++ runtime runs one model too. Causal masks bound the
keys each block walks (Note [Key bounds]), and the packed form (Note [Packed sequences]) runs on CUDA.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import bladepack
from bladepack import Dim
from tests.cuda_harness import FakeGpu, ptx_entries, ptxas_reports
from tests.test_attention import _CausalForms, _Padded, _Sdpa, _TransformersMask

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None and not os.environ.get("NVCC"), reason="nvcc not found (CUDA targets need it)"
)

TARGETS = ("cuda:sm_90",)
MAX = 300


def _kinds(art: Any) -> list[str]:
    return [k.kind for k in art.plan.kernels if k.target == "cuda"]


def _launched(log: str) -> set[str]:
    return {ln.split()[1] for ln in log.splitlines() if ln.startswith("launch ")}


def _np(a: torch.Tensor) -> np.ndarray:
    """numpy has no bfloat16: the loader takes its uint16 bit patterns."""
    return a.view(torch.int16).numpy().view(np.uint16) if a.dtype == torch.bfloat16 else a.numpy()


def _run(
    gpu: FakeGpu, model: torch.nn.Module, cases: Sequence[tuple[torch.Tensor, ...]], art: Any
) -> tuple[list[Any], str]:
    assert "attention" in _kinds(art), _kinds(art)
    _, results, log = gpu.run(art, [tuple(_np(a) for a in c) for c in cases])
    return results, log


def _check(model: torch.nn.Module, cases: Sequence[tuple[torch.Tensor, ...]], results: list[Any], tol: float) -> None:
    failures = []
    for args, got in zip(cases, results, strict=True):
        assert not isinstance(got, str), got
        with torch.no_grad():
            want = model(*args)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            w = w.double().numpy()
            g = np.asarray(g, dtype=np.float64)
            if not np.array_equal(np.isnan(g), np.isnan(w)):
                failures.append(f"{[tuple(a.shape) for a in args]}: NaN at other places than eager")
                continue
            ok = ~np.isnan(w)
            err = float(np.abs(g[ok] - w[ok]).max(initial=0.0)) / (1.0 + float(np.abs(w[ok]).max(initial=0.0)))
            if not err <= tol:
                failures.append(f"{[tuple(a.shape) for a in args]}: {err:.2e}")
    assert not failures, "\n".join(failures)


def _qkv(
    g: torch.Generator, b: int, sq: int, skv: int, d: int, dv: int, h: int, hkv: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q = torch.randn(b, h, sq, d, generator=g).to(dtype)
    k = torch.randn(b, hkv, skv, d, generator=g).to(dtype)
    v = torch.randn(b, hkv, skv, dv, generator=g).to(dtype)
    return q, k, v


def test_padding_mask_both_variants(gpu: FakeGpu) -> None:
    """The encoder's masked_fill pattern at query lengths 1 .. MAX (both variants; a tile +- 1; more keys
    than four warps' tiles), a fully padded first sequence; head dim 64."""

    def make(g: torch.Generator, b: int, n: int) -> tuple[torch.Tensor, ...]:
        q, k, v = _qkv(g, b, n, n, 64, 64, 2, 2)
        mask = (torch.rand(b, n, generator=g) > 0.3).long()
        mask[0] = 0
        return q, k, v, mask

    b, seq = Dim("batch"), Dim("seq", max=MAX)
    dims = {"q": {0: b, 2: seq}, "k": {0: b, 2: seq}, "v": {0: b, 2: seq}, "mask": {0: b, 1: seq}}
    g = torch.Generator().manual_seed(0)
    art = bladepack.optimize(_Padded(), make(g, 2, 9), dynamic_shapes=dims, targets=TARGETS)
    cases = [make(g, bb, n) for bb, n in [(1, 1), (2, 7), (2, 8), (1, 32), (2, 33), (1, 129), (2, 200), (1, MAX)]]
    results, log = _run(gpu, _Padded(), cases, art)
    _check(_Padded(), cases, results, 2e-6)
    assert {"k0_rows", "k0_tile"} <= _launched(log), _launched(log)


def test_causal_odd_head_dims(gpu: FakeGpu) -> None:
    """is_causal over square scores; head dims 40 (scores) and 48 (values: two columns per lane, the
    second only on 16 lanes)."""
    seq = Dim("seq", max=MAX)
    dims = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    g = torch.Generator().manual_seed(1)
    art = bladepack.optimize(_Sdpa(causal=True), _qkv(g, 2, 9, 9, 40, 48, 3, 3), dynamic_shapes=dims, targets=TARGETS)
    cases = [_qkv(g, b, n, n, 40, 48, 3, 3) for b, n in [(1, 1), (2, 5), (1, 8), (2, 65), (1, 257)]]
    results, _ = _run(gpu, _Sdpa(causal=True), cases, art)
    _check(_Sdpa(causal=True), cases, results, 2e-6)


def test_causal_masks_bound_the_keys(gpu: FakeGpu) -> None:
    """Note [Key bounds] on CUDA: sdpa's is_causal, `where(k <= q)`, a masked_fill of `k > q` and a
    window each bound the keys a block walks (`klo_` .. `khi_`), and equal eager across the variants."""
    seq = Dim("seq", max=MAX)
    dims = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    g = torch.Generator().manual_seed(9)
    model = _CausalForms()
    art = bladepack.optimize(model, _qkv(g, 2, 9, 9, 16, 16, 4, 4), dynamic_shapes=dims, targets=TARGETS)
    assert _kinds(art).count("attention") == 4, _kinds(art)
    assert art.sources.units["cuda"].unit.count("khi_ = (") >= 4
    cases = [_qkv(g, b, n, n, 16, 16, 4, 4) for b, n in [(1, 1), (2, 7), (1, 8), (2, 40), (1, 161)]]
    results, _ = _run(gpu, model, cases, art)
    _check(model, cases, results, 2e-6)
    # transformers' form: a materialized mask of `arange + c` positions, and a shifted key position
    dims["pad"] = {0: Dim("batch"), 1: seq}

    def make(b: int, n: int) -> tuple[torch.Tensor, ...]:
        return (*_qkv(g, b, n, n, 16, 16, 2, 2), (torch.rand(b, n, generator=g) > 0.2).long())

    art = bladepack.optimize(_TransformersMask(), make(2, 9), dynamic_shapes=dims, targets=TARGETS)
    assert art.sources.units["cuda"].unit.count("khi_ = (") >= 3
    cases = [make(b, n) for b, n in [(1, 1), (2, 7), (1, 8), (2, 40), (1, 161)]]
    results, _ = _run(gpu, _TransformersMask(), cases, art)
    _check(_TransformersMask(), cases, results, 2e-6)


@pytest.mark.parametrize("new", [1, 3, 9])
def test_gqa_decode_against_a_growing_cache(gpu: FakeGpu, new: int) -> None:
    """Grouped-query attention (8 query heads over 2 KV heads, read in place) of 1, 3 or 9 new rows
    against a cache of 1 .. 1024 positions: a tile, one more, eight warps' tiles and more."""
    past = Dim("past", max=1024)
    dims = {"q": {0: Dim("batch")}, "k": {0: Dim("batch"), 2: past}, "v": {0: Dim("batch"), 2: past}}
    g = torch.Generator().manual_seed(2)
    model = _Sdpa(gqa=True)
    art = bladepack.optimize(model, _qkv(g, 2, new, 9, 16, 16, 8, 2), dynamic_shapes=dims, targets=TARGETS)
    cases = [_qkv(g, b, new, n, 16, 16, 8, 2) for b, n in [(1, 1), (2, 31), (1, 33), (2, 256), (1, 257), (1, 1024)]]
    results, log = _run(gpu, model, cases, art)
    _check(model, cases, results, 2e-6)
    # a tile of rows (four warps) for a static query length of 8 or more; decoding takes eight warps a
    # block, its keys split over blocks at 257 and 1024 positions with the combining kernel after it
    blocks = {ln.split()[1]: ln.split()[7] for ln in log.splitlines() if ln.startswith("launch ")}
    want = {"k0": "128"} if new >= 8 else {"k0_rows": "256", "k0_split": "256", "k1": "128"}
    assert blocks == want, blocks


def _split_blocks(log: str) -> list[int]:
    """Per launch of a "_split" variant, its grid (blocks)."""
    return [int(ln.split()[3]) for ln in log.splitlines() if ln.startswith("launch ") and "_split" in ln.split()[1]]


def test_split_keys_for_long_caches(gpu: FakeGpu) -> None:
    """Note [Split keys]: one query row of one KV head against caches of 1 .. 20000 (chunks from one to
    the 64 at most, a last chunk short or one key long) equals eager; a batch whose rows fill 256
    blocks does not split, and without a split the combining kernel is not launched."""
    past = Dim("past", max=20000)
    dims = {"q": {0: Dim("batch")}, "k": {0: Dim("batch"), 2: past}, "v": {0: Dim("batch"), 2: past}}
    g = torch.Generator().manual_seed(10)
    model = _Sdpa(gqa=True)
    art = bladepack.optimize(model, _qkv(g, 2, 1, 9, 16, 24, 4, 1), dynamic_shapes=dims, targets=TARGETS)
    assert _kinds(art) == ["attention", "attention_combine"], _kinds(art)
    sizes = [(1, 256), (1, 257), (2, 1000), (1, 4097), (3, 8191), (1, 16385), (1, 20000), (64, 300)]
    cases = [_qkv(g, b, 1, n, 16, 24, 4, 1) for b, n in sizes]
    results, log = _run(gpu, model, cases, art)
    _check(model, cases, results, 2e-6)
    # rows (batch x 4 heads) x chunks: min(ceil(n / 256), 256 // rows, 64)
    assert _split_blocks(log) == [4 * 2, 8 * 4, 4 * 17, 12 * 21, 4 * 64, 4 * 64], _split_blocks(log)
    _, plain = _run(gpu, model, [cases[0], cases[-1]], art)
    assert _launched(plain) == {"k0_rows"}, _launched(plain)


def test_split_keys_with_bounds_and_special_values(gpu: FakeGpu) -> None:
    """Split chunks and masks: is_causal with 3 query rows against 300-1100 keys (every chunk but the
    first walks nothing), an additive mask that is -inf over a row's whole first chunks, over all of a
    row (NaN under a plain softmax), NaN in one chunk and +inf in another (NaN rows) — NaN exactly
    where eager has it; float64 and float16 through the workspace; the C++ runtime bit-equal."""

    class _Plain(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.25 + bias, dim=-1), v)

    past = Dim("past", max=1100)
    dims = {"q": {0: Dim("batch")}, "k": {0: Dim("batch"), 2: past}, "v": {0: Dim("batch"), 2: past}}
    g = torch.Generator().manual_seed(11)
    causal = _Sdpa(causal=True)
    art = bladepack.optimize(causal, _qkv(g, 2, 3, 9, 16, 16, 2, 2), dynamic_shapes=dims, targets=TARGETS)
    cases = [_qkv(g, b, 3, n, 16, 16, 2, 2) for b, n in [(1, 300), (2, 777), (1, 1100)]]
    results, log = _run(gpu, causal, cases, art)
    _check(causal, cases, results, 2e-6)
    assert _split_blocks(log), _launched(log)

    def biased(b: int, n: int) -> tuple[torch.Tensor, ...]:
        q, k, v = _qkv(g, b, 2, n, 16, 16, 2, 2)
        bias = torch.randn(b, 2, 2, n, generator=g)
        bias[0, 0, 0, : n - 5] = -math.inf  # only the last chunk's keys
        bias[0, 0, 1] = -math.inf  # nothing: NaN
        bias[0, 1, 0, 3] = math.nan
        bias[-1, 1, 1, n - 1] = math.inf
        return q, k, v, bias

    dims_b = {**dims, "bias": {0: Dim("batch"), 3: past}}
    art = bladepack.optimize(_Plain(), biased(2, 9), dynamic_shapes=dims_b, targets=TARGETS)
    cases = [biased(b, n) for b, n in [(1, 600), (2, 1100)]]
    results, log = _run(gpu, _Plain(), cases, art)
    _check(_Plain(), cases, results, 2e-6)
    assert _split_blocks(log), _launched(log)
    _, cpp, _ = gpu.run_cpp(art, [tuple(a.numpy() for a in c) for c in cases])
    for a, c in zip(results, cpp, strict=True):
        np.testing.assert_array_equal(a[0], c[0])

    for dtype, tol in ((torch.float64, 1e-12), (torch.float16, None)):
        x = _qkv(g, 1, 1, 9, 64, 64, 4, 2, dtype)
        art = bladepack.optimize(_Sdpa(gqa=True), x, dynamic_shapes=dims, targets=TARGETS)
        cases = [_qkv(g, 1, 1, n, 64, 64, 4, 2, dtype) for n in (513, 1100)]
        results, log = _run(gpu, _Sdpa(gqa=True), cases, art)
        assert _split_blocks(log) == [4 * 3, 4 * 5], _split_blocks(log)
        for args, got in zip(cases, results, strict=True):
            with torch.no_grad():
                ref = _Sdpa(gqa=True)(*(a.double() for a in args)).numpy()
                eager = _Sdpa(gqa=True)(*args).double().numpy()
            ours = _fp64_error(np.asarray(got[0]).astype(np.float64), ref)
            assert ours <= (tol if tol is not None else 2 * _fp64_error(eager, ref) + 1e-3), (dtype, ours)


def test_masked_rows_and_non_finite_scores(gpu: FakeGpu) -> None:
    """A boolean mask leaving query row 0 nothing (0 under sdpa's safe softmax), and an additive mask
    carrying -inf for a whole row (NaN under a plain softmax), a NaN score and a +inf score (their rows
    NaN), -inf across the first warps' tiles then finite: NaN exactly where eager has it."""

    class _Both(torch.nn.Module):
        def forward(
            self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            plain = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.25 + bias, dim=-1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), torch.matmul(plain, v)

    def make(g: torch.Generator, b: int, sq: int, skv: int) -> tuple[torch.Tensor, ...]:
        q, k, v = _qkv(g, b, sq, skv, 16, 16, 2, 2)
        mask = torch.rand(b, 1, sq, skv, generator=g) > 0.5
        mask[:, :, 0] = False
        bias = torch.randn(b, 1, sq, skv, generator=g)
        bias[0, 0, 0] = -math.inf
        bias[-1, 0, -1, : min(skv - 1, 150)] = -math.inf
        if sq > 2:
            bias[0, 0, 1, skv // 2] = math.nan
            bias[0, 0, 2, skv - 1] = math.inf
        return q, k, v, mask, bias

    b, sq, skv = Dim("batch"), Dim("sq", max=MAX), Dim("skv", max=MAX)
    dims = {
        "q": {0: b, 2: sq},
        "k": {0: b, 2: skv},
        "v": {0: b, 2: skv},
        "mask": {0: b, 2: sq, 3: skv},
        "bias": {0: b, 2: sq, 3: skv},
    }
    g = torch.Generator().manual_seed(3)
    art = bladepack.optimize(_Both(), make(g, 2, 9, 9), dynamic_shapes=dims, targets=TARGETS)
    assert _kinds(art).count("attention") == 2, _kinds(art)
    cases = [make(g, *s) for s in [(1, 1, 9), (2, 1, 170), (2, 3, 130), (2, 8, 77), (2, 20, 170), (1, 3, 1)]]
    _, results, _ = gpu.run(art, [tuple(a.numpy() for a in c) for c in cases])
    _check(_Both(), cases, results, 2e-6)
    assert not np.asarray(results[2][0])[:, :, 0].any()


def test_empty_key_range_gives_zero(gpu: FakeGpu) -> None:
    """No keys at all (a KV length of 0 in range): 0 under a plain softmax, as torch's empty matmul."""

    class _Plain(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.125, dim=-1), v)

    kv = Dim("kv", min=0, max=100)
    dims = {"q": {0: Dim("batch")}, "k": {0: Dim("batch"), 2: kv}, "v": {0: Dim("batch"), 2: kv}}
    g = torch.Generator().manual_seed(4)
    art = bladepack.optimize(_Plain(), _qkv(g, 2, 3, 5, 8, 8, 2, 2), dynamic_shapes=dims, targets=TARGETS)
    cases = [_qkv(g, 2, 3, n, 8, 8, 2, 2) for n in (0, 1, 100)]
    results, _ = _run(gpu, _Plain(), cases, art)
    _check(_Plain(), cases, results, 2e-6)
    assert not np.asarray(results[0][0]).any()


def _fp64_error(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(x.astype(np.float64) - ref).max() / (1.0 + np.abs(ref).max()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_dtypes(gpu: FakeGpu, dtype: torch.dtype) -> None:
    """float16 / bfloat16 (accumulated in float32: no further from float64 than eager in that dtype,
    which rounds its scores and probabilities) and float64 (within 1e-12), causal GQA at head dim 128."""
    seq = Dim("seq", max=MAX)
    dims = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    model = _Sdpa(causal=True, gqa=True)
    g = torch.Generator().manual_seed(5)
    art = bladepack.optimize(model, _qkv(g, 2, 9, 9, 128, 128, 4, 2, dtype), dynamic_shapes=dims, targets=TARGETS)
    cases = [_qkv(g, b, n, n, 128, 128, 4, 2, dtype) for b, n in [(1, 1), (2, 7), (2, 9), (1, 40), (2, 130)]]
    results, log = _run(gpu, model, cases, art)
    # Note [Tensor-core attention] from 16 query rows in the 16-bit floats
    want = {"k0_rows", "k0_tile"} | ({"k0_mma"} if dtype != torch.float64 else set())
    assert _launched(log) == want, _launched(log)
    for args, got in zip(cases, results, strict=True):
        assert not isinstance(got, str), got
        out = np.asarray(got[0])
        assert out.dtype == (np.dtype(np.uint16) if dtype is torch.bfloat16 else np.dtype(str(dtype)[6:]))
        with torch.no_grad():
            ref = model(*(a.double() for a in args)).numpy()
            eager = model(*args).double().numpy()
        ours = _fp64_error(_bf16(out) if dtype is torch.bfloat16 else out.astype(np.float64), ref)
        if dtype is torch.float64:
            assert ours <= 1e-12, (args[0].shape, ours)
        else:
            assert ours <= 2 * _fp64_error(eager, ref) + 1e-3, (args[0].shape, ours, _fp64_error(eager, ref))


class _Biased(torch.nn.Module):
    """A plain softmax under an additive bias (any values, -inf / NaN / +inf included)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.125 + bias, dim=-1), v)


def _half_results(got: Any, dtype: torch.dtype) -> np.ndarray:
    out = np.asarray(got)
    return _bf16(out) if dtype is torch.bfloat16 else out.astype(np.float64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tensor_core_prefill(gpu: FakeGpu, dtype: torch.dtype) -> None:
    """Note [Tensor-core attention] ("_mma", Sq >= 16), its fragments emulated lane by lane: cross-attention
    (head dims 48 / 40, Sq 16-130 against 0-200 keys: tiles short, one key, none) under an additive bias
    holding -inf over a whole row (NaN), over all keys but the last, a NaN and a +inf (NaN rows) — NaN
    exactly where the float64 model has it, elsewhere no further from it than eager in `dtype` (2x +
    1e-3); the encoder's padding mask with a fully padded sequence; the C++ runtime bit-equal."""

    def biased(b: int, sq: int, skv: int) -> tuple[torch.Tensor, ...]:
        q = torch.randn(b, 2, sq, 48, generator=g)
        k = torch.randn(b, 2, skv, 48, generator=g)
        v = torch.randn(b, 2, skv, 40, generator=g)
        bias = torch.randn(b, 2, sq, skv, generator=g)
        if skv:
            bias[0, 0, 0] = -math.inf
            bias[0, 1, 3, skv // 2] = math.nan
            bias[-1, 0, sq - 1, 0] = math.inf
            bias[-1, 1, 5, : skv - 1] = -math.inf
        return tuple(x.to(dtype) for x in (q, k, v, bias))

    g = torch.Generator().manual_seed(12)
    sq, kv = Dim("sq", max=MAX), Dim("kv", min=0, max=MAX)
    dims = {"q": {0: Dim("batch"), 2: sq}, "k": {0: Dim("batch"), 2: kv}, "v": {0: Dim("batch"), 2: kv}}
    dims["bias"] = {0: Dim("batch"), 2: sq, 3: kv}
    art = bladepack.optimize(_Biased(), biased(2, 17, 9), dynamic_shapes=dims, targets=TARGETS)
    shapes = [(1, 16, 5), (2, 17, 64), (1, 63, 65), (2, 64, 1), (1, 65, 200), (2, 130, 0), (1, 9, 70)]
    cases = [biased(*x) for x in shapes]
    results, log = _run(gpu, _Biased(), cases, art)
    assert _launched(log) == {"k0_mma", "k0_tile"}, _launched(log)
    failures = []
    for args, got in zip(cases, results, strict=True):
        assert not isinstance(got, str), got
        with torch.no_grad():
            ref = _Biased()(*(a.double() for a in args)).numpy()
            eager = _Biased()(*args).double().numpy()
        ours = _half_results(got[0], dtype)
        shape = tuple(args[-1].shape)
        if not np.array_equal(np.isnan(ours), np.isnan(ref)):
            failures.append(f"{shape}: NaN at other places than the float64 model")
            continue
        ok = ~np.isnan(ref)
        # torch's eager in `dtype` can be NaN where the float64 model is not (bfloat16 on an AVX-512 Xeon,
        # the row masked to its last key): eager's error is measured where it has a value, ours everywhere
        fair = ok & ~np.isnan(eager)
        err = _fp64_error(ours[ok], ref[ok]) if ok.any() else 0.0
        theirs = _fp64_error(eager[fair], ref[fair]) if fair.any() else 0.0
        if not err <= 2 * theirs + 1e-3:
            failures.append(f"{shape}: {err:.2e} (eager {theirs:.2e})")
    assert not failures, "\n".join(failures)
    if dtype is torch.float16:
        _, cpp, _ = gpu.run_cpp(art, [tuple(a.numpy() for a in c) for c in cases[:3]])
        for a, c in zip(results[:3], cpp, strict=True):
            np.testing.assert_array_equal(a[0], c[0])

    def padded(b: int, n: int) -> tuple[torch.Tensor, ...]:
        q, k, v = (x.to(dtype) for x in _qkv(g, b, n, n, 64, 64, 2, 2))
        mask = (torch.rand(b, n, generator=g) > 0.3).long()
        mask[0] = 0
        return q, k, v, mask

    seq = Dim("seq", max=MAX)
    dims = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    dims["mask"] = {0: Dim("batch"), 1: seq}
    art = bladepack.optimize(_Padded(), padded(2, 17), dynamic_shapes=dims, targets=TARGETS)
    cases = [padded(b, n) for b, n in [(2, 16), (1, 33), (2, 100), (1, MAX)]]
    results, log = _run(gpu, _Padded(), cases, art)
    assert _launched(log) == {"k0_mma"}, _launched(log)
    for args, got in zip(cases, results, strict=True):
        with torch.no_grad():
            ref = _Padded()(*(a.double() if a.is_floating_point() else a for a in args)).numpy()
            eager = _Padded()(*args).double().numpy()
        err, theirs = _fp64_error(_half_results(got[0], dtype), ref), _fp64_error(eager, ref)
        assert err <= 2 * theirs + 1e-3, (tuple(args[0].shape), err, theirs)


def test_tensor_core_ptx(tmp_path: Path) -> None:
    """The "_mma" variant is tensor-core code: its PTX for sm_80 (the oldest image built) has
    mma.sync.aligned.m16n8k16 of float16 and of bfloat16 into float."""

    seq = Dim("seq", max=MAX)
    dims = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    for dtype, name in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        g = torch.Generator().manual_seed(13)
        art = bladepack.optimize(
            _Sdpa(True), _qkv(g, 2, 17, 17, 64, 64, 2, 2, dtype), dynamic_shapes=dims, targets=TARGETS
        )
        src = tmp_path / f"{name}.cu"
        src.write_text(art.sources.unit("cuda"))
        body = ptx_entries(src, "sm_80", ["k0_mma"])["k0_mma"]
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{name}.{name}.f32" in body, name


def _bf16(bits: np.ndarray) -> np.ndarray:
    """bfloat16 results as numpy callers get them (uint16 bit patterns) in float64."""
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def test_cpp_runtime_agrees(gpu: FakeGpu) -> None:
    """The C++ runtime runs the same kernels on the same fake driver: the Python loader's outputs."""
    b, seq = Dim("batch"), Dim("seq", max=MAX)
    dims = {"q": {0: b, 2: seq}, "k": {0: b, 2: seq}, "v": {0: b, 2: seq}, "mask": {0: b, 1: seq}}

    def make(g: torch.Generator, bb: int, n: int) -> tuple[torch.Tensor, ...]:
        q, k, v = _qkv(g, bb, n, n, 32, 32, 2, 2)
        return q, k, v, (torch.rand(bb, n, generator=g) > 0.3).long()

    g = torch.Generator().manual_seed(6)
    art = bladepack.optimize(_Padded(), make(g, 2, 9), dynamic_shapes=dims, targets=("cpu", *TARGETS))
    cases = [tuple(a.numpy() for a in make(g, bb, n)) for bb, n in [(1, 3), (2, 70)]]
    _, py, _ = gpu.run(art, cases)
    _, cpp, _ = gpu.run_cpp(art, cases)
    for a, c in zip(py, cpp, strict=True):
        assert not isinstance(a, str) and not isinstance(c, str), (a, c)
        np.testing.assert_array_equal(a[0], c[0])


def test_kernels_keep_their_registers(tmp_path: Path) -> None:
    """ptxas's resource report for every variant at the head dims models use (prefill: "_tile" and
    "_rows"; decoding against a cache: "_split" and the combining kernel too): no spill stores or
    loads in float32 and float16 (a spilled accumulator would run from local memory)."""
    seq, past = Dim("seq", max=MAX), Dim("past", max=4096)
    prefill = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    decode = {"q": {0: Dim("batch")}, "k": {0: Dim("batch"), 2: past}, "v": {0: Dim("batch"), 2: past}}
    reports = []
    for dtype, d, sq in [
        (torch.float32, 64, 9),
        (torch.float16, 128, 9),
        (torch.float32, 256, 9),
        (torch.float16, 128, 1),
    ]:
        g = torch.Generator().manual_seed(7)
        dump = tmp_path / f"{str(dtype)[6:]}-{d}-{sq}"
        options = bladepack.CompileOptions(dump_dir=dump)
        dims = prefill if sq > 1 else decode
        x = _qkv(g, 2, sq, 9, d, d, 4, 2, dtype)
        bladepack.optimize(_Sdpa(True, True), x, dynamic_shapes=dims, targets=TARGETS, options=options)
        (src,) = dump.rglob("*.cu")
        entries = ptxas_reports(src, "sm_90")
        want = {"k0_rows", "k0_split", "k1"} if sq == 1 else {"k0_rows", "k0_tile"}
        want |= {"k0_mma"} if sq > 1 and dtype is torch.float16 else set()
        assert set(entries) == want, entries
        reports += [(dtype, d, name, rep) for name, rep in entries.items()]
    spilled = [rep for rep in reports if "0 bytes spill stores, 0 bytes spill loads" not in rep[3]]
    assert not spilled, spilled


@pytest.mark.cuda
def test_attention_on_a_real_gpu() -> None:
    """On a GPU machine: the fused kernels on torch CUDA tensors against a float64 eager on the GPU —
    prefill (both variants) and GQA decoding against caches of up to 4096 positions, float32 within
    1e-5, float16 / bfloat16 no further than eager in that dtype (within 2x, + 1e-3). Sizes below what
    this torch could export (torch 2.11 starts some ranges at 2) are skipped where optimize says why."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    failures = []
    for model, new, seq_max, h, hkv in [(_Sdpa(causal=True), None, 1024, 8, 8), (_Sdpa(gqa=True), 1, 4096, 32, 8)]:
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            seq = Dim("seq", max=seq_max)
            qdim = {0: Dim("batch")} if new else {0: Dim("batch"), 2: seq}
            dims = {"q": qdim, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
            g = torch.Generator().manual_seed(8)
            x = _qkv(g, 2, new or 9, 9, 128, 128, h, hkv, dtype)
            art = bladepack.optimize(model, x, dynamic_shapes=dims, targets=("cuda",))
            m = bladepack.load(art.to_bytes(), device="cuda")
            lows = {sym.name: sym.min for sym in art.plan.symbols}
            for b, n in [(1, 1), (2, 7), (3, 65), (2, 1000), (1, seq_max)]:
                below = [k for k, v in (("seq", n), ("batch", b)) if v < lows.get(k, 1)]
                if below:  # a torch that cannot export size 1 (2.11): optimize must have said so
                    assert all(any(f"range of {k} " in note for note in art.notes) for k in below), art.notes
                    continue
                args = tuple(a.cuda() for a in _qkv(g, b, new or n, n, 128, 128, h, hkv, dtype))
                with torch.no_grad():
                    ref = model(*(a.double() for a in args))
                    eager = model(*args)
                out = m(*args)
                assert out.is_cuda and out.dtype == dtype
                ours = float((out.double() - ref).abs().max() / (1 + ref.abs().max()))
                theirs = float((eager.double() - ref).abs().max() / (1 + ref.abs().max()))
                limit = 1e-5 if dtype == torch.float32 else 2 * theirs + 1e-3
                if not ours <= limit:
                    failures.append(f"{type(model).__name__} {dtype} b={b} n={n}: {ours:.2e} > {limit:.2e}")
    assert not failures, "\n".join(failures)


def test_packed_form_runs_on_the_gpu(gpu: FakeGpu, tmp_path: Path) -> None:
    """Note [Packed sequences] on CUDA: an artifact built with a CUDA target carries a CUDA packed plan
    (its attentions fused, each query's own sequence as key bounds), which `run_packed` and
    `bpk_model_run_packed` (bpk-run --lengths) run on the GPU: each sequence's rows as that sequence
    alone gives them on the CPU (lengths 1, odd, the range's end, several in one call)."""
    from bladepack.inspect import inspect_text, manifest_summary
    from tests.cpp_build import build
    from tests.test_packed import DIMS, _hf, _text

    torch.manual_seed(0)
    model = _hf("distilbert")
    targets = ("cpu", *TARGETS)
    art = bladepack.optimize(model, [_text(2, 5), _text(3, 9)], DIMS, packed=True, targets=targets)
    packed_kinds = [k.kind for k in art.packed[1].plan.kernels if k.target == "cuda"]
    assert packed_kinds.count("attention") == 2, packed_kinds
    assert "khi_" in art.packed[1].sources.unit("cuda")
    cpu = bladepack.load(art.to_bytes())
    assert ", a CUDA plan (LoadedModule.run_packed)" in inspect_text(manifest_summary(cpu.manifest))
    torch.manual_seed(1)
    cases, wants = [], []
    for lens in ([1, 7, 32, 5], [3], [17, 2, 9]):
        reqs = [[x.numpy() for x in _text(1, n)] for n in lens]
        cases.append(([np.concatenate([r[k] for r in reqs], axis=1) for k in range(2)], lens))
        wants.append([cpu.run(r)[0] for r in reqs])
    _, results, log = gpu.run_packed(art, cases)
    assert any("_tile" in name for name in _launched(log)), _launched(log)
    bpk_run = build("release") / "bpk-run"
    path = tmp_path / "m.bpk"
    art.save(path)
    env = gpu._env(art, tmp_path / "cuda.log", "90")
    for (arrays, lens), got, want in zip(cases, results, wants, strict=True):
        assert not isinstance(got, str), got
        for piece, w in zip(np.split(got[0], np.cumsum(lens)[:-1], axis=1), want, strict=True):
            np.testing.assert_allclose(piece, w, rtol=1e-5, atol=1e-5)
        flags = []
        for name, x in zip(("ids", "mask"), arrays, strict=True):
            np.save(tmp_path / f"{name}.npy", x)
            flags += ["--input", f"{name}={tmp_path / name}.npy"]
        r = subprocess.run(
            [str(bpk_run), str(path), "--device", "cuda", *flags, "--output-dir", str(tmp_path)]
            + ["--lengths", ",".join(map(str, lens))],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr
        np.testing.assert_allclose(np.load(tmp_path / "output0.npy"), got[0], rtol=1e-6, atol=1e-6)


class _MergedDecode(torch.nn.Module):
    """Grouped-query decoding of a few new rows whose heads are merged back ([b, new, heads * dv])."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return o.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


class _MergedPrefill(torch.nn.Module):
    """Causal prefill with the heads split from and merged back into [b, s, heads * d], projected."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, 4, 32).transpose(1, 2) for t in (x, x * 0.5, x + 1.0))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(o.transpose(1, 2).reshape(b, s, 128))


def _fusion_plan(dump: Path) -> str:
    (plan,) = dump.rglob("05-fusion.cuda.txt")
    return plan.read_text()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_stores_the_merged_heads(gpu: FakeGpu, tmp_path: Path, dtype: torch.dtype) -> None:
    """Note [Attention stores] on CUDA: prefill (the CUDA-core variants in float32, tensor cores in
    float16) and a decoding step split over blocks (its combining kernel writes the merged layout too)
    store [b, s, heads * dv] directly: no copy kernel between the attention and its consumer. Against
    eager at batch 1 and 3, lengths 1, odd, a tile +- 1, caches up to several chunks."""
    dump = tmp_path / "prefill"
    torch.manual_seed(0)
    model = _MergedPrefill().eval()
    dims = ({0: Dim("batch", max=8), 1: Dim("seq", max=MAX)},)
    options = bladepack.CompileOptions(dump_dir=dump)
    half = None if dtype == torch.float32 else "float16"
    art = bladepack.optimize(model, [(torch.randn(2, 20, 128),)], dims, targets=TARGETS, dtype=half, options=options)
    plan = _fusion_plan(dump)
    assert re.search(r"attention -> %\d+ = \{[^}]*\} stored as permute%\d+ reshape%\d+", plan), plan
    assert not [ln for ln in plan.splitlines() if ": loop[" in ln and "permute%" in ln], plan
    g = torch.Generator().manual_seed(3)
    cases = [(torch.randn(b, n, 128, generator=g).to(dtype),) for b, n in [(1, 1), (3, 7), (1, 16), (3, 65), (1, MAX)]]
    results, log = _run(gpu, model, cases, art)
    if dtype == torch.float16:
        assert any(name.endswith("_mma") for name in _launched(log)), log[-2000:]
        cases = [(c[0].float(),) for c in cases]
        results = [[r.astype(np.float32) for r in res] for res in results]
    _check(model, cases, results, 1e-5 if dtype == torch.float32 else 4e-3)

    dump = tmp_path / "decode"
    b, new, past = Dim("batch", max=8), Dim("new", max=4), Dim("past", max=4096)
    dims_d = {"q": {0: b, 2: new}, "k": {0: b, 2: past}, "v": {0: b, 2: past}}
    g = torch.Generator().manual_seed(4)
    q0, k0, v0 = _qkv(g, 2, 2, 300, 64, 64, 8, 2)
    art = bladepack.optimize(
        _MergedDecode(),
        (q0, k0, v0),
        dynamic_shapes=dims_d,
        targets=TARGETS,
        options=bladepack.CompileOptions(dump_dir=dump),
    )
    assert "stored as permute" in _fusion_plan(dump)
    assert _kinds(art) == ["attention", "attention_combine"], _kinds(art)
    cases_d = [_qkv(g, bb, r, n, 64, 64, 8, 2) for bb, r, n in [(1, 1, 1), (3, 3, 257), (1, 1, 1000), (2, 4, 4096)]]
    results, log = _run(gpu, _MergedDecode(), cases_d, art)
    assert any(name.endswith("_split") for name in _launched(log)), log[-2000:]
    _check(_MergedDecode(), cases_d, results, 1e-5)


class _Segments(torch.nn.Module):
    """Packed sequences' attention written out: row i sees the keys [lo[i], hi[i]) (Note [Key bounds])."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor
    ) -> torch.Tensor:
        s = q @ k.transpose(-1, -2) * q.shape[-1] ** -0.5
        key = torch.arange(k.shape[-2])
        keep = (key >= lo[:, None]) & (key < hi[:, None])
        return torch.softmax(torch.where(keep, s, -math.inf), -1) @ v


def test_tensor_core_warps_skip_other_sequences_keys(gpu: FakeGpu) -> None:
    """Note [Group key bounds] on tensor cores: a warp whose 16 rows see none of a tile's keys skips it
    (sequences of 5-70 tokens packed along one axis: most warps skip most of their block's tiles), the
    results no further from the float64 model than float16 eager, sequences of one token included."""
    g = torch.Generator().manual_seed(21)
    n = Dim("n", max=MAX)
    dims = {"q": {2: n}, "k": {2: n}, "v": {2: n}, "lo": {0: n}, "hi": {0: n}}

    def packed(lens: list[int]) -> tuple[torch.Tensor, ...]:
        total = sum(lens)
        q, k, v = (x.half() for x in _qkv(g, 1, total, total, 64, 64, 2, 2))
        ends = torch.tensor(lens).cumsum(0)
        hi = torch.repeat_interleave(ends, torch.tensor(lens))
        lo = hi - torch.repeat_interleave(torch.tensor(lens), torch.tensor(lens))
        return q, k, v, lo, hi

    art = bladepack.optimize(_Segments(), packed([9, 12]), dynamic_shapes=dims, targets=TARGETS)
    assert "wlo_" in art.sources.unit("cuda")
    cases = [packed(x) for x in ([70, 5, 33, 1, 64, 20], [16], [1] * 40, [130, 7, 60])]
    results, log = _run(gpu, _Segments(), cases, art)
    assert "k0_mma" in _launched(log), _launched(log)
    for args, got in zip(cases, results, strict=True):
        with torch.no_grad():
            ref = _Segments()(*(a.double() if a.is_floating_point() else a for a in args)).numpy()
            eager = _Segments()(*args).double().numpy()
        err, theirs = _fp64_error(_half_results(got[0], torch.float16), ref), _fp64_error(eager, ref)
        assert err <= 2 * theirs + 1e-3, (tuple(args[0].shape), err, theirs)
