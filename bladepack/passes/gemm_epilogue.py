"""GEMM epilogues: the bias / residual add and activation a GEMM library computes while storing.

In: a matmul node the fusion planner gives to the GEMM library, the graph's users and types, the
planner's view function (views of materialized values only), and the library's `EpilogueForms`. Out: a
`GemmEpilogue` — the chain of ops after the matmul that the library's epilogue `D = act(A.B + C)`
computes — or None.

Note [GEMM epilogue]: from the matmul, follow single users while they fit the epilogue's one form:
at most one `add` with a materialized tensor C, then at most one activation the library evaluates as
the model does, in float32: CUTLASS ReLU, GELU in its exact form and SiLU; cuBLASLt ReLU and GELU
in its tanh form (`gelu(x, approximate="tanh")`: CUBLASLT_EPILOGUE_GELU is that formula, and it has
no exact GELU or SiLU, so those stay in the consumer's kernel). C is a *bias* when its
view broadcast to the output has strides (0, ..., 0, 1) — a row read again for every output row
(ldc 0) — or a *residual* when it has the output's own contiguous strides (ldc = N). The last op of the
chain becomes the GEMM's output and is materialized instead of the matmul, so kernels that inlined it
read it instead (the memory traffic never grows: one tensor of the same size is stored either way).
Intermediate ops of the chain have exactly one user, so no other kernel needs them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from bladepack.ir import Node, OpKind
from bladepack.ir.fusion_plan import EPILOGUE_DTYPES, EpilogueForms, GemmEpilogue
from bladepack.ir.ops import GeluAttrs
from bladepack.ir.types import TensorType
from bladepack.ir.views import View, contiguous_strides, sym_eq


def _activation(n: Node) -> str | None:
    if n.op is OpKind.RELU:
        return "relu"
    if n.op is OpKind.SILU:
        return "silu"
    if n.op is OpKind.GELU and isinstance(n.attrs, GeluAttrs):
        return {"none": "gelu", "tanh": "gelu_tanh"}.get(n.attrs.approximate)
    return None


def _source_kind(view: View | None, out: TensorType) -> str | None:
    if view is None:
        return None
    wide = view.broadcast_to(out.shape)
    if wide is None or not out.shape:
        return None
    *outer, last = wide.strides
    if sym_eq(last, 1) and all(sym_eq(s, 0) for s in outer):
        return "bias"
    if all(sym_eq(s, c) for s, c in zip(wide.strides, contiguous_strides(out.shape))):
        return "residual"
    return None


def find_epilogue(
    mm: Node,
    nodes: Mapping[int, Node],
    users: Mapping[int, Sequence[int]],
    types: Mapping[int, TensorType],
    view: Callable[[int], View | None],
    materialized: Callable[[int], bool],
    outputs: Collection[int],
    forms: EpilogueForms,
) -> GemmEpilogue | None:
    """Note [GEMM epilogue]: the epilogue of matmul `mm`, or None. `view(v)` is v as a view of a
    materialized value (None when it is computed inline); `materialized(v)` tells the planner's
    current choice; `outputs` are the graph's outputs (the matmul must not be one); `forms` what the
    GEMM library's epilogue computes."""
    out_type = types[mm.id]
    if mm.op is not OpKind.MATMUL or out_type.dtype not in EPILOGUE_DTYPES or out_type.dtype not in forms.dtypes:
        return None
    chain: list[int] = []
    source: int | None = None
    kind, activation = "none", "none"
    cur = mm.id
    while True:
        us = users.get(cur, ())
        if len(us) != 1 or (materialized(cur) if chain else cur in outputs):
            break  # the value is needed as it is
        u = nodes[us[0]]
        if types[u.id] != out_type or u.inputs.count(cur) != 1:
            break
        if u.op is OpKind.ADD and source is None and activation == "none":
            other = u.inputs[1] if u.inputs[0] == cur else u.inputs[0]
            k = _source_kind(view(other), out_type)
            if k is None:
                break
            source, kind = other, k
        else:
            act = _activation(u)
            if act is None or act not in forms.activations or activation != "none":
                break
            activation = act
        chain.append(u.id)
        cur = u.id
    if not chain:
        return None
    return GemmEpilogue(chain[-1], tuple(chain), source, kind, activation)
