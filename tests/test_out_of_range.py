"""Out-of-range policy (Note [Batch-like dims] in ir/batch_dims.py, loader/out_of_range.py): the proof
per dim on the samples and on models that mix rows, and the split policy against eager at 3x the
maximum batch, through numpy and torch, with caller buffers, and its refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import bladepack
from bladepack.api import Artifact
from bladepack.errors import BpkFormatError, InputError, ShapeGuardError
from samples.registry import SAMPLES
from tests.helpers import as_tuple, with_manifest
from tests.test_cpp_runtime import bpk_run, save_inputs


def _dims_with_batch_max(dyn: dict[str, dict[int, bladepack.Dim]], top: int) -> dict[str, dict[int, bladepack.Dim]]:
    return {
        k: {ax: bladepack.Dim("batch", 1, top) if d.name == "batch" else d for ax, d in axes.items()}
        for k, axes in dyn.items()
    }


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_samples_split_at_three_times_the_maximum_batch(name: str) -> None:
    """Every sample's batch is proven batch-like; with batch in [1, 4], a batch of 13 runs as four
    pieces and matches eager (torch in and out, numpy in and out, caller buffers)."""
    s = SAMPLES[name]
    model = s.build().eval()
    g = torch.Generator().manual_seed(3)
    samples = [s.make_inputs(g, **{**s.base_dims, "batch": b}) for b in (2, 3)]
    art = bladepack.optimize(model, samples, _dims_with_batch_max(s.dynamic_shapes, 4))
    assert art.plan.batch_dims["batch"]["split"], art.plan.batch_dims
    loaded = bladepack.load(art.to_bytes(), on_out_of_range={"batch": "split"})
    args = s.make_inputs(g, **{**s.base_dims, "batch": 13})
    with torch.no_grad():
        want = as_tuple(model(*args))
    got = as_tuple(loaded(*args))
    for o, w in zip(got, want):
        assert o.shape == w.shape
        assert torch.allclose(o, w, rtol=1e-4, atol=1e-5), (name, float((o - w).abs().max()))
    arrays = [a.numpy() for a in args]
    outs = loaded.run(arrays)
    for o, w in zip(outs, want):
        np.testing.assert_allclose(o, w.numpy(), rtol=1e-4, atol=1e-5)
    bufs = [np.empty_like(o) for o in outs]
    loaded.run(arrays, bufs)
    assert all(np.array_equal(b, o) for b, o in zip(bufs, outs))
    with pytest.raises(ShapeGuardError, match="allowed range"):  # the default policy
        bladepack.load(art.to_bytes())(*args)


class _BatchNormTrain(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centered = x - x.mean(0, keepdim=True)
        return centered / ((centered * centered).mean(0, keepdim=True) + 1e-5).sqrt()


class _SumRows(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 + x.sum(0)


class _Flatten(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(-1)


@pytest.mark.parametrize(
    "model, why",
    [
        (_BatchNormTrain(), "reduces over the dim"),
        (_SumRows(), "reduces over the dim"),
        (_Flatten(), "holds batch other than as one whole axis"),
    ],
)
def test_split_is_refused_where_rows_mix(model: nn.Module, why: str) -> None:
    art = bladepack.optimize(model, [(torch.randn(3, 4),), (torch.randn(5, 4),)], ({0: bladepack.Dim("batch", 1, 8)},))
    proof = art.plan.batch_dims["batch"]
    assert not proof["split"] and why in proof["reason"], proof
    with pytest.raises(
        ValueError, match=r"dim 'batch' cannot be split, because it is not proven batch-like: .*test_out_of_range.py"
    ):
        bladepack.load(art.to_bytes(), on_out_of_range={"batch": "split"})


def test_policy_errors_and_edges() -> None:
    class Rows(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.relu() * 3, x.sum(-1)

    art = bladepack.optimize(Rows(), [(torch.randn(3, 4),), (torch.randn(5, 4),)], ({0: bladepack.Dim("batch", 2, 8)},))
    data = art.to_bytes()
    with pytest.raises(ValueError, match="the policies are error, split"):
        bladepack.load(data, on_out_of_range={"batch": "wrap"})
    with pytest.raises(ValueError, match="names dim 'seq'; the artifact's dynamic dims are: batch"):
        bladepack.load(data, on_out_of_range={"seq": "split"})
    loaded = bladepack.load(data, on_out_of_range={"batch": "split"})
    for n in (2, 8, 9, 17, 24, 25):  # in range, just above, uneven pieces, exact multiples
        x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        a, b = loaded(x)
        np.testing.assert_allclose(a, np.maximum(x, 0) * 3, rtol=1e-6)
        np.testing.assert_allclose(b, x.sum(-1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ShapeGuardError, match="allowed range"):  # below the minimum: not the policy's business
        loaded(np.ones((1, 4), np.float32))
    assert bladepack.load(data, on_out_of_range={"batch": "error"})(np.ones((3, 4), np.float32))[0].shape == (3, 4)
    tight = bladepack.optimize(
        Rows(), [(torch.randn(6, 4),), (torch.randn(8, 4),)], ({0: bladepack.Dim("batch", 6, 8)},)
    )
    with pytest.raises(InputError, match=r"cannot be split into pieces inside its range \[6, 8\]"):
        bladepack.load(tight.to_bytes(), on_out_of_range={"batch": "split"})(np.ones((9, 4), np.float32))


def test_inspect_lists_the_policies() -> None:
    from bladepack.inspect import inspect_text, manifest_summary

    s = SAMPLES["llama"]
    art = bladepack.optimize(s.build(), s.export_samples(), s.dynamic_shapes)
    text = inspect_text(manifest_summary(art._parts()[0]))
    assert "  batch in [1, inf]; above the range: error (default) or split (proven batch-like)\n" in text, text
    assert "  past in [1, 1023]; above the range: error only (not batch-like: slice at llama.py:" in text, text


class _Axes(nn.Module):
    """The batch on axis 0 of one input and on axis 1 of another (the pieces are copies there), and an
    output without it (taken from the first piece)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return (x * 2).relu() + 1, y.sin() * self.w, self.w * 3


