"""Cross-request batching along a proven batch-like dim, shared by every serving engine.

In: an artifact's manifest (its signature and `batch_dims` proofs) and a loaded module. Out:
`BatchLayout` — the dim a server may batch along, or why it may not — and `run_requests`, which runs
one engine batch of requests.

Note [Serving batches]: a server may merge requests only along a dim the compiler proved batch-like
(Note [Batch-like dims] in ir/batch_dims.py) that every input and output holds as axis 0: Triton's
`max_batch_size` and Ray Serve's `@serve.batch` both put the batch first. Then the rows of a merged
call are the rows of the separate calls, so merging cannot change a result. Requests merge when every
other dim agrees (Triton's dynamic batcher does the same without ragged batching), or differs only
along a dim the compiler proved paddable with those rows (Note [Padding proofs] in ir/padding.py):
then each request is padded to the group's longest with the pad values the proof names and gets its
own rows back, trimmed to its own length along the axes the proof names (Note [Padded merging]). A
merged call that fails (one request out of range, say) is retried request by request, so each error
reaches only the request that caused it.

Note [Padded merging]: padding costs the padded positions' work, so a group of requests whose lengths
differ is cut, shortest first, where its padded size (rows x the longest length) would exceed the pad
budget times its real size (the sum of rows x own length): at 1.5 a request of 8 tokens and one of 500
run apart, requests of 40 and 48 together. What merging buys is the per-call cost it spreads and the
wider GEMMs it forms, so the budget is per device (`default_pad_budget`): on a GPU, where a call of one
short sequence leaves the device idle behind the host's launch work (130-290 µs a call measured on an
H100), 1.5; on a CPU, 1.0, i.e. no padding, because the CPU runtime's per-call cost is below a
microsecond and its kernels are as fast at a few rows: bench.serving's mixed-length workload on the
2-core machine (a BERT- and a LLaMA-style model of hidden 256, the C++ backend) measured padded
merging at 0.75x / 0.86x the throughput of no merging at a budget of 1.5, 0.77x / 0.94x at 1.25 and
0.94x / 0.99x at 1.1, with a worse p99 (bench/results/serving_mixed.md; an earlier run 0.70x / 0.87x
at 1.5). A server may set it (`--pad-budget`). Requests of a model without the proof merge only on
equal shapes, as before.

Note [Packed merging]: an artifact with a packed form (Note [Packed sequences] in
passes/pack_sequences.py) served on the CPU merges requests of any lengths along its ragged dim with
no padding at all: each row of each request becomes one sequence of a packed call (`run_packed`), cut
where the tokens would pass the packed plan's maximum, and each request gets its own rows back. Its
cost is the real tokens' work, so no budget applies: on the 2-core machine a group of 16 mixed-length
requests ran 0.99-1.07x as fast as running them one by one and 1.65-5.6x as fast as padding them to
the longest (bench/results/packed.md). A GPU instance keeps padded merging: whether packed calls pay
there is not measured yet (the packed form runs on a GPU when the artifact has a CUDA target, through
`run_packed`). The C++ backend does the same (cpp_runtime/triton/backend.cpp, bpk_model_run_packed) where the
ragged inputs and outputs hold the dim on axis 1 (outputs: or not at all).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.errors import BpkFormatError, InputError

DEFAULT_MAX_BATCH = 64  # the batch cap where the batch dim has no maximum (servers need a number)
PAD_BUDGET = 1.5  # Note [Padded merging]: the padded size a merged group may reach, over its real size


def default_pad_budget(device: str) -> float:
    """Note [Padded merging]: 1.5 on a GPU, 1.0 (no padding) on a CPU."""
    return PAD_BUDGET if device.startswith("cuda") else 1.0


@dataclass(frozen=True)
class PaddedDim:
    """A dim requests may differ in and still merge (Note [Padding proofs]): per input, its axis and
    pad value (None: the input does not hold it); per output, the axes to trim to a request's length."""

    dim: str
    inputs: tuple[tuple[int, float] | None, ...]
    outputs: tuple[tuple[int, ...], ...]
    max: int | None = None  # the dim's range maximum: a longer request runs alone (its call says why)

    @staticmethod
    def from_record(name: str, proof: dict[str, Any], m: dict[str, Any]) -> PaddedDim:
        """A proven `padding_dims` record; BpkFormatError for a malformed one (the C++ runtime's
        bpk_model_padded_dims says the same)."""

        def bad(what: str) -> BpkFormatError:
            return BpkFormatError(f"malformed manifest: padding_dims[{name!r}] {what}")

        def axis(a: Any, t: dict[str, Any]) -> int:
            ok = isinstance(a, int) and not isinstance(a, bool) and 0 <= a < len(t["shape"])
            return a if ok and t["shape"][a] == name else -1

        ins, outs = proof.get("inputs"), proof.get("outputs")
        if not isinstance(ins, dict) or not isinstance(outs, dict):
            raise bad("lacks its inputs or outputs")
        names_in = [t["name"] for t in m["inputs"]]
        names_out = [t["name"] for t in m["outputs"]]
        inputs: list[tuple[int, float] | None] = [None] * len(names_in)
        for n, rec in ins.items():
            at = names_in.index(n) if n in names_in else -1
            a = axis(rec.get("axis"), m["inputs"][at]) if at >= 0 and isinstance(rec, dict) else -1
            pad = rec.get("pad") if isinstance(rec, dict) else None
            if a < 0 or isinstance(pad, bool) or not isinstance(pad, (int, float)):
                raise bad(f"does not give the axis of {name!r} and a pad value for input {n!r}")
            inputs[at] = (a, float(pad))
        outputs: list[tuple[int, ...]] = [()] * len(names_out)
        for n, axes in outs.items():
            if n not in names_out or not isinstance(axes, list):
                raise bad(f"names output {n!r} wrongly")
            at = names_out.index(n)
            if any(axis(a, m["outputs"][at]) < 0 for a in axes):
                raise bad(f"gives an axis of output {n!r} that is not {name!r}")
            outputs[at] = tuple(axes)
        top = next((s.get("max") for s in m.get("symbols", []) if s.get("name") == name), None)
        return PaddedDim(name, tuple(inputs), tuple(outputs), top)

    def length(self, request: Sequence[np.ndarray]) -> int | None:
        """The request's length along the dim (None: its inputs disagree, lack the axis, or it is above
        the range, so the request runs alone and its own call says what is wrong)."""
        held = [(x, p[0]) for x, p in zip(request, self.inputs) if p is not None]
        if len(request) != len(self.inputs) or any(x.ndim <= axis for x, axis in held):
            return None
        sizes = {int(x.shape[axis]) for x, axis in held}
        if len(sizes) != 1:
            return None
        n = sizes.pop()
        return None if self.max is not None and n > self.max else n


