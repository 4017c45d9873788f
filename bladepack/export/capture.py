"""Capture a model with torch.export, inferring dynamic dims from several samples.

In: an nn.Module, one or more sample argument tuples, optional `dynamic_shapes` (torch.export's
structure; `torch.export.Dim` or `bladepack.Dim` leaves). Out: an `ExportedProgram` the converters take
(Note [Training IR as it is] in inference_ir.py) whose placeholders carry symbolic dims, plus the name
and range each torch symbol gets in bladepack.

Note [Two exports]: torch.export specializes dims it sees at size 0 or 1 and starts automatic ranges
at 2. So a first export with `Dim.AUTO` (on a sample whose dynamic dims are all >= 2) discovers which
dims are one symbol and what bounds the model itself imposes; a second export declares one named
`Dim` per symbol with `min=1` (or the user's min), so batch 1 works unless the model forbids it —
then the dims torch names in its complaint fall back to min 2.

What torch can prove differs between versions. The CNN sample (stride-2 convolutions and pooling)
exports with height and width from 1 on torch 2.13 (the plain export fails, the size-oblivious retry
succeeds); torch 2.11 (the GPU machines, measured 2026-11-26) fails both with a guard it cannot
discharge, `((height - 1) // 2) % 2 != 0`, so there the two dims start at 2 and optimize says so in a
note. The artifact built there matched eager at heights 2 to 10, 24, 96 and 97 (both parities), and
refuses height 1 with a ShapeGuardError naming the range.

The discovery export's own guards say in advance where a named export must fail (Note [Remainder
guards] in input_guards.py): a remainder on one dim sends it to Dim.AUTO at once, a disequality puts
the size-oblivious mode first.

torch 2.11 also checks a ranged Dim.AUTO against the guards it cannot prove (a Hugging Face Qwen2's
`min(16*s, 32*s) == 16*s` from transformers 5's masks), and its size-oblivious retry may name another
dim than the plain export: the last fallback exports the named dims as bare Dim.AUTO, first those the
last complaint names, then those any complaint names, and `_symbol_map` puts the declared range back
(measured 2026-11-30: Qwen2, LLaMA and Mistral export on 2.11 with ranges from 2, each said in a note).
"""

from __future__ import annotations

import contextlib
import inspect
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import Dim as TorchDim

from bladepack.errors import ExportError
from bladepack.export.declared_dims import (
    AxisSpec,
    declared_relations,
    derived_spec,
    hold_declared,
    spec_range,
    user_specs,
)
from bladepack.export.inference_ir import inference_program
from bladepack.export.input_guards import BrokenGuards, broken_guards, input_guards
from bladepack.export.recurrent import recurrent_layers
from bladepack.export.related_dims import Place, RelatedDims, Relation, traced_probe
from bladepack.export.selective_scan import selective_scans
from bladepack.export.specialized import refuse_specialized

GUARD_NOTE_CHARS = 120  # longer input guards are counted in optimize's note, not written out


@dataclass(frozen=True)
class SymbolInfo:
    name: str
    min: int
    max: int | None
    # the largest size the discovery export found the model valid for (None: unbounded); the traced
    # graph holds for sizes in [min, model_max] (Note [Extending an artifact] in extend.py)
    model_max: int | None = None


