"""Dims the model relates that torch.export leaves independent.

In: the discovery export (one torch symbol per group of input dims, Note [Two exports] in capture.py),
the model, the export sample and the user's samples. Out: per dependent group, `Relation` (it equals
`coeff * root + offset`) and the evidence, for the second export to declare as a derived Dim.

Note [Related dims]: torch.export relates two input dims only where an op guards on them (an add of
the two, a cat). Models that read one input at positions computed from another's length — a Hugging
Face decoder indexes its attention mask with the positions 0 .. past + q, an encoder-decoder indexes
its encoder mask by batch row — carry no such guard: the discovery export gives the mask's length its
own symbol, though the traced graph is only valid where it is `past + 1` (there it indexes past the
end; eager pads the mask and runs). A reference case drawn at an independent length then fails on a
correct artifact. The relation is found by asking the traced graph: a group whose size alone cannot
change by one without the traced model failing or disagreeing with eager depends on another; the
root is the group that, changed together with it as every sample relates them (`coeff * root +
offset`, fitted on the samples), leaves the traced model running and equal to eager, while the
root changed alone breaks it too (else the group fails for a reason of its own, such as an index
input whose values bound it). The tests run the model at the export sample's size and one step away,
so they cost a few forward passes. A dim the user relates in `dynamic_shapes` (`past + 1`) is
declared, not tested, and a dim the user named is never made another's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

Place = tuple[int, int]  # (input, axis)


@dataclass(frozen=True)
class Relation:
    """The dependent dim is `coeff * root + offset` (root: a torch symbol of the discovery export)."""

    root: str
    coeff: int
    offset: int

    def of(self, root_size: int) -> int:
        return self.coeff * root_size + self.offset

    def text(self, root_name: str) -> str:
        text = root_name if self.coeff == 1 else f"{self.coeff}*{root_name}"
        return text + (f" {'+' if self.offset > 0 else '-'} {abs(self.offset)}" if self.offset else "")


def resized(args: Sequence[Any], sizes: Mapping[Place, int]) -> tuple[Any, ...]:
    """`args` with each (input, axis) of `sizes` cut or grown to that size; growing repeats the last
    slice, which keeps index and mask values valid."""
    out = list(args)
    for (i, axis), n in sizes.items():
        t = out[i]
        cur = int(t.shape[axis])
        if n < cur:
            out[i] = t.narrow(axis, 0, n).contiguous()  # a fresh input, as a caller would pass it
        elif n > cur:
            index = torch.cat([torch.arange(cur), torch.full((n - cur,), cur - 1, dtype=torch.long)])
            out[i] = t.index_select(axis, index)
    return tuple(out)


def fits(dependent: Sequence[int], root: Sequence[int]) -> list[tuple[int, int]]:
    """The (coeff, offset) with coeff a positive integer and offset >= 0 such that every sample has
    `dependent = coeff * root + offset`; with one root size seen, `root + k` and `k * root`."""
    pairs = sorted(set(zip(root, dependent)))
    if len({r for r, _ in pairs}) > 1:
        (r0, d0), (r1, d1) = pairs[0], pairs[1]
        if (d1 - d0) % (r1 - r0):
            return []
        coeff = (d1 - d0) // (r1 - r0)
        offset = d0 - coeff * r0
        ok = coeff >= 1 and offset >= 0 and all(d == coeff * r + offset for r, d in pairs)
        return [(coeff, offset)] if ok else []
    if len(pairs) != 1:
        return []  # one root size with several dependent sizes: no function of the root
    (r, d), out = pairs[0], []
    if d >= r:
        out.append((1, d - r))
    if r > 0 and d % r == 0 and d // r >= 2:
        out.append((d // r, 0))
    return out


# the model at the export sample with these input dims resized: None when the traced model runs there
# and equals eager, else what went wrong
Probe = Callable[[Mapping[Place, int]], str | None]


@dataclass
class RelatedDims:
    """The groups of the discovery export and what is known to relate them; `infer` adds relations."""

    groups: dict[str, list[Place]]  # torch symbol -> the input dims that carry it
    derived: dict[Place, Relation]  # input dims the export itself gave as expressions of a symbol
    relations: dict[str, Relation]  # dependent group -> its relation (declared or inferred)
    bounds: dict[str, tuple[int, int | None]]  # the discovery export's range per symbol

    def sizes(self, values: Mapping[str, int]) -> dict[Place, int]:
        """Every input dim's size when the independent groups take `values` (missing: unchanged)."""
        out: dict[Place, int] = {}
        for sym, places in self.groups.items():
            rel = self.relations.get(sym)
            size = rel.of(values[rel.root]) if rel is not None and rel.root in values else values.get(sym)
            if size is not None:
                out.update((p, size) for p in places)
        for p, rel in self.derived.items():
            if rel.root in values:
                out[p] = rel.of(values[rel.root])
        return out

    def _allowed(self, sym: str, size: int) -> bool:
        lo, hi = self.bounds.get(sym, (2, None))
        return size >= max(lo, 1) and (hi is None or size <= hi)

    def infer(
        self,
        probe: Probe,
        current: Mapping[str, int],
        seen: Mapping[str, Sequence[int]],
        names: Mapping[str, str],
        notes: list[str],
        named: frozenset[str] = frozenset(),
    ) -> None:
        """Note [Related dims]. `current`: each group's size in the export sample; `seen`: its sizes in
        the user's samples, in order; `names`: each group's dim name for the notes; `named`: the
        groups the user named in dynamic_shapes (never made dependent: the user said what they are)."""
        order = [s for s in self.groups if s not in self.relations]
        free = [s for s in order if s not in named]  # a dim the user named is not made another's
        lone: dict[str, str] = {}  # group -> what goes wrong when it alone changes
        for dep in free:
            for step in (-1, 1):
                size = current[dep] + step
                if self._allowed(dep, size) and (failure := probe(self.sizes({**current, dep: size}))) is not None:
                    lone[dep] = failure
                    break
        for root in order:
            if root not in lone and not lone:
                break
            if root in self.relations or any(r.root == root for r in self.relations.values()):
                continue
            roots = {r.root for r in self.relations.values()}
            deps = [d for d in lone if d != root and d not in self.relations and d not in roots]
            cluster = self._cluster(root, deps, current, seen)
            if cluster and self._holds(probe, root, cluster, current):
                self.relations.update(cluster)
                texts = ", ".join(f"{names[dep]} = {rel.text(names[root])}" for dep, rel in cluster.items())
                why = lone[next(iter(cluster))]
                for dep in cluster:
                    del lone[dep]
                notes.append(
                    f"related dims, made one: {texts} (so in every sample, and the traced model does not hold "
                    f"otherwise: {why}); declare them in dynamic_shapes to say so yourself"
                )

    def _cluster(
        self, root: str, deps: list[str], current: Mapping[str, int], seen: Mapping[str, Sequence[int]]
    ) -> dict[str, Relation]:
        """The groups that every sample relates to `root` (their first fit), and that a step of the root
        keeps inside their ranges."""
        out = {}
        moved = current[root] + 1
        if not self._allowed(root, moved):
            return {}
        for dep in deps:
            for coeff, offset in fits(seen[dep], seen[root]):
                rel = Relation(root, coeff, offset)
                if rel.of(current[root]) == current[dep] and self._allowed(dep, rel.of(moved)):
                    out[dep] = rel
                    break
        return out

    def _breaks(self, probe: Probe, current: Mapping[str, int], moved: Callable[[int], dict[str, int]]) -> bool:
        """Whether the groups `moved(step)` gives, changed without the rest, fail for a step up or
        down (a mask longer than needed may hold one way)."""
        for step in (1, -1):
            alone = moved(step)
            if all(self._allowed(g, n) for g, n in alone.items()) and probe(self.sizes({**current, **alone})):
                return True
        return False

    def _holds(self, probe: Probe, root: str, cluster: dict[str, Relation], current: Mapping[str, int]) -> bool:
        """The cluster moves with its root: a step of the root that moves every member as related runs
        and equals eager, a step of the members without the root does not (else the members only
        relate among themselves, and the samples' fit to the root is a coincidence), and neither does
        a step of the root without them (else the members fail for a reason of their own: an index
        input's values bound them, not the root). A cluster that does not hold whole is tried one
        member at a time."""
        moved = {**current, root: current[root] + 1}
        saved = dict(self.relations)
        self.relations.update(cluster)
        together = probe(self.sizes(moved)) is None
        self.relations = saved
        if together:  # the members alone, and the root alone, a step up or down, do not hold
            return self._breaks(
                probe, current, lambda step: {dep: rel.of(current[root] + step) for dep, rel in cluster.items()}
            ) and self._breaks(probe, current, lambda step: {root: current[root] + step})
        if len(cluster) == 1:
            return False
        kept = {dep: rel for dep, rel in cluster.items() if self._holds(probe, root, {dep: rel}, current)}
        cluster.clear()
        cluster.update(kept)
        return bool(kept)


