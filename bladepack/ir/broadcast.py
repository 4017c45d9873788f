"""The one broadcasting rule of the IR, used by both front ends (numpy / torch semantics).

In: operand shapes (int or sympy dims). Out: the result shape. Shapes are right-aligned; per axis, a
dim that is 1 broadcasts. The other dims must agree: two different static sizes raise BroadcastError;
a static size wins over symbols (they must equal it, or be 1); among symbols the first one is the
result's. Symbols that the rule takes as equal to another dim are not proven so here: the shape
constraint analysis records "equal, or 1" for every broadcast operand (passes/shape_constraints.py),
canonicalize_shapes unifies them, and the runtime assertions it leaves check them per call.
"""

from __future__ import annotations

from collections.abc import Sequence

from bladepack.ir.types import IRDim


class BroadcastError(ValueError):
    """Shapes that cannot broadcast (two different static sizes on one axis)."""


def broadcast_shapes(*shapes: Sequence[IRDim]) -> tuple[IRDim, ...]:
    rank = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in shapes]
    out: list[IRDim] = []
    for k in range(rank):
        ds = [s[k] for s in padded if not (isinstance(s[k], int) and s[k] == 1)]
        if not ds:
            out.append(1)
            continue
        static = sorted({d for d in ds if isinstance(d, int)})
        if len(static) > 1:
            raise BroadcastError(f"shapes {[list(s) for s in shapes]} cannot broadcast (axis {k}: {static})")
        out.append(static[0] if static else ds[0])
    return tuple(out)
