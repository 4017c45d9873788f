"""IR printer (golden text), verifier and the dead-code pass (Before / Expected)."""

from __future__ import annotations

import numpy as np
import pytest
import sympy

from bladepack.dtypes import DType
from bladepack.ir import GraphBuilder, IRVerificationError, OpKind, Program, ShapeEnv, TensorType, print_graph, verify
from bladepack.ir.ops import AxisAttrs, MatmulAttrs, NoAttrs
from bladepack.passes.dce import dead_code_elimination


def _program() -> tuple[Program, sympy.Symbol]:
    env = ShapeEnv()
    b_ = env.create_symbol("batch", 1, 64)
    g = GraphBuilder()
    x = g.add_input("x", TensorType(DType.FLOAT32, (b_, 16)))
    w = g.add_weight("fc.weight", TensorType(DType.FLOAT32, (32, 16)))
    y = g.add(OpKind.MATMUL, (x, w), TensorType(DType.FLOAT32, (b_, 32)), MatmulAttrs(True), loc="m.py:3")
    dead = g.add(OpKind.EXP, (x,), TensorType(DType.FLOAT32, (b_, 16)))
    z = g.add(OpKind.SOFTMAX, (y,), TensorType(DType.FLOAT32, (b_, 32)), AxisAttrs(1))
    del dead
    return Program(g.finish((z,), ("out",)), env, {"fc.weight": np.zeros((32, 16), np.float32)}), b_


BEFORE = """\
symbols { batch: [1, 64] }
graph(%0 x: f32[batch, 16]) weights(%1 fc.weight: f32[32, 16]) {
  %2: f32[batch, 32] = matmul(%0, %1) {transpose_b=True}
  %3: f32[batch, 16] = exp(%0)
  %4: f32[batch, 32] = softmax(%2) {axis=1}
  return %4
}
"""

EXPECTED = """\
symbols { batch: [1, 64] }
graph(%0 x: f32[batch, 16]) weights(%1 fc.weight: f32[32, 16]) {
  %2: f32[batch, 32] = matmul(%0, %1) {transpose_b=True}
  %4: f32[batch, 32] = softmax(%2) {axis=1}
  return %4
}
"""


def test_printer_golden_and_dce() -> None:
    p, _ = _program()
    assert print_graph(p.graph, p.shape_env) == BEFORE
    after = dead_code_elimination(p)
    assert print_graph(after.graph, after.shape_env) == EXPECTED
    verify(after.graph, after.shape_env)


def test_printer_shows_provenance() -> None:
    p, _ = _program()
    assert "  # m.py:3" in print_graph(p.graph, with_loc=True)


def test_verifier_reports_every_problem() -> None:
    env = ShapeEnv()
    s = env.create_symbol("s", 1, 8)
    t = sympy.Symbol("t", integer=True, nonnegative=True)
    g = GraphBuilder()
    x = g.add_input("x", TensorType(DType.FLOAT32, (s, 4)))
    g.add(OpKind.ADD, (x, 99), TensorType(DType.FLOAT32, (s, 4)))
    g.add(OpKind.ADD, (x, x), TensorType(DType.FLOAT32, (s + 1, 4)))
    g.add(OpKind.EXP, (x,), TensorType(DType.FLOAT32, (t, 4)))
    with pytest.raises(IRVerificationError) as info:
        verify(g.finish((x,), ("y",)), env)
    text = str(info.value)
    assert "undefined values [99]" in text
    assert "cannot broadcast" in text
    assert "unknown symbols" in text


def test_builder_checks_attribute_types() -> None:
    g = GraphBuilder()
    x = g.add_input("x", TensorType(DType.FLOAT32, (4,)))
    with pytest.raises(TypeError, match="softmax takes AxisAttrs"):
        g.add(OpKind.SOFTMAX, (x,), TensorType(DType.FLOAT32, (4,)), NoAttrs())


def test_broadcast_rule() -> None:
    """One rule for both front ends (ir/broadcast.py): 1 broadcasts, a static size wins over symbols,
    the first symbol otherwise; two static sizes that differ are refused."""
    import sympy

    from bladepack.ir.broadcast import BroadcastError, broadcast_shapes

    a, b = sympy.symbols("a b", positive=True, integer=True)
    assert broadcast_shapes((a, 1, 4), (3, 1)) == (a, 3, 4)
    assert broadcast_shapes((1, a), (b, 1), (1,)) == (b, a)
    assert broadcast_shapes((a, 5), (b, 5)) == (a, 5)
    assert broadcast_shapes((a,), (7,)) == (7,)
    assert broadcast_shapes(()) == () and broadcast_shapes((), (2,)) == (2,)
    with pytest.raises(BroadcastError, match=r"axis 1: \[3, 4\]"):
        broadcast_shapes((2, 3), (4,))
