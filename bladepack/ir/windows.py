"""How many windows a convolution or pool slides along one axis, at symbolic sizes: shared by the
torch front end (which checks torch.export's recorded lengths against it, Note [Exported pool
lengths] in export/ops_nn.py) and the ONNX importer (which computes its result shapes from it).

In: the axis length n (int or symbol), the window (kernel, stride, dilation), the padding before and
after, ceil_mode. Out: the count as an IR dim, written with floor / ceiling / Max / Min, which the
shape program evaluates.
"""

from __future__ import annotations

import sympy

from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify


def window_count(n: IRDim, kernel: int, stride: int, dilation: int, lo: IRDim, hi: IRDim, ceil: bool = False) -> IRDim:
    span = sympy.sympify(n) + lo + hi - dilation * (kernel - 1) - 1
    if not ceil:
        return simplify(sympy.floor(span / stride) + 1)
    out = sympy.ceiling(span / stride) + 1
    # The last window must start inside the input or the left padding: drop it when
    # (out - 1) * stride >= n + lo, written as an integer expression the shape program evaluates.
    past = (out - 1) * stride - (sympy.sympify(n) + lo)
    return simplify(out - sympy.Max(0, sympy.Min(1, past + 1)))
