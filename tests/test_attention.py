"""Fused attention (Note [Fused attention], Note [Online softmax on CPU]) against eager.

Every model here must plan its attention as one "attention" kernel (no scores in memory); outputs are
compared with torch at query / key lengths 1, odd, across the key-block size (64) and at the declared
maximum, with boolean, additive, causal and padding masks, GQA, decoding, and fully masked rows.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F

import bladepack
from bladepack import Dim
from tests.helpers import as_tuple, rel_err, runnable_levels

MAX = 200
LENGTHS = (1, 2, 7, 63, 64, 65, 130, MAX)


def _kinds(m: bladepack.LoadedModule) -> list[str]:
    return [k["kind"] for k in m._manifest.kernels["cpu"]]


def _check(model: torch.nn.Module, make, dims: dict, lengths, tol: float) -> bladepack.LoadedModule:
    g = torch.Generator().manual_seed(0)
    art = bladepack.optimize(model, make(g, 2, 9), dynamic_shapes=dims)
    m = bladepack.load(art.to_bytes(), executor="native")
    assert "attention" in _kinds(m), _kinds(m)
    for n in lengths:
        for b in (1, 3):
            x = make(g, b, n)
            with torch.no_grad():
                want = model(*x)
            got = m(*x)
            assert rel_err(got, want) <= tol, (b, n, rel_err(got, want))
    return m


class _Padded(torch.nn.Module):
    """The encoder's pattern: scale by division, a [batch, seq] padding mask through masked_fill with
    the dtype's lowest value (a fully padded row attends uniformly, as in eager)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        s = s.masked_fill(mask[:, None, None, :] == 0, torch.finfo(s.dtype).min)
        return torch.matmul(F.softmax(s, dim=-1), v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_padding_mask(dtype: torch.dtype) -> None:
    def make(g: torch.Generator, b: int, n: int) -> tuple[torch.Tensor, ...]:
        q, k, v = (torch.randn(b, 4, n, 16, generator=g, dtype=dtype) for _ in range(3))
        mask = (torch.rand(b, n, generator=g) > 0.3).long()
        mask[0] = 0  # every key of the first sequence masked
        return q, k, v, mask

    seq = Dim("seq", max=MAX)
    b = Dim("batch")
    dims = {"q": {0: b, 2: seq}, "k": {0: b, 2: seq}, "v": {0: b, 2: seq}, "mask": {0: b, 1: seq}}
    _check(_Padded().eval(), make, dims, LENGTHS, 1e-5 if dtype == torch.float32 else 1e-12)


class _Sdpa(torch.nn.Module):
    def __init__(self, causal: bool = False, gqa: bool = False) -> None:
        super().__init__()
        self.causal, self.gqa = causal, gqa

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=self.gqa)


