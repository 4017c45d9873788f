"""Capture a model with torch.export, inferring dynamic dims from several samples.

In: an nn.Module, one or more sample argument tuples, optional `dynamic_shapes` (torch.export's
structure; `torch.export.Dim` or `bladepack.Dim` leaves). Out: an inference-IR `ExportedProgram`
whose placeholders carry symbolic dims, plus the name and range each torch symbol gets in bladepack.

Note [Two exports]: torch.export specializes dims it sees at size 0 or 1 and starts automatic ranges
at 2. So a first export with `Dim.AUTO` (on a sample whose dynamic dims are all >= 2) discovers which
dims are one symbol and what bounds the model itself imposes; a second export declares one named
`Dim` per symbol with `min=1` (or the user's min), so batch 1 works unless the model forbids it —
then the dims torch names in its complaint fall back to min 2.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import Dim as TorchDim

from bladepack.dims import Dim
from bladepack.errors import ExportError

AxisSpec = dict[int, Any]  # axis -> bladepack.Dim | torch Dim | "auto"


@dataclass(frozen=True)
class SymbolInfo:
    name: str
    min: int
    max: int | None


@dataclass
class Captured:
    program: torch.export.ExportedProgram
    input_names: list[str]
    symbols: dict[str, SymbolInfo]  # torch symbol name -> bladepack symbol
    notes: list[str]


def _as_tuple(sample: Any) -> tuple[Any, ...]:
    return tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)


def normalize_samples(sample_inputs: Any) -> list[tuple[Any, ...]]:
    if isinstance(sample_inputs, list) and sample_inputs and all(isinstance(s, (tuple, list)) for s in sample_inputs):
        samples = [_as_tuple(s) for s in sample_inputs]
    else:
        samples = [_as_tuple(sample_inputs)]
    n = len(samples[0])
    for i, s in enumerate(samples):
        if len(s) != n:
            raise ValueError(f"sample {i} has {len(s)} arguments, sample 0 has {n}")
        for j, (a, b) in enumerate(zip(s, samples[0])):
            if not isinstance(a, torch.Tensor):
                raise TypeError(f"sample {i} argument {j} is a {type(a).__name__}; bladepack takes tensor arguments")
            if a.dim() != b.dim() or a.dtype != b.dtype:
                raise ValueError(
                    f"sample {i} argument {j} is {a.dtype} of rank {a.dim()}, sample 0 has {b.dtype} of rank {b.dim()}"
                )
    return samples


def input_names(model: torch.nn.Module, n: int) -> list[str]:
    try:
        params = [p for p in inspect.signature(model.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:n]]
    return names + [f"input{i}" for i in range(len(names), n)]


def _user_specs(dynamic_shapes: Any, names: list[str], ranks: list[int]) -> list[AxisSpec]:
    specs: list[AxisSpec] = [{} for _ in names]
    if dynamic_shapes is None:
        return specs
    if isinstance(dynamic_shapes, dict):
        unknown = set(dynamic_shapes) - set(names)
        if unknown:
            raise ValueError(f"dynamic_shapes names unknown inputs {sorted(unknown)}; inputs are {names}")
        per_input = [dynamic_shapes.get(n) for n in names]
    else:
        per_input = list(dynamic_shapes)
        if len(per_input) != len(names):
            raise ValueError(f"dynamic_shapes has {len(per_input)} entries for {len(names)} inputs")
    for i, entry in enumerate(per_input):
        if entry is None:
            continue
        items = entry.items() if isinstance(entry, dict) else enumerate(entry)
        for axis, d in items:
            if d is None:
                continue
            if not -ranks[i] <= axis < ranks[i]:
                raise ValueError(f"dynamic_shapes: input {names[i]!r} has rank {ranks[i]}, no axis {axis}")
            specs[i][axis % ranks[i]] = d
    return specs


def _spec_range(d: Any) -> tuple[str | None, int | None, int | None]:
    if isinstance(d, Dim):
        return d.name, d.min, d.max
    name = getattr(d, "__name__", None)
    if name is None or not hasattr(d, "min"):
        return None, None, None  # Dim.AUTO / Dim.DYNAMIC
    lo, hi = int(d.min), d.max
    return name, lo, (None if hi is None or hi >= 2**62 else int(hi))


def _export_sample(samples: list[tuple[Any, ...]], dynamic: list[set[int]]) -> tuple[Any, ...]:
    """The sample with the largest dynamic dims, with every dynamic dim of size 1 doubled (by repetition,
    which keeps index and mask values valid)."""
    def key(s: tuple[Any, ...]) -> tuple[int, int]:
        sizes = [t.shape[a] for t, axes in zip(s, dynamic) for a in axes]
        return (min(sizes, default=0), sum(t.numel() for t in s))

    best = max(samples, key=key)
    out = []
    for t, axes in zip(best, dynamic):
        for a in sorted(axes):
            if t.shape[a] == 1:
                t = torch.cat([t, t], dim=a)
        out.append(t)
    return tuple(out)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def _export(model: torch.nn.Module, args: tuple[Any, ...], shapes: Any) -> torch.export.ExportedProgram:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(model, args, dynamic_shapes=shapes, strict=False)


def capture(model: torch.nn.Module, sample_inputs: Any, dynamic_shapes: Any = None) -> Captured:
    samples = normalize_samples(sample_inputs)
    names = input_names(model, len(samples[0]))
    ranks = [t.dim() for t in samples[0]]
    user = _user_specs(dynamic_shapes, names, ranks)
    dynamic = [set(u) for u in user]
    for i in range(len(names)):
        for axis in range(ranks[i]):
            if len({s[i].shape[axis] for s in samples}) > 1:
                dynamic[i].add(axis)
    args = _export_sample(samples, dynamic)
    notes: list[str] = []
    with _eval_mode(model), torch.no_grad():
        if not any(dynamic):
            return Captured(_finish(_run(model, args, None)), names, {}, notes)
        auto = [
            {a: (_to_torch_dim(user[i][a]) if a in user[i] else TorchDim.AUTO) for a in sorted(dynamic[i])} or None
            for i in range(len(names))
        ]
        first = _run(model, args, tuple(auto))
        groups, bounds = _symbol_groups(first, names, dynamic)
        specs, infos = _named_dims(groups, bounds, user, names)
        ep, retried = _export_min1(model, args, specs, infos, names, groups)
        if retried:
            notes.append("the model specializes size 1 for " + ", ".join(sorted(retried)) + "; their ranges start at 2")
        return Captured(_finish(ep), names, _symbol_map(ep, groups, infos), notes)


def _run(model: torch.nn.Module, args: tuple[Any, ...], shapes: Any) -> torch.export.ExportedProgram:
    try:
        return _export(model, args, shapes)
    except Exception as e:  # torch raises many types; the message is what the user needs
        raise ExportError(f"torch.export could not capture the model: {type(e).__name__}: {e}") from e


def _finite(v: Any) -> int | None:
    """A range bound as an int, or None when it is infinite (torch's int_oo) or beyond int64."""
    if isinstance(v, int) or getattr(v, "is_Integer", False):
        n = int(v)
        return n if abs(n) < 2**62 else None
    return None


def _to_torch_dim(d: Any) -> Any:
    name, lo, hi = _spec_range(d)
    if name is None:
        return d
    return TorchDim(name, min=lo or 0, max=hi if hi is not None else 2**62)


def _placeholder_dims(ep: torch.export.ExportedProgram, names: list[str]) -> list[list[Any]]:
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    return [list(nodes[u].meta["val"].shape) for u in user]


def _symbol_groups(ep: torch.export.ExportedProgram, names: list[str], dynamic: list[set[int]]
                   ) -> tuple[dict[str, list[tuple[int, int]]], dict[str, tuple[int, int | None]]]:
    """torch symbol name -> the (input, axis) pairs that carry it, and the symbol's discovered range."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for i, dims in enumerate(_placeholder_dims(ep, names)):
        for axis, d in enumerate(dims):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                groups.setdefault(str(d.node.expr), []).append((i, axis))
            elif axis in dynamic[i] and not isinstance(d, torch.SymInt):
                raise ExportError(
                    f"input {names[i]!r} dimension {axis} varies between samples, but the model fixes it to {d}"
                )
    bounds = {str(sym): (_finite(vr.lower) or 0, _finite(vr.upper)) for sym, vr in ep.range_constraints.items()}
    return groups, bounds


def _named_dims(groups: dict[str, list[tuple[int, int]]], bounds: dict[str, tuple[int, int | None]],
                user: list[AxisSpec], names: list[str]) -> tuple[dict[str, Any], dict[str, SymbolInfo]]:
    specs, infos, used = {}, {}, set()
    for sym, places in groups.items():
        lo_model, hi_model = bounds.get(sym, (2, None))
        name, lo, hi = None, 1, hi_model
        for i, a in places:
            if a in user[i]:
                uname, ulo, uhi = _spec_range(user[i][a])
                if uname is not None:
                    name, lo = uname, ulo if ulo is not None else 1
                    if uhi is not None:
                        hi = uhi if hi is None else min(hi, uhi)
        if name is None:
            i, a = places[0]
            name = f"{names[i]}_dim{a}"
        while name in used:
            name += "_"
        used.add(name)
        infos[sym] = SymbolInfo(name, lo, hi)
        specs[sym] = (lo_model, hi_model)
    return specs, infos


def _build_shapes(groups: dict[str, list[tuple[int, int]]], infos: dict[str, SymbolInfo], n: int,
                  min_override: dict[str, int]) -> tuple[Any, ...]:
    shapes: list[dict[int, Any]] = [{} for _ in range(n)]
    for sym, places in groups.items():
        info = infos[sym]
        lo = max(info.min, min_override.get(sym, 0))
        d = TorchDim(info.name, min=lo, max=info.max if info.max is not None else 2**62)
        for i, a in places:
            shapes[i][a] = d
    return tuple(s or None for s in shapes)


def _export_min1(model: torch.nn.Module, args: tuple[Any, ...], specs: dict[str, Any], infos: dict[str, SymbolInfo],
                 names: list[str], groups: dict[str, list[tuple[int, int]]]) -> tuple[torch.export.ExportedProgram, set[str]]:
    override: dict[str, int] = {}
    for _attempt in range(3):
        try:
            return _export(model, args, _build_shapes(groups, infos, len(names), override)), {
                infos[s].name for s in override
            }
        except Exception as e:
            text = str(e)
            culprits = {s for s, info in infos.items() if re.search(rf"\b{re.escape(info.name)}\b", text) and s not in override}
            if not culprits:
                culprits = {s for s in infos if s not in override}
            if not culprits:
                raise ExportError(f"torch.export could not capture the model: {type(e).__name__}: {e}") from e
            for s in culprits:
                override[s] = 2
    raise ExportError("torch.export kept rejecting the dynamic dims even with min=2")


def _symbol_map(ep: torch.export.ExportedProgram, groups: dict[str, list[tuple[int, int]]],
                infos: dict[str, SymbolInfo]) -> dict[str, SymbolInfo]:
    """Map the final program's torch symbols (they are renamed between exports) to bladepack symbols."""
    place_to_info = {p: infos[s] for s, places in groups.items() for p in places}
    out: dict[str, SymbolInfo] = {}
    user = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == torch.export.graph_signature.InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    ranges = {str(k): v for k, v in ep.range_constraints.items()}
    for i, u in enumerate(user):
        for a, d in enumerate(nodes[u].meta["val"].shape):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol and (i, a) in place_to_info:
                info = place_to_info[(i, a)]
                sym = str(d.node.expr)
                vr = ranges.get(sym)
                lo = (_finite(vr.lower) or 0) if vr is not None else info.min
                hi, model_hi = info.max, (_finite(vr.upper) if vr is not None else None)
                if model_hi is not None:
                    hi = model_hi if hi is None else min(hi, model_hi)
                out[sym] = SymbolInfo(info.name, max(lo, info.min), hi)
    return out


def _finish(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """Inference IR: drops dropout and autograd wrappers, keeps high-level ops (no decomposition)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ep.run_decompositions({})


def describe_samples(samples: Sequence[tuple[Any, ...]]) -> str:
    return "; ".join(", ".join(str(tuple(t.shape)) for t in s) for s in samples)
