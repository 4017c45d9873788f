"""The graph passes: one visible list, each with the reason it runs.

In: an IR `Program` from a front end, the options and the capabilities of the backends it is built for.
Out: the optimized `Program` (the "graph passes" stage of optimize, bladepack/stages.py; the plan
stages then lower it). A pass in `LAYOUT_PASSES` changes layouts that suit some backends' kernels
only: it runs when every backend built for lists it (`Capabilities.layout_passes`); `dense_layers`
also needs `CompileOptions.dense_layers`, `winograd_conv` `CompileOptions.winograd`. With a dump directory, the IR after every pass is written to
<dir>/<prefix>NN-<pass>.ir.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from bladepack.ir import Program, print_graph, verify
from bladepack.options import CompileOptions
from bladepack.passes.canonicalize_shapes import canonicalize_shapes
from bladepack.passes.channels_last import channels_last
from bladepack.passes.conv_layout import conv_layout
from bladepack.passes.dce import dead_code_elimination
from bladepack.passes.decompose import decompose
from bladepack.passes.dense_layers import dense_layers
from bladepack.passes.direct_conv import direct_conv
from bladepack.passes.matmul_scalars import matmul_scalars
from bladepack.passes.pack_linear import pack_linear
from bladepack.passes.sink_layout import sink_layout
from bladepack.passes.transposed_weights import transposed_weights
from bladepack.passes.weight_views import weight_views
from bladepack.passes.winograd_conv import winograd_conv
from bladepack.target import Capabilities

Pass = Callable[[Program], Program]

PIPELINE: list[tuple[Pass, str]] = [
    (canonicalize_shapes, "give equal dims one form (shape-constraint analysis), so fusion sees them as equal"),
    (dead_code_elimination, "drop nodes no output needs (front ends emit unused multi-result pieces)"),
    (decompose, "split convolution biases into adds, which fuse as GEMM epilogues"),
    (weight_views, "reshapes of weights as weights, so the passes below see a convolution's or a layer's weight"),
    (winograd_conv, "3x3 convolutions of many channels by Winograd's F(2x2, 3x3) on transformed weights"),
    (direct_conv, "small convolutions as direct kernels on weights packed at optimize time"),
    (channels_last, "direct convolutions and the pooling / elementwise ops after them channels-last"),
    (conv_layout, "channel-major convolution results, so one GEMM covers the whole batch"),
    (sink_layout, "unary elementwise ops before the reshapes / permutes they read, so they join their producer"),
    (transposed_weights, "`x @ W.T` read as nn.Linear's product, so the dense-layer pass sees a linear layer"),
    (dense_layers, "linear layers as pointwise convolutions with their bias / activation in the store"),
    (pack_linear, "linear layers' weights stored [K, N], so few-row products need no lane sums"),
    (matmul_scalars, "scalar factors of matmul operands onto the product, so attention reads its operands in place"),
]
LAYOUT_PASSES = frozenset({winograd_conv, channels_last, dense_layers, pack_linear})


def runs(fn: Pass, options: CompileOptions, caps: Sequence[Capabilities]) -> bool:
    """Whether `fn` runs for a plan built for backends of these capabilities."""
    if fn in LAYOUT_PASSES and not all(fn.__name__ in c.layout_passes for c in caps):
        return False
    if fn is winograd_conv:
        return options.winograd
    return fn is not dense_layers or options.dense_layers


def run_pipeline(
    p: Program, options: CompileOptions, caps: Sequence[Capabilities], dump: tuple[Path, str] | None = None
) -> Program:
    if options.verify:
        verify(p.graph, p.shape_env)
    for i, (fn, _reason) in enumerate(PIPELINE, start=1):
        if not runs(fn, options, caps):
            continue
        p = fn(p)
        if options.verify:
            verify(p.graph, p.shape_env)
        if dump is not None:
            directory, prefix = dump
            directory.mkdir(parents=True, exist_ok=True)
            (directory / f"{prefix}{i:02d}-{fn.__name__}.ir").write_text(
                print_graph(p.graph, p.shape_env, with_loc=True)
            )
    return p
