"""The IR's view of the op set: `OpKind`, `OpClass`, `OP_INFO` and the attribute types (bladepack/opset),
with `SymInt`, the run-time alias of a size that may be symbolic.

In: nothing. Out: the names the compile side imports. The op table itself is opset/table.py (Note
[Adding an elementwise op]); attributes are opset/attrs.py (Note [Shapes come from types]).
"""

from __future__ import annotations

from typing import Union

import sympy

from bladepack.opset.attrs import (
    CHANNEL_BLOCK,
    DENSE_CONV,
    DENSE_PANELS,
    MAX_TOPK,
    MAX_WEIGHT_BYTES,
    PANEL,
    RECURRENT_GATES,
    SCATTER_REDUCTIONS,
    ArangeAttrs,
    ArgReduceAttrs,
    Attrs,
    AxisAttrs,
    ClampAttrs,
    ConstantAttrs,
    Conv2dAttrs,
    GeluAttrs,
    IndexAttrs,
    LeakyReluAttrs,
    MatmulAttrs,
    NoAttrs,
    NormAttrs,
    PadAttrs,
    PermuteAttrs,
    Pool2dAttrs,
    RecurrentAttrs,
    ReduceAttrs,
    SafeSoftmaxAttrs,
    ScatterAttrs,
    SelectiveScanAttrs,
    SliceAttrs,
    SortAttrs,
    TakeAttrs,
    TopkAttrs,
    generated_conv,
    is_dense_conv,
)
from bladepack.opset.table import OP_INFO, OpClass, OpInfo, OpKind

# An integer that may be symbolic: a plain int or a sympy expression over shape symbols.
SymInt = Union[int, sympy.Expr]
Scalar = Union[bool, int, float]

__all__ = [
    "CHANNEL_BLOCK",
    "DENSE_CONV",
    "DENSE_PANELS",
    "MAX_WEIGHT_BYTES",
    "MAX_TOPK",
    "PANEL",
    "OP_INFO",
    "ArangeAttrs",
    "ArgReduceAttrs",
    "Attrs",
    "AxisAttrs",
    "ClampAttrs",
    "ConstantAttrs",
    "Conv2dAttrs",
    "GeluAttrs",
    "IndexAttrs",
    "LeakyReluAttrs",
    "MatmulAttrs",
    "NoAttrs",
    "NormAttrs",
    "OpClass",
    "OpInfo",
    "OpKind",
    "PadAttrs",
    "PermuteAttrs",
    "Pool2dAttrs",
    "ReduceAttrs",
    "SafeSoftmaxAttrs",
    "Scalar",
    "SliceAttrs",
    "SymInt",
    "TakeAttrs",
    "TopkAttrs",
    "SortAttrs",
    "ScatterAttrs",
    "RecurrentAttrs",
    "RECURRENT_GATES",
    "SelectiveScanAttrs",
    "SCATTER_REDUCTIONS",
    "generated_conv",
    "is_dense_conv",
]
