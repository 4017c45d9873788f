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


def gemm_args(ints: Sequence[int], itemsize: int) -> GemmArgs:
    batch, sa, sb, sc = list(ints[0:3]), list(ints[3:6]), list(ints[6:9]), list(ints[9:12])
    m, n, k, ta, tb, lda, ldb, ldc = (int(v) for v in ints[12:20])
    ss, ld_src = (list(ints[20:23]), int(ints[23])) if len(ints) > 20 else ([0, 0, 0], 0)
    if batch[2] == 1:  # the middle batch dim as the library's batch
        batch = [batch[0], 1, batch[1]]
        sa, sb, sc, ss = ([s[0], 0, s[1]] for s in (sa, sb, sc, ss))
    if m == 0 or n == 0 or min(batch) == 0:
        steps: tuple[tuple[int, int, int, int], ...] = ()
    elif batch[0] == 1 and batch[1] == 1:
        steps = ((0, 0, 0, 0),)  # the one step of an unbatched or library-batched GEMM
    else:
        steps = tuple(
            (
                (b0 * sa[0] + b1 * sa[1]) * itemsize,
                (b0 * sb[0] + b1 * sb[1]) * itemsize,
                (b0 * sc[0] + b1 * sc[1]) * itemsize,
                (b0 * ss[0] + b1 * ss[1]) * itemsize,
            )
            for b0 in range(batch[0])
            for b1 in range(batch[1])
        )
    return GemmArgs(m, n, k, bool(ta), bool(tb), lda, ldb, ldc, batch[2], sa[2], sb[2], sc[2], ld_src, ss[2], steps)
