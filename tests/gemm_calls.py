"""GemmCalls as the lowering describes common GEMMs, for the CUTLASS selection and emitter tests."""

from __future__ import annotations

from typing import Any

import sympy

from bladepack.dtypes import DType
from bladepack.ir.views import View
from bladepack.library_ops.cpu_gemm import GemmCall


def linear_call(m: Any, n: int, k: int, dtype: DType = DType.FLOAT16) -> GemmCall:
    """x [M, K] @ W[N, K]^T, as lower_matmul describes a linear layer."""
    ms = sympy.sympify(m)
    zero = (0, 0, 0)
    return GemmCall(
        dtype, View(0, 0, (ms, k), (k, 1)), View(1, 0, (n, k), (k, 1)), 2, (1, 1, 1), zero, zero, zero,
        ms, n, k, False, True, k, k, n,
    )  # fmt: skip


def bmm_call(b: Any, s: Any, d: int, broadcast_b: bool = False) -> GemmCall:
    """[b, s, d] @ [b, d, s] (attention scores); `broadcast_b`: B is one [d, s] matrix for every batch."""
    sb = (0, 0, 0 if broadcast_b else d * s)
    return GemmCall(
        DType.FLOAT16, View(0, 0, (b, s, d), (s * d, d, 1)), View(1, 0, (b, d, s), (d * s, s, 1)), 2,
        (1, 1, b), (0, 0, s * d), sb, (0, 0, s * s), s, s, d, False, False, d, s, s,
    )  # fmt: skip