@dataclass(frozen=True)
class PackedDim:
    """Note [Packed merging]: the ragged dim (its inputs' axes), each output's sequence axis (-1: one
    row per sequence, along axis 0), and the packed plan's most tokens (None: no limit)."""

    dim: PaddedDim
    outputs: tuple[int, ...]
    tokens: int | None


@dataclass(frozen=True)
class BatchLayout:
    dim: str | None  # the batch-like dim every input and output holds as axis 0; None: no batching
    min: int
    max: int | None  # the dim's range maximum (None: unbounded)
    reason: str  # why there is no batching ("" when dim is set)
    padded: tuple[PaddedDim, ...] = ()  # dims requests may differ in (Note [Padded merging])
    pad_budget: float = PAD_BUDGET  # a merged group's padded size over its real size, at most
    packed: PackedDim | None = None  # Note [Packed merging]: the dim requests merge along, packed

    @property
    def ragged(self) -> tuple[PaddedDim, ...]:
        """The dims merged requests may differ in: padded, or the packed one."""
        return self.padded if self.packed is None else (self.packed.dim,)

    @staticmethod
    def from_manifest(
        m: dict[str, Any], padding: bool = True, pad_budget: float = PAD_BUDGET, packed: bool = False
    ) -> BatchLayout:
        """The batching an artifact allows; `padding` False or a `pad_budget` of 1 merges equal shapes
        only (Note [Padded merging]); `packed` (a CPU instance) merges any lengths through the
        artifact's packed form where it has one (Note [Packed merging])."""
        if not pad_budget >= 1.0:
            raise ValueError(f"the pad budget is a padded size over a real size, at least 1.0; got {pad_budget}")
        layout = BatchLayout._batch(m)
        rec = m.get("packed")
        if layout.dim is not None and padding and packed and rec is not None and rec.get("rows") == layout.dim:
            proof = (m.get("padding_dims") or {}).get(rec["symbol"])
            if isinstance(proof, dict) and proof.get("padding") is True:
                dim = PaddedDim.from_record(rec["symbol"], proof, m)
                names = [t["name"] for t in m["outputs"]]
                tokens = next((s.get("max") for s in rec["plan"]["symbols"] if s.get("name") == rec["tokens"]), None)
                axes = tuple(int(rec["outputs"][n][1]) for n in names)
                return BatchLayout(layout.dim, layout.min, layout.max, "", (), 1.0, PackedDim(dim, axes, tokens))
        if layout.dim is None or not padding or pad_budget == 1.0:
            return layout
        padded = []
        for name, proof in sorted((m.get("padding_dims") or {}).items()):
            if isinstance(proof, dict) and proof.get("padding") is True:
                dim = PaddedDim.from_record(name, proof, m)
                # padded along the rows a server merges (axis 0), which the padding itself never is
                if proof.get("rows") == layout.dim and all(p is None or p[0] != 0 for p in dim.inputs):
                    padded.append(dim)
        return BatchLayout(layout.dim, layout.min, layout.max, "", tuple(padded), pad_budget)

    @staticmethod
    def _batch(m: dict[str, Any]) -> BatchLayout:
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