@pytest.fixture(scope="module")
def axes() -> tuple[_Axes, Artifact]:
    batch = bladepack.Dim("batch", 1, 4)
    model = _Axes()
    samples = [(torch.randn(b, 6), torch.randn(3, b, 5)) for b in (2, 3)]
    return model, bladepack.optimize(model, samples, ({0: batch}, {1: batch}))


def test_output_shapes_and_axes_beyond_the_first(axes: tuple[_Axes, Artifact]) -> None:
    model, art = axes
    loaded = bladepack.load(art.to_bytes(), on_out_of_range={"batch": "split"})
    assert loaded.output_shapes((13, 6), (3, 13, 5)) == [(13, 6), (3, 13, 5), (5,)]
    assert loaded.output_shapes((3, 6), (3, 3, 5)) == [(3, 6), (3, 3, 5), (5,)]
    x, y = torch.randn(13, 6), torch.randn(3, 13, 5)
    with torch.no_grad():
        want = model(x, y)
    for got, w in zip(loaded(x, y), want):
        assert torch.allclose(got, w, rtol=1e-6, atol=1e-7)
    bufs = [np.empty((13, 6), np.float32), np.empty((3, 12, 5), np.float32), np.empty(5, np.float32)]
    with pytest.raises(
        InputError, match=r"output buffer 'output1' is float32\[3, 12, 5\]; the result is float32\[3, 13, 5\]"
    ):
        loaded.run([x.numpy(), y.numpy()], bufs)


def test_malformed_proof_record_is_a_format_error(axes: tuple[_Axes, Artifact]) -> None:
    _, art = axes
    for axes_edit in ([0, 0], [0], [1, 1], [-1, -1], "x"):
        edited = with_manifest(art, lambda m: m["batch_dims"]["batch"].__setitem__("inputs", axes_edit))
        with pytest.raises(BpkFormatError, match=r"batch_dims\['batch'\] does not give the axis of 'batch'"):
            bladepack.load(edited, on_out_of_range={"batch": "split"})
        # without the policy nothing reads the record
        assert bladepack.load(edited)(np.ones((2, 6), np.float32), np.ones((3, 2, 5), np.float32))[0].shape == (2, 6)


# -- the C++ runtime: the same pieces, the same results, the same refusals


def _cpp_outputs(
    build: Path, path: Path, arrays: list[np.ndarray], names: list[str], out_names: list[str], tag: str, *flags: str
) -> list[np.ndarray]:
    out_dir = path.parent / f"out-{tag}"
    out_dir.mkdir(exist_ok=True)
    r = bpk_run(build, str(path), *save_inputs(arrays, names, tag), "--output-dir", str(out_dir), *flags)
    assert r.returncode == 0, r.stderr
    return [np.load(out_dir / f"{n}.npy") for n in out_names]


