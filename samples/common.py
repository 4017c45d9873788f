"""What every sample provides: a model, export samples, and inputs at any dims in range."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass(frozen=True)
class Sample:
    name: str
    build: Callable[[], torch.nn.Module]
    # make_inputs(generator, **dims) -> argument tuple for those symbol values
    make_inputs: Callable[..., tuple[torch.Tensor, ...]]
    # dims of the samples shown to optimize (each a dict symbol -> size)
    export_dims: list[dict[str, int]]
    # values per dynamic dim the tests check: 1, odd sizes, both range ends, unseen values
    test_dims: dict[str, list[int]]
    # the other dims' values used while one dim is swept
    base_dims: dict[str, int]
    dynamic_shapes: Any = None
    notes: list[str] = field(default_factory=list)

    def export_samples(self, seed: int = 0) -> list[tuple[torch.Tensor, ...]]:
        g = torch.Generator().manual_seed(seed)
        return [self.make_inputs(g, **d) for d in self.export_dims]

    def test_cases(self) -> list[dict[str, int]]:
        """One case per test value of each dim, the other dims at their base values."""
        cases = []
        for name, values in self.test_dims.items():
            for v in values:
                cases.append({**self.base_dims, name: v})
        return cases
