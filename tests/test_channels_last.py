"""Note [Channels-last chains] (passes/channels_last.py): direct convolutions, pooling and elementwise ops
computing [N, H, W, C] on the CPU, against eager at widths below, at and above a register tile, at size
1, odd sizes and every window edge case (strides, dilation, padding, ceil mode, non-square kernels)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import bladepack
from bladepack import Dim
from bladepack.errors import ShapeGuardError
from bladepack.ir import OpKind
from bladepack.ir.ops import Conv2dAttrs, Pool2dAttrs
from samples.zoo import InvertedResidual, bn_statistics
from tests.helpers import refused_by_torch


class _Chains(torch.nn.Module):
    """Every layer a channels-last chain meets: a stride-2 stem on the NCHW input, max pooling with
    padding, a dilated convolution with a residual, average pooling in ceil mode without the padding
    in its count, 24 and 40 output channels (not a multiple of a vector), a (3, 2) kernel with stride
    (2, 1), then a global average and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.dil = torch.nn.Conv2d(16, 16, 3, padding=2, dilation=2, bias=False)
        self.wide = torch.nn.Conv2d(16, 24, 3, padding=1)
        self.odd = torch.nn.Conv2d(24, 40, (3, 2), stride=(2, 1), padding=(1, 1))
        self.head = torch.nn.Linear(40, 7)
        self.bn.running_mean.copy_(0.1 * torch.randn(16, generator=g))
        self.bn.running_var.copy_(0.5 + torch.rand(16, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.stem(x)))
        y = torch.nn.functional.max_pool2d(y, 3, stride=2, padding=1)
        y = torch.relu(y + self.dil(y))
        y = torch.nn.functional.gelu(self.wide(y))
        y = torch.nn.functional.avg_pool2d(y, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        y = torch.sigmoid(self.odd(y)) * 2.0
        return self.head(y.mean(dim=(2, 3)))


SHAPES = [(1, 2, 2), (2, 2, 30), (1, 24, 2), (2, 3, 3), (3, 7, 9), (2, 17, 33), (1, 32, 16), (2, 31, 40), (1, 64, 7)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_channels_last_chains_match_eager(dtype: torch.dtype) -> None:
    model = _Chains().eval().to(dtype)
    samples = [(torch.randn(2, 3, 20, 24, dtype=dtype),), (torch.randn(3, 3, 26, 18, dtype=dtype),)]
    dims = {"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}}
    art = bladepack.optimize(model, samples, dims)
    m = bladepack.load(art.to_bytes(), executor="native")
    kinds = [k["kind"] for k in m._manifest.kernels["cpu"]]
    assert kinds.count("conv") == 5 and kinds.count("pool") == 2, kinds  # the head: Note [Dense layers]
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for n, h, w in SHAPES:
        x = torch.randn(n, 3, h, w, dtype=dtype)
        with torch.no_grad():
            want = model(x).numpy()
        try:
            got = np.asarray(m(x.numpy()))
        except ShapeGuardError as e:
            assert refused_by_torch(art.notes, e), e
            continue
        err = float(np.abs(got - want).max() / (1 + np.abs(want).max()))
        assert err <= tol, ((n, h, w), err)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.conv = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.max_pool2d(torch.relu(self.stem(x)), 2)
        z = torch.relu(y + self.conv(y))
        return z.mean(dim=(2, 3)), z + x[:, :1, ::2, ::2]


def test_channels_last_golden() -> None:
    """The stem reads the NCHW input in place; the pooling, the residual chain and the global mean
    (over H and W of [N, H, W, C]) stay channels-last; the whole-tensor NCHW operand of the last add
    keeps that add NCHW, reading z through its permute."""
    from bladepack.backends import backend
    from bladepack.export import capture, to_program
    from bladepack.lowering.lower_native import fusion_for
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    samples = [(torch.randn(2, 3, 10, 8),), (torch.randn(3, 3, 12, 14),)]
    p = run_pipeline(
        to_program(capture(_Block().eval(), samples, None)), CompileOptions.from_env(), [backend("cpu").caps]
    )
    layouts = [
        (n.op, n.attrs.out_layout if isinstance(n.attrs, Conv2dAttrs) else n.attrs.layout)
        for n in p.graph.nodes
        if isinstance(n.attrs, (Conv2dAttrs, Pool2dAttrs))
    ]
    assert layouts == [(OpKind.CONV2D, "nhwc"), (OpKind.MAX_POOL2D, "nhwc"), (OpKind.CONV2D, "nhwc")]
    assert fusion_for(p, backend("cpu")).text(p.graph) == textwrap.dedent("""\
        fusion plan: 3 kernels, 0 library calls, 2 direct convolutions, 0 reference steps
          conv2d%5 (direct kernel) -> %11 = {add%9 relu%11} (epilogue: inline)
          k0: pool[x_dim0, floor(x_dim2/2), floor(x_dim3/2), 16] -> %13 = {max_pool2d%13}
          conv2d%15 (direct kernel) -> %19 = {add%17 relu%19} (epilogue: inline)
          k1: reduce[x_dim0, 16] -> %21 = {mean%21}
          k2: loop[x_dim0, 16, floor(x_dim2/2), floor(x_dim3/2)] -> %25 = {permute%20 slice%22 slice%23 slice%24 add%25}
        """)


class _GlobalPools(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 24, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(self.conv(x))
        return y.sum(dim=(2, 3), keepdim=True), torch.amax(y, dim=(-2, -1)), torch.amin(y, dim=(3, 2), keepdim=True)


def test_channels_last_global_reductions() -> None:
    """Sums, maxima and minima over H and W of a channels-last value reduce [N, H, W, C] over (1, 2),
    with and without kept dims; at a single pixel and at odd sizes."""
    model = _GlobalPools().eval()
    samples = [(torch.randn(2, 3, 10, 8),), (torch.randn(3, 3, 12, 14),)]
    art = bladepack.optimize(model, samples, {"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}})
    m = bladepack.load(art.to_bytes(), executor="native")
    assert [k["kind"] for k in m._manifest.kernels["cpu"]].count("reduce") == 3
    for n, h, w in [(1, 1, 1), (2, 5, 3), (3, 17, 31)]:
        x = torch.randn(n, 3, h, w)
        with torch.no_grad():
            want = model(x)
        got = m(x.numpy())
        for g, e in zip(got, want):
            assert g.shape == tuple(e.shape)
            assert float(np.abs(g - e.numpy()).max() / (1 + e.abs().max())) <= 1e-5, (n, h, w)


class _Mobile(torch.nn.Module):
    """MobileNet-style layers: pointwise expansion (24 -> 72, 72 is not a multiple of the 64-channel
    block), depthwise 3x3, a strided 5x5 and a dilated depthwise, ReLU6, a pointwise projection to 40
    channels with a residual, and a pointwise layer whose chain ends at an output and widens (24 -> 40:
    kept NCHW, Note [Pointwise exits])."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 24, 3, stride=2, padding=1)
        self.expand = torch.nn.Conv2d(24, 72, 1, bias=False)
        self.bn = torch.nn.BatchNorm2d(72)
        self.dw = torch.nn.Conv2d(72, 72, 3, padding=1, groups=72, bias=False)
        self.dw5 = torch.nn.Conv2d(72, 72, 5, stride=2, padding=2, groups=72)
        self.dwd = torch.nn.Conv2d(72, 72, 3, padding=2, dilation=2, groups=72)
        self.project = torch.nn.Conv2d(72, 24, 1)
        self.last = torch.nn.Conv2d(24, 40, 1)
        g = torch.Generator().manual_seed(7)
        self.bn.running_mean.copy_(0.1 * torch.randn(72, generator=g))
        self.bn.running_var.copy_(0.5 + torch.rand(72, generator=g))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.nn.functional.relu6(self.stem(x))
        z = torch.nn.functional.relu6(self.bn(self.expand(y)))
        z = torch.nn.functional.relu6(self.dw(z))
        y = y + self.project(self.dwd(z))
        return self.last(y), self.dw5(z).mean(dim=(2, 3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_channels_last_depthwise_and_pointwise(dtype: torch.dtype) -> None:
    """Depthwise and pointwise convolutions become channels-last direct kernels on weights packed here
    (their other plans: a GEMM per channel, one GEMM on the input); the widening pointwise one whose
    chain ends at an output stays a GEMM storing NCHW (Note [Pointwise exits])."""
    model = _Mobile().eval().to(dtype)
    samples = [(torch.randn(2, 3, 20, 24, dtype=dtype),), (torch.randn(3, 3, 26, 18, dtype=dtype),)]
    art = bladepack.optimize(model, samples, {"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}})
    m = bladepack.load(art.to_bytes(), executor="native")
    kinds = [k["kind"] for k in m._manifest.kernels["cpu"]]
    assert kinds.count("conv") == 6 and "im2col" not in kinds, kinds
    ref = bladepack.load(art.to_bytes(), executor="reference")  # the plan's nhwc ops in numpy
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for n, h, w in [(1, 1, 1), (1, 2, 2), (2, 1, 30), (1, 24, 1), (2, 7, 9), (3, 17, 33), (1, 64, 40)]:
        x = torch.randn(n, 3, h, w, dtype=dtype)
        with torch.no_grad():
            want = model(x)
        for runner in (m, ref):
            got = runner(x.numpy())
            for g, e in zip(got, want):
                err = float(np.abs(g - e.numpy()).max() / (1 + e.abs().max()))
                assert err <= tol, ((n, h, w), err)


class _NarrowExit(torch.nn.Module):
    """A MobileNet inverted residual (samples/zoo.py's) that ends the model: its 64 -> 16 projection (a
    batch norm and the residual after it) is a pointwise convolution on a channels-last input whose
    chain ends at the output and narrows."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Hardswish())
        self.block = InvertedResidual(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.stem(x))


def test_narrowing_pointwise_exit_stays_channels_last() -> None:
    """Note [Pointwise exits]: the projection that ends the model is a channels-last kernel with its
    batch norm and residual fused (no GEMM, no copy of its 64-channel input), the output copied to NCHW
    once; against eager at sizes 1 to 40, one and two threads."""
    from bladepack.options import LoaderOptions

    torch.manual_seed(0)
    model = bn_statistics(_NarrowExit(), 0.2, (0.5, 1.5))
    samples = [(torch.randn(2, 3, 12, 10),), (torch.randn(1, 3, 9, 14),)]
    art = bladepack.optimize(model, samples, {"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}})
    for threads in (1, 2):
        m = bladepack.load(art.to_bytes(), executor="native", options=LoaderOptions(num_threads=threads))
        assert [k["kind"] for k in m._manifest.kernels["cpu"]].count("conv") == 4
        x0 = torch.randn(1, 3, 5, 6)
        assert [r["what"] for r in m.profile(x0.numpy(), repeat=1)].count("gemm") == 0
        for n, h, w in [(1, 1, 1), (2, 3, 5), (1, 17, 33), (3, 40, 8)]:
            x = torch.randn(n, 3, h, w)
            with torch.no_grad():
                want = model(x).numpy()
            got = np.asarray(m(x.numpy()))
            assert got.shape == want.shape
            assert float(np.abs(got - want).max() / (1 + np.abs(want).max())) <= 1e-5, (threads, (n, h, w))


class _Hard(torch.nn.Module):
    """MobileNetV3's activations after convolutions (hardswish reads its input twice: an epilogue DAG,
    not a chain) and a depthwise convolution that doubles the channels (groups 16, 32 outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.down = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1, groups=16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.hardswish(self.stem(x))
        return torch.nn.functional.hardsigmoid(self.down(y)).mean(dim=(2, 3))


def test_channels_last_epilogue_dags_and_channel_multipliers() -> None:
    from bladepack.backends import backend
    from bladepack.export import capture, to_program
    from bladepack.lowering.lower_native import fusion_for
    from bladepack.options import CompileOptions
    from bladepack.passes.pipeline import run_pipeline

    model = _Hard().eval()
    samples = [(torch.randn(2, 3, 20, 24),), (torch.randn(3, 3, 26, 18),)]
    p = run_pipeline(to_program(capture(model, samples, None)), CompileOptions.from_env(), [backend("cpu").caps])
    assert fusion_for(p, backend("cpu")).text(p.graph) == textwrap.dedent("""\
        fusion plan: 1 kernels, 0 library calls, 2 direct convolutions, 0 reference steps
          conv2d%6 (direct kernel) -> %20 = {add%10 constant%12 add%13 clamp%15 mul%17 constant%19 div%20} (epilogue: inline)
          conv2d%23 (direct kernel) -> %35 = {add%27 constant%29 add%30 clamp%32 constant%34 div%35} (epilogue: inline)
          k0: reduce[x_dim0, 32] -> %37 = {mean%37}
        """)
    art = bladepack.optimize(model, samples, {"x": {0: Dim("batch"), 2: Dim("h"), 3: Dim("w")}})
    m = bladepack.load(art.to_bytes(), executor="native")
    for n, h, w in [(1, 1, 1), (2, 3, 5), (1, 8, 31), (3, 33, 17)]:
        x = torch.randn(n, 3, h, w)
        with torch.no_grad():
            want = model(x).numpy()
        got = np.asarray(m(x.numpy()))
        assert float(np.abs(got - want).max() / (1 + np.abs(want).max())) <= 1e-5, (n, h, w)


class _Wide(torch.nn.Module):
    """Direct 3x3 convolutions of 16, 24, 40 and 64 output channels (tiles of 8 and 6 pixels), stride 1
    and 2, on the NCHW input, each its own output (the NCHW kernel: no channels-last chain)."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [
                torch.nn.Conv2d(8, 16, 3, padding=1),
                torch.nn.Conv2d(8, 24, 3, padding=1, bias=False),
                torch.nn.Conv2d(8, 40, 3, stride=2, padding=1),
                torch.nn.Conv2d(8, 64, 3, padding=1),
            ]
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.relu(c(x)) for c in self.convs)


class _Heads(torch.nn.Module):
    """Direct convolutions on an NCHW input, each its own output (no channels-last chain): 12, 25, 40
    and 64 output channels, which the AVX2 library walks in blocks of 8 (tiles of 8 pixels) or 16
    (tiles of 4) with a narrower last one (Note [Convolution tiles per ISA])."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [
                torch.nn.Conv2d(8, 12, 3, padding=1),
                torch.nn.Conv2d(8, 25, 3, padding=1),
                torch.nn.Conv2d(8, 40, 3, stride=2, padding=1, bias=False),
                torch.nn.Conv2d(8, 64, (3, 2), padding=(1, 0)),
            ]
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.relu(c(x)) for c in self.convs)


class _Chain(torch.nn.Module):
    """A chain of padded 3x3 convolutions on channels-last values (window-origin tiles of 8 pixels)
    to 16, 24, 40 and, at stride 2, 48 channels: whole 16-channel blocks in two halves of 4 pixels
    and a last block of 8 in the AVX2 library (Note [AVX2 pixel halves]); the last map an output,
    the others' channel means."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [
                torch.nn.Conv2d(8, 16, 3, padding=1),
                torch.nn.Conv2d(16, 24, 3, padding=1, bias=False),
                torch.nn.Conv2d(24, 40, 3, padding=1),
                torch.nn.Conv2d(40, 48, 3, stride=2, padding=1),
            ]
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        means = []
        for c in self.convs:
            x = torch.relu(c(x))
            means.append(x.mean(dim=(2, 3)))
        return (x, *means[:-1])


# pixel counts 4, 9, 16, 25, 49, 81, 6, 15, 45, 14, 10, 21, 35, 18: every residue modulo the 8-pixel
# tile (and the 40-channel stride-2 convolution's 1, 4, 4, 9, 16, 25, 2, 6, 15, 4, 3, 8, 12, 5 too)
SIDES = ((2, 2), (3, 3), (4, 4), (5, 5), (7, 7), (9, 9), (2, 3), (3, 5), (5, 9), (2, 7), (2, 5), (3, 7), (5, 7), (9, 2))


@pytest.mark.parametrize("model", [_Wide, _Heads, _Chain])
def test_convolution_tiles_at_every_isa_level(tmp_path: Path, model: type[torch.nn.Module]) -> None:
    """Every ISA library this CPU runs (the NCHW kernel's AVX2 code takes narrower channel blocks, Note
    [Convolution tiles per ISA]; the channels-last one halves its tiles' pixels, Note [AVX2 pixel
    halves]), at one and two threads, at images of 2 x 2 to 9 x 9 whose pixel counts (and the strided
    convolution's) leave every residue modulo the 8-pixel tile, against eager within 1e-5 of each
    output's scale; channels-last chains and NCHW direct kernels."""
    from bladepack.options import LoaderOptions
    from tests.helpers import all_isas, runnable_levels

    torch.manual_seed(0)
    net = model().eval()
    dims = {2: Dim("height", min=2, max=16), 3: Dim("width", min=2, max=16)}
    samples = [(torch.randn(1, 8, 5, 6),), (torch.randn(1, 8, 4, 7),)]
    art = bladepack.optimize(net, samples, (dims,), options=all_isas())
    levels = runnable_levels(art)
    assert len(levels) >= 2, art.cpu_libraries
    path = tmp_path / "convs.bpk"
    art.save(path)
    for isa in levels:
        for threads in (1, 2):
            mod = bladepack.load(path, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=threads))
            kinds = [k["kind"] for k in mod._manifest.kernels["cpu"]]
            assert kinds.count("conv") == len(net.convs), kinds  # type: ignore[arg-type]
            for h, w in SIDES:
                x = torch.randn(1, 8, h, w)
                with torch.no_grad():
                    want = [w.numpy() for w in net(x)]
                for k, (got, ref) in enumerate(zip(mod(x.numpy()), want, strict=True)):
                    err = float(np.abs(np.asarray(got) - ref).max() / max(1.0, float(np.abs(ref).max())))
                    assert err <= 1e-5, (isa, threads, h, w, k, err)


class _Multipliers(torch.nn.Module):
    """Depthwise convolutions that multiply the channels (Note [Channel multipliers]): 3 (72 outputs,
    blocks of 63 and 9), 5 with stride 2 (150: 60, 60, 30), 2 dilated, 17 with a 3 x 5 window (68: 51,
    17), and 65 (130 outputs: more than a block, the per-channel read), each with a hardswish epilogue."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            [
                torch.nn.Conv2d(24, 72, 3, padding=1, groups=24),
                torch.nn.Conv2d(30, 150, 3, stride=2, padding=1, groups=30, bias=False),
                torch.nn.Conv2d(8, 16, 3, padding=2, dilation=2, groups=8),
                torch.nn.Conv2d(4, 68, (3, 5), padding=(1, 2), groups=4),
                torch.nn.Conv2d(2, 130, 3, padding=1, groups=2),
            ]
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.nn.functional.hardswish(c(x[:, : c.in_channels]))  # type: ignore[index]
            for c in self.convs
        )


def test_depthwise_channel_multipliers_at_every_isa_level(tmp_path: Path) -> None:
    """Note [Channel multipliers] and Note [Interior tiles]: every ISA library this CPU runs, one and two
    threads, images narrower than a tile (every tile on the border) and wide ones (interior tiles),
    against eager within 1e-5 of each output's scale."""
    torch.manual_seed(0)
    _depthwise_everywhere(_Multipliers(), 30, tmp_path / "multipliers.bpk")


def _depthwise_everywhere(model: torch.nn.Module, channels: int, path: Path) -> None:
    """`model` (depthwise convolutions, each its own output, on the first channels of an input of
    `channels`) at every ISA library this CPU runs, one and two threads, images with every tile on the
    border and wide ones with interior tiles, against eager within 1e-5 of each output's scale."""
    from bladepack.options import LoaderOptions
    from tests.helpers import all_isas, runnable_levels

    net = model.eval()
    dims = ({0: Dim("batch", max=4), 2: Dim("h", max=64), 3: Dim("w", max=64)},)
    art = bladepack.optimize(net, [(torch.randn(2, channels, 9, 11),)], dims, options=all_isas())
    levels = runnable_levels(art)
    assert len(levels) >= 2, art.cpu_libraries
    art.save(path)
    for isa in levels:
        for threads in (1, 2):
            mod = bladepack.load(path, executor="native", options=LoaderOptions(cpu_isa=isa, num_threads=threads))
            assert [k["kind"] for k in mod._manifest.kernels["cpu"]].count("conv") == len(net.convs)
            for n, h, w in [(1, 1, 1), (2, 3, 5), (1, 9, 40), (2, 17, 33), (1, 4, 64)]:
                x = torch.randn(n, channels, h, w)
                with torch.no_grad():
                    want = [t.numpy() for t in net(x)]
                for k, (got, ref) in enumerate(zip(mod(x.numpy()), want, strict=True)):
                    err = float(np.abs(np.asarray(got) - ref).max() / max(1.0, float(np.abs(ref).max())))
                    assert err <= 1e-5, (isa, threads, (n, h, w), k, err)


class _DepthwiseWidths(torch.nn.Module):
    """Depthwise convolutions without a channel multiplier whose channel counts cross the AVX2 library's
    blocks of 16 (Note [Convolution tiles per ISA]): 8 and 12 (one narrow block), 17 (16 and a tail of 1),
    40 (16, 16, 8), 64 (a whole AVX-512 block), 72 (past it, a tail of 8 there) and 100 at stride 2, each with
    a batch norm and a hardswish epilogue, as MobileNet's are."""

    COUNTS = (8, 12, 17, 40, 64, 72, 100)

    def __init__(self) -> None:
        super().__init__()
        self.convs = torch.nn.ModuleList(
            torch.nn.Conv2d(c, c, 3, stride=2 if c == 100 else 1, padding=1, groups=c, bias=c % 2 == 0)
            for c in self.COUNTS
        )
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(c) for c in self.COUNTS)
        for bn in self.norms:
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(
            torch.nn.functional.hardswish(bn(c(x[:, : c.in_channels])))  # type: ignore[index]
            for c, bn in zip(self.convs, self.norms)
        )


def test_depthwise_channel_blocks_at_every_isa_level(tmp_path: Path) -> None:
    """The depthwise kernel's channel blocks per ISA library (AVX2 walks 16 channels at a time): every
    library this CPU runs, one and two threads, images with every tile on the border and wide ones with
    interior tiles, against eager within 1e-5 of each output's scale."""
    torch.manual_seed(0)
    _depthwise_everywhere(_DepthwiseWidths(), 100, tmp_path / "depthwise.bpk")
