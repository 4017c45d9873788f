"""A native CPU plan's launch list compiled once into a word template (Note [Launch word template]).

In: the plan's launch records, its kernel rows and the library's function count. Out: `LaunchWords`,
whose `segments(registers)` gives the launch segments of one input-shape signature — the same
segments a walk over every record would give, for a gather and a pass over the launches.

Note [Launch word template]: a native launch's words are [op, function or GEMM dtype code, pointer
count, integer count, (slot, byte offset) per pointer, integers]; most of them are constants of the
plan, the rest register references of the shape program. All launches' words are laid out once in
one int64 array with the constants in place; each register word is recorded as (position, register)
and each kernel's function word as (position, its variants). A new signature then costs one gather
of the registers into their positions, a variant choice per kernel and a pass over the launches for
their shape and data conditions (Note [Guarded launches]). A segment is a run of consecutive launches
(dropped launches and reference steps end one), so its words are one slice of the array. The first
call at a new shape of a 4-layer encoder (37 launches, ~1200 words) spent ~190 µs resolving words
one by one; the gather makes that ~30 µs, and a server fed sequences of every length pays it on most calls.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.errors import BpkFormatError
from bladepack.loader.cuda_driver import BUFFER_END, BUFFER_POINTER, BUFFER_SIZE

OP_KERNEL, OP_GEMM = 1, 2
GEMM_DTYPE_CODES = {"float32": 0, "float64": 1, "float16": 2, "bfloat16": 3}  # a GEMM record's `a` word


def resolve_word(v: Any, regs: Sequence[int]) -> int:
    """A launch word or plan size: an integer, or a register reference {"r": k}."""
    if isinstance(v, dict):
        return int(regs[v["r"]])
    return int(v)


_WORD = 0xFFFFFFFFFFFFFFFF  # a 64-bit parameter word: negative integers as their two's complement


class WordTemplate:
    """Words laid out once (Note [Launch word template]): each constant in place, each register word
    recorded as (position, register), filled per signature by one gather. `unsigned` keeps the words
    as 64-bit patterns (CUDA parameters); otherwise they are int64 and `exact` says whether every
    constant fits (a manifest integer may not)."""

    def __init__(self, unsigned: bool = False) -> None:
        self.words: list[int] = []
        self._at: list[int] = []
        self._reg: list[int] = []
        self._unsigned = unsigned
        self._frozen: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def put(self, v: Any) -> int:
        """Append a constant or a register reference {"r": k}; its position."""
        if isinstance(v, dict):
            self._at.append(len(self.words))
            self._reg.append(int(v["r"]))
            self.words.append(0)
        else:
            self.words.append(int(v) & _WORD if self._unsigned else int(v))
        return len(self.words) - 1

    @property
    def register_words(self) -> list[tuple[int, int]]:
        """(position, register) of every word a signature fills from a register."""
        return list(zip(self._at, self._reg))

    @property
    def exact(self) -> bool:
        return self._unsigned or all(-(1 << 63) <= w < (1 << 63) for w in self.words)

    def fill(self, regs: Sequence[int]) -> np.ndarray:
        """The words at one signature (a fresh array)."""
        if self._frozen is None:
            dtype = np.uint64 if self._unsigned else np.int64
            self._frozen = (
                np.array(self.words, dtype=dtype),
                np.array(self._at, dtype=np.intp),
                np.array(self._reg, dtype=np.intp),
            )
        template, at, reg = self._frozen
        words = template.copy()
        if reg.size:
            values = registers_array(regs)[reg]
            words[at] = values.view(np.uint64) if self._unsigned else values
        return words


@dataclass(frozen=True)
class Segment:
    """A run of native launches (`words`), or one reference step (`ref` = launch record), that runs when
    every (slot, byte offset, expected) data condition of `when` holds (Note [Guarded launches])."""

    words: np.ndarray | None
    first_launch: int
    ref: dict[str, Any] | None = None
    when: tuple[tuple[int, int, bool], ...] = ()

    def wanted(self, slots: np.ndarray) -> bool:
        """Whether the data conditions hold, read in order (an inner predicate is read only once the
        outer ones hold: Note [Branch predicates] in ir/guards.py)."""
        for slot, off, taken in self.when:
            if (ctypes.c_uint8.from_address(int(slots[slot]) + off).value != 0) != taken:
                return False
        return True


@dataclass(frozen=True)
class Launch:
    index: int  # in the plan
    record: dict[str, Any]
    ref: bool  # a reference step: no words
    start: int  # its words in the template
    end: int
    shape_when: tuple[tuple[int, bool], ...]  # (register, expected)
    data_when: tuple[tuple[int, Any, bool], ...]  # (slot, byte offset word, expected)
    fn_at: int  # the position of a kernel's function word, -1 for a GEMM
    variants: tuple[tuple[int, int], ...]  # a kernel's (predicate register, function), first true wins
    name: str


class LaunchWords:
    """Note [Launch word template]. Built after the plan checks (Note [Plan checks]) passed."""

    def __init__(self, launches: Sequence[dict[str, Any]], kernels: Sequence[dict[str, Any]], nfn: int) -> None:
        self._words = WordTemplate()
        words, put = self._words.words, self._words.put
        self._launches: list[Launch] = []
        for k, lr in enumerate(launches):
            op = lr["op"]
            when = lr.get("when", ())
            shape_when = tuple((int(c["r"]), bool(c["is"])) for c in when if "r" in c)
            data_when = tuple((int(c["ptr"][0]), c["ptr"][1], bool(c["is"])) for c in when if "ptr" in c)
            start, fn_at, name = len(words), -1, ""
            variants: tuple[tuple[int, int], ...] = ()
            if op == "kernel":
                row = kernels[lr["k"]]
                name = str(row["name"])
                variants = tuple((int(v["pred"]), int(v["fn"])) for v in row["variants"])
                fn_at = start + 1
                words += [OP_KERNEL, -1]
            elif op == "gemm":
                words += [OP_GEMM, GEMM_DTYPE_CODES[lr["dtype"]]]
            elif op != "ref":
                raise BpkFormatError(f"unknown launch op {op!r}")
            if op != "ref":
                ptrs, ints = lr["ptrs"], lr["ints"]
                words += [len(ptrs), len(ints)]
                for slot, off in ptrs:
                    words.append(int(slot))
                    put(off)
                for v in ints:
                    put(v)
            self._launches.append(
                Launch(k, lr, op == "ref", start, len(words), shape_when, data_when, fn_at, variants, name)
            )
        self._nfn = nfn

    @property
    def template(self) -> WordTemplate:
        """Every launch's words laid out once (a reference step's none)."""
        return self._words

    @property
    def launches(self) -> tuple[Launch, ...]:
        """Per plan launch: its words' range in the template, its conditions and its kernel's variants."""
        return tuple(self._launches)

    def segments(self, regs: Sequence[int]) -> tuple[Segment, ...]:
        """The launch list at one signature: launches a shape condition rules out dropped, the rest cut
        into segments at reference steps, at dropped launches and where the data conditions change."""
        words = self._words.fill(regs)
        segments: list[Segment] = []
        start, end, first = -1, -1, 0
        cur: tuple[tuple[int, int, bool], ...] = ()
        for ln in self._launches:
            hold = not ln.shape_when or all(bool(regs[r]) == want for r, want in ln.shape_when)
            data = (
                tuple((slot, resolve_word(off, regs), taken) for slot, off, taken in ln.data_when)
                if ln.data_when
                else ()
            )
            if not hold or ln.ref or data != cur:
                if start >= 0:
                    segments.append(Segment(words[start:end], first, None, cur))
                start, first, cur = -1, ln.index + (not hold or ln.ref), data
            if not hold:
                continue
            if ln.ref:
                segments.append(Segment(None, ln.index, ln.record, data))
                continue
            if ln.fn_at >= 0:
                fn = next((f for pred, f in ln.variants if regs[pred]), None)
                if fn is None or not 0 <= fn < self._nfn:
                    raise BpkFormatError(f"kernel {ln.name}: no variant applies (corrupt plan)")
                words[ln.fn_at] = fn
            if start < 0:
                start = ln.start
            end = ln.end
        if start >= 0 or not segments:
            segments.append(Segment(words[start:end] if start >= 0 else words[:0], first, None, cur))
        return tuple(segments)


class KernelParams:
    """Note [Launch word template] for a CUDA plan's kernel launches: each launch's parameter words
    [status, pointers, integers] (pointers zero: the call fills them from its slots) and its pointers'
    (position, slot, byte offset), laid out once for every kernel launch of the plan. `at(regs)` gives
    the whole plan's arrays at one signature; `kept(...)` cuts them down to the launches that run."""

    def __init__(self, launches: Sequence[dict[str, Any]], status_slot: int) -> None:
        self._words, self._offs = WordTemplate(unsigned=True), WordTemplate(unsigned=True)
        pos: list[int] = []
        slots: list[int] = []
        self.ranges: dict[int, tuple[int, int, int, int]] = {}  # launch -> words [w0, w1), pointers [p0, p1)
        for k, lr in enumerate(launches):
            if lr["op"] != "kernel":
                continue
            w0, p0 = len(self._words.words), len(pos)
            for slot, off in ((status_slot, 0), *lr["ptrs"]):
                pos.append(self._words.put(0))
                slots.append(int(slot))
                self._offs.put(off)
            for v in lr["ints"]:
                self._words.put(v)
            self.ranges[k] = (w0, len(self._words.words), p0, len(pos))
        self._pos = np.array(pos, dtype=np.int64)
        self._slots = np.array(slots, dtype=np.int64)
        self._cuts: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self._records: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}

    def at(self, regs: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(words, pointer positions, slots, byte offsets) of every kernel launch at these registers."""
        return self._words.fill(regs), self._pos, self._slots, self._offs.fill(regs)

    def kept(
        self, arrays: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray], launches: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`at`'s arrays for the kernel launches `launches` only (in plan order), positions renumbered
        (the gathers laid out once per set of launches: a plan's shape conditions give a few)."""
        words, _, _, offs = arrays
        chosen = tuple(launches)
        cut = self._cuts.get(chosen)
        if cut is None:
            w: list[np.ndarray] = []
            p: list[np.ndarray] = []
            for k in chosen:
                w0, w1, p0, p1 = self.ranges[k]
                w.append(np.arange(w0, w1))
                p.append(np.arange(p0, p1))
            at = np.concatenate(w) if w else np.zeros(0, dtype=np.int64)
            ptrs = np.concatenate(p) if p else np.zeros(0, dtype=np.int64)
            renumbered = np.searchsorted(at, self._pos[ptrs]) if ptrs.size else ptrs
            cut = (at, renumbered.astype(np.int64), self._slots[ptrs], ptrs)
            if len(self._cuts) >= 64:
                self._cuts.clear()
            self._cuts[chosen] = cut
        at, pos, slots, ptrs = cut
        return words[at], pos, slots, offs[ptrs]

    def records(self, launches: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Note [Launch records] of the kernel launches `launches` (in plan order), laid out once per set."""
        chosen = tuple(launches)
        got = self._records.get(chosen)
        if got is None:
            got = _launch_records([self.ranges[k][1] - self.ranges[k][0] for k in chosen])
            if len(self._records) >= 64:
                self._records.clear()
            self._records[chosen] = got
        return got


# Note [Launch records]: a kernel launch hands the driver its parameters through `extra`
# (CU_LAUNCH_PARAM_BUFFER_POINTER, the words' address, CU_LAUNCH_PARAM_BUFFER_SIZE, the size's address,
# CU_LAUNCH_PARAM_END). Building those two ctypes objects per launch cost ~6 µs of Python, more than the
# driver call; so the records of a set of kernel launches are one uint64 [n, 5] array, laid out once per
# set (`KernelParams.records`), whose address column holds each launch's byte offset into the words — a
# call adds its words' address to that column and passes each launch its row.


def _launch_records(words: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Note [Launch records] of consecutive launches of `words[j]` parameter words each: the [n, 5]
    template and the sizes its rows point at (keep both alive while the template is used)."""
    n = len(words)
    sizes = np.array([8 * w for w in words], dtype=np.uint64)
    template = np.zeros((n, 5), dtype=np.uint64)
    if n:
        template[:, 0], template[:, 2], template[:, 4] = BUFFER_POINTER, BUFFER_SIZE, BUFFER_END
        template[1:, 1] = np.cumsum(sizes)[:-1]
        template[:, 3] = sizes.ctypes.data + 8 * np.arange(n, dtype=np.uint64)
    return template, sizes


def registers_array(regs: Sequence[int]) -> np.ndarray:
    """A signature's registers as int64 (the shape program keeps every register inside int64)."""
    return np.array(regs, dtype=np.int64)
