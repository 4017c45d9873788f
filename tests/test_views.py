"""Strided views through chains of layout ops agree with numpy on every element (hypothesis), and
hierarchical intermediate dims resolve when a later op makes the view flat again."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from bladepack.ir.views import View


def _gather(base: np.ndarray, v: View) -> np.ndarray:
    out = np.empty(tuple(int(d) for d in v.shape), dtype=base.dtype)
    for idx in itertools.product(*[range(int(d)) for d in v.shape]):
        out[idx] = base.flat[int(v.offset) + sum(i * int(s) for i, s in zip(idx, v.strides))]
    return out


@st.composite
def chains(draw: Any) -> tuple[tuple[int, ...], list[tuple[str, Any]]]:
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4)))
    ops: list[tuple[str, Any]] = []
    cur = shape
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["reshape", "permute", "slice"]))
        if kind == "permute":
            perm = tuple(draw(st.permutations(range(len(cur)))))
            ops.append((kind, perm))
            cur = tuple(cur[p] for p in perm)
        elif kind == "slice":
            axis = draw(st.integers(0, len(cur) - 1))
            start = draw(st.integers(0, cur[axis] - 1))
            step = draw(st.integers(1, 2))
            length = len(range(start, cur[axis], step))
            ops.append((kind, (axis, start, step, length)))
            cur = cur[:axis] + (length,) + cur[axis + 1 :]
        else:  # a random regrouping of the same element count
            n = int(np.prod(cur))
            factors = [f for f in range(1, n + 1) if n % f == 0]
            new: list[int] = []
            left = n
            while left > 1 and len(new) < 4:
                f = draw(st.sampled_from([f for f in factors if left % f == 0]))
                new.append(f)
                left //= f
            new.append(left)
            ops.append((kind, tuple(new)))
            cur = tuple(new)
    return shape, ops


@settings(max_examples=300, deadline=None)
@given(chains())
def test_views_agree_with_numpy(chain) -> None:
    shape, ops = chain
    base = np.arange(int(np.prod(shape))).reshape(shape)
    want = base
    v: View | None = View.whole(0, shape)
    for kind, arg in ops:
        if kind == "permute":
            want = want.transpose(arg)
            v = v.permute(arg) if v is not None else None
        elif kind == "slice":
            axis, start, step, length = arg
            want = want[(slice(None),) * axis + (slice(start, None, step),)]
            v = v.slice(axis, start, step, length) if v is not None else None
        else:
            want = want.reshape(arg)
            v = v.reshape(arg) if v is not None else None
    if v is not None and v.flat:
        assert np.array_equal(_gather(base, v), want)
    if all(k == "reshape" for k, _ in ops):  # reshapes of a dense array are always flat views
        assert v is not None and v.flat


def test_attention_head_split_is_a_view_again() -> None:
    L, N, H, hd = sympy.symbols("L N H hd", positive=True, integer=True)
    qkv = View.whole(0, (L, N, 3 * H * hd))
    q = qkv.slice(2, 0, 1, H * hd)
    mid = q.reshape((L, N * H, hd))  # not one stride per dim: N and H do not merge
    assert mid is not None and not mid.flat
    out = mid.permute((1, 0, 2)).reshape((N, H, L, hd))
    assert out is not None and out.flat
    assert out.strides == (3 * H * hd, hd, 3 * H * hd * N, 1)
