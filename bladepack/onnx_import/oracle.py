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

from bladepack.onnx_import.model import load_model


def onnx_oracle(model: Any) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    proto = load_model(model)
    evaluator = ReferenceEvaluator(proto)
    initializers = {t.name for t in proto.graph.initializer}
    names = [i.name for i in proto.graph.input if i.name not in initializers]

    def run(arrays: list[np.ndarray]) -> list[np.ndarray]:
        with np.errstate(all="ignore"):  # the model's own arithmetic on generated data (a log of 0 is -inf)
            return [np.asarray(o) for o in evaluator.run(None, dict(zip(names, arrays)))]

    return run