Call = Callable[[list[np.ndarray]], list[np.ndarray]]
PackedCall = Callable[[list[np.ndarray], list[int]], list[np.ndarray]]


def run_requests(
    layout: BatchLayout, call: Call, requests: Sequence[list[np.ndarray]], packed_call: PackedCall | None = None
) -> list[list[np.ndarray] | Exception]:
    """Per request, its outputs or the exception its own call raised (Note [Serving batches]);
    `packed_call` (`LoadedModule.run_packed`) runs the groups of a packed layout (Note [Packed merging])."""
    if layout.packed is not None and packed_call is not None:
        return _run_packed(layout.packed, call, packed_call, requests)
    results: list[list[np.ndarray] | Exception | None] = [None] * len(requests)
    groups: dict[tuple[Any, ...], list[int]] = {}
    lengths: list[tuple[int, ...]] = []
    for k, req in enumerate(requests):
        own = tuple(d.length(req) for d in layout.padded)
        key = _merge_key(req, layout.padded, own) if layout.dim is not None else None
        lengths.append(tuple(n or 0 for n in own))
        if key is None:
            results[k] = _alone(call, req)
        else:
            groups.setdefault(key, []).append(k)
    for members in groups.values():
        for part in _within_budget(members, [rows(requests[k]) for k in members], lengths, layout):
            _run_group(layout, call, requests, part, lengths, results)
    return [r if r is not None else InputError("request was not run") for r in results]


def _within_budget(
    members: list[int], counts: list[int], lengths: list[tuple[int, ...]], layout: BatchLayout
) -> list[list[int]]:
    """The members cut into groups, shortest first, each within the pad budget and the batch maximum
    (Note [Padded merging])."""
    top = layout.max
    order = sorted(range(len(members)), key=lambda j: lengths[members[j]])
    parts: list[list[int]] = []
    part: list[int] = []
    real = padded_rows = 0
    longest: tuple[int, ...] = ()
    for j in order:
        k, n = members[j], counts[j]
        size = _size(lengths[k])
        grown = tuple(max(a, b) for a, b in zip(longest, lengths[k])) if part else lengths[k]
        over = top is not None and padded_rows + n > top
        if part and (over or (padded_rows + n) * _size(grown) > layout.pad_budget * (real + n * size)):
            parts.append(part)
            part, real, padded_rows, grown = [], 0, 0, lengths[k]
        part.append(k)
        real += n * size
        padded_rows += n
        longest = grown
    if part:
        parts.append(part)
    return parts


def _size(lengths: tuple[int, ...]) -> int:
    out = 1
    for n in lengths:
        out *= max(n, 1)
    return out


def _run_group(
    layout: BatchLayout,
    call: Callable[[list[np.ndarray]], list[np.ndarray]],
    requests: Sequence[list[np.ndarray]],
    members: list[int],
    lengths: list[tuple[int, ...]],
    results: list[list[np.ndarray] | Exception | None],
) -> None:
    if len(members) == 1:
        results[members[0]] = _alone(call, requests[members[0]])
        return
    counts = [rows(requests[k]) for k in members]
    longest = tuple(max(lengths[k][d] for k in members) for d in range(len(layout.padded)))
    merged = [
        np.concatenate([_padded(requests[k][i], i, layout.padded, longest) for k in members])
        for i in range(len(requests[members[0]]))
    ]
    try:
        outs = call(merged)
    except Exception:
        outs = None
    if outs is None or any(o.ndim == 0 or o.shape[0] != sum(counts) for o in outs):
        for k in members:  # a failed call, or outputs without the rows first (a config set by hand)
            results[k] = _alone(call, requests[k])
        return
    lo = 0
    for k, n in zip(members, counts):
        results[k] = [_trimmed(o[lo : lo + n], j, layout.padded, lengths[k]) for j, o in enumerate(outs)]
        lo += n


