"""Note [Wide convolutions] (codegen/cpu_conv_wide.py) and Note [Interior windows] (codegen/
cpu_conv_nhwc.py): convolutions of more than 64 output channels or 1152 taps run channels-last on
weights packed in panels of 16 output channels, and channels-last pooling takes interior windows in
unrolled loops. Against eager at every ISA level this CPU runs, 1-3 threads, sizes from a single pixel
to several tile groups; output-channel counts off the 64-channel block and the AVX2 library's
16-channel tile (72, 130, 40, 96), input-channel counts that leave a last, shorter weight chunk (130
over 3x3 and 5x5 taps), strides, dilation, a non-square kernel and a 1x1 downsampling."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

import bladepack
from bladepack import Dim
from bladepack.ir.ops import Conv2dAttrs
from tests.helpers import all_isas, eager_failures, eager_outputs, runnable_levels

SHAPES = ((1, 1, 1), (2, 5, 7), (1, 13, 17), (3, 8, 3), (1, 31, 29))  # (batch, height, width)


class _WideChain(nn.Module):
    """A ResNet-style stage of wide convolutions: a 72-channel stem on the NCHW input (blocks of 64 and
    8), a stride-2 3x3 to 130 channels plus a 1x1 stride-2 downsampling added to it (three blocks, the
    last of 2), a dilated (3, 1) kernel, a 5x5 dilated convolution to 40 channels (one block, 3250
    taps, five weight chunks), and a 96-channel convolution whose chain ends at the output; between
    them batch norm, ReLU and the residual add as epilogues, and a 3x3 max pooling and two average
    poolings (with and without the padding in the count) channels-last."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.stem = nn.Conv2d(3, 72, 3, padding=1)
        self.bn = nn.BatchNorm2d(72)
        self.c2 = nn.Conv2d(72, 130, 3, stride=2, padding=1, bias=False)
        self.down = nn.Conv2d(72, 130, 1, stride=2)
        self.c3 = nn.Conv2d(130, 130, (3, 1), padding=(2, 0), dilation=(2, 1))
        self.c4 = nn.Conv2d(130, 40, 5, padding=4, dilation=2, bias=False)
        self.c5 = nn.Conv2d(40, 96, 3, padding=1)
        self.bn.running_mean.copy_(0.1 * torch.randn(72, generator=g))
        self.bn.running_var.copy_(0.5 + torch.rand(72, generator=g))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = torch.relu(self.bn(self.stem(x)))
        p = nn.functional.max_pool2d(y, 3, stride=1, padding=1)
        z = torch.relu(self.c2(p) + self.down(y))
        z = torch.relu(self.c3(z)) + z
        a = nn.functional.avg_pool2d(z, 3, stride=1, padding=1, count_include_pad=False)
        b = nn.functional.avg_pool2d(z, 3, stride=1, padding=1)
        return self.c5(torch.relu(self.c4(a))), b.mean(dim=(2, 3)), p[:, :, ::2, ::3]


def _convs(model: nn.Module, samples: list[tuple[torch.Tensor, ...]]) -> list[Any]:
    """The convolutions of the model's CPU program after the graph passes."""
    from bladepack.backends import backend
    from bladepack.export import capture, to_program
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    p = run_pipeline(to_program(capture(model, samples, None)), CompileOptions.from_env(), [backend("cpu").caps])
    return [n for n in p.graph.nodes if isinstance(n.attrs, Conv2dAttrs)]