@dataclass
class Captured:
    program: torch.export.ExportedProgram
    input_names: list[str]
    symbols: dict[str, SymbolInfo]  # torch symbol name -> bladepack symbol
    notes: list[str]
    # Note [Input guards]: conditions over the inputs' torch symbols the traced graph needs, with
    # torch's source of each (only after a Dim.AUTO fallback)
    guards: list[tuple[Any, str, str]] = field(default_factory=list)
    # the program is torch.export's training IR as it is, not retraced (Note [Training IR as it is])
    as_exported: bool = False


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
        params = [
            p
            for p in inspect.signature(model.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[:n]]
    return names + [f"input{i}" for i in range(len(names), n)]


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


def distinct_arguments(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """torch.export gives a tensor passed as several arguments one placeholder, which every one of them
    then reads (a sample `(x, x, x)` for `forward(q, k, v)` would compile a model of one input, silently
    wrong for distinct ones): each repeat of an argument is a copy. Views of one storage stay as they
    are; export keeps them apart."""
    seen: set[int] = set()
    out = []
    for a in args:
        out.append(a.clone() if id(a) in seen else a)
        seen.add(id(a))
    return tuple(out)


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    """Inference mode while exporting; afterwards every submodule's own mode back (a recursive
    `train(was)` would switch an eval-mode submodule of a training-mode model to training)."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, was in modes:
            m.training = was


@contextlib.contextmanager
def no_cache_object(model: torch.nn.Module, notes: list[str]) -> Iterator[None]:
    """A Hugging Face model whose config asks for a KV cache returns a cache object (DynamicCache),
    which no artifact can hold: exported with `config.use_cache = False` (restored after), and said so.
    Cached decoding passes the past keys and values as inputs instead."""
    config = getattr(model, "config", None)
    if getattr(config, "use_cache", False) is not True:
        yield
        return
    config.use_cache = False  # type: ignore[union-attr]
    notes.append(
        f"{type(model).__name__}: exported with config.use_cache = False (a cache object is no tensor "
        "output; pass past keys and values as inputs for cached decoding)"
    )
    try:
        yield
    finally:
        config.use_cache = True  # type: ignore[union-attr]


def _export(
    model: torch.nn.Module, args: tuple[Any, ...], shapes: Any, oblivious: bool = False
) -> torch.export.ExportedProgram:
    import torch.fx.experimental._config as fx_config

    if oblivious and not hasattr(fx_config, "backed_size_oblivious"):
        raise ExportError("this torch has no size-oblivious tracing mode")
    patch = fx_config.patch(backed_size_oblivious=oblivious)  # type: ignore[attr-defined]
    with warnings.catch_warnings(), patch:
        warnings.simplefilter("ignore")
        return torch.export.export(model, args, dynamic_shapes=_fit_signature(model, shapes), strict=False)


def _fit_signature(model: torch.nn.Module, shapes: Any) -> Any:
    """torch.export matches dynamic_shapes to forward's parameters: arguments caught by *args form
    one tuple entry."""
    if shapes is None:
        return None
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return shapes
    named = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if not any(p.kind == p.VAR_POSITIONAL for p in params):
        return shapes
    return (*shapes[: len(named)], tuple(shapes[len(named) :]))


def capture(model: torch.nn.Module, sample_inputs: Any, dynamic_shapes: Any = None) -> Captured:
    samples = normalize_samples(sample_inputs)
    names = input_names(model, len(samples[0]))
    ranks = [t.dim() for t in samples[0]]
    user = user_specs(dynamic_shapes, names, ranks)
    declared = {(i, a): spec for i, u in enumerate(user) for a, d in u.items() if (spec := derived_spec(d))}
    dynamic = [set(u) for u in user]
    for i in range(len(names)):
        for axis in range(ranks[i]):
            if len({s[i].shape[axis] for s in samples}) > 1:
                dynamic[i].add(axis)
    args = distinct_arguments(hold_declared(samples, _export_sample(samples, dynamic), user, declared, names))
    notes: list[str] = []
    with (
        eval_mode(model),
        no_cache_object(model, notes),
        recurrent_layers(model),
        selective_scans(model),
        torch.no_grad(),
    ):
        if not any(dynamic):
            ep = _run(model, args, None)
            program = inference_program(ep)
            return Captured(program, names, {}, notes, as_exported=program is ep)
        auto = [{a: TorchDim.AUTO for a in sorted(dynamic[i])} or None for i in range(len(names))]
        first = _run(model, args, tuple(auto))
        dims, specialized = _symbol_groups(first, dynamic)
        for i, axis, size in specialized:
            refuse_specialized(lambda: _export(model, args, tuple(auto)), names, user, samples, i, axis, size)
        infos = _named_dims(dims.groups, dims.bounds, user, names, notes)
        named: dict[str, str] = {}
        for sym, info in infos.items():  # one name on several groups declares them equal
            if named.setdefault(info.name, sym) != sym:
                dims.relations[sym] = Relation(named[info.name], 1, 0)
        declared_relations(dims, declared, {sym: info.name for sym, info in infos.items()}, names)
        group_names = {sym: info.name for sym, info in infos.items()}
        current = {sym: int(args[ps[0][0]].shape[ps[0][1]]) for sym, ps in dims.groups.items()}
        seen = {sym: [int(s[ps[0][0]].shape[ps[0][1]]) for s in samples] for sym, ps in dims.groups.items()}
        user_named = frozenset(
            sym
            for sym, places in dims.groups.items()
            if any(a in user[i] and spec_range(user[i][a])[0] is not None for i, a in places)
        )
        probe = traced_probe(model, first.module(), args, names)
        dims.infer(probe, current, seen, group_names, notes, user_named)
        infos = _narrow_roots(infos, dims)
        roots = {s: (i.name, i.min, i.max) for s, i in infos.items() if s not in dims.relations}
        broken = broken_guards(first, model, roots)
        ep, fallbacks = _export_min1(model, args, infos, names, dims, broken)
        symbols = _symbol_map(ep, dims, infos)
        guards = input_guards(ep, model, {s: (i.name, i.min, i.max) for s, i in symbols.items()})
        if guards:
            dim_names = {s: i.name for s, i in symbols.items()}
            notes.append(
                _guards_note(
                    [
                        (text, sorted({dim_names.get(v.name, v.name) for v in cond.free_symbols}))
                        for cond, _, text in guards
                    ]
                )
            )
        for name, reason in sorted(fallbacks.items()):
            lo = min((i.min for i in symbols.values() if i.name == name), default=2)
            notes.append(
                f"torch.export could not prove the model valid over the declared range of {name} "
                f"({reason}); its range starts at {lo}"
            )
        program = inference_program(ep)
        return Captured(program, names, symbols, notes, guards, as_exported=program is ep)


def _guards_note(guards: list[tuple[str, list[str]]]) -> str:
    """The input guards (text, the dims it is on) in a note: the short ones written out, the long ones
    (a Swin's padded window sizes run to kilobytes each) counted with their dims; a refused call names
    its own."""
    parts = [text for text, _ in guards if len(text) <= GUARD_NOTE_CHARS]
    rest = [dims for text, dims in guards if len(text) > GUARD_NOTE_CHARS]
    if rest:
        names = sorted({n for dims in rest for n in dims})
        parts.append(f"{len(rest)} longer condition{'s' if len(rest) > 1 else ''} on {', '.join(names)}")
    return (
        "torch.export traced the model only where "
        + "; ".join(parts)
        + " (its guards; the artifact refuses other shapes, naming the guard they break)"
    )


def _run(model: torch.nn.Module, args: tuple[Any, ...], shapes: Any) -> torch.export.ExportedProgram:
    try:
        return _export(model, args, shapes)
    except Exception as e:  # torch raises many types; the message is what the user needs
        hint = ""
        if "in output, which is not a known type" in str(e):
            hint = (
                "\nhint: the model returns an object that is not tensors, tuples, lists or dicts (a cache?): "
                "wrap it in a module that returns the tensors you need"
            )
        raise ExportError(f"torch.export could not capture the model: {type(e).__name__}: {e}{hint}") from e


def _finite(v: Any) -> int | None:
    """A range bound as an int, or None when it is infinite (torch's int_oo) or beyond int64."""
    if isinstance(v, int) or getattr(v, "is_Integer", False):
        n = int(v)
        return n if abs(n) < 2**62 else None
    return None


def _placeholder_dims(ep: torch.export.ExportedProgram) -> list[list[Any]]:
    """The dims of the user inputs' placeholders, in argument order."""
    user = [
        s.arg.name
        for s in ep.graph_signature.input_specs
        if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
    ]
    nodes = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    return [list(nodes[u].meta["val"].shape) for u in user]


def _affine(expr: Any) -> tuple[str, int, int] | None:
    """(symbol, coeff, offset) when a torch size expression is `coeff * symbol + offset`."""
    free = list(expr.free_symbols)
    if len(free) != 1:
        return None
    sym = free[0]
    coeff = expr.coeff(sym)
    offset = expr.subs(sym, 0)
    if not (coeff.is_Integer and offset.is_Integer and int(coeff) >= 1) or (expr - coeff * sym - offset) != 0:
        return None
    return str(sym), int(coeff), int(offset)


def _symbol_groups(
    ep: torch.export.ExportedProgram, dynamic: list[set[int]]
) -> tuple[RelatedDims, list[tuple[int, int, int]]]:
    """The discovery export's groups (torch symbol -> the (input, axis) pairs that carry it), the input
    dims it gave as expressions of a symbol, the symbols' discovered ranges; and the dynamic dims it
    fixed, as (input, axis, size)."""
    groups: dict[str, list[Place]] = {}
    derived: dict[Place, Relation] = {}
    fixed: list[tuple[int, int, int]] = []
    for i, dims in enumerate(_placeholder_dims(ep)):
        for axis, d in enumerate(dims):
            if isinstance(d, torch.SymInt) and d.node.expr.is_number:
                d = int(d.node.expr)  # a symbol the export fixed to a constant
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                groups.setdefault(str(d.node.expr), []).append((i, axis))
            elif isinstance(d, torch.SymInt):
                form = _affine(d.node.expr)
                if form is None:
                    raise ExportError(
                        f"torch.export gave input {i} dimension {axis} the size {d.node.expr}, which is not a "
                        "multiple of one dim plus a constant; bladepack binds input dims of that form only"
                    )
                derived[(i, axis)] = Relation(*form)
            elif axis in dynamic[i]:
                fixed.append((i, axis, int(d)))
    missing = {r.root for r in derived.values()} - set(groups)
    if missing:
        raise ExportError(
            f"torch.export related input dims to {sorted(missing)}, which no input dimension is by itself"
        )
    bounds = {str(sym): (_finite(vr.lower) or 0, _finite(vr.upper)) for sym, vr in ep.range_constraints.items()}
    return RelatedDims(groups, derived, {}, bounds), fixed


def _narrow_roots(infos: dict[str, SymbolInfo], dims: RelatedDims) -> dict[str, SymbolInfo]:
    """A related dim's range bounds its root's: `past + 1 <= 128` makes past <= 127, and a dependent
    dim is at least its own min (1 unless declared)."""
    out = dict(infos)
    for dep, rel in dims.relations.items():
        d, r = infos[dep], out[rel.root]
        lo = max(r.min, -(-(d.min - rel.offset) // rel.coeff))
        hi = r.max
        for cap in (d.max, d.model_max):
            if cap is not None:
                top = (cap - rel.offset) // rel.coeff
                hi = top if hi is None else min(hi, top)
        for sym, info in out.items():
            if info.name == r.name:
                out[sym] = SymbolInfo(info.name, lo, hi, info.model_max)
    return out


def _named_dims(
    groups: dict[str, list[tuple[int, int]]],
    bounds: dict[str, tuple[int, int | None]],
    user: list[AxisSpec],
    names: list[str],
    notes: list[str],
) -> dict[str, SymbolInfo]:
    infos: dict[str, SymbolInfo] = {}
    used: set[str] = set()
    for sym, places in groups.items():
        name, lo, hi = None, 1, bounds.get(sym, (2, None))[1]
        model_max = hi
        for i, a in places:
            if a in user[i]:
                uname, ulo, uhi = spec_range(user[i][a])
                if uname is not None:
                    name, lo = uname, ulo if ulo is not None else 1
                    if uhi is not None:
                        if hi is not None and uhi > hi:
                            notes.append(f"{uname}: the declared max {uhi} exceeds what the model allows; using {hi}")
                        hi = uhi if hi is None else min(hi, uhi)
        if name is None:
            i, a = places[0]
            name = f"{names[i]}_dim{a}"
            while name in used:
                name += "_"
        # A user name given to several groups declares them equal (as one torch Dim object does).
        prev = next((info for info in infos.values() if info.name == name), None)
        if prev is not None:
            lo = max(lo, prev.min)
            hi = prev.max if hi is None else (hi if prev.max is None else min(hi, prev.max))
            if prev.model_max is not None:
                model_max = prev.model_max if model_max is None else min(model_max, prev.model_max)
            for s, info in infos.items():
                if info.name == name:
                    infos[s] = SymbolInfo(name, lo, hi, model_max)
        used.add(name)
        infos[sym] = SymbolInfo(name, lo, hi, model_max)
    return infos


def _build_shapes(
    dims: RelatedDims, infos: dict[str, SymbolInfo], n: int, hinted: set[str], bare: bool = False
) -> tuple[Any, ...]:
    """One named torch Dim per independent group (a shared name: the same Dim), a derived Dim
    (`past + 1`) for every related group and every input dim the discovery export gave as an
    expression; a hinted symbol (and what derives from it) gets Dim.AUTO with its range (`bare`:
    without one, where torch checks even an AUTO range against guards it cannot prove)."""
    shapes: list[dict[int, Any]] = [{} for _ in range(n)]
    named: dict[str, Any] = {}
    roots: dict[str, Any] = {}
    for sym, places in dims.groups.items():
        if sym in dims.relations:
            continue
        info = infos[sym]
        hi = info.max if info.max is not None else 2**62
        if sym in hinted:
            d = TorchDim.AUTO if bare else TorchDim.AUTO(min=info.min, max=hi)
        else:
            d = named.setdefault(info.name, TorchDim(info.name, min=info.min, max=hi))
        roots[sym] = d
        for i, a in places:
            shapes[i][a] = d
    related = [(p, rel) for sym, rel in dims.relations.items() for p in dims.groups[sym]]
    for (i, a), rel in [*related, *dims.derived.items()]:
        root = roots[rel.root]
        if rel.root in hinted:
            shapes[i][a] = TorchDim.AUTO
        elif (rel.coeff, rel.offset) == (1, 0):
            shapes[i][a] = root
        else:
            shapes[i][a] = root * rel.coeff + rel.offset if rel.coeff != 1 else root + rel.offset
    return tuple(s or None for s in shapes)


def _export_min1(
    model: torch.nn.Module,
    args: tuple[Any, ...],
    infos: dict[str, SymbolInfo],
    names: list[str],
    dims: RelatedDims,
    broken: BrokenGuards,
) -> tuple[torch.export.ExportedProgram, dict[str, str]]:
    """Export with one named Dim per symbol (ranges from the user and the discovery export) and derived
    Dims for related dims.

    torch's guard solver sometimes cannot prove a true guard (e.g. `min(8+8*s, 32+32*s) == 8+8*s`
    from strides after a cat); size-oblivious tracing (torch's own mode for sizes it must not
    specialize) then usually succeeds, with our ranges put back explicitly. Where even that fails, the
    symbols torch names fall back to an AUTO hint and the range torch infers.
    Symbols with a `broken` remainder guard (Note [Remainder guards]) fall back at once; a broken
    disequality puts the size-oblivious mode first.
    Returns the program and, per fallen-back symbol name, torch's reason."""
    if broken.remainders:
        try:
            ep = _export(model, args, _build_shapes(dims, infos, len(names), set(broken.remainders)))
        except Exception:  # the long way below says what went wrong
            pass
        else:
            reasons = {
                infos[s].name: f"its guard {t} does not hold at every size" for s, t in broken.remainders.items()
            }
            return ep, reasons
    shapes = _build_shapes(dims, infos, len(names), set())
    texts = []  # each mode's complaint: they may name different dims
    for oblivious in (True, False) if broken.disequalities else (False, True):
        try:
            return _export(model, args, shapes, oblivious), {}
        except Exception as e:
            texts.append(str(e))
    roots = {s: info for s, info in infos.items() if s not in dims.relations}

    def named_in(text: str) -> set[str]:
        return {s for s, info in roots.items() if re.search(rf"\b{re.escape(info.name)}\b", text)}

    # the dims the last complaint names (else all), then those any complaint names; each with its
    # range as an AUTO hint, then (torch 2.11 checks an AUTO Dim's range against the guards it cannot
    # prove too, a Qwen2's `min(16*s, 32*s) == 16*s`) a bare AUTO Dim, the range put back by _symbol_map
    last = named_in(texts[-1]) or set(roots)
    tries = [(last, False), (last, True)]
    if named_in("\n".join(texts)) - last:
        tries += [(last | named_in("\n".join(texts)), False), (last | named_in("\n".join(texts)), True)]
    failure: Exception | None = None
    for culprits, bare in tries:
        try:
            ep = _export(model, args, _build_shapes(dims, infos, len(names), culprits, bare))
        except Exception as e:
            failure = failure or e
            continue
        text = "\n".join(texts)
        return ep, {infos[s].name: fallback_reason(text, infos[s].name) for s in culprits}
    assert failure is not None
    raise ExportError(f"torch.export could not capture the model: {type(failure).__name__}: {failure}") from failure


def fallback_reason(text: str, name: str) -> str:
    """The line of torch's export error that concerns symbol `name` (else its first detail line), with
    the 2^62 that stands for an unbounded range here written as inf."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    mine = [ln for ln in lines[1:] if re.search(rf"\b{re.escape(name)}\b", ln)]
    line = ([ln for ln in mine if ln.startswith("- ")] or mine or lines[1:2] or lines[:1] or [""])[0]
    return line.replace(str(2**62), "inf")


def _symbol_map(
    ep: torch.export.ExportedProgram, dims: RelatedDims, infos: dict[str, SymbolInfo]
) -> dict[str, SymbolInfo]:
    """Map the final program's torch symbols (they are renamed between exports) to bladepack symbols; a
    group made equal to another (Note [Related dims]) is its root's symbol."""
    place_to_info: dict[Place, SymbolInfo] = {}
    for s, places in dims.groups.items():
        rel = dims.relations.get(s)
        info = infos[rel.root] if rel is not None else infos[s]
        place_to_info.update((p, info) for p in places)
    out: dict[str, SymbolInfo] = {}
    ranges = {str(k): v for k, v in ep.range_constraints.items()}
    for i, shape in enumerate(_placeholder_dims(ep)):
        for a, d in enumerate(shape):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol and (i, a) in place_to_info:
                info = place_to_info[(i, a)]
                sym = str(d.node.expr)
                vr = ranges.get(sym)
                lo = (_finite(vr.lower) or 0) if vr is not None else info.min
                hi, model_hi = info.max, (_finite(vr.upper) if vr is not None else None)
                if model_hi is not None:
                    hi = model_hi if hi is None else min(hi, model_hi)
                out[sym] = SymbolInfo(info.name, max(lo, info.min), hi, info.model_max)
    return out
