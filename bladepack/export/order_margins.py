"""Orders a reference case must not leave to rounding (Note [Conditioned cases] in
bladepack/reference_record.py), for the torch oracle.

In: the values each order op of a model saw in one eager call (`OrderCall`: sort, argsort, top-k,
argmax / argmin, max / min along a dim) and the same ops' values in a float64 twin of the call.
Out: None when every order the ops decided is wider than rounding moves its values, else the reason
(`ill_conditioned`).

Only orders whose indices the model uses count (a later op reads them, or they are an output): a
softmax's `x.max(-1).values` or a sort's values are the same whichever of two tied elements comes
first. An order op decides between adjacent values of its sorted line: all of them for sort and argsort,
the first k and the boundary after them for top-k, the first two for argmax / argmin / max / min.
A pair is decided by rounding when its values lie within MARGIN times the largest difference, along
their line, between the float32 (or float16) call's and the float64 twin's values of that op, unless the two values are
equal in both calls (a tie the model itself makes: zeros after a ReLU, repeated inputs; every
executor breaks it by the stable order).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

# Another executor's rounding of an op's input may differ from eager's by a few times eager's own
# difference from float64 (a different summation order, exp polynomial or fused multiply-add).
MARGIN = 4.0


@dataclass(frozen=True)
class OrderCall:
    """One order decision: `x` its values, `dim` the axis (None: the flattened tensor), `lead` how many
    leading positions of the sorted line the op fixes (None: all of them), `descending` the order."""

    op: str
    x: torch.Tensor
    dim: int | None
    lead: int | None
    descending: bool


def order_call(name: str, args: tuple, kwargs: dict) -> OrderCall | None:  # type: ignore[type-arg]
    """The decision of a torch call `name` (sort, argsort, topk, argmax, argmin, max, min) with these
    arguments, or None where it decides no order (max of a whole tensor, max of two tensors)."""
    x = args[0] if args else kwargs.get("input")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return None  # integer values round nowhere
    rest = args[1:]

    def arg(i: int, key: str, default: object) -> object:
        return rest[i] if len(rest) > i else kwargs.get(key, default)

    if name in ("sort", "argsort"):
        dim = arg(0, "dim", -1)
        return OrderCall(name, x.detach().clone(), int(dim), None, bool(arg(1, "descending", False)))  # type: ignore[call-overload]
    if name == "topk":
        k, dim = arg(0, "k", 1), arg(1, "dim", -1)
        return OrderCall(name, x.detach().clone(), int(dim), int(k), bool(arg(2, "largest", True)))  # type: ignore[call-overload]
    if name in ("argmax", "argmin"):
        dim = arg(0, "dim", None)
        return OrderCall(name, x.detach().clone(), None if dim is None else int(dim), 1, name == "argmax")  # type: ignore[call-overload]
    if name in ("max", "min"):
        dim = arg(0, "dim", None)
        if isinstance(dim, bool) or not isinstance(dim, int):
            return None  # the whole tensor's extreme (a value only), or the elementwise form
        return OrderCall(name, x.detach().clone(), dim, 1, name == "max")
    return None


@dataclass
class OrderLog:
    """The order decisions of one call, and which of them the model used the indices of."""

    calls: list[OrderCall] = field(default_factory=list)
    used: set[int] = field(default_factory=set)
    indices: list[torch.Tensor] = field(default_factory=list)

    def decided(self, call: OrderCall, indices: torch.Tensor) -> None:
        self.calls.append(call)
        self.indices.append(indices)

    def read(self, values: Iterable[object]) -> None:
        """`values` (an op's arguments, or the model's outputs) may hold indices of a decision."""
        self.used.update(k for v in values for k, t in enumerate(self.indices) if v is t)


def ill_conditioned(f32: OrderLog, f64: OrderLog) -> str | None:
    """Why the used order decisions of the call `f32` depend on rounding, given the same ops' values
    in its float64 twin `f64`; None when none does, or when the twin's calls do not match."""
    if len(f32.calls) != len(f64.calls) or any(
        (a.op, a.dim, a.lead, a.descending, a.x.shape) != (b.op, b.dim, b.lead, b.descending, b.x.shape)
        for a, b in zip(f32.calls, f64.calls)
    ):
        return None  # the twin took another path: nothing to compare
    for k in sorted(f32.used):
        why = _close_pair(f32.calls[k], f64.calls[k])
        if why is not None:
            return why
    return None


def _lines(c: OrderCall) -> torch.Tensor:
    x = c.x.double()
    if c.dim is None:
        return x.reshape(1, -1)
    return x.movedim(c.dim, -1).reshape(-1, x.shape[c.dim]) if x.dim() else x.reshape(1, 1)


def _close_pair(a: OrderCall, b: OrderCall) -> str | None:
    lo, hi = _lines(a), _lines(b)
    n = hi.shape[-1]
    if n < 2 or hi.numel() == 0:
        return None
    finite = torch.isfinite(lo) & torch.isfinite(hi)
    moved = torch.where(finite, (lo - hi).abs(), 0.0).amax(dim=-1, keepdim=True)  # per line
    if not bool((moved > 0).any()):
        return None  # the values are exact in float32: only ties the model makes, broken stably
    # the twin's order (NaN ranks largest, as torch sorts), its adjacent pairs among the decided ones
    order = torch.sort(hi, dim=-1, descending=a.descending, stable=True).indices
    pairs = n - 1 if a.lead is None else min(a.lead, n - 1)
    first, second = order[:, :pairs], order[:, 1 : pairs + 1]
    h1, h2 = hi.gather(-1, first), hi.gather(-1, second)
    l1, l2 = lo.gather(-1, first), lo.gather(-1, second)
    gap = (h1 - h2).abs()
    both_finite = torch.isfinite(h1) & torch.isfinite(h2)
    tie = (h1 == h2) & (l1 == l2)
    close = both_finite & ~tie & (gap <= MARGIN * moved)
    if not bool(close.any()):
        return None
    ratio = torch.where(close, gap / moved, torch.inf)
    at = int(ratio.argmin())
    width, by = float(gap.flatten()[at]), float(moved[at // gap.shape[1], 0])
    return f"{a.op} over values {width:.2g} apart, which float32 rounding moves by up to {by:.2g} in their line"
