"""Pass: linear layers' weights stored [K, N] at optimize time, for CPU plans.

In: a `Program`. Out: each matmul `x @ W^T` (transpose_b, as nn.Linear and ONNX Gemm(transB=1) store
W [N, K]) whose W is a 2-D constant of at least PACK_MIN_N rows and read by nothing but such products
reads a new constant W^T [K, N] (named `<weight>.kn`) with transpose_b off; the original weight goes.

Note [Packed linear weights]: with W [N, K], a product of a few rows is N dot products over K — each
ends in a horizontal sum of vector lanes, which costs more than its multiply-adds when K is a few
hundred (the MLP sample's 64 -> 256 layer spent 2.4 us on 16K multiply-adds at one row). Stored
[K, N], the same product broadcasts one element of x and multiply-adds a contiguous run of W's row
into vector accumulators that hold whole outputs: no lane sums at all (Note [Small-M GEMMs] in
codegen/cpu_gemm.h: such products of up to 16 rows on weights of 8K+ elements, up to 64 on 64K+,
where measured faster than OpenBLAS; a larger product split over the threads runs it per piece that
fits). BLAS reads [K, N] as a plain NN product at every other size; measured on the MLP sample against
the [N, K] plan (2-core AVX-512, numpy's OpenBLAS, one process): 1.16-1.95x less time per call from 1
to 64 rows, 1.1x at 255, about even at 1024 and 4096.
Narrow outputs (N < PACK_MIN_N: a classifier head) keep W [N, K]: one vector chunk of columns is
wider than the output, and BLAS's NT path measured faster there. Only for CPU-only plans: the CUDA
plan's GEMM configs and their alignment rules are chosen per operand layout, and its profiled choices
assume nn.Linear's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bladepack.ir import GraphBuilder, Node, OpKind, Program, rebuild_graph
from bladepack.ir.ops import MatmulAttrs
from bladepack.ir.types import TensorType
from bladepack.passes.dce import dead_code_elimination

PACK_MIN_N = 32


def _linear(n: Node, weights: set[int]) -> bool:
    a = n.attrs
    return n.op is OpKind.MATMUL and isinstance(a, MatmulAttrs) and a.transpose_b and n.inputs[1] in weights


def pack_linear(p: Program) -> Program:
    g = p.graph
    weights = {w.id: w for w in g.weights}
    readers: dict[int, list[Node]] = {}
    for n in g.nodes:
        for i in dict.fromkeys(n.inputs):
            if i in weights:
                readers.setdefault(i, []).append(n)
    packable = {
        w
        for w, ns in readers.items()
        if weights[w].type.rank == 2
        and isinstance(weights[w].type.shape[0], int)
        and weights[w].type.shape[0] >= PACK_MIN_N
        and w not in g.outputs
        and all(_linear(n, {w}) and n.inputs.count(w) == 1 and n.inputs[0] != w for n in ns)
    }
    if not packable:
        return p
    data = dict(p.weight_data)
    packed: dict[int, int] = {}

    def pack(b: GraphBuilder, n: Node, ins: tuple[int, ...]) -> int | None:
        if n.op is not OpKind.MATMUL or n.inputs[1] not in packable:
            return None
        w = weights[n.inputs[1]]
        if w.id not in packed:
            name = f"{w.name}.kn"
            data[name] = np.ascontiguousarray(np.asarray(p.weight_data[w.name]).T)
            nn, k = w.type.shape
            packed[w.id] = b.add_weight(name, TensorType(w.type.dtype, (k, nn)))
        return b.add(n.op, (ins[0], packed[w.id]), n.type, MatmulAttrs(transpose_b=False), n.loc)

    graph = rebuild_graph(g, pack)
    # the [N, K] weights nothing reads any more go, with their data
    return dead_code_elimination(dataclasses.replace(p, graph=graph, weight_data=data))
