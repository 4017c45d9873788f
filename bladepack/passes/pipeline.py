"""The optimization pipeline: one visible list of passes, each with the reason it runs.

In: an IR `Program` from a front end and the plan's targets. Out: the optimized `Program` (then
`build_plan` lowers it to an `ExecPlan`). With BLADEPACK_DUMP=dir, the IR after every pass is written to
dir/NN-<pass>.ir. Passes in CPU_ONLY run only when "cpu" is the one target (their layouts suit the
CPU's kernels, not the CUDA plan's); BLADEPACK_DENSE_LAYERS=0 skips `dense_layers`.
"""

from __future__ import annotations

from collections.abc import Callable

from bladepack.ir import Program, print_graph, verify
from bladepack.options import Options
from bladepack.passes.canonicalize_shapes import canonicalize_shapes
from bladepack.passes.channels_last import channels_last
from bladepack.passes.conv_layout import conv_layout
from bladepack.passes.dce import dead_code_elimination
from bladepack.passes.decompose import decompose
from bladepack.passes.dense_layers import dense_layers
from bladepack.passes.direct_conv import direct_conv
from bladepack.passes.matmul_scalars import matmul_scalars
from bladepack.passes.pack_linear import pack_linear

Pass = Callable[[Program], Program]

PIPELINE: list[tuple[Pass, str]] = [
    (canonicalize_shapes, "give equal dims one form (shape-constraint analysis), so fusion sees them as equal"),
    (dead_code_elimination, "drop nodes no output needs (front ends emit unused multi-result pieces)"),
    (decompose, "split convolution biases into adds, which fuse as GEMM epilogues"),
    (direct_conv, "small convolutions as direct kernels on weights packed at optimize time"),
    (conv_layout, "channel-major convolution results, so one GEMM covers the whole batch"),
    (channels_last, "direct convolutions and the pooling / elementwise ops after them channels-last (CPU only)"),
    (dense_layers, "linear layers as pointwise convolutions with their bias / activation in the store (CPU only)"),
    (pack_linear, "linear layers' weights stored [K, N], so few-row products need no lane sums (CPU only)"),
    (matmul_scalars, "scalar factors of matmul operands onto the product, so attention reads its operands in place"),
]
CPU_ONLY = frozenset({pack_linear, channels_last, dense_layers})


def run_pipeline(p: Program, options: Options, targets: frozenset[str] = frozenset({"cpu"})) -> Program:
    dump = options.dump_dir
    if dump is not None:
        dump.mkdir(parents=True, exist_ok=True)
        (dump / "00-export.ir").write_text(print_graph(p.graph, p.shape_env, with_loc=True))
    if options.verify:
        verify(p.graph, p.shape_env)
    for i, (fn, _reason) in enumerate(PIPELINE, start=1):
        if fn in CPU_ONLY and targets != {"cpu"}:
            continue
        if fn is dense_layers and not options.dense_layers:
            continue
        p = fn(p)
        if options.verify:
            verify(p.graph, p.shape_env)
        if dump is not None:
            (dump / f"{i:02d}-{fn.__name__}.ir").write_text(print_graph(p.graph, p.shape_env, with_loc=True))
    return p
