"""The Python loader: input checks, guards, torch/numpy interop, output buffers, threads, isolation."""

from __future__ import annotations

import re
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
from bladepack.options import LoaderOptions
from tests.helpers import refused_by_torch, rel_err

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
    """The Python path evaluates the shape program once per signature; the native executor's new
    signatures never evaluate it in Python (Note [Native preparation])."""
    mlp._executor.prepare.clear()
    fast = getattr(mlp._executor, "fast", None)
    if fast is not None:
        fast._plans.clear()
        monkeypatch.setattr(fast, "_prepare", None)  # the Python path, as a library from before it
    evaluated = []
    program = mlp._manifest.program
    real = type(program).evaluate
    monkeypatch.setattr(type(program), "evaluate", lambda self, shapes: evaluated.append(shapes) or real(self, shapes))
    for b in (2, 3, 2, 3, 2):
        mlp(np.zeros((b, 64), np.float32))
    assert sorted(k[0][0] for k in mlp._executor.prepare.signatures()) == [2, 3]
    assert [s[0][0] for s in evaluated] == [2, 3]
    assert mlp.output_shapes((7, 64)) == [(7, 10)]
    if fast is not None:
        monkeypatch.undo()
        monkeypatch.setattr(
            type(program), "evaluate", lambda self, shapes: evaluated.append(shapes) or real(self, shapes)
        )
        evaluated.clear()
        for b in (4, 5, 4, 9):
            mlp(np.zeros((b, 64), np.float32))
        assert evaluated == [] and [k[0][0] for k in fast._plans][-3:] == [4, 5, 9]


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_shape_cache_is_bounded(mlp_artifact, executor: str) -> None:
    """Note [Prepared plans]: at most LoaderOptions.shape_cache signatures stay prepared (fast path too),
    least recently used out first; evicted signatures still run, prepared again."""
    m = bladepack.load(mlp_artifact.to_bytes(), executor=executor, options=LoaderOptions.from_env(shape_cache=3))
    ref = bladepack.load(mlp_artifact.to_bytes(), executor="reference")
    fast = getattr(m._executor, "fast", None)
    rng = np.random.default_rng(3)
    for native in (True, False):  # signatures prepared by the kernel library, then by the Python path
        if fast is None and native:
            continue
        if fast is not None:
            fast._plans.clear()
            if not native:
                fast._prepare = None  # the Python path, as a library from before native preparation
        for b in (1, 2, 3, 1, 4, 5, 6, 2, 64):
            x = rng.standard_normal((b, 64), dtype=np.float32)
            assert rel_err(m(x), ref(x)) <= 1e-6
        assert fast is None or len(fast._plans) <= 3
    cache = m._executor.prepare
    assert len(cache) == 3 and [k[0][0] for k in cache.signatures()] == [6, 2, 64]


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
    with pytest.raises(bladepack.loader.ExecutionError, match=r"index out of range.*\[0, 9\]"):
        m(np.array([[1, 11]]))
    assert rel_err(m(torch.tensor([[3, 4, 5]])), emb(torch.tensor([[3, 4, 5]]))) == 0.0


def test_too_small_for_a_window_is_an_error_not_an_empty_result() -> None:
    pool = torch.nn.AvgPool2d(2)
    art = bladepack.optimize(pool, [(torch.randn(1, 2, 6, 6),), (torch.randn(1, 2, 9, 7),)])
    m = bladepack.load(art.to_bytes())
    assert m(np.ones((1, 2, 3, 2), np.float32)).shape == (1, 2, 1, 1)
    with pytest.raises(ShapeGuardError) as e:
        m(np.ones((1, 2, 4, 1), np.float32))
    if not refused_by_torch(art.notes, e.value):  # a torch that narrowed the range refuses it before the pool
        assert re.search(r"too small for avg_pool2d .* output size along dimension 3 would be 0", str(e.value)), e.value


def test_inputs_by_name_in_any_order_and_clear_mistakes(two_input_artifact) -> None:
    m = bladepack.load(two_input_artifact.to_bytes())
    x, mask = np.ones((2, 5, 3), np.float32), np.ones((2, 5), np.float32)
    assert np.array_equal(m(mask=mask, x=x), m(x, mask))
    with pytest.raises(InputError, match=r"missing input\(s\) \['x'\]"):
        m(mask=mask)
    with pytest.raises(InputError, match=r"\['x'\] given both by position and by name"):
        m(x, x=x)


def test_negative_and_conjugate_views_are_resolved(mlp_artifact) -> None:
    """A torch view with the negative or conjugate bit holds other values than its memory: both the full
    path and the repeated-shape fast path read the values."""
    m = bladepack.load(mlp_artifact.to_bytes())
    ref = bladepack.load(mlp_artifact.to_bytes(), executor="reference")
    x = torch.randn(3, 64)
    z = torch.complex(torch.randn(3, 64), x)
    for view in (torch._neg_view(x), z.conj().imag, torch._neg_view(x)):  # the third call: fast path
        assert view.is_neg()
        want = ref(view.resolve_neg().numpy())
        assert rel_err(m(view), want) <= 1e-6
        assert rel_err(ref(view), want) == 0.0


