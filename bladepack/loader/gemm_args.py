"""A GEMM launch record's ints resolved once per input-shape signature, for cuBLAS and CUTLASS alike.

In: GemmCall's ints (three batch dims with element strides of A, B and C, then M, N, K, the transpose
flags and leading dims; library_ops/cpu_gemm.py), for a CUTLASS epilogue with a source tensor four more
(its three batch strides and leading dim; Note [GEMM epilogue]), and the element size. Out: `GemmArgs`
— the batch dim the library runs itself (the innermost one, or the middle one when the innermost is 1:
a grouped convolution's groups) with its strides, and the byte offsets of A, B, C (the output) and the
source for every step of the batch dims left to the host loop. A call then only adds these offsets to
its operand addresses.
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
    if b2 == 1:  # the middle batch dim as the library's batch
        b1, b2 = 1, b1
        a1, a2, p1, p2, c1, c2, e1, e2 = 0, a1, 0, p1, 0, c1, 0, e1
    m, n = int(m), int(n)
    if m == 0 or n == 0 or min(b0, b1, b2) == 0:
        steps: tuple[tuple[int, int, int, int], ...] = ()
    elif b0 == 1 and b1 == 1:
        steps = _ONE_STEP
    else:
        steps = tuple(
            (
                (i * a0 + j * a1) * itemsize,
                (i * p0 + j * p1) * itemsize,
                (i * c0 + j * c1) * itemsize,
                (i * e0 + j * e1) * itemsize,
            )
            for i in range(b0)
            for j in range(b1)
        )
    return GemmArgs(
        m, n, int(k), bool(ta), bool(tb), int(lda), int(ldb), int(ldc), b2, a2, p2, c2, int(ld_src), e2, steps
    )
