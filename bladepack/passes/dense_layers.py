"""Pass: linear layers as channels-last pointwise convolutions, with their elementwise chains, for CPU plans.

In: a `Program` after `channels_last`. Out: each product `x @ W` of a value x [..., K] and a 2-D constant
weight (W [K, N], or W [N, K] read transposed as nn.Linear and ONNX Gemm(transB=1) store it) becomes a 1x1 convolution (stride 1, no padding, out_layout "nhwc", weight_layout
"ihwo") of x's rows viewed as the pixels of a channels-last image (`pixels`: [M, K] as [1, 1, M, K],
[B, S, K] as [1, B, S, K]), on the weight stored [K, 1, 1, N], or in column panels
(`weight_layout="panels"`: Note [Dense weight panels]) where N is a multiple of 64 or the weight is over
MAX_WEIGHT_BYTES. Each elementwise op that reads such a
result, and whose other operands are such results, scalars, constant along every dim but the last (a
bias), or a whole value of the result's shape (a residual), computes on the [N, H, W, C] views as
well. A reshape back to [..., N] (a view) follows each converted value for the consumers outside.

Note [Dense layers]: a BLAS GEMM stores its product and stops, so a linear layer's bias, activation and
residual add run as a separate loop kernel that reads the product back and writes it again, with a
launch of the pool of its own; a classifier head of 10 columns takes OpenBLAS's slowest path. As a
pointwise convolution the product is the channels-last kernel's register tile (Note [Channels-last
convolution], codegen/cpu_conv_nhwc.py): rows x output channels in vector accumulators across K, the
elementwise chain evaluated before one vector store (Note [Convolution epilogue]), the rows and column
blocks split over the pool together (codegen/cpu_dense.py picks the tile from the run-time row count).
Only for CPU-only plans, like the other channels-last ops.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

import numpy as np

from bladepack.dtypes import DType
from bladepack.ir import GraphBuilder, Node, OpKind, Program, rebuild_graph
from bladepack.ir.ops import (
    CHANNEL_BLOCK,
    DENSE_CONV,
    DENSE_PANELS,
    MAX_WEIGHT_BYTES,
    OP_INFO,
    PANEL,
    Conv2dAttrs,
    MatmulAttrs,
    OpClass,
    SliceAttrs,
)
from bladepack.ir.types import IRDim, TensorType
from bladepack.passes.dce import dead_code_elimination

# Note [Dense weight sizes]: the dense kernel streams W's [K, 64] column panel once per tile of rows,
# with no blocking of K. With a tile's rows outer (its inputs stay in L1 across W's column blocks),
# W must stay in the core's L2: measured (bench/results/dense_layers.md, Linear + ReLU, whole calls,
# against the BLAS plan) as fast or faster at every row count up to 512 KB (256 x 512 float32);
# 512 x 512 and larger 0.5-0.95x (768 x 3072: 0.3x at 1024 rows). Larger weights are read in column
# panels (Note [Dense weight panels]) with the blocks outer, so one block's [K, 64] panel must stay in
# L2 instead: K * 64 elements of up to 1 MiB (K up to 4096 float32).
#
# Note [Dense K pieces]: a longer K is split into even pieces within that bound (multiples of PANEL),
# each a dense convolution on a slice of x's channels (a view) and its own panels; the pieces'
# products are summed by adds the convolution epilogue pass folds into their stores (a residual),
# the bias and activation after the last sum. The partial sums cost one [M, N] store and read per
# piece, against M * N * K multiply-adds. Measured (bench/results/dense_layers_large.md) at 1024 rows:
# 1.02-1.12x the BLAS plan in pieces, 0.92-0.98x as one piece of 8192 or 11008 (its panel past L2).
MAX_PANEL_BYTES = 1024 * 1024

# Note [Dense weight panels]: W [K, N] stored row-major puts a column block's K rows N elements
# apart: past L2, each k of a block's pass is another cache line and, at N >= 1024, another page, so
# the kernel stalls on the TLB and the prefetchers see no stream. A weight over MAX_WEIGHT_BYTES is
# stored instead as [ceil(N / 16), K, 1, 16] (`weight_layout="panels"`): each 16 columns contiguous
# over K, the last panel zero-padded, so a block's pass reads one to four sequential streams (AVX-512's
# 64 columns are four panels; AVX2's and SSE's 8- and 16-column blocks one, their 24- and 12-column
# ones narrowed to 16 and 8 to stay inside). One layout serves every ISA level of the artifact. The
# kernel then walks column blocks outer and row tiles inner (codegen/cpu_dense.py), so a block's panel
# stays in L2 across the rows. Measured beside the row-major kernel and OpenBLAS's AVX-512 kernels
# (bench/results/dense_layers_large.md).
#
# Inside L2 the row-major layout costs the narrow-register libraries too: AVX2's 16-column block reads
# one cache line per k at a stride of N * 4 bytes, which at N = 256 (1 KB) maps every k of the block
# to 4 of L1's 64 sets, where the tile's six input rows (also 1 KB apart) live, so they evict each
# other. A weight whose N is a multiple of CHANNEL_BLOCK is stored in panels whatever its size (no
# padding), its tiles' rows still outer below MAX_WEIGHT_BYTES. Measured on a Zen 4 EPYC with a
# standalone 6 x 16 AVX2 micro-kernel, one thread, 256 x 256, the best of 20 (bench/results/
# dense_layers_avx2.md "Panels inside L2"): 4096 rows 70-76% -> 87% of the FMA peak, 255 rows 87% ->
# 97%; the AVX-512 6 x 64 tile the same either way (81% and 98%). Narrower or ragged N stays row-major:
# its rows are a line or two apart already, and a decode step's few rows would stream the padding.
DENSE_DTYPES = frozenset({DType.FLOAT32, DType.FLOAT64, DType.FLOAT16, DType.BFLOAT16})


def pixels(shape: tuple[IRDim, ...]) -> tuple[IRDim, IRDim, IRDim, IRDim]:
    """[..., C] as the [N, H, W, C] of a channels-last image whose pixels are its rows: [M, C] is
    [1, 1, M, C], [B, S, C] is [1, B, S, C], and more leading dims merge into N. A batch or sequence
    dim stays a dim of its own, so the rows stay provably independent along it (Note [Batch-like dims]
    in ir/batch_dims.py)."""
    lead = tuple(shape[:-1])
    padded = (1,) * max(0, 3 - len(lead)) + lead
    return (TensorType(DType.INT64, padded[:-2]).numel(), padded[-2], padded[-1], shape[-1])


def _linear(n: Node, weights: Collection[int], types: dict[int, TensorType]) -> bool:
    """`x @ W` with W a 2-D constant of int dims and x [..., K] of the result's leading dims."""
    a = n.attrs
    if n.op is not OpKind.MATMUL or not isinstance(a, MatmulAttrs) or n.inputs[1] not in weights:
        return False
    wt = types[n.inputs[1]]
    if wt.rank != 2 or not all(isinstance(d, int) for d in wt.shape) or n.type.dtype not in DENSE_DTYPES:
        return False
    xt = types[n.inputs[0]]
    return n.type.rank >= 2 and xt.shape[:-1] == n.type.shape[:-1] and n.inputs[0] != n.inputs[1]


