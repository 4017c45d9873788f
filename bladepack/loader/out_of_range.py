"""Out-of-range policy per dim: a batch above its maximum run as several calls (Note [Batch-like dims]).

In: the manifest's `batch_dims` records and the caller's `on_out_of_range` ({dim: "error" | "split"}).
Out: `SplitPolicy`, which, for a call whose split dim is above its range, cuts the inputs along the
dim's axis into near-equal pieces inside the range, runs each through the module's executor and
concatenates the outputs along theirs (an output without the dim comes from the first piece: the
proof says it does not depend on the rows). Anything else — a dim in range, inputs whose sizes
disagree, a dim below its minimum — goes to the executor unchanged, which raises its usual errors.
Works on numpy arrays and torch tensors (CPU or CUDA) without importing torch.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.errors import BpkFormatError, InputError

POLICIES = ("error", "split")


@dataclass(frozen=True)
class _Split:
    dim: str
    min: int
    max: int
    inputs: tuple[int, ...]  # per input, the dim's axis (-1: none)
    outputs: tuple[int, ...]


class SplitPolicy:
    def __init__(self, manifest: dict[str, Any], requested: dict[str, str], source: str) -> None:
        if not isinstance(requested, dict):
            raise ValueError(f"on_out_of_range must map dim names to one of {POLICIES}, got {requested!r}")
        symbols = {s["name"]: s for s in manifest.get("symbols", [])}
        proofs = manifest.get("batch_dims")
        self.outputs = [t["name"] for t in manifest["outputs"]]
        self.splits: list[_Split] = []
        for dim, policy in requested.items():
            if policy not in POLICIES:
                raise ValueError(f"on_out_of_range[{dim!r}] is {policy!r}; the policies are {', '.join(POLICIES)}")
            if dim not in symbols:
                known = ", ".join(sorted(symbols)) or "none"
                raise ValueError(f"on_out_of_range names dim {dim!r}; the artifact's dynamic dims are: {known}")
            if policy == "error":
                continue
            if proofs is None:
                raise ValueError(
                    f"{source} was built before bladepack proved batch-like dims; optimize it again to split {dim!r}"
                )
            proof = proofs.get(dim, {"split": False, "reason": "no input binds it"})
            if not proof.get("split"):
                raise ValueError(
                    f"on_out_of_range: dim {dim!r} cannot be split, because it is not proven batch-like: "
                    f"{proof.get('reason', 'no reason recorded')}"
                )
            ins = _axes(proof.get("inputs"), manifest["inputs"], dim)
            outs = _axes(proof.get("outputs"), manifest["outputs"], dim)
            if ins is None or outs is None or all(ax < 0 for ax in ins):
                raise BpkFormatError(
                    f"{source}: malformed manifest: batch_dims[{dim!r}] does not give the axis of {dim!r} "
                    "in each input and output"
                )
            if symbols[dim].get("max") is None:
                continue  # no maximum: nothing is ever above it
            self.splits.append(_Split(dim, int(symbols[dim]["min"]), int(symbols[dim]["max"]), ins, outs))

    def shapes(
        self, shapes: Sequence[Sequence[int]], plan: tuple[_Split, list[tuple[int, int]]], piece: Callable[..., Any]
    ) -> list[tuple[int, ...]]:
        """The whole results' shapes: the first piece's (from `piece`, given its input shapes), with the
        dim's full size."""
        sp, bounds = plan
        lo, hi = bounds[0]
        first = [tuple(d if a != ax else hi - lo for a, d in enumerate(s)) for s, ax in zip(shapes, sp.inputs)]
        n = bounds[-1][1]
        return [tuple(d if a != ax else n for a, d in enumerate(s)) for s, ax in zip(piece(*first), sp.outputs)]

    def __bool__(self) -> bool:
        return bool(self.splits)

    def pieces(self, inputs: Sequence[Any]) -> tuple[_Split, list[tuple[int, int]]] | None:
        """The split dim above its maximum and the [lo, hi) pieces of it, or None for a plain call."""
        over = []
        for sp in self.splits:
            if len(inputs) != len(sp.inputs):
                return None
            sizes = {
                int(x.shape[ax])
                for x, ax in zip(inputs, sp.inputs)
                if ax >= 0 and hasattr(x, "shape") and len(x.shape) > ax
            }
            if len(sizes) != 1:
                return None  # inconsistent or unreadable: the executor says what is wrong
            n = sizes.pop()
            if n > sp.max:
                over.append((sp, n))
        if not over:
            return None
        if len(over) > 1:
            names = ", ".join(f"{sp.dim}={n}" for sp, n in over)
            raise InputError(f"more than one dim is above its range ({names}); the split policy splits one at a time")
        sp, n = over[0]
        count = -(-n // sp.max)
        base, extra = divmod(n, count)
        if base < sp.min:
            raise InputError(
                f"dim {sp.dim!r} is {n}: it cannot be split into pieces inside its range [{sp.min}, {sp.max}]"
            )
        bounds, lo = [], 0
        for k in range(count):
            hi = lo + base + (1 if k < extra else 0)
            bounds.append((lo, hi))
            lo = hi
        return sp, bounds

    def run(
        self,
        inputs: Sequence[Any],
        outputs: Sequence[Any] | None,
        plan: tuple[_Split, list[tuple[int, int]]],
        call: Callable[[Sequence[Any]], list[Any]],
    ) -> list[Any]:
        sp, bounds = plan
        parts: list[list[Any]] = []
        for lo, hi in bounds:
            piece = [x if ax < 0 else x[(slice(None),) * ax + (slice(lo, hi),)] for x, ax in zip(inputs, sp.inputs)]
            parts.append(call(piece))
        results = [_concat([p[k] for p in parts], ax) if ax >= 0 else parts[0][k] for k, ax in enumerate(sp.outputs)]
        if outputs is None:
            return results
        if len(outputs) != len(results):
            raise InputError(f"expected {len(results)} output buffers, got {len(outputs)}")
        for spec, buf, r in zip(self.outputs, outputs, results):
            if tuple(buf.shape) != tuple(r.shape) or str(buf.dtype).removeprefix("torch.") != str(r.dtype).removeprefix(
                "torch."
            ):
                raise InputError(
                    f"output buffer '{spec}' is {str(buf.dtype).removeprefix('torch.')}{list(buf.shape)}; "
                    f"the result is {str(r.dtype).removeprefix('torch.')}{list(r.shape)}"
                )
            if isinstance(buf, np.ndarray):
                np.copyto(buf, np.asarray(r))
            else:
                buf.copy_(r)
        return list(outputs)


def _axes(record: Any, tensors: list[dict[str, Any]], dim: str) -> tuple[int, ...] | None:
    """A proof record's axes (`inputs` / `outputs`): one per tensor, -1 or an axis whose dim is `dim`;
    None when the record says anything else."""
    if not isinstance(record, list) or len(record) != len(tensors):
        return None
    for ax, t in zip(record, tensors):
        if not isinstance(ax, int) or isinstance(ax, bool) or not -1 <= ax < len(t["shape"]):
            return None
        if ax >= 0 and t["shape"][ax] != dim:
            return None
    return tuple(record)


def _concat(parts: list[Any], axis: int) -> Any:
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts, axis=axis)
    torch = sys.modules.get("torch")  # the caller passed tensors: torch is imported already
    if torch is not None and all(isinstance(p, torch.Tensor) for p in parts):
        return torch.cat(parts, dim=axis)
    raise InputError(f"cannot concatenate split results of types {sorted({type(p).__name__ for p in parts})}")
