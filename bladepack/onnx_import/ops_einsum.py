"""ONNX → IR: Einsum, as sums, permutes, reshapes and batched matrix products.

In: an Einsum node (explicit "ab,bc->ac" or implicit "ab,bc" equations; no ellipsis, no repeated
letter within one operand). Out: IR values.

Operands are contracted left to right. Each pair becomes one MATMUL: letters only one side needs are
summed away first; the rest are grouped into batch letters (both sides and still needed), the
contracted letters (both sides, not needed after) and each side's own letters; each side is permuted
to [batch, own, contracted] / [batch, contracted, own], flattened to three groups, multiplied, and
unflattened. The result is permuted into the equation's output order.
"""

from __future__ import annotations

import sympy

from bladepack.ir import OpKind, TensorType, Tri
from bladepack.ir.ops import MatmulAttrs, ReduceAttrs
from bladepack.ir.types import IRDim
from bladepack.onnx_import.context import OnnxCtx, OVal, Unsupported, converts, simplify_dim
from bladepack.onnx_import.ops_layout import permute

K = OpKind


def _parse(equation: str, n: int) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    if "." in eq:
        raise Unsupported(f"Einsum with an ellipsis ({equation!r})")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != n:
        raise Unsupported(f"Einsum equation {equation!r} names {len(terms)} operands for {n} inputs")
    if not arrow:  # implicit: the letters used once, in alphabetical order
        out = "".join(sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1))
    for t in [*terms, out]:
        if len(set(t)) != len(t) or not all(c.isalpha() for c in t):
            raise Unsupported(f"Einsum term {t!r} of {equation!r} (a repeated letter takes a diagonal)")
    return terms, out


def _sum_away(ctx: OnnxCtx, x: OVal, letters: str, keep: set[str]) -> tuple[OVal, str]:
    axes = tuple(k for k, c in enumerate(letters) if c not in keep)
    if not axes:
        return x, letters
    shape = tuple(d for k, d in enumerate(x.type.shape) if k not in axes)
    y = ctx.out(K.SUM, (ctx.tensor(x),), TensorType(x.type.dtype, shape), ReduceAttrs(axes, False))
    return y, "".join(c for c in letters if c in keep)


def _product(dims: list[IRDim]) -> IRDim:
    out: IRDim = 1
    for d in dims:
        out = simplify_dim(sympy.sympify(out) * d)
    return out


def _reshape(ctx: OnnxCtx, x: OVal, shape: tuple[IRDim, ...]) -> OVal:
    return OVal(TensorType(x.type.dtype, shape), ctx.reshape(ctx.tensor(x), shape))


def _contract(ctx: OnnxCtx, a: OVal, la: str, b: OVal, lb: str, needed: set[str]) -> tuple[OVal, str]:
    a, la = _sum_away(ctx, a, la, needed | set(lb))
    b, lb = _sum_away(ctx, b, lb, needed | set(la))
    size: dict[str, IRDim] = {}
    for x, letters in ((a, la), (b, lb)):
        for c, d in zip(letters, x.type.shape):
            if c in size and ctx.eq(size[c], d) is Tri.NO:
                raise Unsupported(f"Einsum letter {c!r} of sizes {size[c]} and {d} (broadcasting is not supported)")
            size.setdefault(c, d)
    batch = [c for c in la if c in lb and c in needed]
    summed = [c for c in la if c in lb and c not in needed]
    left = [c for c in la if c not in lb]
    right = [c for c in lb if c not in la]
    a = permute(ctx, a, tuple(la.index(c) for c in batch + left + summed))
    b = permute(ctx, b, tuple(lb.index(c) for c in batch + summed + right))
    bd = [size[c] for c in batch]
    m, k, n = _product([size[c] for c in left]), _product([size[c] for c in summed]), _product([size[c] for c in right])
    a3, b3 = _reshape(ctx, a, (*bd, m, k)), _reshape(ctx, b, (*bd, k, n))
    t = TensorType(a.type.dtype, (*bd, m, n))
    y = ctx.out(K.MATMUL, (ctx.tensor(a3), ctx.tensor(b3)), t, MatmulAttrs(False))
    kept = batch + left + right
    return _reshape(ctx, y, tuple(size[c] for c in kept)), "".join(kept)


@converts("Einsum")
def _einsum(ctx: OnnxCtx, ins: list[OVal | None]) -> list[OVal | None]:
    eq = ctx.text("equation", "None")
    operands = [x for x in ins if x is not None]
    terms, out = _parse(eq, len(operands))
    dt = operands[0].type.dtype
    if not dt.is_floating or any(x.type.dtype is not dt for x in operands):
        raise Unsupported(f"Einsum of {[x.type.dtype.value for x in operands]} (one float dtype)")
    for x, t in zip(operands, terms):
        if x.type.rank != len(t):
            raise Unsupported(f"Einsum term {t!r} for a rank-{x.type.rank} operand")
    acc, letters = operands[0], terms[0]
    for k in range(1, len(operands)):
        later = set(out).union(*terms[k + 1 :])
        acc, letters = _contract(ctx, acc, letters, operands[k], terms[k], later)
    acc, letters = _sum_away(ctx, acc, letters, set(out))
    return [permute(ctx, acc, tuple(letters.index(c) for c in out))]
