"""Note [Winograd convolutions] (codegen/cpu_conv_winograd.py, passes/winograd_conv.py): 3x3 stride-1
convolutions of 64 to 256 channels compute by F(2x2, 3x3) on transformed weights. Against eager at
every ISA level this CPU runs, 1-3 threads, images from one pixel to several tile groups, odd and
even sizes (tiles past the last row or column), paddings 0-2, output-channel counts off the 64-channel
block and the AVX2 library's 16-channel sub-block (72, 130, 80), input-channel counts that are not a
multiple of a vector (70), and the epilogue chain (batch norm, residual add, ReLU); the transformed
weights' packing and its inverse; which convolutions the pass takes; the source weights kept exactly."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import bladepack
from bladepack import Dim
from bladepack.ir.ops import Conv2dAttrs
from bladepack.opset import packed_weights
from bladepack.options import CompileOptions, LoaderOptions
from tests.helpers import all_isas, eager_failures, eager_outputs, runnable_levels

SHAPES = ((1, 1, 1), (1, 2, 3), (2, 5, 7), (1, 13, 17), (3, 8, 3), (1, 30, 29))  # (batch, height, width)


class _WinogradChain(nn.Module):
    """A ResNet-style block of 64 channels (batch norm and ReLU, then the residual add) into a 70-channel
    convolution without padding, a 130-channel one with padding 2 (three blocks, the last of 2
    channels) and an 80-channel one (a block of 64 and one of 16) whose chain ends at the output; a
    32-channel one gets both kernels (Note [Winograd at few channels]) and a stride-2 one stays with its
    direct kernel."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.stem = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.c1 = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.c2 = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.c3 = nn.Conv2d(64, 70, 3, padding=0)
        self.c4 = nn.Conv2d(70, 130, 3, padding=2, bias=False)
        self.c5 = nn.Conv2d(130, 80, 3, padding=1)
        self.small = nn.Conv2d(64, 32, 3, padding=1)
        self.strided = nn.Conv2d(64, 64, 3, stride=2, padding=1)
        for bn in (self.bn1, self.bn2):
            assert bn.running_mean is not None and bn.running_var is not None
            bn.running_mean.copy_(0.1 * torch.randn(64, generator=g))
            bn.running_var.copy_(0.5 + torch.rand(64, generator=g))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = torch.relu(self.stem(x))
        z = torch.relu(self.bn1(self.c1(y)))
        z = torch.relu(self.bn2(self.c2(z)) + y)
        w = torch.relu(self.c4(torch.relu(self.c3(z))))
        return self.c5(w), self.small(z).mean(dim=(2, 3)), self.strided(z).amax(dim=(2, 3))


def _convs(model: nn.Module, samples: Sequence[tuple[torch.Tensor, ...]], winograd: bool = True) -> list[Any]:
    """The convolutions of the model's CPU program after the graph passes."""
    from bladepack.backends import backend
    from bladepack.export import capture, to_program
    from bladepack.passes.pipeline import run_pipeline

    options = CompileOptions.from_env(winograd=winograd)
    p = run_pipeline(to_program(capture(model, list(samples), None)), options, [backend("cpu").caps])
    return [n for n in p.graph.nodes if isinstance(n.attrs, Conv2dAttrs)]


def _err(got: Any, ref: np.ndarray) -> float:
    return float(np.abs(np.asarray(got) - ref).max() / (1 + np.abs(ref).max()))


