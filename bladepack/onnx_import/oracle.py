"""The ONNX model itself as the oracle for reference cases (Note [Reference cases]): onnx's own
reference evaluator, independent of bladepack's kernels and of its numpy reference executor.

In: the model (a path or a ModelProto). Out: a function from input arrays (in graph-input order,
initializers excluded) to output arrays (in graph-output order).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops import op_resize

from bladepack.onnx_import.model import load_model


class Resize(op_resize.Resize):
    """Note [pytorch_half_pixel at one pixel]: the ONNX specification (and ONNX Runtime) maps an output
    axis of length 1 to input position 0 under pytorch_half_pixel; onnx's reference evaluator uses -0.5
    there, which a cubic kernel reads as a mix of the first two pixels (a 1x2 row resized to 1x1 gives
    0.83 * x0 + ... instead of x0). bladepack's kernels follow the specification (ir/interpolate.py), so
    the oracle must too: such axes are resized in a second pass with `asymmetric`, which maps output 0
    to position 0 whatever the scale (the first pass resizes the other axes as asked; linear and cubic
    resizing is separable, so the two passes give the one-pass result but for rounding). The class is
    named as the op it replaces: the evaluator matches `new_ops` by class name."""

    def _run(self, X, roi, scales=None, sizes=None, **attrs):  # type: ignore[no-untyped-def,override]
        out = super()._run(X, roi, scales, sizes, **attrs)
        y = out[0]
        ones = [k for k in range(X.ndim) if y.shape[k] == 1 and X.shape[k] != 1]
        if (
            not ones
            or attrs.get("coordinate_transformation_mode") != "pytorch_half_pixel"
            or attrs.get("mode") not in ("linear", "cubic")
            or attrs.get("antialias")
            or attrs.get("axes") is not None
        ):
            return out
        if scales is not None and len(scales):
            first = np.array([1.0 if k in ones else float(scales[k]) for k in range(X.ndim)], dtype=np.float32)
            (mid,) = super()._run(X, roi, first, None, **attrs)
        else:
            first_sizes = np.array([X.shape[k] if k in ones else y.shape[k] for k in range(X.ndim)], dtype=np.int64)
            (mid,) = super()._run(X, roi, None, first_sizes, **attrs)
        last = {**attrs, "coordinate_transformation_mode": "asymmetric"}
        return super()._run(mid, roi, None, np.array(y.shape, dtype=np.int64), **last)


def onnx_oracle(model: Any) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    proto = load_model(model)
    evaluator = ReferenceEvaluator(proto, new_ops=[Resize])
    initializers = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):  # the model's own arithmetic on generated data (a log of 0 is -inf)
            return [np.asarray(o) for o in evaluator.run(None, dict(zip(names, arrays)))]

    return run