class _SdpaMask(torch.nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _qkv(g: torch.Generator, b: int, sq: int, skv: int, d: int = 40, dv: int = 24, h: int = 3, hkv: int = 3):
    q = torch.randn(b, h, sq, d, generator=g)
    k = torch.randn(b, hkv, skv, d, generator=g)
    v = torch.randn(b, hkv, skv, dv, generator=g)
    return q, k, v


def test_causal_prefill_odd_head_dims() -> None:
    """is_causal over a square score matrix; head dims 40 (scores) and 48 (values: three vectors, so the
    wide variant takes its rows four at a time), not vector multiples."""
    seq = Dim("seq", max=MAX)
    dims = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    _check(_Sdpa(causal=True), lambda g, b, n: _qkv(g, b, n, n, 40, 48), dims, LENGTHS, 1e-5)


def test_bool_mask_fully_masked_rows_give_zero() -> None:
    """sdpa with a boolean mask: a query row whose every key is masked gives 0 in torch (its safe
    softmax), and 0 here; other rows attend to their unmasked keys."""

    def make(g: torch.Generator, b: int, n: int) -> tuple[torch.Tensor, ...]:
        q, k, v = _qkv(g, b, n, n, 16, 16, 2, 2)
        mask = torch.rand(b, 1, n, n, generator=g) > 0.5
        mask[:, :, 0] = False  # query row 0 sees nothing
        return q, k, v, mask

    b, seq = Dim("batch"), Dim("seq", max=MAX)
    dims = {"q": {0: b, 2: seq}, "k": {0: b, 2: seq}, "v": {0: b, 2: seq}, "mask": {0: b, 2: seq, 3: seq}}
    m = _check(_SdpaMask(), make, dims, LENGTHS, 1e-5)
    q, k, v, mask = make(torch.Generator().manual_seed(3), 2, 65)
    assert not m(q, k, v, mask)[:, :, 0].any()


def test_additive_mask_and_plain_softmax_nan_rows() -> None:
    """A float mask added to the scores; rows entirely -inf under a plain softmax are NaN, as in eager."""

    class _Additive(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            s = torch.matmul(q, k.transpose(-1, -2)) * 0.125 + bias
            return torch.matmul(torch.softmax(s, dim=-1), v)

    def make(g: torch.Generator, b: int, n: int) -> tuple[torch.Tensor, ...]:
        q, k, v = _qkv(g, b, n, n, 16, 24, 2, 2)
        bias = torch.randn(b, 1, n, n, generator=g)
        bias[0, 0, -1] = -math.inf  # the last query row of the first sequence: every score -inf
        return q, k, v, bias

    b, seq = Dim("batch"), Dim("seq", max=MAX)
    dims = {"q": {0: b, 2: seq}, "k": {0: b, 2: seq}, "v": {0: b, 2: seq}, "bias": {0: b, 2: seq, 3: seq}}
    m = _check(_Additive(), make, dims, LENGTHS, 1e-5)
    q, k, v, bias = make(torch.Generator().manual_seed(4), 2, 7)
    assert torch.isnan(torch.as_tensor(m(q, k, v, bias))[0, :, -1]).all()


@pytest.mark.parametrize("new", [1, 3, 5])
def test_gqa_decode_against_a_growing_cache(new: int) -> None:
    """Grouped-query attention (8 query heads over 2 KV heads, read in place) of 1, 3 or 5 new rows
    against a KV cache of 1 .. 1024 positions (both variants: rows and blocked)."""
    past = Dim("past", max=1024)
    dims = {"q": {0: Dim("batch")}, "k": {0: Dim("batch"), 2: past}, "v": {0: Dim("batch"), 2: past}}

    def make(g: torch.Generator, b: int, n: int) -> tuple[torch.Tensor, ...]:
        return _qkv(g, b, new, n, 8, 8, 8, 2)

    _check(_Sdpa(gqa=True), make, dims, (1, 2, 31, 64, 65, 200, 1023, 1024), 1e-5)


def test_empty_key_range_gives_zero() -> None:
    """With no keys (a KV length of 0 in range) the product is an empty sum: 0 under a plain softmax,
    as torch gives, not the NaN of a row whose scores are all -inf."""

    class _Plain(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.125, dim=-1), v)

    kv = Dim("kv", min=0, max=100)

    def make(g: torch.Generator, b: int, n: int) -> tuple[torch.Tensor, ...]:
        return _qkv(g, b, 3, n, 8, 8, 2, 2)

    _check(
        _Plain(),
        make,
        {"q": {0: Dim("batch")}, "k": {0: Dim("batch"), 2: kv}, "v": {0: Dim("batch"), 2: kv}},
        (0, 1, 5, 100),
        1e-5,
    )


def test_attention_whose_output_is_the_next_ones_scores() -> None:
    """softmax(softmax(q @ kT) @ v) @ w: the second softmax's scores are the first attention's output;
    the first fuses, the second runs as GEMMs and a row kernel; both equal eager."""

    class _Chained(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            a = torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)), dim=-1), v)
            return torch.matmul(torch.softmax(a, dim=-1), w)

    def make(g: torch.Generator, b: int, n: int) -> tuple[torch.Tensor, ...]:
        q, k, v = _qkv(g, b, n, 8, 8, 8, 2, 2)  # eight keys: the second's head dims are constants too
        return q, k, v, torch.randn(b, 2, 8, 8, generator=g)

    b, seq = Dim("batch"), Dim("seq", max=MAX)
    dims = {"q": {0: b, 2: seq}, "k": {0: b}, "v": {0: b}, "w": {0: b}}
    m = _check(_Chained(), make, dims, (1, 5, 64, 65), 1e-5)
    # the fused first attention and the second's softmax; nothing left to the reference executor
    assert sorted(_kinds(m)) == ["attention", "row"], _kinds(m)


