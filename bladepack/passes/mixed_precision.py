"""Mixed precision: a float32 model computed in float16 or bfloat16.

In: a `Program` and the compute dtype. Out: the same program with every float32 input, weight and value
in that dtype — what `model.to(dtype)` computes when given inputs of that dtype — and the weight data
converted (round to nearest even; bfloat16 weights are kept as their uint16 bit patterns, numpy having
no bfloat16). Accuracy is kept where it matters by the kernels, not by this pass: CUDA kernels hold
16-bit values in float registers, so reductions, softmax and normalization statistics accumulate in
float32 (Note [Register types] in codegen/cuda_emitter.py), and cuBLAS GEMMs compute in float32.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from bladepack.dtypes import DType
from bladepack.ir import Program
from bladepack.ir.types import TensorType

COMPUTE_DTYPES = ("float32", "float16", "bfloat16")


def bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays NaN."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(a)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def _convert(a: np.ndarray, dtype: DType) -> np.ndarray:
    """float32 weights in `dtype` (bfloat16: its bit patterns). Where torch is loaded (the torch front
    end), its conversion runs them — the same rounding, on every core (a 1.1B-parameter decoder's
    precision stage 6.1 s -> 2.8 s on two cores) — else numpy's; NaN stays NaN either way, its payload
    may differ."""
    torch = sys.modules.get("torch")
    if torch is not None:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if dtype is DType.FLOAT16:
            return t.to(torch.float16).numpy()  # type: ignore[no-any-return]
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)  # type: ignore[no-any-return]
    if dtype is DType.FLOAT16:
        return a.astype(np.float16)
    return bfloat16_bits(a)


def to_precision(p: Program, dtype: str) -> Program:
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"dtype must be one of {list(COMPUTE_DTYPES)} (or None), got {dtype!r}")
    target = DType(dtype)
    if target is DType.FLOAT32:
        return p

    def conv(t: TensorType) -> TensorType:
        return TensorType(target, t.shape) if t.dtype is DType.FLOAT32 else t

    g = p.graph
    graph = dataclasses.replace(
        g,
        inputs=tuple(dataclasses.replace(x, type=conv(x.type)) for x in g.inputs),
        weights=tuple(dataclasses.replace(w, type=conv(w.type)) for w in g.weights),
        nodes=tuple(dataclasses.replace(n, type=conv(n.type)) for n in g.nodes),
    )
    data = {name: _convert(a, target) if a.dtype == np.float32 else a for name, a in p.weight_data.items()}
    return dataclasses.replace(p, graph=graph, weight_data=data)
