"""A small ResNet-style CNN with dynamic batch, height and width."""

from __future__ import annotations

import torch
from torch import nn

from bladepack import Dim
from samples.common import Sample


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class CNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.block1 = Block(16)
        self.down = nn.Conv2d(16, 32, 1, stride=2)
        self.block2 = Block(32)
        self.head = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block1(self.pool(self.stem(x)))
        x = self.block2(self.down(x))
        x = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.head(x)


def _randomize_bn(m: nn.Module) -> nn.Module:
    g = torch.Generator().manual_seed(1)
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.copy_(0.1 * torch.randn(mod.num_features, generator=g))
            mod.running_var.copy_(0.5 + torch.rand(mod.num_features, generator=g))
            mod.weight.data.copy_(1.0 + 0.1 * torch.randn(mod.num_features, generator=g))
            mod.bias.data.copy_(0.1 * torch.randn(mod.num_features, generator=g))
    return m.eval()


def make_inputs(g: torch.Generator, batch: int, height: int, width: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(batch, 3, height, width, generator=g),)


SAMPLE = Sample(
    name="cnn",
    build=lambda: _randomize_bn(CNN()),
    make_inputs=make_inputs,
    export_dims=[{"batch": 2, "height": 32, "width": 40}, {"batch": 3, "height": 48, "width": 36}],
    test_dims={"batch": [1, 2, 5, 6, 11], "height": [1, 7, 31, 64, 97], "width": [1, 9, 33, 50, 128]},
    base_dims={"batch": 2, "height": 24, "width": 30},
    dynamic_shapes={"x": {0: Dim("batch"), 2: Dim("height"), 3: Dim("width")}},
)