class _RelativeBias(torch.nn.Module):
    """T5's pattern: a bias per (head, query, key) from a learned table indexed by a log-spaced bucket
    of the distance, added to the scores of two attentions over a batch of sequences."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(8, heads)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(q.shape[2])
        distance = (pos[None, :] - pos[:, None]).abs().float()
        bucket = (torch.log(distance + 1.0) * 2.0).long().clamp(max=7)
        bias = self.table(bucket).permute(2, 0, 1)[None]  # [1, heads, seq, seq]
        a = torch.matmul(torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.25 + bias, dim=-1), v)
        return torch.matmul(torch.softmax(torch.matmul(a, k.transpose(-1, -2)) * 0.25 + bias, dim=-1), v)


def test_broadcast_bias_is_computed_once() -> None:
    """Note [Broadcast side values]: the bias (a log and a table lookup per (head, query, key)) is
    stored once by a loop kernel both attentions read, not recomputed for every sequence of the batch
    in each attention's score loop."""

    def make(g: torch.Generator, b: int, n: int) -> tuple[torch.Tensor, ...]:
        return _qkv(g, b, n, n, 16, 16, 3, 3)

    b, seq = Dim("batch"), Dim("seq", max=MAX)
    dims = {"q": {0: b, 2: seq}, "k": {0: b, 2: seq}, "v": {0: b, 2: seq}}
    torch.manual_seed(0)
    m = _check(_RelativeBias(3).eval(), make, dims, (1, 2, 7, 64, 65, 130), 1e-5)
    kernels = m._manifest.kernels["cpu"]
    first, second = (set(k["nodes"]) for k in kernels if k["kind"] == "attention")
    assert not first & second, "the attentions share inline values"
    assert [k["kind"] for k in kernels].count("loop") == 1, [k["kind"] for k in kernels]


def test_wide_groups_at_every_isa_level() -> None:
    """Note [Attention groups per ISA]: the wide variant (64 query rows and more) takes eight rows per
    register block in the AVX-512 library and four in the AVX2 one; Note [Value chunks per ISA]: each
    library sums the values into as many output columns at a time as its registers hold (AVX2: 16 of
    a head of 40 or 64, the last chunk of 40 partial). Against eager, with a padding mask, at head dims
    of one to four score vectors, in the blocked variant (9 rows) and the wide one at query counts off
    the groups (65, 130)."""
    from bladepack.options import LoaderOptions
    from tests.helpers import all_isas

    model = _Padded().eval()
    for hd in (16, 32, 40, 64):

        def make(g: torch.Generator, b: int, n: int, hd: int = hd) -> tuple[torch.Tensor, ...]:
            q, k, v = (torch.randn(b, 2, n, hd, generator=g) for _ in range(3))
            return q, k, v, (torch.rand(b, n, generator=g) > 0.2).long()

        g = torch.Generator().manual_seed(1)
        s = Dim("s", 1, MAX)
        dims = ({2: s}, {2: s}, {2: s}, {1: s})
        art = bladepack.optimize(model, make(g, 2, 9), dynamic_shapes=dims, options=all_isas())
        levels = runnable_levels(art)
        for isa in levels:
            m = bladepack.load(art.to_bytes(), executor="native", options=LoaderOptions(cpu_isa=isa))
            assert "attention" in _kinds(m), _kinds(m)
            for n in (9, 64, 65, 130):
                x = make(g, 2, n)
                with torch.no_grad():
                    want = model(*x)
                assert rel_err(m(*x), want) <= 1e-5, (isa, hd, n)


