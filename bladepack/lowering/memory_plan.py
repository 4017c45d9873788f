"""Memory planning: liveness-based reuse of one arena, sized and laid out by formulas of the symbols.

In: buffers (value id, byte size as int-or-sympy, first and last step that touches it). Out: an arena
offset per buffer and the arena's total size, both expressions the shape program evaluates per input
shape (TVM Relax's symbolic memory planning, done greedily).

Note [Slot reuse]: buffers are placed in definition order. A buffer takes a free slot (one whose last
user ran before this buffer is defined) when the slot is proven at least as large for every shape in
range; else a free slot proven no larger grows to it; else a new slot opens. Sizes never become a
max of incomparable terms, so offsets stay short formulas. Slots are 64-byte aligned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from bladepack.ir import ShapeEnv, Tri
from bladepack.ir.types import IRDim
from bladepack.ir.views import simplify, sym_eq

ALIGN = 64


@dataclass(frozen=True)
class Buffer:
    id: int
    nbytes: IRDim
    first: int
    last: int


@dataclass(frozen=True)
class MemoryPlan:
    offsets: dict[int, IRDim]
    slots: tuple[IRDim, ...]  # aligned size of each slot
    total: IRDim

    def text(self) -> str:
        return f"arena {len(self.slots)} slots, {self.total} bytes"


def _aligned(e: IRDim) -> IRDim:
    if isinstance(e, int):
        return -(-e // ALIGN) * ALIGN
    return simplify(ALIGN * sympy.ceiling(sympy.sympify(e) / ALIGN))


def _le(env: ShapeEnv, a: IRDim, b: IRDim) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    return env.prove_le(sympy.sympify(a), sympy.sympify(b)) is Tri.YES  # YES where b - a expands to 0


def plan_memory(env: ShapeEnv, buffers: Sequence[Buffer]) -> MemoryPlan:
    sizes: list[IRDim] = []
    busy_until: list[int] = []
    where: dict[int, int] = {}
    for buf in sorted(buffers, key=lambda b: (b.first, b.id)):
        need = _aligned(buf.nbytes)
        free = [k for k in range(len(sizes)) if busy_until[k] < buf.first]
        fits = [k for k in free if _le(env, need, sizes[k])]
        if fits:
            k = min(fits, key=lambda s: (0 if sym_eq(sizes[s], need) else 1, s))
        else:
            grow = [k for k in free if _le(env, sizes[k], need)]
            if grow:
                k = grow[0]
                sizes[k] = need
            else:
                k = len(sizes)
                sizes.append(need)
                busy_until.append(-1)
        busy_until[k] = max(busy_until[k], buf.last)
        where[buf.id] = k
    offsets_of_slot: list[IRDim] = []
    acc: IRDim = 0
    for s in sizes:
        offsets_of_slot.append(acc)
        acc = simplify(acc + s)
    return MemoryPlan({b: offsets_of_slot[k] for b, k in where.items()}, tuple(sizes), acc)
