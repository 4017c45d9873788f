"""Note [Negative indices] (bladepack/opset/attrs.py): an index is read as eager reads it. torch's
embedding, index_select and gather raise on a negative index, so the artifact does too (an
ExecutionError naming the lookup and the model's source line), while advanced indexing (`x[idx]`)
counts a negative index from the end; past either end is an error everywhere. Checked at the
boundaries (-size - 1, -size, -1, 0, size - 1, size) on the native and reference executors and
through the C++ runtime's bpk-run, against eager."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import bladepack
from bladepack.errors import IndexRangeError
from tests.test_cpp_runtime import TMP, bpk_run, save_inputs

SIZE = 10


class _Embedding(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(SIZE, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.emb(ids) * 2.0  # the lookup fuses into the scaling kernel


class _Table(torch.nn.Module):
    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(SIZE, 4, generator=torch.Generator().manual_seed(0)))
        self.fn = fn

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fn(self.table, ids)


def _ids(v: int, n: int) -> np.ndarray:
    """n indices, the second of them `v`."""
    ids = np.array([1, 2, 3, 4, 5, 6][:n])
    ids[1] = v
    return ids


# (name, model, whether a negative index counts from the end, the index input of a call: `v` among n)
CASES: list[tuple[str, Callable[[], torch.nn.Module], bool, Callable[[int, int], np.ndarray]]] = [
    ("embedding", _Embedding, False, lambda v, n: _ids(v, n)[None]),
    ("index_select", lambda: _Table(lambda t, i: torch.index_select(t, 0, i)), False, _ids),
    ("gather", lambda: _Table(lambda t, i: torch.gather(t, 0, i)), False, lambda v, n: np.stack([_ids(v, n)] * 4, 1)),
    ("advanced indexing", lambda: _Table(lambda t, i: t[i]), True, _ids),
]
BOUNDARIES = (-SIZE - 1, -SIZE, -1, 0, SIZE - 1, SIZE)


@pytest.fixture(scope="module", params=CASES, ids=[c[0] for c in CASES])
def case(request: pytest.FixtureRequest) -> tuple[tuple[Any, ...], torch.nn.Module, Any]:
    _, make, _, call = request.param
    model = make().eval()
    samples = [(torch.from_numpy(call(3, n)),) for n in (3, 5)]  # the index count is dynamic
    return request.param, model, bladepack.optimize(model, samples)


def _eager(model: torch.nn.Module, ids: np.ndarray) -> np.ndarray | None:
    try:
        with torch.no_grad():
            out: np.ndarray = model(torch.from_numpy(ids)).numpy()
            return out
    except (IndexError, RuntimeError):
        return None  # eager refuses the index


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_python_loader_reads_indices_as_eager(case: Any, executor: str) -> None:
    (name, _, wraps, call), model, art = case
    m = bladepack.load(art.to_bytes(), executor=executor)
    lowest = -SIZE if wraps else 0
    for v in BOUNDARIES:
        ids = call(v, 4)
        want = _eager(model, ids)
        assert (want is not None) == (lowest <= v < SIZE), (name, v)  # the rule is eager's
        if want is None:
            with pytest.raises(IndexRangeError, match=rf"index out of range.*\[{lowest}, {SIZE - 1}\]") as e:
                m(ids)
            assert "test_negative_indices.py" in str(e.value), str(e.value)  # the model's own line
        else:
            np.testing.assert_allclose(m(ids), want, rtol=1e-6, atol=0)


def test_cpp_runtime_reads_indices_as_eager(case: Any, release: Path) -> None:
    """bpk-run raises the Python loader's errors, word for word, and computes its results."""
    (name, _, _, call), _, art = case
    path = TMP / f"indices-{name.replace(' ', '_')}.bpk"
    art.save(path)
    m = bladepack.load(path)
    for v in BOUNDARIES:
        ids = call(v, 4)
        args = save_inputs([ids], [t.name for t in m.signature.inputs], f"indices-{v}")
        r = bpk_run(release, str(path), *args)
        try:
            m(ids)
        except IndexRangeError as e:
            assert r.returncode == 1 and f"bad index: {e}" in r.stderr, (name, v, r.stderr)
        else:
            assert r.returncode == 0, (name, v, r.stderr)
