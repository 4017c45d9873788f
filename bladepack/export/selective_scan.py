"""Mamba's selective scans kept whole through torch.export.

In: a model that may call Hugging Face's `mamba_selective_scan` (transformers' Mamba and the models
built on its mixer) or `mamba2_chunk_scan` (Mamba-2's state-space duality, and the hybrids built on
its mixer: Bamba, Zamba2, NemotronH, GraniteMoeHybrid). Out: `selective_scans(model)`, a context in
which those functions export as one `bladepack::selective_scan` node each, and the converter of that
node to a SELECTIVE_SCAN op (Note [Selective scan kernel] in codegen/selective_scan_kernel.py).

Note [Selective scans through export]: the function's torch fallback is a Python loop over the
steps, which torch.export unrolls at the sample's length (the sequence dim becomes a constant, and
optimize refuses the model). Inside `selective_scans` the function is replaced, in every loaded
transformers module that defines it (restored afterwards), by a custom op with a fake kernel, so the
scan stays one node with a symbolic length; its eager kernel is the same recurrence. A scan that must
return its last state (a cache being filled) is refused: export with use_cache=False.

Note [Mamba-2 as a selective scan]: Mamba-2's chunked scan is the same recurrence as Mamba's with a
scalar A per head, the step size per head and Bm, Cm shared by the heads of a group: per head h of
group g, x = exp(delta[h] * A[h]) * x + delta[h] * Bm[g] * u[h, p] over a state [P, N], y[h, p] =
x[p] . Cm[g] + D[h] * u[h, p]. Its torch fallback computes it by chunks (padding the sequence to a
multiple of the chunk, segment sums, einsums), and torch.export could not trace that at batch 1 or at
lengths that are not padded into two chunks (the reshapes of the padded chunks guard `!= 1` and
`pad > 0`). Inside `selective_scans` it becomes one SELECTIVE_SCAN over the H * P channels with grouped
Bm, Cm [batch, G, N, L], and dt, A, D per head: delta = clamp(softplus(dt + dt_bias)) [batch, H, L]
by plain ops, A [H, 1] (one decay per step, not N), D [H]. The fallback's result is float32 whatever
the input dtype, and so is this one.
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
from bladepack.ir.views import sym_eq

_NAME = "mamba_selective_scan"
_NAME2 = "mamba2_chunk_scan"


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
    """u [batch, D, L]; dt [batch, H, L], A [H, N] or [H, 1] (one A for every N), D and delta_bias [H]
    for H heads dividing D (channel d in head d // (D / H); H = D in Mamba); B, C [batch, N, L] or
    [batch, G, N, L] (channel d in group d // (D / G)) -> y [batch, D, L] (Hugging Face's recurrence,
    step by step)."""
    rep = u.shape[1] // dt.shape[1]
    if rep != 1:  # one row of dt, A, D and the bias per channel
        dt, A = dt.repeat_interleave(rep, dim=1), A.repeat_interleave(rep, dim=0)
        D = None if D is None else D.repeat_interleave(rep, dim=0)
        delta_bias = None if delta_bias is None else delta_bias.repeat_interleave(rep, dim=0)
    if B.dim() == 4:  # grouped: one row of B and C per channel
        B = B.repeat_interleave(u.shape[1] // B.shape[1], dim=1)
        C = C.repeat_interleave(u.shape[1] // C.shape[1], dim=1)
    else:
        B, C = B[:, None], C[:, None]
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    state = u.new_zeros((u.shape[0], u.shape[1], B.shape[-2]), dtype=torch.float32)
    ys = []
    for t in range(u.shape[2]):
        step = dt[:, :, t, None].float()
        state = torch.exp(A[None].float() * step) * state + step * B[:, :, :, t].float() * u[:, :, t, None].float()
        ys.append((state * C[:, :, :, t].float()).sum(-1))
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


def _chunk_scan(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    chunk_size: int,
    D: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    initial_states: torch.Tensor | None = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    **kwargs: Any,
) -> torch.Tensor:
    """Note [Mamba-2 as a selective scan]: x [batch, L, H, P], dt [batch, L, H], A [H], B, C
    [batch, L, G, N] -> y [batch, L, H, P] in float32."""
    del chunk_size  # the recurrence has no chunks
    if return_final_states or initial_states is not None:
        raise ExportError(
            "mamba2_chunk_scan reads or returns a state (a cache): export with config.use_cache = False "
            "and without cache_params"
        )
    extra = sorted(k for k, v in kwargs.items() if v is not None)
    if extra:  # the torch fallback ignores these, the hub kernels do not: refuse rather than guess
        raise ExportError(f"mamba2_chunk_scan with {', '.join(extra)}: only the plain chunked scan exports")
    batch, steps, heads, head_dim = hidden_states.shape
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]).float()
    u = hidden_states.float().permute(0, 2, 3, 1).reshape(batch, heads * head_dim, steps)
    bm, cm = (v.float().permute(0, 2, 3, 1) for v in (B, C))  # [batch, G, N, L]
    d = None if D is None else D.float()
    y: torch.Tensor = torch.ops.bladepack.selective_scan(
        u, dt.permute(0, 2, 1), A.float()[:, None], bm, cm, d, None, None, False
    )
    return y.reshape(batch, heads, head_dim, steps).permute(0, 3, 1, 2)


@contextlib.contextmanager
def selective_scans(model: torch.nn.Module) -> Iterator[None]:
    """Note [Selective scans through export] and Note [Mamba-2 as a selective scan]."""
    del model  # the functions are module globals, not attributes of the model
    patched = [
        (m, name, getattr(m, name))
        for module_name, m in list(sys.modules.items())
        if module_name.startswith("transformers.models.")
        for name in (_NAME, _NAME2)
        if callable(getattr(m, name, None))
    ]
    for m, name, _ in patched:
        setattr(m, name, _scan if name == _NAME else _chunk_scan)
    try:
        yield
    finally:
        for m, name, fn in patched:
            setattr(m, name, fn)


@converts("bladepack.selective_scan.default")
def _selective_scan(ctx: Ctx, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    u, dt, a, b, c = (ctx.v(x) for x in args[:5])
    d, z, bias = (arg(args, kwargs, k, n) for k, n in ((5, "D"), (6, "z"), (7, "delta_bias")))
    softplus = bool(arg(args, kwargs, 8, "delta_softplus", False))
    ut, dtt, at, bt = ctx.t(u), ctx.t(dt), ctx.t(a), ctx.t(b)
    channels, heads = ut.shape[1] if ut.rank == 3 else None, dtt.shape[1] if dtt.rank == 3 else None

    def divides(k: object) -> bool:
        return k == channels or (isinstance(k, int) and isinstance(channels, int) and channels % k == 0)

    if (
        not ut.dtype.is_floating
        or ut.rank != 3
        or dtt.rank != 3
        or at.rank != 2
        or bt.rank not in (3, 4)
        or not isinstance(bt.shape[-2], int)
        or at.shape[1] not in (1, bt.shape[-2])
        or not sym_eq(at.shape[0], heads)
        or not divides(heads)
        or (bt.rank == 4 and not divides(bt.shape[1]))
    ):
        raise Unsupported(
            f"a selective scan of u {ut}, dt {dtt}, A {at} and B {bt} (u [batch, D, L], dt [batch, H, L] for H "
            "dividing D, A [H, N] or [H, 1], B [batch, N, L] or [batch, G, N, L] for G dividing D, N a constant)"
        )
    inputs = [u, dt, a, b, c] + [ctx.v(x) for x in (d, z, bias) if x is not None]
    attrs = SelectiveScanAttrs(softplus, d is not None, z is not None, bias is not None)
    return ctx.emit(OpKind.SELECTIVE_SCAN, inputs, TensorType(ut.dtype, ut.shape), attrs)
