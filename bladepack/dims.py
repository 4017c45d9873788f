"""`bladepack.Dim`: a named dynamic dimension with an inclusive range, and `DerivedDim`, a dim that is
an affine function of one (`past + 1`, `2 * seq`). Loader-safe."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dim:
    """A dynamic dimension declared by the user: `Dim("batch", min=1, max=64)`.

    `max=None` means no upper bound beyond what the model itself imposes. `past + 1`, `past - 1`,
    `2 * seq` are `DerivedDim`s: dims that always equal that function of this one.
    """

    name: str
    min: int = 1
    max: int | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"Dim name must be an identifier, got {self.name!r}")
        if self.min < 0:
            raise ValueError(f"Dim {self.name!r}: min must be >= 0, got {self.min}")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"Dim {self.name!r}: max {self.max} is below min {self.min}")

    def __add__(self, other: int) -> DerivedDim:
        return DerivedDim(self, 1, 0) + other

    __radd__ = __add__

    def __sub__(self, other: int) -> DerivedDim:
        return DerivedDim(self, 1, 0) - other

    def __mul__(self, other: int) -> DerivedDim:
        return DerivedDim(self, 1, 0) * other

    __rmul__ = __mul__


def _int(op: str, other: object) -> int:
    if not isinstance(other, int) or isinstance(other, bool):
        raise TypeError(f"a derived dim is a Dim {op} an integer, not {type(other).__name__}")
    return other


@dataclass(frozen=True)
class DerivedDim:
    """`coeff * root + offset`: a dim that always has that size (a mask one longer than the cache,
    `past + 1`; an upsampled length, `2 * seq`). Its range follows from the root's."""

    root: Dim
    coeff: int
    offset: int

    def __post_init__(self) -> None:
        if self.coeff < 1:
            raise ValueError(f"a derived dim's coefficient must be a positive integer, got {self.coeff}")

    @property
    def name(self) -> str:
        text = self.root.name if self.coeff == 1 else f"{self.coeff}*{self.root.name}"
        if self.offset:
            text += f" {'+' if self.offset > 0 else '-'} {abs(self.offset)}"
        return text

    @property
    def min(self) -> int:
        return self.coeff * self.root.min + self.offset

    @property
    def max(self) -> int | None:
        return None if self.root.max is None else self.coeff * self.root.max + self.offset

    def __add__(self, other: int) -> DerivedDim:
        return DerivedDim(self.root, self.coeff, self.offset + _int("+", other))

    __radd__ = __add__

    def __sub__(self, other: int) -> DerivedDim:
        return DerivedDim(self.root, self.coeff, self.offset - _int("-", other))

    def __mul__(self, other: int) -> DerivedDim:
        k = _int("*", other)
        return DerivedDim(self.root, self.coeff * k, self.offset * k)

    __rmul__ = __mul__

    def __str__(self) -> str:
        return self.name