def test_winograd_convolutions_match_eager(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _WinogradChain().eval()
    samples = [(torch.randn(2, 3, 10, 8),), (torch.randn(3, 3, 12, 14),)]
    layouts = [n.attrs.weight_layout for n in _convs(model, samples)]
    assert sorted(layouts) == ["hwio_winograd", "ihwo", "ihwo"] + ["winograd"] * 5, layouts
    art = bladepack.optimize(model, samples, {"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}}, options=all_isas())
    path = tmp_path / "winograd.bpk"
    path.write_bytes(art.to_bytes())
    rng = np.random.default_rng(4)
    inputs = [rng.standard_normal((n, 3, h + 4, w + 4), dtype=np.float32) for n, h, w in SHAPES]
    # the reference executor unpacks the transformed weights
    failures = eager_failures(path, runnable_levels(art), inputs, eager_outputs(model, inputs), 1e-5, reference=3)
    assert not failures, "\n".join(failures)


def test_winograd_is_more_accurate_than_direct_at_resnet_width(tmp_path: Path) -> None:
    """At 128 channels and 28 x 28 the transformed sums (4 products per output where the direct kernel
    adds 9) stay within the direct kernels' error of float64 eager; `winograd=False` keeps the direct
    kernel."""

    class Conv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(128, 128, 3, padding=1, bias=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.conv(torch.relu(x)))

    torch.manual_seed(1)
    model = Conv().eval()
    samples = [(torch.randn(1, 128, 9, 10),), (torch.randn(2, 128, 11, 7),)]
    x = torch.randn(2, 128, 28, 28)
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    model.float()
    errs = {}
    for winograd in (True, False):
        kinds = [n.attrs.weight_layout for n in _convs(model, samples, winograd)]
        assert kinds == (["winograd"] if winograd else ["tap_panels"]), kinds
        art = bladepack.optimize(model, samples, options=CompileOptions.from_env(winograd=winograd))
        path = tmp_path / f"w{int(winograd)}.bpk"
        art.save(path)
        errs[winograd] = _err(bladepack.load(path)(x.numpy()), want)
    assert errs[True] <= max(errs[False], 1e-6), errs


def test_transformed_weights_pack_and_unpack() -> None:
    """U = G g G^T per filter in float64, rounded once, in "blocks" order of a 4x4 kernel; unpacking
    (G's left inverse) gives the filters back to within rounding, which is why the writer never
    derives a source weight from them (`EXACT_LAYOUTS`)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((70, 65, 3, 3)).astype(np.float32)
    packed = packed_weights.pack("winograd", w)
    assert packed.shape == packed_weights.packed_shape("winograd", w.shape) == (8, 4, 65, 64)
    u = np.einsum("ik,ockl,jl->ocij", packed_weights.WINOGRAD_G, w.astype(np.float64), packed_weights.WINOGRAD_G)
    blocks = packed.reshape(2, 4, 4, 65, 64)
    assert np.array_equal(blocks[0, 1, 2, :, :], u[:64, :, 1, 2].T.astype(np.float32))
    assert np.array_equal(blocks[1, 3, 0, :, :6], u[64:, :, 3, 0].T.astype(np.float32))
    assert not blocks[1, ..., 6:].any()
    back = packed_weights.unpack("winograd", packed, 70)
    assert back.shape == w.shape and float(np.abs(back - w).max()) <= 4e-6
    assert "winograd" in packed_weights.PACKED_LAYOUTS and "winograd" not in packed_weights.EXACT_LAYOUTS
    with pytest.raises(ValueError, match="3x3 filters, not 5x5"):
        packed_weights.pack("winograd", np.zeros((64, 64, 5, 5), np.float32))


class _Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x))


def test_winograd_golden() -> None:
    """The pass packs the 64-channel 3x3 weight [4, 4, 64, 64] (one block; per element of the 4x4
    transform, the [C_in, 64] matrix); channels_last makes the convolution channels-last, its chain
    ending at the output through a permute."""
    from bladepack.backends import backend
    from bladepack.export import capture, to_program
    from bladepack.ir.printer import print_graph
    from bladepack.passes.pipeline import run_pipeline

    model = _Block(64).eval()
    samples = [(torch.randn(2, 64, 6, 5),), (torch.randn(3, 64, 7, 9),)]
    p = run_pipeline(to_program(capture(model, samples, None)), CompileOptions.from_env(), [backend("cpu").caps])
    assert print_graph(p.graph, p.shape_env) == textwrap.dedent("""\
        symbols { x_dim0: [1, inf], x_dim2: [1, inf], x_dim3: [1, inf] }
        graph(%0 x: f32[x_dim0, 64, x_dim2, x_dim3]) weights(%1 conv.weight.winograd: f32[4, 4, 64, 64]) {
          %2: f32[x_dim0, x_dim2, x_dim3, 64] = permute(%0) {perm=(0, 2, 3, 1)}
          %3: f32[x_dim0, x_dim2, x_dim3, 64] = conv2d(%2, %1) {stride=(1, 1), padding=(1, 1), dilation=(1, 1), groups=1, has_bias=False, out_layout='nhwc', weight_layout='winograd'}
          %5: f32[x_dim0, x_dim2, x_dim3, 64] = relu(%3)
          %6: f32[x_dim0, 64, x_dim2, x_dim3] = permute(%5) {perm=(0, 3, 1, 2)}
          return %6
        }
        """)


class _Pooled(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.block = _Block(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x).mean(dim=(2, 3))


@pytest.mark.parametrize(
    ("channels", "pooled", "layout"),
    [(8, True, "ihwo"), (16, True, "hwio_winograd"), (32, True, "hwio_winograd"), (32, False, "ihwo")]
    + [(512, True, "tap_panels")],
)
def test_which_convolutions_the_pass_takes(channels: int, pooled: bool, layout: str) -> None:
    """Below 16 channels the transforms cost more than they save; from 16 to 63 the weight is kept both
    ways (Note [Winograd at few channels]), unless the convolution's chain ends at an output (the direct
    kernel stores NCHW itself, a channels-last one would leave a copy); a 512 x 512 convolution's
    transformed weights (16.8 MB) would be read once per call on the small images it sees."""
    model = (_Pooled(channels) if pooled else _Block(channels)).eval()
    samples = [(torch.randn(2, channels, 6, 5),), (torch.randn(3, channels, 7, 9),)]
    assert [n.attrs.weight_layout for n in _convs(model, samples)] == [layout]


class _FewChannels(nn.Module):
    """Note [Winograd at few channels]: 3x3 convolutions of 16 to 64 channels, output counts off the
    8- and 16-lane vectors (24, 40, 17) and a full block (64), padded and not, with batch norm, ReLU and
    a residual add in their chains (none ending at an output, which keeps the direct kernel)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.c1 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 24, 3, padding=1)
        self.c3 = nn.Conv2d(24, 17, 3, padding=1, bias=False)
        self.c4 = nn.Conv2d(17, 40, 3, padding=0)
        self.c5 = nn.Conv2d(40, 64, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.stem(x))
        y = torch.relu(self.bn1(self.c1(y)) + y)
        z = torch.relu(self.c4(self.c3(torch.relu(self.c2(y)))))
        return self.c5(z).flatten(2), z.mean(dim=(2, 3))


def test_few_channel_convolutions_take_both_variants(tmp_path: Path) -> None:
    """Each paired convolution's kernel runs its Winograd variant at some of the shapes and its direct
    variant at others (by `covered`, the plan's own choice), both matching eager at every ISA level,
    1-3 threads: single images from 3 x 3 pixels to 2 tile rows, odd and even sizes, and batches whose
    images run on across rows (Note [Tiles across images])."""
    from bladepack.artifact import read
    from bladepack.artifact.reference_cases import covered
    from bladepack.artifact.shape_program import ShapeProgram

    torch.manual_seed(3)
    model = _FewChannels().eval()
    assert model.bn1.running_var is not None
    model.bn1.running_var.copy_(0.5 + torch.rand(16))
    samples = [(torch.randn(2, 3, 10, 8),), (torch.randn(3, 3, 12, 14),)]
    layouts = [n.attrs.weight_layout for n in _convs(model, samples)]
    assert sorted(layouts) == ["hwio_winograd"] * 5 + ["ihwo"], layouts
    art = bladepack.optimize(model, samples, {"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}}, options=all_isas())
    path = tmp_path / "few.bpk"
    art.save(path)
    shapes = ((1, 3, 3), (1, 4, 4), (2, 3, 5), (1, 5, 9), (3, 4, 7), (7, 3, 3), (2, 12, 11), (5, 6, 6))
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal((n, 3, h, w), dtype=np.float32) for n, h, w in shapes]
    manifest = read(art.to_bytes()).manifest
    program = ShapeProgram.from_manifest(manifest["shape_program"])
    ran = {v.split()[-1] for x in inputs for v in covered(manifest, program.evaluate([list(x.shape)]))}
    paired = [k["name"] for k in manifest["kernels"] if k["name"] + "_winograd" in str(k["variants"])]
    assert len(paired) == 5, paired
    for name in paired:
        assert {v for v in ran if v.startswith(name + "_")} == {name + "_winograd", name + "_direct"}, (name, ran)
    # the reference executor reads the filter part of the paired weight
    failures = eager_failures(path, runnable_levels(art), inputs, eager_outputs(model, inputs), 1e-5, reference=4)
    assert not failures, "\n".join(failures)


def test_source_weights_stay_exact() -> None:
    """The source program keeps its own copy of a weight the plan holds only transformed (unpacking
    is exact only to rounding), so `extend` rebuilds the same artifact byte for byte; `inspect` names
    the kernel."""
    from bladepack.artifact import read
    from bladepack.extend import extend
    from bladepack.inspect import inspect_text, manifest_summary

    torch.manual_seed(0)
    model = _Block(64).eval()
    samples = [(torch.randn(2, 64, 6, 5),), (torch.randn(3, 64, 7, 9),)]
    art = bladepack.optimize(model, samples)
    manifest = read(art.to_bytes()).manifest
    row = manifest["source_program"]["weights"]["conv.weight"]
    assert "packed" not in row and row["section"] == "program/weight/conv.weight", row
    assert extend(art.to_bytes()).to_bytes() == art.to_bytes()
    kernels = manifest_summary(manifest)["kernels"]
    assert [k["conv"] for k in kernels if k["kind"] == "conv"] == ["winograd"]
    assert "conv (winograd)" in inspect_text(manifest_summary(manifest))


def test_input_read_through_a_permute(tmp_path: Path) -> None:
    """A Winograd convolution on the model's own NCHW input reads it in place through the permute (each
    pixel's channels a plane apart, the transform's loads strided), at every ISA level."""
    torch.manual_seed(2)
    model = _Block(96).eval()
    samples = [(torch.randn(2, 96, 6, 5),), (torch.randn(3, 96, 7, 9),)]
    art = bladepack.optimize(model, samples, options=all_isas())
    path = tmp_path / "block.bpk"
    art.save(path)
    rng = np.random.default_rng(1)
    for isa in runnable_levels(art):
        m = bladepack.load(path, options=LoaderOptions(cpu_isa=isa))
        for n, h, w in ((1, 1, 1), (2, 3, 8), (1, 11, 6)):
            x = rng.standard_normal((n, 96, h, w), dtype=np.float32)
            with torch.no_grad():
                want = model(torch.from_numpy(x)).numpy()
            assert _err(m(x), want) <= 1e-5, (isa, (n, h, w))
