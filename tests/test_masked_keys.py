"""Note [Masked key blocks]: the CPU attention kernel skips key blocks a padding mask masks entirely.

Padding masks of every form the kernel reads (a masked_fill with the dtype's lowest value or -inf, a
where keeping the unmasked keys, one conjunct of a causal-and-padding mask), valid lengths at the key
block's edges (0, 1, 63, 64, 65, all), query counts of each variant (1 and 3 rows, 8, 80) and every
ISA level, against eager; and the rows where a skipped key would count (no unmasked key above the
fill), which take a second pass over every key.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import bladepack
from bladepack import Dim
from bladepack.options import LoaderOptions
from tests.helpers import all_isas, rel_err, runnable_levels

MAX = 200
VALID = (0, 1, 63, 64, 65, 130)  # valid keys per sequence (clipped to the key count)
HEAD = 40  # the AVX2 library's six-row groups, value chunks of 16, 16 and 8 (Note [Value chunks per ISA])


class _Masked(torch.nn.Module):
    """Scores scaled by `scale`, then masked by `form`: "lowest" (masked_fill with finfo.min), "ninf"
    (masked_fill with -inf), "keep" (where(valid, s, -inf)), "causal" (where(valid & k <= q, s, -inf)),
    "fill" (masked_fill with -1e4, old BERT's constant)."""

    def __init__(self, form: str, scale: float = 0.25) -> None:
        super().__init__()
        self.form, self.scale = form, scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        pad = mask[:, None, None, :] == 0
        if self.form == "lowest":
            s = s.masked_fill(pad, torch.finfo(s.dtype).min)
        elif self.form == "ninf":
            s = s.masked_fill(pad, -math.inf)
        elif self.form == "fill":
            s = s.masked_fill(pad, -10000.0)
        elif self.form == "keep":
            s = torch.where(mask[:, None, None, :] > 0, s, -math.inf)
        else:
            qpos = torch.arange(q.shape[2])[:, None] + (k.shape[2] - q.shape[2])
            keep = (mask[:, None, None, :] > 0) & (torch.arange(k.shape[2])[None, :] <= qpos)
            s = torch.where(keep, s, -math.inf)
        return torch.matmul(F.softmax(s, dim=-1), v)


def _make(g: torch.Generator, b: int, sq: int, skv: int, q_scale: float = 1.0) -> tuple[torch.Tensor, ...]:
    if q_scale == 1.0:
        q, k = torch.randn(b, 2, sq, HEAD, generator=g), torch.randn(b, 2, skv, HEAD, generator=g)
    else:  # small integers times a power of two: scores exact in any order of summation
        q = torch.randint(-3, 4, (b, 2, sq, HEAD), generator=g).float() * q_scale
        k = torch.randint(-3, 4, (b, 2, skv, HEAD), generator=g).float()
    v = torch.randn(b, 2, skv, HEAD, generator=g)
    valid = torch.tensor([VALID[(i + skv) % len(VALID)] for i in range(b)])
    mask = (torch.arange(skv)[None, :] < valid[:, None]).long()
    return q, k, v, mask


def _dims() -> dict:
    b, sq, skv = Dim("batch"), Dim("sq", max=MAX), Dim("skv", max=MAX)
    return {"q": {0: b, 2: sq}, "k": {0: b, 2: skv}, "v": {0: b, 2: skv}, "mask": {0: b, 1: skv}}


def _sweep(model: torch.nn.Module, q_scale: float = 1.0) -> str:
    """Every variant and ISA level against eager; the generated CPU source."""
    g = torch.Generator().manual_seed(0)
    art = bladepack.optimize(model, _make(g, 2, 9, 9), dynamic_shapes=_dims(), options=all_isas())
    unit = art.sources.units["cpu"].unit
    assert "if (!live_) continue;" in unit  # the kernel reads the mask per key block
    failures = []
    for isa in runnable_levels(art):
        m = bladepack.load(art.to_bytes(), executor="native", options=LoaderOptions(cpu_isa=isa))
        for sq, skv in [(1, 1), (1, 130), (3, 200), (8, 65), (8, 129), (80, 80), (80, 200), (130, 130)]:
            x = _make(g, 6, sq, skv, q_scale)
            with torch.no_grad():
                want = model(*x)
            got = torch.as_tensor(m(*x))
            if not torch.equal(torch.isnan(got), torch.isnan(want)):
                failures.append(f"{isa} {sq}x{skv}: NaN at other places than eager")
                continue
            finite = ~torch.isnan(want)
            err = rel_err(got[finite], want[finite]) if finite.any() else 0.0
            if not err <= 1e-5:
                failures.append(f"{isa} {sq}x{skv}: {err:.1e}")
    assert not failures, "\n".join(failures)
    return unit


@pytest.mark.parametrize("form", ["lowest", "ninf", "keep", "causal"])
def test_padding_masks_skip_key_blocks(form: str) -> None:
    """Sequences with no valid key: uniform over every key under finfo.min (a second pass), NaN under
    -inf (a plain softmax), as in eager; otherwise each row attends to its valid keys only."""
    model = _Masked(form).eval()
    unit = _sweep(model)
    assert ("for (int pass_ = 0; pass_ < 2; ++pass_)" in unit) == (form == "lowest")


def test_fill_above_the_scores_takes_the_second_pass() -> None:
    """masked_fill with -1e4 where the valid keys' scores are far below it (integer scores scaled by
    4096, thousands apart): the masked keys carry the softmax, as in eager, so the rows read every key
    again."""
    _sweep(_Masked("fill").eval(), q_scale=4096.0)


def test_valid_keys_all_minus_inf_take_the_second_pass() -> None:
    """A row whose valid keys all score -inf (an additive -inf before the padding's finfo.min): eager
    spreads it uniformly over the padded keys, which the first pass skipped."""

    class _Both(torch.nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            s = torch.matmul(q, k.transpose(-1, -2)) * 0.25
            s = s + torch.where(torch.arange(q.shape[2])[:, None] == 0, -math.inf, 0.0)  # query row 0
            s = s.masked_fill(mask[:, None, None, :] == 0, torch.finfo(s.dtype).min)
            return torch.matmul(F.softmax(s, dim=-1), v)

    _sweep(_Both().eval())


def test_values_of_skipped_keys_are_not_read() -> None:
    """The documented difference from eager: a NaN in V at a key whose whole block of 64 is padding is
    never read (eager's 0 * NaN makes every row NaN); one in a block with valid keys is, as in eager."""
    model = _Masked("lowest").eval()
    art = bladepack.optimize(model, _make(torch.Generator().manual_seed(0), 2, 9, 9), dynamic_shapes=_dims())
    m = bladepack.load(art.to_bytes(), executor="native")
    q, k, v, mask = _make(torch.Generator().manual_seed(1), 1, 8, 200)
    mask[:] = (torch.arange(200) < 70).long()
    v[0, :, 150] = math.nan  # keys 128-191: all padding
    with torch.no_grad():
        want = model(q, k, v.nan_to_num(0.0), mask)
    assert rel_err(m(q, k, v, mask), want) <= 1e-5
    v[0, :, 100] = math.nan  # keys 64-127: 64-69 valid
    assert torch.isnan(torch.as_tensor(m(q, k, v, mask))).all()
