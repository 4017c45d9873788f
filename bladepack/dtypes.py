"""Element types shared by the compiler and the loaders.

In: nothing. Out: the closed set of dtype names that may appear in an artifact, with their sizes and
numpy equivalents. The loader imports this module, so it must stay free of torch and sympy.
"""

from __future__ import annotations

from enum import Enum

import numpy as np


class DType(str, Enum):
    FLOAT32 = "float32"
    FLOAT64 = "float64"
    FLOAT16 = "float16"
    BFLOAT16 = "bfloat16"
    INT64 = "int64"
    INT32 = "int32"
    INT16 = "int16"
    INT8 = "int8"
    UINT8 = "uint8"
    BOOL = "bool"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_floating(self) -> bool:
        return self in (DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16)

    @property
    def short(self) -> str:
        """Short name used by the IR printer (f32, i64, ...)."""
        return _SHORT[self]

    def scalar(self, value: bool | int | float) -> bool | int | float:
        """`value` as the Python scalar of this dtype; ValueError for a fractional value of an integer dtype."""
        if self is DType.BOOL:
            return bool(value)
        if self.is_floating:
            return float(value)
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"non-integer constant {value} for {self.value}")
        return int(value)

    def to_numpy(self) -> np.dtype:
        """The numpy dtype; bfloat16 has none and raises a clear error."""
        if self is DType.BFLOAT16:
            raise TypeError("bfloat16 tensors cannot be represented in numpy; pass torch tensors")
        dt: np.dtype = np.dtype(self.value)
        return dt

    def storage_numpy(self) -> np.dtype:
        """The numpy dtype holding this dtype's bits on the host: bfloat16 as uint16 bit patterns."""
        return np.dtype(np.uint16) if self is DType.BFLOAT16 else self.to_numpy()


_ITEMSIZE = {
    DType.FLOAT32: 4,
    DType.FLOAT64: 8,
    DType.FLOAT16: 2,
    DType.BFLOAT16: 2,
    DType.INT64: 8,
    DType.INT32: 4,
    DType.INT16: 2,
    DType.INT8: 1,
    DType.UINT8: 1,
    DType.BOOL: 1,
}

_SHORT = {
    DType.FLOAT32: "f32",
    DType.FLOAT64: "f64",
    DType.FLOAT16: "f16",
    DType.BFLOAT16: "bf16",
    DType.INT64: "i64",
    DType.INT32: "i32",
    DType.INT16: "i16",
    DType.INT8: "i8",
    DType.UINT8: "u8",
    DType.BOOL: "bool",
}


def dtype_from_numpy(dt: np.dtype) -> DType:
    try:
        return DType(np.dtype(dt).name)
    except ValueError:
        allowed = ", ".join(d.value for d in DType)
        raise TypeError(f"unsupported numpy dtype {np.dtype(dt).name}; allowed: {allowed}") from None