def _run_packed(
    d: PackedDim, call: Call, packed_call: PackedCall, requests: Sequence[list[np.ndarray]]
) -> list[list[np.ndarray] | Exception]:
    """Note [Packed merging]: groups of requests agreeing on every other dim, each row a sequence."""
    results: list[list[np.ndarray] | Exception | None] = [None] * len(requests)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for k, req in enumerate(requests):
        n = d.dim.length(req)
        key = _merge_key(req, (d.dim,), (n,))
        if key is None:
            results[k] = _alone(call, req)
        else:
            groups.setdefault(key, []).append(k)
    for members in groups.values():
        part: list[int] = []
        tokens = 0
        for k in members:  # cut where the tokens would pass the packed plan's maximum
            size = rows(requests[k]) * (d.dim.length(requests[k]) or 0)
            if part and d.tokens is not None and tokens + size > d.tokens:
                _run_packed_group(d, call, packed_call, requests, part, results)
                part, tokens = [], 0
            part.append(k)
            tokens += size
        _run_packed_group(d, call, packed_call, requests, part, results)
    return [r if r is not None else InputError("request was not run") for r in results]


def _run_packed_group(
    d: PackedDim,
    call: Call,
    packed_call: PackedCall,
    requests: Sequence[list[np.ndarray]],
    members: list[int],
    results: list[list[np.ndarray] | Exception | None],
) -> None:
    if len(members) == 1:
        results[members[0]] = _alone(call, requests[members[0]])
        return
    counts = [rows(requests[k]) for k in members]
    lengths = [d.dim.length(requests[k]) or 0 for k, n in zip(members, counts) for _ in range(n)]
    inputs = []
    for i, x in enumerate(requests[members[0]]):
        p = d.dim.inputs[i]
        if p is None:
            inputs.append(x)  # an input without the ragged dim holds no rows either (Note [Packed sequences])
        else:
            inputs.append(
                np.concatenate([requests[k][i][r : r + 1] for k, n in zip(members, counts) for r in range(n)], p[0])
            )
    try:
        outs = packed_call(inputs, lengths)
    except Exception:
        outs = None
    if outs is None or len(outs) != len(d.outputs):
        for k in members:
            results[k] = _alone(call, requests[k])
        return
    cuts = np.cumsum(lengths)[:-1]  # an output with one row per sequence (axis -1) is cut row by row
    pieces = [np.split(o, cuts, axis=a) if a >= 0 else np.split(o, len(lengths)) for o, a in zip(outs, d.outputs)]
    at = 0
    for k, n in zip(members, counts):
        results[k] = [np.concatenate(p[at : at + n], 0) for p in pieces]
        at += n


def _padded(x: np.ndarray, i: int, padded: Sequence[PaddedDim], longest: tuple[int, ...]) -> np.ndarray:
    """Input `i` of a request padded at the end of each padded dim's axis to the group's longest."""
    for d, n in zip(padded, longest):
        p = d.inputs[i]
        if p is not None and x.shape[p[0]] < n:
            widths = [(0, 0)] * x.ndim
            widths[p[0]] = (0, n - x.shape[p[0]])
            x = np.pad(x, widths, constant_values=np.asarray(p[1]).astype(x.dtype))
    return x


def _trimmed(o: np.ndarray, j: int, padded: Sequence[PaddedDim], own: tuple[int, ...]) -> np.ndarray:
    """Output `j`'s rows of one request, cut to the request's own length along each padded axis."""
    key: list[slice] = [slice(None)] * o.ndim
    for d, n in zip(padded, own):
        for axis in d.outputs[j]:
            key[axis] = slice(0, n)
    return np.ascontiguousarray(o[tuple(key)]) if any(k != slice(None) for k in key) else o


def _merge_key(
    req: Sequence[np.ndarray], padded: Sequence[PaddedDim], own: tuple[int | None, ...]
) -> tuple[Any, ...] | None:
    """What must agree for requests to merge: every dim but the first and the padded ones (`own`: the
    request's length along each of `padded`, None where it has none), and the dtypes (None: never)."""
    try:
        rows(req)
    except InputError:
        return None
    if any(x.ndim == 0 for x in req):
        return None
    if any(n is None for n in own):
        return None
    free = [{p[0] for d in padded if (p := d.inputs[i]) is not None} for i in range(len(req))]
    return tuple(
        (x.dtype.str, x.ndim, tuple(-1 if a in free[i] else n for a, n in enumerate(x.shape) if a > 0))
        for i, x in enumerate(req)
    )


def _alone(call: Callable[[list[np.ndarray]], list[np.ndarray]], req: list[np.ndarray]) -> list[np.ndarray] | Exception:
    try:
        return call(req)
    except Exception as e:
        return e