def test_tensors_without_data_are_input_errors(mlp_artifact) -> None:
    m = bladepack.load(mlp_artifact.to_bytes())
    with pytest.raises(InputError, match="input 'x' is a meta tensor"):
        m(torch.empty(2, 64, device="meta"))


@pytest.fixture(scope="module")
def flatten_artifact() -> bladepack.api.Artifact:
    class Flat(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.float() * 2).reshape(-1)

    samples = [(torch.ones(2, 3, dtype=torch.uint8),), (torch.ones(4, 5, dtype=torch.uint8),)]
    return bladepack.optimize(Flat(), samples)


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_huge_shapes_are_refused_before_allocation(flatten_artifact, executor: str) -> None:
    """Note [Bytes before allocation] and Note [int64 shape arithmetic]: stride-0 views claim any size."""
    m = bladepack.load(flatten_artifact.to_bytes(), executor=executor)
    huge = np.broadcast_to(np.uint8(1), (1 << 40, 3))  # 12 TiB of float32 results, no memory behind it
    with pytest.raises(InputError, match=r"need \d+ bytes .*more than this machine's \d+ bytes of memory"):
        m(huge)
    with pytest.raises(InputError, match="more than this machine's"):
        m(torch.zeros(1, 3, dtype=torch.uint8).expand(1 << 40, 3))
    overflow = np.broadcast_to(np.uint8(1), (1 << 31, 1 << 31))  # 2**62 elements: 2**64 bytes of float32
    with pytest.raises(InputError, match=r"need \d+ bytes \(.*18446744073709551616"):
        m(overflow)
    assert m(np.ones((3, 2), np.uint8)).shape == (6,)  # still fine afterwards


def test_shape_program_computes_in_int64() -> None:
    """Note [int64 shape arithmetic]: the Python evaluator fails where the C++ one does."""
    from bladepack.artifact.shape_program import Op, ShapeProgram

    prog = ShapeProgram(((Op.DIM, 0, 0, 0, 0), (Op.MUL, 1, 0, 0, 0), (Op.ADD, 2, 1, 1, 0)), 3, ())
    assert prog.evaluate([((1 << 31) - 1,)])[2] == 2 * ((1 << 31) - 1) ** 2
    with pytest.raises(ShapeGuardError, match="shape program overflowed int64 at instruction 2"):
        prog.evaluate([(1 << 31,)])  # 2**62 + 2**62 = 2**63
    with pytest.raises(ShapeGuardError, match="shape program overflowed int64 at instruction 1"):
        prog.evaluate([(1 << 32,)])


def test_lying_shape_programs_are_refused_at_load(mlp_artifact) -> None:
    from bladepack.artifact import format as bpk_format
    from bladepack.artifact.shape_program import Op, ShapeProgram
    from bladepack.errors import BpkFormatError

    bpk = bpk_format.read(mlp_artifact.to_bytes())
    sections = [bpk_format.Section(n, bytes(bpk.section(n))) for n in bpk.section_names]
    base = {k: v for k, v in bpk.manifest.items() if k != "sections"}
    prog = ShapeProgram.from_manifest(base["shape_program"])

    def load_with(program: ShapeProgram) -> None:
        manifest = {**base, "shape_program": program.to_manifest()}
        bladepack.load(b"".join(bytes(c) for c in bpk_format.encode(manifest, sections)))

    with pytest.raises(BpkFormatError, match=r"shape program: 1000000000 registers for \d+ instructions"):
        load_with(ShapeProgram(prog.code, 10**9, prog.messages))
    dim = next(k for k, ins in enumerate(prog.code) if ins[0] == Op.DIM)
    for a, b in ((0, 5), (3, 0), (-1, 0)):
        code = list(prog.code)
        code[dim] = (Op.DIM, code[dim][1], a, b, 0)
        with pytest.raises(BpkFormatError, match=f"DIM reads input {a} axis {b}, which the signature does not have"):
            load_with(ShapeProgram(tuple(code), prog.num_registers, prog.messages))


def test_deeply_nested_attributes_are_refused_at_load(mlp_artifact) -> None:
    from bladepack.artifact import format as bpk_format
    from bladepack.errors import BpkFormatError

    bpk = bpk_format.read(mlp_artifact.to_bytes())
    sections = [bpk_format.Section(n, bytes(bpk.section(n))) for n in bpk.section_names]
    manifest = {k: v for k, v in bpk.manifest.items() if k != "sections"}
    nested: list[object] = [1]
    for _ in range(1000):
        nested = [nested]
    steps = [dict(s) for s in manifest["plan"]["steps"]]
    steps[0] = {**steps[0], "attrs": {**steps[0]["attrs"], "deep": nested}}
    manifest["plan"] = {"steps": steps}
    data = b"".join(bytes(c) for c in bpk_format.encode(manifest, sections))
    with pytest.raises(BpkFormatError, match="step 0's attributes nest deeper than 8 levels"):
        bladepack.load(data)
