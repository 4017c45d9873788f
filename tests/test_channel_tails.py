"""Channel and column tails: every channel of a classifier head, pooled or dense, at every ISA level this
CPU runs and at 1-4 threads (issue: a 1x1 convolution to 1000 channels, pooled and soft-maxed, was
reported with its last channels zeroed, 996-999 at one thread and 492-499 / 992-999 at two).

Each check compares element by element and names the channels that differ, so a tail that is skipped
(zeros) or written twice shows as a run of channel numbers, not as a small normwise error."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

import bladepack
from bladepack.compiled import Artifact
from bladepack.errors import CompileError
from bladepack.loader.native_cpu import NativeUnavailable
from bladepack.options import CompileOptions, LoaderOptions
from tests.helpers import all_isas, runnable_levels

THREADS = (1, 2, 3, 4)
SHAPES = ((1, 1), (2, 3), (3, 7), (1, 13))  # (batch, height = width)


def _bad_channels(got: np.ndarray, ref: np.ndarray, tol: float = 1e-5) -> np.ndarray:
    """The channels (last axis) where some element differs by more than tol * max(1, max |ref|)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, (got.shape, got.dtype, ref.shape, ref.dtype)
    err = np.abs(got.astype(np.float64) - ref.astype(np.float64)) > tol * max(1.0, float(np.abs(ref).max()))
    return np.nonzero(err.reshape(-1, got.shape[-1]).any(axis=0))[0]


def _outputs(out: object) -> list[np.ndarray]:
    return [np.asarray(o) for o in out] if isinstance(out, (list, tuple)) else [np.asarray(out)]


def _check_everywhere(art: Artifact, run_ref, inputs: Sequence[np.ndarray], names: Sequence[str], where: Path) -> None:
    """Run `art` in every ISA library this CPU runs at 1-4 threads on each input; every output's every
    channel matches `run_ref`."""
    where.write_bytes(art.to_bytes())
    levels = runnable_levels(art)
    assert levels, art.cpu_libraries
    wants = [run_ref(x) for x in inputs]
    failures = []
    for isa in levels:
        for threads in THREADS:
            mod = bladepack.load(where, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=threads))
            assert mod.executor == f"native ({isa})"
            for x, want in zip(inputs, wants):
                for name, got, ref in zip(names, _outputs(mod(x)), want, strict=True):
                    bad = _bad_channels(np.asarray(got), ref)
                    if len(bad):
                        failures.append(
                            f"{isa}, {threads} threads, input {x.shape}, {name}: channels {bad.tolist()[:16]}"
                        )
    assert not failures, "\n".join(failures)


class _ClassifierHeads(nn.Module):
    """The reported head and its relatives over a small channels-last stem: 1x1 convolution -> ReLU ->
    global average pool -> softmax; pool first, then the 1x1 convolution (a dense layer on the pooled
    features); a linear layer on the pooled features; a global max pool of the head's convolution."""

    def __init__(self, cin: int, classes: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, cin, 3, padding=1)
        self.conv_head = nn.Conv2d(cin, classes, 1)
        self.pool_head = nn.Conv2d(cin, classes, 1)
        self.linear_head = nn.Linear(cin, classes + 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = torch.relu(self.stem(x))
        c = self.conv_head(f)
        pooled = f.mean((2, 3), keepdim=True)
        return (
            torch.softmax(torch.relu(c).mean((2, 3)), 1),
            torch.softmax(self.pool_head(pooled).flatten(1), 1),
            torch.softmax(self.linear_head(pooled.flatten(1)), 1),
            c.amax((2, 3)),
        )


def _torch_case(model: nn.Module, channels: int, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = model.eval()
    hw = Dim("hw", min=1, max=32)
    dims = {0: Dim("batch", min=1, max=16), 2: hw, 3: hw}
    art = bladepack.optimize(model, (torch.randn(2, channels, 5, 5),), dynamic_shapes=(dims,), options=all_isas())
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((b, channels, s, s), dtype=np.float32) for b, s in SHAPES]

    def run_ref(x: np.ndarray) -> list[np.ndarray]:
        with torch.no_grad():
            return [o.numpy() for o in model(torch.from_numpy(x))]

    names = [o.name for o in art.plan.outputs]
    _check_everywhere(art, run_ref, inputs, names, tmp_path / "heads.bpk")


def test_classifier_heads_of_1000_classes(tmp_path: Path) -> None:
    """The reported head (1000 classes), pooled, dense and max-pooled, on a 16-channel stem."""
    _torch_case(_ClassifierHeads(16, 1000), 3, tmp_path)


def test_classifier_head_from_onnx(tmp_path: Path) -> None:
    """The reported form, from ONNX: Conv 1x1 (512 -> 1000) -> Relu -> GlobalAveragePool -> Flatten ->
    Softmax, as SqueezeNet ends, on 13 x 13 maps and dynamic batch."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((1000, 512, 1, 1)) * 0.05).astype(np.float32)
    b = (rng.standard_normal(1000) * 0.1).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Softmax", ["f"], ["y"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 512, 13, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1000])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    path = tmp_path / "head.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    art = bladepack.optimize(str(path), options=all_isas())

    def run_ref(x: np.ndarray) -> list[np.ndarray]:
        c = np.maximum(np.einsum("oi,bihw->bohw", w[:, :, 0, 0].astype(np.float64), x) + b[:, None, None], 0)
        p = c.mean(axis=(2, 3))
        e = np.exp(p - p.max(axis=1, keepdims=True))
        return [(e / e.sum(axis=1, keepdims=True)).astype(np.float32)]

    inputs = [rng.standard_normal((n, 512, 13, 13), dtype=np.float32) for n in (1, 2, 3)]
    _check_everywhere(art, run_ref, inputs, ["y"], tmp_path / "head.bpk")


class _PoolsOfAnyWidth(nn.Module):
    """Reductions and row ops whose channel count is a dynamic dim: one kernel covers every count."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.softmax(x.mean((2, 3)), 1),
            x.amax((2, 3)),
            torch.softmax(x, 1).sum((2, 3)),
            torch.relu(x).permute(0, 2, 3, 1).mean((1, 2)),
        )


