"""Packed execution in the loader: several sequences of different lengths in one call, no padding.

In: a loaded artifact with a packed form (`manifest["packed"]`, Note [Packed sequences] in
passes/pack_sequences.py) and a call's inputs, with every ragged input holding the sequences one after
the other along its sequence axis (its rows axis of size 1), plus each sequence's length. Out: the
outputs with the sequences one after the other along their sequence axis (or, for an output read at
one position of each sequence, one row per sequence along its rows axis), as each sequence alone would
give them (within float rounding).

Each length is checked as a call of that one sequence would be (the unpacked plan's shape program:
its range and every guard; a batch of `rows_min` copies of it where the batch starts above 1); the
packed plan itself gets each token's sequence bounds as its two extra inputs. The packed plan is loaded on first use, from the same file (its sections are named by
`manifest["packed"]["sections"]`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bladepack.artifact.format import BpkFile
from bladepack.errors import InputError


def rows_min(signature: Any, record: dict[str, Any]) -> int:
    """The least batch the unpacked plan takes: the range's start of the ragged inputs' rows dim (2
    where a torch before 2.13 could not export a batch of 1: Note [Two exports])."""
    mins = {sym.name: sym.min for sym in signature.symbols}
    least = 1
    for t in signature.inputs:
        if t.name in record["inputs"]:
            d = t.shape[int(record["inputs"][t.name][0])]
            least = max(least, int(mins.get(d, 1)) if isinstance(d, str) else 1)
    return least


class PackedFile:
    """The artifact seen as its packed form: the packed plan's manifest, sections by its names."""

    def __init__(self, bpk: BpkFile, record: dict[str, Any]) -> None:
        self._bpk = bpk
        self._names: dict[str, str] = dict(record.get("sections", {}))
        self.source = f"{bpk.source} (packed form)"
        self.manifest = {
            **record["plan"],
            "format_version": bpk.manifest["format_version"],
            "producer": bpk.manifest.get("producer", {}),
            "sections": bpk.manifest["sections"],
        }

    def section(self, name: str) -> memoryview:
        return self._bpk.section(self._names.get(name, name))

    def section_copy(self, name: str) -> bytes:
        return self._bpk.section_copy(self._names.get(name, name))

    def section_digest(self, name: str) -> str:
        return self._bpk.section_digest(self._names.get(name, name))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bpk, name)


class PackedRunner:
    """`LoadedModule.run_packed`: checks the lengths and the packed inputs, runs the packed plan."""

    def __init__(
        self,
        record: dict[str, Any],
        names: Sequence[str],
        check_one: Callable[[list[tuple[int, ...]]], object],
        module: Any,
        rows: int = 1,
    ) -> None:
        self.record = record
        self.names = list(names)
        self.inputs: dict[str, tuple[int, int]] = {n: (int(a[0]), int(a[1])) for n, a in record["inputs"].items()}
        self.check_one = check_one  # the unpacked plan's shape check of one sequence's input shapes
        self.module = module
        self.rows = rows  # a sequence alone is a batch of this many rows (rows_min)
        self.checked: set[tuple[tuple[int, ...], ...]] = set()

    def run(self, inputs: Sequence[Any], lengths: Sequence[int]) -> list[Any]:
        if len(inputs) != len(self.names):
            raise InputError(f"run_packed takes {len(self.names)} inputs ({self.names}), got {len(inputs)}")
        try:
            given = np.asarray(lengths).reshape(-1)
            lens = given.astype(np.int64)
        except (TypeError, ValueError):
            raise InputError("lengths must be a sequence of integers, one per sequence") from None
        if lens.size == 0:
            raise InputError("lengths is empty: run_packed needs at least one sequence")
        if np.any(given != lens) or np.any(lens < 0):
            raise InputError(f"lengths must be whole numbers >= 0, got {given.tolist()}")
        total = int(lens.sum())
        arrays = list(inputs)
        for k, name in enumerate(self.names):
            if name not in self.inputs:
                continue
            shape = tuple(np.shape(arrays[k]))
            rows, seq = self.inputs[name]
            if len(shape) <= max(rows, seq):
                raise InputError(
                    f"packed input '{name}' has shape {shape}; it needs its rows on axis {rows} "
                    f"and the sequences on axis {seq}"
                )
            if shape[rows] != 1 or shape[seq] != total:
                raise InputError(
                    f"packed input '{name}' has shape {shape}: axis {rows} (the rows) must be 1 and axis {seq} "
                    f"the sum of the lengths, {total}"
                )
        for n in sorted(set(lens.tolist())):  # each length as a call of that one sequence would be checked
            shapes: list[tuple[int, ...]] = []
            for k, name in enumerate(self.names):
                dims = [int(d) for d in np.shape(arrays[k])]
                if name in self.inputs:
                    dims[self.inputs[name][0]], dims[self.inputs[name][1]] = self.rows, n
                shapes.append(tuple(dims))
            key = tuple(shapes)
            if key not in self.checked:
                try:
                    self.check_one(shapes)
                except InputError as e:
                    raise InputError(f"a sequence of length {n}: {e}") from None
                if len(self.checked) < 4096:
                    self.checked.add(key)
        ends = np.cumsum(lens)
        starts = ends - lens
        bounds = [np.repeat(starts, lens), np.repeat(ends, lens)]
        if self.record.get("firsts"):  # outputs with one row per sequence read each one's first token
            bounds.append(starts)
        out: list[Any] = self.module.run([*arrays, *bounds])
        return out
