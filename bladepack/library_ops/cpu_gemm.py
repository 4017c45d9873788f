"""GEMMs on CPU: matmul and convolution lowered to batched BLAS calls on strided views.

In: a matmul or conv2d node and the strided views of its operands (views.py). Out: `GemmCall`, the
arguments of one `bpk_gemm` launch (up to three batch dims with element strides, then M N K, the
transpose flags and leading dimensions), every size an int or a sympy expression for the shape program.

Note [BLAS views]: an operand matrix is passed without a copy when one of its two strides is 1 and the
other is at least the extent it strides over (proven for every shape in range); otherwise the fusion
planner materializes the operand. Batch dims that are contiguous over the rows of A while B is shared
(a linear layer on [batch, seq, hidden]) fold into M, so that is one large GEMM, not batch x seq small
ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from bladepack.dtypes import DType
from bladepack.ir import Node, ShapeEnv, Tri
from bladepack.ir.ops import Conv2dAttrs, MatmulAttrs
from bladepack.ir.types import IRDim
from bladepack.ir.views import View, contiguous_strides, simplify, sym_eq

MAX_BATCH = 3


@dataclass(frozen=True)
class GemmCall:
    dtype: DType
    a: View
    b: View
    out: int
    batch: tuple[IRDim, IRDim, IRDim]
    sa: tuple[IRDim, IRDim, IRDim]
    sb: tuple[IRDim, IRDim, IRDim]
    sc: tuple[IRDim, IRDim, IRDim]
    m: IRDim
    n: IRDim
    k: IRDim
    ta: bool
    tb: bool
    lda: IRDim
    ldb: IRDim
    ldc: IRDim

    def ints(self) -> list[IRDim]:
        return [
            *self.batch,
            *self.sa,
            *self.sb,
            *self.sc,
            self.m,
            self.n,
            self.k,
            int(self.ta),
            int(self.tb),
            self.lda,
            self.ldb,
            self.ldc,
        ]


def _at_least(env: ShapeEnv, big: IRDim, small: IRDim) -> bool:
    return sym_eq(big, small) or env.prove_le(sympy.sympify(small), sympy.sympify(big)) is Tri.YES


def matrix_layout(env: ShapeEnv, rows: IRDim, cols: IRDim, s_row: IRDim, s_col: IRDim) -> tuple[bool, IRDim] | None:
    """(transposed, leading dim) for a rows x cols matrix with these strides, or None (needs a copy)."""
    if s_col == 1 and (rows == 1 or _at_least(env, s_row, cols)):
        return False, (s_row if rows != 1 else cols)
    if s_row == 1 and (cols == 1 or _at_least(env, s_col, rows)):
        return True, (s_col if cols != 1 else rows)
    if rows == 1 and cols == 1:
        return False, 1
    return None


def _operand(node: Node, k: int, view: View) -> View:
    """Operand k as a [..., rows, cols] view in matmul orientation (b transposed when asked)."""
    assert isinstance(node.attrs, MatmulAttrs)
    if k == 1 and node.attrs.transpose_b:
        perm = list(range(len(view.shape)))
        perm[-1], perm[-2] = perm[-2], perm[-1]
        return view.permute(perm)
    return view


def operand_ok(env: ShapeEnv, node: Node, k: int, view: View) -> bool:
    v = _operand(node, k, view)
    if len(v.shape) < 2 or len(node.type.shape) - 2 > MAX_BATCH + 1:
        return False
    return matrix_layout(env, v.shape[-2], v.shape[-1], v.strides[-2], v.strides[-1]) is not None


def lower_matmul(env: ShapeEnv, node: Node, view_a: View, view_b: View) -> GemmCall | None:
    a, b = _operand(node, 0, view_a), _operand(node, 1, view_b)
    out_shape = node.type.shape
    batch = out_shape[:-2]
    m, n = out_shape[-2], out_shape[-1]
    k = a.shape[-1]
    la = matrix_layout(env, m, k, a.strides[-2], a.strides[-1])
    lb = matrix_layout(env, k, n, b.strides[-2], b.strides[-1])
    if la is None or lb is None:
        return None
    wide_a, wide_b = a.broadcast_to((*batch, m, k)), b.broadcast_to((*batch, k, n))
    if wide_a is None or wide_b is None:
        return None
    sa = list(wide_a.strides[: len(batch)])
    sb = list(wide_b.strides[: len(batch)])
    sc = list(contiguous_strides(out_shape)[: len(batch)])
    dims = list(batch)
    ta, lda = la
    # fold trailing batch dims into M while A's rows stay contiguous across them and B is shared
    row_stride = lda
    while dims and not ta and sb[-1] == 0 and sym_eq(sa[-1], simplify(m * row_stride)):
        m = simplify(m * dims[-1])
        dims.pop(), sa.pop(), sb.pop(), sc.pop()
    keep = [i for i, d in enumerate(dims) if d != 1]
    dims, sa, sb, sc = ([x[i] for i in keep] for x in (dims, sa, sb, sc))
    if len(dims) > MAX_BATCH:
        return None
    pad = MAX_BATCH - len(dims)
    return GemmCall(
        node.type.dtype,
        view_a,
        view_b,
        node.id,
        tuple(dims + [1] * pad),  # type: ignore[arg-type]
        tuple(sa + [0] * pad),  # type: ignore[arg-type]
        tuple(sb + [0] * pad),  # type: ignore[arg-type]
        tuple(sc + [0] * pad),  # type: ignore[arg-type]
        m,
        n,
        k,
        ta,
        lb[0],
        lda,
        lb[1],
        n,
    )


def conv_is_pointwise(node: Node) -> bool:
    a = node.attrs
    assert isinstance(a, Conv2dAttrs)
    w = node.type.shape  # unused; kernel size comes from the weight
    del w
    return a.stride == (1, 1) and a.padding == (0, 0) and a.groups == 1


def lower_conv(node: Node, x: View, w: View, cols: int | None) -> GemmCall:
    """conv2d as GEMMs per (image, group): W_g [OCg, C/g*KH*KW] @ cols_(n,g) [C/g*KH*KW, OH*OW].

    `cols` is the im2col buffer's value id ([N, C*KH*KW, OH*OW]), or None for a 1x1 stride-1 unpadded
    convolution, which reads x directly as [N, C, H*W]."""
    a = node.attrs
    assert isinstance(a, Conv2dAttrs)
    if a.out_layout == "cnhw":
        return _lower_conv_cnhw(node, w, cols)
    nb, oc, oh, ow = node.type.shape
    _, cg, kh, kw = w.shape
    g = a.groups
    ocg = oc // g
    kk = simplify(cg * kh * kw)
    p = simplify(oh * ow)
    wa = View(w.base, w.offset, (g, ocg, kk), (ocg * kk, kk, 1))
    if cols is None:
        b_view = View(x.base, x.offset, (nb, kk, p), contiguous_strides((nb, kk, p)))
        sb: tuple[IRDim, IRDim] = (simplify(kk * p), 0)
    else:
        b_view = View(cols, 0, (nb, g * kk, p), contiguous_strides((nb, g * kk, p)))
        sb = (simplify(g * kk * p), simplify(kk * p))
    return GemmCall(
        node.type.dtype,
        wa,
        b_view,
        node.id,
        (nb, g, 1),
        (0, ocg * kk, 0),
        (sb[0], sb[1], 0),
        (simplify(oc * p), simplify(ocg * p), 0),
        ocg,
        p,
        kk,
        False,
        False,
        kk,
        p,
        p,
    )


def _lower_conv_cnhw(node: Node, w: View, cols: int | None) -> GemmCall:
    """Note [Batch-folded convolution]: W [OC, C*KH*KW] @ cols [C*KH*KW, N*OH*OW] -> [OC, N*OH*OW], one GEMM."""
    assert cols is not None, "a channel-major convolution always goes through im2col"
    oc, nb, oh, ow = node.type.shape
    _, cg, kh, kw = w.shape
    kk = simplify(cg * kh * kw)
    cols_n = simplify(nb * oh * ow)
    wa = View(w.base, w.offset, (1, oc, kk), (0, kk, 1))
    b_view = View(cols, 0, (1, kk, cols_n), (0, cols_n, 1))
    return GemmCall(
        node.type.dtype,
        wa,
        b_view,
        node.id,
        (1, 1, 1),
        (0, 0, 0),
        (0, 0, 0),
        (0, 0, 0),
        oc,
        cols_n,
        kk,
        False,
        False,
        kk,
        cols_n,
        cols_n,
    )