def test_non_finite_scores_match_eager() -> None:
    """Note [Softmax exponentials]: NaN, +inf and -inf scores (a float mask carrying them), rows whose
    scores are all -inf and rows whose first key block is all -inf, through the fused attention's three
    variants (1-3, 8 and 80 query rows) at every ISA level, and through the row softmax and log-softmax:
    NaN and infinities exactly where eager has them, the rest within 1e-5."""

    class _Scores(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> tuple:
            s = torch.matmul(q, k.transpose(-1, -2)) * 0.25 + bias
            return torch.matmul(torch.softmax(s, dim=-1), v), torch.softmax(bias, -1), torch.log_softmax(bias, -1)

    def make(g: torch.Generator, b: int, sq: int, skv: int) -> tuple[torch.Tensor, ...]:
        q, k, v = _qkv(g, b, sq, skv, 16, 16, 2, 2)
        bias = torch.randn(b, 1, sq, skv, generator=g)
        bias[0, 0, 0] = -math.inf  # every score -inf: NaN under a plain softmax
        bias[-1, 0, -1, : min(skv - 1, 70)] = -math.inf  # -inf through the first key block, then finite
        if sq > 2:
            bias[0, 0, 1, skv // 2] = math.nan  # one NaN score: its row NaN
            bias[0, 0, 2, skv - 1] = math.inf  # one +inf score: its row NaN (exp(inf - inf))
        return q, k, v, bias

    b, sq, skv = Dim("batch"), Dim("sq", max=MAX), Dim("skv", max=MAX)
    dims = {"q": {0: b, 2: sq}, "k": {0: b, 2: skv}, "v": {0: b, 2: skv}, "bias": {0: b, 2: sq, 3: skv}}
    g = torch.Generator().manual_seed(5)
    art = bladepack.optimize(_Scores(), make(g, 2, 9, 9), dynamic_shapes=dims)
    failures = []
    for isa in runnable_levels(art):
        m = bladepack.load(art.to_bytes(), executor="native", options=bladepack.LoaderOptions(cpu_isa=isa))
        assert "attention" in _kinds(m), _kinds(m)
        for shape in [(1, 1, 9), (2, 1, 150), (2, 3, 130), (2, 8, 77), (2, 80, 150), (1, 3, 1)]:
            x = make(g, *shape)
            with torch.no_grad():
                wants = _Scores()(*x)
            for k, (got, want) in enumerate(zip(m(*x), wants, strict=True)):
                got_t = torch.as_tensor(got)
                if not torch.equal(torch.isnan(got_t), torch.isnan(want)):
                    failures.append(f"{isa} {shape} output {k}: NaN at other places than eager")
                    continue
                if not torch.equal(got_t[torch.isinf(want)], want[torch.isinf(want)]):
                    failures.append(f"{isa} {shape} output {k}: infinities at other places than eager")
                finite = torch.isfinite(want)
                if not finite.any():
                    continue
                err = float((got_t[finite] - want[finite]).abs().max())
                if not err <= 1e-5 * (1 + float(want[finite].abs().max())):
                    failures.append(f"{isa} {shape} output {k}: {err:.1e}")
    assert not failures, "\n".join(failures)


class _CausalForms(torch.nn.Module):
    """Three ways of writing a causal mask the kernels bound (Note [Key bounds]): sdpa's is_causal, a
    where keeping `k <= q`, a masked_fill of `k > q` with -inf (the negated form); and a window's
    `q - 3 <= k` beside `k <= q`, both bounds of one conjunction. Each on its own head."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        def scores(h: int) -> torch.Tensor:
            return torch.matmul(q[:, h : h + 1], k[:, h : h + 1].transpose(-1, -2)) * 0.25

        qpos, kpos = torch.arange(q.shape[2])[:, None], torch.arange(k.shape[2])[None, :]
        sdpa = F.scaled_dot_product_attention(q[:, :1], k[:, :1], v[:, :1], is_causal=True)
        kept = torch.softmax(torch.where(kpos <= qpos, scores(1), -math.inf), -1) @ v[:, 1:2]
        filled = torch.softmax(scores(2).masked_fill(kpos > qpos, -math.inf), -1) @ v[:, 2:3]
        inside = (qpos - 3 <= kpos) & (kpos <= qpos)
        window = torch.softmax(torch.where(inside, scores(3), -math.inf), -1) @ v[:, 3:4]
        return sdpa, kept, filled, window


class _TransformersMask(torch.nn.Module):
    """transformers' sdpa_mask (masking_utils.py): positions as `arange + offset`, `kv <= q` and'd with
    True and with the padding mask into one boolean mask that two attentions read; and a key position
    shifted by a constant (`k + 2 <= q + 1`: each row sees one key fewer, the first none)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = q.shape[2]
        qi, ki = (torch.arange(n) + 0)[None, None, :, None], (torch.arange(n) + 0)[None, None, None, :]
        mask = torch.ones((), dtype=torch.bool) & (ki <= qi)
        mask = mask & pad.bool()[:, None, None, :]
        first = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        second = F.scaled_dot_product_attention(first, k, v, attn_mask=mask)
        shifted = F.scaled_dot_product_attention(q, k, v, attn_mask=(ki + 2 <= qi + 1) & pad.bool()[:, None, None, :])
        return first, second, shifted


def test_transformers_masks_bound_the_keys() -> None:
    """Note [Key bounds] through a materialized mask of transformers' form (positions `arange + c`): each
    attention walks its rows' keys only, and equals eager (rows with no key: 0, sdpa's safe softmax)."""
    seq = Dim("seq", max=MAX)
    dims = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    dims["pad"] = {0: Dim("batch"), 1: seq}
    g = torch.Generator().manual_seed(10)

    def make(b: int, n: int) -> tuple[torch.Tensor, ...]:
        pad = (torch.rand(b, n, generator=g) > 0.2).long()
        pad[:, 0] = 1
        return (*_qkv(g, b, n, n, 16, 16, 2, 2), pad)

    model = _TransformersMask()
    art = bladepack.optimize(model, make(2, 9), dynamic_shapes=dims)
    m = bladepack.load(art.to_bytes(), executor="native")
    assert _kinds(m).count("attention") == 3, _kinds(m)
    assert art.sources.units["cpu"].unit.count("khi_ = std::max<int64_t>(khi_") >= 3
    for b, n in [(1, 1), (2, 3), (1, 17), (2, 64), (1, 65), (2, 130), (1, MAX)]:
        x = make(b, n)
        with torch.no_grad():
            wants = model(*x)
        for got, want in zip(m(*x), wants, strict=True):
            assert rel_err(got, want) <= 1e-5, (b, n, rel_err(got, want))


def test_causal_masks_bound_the_keys() -> None:
    """Note [Key bounds]: each form is read as bounds (the kernels walk `klo_` .. `khi_`), and every
    output equals eager at lengths across the variants and key blocks."""
    seq = Dim("seq", max=MAX)
    dims = {"q": {0: Dim("batch"), 2: seq}, "k": {0: Dim("batch"), 2: seq}, "v": {0: Dim("batch"), 2: seq}}
    g = torch.Generator().manual_seed(9)
    model = _CausalForms()
    art = bladepack.optimize(model, _qkv(g, 2, 9, 9, 16, 16, 4, 4), dynamic_shapes=dims)
    m = bladepack.load(art.to_bytes(), executor="native")
    assert _kinds(m).count("attention") == 4, _kinds(m)
    assert art.sources.units["cpu"].unit.count("khi_ = std::max<int64_t>(khi_") >= 4
    for b, n in [(1, 1), (2, 3), (1, 17), (2, 64), (1, 65), (2, 130), (1, MAX)]:
        x = _qkv(g, b, n, n, 16, 16, 4, 4)
        with torch.no_grad():
            wants = model(*x)
        for got, want in zip(m(*x), wants, strict=True):
            assert rel_err(got, want) <= 1e-5, (b, n, rel_err(got, want))


class _MergedHeads(torch.nn.Module):
    """Heads split from x, attended, merged back and projected, as every transformer writes it; `use`
    says what else reads the attention's output: nothing ("merge"), the caller too ("twice"), or the
    merge transposes its last axis away ("transposed")."""

    def __init__(self, use: str) -> None:
        super().__init__()
        self.use = use
        self.proj = torch.nn.Linear(48, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, 3, 16).transpose(1, 2) for t in (x, x * 0.5, x + 1.0))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if self.use == "transposed":
            return self.proj(o.permute(0, 2, 3, 1).reshape(b, s, 48))
        merged = self.proj(o.transpose(1, 2).reshape(b, s, 48))
        return (merged, o) if self.use == "twice" else merged


@pytest.mark.parametrize("use", ["merge", "twice", "transposed"])
def test_attention_stores_the_merged_heads(tmp_path, use: str) -> None:
    """Note [Attention stores]: the attention kernel writes the merged-heads layout ([b, s, heads * d])
    its output becomes, so no copy kernel runs between it and the projection; not where the output has
    another reader or the permute moves its last axis (then a copy kernel stores the layout, as before).
    Against eager at batch 1 and 3, lengths 1, odd and the maximum."""
    model = _MergedHeads(use).eval()
    dims = ({0: Dim("batch", max=8), 1: Dim("seq", max=MAX)},)
    dump = tmp_path / "dump"
    art = bladepack.optimize(model, [(torch.randn(2, 9, 48),)], dims, options=bladepack.CompileOptions(dump_dir=dump))
    plan = (dump / "05-fusion.cpu.txt").read_text()
    stored = re.search(r"attention -> %\d+ = \{[^}]*\} stored as permute%\d+ reshape%\d+", plan)
    assert (stored is not None) == (use == "merge"), plan
    copies = [ln for ln in plan.splitlines() if ": loop[" in ln and "permute%" in ln]
    assert len(copies) == (0 if use == "merge" else 1), plan
    m = bladepack.load(art.to_bytes(), executor="native")
    for b, n in [(1, 1), (3, 7), (1, 64), (3, 65), (1, MAX)]:
        x = torch.randn(b, n, 48, generator=torch.Generator().manual_seed(n))
        with torch.no_grad():
            want = model(x)
        for got, ref in zip(as_tuple(m(x)), as_tuple(want), strict=True):
            assert rel_err(got, ref) <= 1e-5, (b, n, rel_err(got, ref))