def test_wide_convolutions_match_eager(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _WideChain().eval()
    samples = [(torch.randn(2, 3, 10, 8),), (torch.randn(3, 3, 12, 14),)]
    art = bladepack.optimize(model, samples, {"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}}, options=all_isas())
    assert [n.attrs.weight_layout for n in _convs(model, samples)] == ["tap_panels"] * 6
    path = tmp_path / "wide.bpk"
    path.write_bytes(art.to_bytes())
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal((n, 3, h, w), dtype=np.float32) for n, h, w in SHAPES]
    # the reference executor reads the blocked weights as the kernels do
    failures = eager_failures(path, runnable_levels(art), inputs, eager_outputs(model, inputs), 2e-5, reference=3)
    assert not failures, "\n".join(failures)


class _One(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 80, (3, 2), padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def test_wide_convolution_golden() -> None:
    """The pass packs a wide convolution's weight [ceil(80 / 16) * 3, 2, 4, 16] ("tap_panels": per panel
    of 16 output channels, per tap, the [C_in, 16] matrix; Note [Weight panels]); its chain ends at the
    output, so it stores channels-last and a permute gives the NCHW result."""
    from bladepack.backends import backend
    from bladepack.export import capture, to_program
    from bladepack.ir.printer import print_graph
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    model = _One().eval()
    samples = [(torch.randn(2, 4, 6, 5),), (torch.randn(3, 4, 7, 9),)]
    p = run_pipeline(to_program(capture(model, samples, None)), CompileOptions.from_env(), [backend("cpu").caps])
    assert print_graph(p.graph, p.shape_env) == textwrap.dedent("""\
        symbols { x_dim0: [1, inf], x_dim2: [1, inf], x_dim3: [1, inf] }
        graph(%0 x: f32[x_dim0, 4, x_dim2, x_dim3]) weights(%3 conv.weight.tap_panels: f32[15, 2, 4, 16]) {
          %2: f32[x_dim0, x_dim2, x_dim3, 4] = permute(%0) {perm=(0, 2, 3, 1)}
          %4: f32[x_dim0, x_dim2, x_dim3+1, 80] = conv2d(%2, %3) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, has_bias=False, out_layout='nhwc', weight_layout='tap_panels'}
          %6: f32[x_dim0, x_dim2, x_dim3+1, 80] = relu(%4)
          %7: f32[x_dim0, 80, x_dim2, x_dim3+1] = permute(%6) {perm=(0, 3, 1, 2)}
          return %7
        }
        """)
    (w,) = [w for w in p.graph.weights]
    assert w.type.shape == (15, 2, 4, 16)
    packed = np.asarray(p.weight_data[w.name]).reshape(5, 3, 2, 4, 16)
    torch_w = model.conv.weight.detach().numpy()  # [80, 4, 3, 2]
    for q in range(5):
        assert np.array_equal(packed[q], torch_w[16 * q : 16 * q + 16].transpose(2, 3, 1, 0))


class _Ragged(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(5, 72, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_tap_panels_zero_pad_the_last_panel() -> None:
    """72 output channels: four full panels and a fifth of 8, zero-padded to 16; unpack gives the
    weight back."""
    from bladepack.opset import packed_weights

    w = _Ragged().conv.weight.detach().numpy()
    packed = packed_weights.pack("tap_panels", w)
    assert packed.shape == packed_weights.packed_shape("tap_panels", w.shape) == (15, 3, 5, 16)
    last = packed.reshape(5, 3, 3, 5, 16)[4]
    assert np.array_equal(last[..., :8], w[64:].transpose(2, 3, 1, 0)) and not last[..., 8:].any()
    assert np.array_equal(packed_weights.unpack("tap_panels", packed, 72), w)


def test_source_weights_read_back_from_packed_convolution_weights() -> None:
    """Note [Derived source weights] (artifact/writer.py): the source program's convolution weights are
    the plan's packed ones ("tap_panels", "ihwo"), not a second copy; `extend` unpacks them and rebuilds
    the same artifact byte for byte."""
    from bladepack.artifact import read
    from bladepack.extend import extend

    torch.manual_seed(0)
    model = _WideChain().eval()
    samples = [(torch.randn(2, 3, 10, 8),), (torch.randn(3, 3, 12, 14),)]
    art = bladepack.optimize(model, samples)
    rows = read(art.to_bytes()).manifest["source_program"]["weights"]
    convs = {name: row for name, row in rows.items() if name.endswith("weight") and len(row["shape"]) == 4}
    assert sorted(row.get("layout", "") for row in convs.values()) == ["tap_panels"] * 6, convs
    assert all(row["packed"] == [f"weight/{name}.tap_panels"] and "section" not in row for name, row in convs.items())
    assert extend(art.to_bytes()).to_bytes() == art.to_bytes()
