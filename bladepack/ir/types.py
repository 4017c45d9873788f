"""Tensor types with symbolic dimensions.

In: a dtype and a tuple of dims, each a non-negative int or a sympy expression over shape symbols.
Out: `TensorType`, hashable and printable; `dim_str` prints one dim the way the IR printer does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import sympy

from bladepack.dtypes import DType

IRDim = Union[int, sympy.Expr]


def canonical_dim(d: IRDim) -> IRDim:
    """Plain int for constant expressions, a sympy expression otherwise."""
    if isinstance(d, sympy.Expr):
        if d.is_Integer:
            return int(d)
        return d
    if isinstance(d, bool) or not isinstance(d, int):
        raise TypeError(f"a dimension must be an int or a sympy expression, got {d!r}")
    return d


def dim_str(d: IRDim) -> str:
    return str(d).replace(" ", "")


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple[IRDim, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(canonical_dim(d) for d in self.shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(d, int) for d in self.shape)

    def numel(self) -> IRDim:
        n: IRDim = 1
        for d in self.shape:
            n = n * d
        return canonical_dim(sympy.expand(n)) if isinstance(n, sympy.Expr) else n

    def nbytes(self) -> IRDim:
        n = self.numel()
        return (
            canonical_dim(sympy.expand(n * self.dtype.itemsize))
            if isinstance(n, sympy.Expr)
            else n * self.dtype.itemsize
        )

    def __str__(self) -> str:
        return f"{self.dtype.short}[{', '.join(dim_str(d) for d in self.shape)}]"
