"""The dims a user declares in `dynamic_shapes`: named (`bladepack.Dim`, `torch.export.Dim`), derived
(`past + 1`, `2 * seq`: `bladepack.DerivedDim` or torch's) or `Dim.AUTO`, and what they imply for the
export sample and the discovery export's groups.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bladepack.dims import DerivedDim, Dim
from bladepack.errors import ExportError
from bladepack.export.related_dims import Place, RelatedDims, Relation, resized

AxisSpec = dict[int, Any]  # axis -> bladepack.Dim | bladepack.DerivedDim | torch Dim (or derived) | "auto"


def user_specs(dynamic_shapes: Any, names: list[str], ranks: list[int]) -> list[AxisSpec]:
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


def spec_range(d: Any) -> tuple[str | None, int | None, int | None]:
    """A named dim's (name, min, max); (None, None, None) for Dim.AUTO / Dim.DYNAMIC and derived dims."""
    if isinstance(d, Dim):
        return d.name, d.min, d.max
    name = getattr(d, "__name__", None)
    if name is None or not hasattr(d, "min") or derived_spec(d) is not None:
        return None, None, None
    lo, hi = int(d.min), d.max
    return name, lo, (None if hi is None or hi >= 2**62 else int(hi))


@dataclass(frozen=True)
class DerivedSpec:
    """A dim declared as `coeff * root + offset` (bladepack.DerivedDim or torch's `past + 1`)."""

    root: Any  # the root's spec: a bladepack.Dim or a torch Dim
    coeff: int
    offset: int

    @property
    def root_name(self) -> str:
        return str(spec_range(self.root)[0])

    def text(self) -> str:
        return Relation("", self.coeff, self.offset).text(self.root_name)


def derived_spec(d: Any) -> DerivedSpec | None:
    if isinstance(d, DerivedDim):
        return DerivedSpec(d.root, d.coeff, d.offset)
    root, fn = getattr(d, "root", None), getattr(d, "fn", None)
    if root is None or not callable(fn):
        return None
    if derived_spec(root) is not None:
        raise ValueError(
            f"dynamic_shapes: {d.__name__} derives from a derived dim; derive it from {root.root.__name__}"
        )
    offset = int(fn(0))
    coeff = int(fn(1)) - offset
    if coeff < 1 or int(fn(2)) != 2 * coeff + offset:
        raise ValueError(f"dynamic_shapes: {d.__name__} is not coeff * dim + offset with a positive integer coeff")
    return DerivedSpec(root, coeff, offset)


def hold_declared(
    samples: list[tuple[Any, ...]],
    args: tuple[Any, ...],
    user: list[AxisSpec],
    declared: dict[Place, DerivedSpec],
    names: list[str],
) -> tuple[Any, ...]:
    """The export sample with every declared derived dim at its root's size times coeff plus offset (the
    sample may have grown its size-1 dims). A root no input carries, or a sample that breaks the
    declared relation, is an error."""
    roots = {name: (i, a) for i, u in enumerate(user) for a, d in u.items() if (name := spec_range(d)[0]) is not None}
    sizes: dict[Place, int] = {}
    for (i, a), spec in declared.items():
        if spec.root_name not in roots:
            raise ExportError(
                f"dynamic_shapes: input {names[i]!r} dimension {a} is {spec.text()}, but no input dimension is "
                f"{spec.root_name} itself; declare {spec.root_name} on the dimension it is"
            )
        ri, ra = roots[spec.root_name]
        for k, sample in enumerate(samples):
            want = spec.coeff * int(sample[ri].shape[ra]) + spec.offset
            if int(sample[i].shape[a]) != want:
                raise ExportError(
                    f"sample {k}: input {names[i]!r} dimension {a} is {int(sample[i].shape[a])}, but dynamic_shapes "
                    f"declares it {spec.text()} = {want} ({spec.root_name} is input {names[ri]!r} dimension {ra})"
                )
        sizes[(i, a)] = spec.coeff * int(args[ri].shape[ra]) + spec.offset
    return resized(args, sizes)


def declared_text(d: Any) -> str:
    derived = derived_spec(d)
    if derived is not None:
        return derived.text()
    name, lo, hi = spec_range(d)
    return f"{name} in [{lo}, {'inf' if hi is None else hi}]"


def declared_relations(
    dims: RelatedDims, declared: dict[Place, DerivedSpec], dim_names: dict[str, str], names: list[str]
) -> None:
    """The user's derived dims as relations between the discovery export's groups; one the export
    contradicts (it made the two dims equal, or related them otherwise) is an error."""
    by_name: dict[str, str] = {}
    for sym, name in dim_names.items():  # a name on several groups: the first is their symbol
        by_name.setdefault(name, sym)
    for (i, a), spec in declared.items():
        root = by_name[spec.root_name]
        want = Relation(root, spec.coeff, spec.offset)
        place = f"input {names[i]!r} dimension {a}"
        have = dims.derived.get((i, a))
        group = next((sym for sym, places in dims.groups.items() if (i, a) in places), None)
        if group == root and want != Relation(root, 1, 0):
            raise ExportError(f"dynamic_shapes declares {place} {spec.text()}, but the model makes it {spec.root_name}")
        if have is not None and have != want:
            raise ExportError(
                f"dynamic_shapes declares {place} {spec.text()}, but the model makes it "
                f"{have.text(dim_names[have.root])}"
            )
        if group is not None and group != root:
            prev = dims.relations.get(group)
            if prev is not None and prev != want:
                raise ExportError(
                    f"dynamic_shapes declares {place} {spec.text()}, and a dimension the model makes equal to it "
                    f"{prev.text(spec.root_name)}"
                )
            dims.relations[group] = want
