"""The SCATTER op (ScatterAttrs, Note [Scatter kernel] in codegen/anchor_kernels.py): torch's scatter,
scatter_add and scatter_reduce and ONNX's ScatterElements, in generated kernels on CPU (and their CUDA
source through nvcc), against eager and onnx's reference: duplicates in index order, index errors
named, never a wrong answer. The dynamic-shape sweep is the "scatter" case of tests/test_ops.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import bladepack
from bladepack.errors import IndexRangeError
from bladepack.target import PTX_ARCH


class _Scatters(nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.scatter(1, i, x[:, : i.shape[1]] * 10),
            x.scatter_add(1, i, torch.ones_like(x[:, : i.shape[1]])),
            x.scatter_reduce(1, i, x[:, : i.shape[1]] + 5, "amax", include_self=False),
            x.scatter_reduce(1, i, x[:, : i.shape[1]], "mean", include_self=False),
        )


def _artifact() -> bladepack.Artifact:
    g = torch.Generator().manual_seed(0)
    samples = [(torch.randn(b, 6, generator=g), torch.randint(0, 6, (b, 4), generator=g)) for b in (2, 3)]
    return bladepack.optimize(_Scatters(), samples)


@pytest.fixture(scope="module")
def art() -> bladepack.Artifact:
    return _artifact()


def test_scatter_runs_in_a_generated_kernel(art: bladepack.Artifact) -> None:
    plan = art.sources.fusion_text("cpu")
    assert "0 reference steps" in plan and plan.count(": scatter[") == 5, plan


@pytest.mark.parametrize("executor", ["native", "reference"])
def test_duplicates_resolve_in_index_order(art: bladepack.Artifact, executor: str) -> None:
    """Every index of a row names one column: the last source wins an assignment, every one counts in
    a sum, amax and mean; columns no index names keep x."""
    loaded = bladepack.load(art.to_bytes(), executor=executor)
    x = np.arange(12, dtype=np.float32).reshape(2, 6) / 4
    i = np.array([[3, 3, 3, 0], [5, 1, 5, 5]], dtype=np.int64)
    got = loaded(x, i)
    want = _Scatters()(torch.from_numpy(x), torch.from_numpy(i))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-6)


@pytest.mark.parametrize("executor", ["native", "reference"])
@pytest.mark.parametrize("bad", [6, -1])
def test_an_index_outside_the_axis_is_an_error(art: bladepack.Artifact, executor: str, bad: int) -> None:
    """torch's scatter takes indices in [0, size): 6 and -1 are IndexRangeErrors naming the scatter."""
    loaded = bladepack.load(art.to_bytes(), executor=executor)
    x = np.zeros((2, 6), np.float32)
    i = np.array([[0, 1, 2, bad], [0, 0, 0, 0]], dtype=np.int64)
    with pytest.raises(IndexRangeError, match="scatter"):
        loaded(x, i)


def test_onnx_scatter_elements() -> None:
    """ScatterElements with each reduction, negative indices counting from the end (ONNX allows them),
    against onnx's reference."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    nodes = [
        helper.make_node("ScatterElements", ["x", "i", "u"], [f"y_{r}"], axis=1, reduction=r)
        for r in ("none", "add", "mul", "max", "min")
    ]
    vi = helper.make_tensor_value_info
    graph = helper.make_graph(
        nodes,
        "scatter",
        [
            vi("x", TensorProto.FLOAT, ["n", 5]),
            vi("i", TensorProto.INT64, ["n", 3]),
            vi("u", TensorProto.FLOAT, ["n", 3]),
        ],
        [vi(f"y_{r}", TensorProto.FLOAT, None) for r in ("none", "add", "mul", "max", "min")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    loaded = bladepack.load(bladepack.optimize(model).to_bytes())
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(0)
    for n in (1, 2, 7):
        x = rng.standard_normal((n, 5)).astype(np.float32)
        i = np.stack([rng.permutation(np.arange(-5, 5))[:3] for _ in range(n)]).astype(np.int64)  # distinct per row
        u = rng.standard_normal((n, 3)).astype(np.float32)
        want = ref.run(None, {"x": x, "i": i, "u": u})
        for g, w in zip(loaded(x, i, u), want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc")
def test_the_cuda_scatter_kernel_compiles(tmp_path: Path) -> None:
    from bladepack.codegen.cuda_toolchain import build_images

    g = torch.Generator().manual_seed(0)
    samples = [(torch.randn(b, 6, generator=g), torch.randint(0, 6, (b, 4), generator=g)) for b in (2, 3)]
    art = bladepack.optimize(_Scatters(), samples, targets=("cuda",))
    assert art.sources.fusion_text("cuda").count(": scatter[") == 5
    source = art.sources.unit("cuda")
    images = build_images(source, tmp_path, arches=[PTX_ARCH])
    assert images
