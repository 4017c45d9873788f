"""ONNX GridSample (onnx_import/ops_sampling.py, Note [Grid sampling] in ir/grid_sample.py): every mode
and padding, both align_corners, on images and volumes, against onnx's reference at dynamic batch and
output sizes; cubic sampling of a volume is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import bladepack
from bladepack.errors import UnsupportedOpsError


def _model(modes: list[tuple[str, str, int]], opset: int = 20, volume: bool = False) -> object:
    vi = helper.make_tensor_value_info
    nodes = [
        helper.make_node("GridSample", ["x", "g"], [f"y{k}"], mode=m, padding_mode=p, align_corners=a)
        for k, (m, p, a) in enumerate(modes)
    ]
    x, g = (["n", 3, 4, 5, 6], ["n", "do", "ho", "wo", 3]) if volume else (["n", 3, 5, 7], ["n", "ho", "wo", 2])
    graph = helper.make_graph(
        nodes,
        "grid",
        [vi("x", TensorProto.FLOAT, x), vi("g", TensorProto.FLOAT, g)],
        [vi(f"y{k}", TensorProto.FLOAT, None) for k in range(len(modes))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_grid_sample_matches_the_reference() -> None:
    modes = [
        (m, p, a) for m in ("linear", "nearest", "cubic") for p in ("zeros", "border", "reflection") for a in (0, 1)
    ]
    model = _model(modes)
    loaded = bladepack.load(bladepack.optimize(model).to_bytes())
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(0)
    for n, ho, wo in [(1, 1, 1), (2, 4, 3), (3, 6, 9)]:
        x = rng.standard_normal((n, 3, 5, 7)).astype(np.float32)
        g = (rng.uniform(-1.3, 1.3, (n, ho, wo, 2))).astype(np.float32)  # inside and outside the image
        want = ref.run(None, {"x": x, "g": g})
        got = loaded(x, g)
        for (m, p, a), w, o in zip(modes, want, got, strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5, err_msg=f"{m}, {p}, align_corners={a}")


def test_volumes_match_the_reference() -> None:
    modes = [(m, p, a) for m in ("linear", "nearest") for p in ("zeros", "border", "reflection") for a in (0, 1)]
    model = _model(modes, volume=True)
    loaded = bladepack.load(bladepack.optimize(model).to_bytes())
    ref = ReferenceEvaluator(model)
    rng = np.random.default_rng(1)
    for n, do, ho, wo in [(1, 1, 1, 1), (2, 3, 4, 2), (1, 2, 5, 7)]:
        x = rng.standard_normal((n, 3, 4, 5, 6)).astype(np.float32)
        g = (rng.uniform(-1.3, 1.3, (n, do, ho, wo, 3))).astype(np.float32)
        want = ref.run(None, {"x": x, "g": g})
        for (m, p, a), w, o in zip(modes, want, loaded(x, g), strict=True):
            np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5, err_msg=f"{m}, {p}, align_corners={a}")


def test_opset_16_names_and_cubic_volumes_refused() -> None:
    model = _model([("bilinear", "zeros", 0), ("bicubic", "border", 1)], opset=16)
    x = np.random.default_rng(2).standard_normal((2, 3, 5, 7)).astype(np.float32)
    g = np.random.default_rng(3).uniform(-1.2, 1.2, (2, 3, 4, 2)).astype(np.float32)
    got = bladepack.load(bladepack.optimize(model).to_bytes())(x, g)
    same = _model([("linear", "zeros", 0), ("cubic", "border", 1)])  # opset 20's names for the same sampling
    for w, o in zip(ReferenceEvaluator(same).run(None, {"x": x, "g": g}), got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5)
    with pytest.raises(UnsupportedOpsError, match="GridSample with mode='cubic' of a volume"):
        bladepack.optimize(_model([("cubic", "zeros", 0)], volume=True))
