"""Cross-request batching along a proven batch-like dim, shared by every serving engine.

In: an artifact's manifest (its signature and `batch_dims` proofs) and a loaded module. Out:
`BatchLayout` — the dim a server may batch along, or why it may not — and `run_requests`, which runs
one engine batch of requests.

Note [Serving batches]: a server may merge requests only along a dim the compiler proved batch-like
(Note [Batch-like dims] in ir/batch_dims.py) that every input and output holds as axis 0: Triton's
`max_batch_size` and Ray Serve's `@serve.batch` both put the batch first. Then the rows of a merged
call are the rows of the separate calls, so merging cannot change a result. Requests merge only when
every other dim agrees (Triton's dynamic batcher does the same without ragged batching, which a
generated config never asks for); a request whose sequence length differs runs in its own call. No
artifact records a padding-mask input today, so nothing is padded to a longer request's length: a
padded row would change what a model without such a mask computes. A merged call that fails (one
request out of range, say) is retried request by request, so each error reaches only the request that
caused it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.errors import InputError

DEFAULT_MAX_BATCH = 64  # the batch cap where the batch dim has no maximum (servers need a number)


@dataclass(frozen=True)
class BatchLayout:
    dim: str | None  # the batch-like dim every input and output holds as axis 0; None: no batching
    min: int
    max: int | None  # the dim's range maximum (None: unbounded)
    reason: str  # why there is no batching ("" when dim is set)

    @staticmethod
    def from_manifest(m: dict[str, Any]) -> BatchLayout:
        symbols = {s["name"]: s for s in m.get("symbols", [])}
        proofs = m.get("batch_dims")
        if proofs is None:
            return BatchLayout(None, 1, None, "the artifact predates batch-like dim proofs (format 1.3)")
        reasons = []
        for name, proof in proofs.items():
            if not proof.get("split"):
                reasons.append(f"{name}: {proof.get('reason', 'not proven batch-like')}")
                continue
            ins, outs = proof.get("inputs", []), proof.get("outputs", [])
            if ins and all(ax == 0 for ax in ins) and outs and all(ax == 0 for ax in outs):
                sym = symbols.get(name, {})
                return BatchLayout(name, int(sym.get("min", 1)), sym.get("max"), "")
            reasons.append(f"{name}: proven batch-like, but not axis 0 of every input and output")
        if not proofs:
            reasons.append("the artifact has no dynamic dims")
        return BatchLayout(None, 1, None, "; ".join(reasons))

    def limit(self, requested: int | None = None) -> int:
        """The largest batch a server may form: the dim's maximum (DEFAULT_MAX_BATCH when it has none),
        capped by `requested`; 0 when there is no batch dim."""
        if requested is not None and requested < 1:
            raise ValueError(f"max batch size must be at least 1, got {requested}")
        if self.dim is None:
            return 0
        top = self.max if self.max is not None else DEFAULT_MAX_BATCH
        return top if requested is None else min(top, requested)


def rows(request: Sequence[np.ndarray]) -> int:
    """A request's size along axis 0 (its batch), checked to agree across its inputs."""
    sizes = {int(x.shape[0]) for x in request if x.ndim > 0}
    if len(sizes) != 1:
        raise InputError(f"the inputs' first dims differ ({sorted(sizes)}); a batched model needs them equal")
    return sizes.pop()


def run_requests(
    layout: BatchLayout, call: Callable[[list[np.ndarray]], list[np.ndarray]], requests: Sequence[list[np.ndarray]]
) -> list[list[np.ndarray] | Exception]:
    """Per request, its outputs or the exception its own call raised (Note [Serving batches])."""
    results: list[list[np.ndarray] | Exception | None] = [None] * len(requests)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, req in enumerate(requests):
        key = _merge_key(req) if layout.dim is not None else None
        if key is None:
            results[k] = _alone(call, req)
        else:
            groups.setdefault(key, []).append(k)
    for members in groups.values():
        if len(members) == 1:
            results[members[0]] = _alone(call, requests[members[0]])
            continue
        counts = [rows(requests[k]) for k in members]
        if layout.max is not None and sum(counts) > layout.max:
            for k in members:
                results[k] = _alone(call, requests[k])
            continue
        merged = [np.concatenate([requests[k][i] for k in members]) for i in range(len(requests[members[0]]))]
        try:
            outs = call(merged)
        except Exception:
            outs = None
        if outs is None or any(o.ndim == 0 or o.shape[0] != sum(counts) for o in outs):
            for k in members:  # a failed call, or outputs without the rows first (a config set by hand)
                results[k] = _alone(call, requests[k])
            continue
        lo = 0
        for k, n in zip(members, counts):
            results[k] = [o[lo : lo + n] for o in outs]
            lo += n
    return [r if r is not None else InputError("request was not run") for r in results]


def _merge_key(req: Sequence[np.ndarray]) -> tuple[Any, ...] | None:
    """What must agree for requests to merge: every dim but the first, and the dtypes (None: never)."""
    try:
        rows(req)
    except InputError:
        return None
    if any(x.ndim == 0 for x in req):
        return None
    return tuple((x.dtype.str, x.shape[1:]) for x in req)


def _alone(call: Callable[[list[np.ndarray]], list[np.ndarray]], req: list[np.ndarray]) -> list[np.ndarray] | Exception:
    try:
        return call(req)
    except Exception as e:
        return e
