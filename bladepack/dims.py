"""`bladepack.Dim`: a named dynamic dimension with an inclusive range. Loader-safe."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Dim:
    """A dynamic dimension declared by the user: `Dim("batch", min=1, max=64)`.

    `max=None` means no upper bound beyond what the model itself imposes.
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
