"""The per-signature launch checks of Note [Plan checks] as a few array operations.

In: the `Manifest` and a plan kind whose plan passed `check_plan`. Out: `LaunchChecks`, called per new
input-shape signature as `check_launches` is, returning the bytes each slot holds or raising its error.

Note [Vectorized launch checks]: `check_launches` walks every arena buffer and pointer of the plan in
Python — ~80 µs for a 4-layer encoder's 36 buffers and 165 pointers, half of a new signature's host
work once its launch words came from a template. Here each buffer's offset and dims, each condition's
and each pointer's byte offset are laid out once as constants and register gathers (as Note [Launch
word template] does for the words), so a signature costs one gather and a few whole-array
comparisons, then the GEMM records (a handful) through the same `check_gemm` as before. This only
decides that everything passes. When anything fails — or a size falls where int64 arithmetic might not
hold it exactly (a negative dim or offset, a buffer's dims whose product may pass 2^62 bytes, a slot of
2^63 bytes or more, a plan literal outside int64) — `check_launches` runs and raises its own error: the
first failure in plan order, in its words.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bladepack.loader.launch_words import WordTemplate
from bladepack.loader.manifest import Key, Manifest, element_count
from bladepack.loader.plan_check import BYTE_SIZES, GEMM_OPS, INT64_MAX, check_gemm, check_launches

_EXACT_BYTES = float(1 << 62)  # a buffer estimated below this many bytes has an exact int64 size


class LaunchChecks:
    def __init__(self, m: Manifest, kind: str) -> None:
        self.m, self.kind = m, kind
        plan = m.native[kind]
        assert plan is not None
        self._values = WordTemplate()
        put = self._values.put
        one = put(1)
        self._arena = put(plan["arena_bytes"])
        self._in_sizes = [BYTE_SIZES[t.dtype] for t in m.signature.inputs]
        self._out_sizes = [
            BYTE_SIZES[m.values[o]["dtype"]] if slot != -1 and o in m.values else 0
            for o, slot in zip(m.outputs, plan["outputs"])
        ]
        self._weights = [element_count(w["shape"]) * BYTE_SIZES[w["dtype"]] for w in m.weight_rows]
        rank = max((len(b["shape"]) for b in plan["buffers"]), default=0)
        self._buf_off = np.array([put(b["offset"]) for b in plan["buffers"]], dtype=np.intp)
        dims = [[put(d) for d in b["shape"]] + [one] * (rank - len(b["shape"])) for b in plan["buffers"]]
        self._buf_dims = np.array(dims, dtype=np.intp).reshape(len(dims), rank)
        self._buf_item = np.array([BYTE_SIZES[b["dtype"]] for b in plan["buffers"]], dtype=np.int64)
        cond_slot: list[int] = []
        cond_off: list[int] = []
        ptr_slot: list[int] = []
        ptr_off: list[int] = []
        self._gemms: list[tuple[int, list[int], list[int], int, bool]] = []
        for i, lr in enumerate(plan["launches"]):
            for c in lr.get("when", ()):
                if "ptr" in c:
                    cond_slot.append(int(c["ptr"][0]))
                    cond_off.append(put(c["ptr"][1]))
            if lr["op"] == "ref":
                continue
            first = len(ptr_slot)
            for slot, off in lr["ptrs"]:
                ptr_slot.append(int(slot))
                ptr_off.append(put(off))
            if lr["op"] in GEMM_OPS:
                ints = [put(v) for v in lr["ints"]]
                rooms = list(range(first, len(ptr_slot)))
                self._gemms.append((i, ints, rooms, BYTE_SIZES[lr["dtype"]], len(lr["ptrs"]) == 4))
        self._cond_slot, self._cond_off = np.array(cond_slot, dtype=np.intp), np.array(cond_off, dtype=np.intp)
        self._ptr_slot, self._ptr_off = np.array(ptr_slot, dtype=np.intp), np.array(ptr_off, dtype=np.intp)
        self._exact = self._values.exact

    def __call__(self, key: Key, regs: Sequence[int], out_shapes: Sequence[Sequence[int]]) -> list[int]:
        """The bytes each slot holds (arena, inputs, outputs, weights) after every check passed."""
        if not self._exact:
            return check_launches(self.m, self.kind, key, regs, out_shapes)
        vals = self._values.fill(regs)
        arena = int(vals[self._arena])
        slots = [arena]
        slots += [element_count(s) * size for s, size in zip(key, self._in_sizes)]
        slots += [element_count(s) * size if size else 0 for s, size in zip(out_shapes, self._out_sizes)]
        slots += self._weights
        if arena < 0 or max(slots) > INT64_MAX or not self._passes(vals, arena, np.array(slots, dtype=np.int64)):
            return check_launches(self.m, self.kind, key, regs, out_shapes)
        return slots

    def _passes(self, vals: np.ndarray, arena: int, slots: np.ndarray) -> bool:
        if self._buf_off.size:
            offs, dims = vals[self._buf_off], vals[self._buf_dims]
            if (offs < 0).any() or (dims < 0).any():
                return False
            est = np.prod(dims.astype(np.float64), axis=1) * self._buf_item
            if (est >= _EXACT_BYTES).any():
                return False
            if (np.prod(dims, axis=1) * self._buf_item > arena - offs).any():
                return False
        if self._cond_off.size:
            at = vals[self._cond_off]
            if ((at < 0) | (at >= slots[self._cond_slot])).any():
                return False
        room = slots[self._ptr_slot] - vals[self._ptr_off]
        if ((vals[self._ptr_off] < 0) | (room < 0)).any():
            return False
        if self._gemms:  # every pointer is in bounds: the first GEMM that fails is the plan's first failure
            vl, rl = vals.tolist(), room.tolist()
            for i, ints, rooms, item, four in self._gemms:
                check_gemm(self.m, i, [vl[j] for j in ints], [rl[j] for j in rooms], item, four)
        return True
