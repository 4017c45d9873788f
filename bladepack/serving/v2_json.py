"""KServe v2 inference requests and responses in JSON, for engines without their own (Ray Serve).

In: a request body `{"inputs": [{"name", "shape", "datatype", "data"}, ...]}` and the artifact's
input specs. Out: the input arrays in signature order, or an `InputError` naming what is wrong (a
missing or unknown input, a datatype other than the input's, data that does not fill the shape);
and a response body `{"model_name", "outputs": [...]}` from output arrays. Triton speaks the same
protocol natively (HTTP and gRPC), so one client serves both engines.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from bladepack.errors import InputError

V2_DATATYPES = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
}
_FROM_V2 = {v: k for k, v in V2_DATATYPES.items()}


def decode_request(body: Any, inputs: Sequence[dict[str, Any]]) -> list[np.ndarray]:
    if not isinstance(body, dict) or not isinstance(body.get("inputs"), list):
        raise InputError('a v2 request is a JSON object with an "inputs" list')
    given: dict[str, np.ndarray] = {}
    for k, t in enumerate(body["inputs"]):
        if not isinstance(t, dict) or not {"name", "shape", "datatype", "data"} <= set(t):
            raise InputError(f"request input {k} needs name, shape, datatype and data")
        name, dtype = str(t["name"]), _FROM_V2.get(str(t["datatype"]))
        if dtype is None:
            raise InputError(f"input '{name}': datatype {t['datatype']!r} is not one of {', '.join(_FROM_V2)}")
        shape = t["shape"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InputError(f"input '{name}': shape must be a list of non-negative integers, got {shape!r}")
        try:
            flat = np.asarray(t["data"], dtype=dtype).reshape(-1)
        except (TypeError, ValueError) as e:
            raise InputError(f"input '{name}': data is not {t['datatype']}: {e}") from None
        if flat.size != int(np.prod(shape)):
            raise InputError(f"input '{name}': {flat.size} values do not fill shape {shape}")
        given[name] = flat.reshape(shape)
    names = [t["name"] for t in inputs]
    unknown = sorted(set(given) - set(names))
    missing = [n for n in names if n not in given]
    if unknown or missing:
        raise InputError(f"request inputs: unknown {unknown}, missing {missing}; the model's inputs are {names}")
    return [given[n] for n in names]


def encode_response(model: str, names: Sequence[str], arrays: Sequence[np.ndarray]) -> dict[str, Any]:
    return {
        "model_name": model,
        "outputs": [
            {
                "name": n,
                "shape": list(a.shape),
                "datatype": V2_DATATYPES[a.dtype.name],
                "data": a.reshape(-1).tolist(),
            }
            for n, a in zip(names, arrays)
        ],
    }
