"""An MLP with a dynamic batch (declared range [1, 4096])."""

from __future__ import annotations

import torch
from torch import nn

from bladepack import Dim
from samples.common import Sample


class MLP(nn.Module):
    def __init__(self, d_in: int = 64, hidden: int = 256, d_out: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(x))
        h = nn.functional.gelu(self.fc2(h)) + h
        return torch.log_softmax(self.head(h), dim=-1)


def make_inputs(g: torch.Generator, batch: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 64, generator=g),)


SAMPLE = Sample(
    name="mlp",
    build=lambda: MLP().eval(),
    make_inputs=make_inputs,
    export_dims=[{"batch": 2}, {"batch": 8}],
    test_dims={"batch": [1, 3, 17, 255, 4096]},
    base_dims={"batch": 4},
    dynamic_shapes={"x": {0: Dim("batch", 1, 4096)}},
)