def test_pools_at_every_channel_count_1_to_1030(tmp_path: Path) -> None:
    """Channel counts 1-1030, every one (a dynamic dim, so the same kernels serve all), in every ISA
    library this CPU runs at 1 and 2 threads (the channel split of two threads puts a tail mid-range)."""
    model = _PoolsOfAnyWidth().eval()
    dims = {0: Dim("batch", min=1, max=4), 1: Dim("channels", min=1, max=1030), 2: Dim("hw", min=1, max=8)}
    dims[3] = dims[2]
    art = bladepack.optimize(model, (torch.randn(2, 7, 3, 3),), dynamic_shapes=(dims,), options=all_isas())
    path = tmp_path / "pools.bpk"
    path.write_bytes(art.to_bytes())
    rng = np.random.default_rng(2)
    failures = []
    for isa in runnable_levels(art):
        for threads in (1, 2):
            mod = bladepack.load(path, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=threads))
            for c in range(1, 1031):
                x = rng.standard_normal((1 + c % 2, c, 1 + c % 3, 1 + c % 3), dtype=np.float32)
                with torch.no_grad():
                    want = [o.numpy() for o in model(torch.from_numpy(x))]
                for k, (got, ref) in enumerate(zip(_outputs(mod(x)), want, strict=True)):
                    bad = _bad_channels(np.asarray(got), ref)
                    if len(bad):
                        failures.append(f"{isa}, {threads} threads, {c} channels, output {k}: {bad.tolist()[:16]}")
    assert not failures, "\n".join(failures[:20])


_COUNTS = (*range(1, 18), 31, 63, 65, 127, 129, 500, 513, 1000, 1030)


class _HeadsOfManyWidths(nn.Module):
    """Per count in _COUNTS a channels-last 1x1 convolution head, pooled and soft-maxed, and a linear
    layer on the pooled features: every residue modulo the vector widths (4, 8, 16 lanes), channel
    tails of the 64-channel blocks, 1000 and past 1024."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.convs = nn.ModuleList(nn.Conv2d(16, c, 1) for c in _COUNTS)
        self.linears = nn.ModuleList(nn.Linear(16, c) for c in _COUNTS)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        f = torch.relu(self.stem(x))
        pooled = f.mean((2, 3))
        convs = tuple(torch.softmax(torch.relu(h(f)).mean((2, 3)), 1) for h in self.convs)
        return convs + tuple(torch.softmax(h(pooled), 1) for h in self.linears)


@pytest.mark.exhaustive
def test_heads_of_many_widths(tmp_path: Path) -> None:
    """Convolution and dense heads of 1-17, 31, 63, 65, 127, 129, 500, 513, 1000 and 1030 channels at
    every ISA level this CPU runs and 1-4 threads."""
    _torch_case(_HeadsOfManyWidths(), 3, tmp_path)


def test_cpu_isa_names_a_library_this_cpu_runs(tmp_path: Path) -> None:
    """LoaderOptions.cpu_isa loads the named level; a level not in the artifact, or one this CPU lacks,
    is refused naming the ones that run."""
    art = bladepack.optimize(_PoolsOfAnyWidth(), (torch.randn(2, 7, 3, 3),), options=all_isas())
    levels = runnable_levels(art)
    for isa in levels:
        assert bladepack.load(art.to_bytes(), options=LoaderOptions(cpu_isa=isa)).executor == f"native ({isa})"
    with pytest.raises(
        NativeUnavailable,
        match=r"cpu_isa='x86-64-v9': that CPU kernel library is not in the artifact; choose one of x86-64",
    ):
        bladepack.load(art.to_bytes(), executor="native", options=LoaderOptions(cpu_isa="x86-64-v9"))
    missing = [isa for isa, _, _ in art.cpu_libraries if isa not in levels]
    if missing:
        with pytest.raises(NativeUnavailable, match="does not run on this CPU"):
            bladepack.load(art.to_bytes(), executor="native", options=LoaderOptions(cpu_isa=missing[0]))


def test_cpu_isas_all_and_unknown_names() -> None:
    """CompileOptions.cpu_isas "all" builds every level (as unset does); an unknown name is a
    CompileError listing what is allowed, not an internal error."""
    art = bladepack.optimize(_PoolsOfAnyWidth(), (torch.randn(2, 7, 3, 3),), options=all_isas())
    every = bladepack.optimize(
        _PoolsOfAnyWidth(), (torch.randn(2, 7, 3, 3),), options=CompileOptions.from_env(cpu_isas="all")
    )
    assert [lib[0] for lib in every.cpu_libraries] == [lib[0] for lib in art.cpu_libraries]
    with pytest.raises(CompileError, match=r"cpu_isas \(BLADEPACK_CPU_ISAS\) names avx9; allowed: all, host"):
        bladepack.optimize(
            _PoolsOfAnyWidth(), (torch.randn(2, 7, 3, 3),), options=CompileOptions.from_env(cpu_isas="avx9")
        )