@pytest.mark.parametrize("name", ["encoder", "llama"])
def test_cpp_split_matches_python(release: Path, name: str, tmp_path: Path) -> None:
    """bpk-run --on-out-of-range batch=split gives the Python loader's results bit for bit at batch 1
    (in range), 4 (the maximum), 5, 13 and 16."""
    s = SAMPLES[name]
    g = torch.Generator().manual_seed(5)
    samples = [s.make_inputs(g, **{**s.base_dims, "batch": b}) for b in (2, 3)]
    path = tmp_path / f"{name}.bpk"
    bladepack.optimize(s.build().eval(), samples, _dims_with_batch_max(s.dynamic_shapes, 4)).save(path)
    loaded = bladepack.load(path, on_out_of_range={"batch": "split"})
    names = [t.name for t in loaded.signature.inputs]
    out_names = [t.name for t in loaded.signature.outputs]
    for b in (1, 4, 5, 13, 16):
        arrays = [a.numpy() for a in s.make_inputs(g, **{**s.base_dims, "batch": b})]
        got = _cpp_outputs(release, path, arrays, names, out_names, f"{name}-{b}", "--on-out-of-range", "batch=split")
        for o, w in zip(got, loaded.run(arrays)):
            assert o.shape == w.shape and np.array_equal(o, w), (name, b)
    r = bpk_run(release, str(path), *save_inputs(arrays, names, f"{name}-plain"))
    assert r.returncode == 1 and "allowed range" in r.stderr, r.stderr


def test_cpp_axes_and_refusals_match_python(release: Path, axes: tuple[_Axes, Artifact], tmp_path: Path) -> None:
    _, art = axes
    path = tmp_path / "axes.bpk"
    art.save(path)
    x, y = torch.randn(11, 6), torch.randn(3, 11, 5)
    got = _cpp_outputs(
        release,
        path,
        [x.numpy(), y.numpy()],
        ["x", "y"],
        ["output0", "output1", "output2"],
        "axes",
        "--on-out-of-range",
        "batch=split",
    )
    want = bladepack.load(path, on_out_of_range={"batch": "split"}).run([x.numpy(), y.numpy()])
    assert all(np.array_equal(o, w) for o, w in zip(got, want))

    def refusal(policy: str, data: bytes | None = None) -> tuple[str, str]:
        target = path
        if data is not None:
            target = tmp_path / "edited.bpk"
            target.write_bytes(data)
        r = bpk_run(release, str(target), "--on-out-of-range", policy)
        assert r.returncode == 1, r.stdout
        dim, _, pol = policy.partition("=")
        with pytest.raises((ValueError, BpkFormatError)) as e:
            bladepack.load(target, on_out_of_range={dim: pol})
        return r.stderr.strip().split(": ", 2)[-1], str(e.value)

    for policy in ("batch=wrap", "seq=split"):
        cpp, py = refusal(policy)
        assert cpp == py, (cpp, py)
    rows = bladepack.optimize(
        _SumRows(), [(torch.randn(3, 4),), (torch.randn(5, 4),)], ({0: bladepack.Dim("batch", 1, 8)},)
    )
    cpp, py = refusal("batch=split", rows.to_bytes())
    assert cpp == py and "cannot be split, because it is not proven batch-like" in py, (cpp, py)
    cpp, py = refusal(
        "batch=split", with_manifest(art, lambda m: m["batch_dims"]["batch"].__setitem__("outputs", [0, 0, 0]))
    )
    assert cpp.endswith(py.split(": ", 1)[1]) and "does not give the axis" in py, (cpp, py)
    tight = bladepack.optimize(
        _Axes(),
        [(torch.randn(b, 6), torch.randn(3, b, 5)) for b in (3, 4)],
        ({0: bladepack.Dim("batch", 3, 4)}, {1: bladepack.Dim("batch", 3, 4)}),
    )
    tight_path = tmp_path / "tight.bpk"
    tight.save(tight_path)
    arrays = [torch.randn(5, 6).numpy(), torch.randn(3, 5, 5).numpy()]
    r = bpk_run(release, str(tight_path), *save_inputs(arrays, ["x", "y"], "tight"), "--on-out-of-range", "batch=split")
    with pytest.raises(InputError) as e:
        bladepack.load(tight_path, on_out_of_range={"batch": "split"}).run(arrays)
    assert r.returncode == 1 and r.stderr.strip().endswith(str(e.value)), (r.stderr, str(e.value))


@pytest.mark.slow
def test_cpp_split_under_sanitizers(axes: tuple[_Axes, Artifact], tmp_path: Path) -> None:
    from tests import cpp_build

    build = cpp_build.build("sanitize")
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    path = tmp_path / "axes.bpk"
    axes[1].save(path)
    for b in (5, 9, 12):
        arrays = [torch.randn(b, 6).numpy(), torch.randn(3, b, 5).numpy()]
        r = bpk_run(
            build, str(path), *save_inputs(arrays, ["x", "y"], f"asan-{b}"), "--on-out-of-range", "batch=split", env=env
        )
        assert r.returncode == 0 and "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-4000:]
