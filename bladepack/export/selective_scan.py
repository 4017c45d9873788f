"""Mamba's selective scan kept whole through torch.export.

In: a model that may call Hugging Face's `mamba_selective_scan` (transformers' Mamba and the models
built on its mixer). Out: `selective_scans(model)`, a context in which that function exports as one
`bladepack::selective_scan` node, and the converter of that node to a SELECTIVE_SCAN op (Note
[Selective scan kernel] in codegen/selective_scan_kernel.py).

Note [Selective scans through export]: the function's torch fallback is a Python loop over the
steps, which torch.export unrolls at the sample's length (the sequence dim becomes a constant, and
optimize refuses the model). Inside `selective_scans` the function is replaced, in every loaded
transformers module that defines it (restored afterwards), by a custom op with a fake kernel, so the
scan stays one node with a symbolic length; its eager kernel is the same recurrence. A scan that must
return its last state (a cache being filled) is refused: export with use_cache=False.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from bladepack.errors import ExportError
from bladepack.export.context import Ctx, Unsupported, arg, converts
from bladepack.ir import OpKind, TensorType
from bladepack.ir.ops import SelectiveScanAttrs

_NAME = "mamba_selective_scan"


@torch.library.custom_op("bladepack::selective_scan", mutates_args=())
def _scan_op(
    u: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    delta_bias: torch.Tensor | None,
    delta_softplus: bool,
) -> torch.Tensor:
    """u, dt [batch, D, L], A [D, N], B, C [batch, N, L] -> y [batch, D, L] (Hugging Face's
    recurrence, step by step)."""
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    state = u.new_zeros((u.shape[0], u.shape[1], A.shape[1]), dtype=torch.float32)
    ys = []
    for t in range(u.shape[2]):
        step = dt[:, :, t, None].float()
        state = torch.exp(A[None].float() * step) * state + step * B[:, None, :, t].float() * u[:, :, t, None].float()
        ys.append((state * C[:, None, :, t].float()).sum(-1))
    y = torch.stack(ys, dim=-1).to(u.dtype) if ys else u.new_zeros(u.shape)
    if D is not None:
        y = y + u * D[None, :, None]
    if z is not None:
        y = y * F.silu(z)
    return y


@_scan_op.register_fake
def _(
    u: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    delta_bias: torch.Tensor | None,
    delta_softplus: bool,
) -> torch.Tensor:
    return u.new_empty(u.shape)


def _scan(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    if return_last_state:
        raise ExportError(
            "mamba_selective_scan asked for its last state (a cache being filled): export with "
            "config.use_cache = False and pass states as inputs"
        )
    y: torch.Tensor = torch.ops.bladepack.selective_scan(
        hidden_states, dt, A, B, C, D, z, delta_bias, bool(delta_softplus)
    )
    return y


@contextlib.contextmanager
def selective_scans(model: torch.nn.Module) -> Iterator[None]:
    """Note [Selective scans through export]."""
    del model  # the function is a module global, not an attribute of the model
    patched = [
        (m, getattr(m, _NAME))
        for name, m in list(sys.modules.items())
        if name.startswith("transformers.models.") and callable(getattr(m, _NAME, None))
    ]
    for m, _ in patched:
        setattr(m, _NAME, _scan)
    try:
        yield
    finally:
        for m, fn in patched:
            setattr(m, _NAME, fn)


@converts("bladepack.selective_scan.default")
def _selective_scan(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    u, dt, a, b, c = (ctx.v(x) for x in args[:5])
    d, z, bias = (arg(args, kwargs, k, n) for k, n in ((5, "D"), (6, "z"), (7, "delta_bias")))
    softplus = bool(arg(args, kwargs, 8, "delta_softplus", False))
    ut, at = ctx.t(u), ctx.t(a)
    if not ut.dtype.is_floating or ut.rank != 3 or at.rank != 2 or not isinstance(at.shape[1], int):
        raise Unsupported(f"a selective scan of {ut} with A {at} (u [batch, D, L], A [D, N] of a constant N)")
    inputs = [u, dt, a, b, c] + [ctx.v(x) for x in (d, z, bias) if x is not None]
    attrs = SelectiveScanAttrs(softplus, d is not None, z is not None, bias is not None)
    return ctx.emit(OpKind.SELECTIVE_SCAN, inputs, TensorType(ut.dtype, ut.shape), attrs)
