"""The Python loader: input checks, guards, torch/numpy interop, output buffers, threads, isolation."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import bladepack
from bladepack import InputError, ShapeGuardError
from tests.helpers import rel_err

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def mlp(mlp_artifact) -> bladepack.LoadedModule:
    return bladepack.load(mlp_artifact.to_bytes())


def test_signature_text(mlp) -> None:
    assert str(mlp.signature) == "(x: float32[batch, 64]) -> (output0: float32[batch, 10]) where batch in [1, 64]"


def test_wrong_input_count(mlp) -> None:
    x = np.zeros((2, 64), np.float32)
    with pytest.raises(InputError, match=r"expected 1 inputs \(x\), got 2"):
        mlp(x, x)


def test_wrong_rank(mlp) -> None:
    with pytest.raises(InputError, match=r"input 'x' has rank 3 .* expected rank 2"):
        mlp(np.zeros((2, 64, 1), np.float32))


def test_wrong_dtype(mlp) -> None:
    with pytest.raises(InputError, match="input 'x' has dtype float64; expected float32"):
        mlp(np.zeros((2, 64)))


def test_static_dim_mismatch(mlp) -> None:
    with pytest.raises(InputError, match="input 'x' dimension 1 is 63; it is static and must be 64"):
        mlp(np.zeros((2, 63), np.float32))


@pytest.mark.parametrize("batch", [0, 65, 1000])
def test_out_of_range(mlp, batch: int) -> None:
    msg = rf"input 'x' dimension 0 \(symbol 'batch'\) is {batch}; the allowed range is \[1, 64\]"
    with pytest.raises(ShapeGuardError, match=msg):
        mlp(np.zeros((batch, 64), np.float32))


def test_range_ends_accepted(mlp) -> None:
    for b in (1, 64):
        assert mlp(np.zeros((b, 64), np.float32)).shape == (b, 10)


def test_symbols_must_agree(two_input_artifact) -> None:
    m = bladepack.load(two_input_artifact.to_bytes())
    with pytest.raises(
        ShapeGuardError, match=r"input 'mask' dimension 1 is 6, but it must equal input 'x' dimension 1 .* which is 5"
    ):
        m(np.zeros((2, 5, 3), np.float32), np.zeros((2, 6), np.float32))


def test_kwargs_and_unknown_names(two_input_artifact) -> None:
    m = bladepack.load(two_input_artifact.to_bytes())
    x, mask = np.ones((2, 5, 3), np.float32), np.ones((2, 5), np.float32)
    assert np.array_equal(m(x, mask=mask), m(x=x, mask=mask))
    with pytest.raises(InputError, match="unknown input name"):
        m(x=x, masks=mask)


def test_torch_in_torch_out_numpy_in_numpy_out(mlp) -> None:
    x = torch.randn(3, 64, requires_grad=True)
    y = mlp(x)
    assert isinstance(y, torch.Tensor) and y.shape == (3, 10)
    assert isinstance(mlp(x.detach().numpy()), np.ndarray)
    with pytest.raises(InputError, match="dtype"):
        mlp(torch.randn(3, 64, dtype=torch.float64))


def test_outputs_into_caller_buffers(mlp) -> None:
    x = np.random.default_rng(0).standard_normal((5, 64), dtype=np.float32)
    buf = np.empty((5, 10), np.float32)
    mlp.run([x], outputs=[buf])
    assert np.array_equal(buf, mlp(x))
    with pytest.raises(InputError, match="output buffer"):
        mlp.run([x], outputs=[np.empty((4, 10), np.float32)])


def test_shape_program_cached_per_signature(mlp, monkeypatch) -> None:
    mlp._executor.prepare.clear()
    fast = getattr(mlp._executor, "fast", None)
    if fast is not None:
        fast._plans.clear()
    evaluated = []
    program = mlp._manifest.program
    real = type(program).evaluate
    monkeypatch.setattr(type(program), "evaluate", lambda self, shapes: evaluated.append(shapes) or real(self, shapes))
    for b in (2, 3, 2, 3, 2):
        mlp(np.zeros((b, 64), np.float32))
    assert sorted(k[0][0] for k in mlp._executor.prepare.signatures()) == [2, 3]
    assert [s[0][0] for s in evaluated] == [2, 3]
    assert mlp.output_shapes((7, 64)) == [(7, 10)]


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_shape_cache_is_bounded(mlp_artifact, monkeypatch, executor: str) -> None:
    """Note [Prepared plans]: at most BLADEPACK_SHAPE_CACHE signatures stay prepared (fast path too),
    least recently used out first; evicted signatures still run, prepared again."""
    monkeypatch.setenv("BLADEPACK_SHAPE_CACHE", "3")
    m = bladepack.load(mlp_artifact.to_bytes(), executor=executor)
    ref = bladepack.load(mlp_artifact.to_bytes(), executor="reference")
    rng = np.random.default_rng(3)
    for b in (1, 2, 3, 1, 4, 5, 6, 2, 64):
        x = rng.standard_normal((b, 64), dtype=np.float32)
        assert rel_err(m(x), ref(x)) <= 1e-6
    cache = m._executor.prepare
    assert len(cache) == 3 and [k[0][0] for k in cache.signatures()] == [6, 2, 64]
    fast = getattr(m._executor, "fast", None)
    assert fast is None or len(fast._plans) <= 3


def test_shape_cache_lru_order() -> None:
    from bladepack.loader.executor import ShapeCache

    made: list[int] = []
    cache = ShapeCache(lambda key: made.append(key[0][0]) or key[0][0] * 10, limit=2)
    assert [cache(((n,),)) for n in (1, 2, 1, 3, 2, 1)] == [10, 20, 10, 30, 20, 10]
    assert made == [1, 2, 3, 2, 1]  # 1 was used last before 3 came, so 2 went first
    with pytest.raises(ValueError, match="at least one"):
        ShapeCache(lambda key: 0, limit=0)


def test_concurrent_calls_are_safe(mlp_artifact) -> None:
    m = bladepack.load(mlp_artifact.to_bytes())
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((b, 64), dtype=np.float32) for b in (1, 2, 3, 5, 8, 13)]
    expected = [m(x) for x in inputs]
    m._executor.prepare.clear()
    errors: list[str] = []

    def worker(k: int) -> None:
        for i in range(30):
            j = (k + i) % len(inputs)
            if not np.array_equal(m(inputs[j]), expected[j]):
                errors.append(f"thread {k} call {i}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_loader_runs_without_torch_or_sympy(mlp_artifact, tmp_path: Path) -> None:
    """A fresh process where importing torch or sympy fails loads and runs the artifact."""
    mlp_artifact.save(tmp_path / "m.bpk")
    x = np.random.default_rng(2).standard_normal((3, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    expected = bladepack.load(tmp_path / "m.bpk")(x)
    np.save(tmp_path / "expected.npy", expected)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None
        sys.modules["sympy"] = None
        import numpy as np
        import bladepack
        m = bladepack.load({str(tmp_path / "m.bpk")!r})
        y = m(np.load({str(tmp_path / "x.npy")!r}))
        assert np.array_equal(y, np.load({str(tmp_path / "expected.npy")!r}))
        assert "torch" not in [k for k, v in sys.modules.items() if v is not None]
        print("ok", m.signature)
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok")


def test_index_out_of_table_is_a_clear_error() -> None:
    emb = torch.nn.Embedding(10, 4)
    art = bladepack.optimize(emb, [(torch.tensor([[1, 2]]),), (torch.tensor([[1, 2, 3]]),)])
    m = bladepack.load(art.to_bytes())
    with pytest.raises(bladepack.loader.ExecutionError, match=r"index out of range.*\[-10, 9\]"):
        m(np.array([[1, 11]]))
    assert rel_err(m(torch.tensor([[3, 4, 5]])), emb(torch.tensor([[3, 4, 5]]))) == 0.0


def test_too_small_for_a_window_is_an_error_not_an_empty_result() -> None:
    pool = torch.nn.AvgPool2d(2)
    art = bladepack.optimize(pool, [(torch.randn(1, 2, 6, 6),), (torch.randn(1, 2, 9, 7),)])
    m = bladepack.load(art.to_bytes())
    assert m(np.ones((1, 2, 3, 2), np.float32)).shape == (1, 2, 1, 1)
    with pytest.raises(ShapeGuardError, match=r"too small for avg_pool2d .* output size along dimension 3 would be 0"):
        m(np.ones((1, 2, 4, 1), np.float32))


def test_inputs_by_name_in_any_order_and_clear_mistakes(two_input_artifact) -> None:
    m = bladepack.load(two_input_artifact.to_bytes())
    x, mask = np.ones((2, 5, 3), np.float32), np.ones((2, 5), np.float32)
    assert np.array_equal(m(mask=mask, x=x), m(x, mask))
    with pytest.raises(InputError, match=r"missing input\(s\) \['x'\]"):
        m(mask=mask)
    with pytest.raises(InputError, match=r"\['x'\] given both by position and by name"):
        m(x, x=x)
