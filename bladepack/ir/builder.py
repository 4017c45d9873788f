"""What a front end's context offers the IR builders both front ends share (ir/recurrent.py,
ir/grid_sample.py): the torch front end's `Ctx` and the ONNX importer's `OnnxCtx` both satisfy it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from bladepack.dtypes import DType
from bladepack.ir.ops import OpKind
from bladepack.ir.types import TensorType


class Builder(Protocol):
    def emit(self, op: OpKind, inputs: Sequence[int], t: TensorType, attrs: Any = None) -> int: ...

    def const(self, value: bool | int | float, dtype: DType) -> int: ...

    def cast(self, v: int, dtype: DType) -> int: ...

    def t(self, v: int) -> TensorType: ...
