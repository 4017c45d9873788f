"""A GEMM launch record's ints resolved once per input-shape signature, for cuBLAS, cuBLASLt and CUTLASS.

In: GemmCall's ints (three batch dims with element strides of A, B and C, then M, N, K, the transpose
flags and leading dims; library_ops/cpu_gemm.py: the batch dims come first, padded with 1s after them),
for an epilogue with a source tensor four more (its three batch strides and leading dim; Note [GEMM
epilogue]), and the element size. Out: `GemmArgs` — the batch the library runs itself with its strides:
the innermost batch dim that is not 1, merged with the dims outside it whose strides are its stride
times its length (a contiguous [b, h, s, d] attention's b x h products are one strided-batched call) —
and the byte offsets of A, B, C (the output) and the source for every step of the batch dims left to
the host loop. A call then only adds these offsets to its operand addresses. The C++ runtime's
`gemm_args` (cpp_runtime/src/cuda_gemm.cpp) is the same function.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple


class GemmArgs(NamedTuple):  # (a tuple: made per GEMM record at each new signature)
    m: int
    n: int
    k: int
    ta: bool
    tb: bool
    lda: int
    ldb: int
    ldc: int
    batch: int  # the library's own batch count
    stride_a: int  # its element strides
    stride_b: int
    stride_c: int
    ld_src: int  # the epilogue source's leading dim and batch stride (0 for a bias row or no source)
    stride_src: int
    steps: tuple[tuple[int, int, int, int], ...]  # byte offsets of A, B, C, source per host-loop step (none when empty)


_ONE_STEP = ((0, 0, 0, 0),)  # the one host step of an unbatched or library-batched GEMM


def gemm_args(ints: Sequence[int], itemsize: int) -> GemmArgs:
    b0, b1, b2, a0, a1, a2, p0, p1, p2, c0, c1, c2, m, n, k, ta, tb, lda, ldb, ldc = ints[:20]
    e0, e1, e2, ld_src = ints[20:24] if len(ints) > 20 else (0, 0, 0, 0)
    m, n = int(m), int(n)
    dims = [(int(b0), (a0, p0, c0, e0)), (int(b1), (a1, p1, c1, e1)), (int(b2), (a2, p2, c2, e2))]
    if m == 0 or n == 0 or min(d for d, _ in dims) == 0:
        return GemmArgs(m, n, int(k), bool(ta), bool(tb), int(lda), int(ldb), int(ldc), 1, 0, 0, 0, int(ld_src), 0, ())
    # the library's batch: the innermost dim that is not 1, and each dim outside it whose strides are its
    # own times its length (one strided batch: a contiguous [b, h, s, d] attention is one call of b x h)
    outer = [(d, st) for d, st in dims if d != 1]
    count, lib = outer.pop() if outer else (1, (0, 0, 0, 0))
    while outer and all(int(o) == int(i) * count for o, i in zip(outer[-1][1], lib)):
        count *= outer.pop()[0]
    offsets: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)]
    for d, st in outer:  # the host loop, outermost first
        sa_, sb_, sc_, se_ = (int(s) * itemsize for s in st)
        offsets = [(a + j * sa_, b + j * sb_, c + j * sc_, e + j * se_) for a, b, c, e in offsets for j in range(d)]
    steps = tuple(offsets) if outer else _ONE_STEP
    sa, sb, sc, se = (int(s) for s in lib)
    return GemmArgs(
        m, n, int(k), bool(ta), bool(tb), int(lda), int(ldb), int(ldc), count, sa, sb, sc, int(ld_src), se, steps
    )