def panels(kn: np.ndarray) -> np.ndarray:
    """W [K, N] as [ceil(N / PANEL), K, 1, PANEL]: column panels, the last zero-padded (Note [Dense
    weight panels])."""
    k, nn = kn.shape
    count = -(-nn // PANEL)
    padded = np.zeros((k, count * PANEL), dtype=kn.dtype)
    padded[:, :nn] = kn
    return np.ascontiguousarray(padded.reshape(k, count, 1, PANEL).transpose(1, 0, 2, 3))


def k_pieces(k: int, itemsize: int) -> list[tuple[int, int]]:
    """[k0, k1) per piece of a K whose 64-column panel would pass MAX_PANEL_BYTES, split evenly in
    multiples of PANEL (Note [Dense K pieces]); one piece otherwise."""
    longest = MAX_PANEL_BYTES // (CHANNEL_BLOCK * itemsize)
    count = -(-k // longest)
    per = -(-k // count)
    step = -(-per // PANEL) * PANEL
    return [(k0, min(k, k0 + step)) for k0 in range(0, k, step)]


def _elementwise(n: Node) -> bool:
    cls = OP_INFO[n.op].op_class
    return cls in (OpClass.ELEMENTWISE, OpClass.BROADCAST) and n.op not in (OpKind.CONSTANT, OpKind.FULL, OpKind.EXPAND)


def dense_layers(p: Program) -> Program:
    g = p.graph
    by_id = {w.id: w for w in g.weights}
    types = g.value_types()
    readers: dict[int, list[Node]] = {}
    for n in g.nodes:
        for i in dict.fromkeys(n.inputs):
            if i in by_id:
                readers.setdefault(i, []).append(n)
    # a weight converts when every reader is a linear layer reading it as W (one layout serves them all)
    convertible = {
        w
        for w, ns in readers.items()
        if w not in g.outputs
        and all(_linear(n, by_id, types) and n.inputs[1] == w and n.inputs.count(w) == 1 for n in ns)
        and len({n.attrs.transpose_b for n in ns if isinstance(n.attrs, MatmulAttrs)}) == 1
    }
    if not convertible:
        return p
    data = dict(p.weight_data)
    # original weight -> the convolution's attrs, and (k0, k1, copy) per piece of K
    packed: dict[int, tuple[Conv2dAttrs, list[tuple[int, int, int]]]] = {}
    # a run-time branch's merge `where(pred, a, b)` keeps its operands, so each branch's guard holds
    # (Note [Guarded nodes] in ir/graph.py: a value's guard counts where all its readers share it)
    preds = {c.pred for n in g.nodes for c in n.guard}
    # the [1, 1, M, N] version of a value of the new graph, keyed by its [..., N] version (the reshape)
    dense_of: dict[int, int] = {}

    def pack(b: GraphBuilder, w_id: int, transposed: bool) -> tuple[Conv2dAttrs, list[tuple[int, int, int]]]:
        if w_id not in packed:
            w = by_id[w_id]
            arr = np.asarray(p.weight_data[w.name])
            kn = arr.T if transposed else arr
            k, nn = kn.shape
            if kn.nbytes <= MAX_WEIGHT_BYTES and nn % CHANNEL_BLOCK:
                attrs, copies = DENSE_CONV, [(f"{w.name}.dense", 0, k, np.ascontiguousarray(kn).reshape(k, 1, 1, nn))]
            elif kn.nbytes <= MAX_WEIGHT_BYTES:  # Note [Dense weight panels]: inside L2, one piece
                attrs, copies = DENSE_PANELS, [(f"{w.name}.panels", 0, k, panels(kn))]
            else:  # Note [Dense weight panels], Note [Dense K pieces]
                bounds = k_pieces(k, kn.dtype.itemsize)
                suffix = [str(i) if len(bounds) > 1 else "" for i in range(len(bounds))]
                attrs = DENSE_PANELS
                copies = [(f"{w.name}.panels{s}", k0, k1, panels(kn[k0:k1])) for s, (k0, k1) in zip(suffix, bounds)]
            pieces = []
            for name, k0, k1, stored in copies:
                data[name] = stored
                pieces.append((k0, k1, b.add_weight(name, TensorType(w.type.dtype, stored.shape))))
            packed[w_id] = (attrs, pieces)
        return packed[w_id]

    def flat(t: TensorType) -> TensorType:
        return TensorType(t.dtype, pixels(t.shape))

    def as_pixels(b: GraphBuilder, v: int, t: TensorType, loc: str) -> int:
        """v [..., C] viewed as [N, H, W, C]: a reshape, unless v is 4-D already."""
        return v if t.rank == 4 else b.add(OpKind.RESHAPE, (v,), flat(t), loc=loc)

    def operand(b: GraphBuilder, v: int, old: int, out: TensorType, loc: str) -> int | None:
        """v as an operand of a converted elementwise op of result type `out` ([..., N]), or None."""
        t = types[old]
        if v in dense_of:
            return dense_of[v] if t.shape == out.shape else None
        if t.rank == 0:
            return v
        shape = (1,) * (out.rank - t.rank) + tuple(t.shape)
        if all(d == 1 for d in shape[:-1]):  # a bias: constant along every dim but the last
            return b.add(OpKind.RESHAPE, (v,), TensorType(t.dtype, (1, 1, 1, shape[-1])), loc=loc)
        if t.shape == out.shape:  # a whole value of the result's shape (a residual)
            return as_pixels(b, v, t, loc)
        return None

    def convert(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        if n.op is OpKind.MATMUL and n.inputs[1] in convertible:
            assert isinstance(n.attrs, MatmulAttrs)
            xt = types[n.inputs[0]]
            x4 = dense_of[ins[0]] if ins[0] in dense_of else as_pixels(b, ins[0], xt, n.loc)
            attrs, pieces = pack(b, n.inputs[1], n.attrs.transpose_b)
            y = -1
            for k0, k1, w4 in pieces:  # Note [Dense K pieces]: each piece's product adds the ones before
                xk = x4
                if len(pieces) > 1:
                    shape = (*flat(xt).shape[:3], k1 - k0)
                    xk = b.add(OpKind.SLICE, (x4,), TensorType(xt.dtype, shape), SliceAttrs(3, k0, 1), n.loc)
                part = b.add(OpKind.CONV2D, (xk, w4), flat(n.type), attrs, n.loc)
                y = part if y < 0 else b.add(OpKind.ADD, (part, y), flat(n.type), loc=n.loc)
        elif (
            _elementwise(n) and any(i in dense_of for i in ins) and not (n.op is OpKind.WHERE and n.inputs[0] in preds)
        ):
            xs = [operand(b, i, o, n.type, n.loc) for i, o in zip(ins, n.inputs)]
            if any(x is None for x in xs):
                return None
            y = b.add(n.op, tuple(x for x in xs if x is not None), flat(n.type), n.attrs, n.loc)
        else:
            return None
        back = y if n.type.rank == 4 else b.add(OpKind.RESHAPE, (y,), n.type, loc=n.loc)
        dense_of[back] = y
        return back

    graph = rebuild_graph(g, convert)
    # the weights nothing reads any more go, with their data
    return dead_code_elimination(dataclasses.replace(p, graph=graph, weight_data=data))