def traced_probe(
    model: torch.nn.Module, traced: torch.nn.Module, args: tuple[Any, ...], input_names: Sequence[str]
) -> Probe:
    """Runs eager and the traced graph at `args` resized; None when both run and agree, else what went
    wrong, naming the resized inputs."""

    def run(sizes: Mapping[Place, int]) -> str | None:
        changed = resized(args, sizes)
        where = ", ".join(
            f"{input_names[i]} dimension {a} = {n}" for (i, a), n in sorted(sizes.items()) if args[i].shape[a] != n
        )
        try:
            want = model(*changed)
        except Exception as e:  # the user's model at a new size: anything may go wrong
            return f"at {where} the model fails: {type(e).__name__}: {_first_line(e)}"
        try:
            got = traced(*changed)
        except Exception as e:
            return f"at {where} the traced model fails: {type(e).__name__}: {_first_line(e)}"
        if not _same(got, want):
            return f"at {where} the traced model computes other values than eager"
        return None

    return run


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else ""


def _same(got: Any, want: Any) -> bool:
    a, _ = torch.utils._pytree.tree_flatten(got)
    b, _ = torch.utils._pytree.tree_flatten(want)
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            if x.is_floating_point() or x.is_complex():
                if not torch.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True):
                    return False
            elif not torch.equal(x, y):
                return False
        elif isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor) or x != y:
            return False
    return True
