"""Orders a reference case must not leave to rounding (Note [Conditioned cases] in
bladepack/reference_record.py), for both front ends' oracles.

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

import numpy as np

# Another executor's rounding of an op's input may differ from eager's by a few times eager's own
# difference from float64 (a different summation order, exp polynomial or fused multiply-add).
MARGIN = 4.0


@dataclass(frozen=True)
class OrderCall:
    """One order decision: `x` its values as float64 (None where they were not kept: a decision whose
    use is not known yet), `shape` theirs, `dim` the axis (None: the flattened tensor), `lead` how many
    leading positions of the sorted line the op fixes (None: all of them), `descending` the order."""

    op: str
    x: np.ndarray | None
    shape: tuple[int, ...]
    dim: int | None
    lead: int | None
    descending: bool


@dataclass
class OrderLog:
    """The order decisions of one call, and which of them the model used the indices of."""

    calls: list[OrderCall] = field(default_factory=list)
    used: set[int] = field(default_factory=set)
    indices: list[object] = field(default_factory=list)  # what stands for each decision's indices

    def decided(self, call: OrderCall, indices: object) -> None:
        self.calls.append(call)
        self.indices.append(indices)

    def read(self, values: Iterable[object]) -> None:
        """`values` (an op's arguments, or the model's outputs) may hold indices of a decision."""
        self.used.update(k for v in values for k, t in enumerate(self.indices) if v is t)


def ill_conditioned(f32: OrderLog, f64: OrderLog) -> str | None:
    """Why the used order decisions of the call `f32` depend on rounding, given the same ops' values
    in its float64 twin `f64`; None when none does, or when the twin's calls do not match."""
    if len(f32.calls) != len(f64.calls) or any(
        (a.op, a.dim, a.lead, a.descending, a.shape) != (b.op, b.dim, b.lead, b.descending, b.shape)
        for a, b in zip(f32.calls, f64.calls)
    ):
        return None  # the twin took another path: nothing to compare
    for k in sorted(f32.used):
        why = _close_pair(f32.calls[k], f64.calls[k])
        if why is not None:
            return why
    return None


def _lines(x: np.ndarray, dim: int | None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if dim is None or x.ndim == 0:
        return x.reshape(1, -1)
    return np.moveaxis(x, dim, -1).reshape(-1, x.shape[dim])


def _close_pair(a: OrderCall, b: OrderCall) -> str | None:
    if a.x is None or b.x is None:
        return None  # values not kept: nothing to judge by
    lo, hi = _lines(a.x, a.dim), _lines(b.x, b.dim)
    n = hi.shape[-1]
    if n < 2 or hi.size == 0:
        return None
    finite = np.isfinite(lo) & np.isfinite(hi)
    with np.errstate(invalid="ignore"):
        moved = np.where(finite, np.abs(lo - hi), 0.0).max(axis=-1, keepdims=True)  # per line
    if not (moved > 0).any():
        return None  # the values are exact in float32: only ties the model makes, broken stably
    # the twin's order (NaN ranks largest, as torch sorts; a stable sort), its decided adjacent pairs
    key = np.where(np.isnan(hi), np.inf, hi)
    order = np.argsort(-key if a.descending else key, axis=-1, kind="stable")
    pairs = n - 1 if a.lead is None else min(a.lead, n - 1)
    first, second = order[:, :pairs], order[:, 1 : pairs + 1]
    h1, h2 = np.take_along_axis(hi, first, -1), np.take_along_axis(hi, second, -1)
    l1, l2 = np.take_along_axis(lo, first, -1), np.take_along_axis(lo, second, -1)
    with np.errstate(invalid="ignore"):
        gap = np.abs(h1 - h2)
    both_finite = np.isfinite(h1) & np.isfinite(h2)
    tie = (h1 == h2) & (l1 == l2)
    close = both_finite & ~tie & (gap <= MARGIN * moved)
    if not close.any():
        return None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(close, gap / moved, np.inf)
    row, col = np.unravel_index(int(np.argmin(ratio)), ratio.shape)
    width, by = float(gap[row, col]), float(moved[row, 0])
    return f"{a.op} over values {width:.2g} apart, which float32 rounding moves by up to {by:.2g} in their line"
