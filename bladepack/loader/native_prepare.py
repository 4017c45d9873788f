"""A native CPU plan's new input-shape signatures prepared inside its kernel library.

In: a `Manifest` whose CPU plan passed the load-time checks, and the library's `bpk_prepare` entry
point. Out: `NativePreparation`, which prepares one signature in a single foreign call — the launch
words, the arena size and the output shapes — or None, and the Python path takes the call.

Note [Native preparation]: a decode loop or a server fed sequences of every length meets a new shape
on nearly every call, and preparing a signature in Python (shape program, output specs, the
per-signature plan checks, the launch words, the kernels' operand checks: ~60 µs for the LLaMA
sample's step, Note [Launch word template]) cost several times the step's kernels. The kernel
library therefore carries an interpreter (`bpk::prep::prepare`, codegen/cpu_prepare.h) of a
*preparation program* that this module lays out once per load from the manifest: the shape program
(each DIM rewritten to read its dim's position in the flattened input dims), the inputs' ranks, item
sizes and static dims, the outputs' dims, the arena buffers, every launch pointer, the GEMM records,
the launch word template with its register positions (Note [Launch word template]), each launch's
shape conditions and kernel variants, and which slots a launch may write. Every value the plan
takes from a register or a constant is one index into a register file that holds the program's
registers followed by the plan's constants.

The interpreter computes exactly what the Python path would and refuses wherever the Python path
might raise: a failed guard, a division by zero or any int64 overflow, a static dim that differs,
a buffer, pointer or GEMM record outside its tensor (Note [Plan checks]), no kernel variant, a failed
operand check (Note [Kernel operand checks]) or more bytes than the machine holds (Note [Bytes before
allocation]). A refusal is not an error: the call goes the Python path, which raises its own words
(or, where only int64 arithmetic was in doubt, runs). A launch a shape condition rules out is left
out of the words, so the kept launches are one list, as Note [Fast path] runs them; a run of
launches under run-time data conditions (Note [Guarded launches]) is preceded by one WHEN record per
condition (codegen/cpu_runtime.h), which the library reads where the Python path would read the
predicate bytes between its segments, so a branching plan is one list too. The LLaMA
sample's decode loop went from ~125 to ~20 µs a step (bench/results/decode_walk.md). Plans with
reference steps or an output the plan does not write are not prepared natively (their calls need the
Python path's segments), and neither is a plan with a constant outside int64.

Header (int64 words, the order of HEADER; "at" words are positions in the program):
magic, inputs, inputs at, registers, constants, constants at, instructions, code at, outputs, outputs
at, arena (register index), weights, weights at, buffers, buffers at, pointers, pointers at, GEMMs,
GEMMs at, words, words at, fills, fills at, launches, launches at, writable at, memory (bytes),
conditions, conditions at.
Sections: inputs [first dim's position, rank, item bytes, static dim or -1 per axis]; outputs [item
bytes, rank, dim indices]; weights [bytes]; buffers [offset index, item bytes, rank, dim indices];
pointers [slot, offset index]; GEMMs [first pointer, pointer count, item bytes, integer count,
integer indices]; fills [word position, index]; launches [start, end, shape condition count,
(predicate index, expected) pairs, data condition count, (slot, offset index, expected) triples,
function word position or -1, variant count, (predicate index, function) pairs]; writable: one byte
per slot, packed into words; conditions [slot, offset index] (every data condition's byte).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.artifact.native_plan import declined
from bladepack.loader.launch_words import LaunchWords
from bladepack.loader.manifest import Manifest, element_count
from bladepack.loader.plan_check import BYTE_SIZES

HEADER = [
    "magic",
    "inputs",
    "inputs_at",
    "registers",
    "constants",
    "constants_at",
    "instructions",
    "code_at",
    "outputs",
    "outputs_at",
    "arena",
    "weights",
    "weights_at",
    "buffers",
    "buffers_at",
    "pointers",
    "pointers_at",
    "gemms",
    "gemms_at",
    "words",
    "words_at",
    "fills",
    "fills_at",
    "launches",
    "launches_at",
    "writable_at",
    "memory",
    "conds",
    "conds_at",
]
MAGIC = int.from_bytes(b"BPKPREP1", "little")
_DIM = 1  # the shape program's DIM opcode
_I64 = (-(1 << 63), 1 << 63)

# why a signature was left to the Python path: bpk::prep::Stage
STAGES = ("prepared", "shape program", "slot bytes", "buffer", "pointer", "GEMM", "variant", "operands", "memory")


class _Program:
    """The preparation program under construction: the register file's constants interned, the sections
    appended in order."""

    def __init__(self, num_registers: int) -> None:
        self.nregs = num_registers
        self.consts: dict[int, int] = {}
        self.exact = True

    def ref(self, v: Any) -> int:
        """A plan integer or register reference as one index into the register file."""
        if isinstance(v, dict):
            return int(v["r"])
        v = int(v)
        if not _I64[0] <= v < _I64[1]:
            self.exact = False
            v = 0
        return self.nregs + self.consts.setdefault(v, len(self.consts))


def eligible(m: Manifest) -> str | None:
    """`declined` for a loaded manifest's CPU plan."""
    plan = m.native["cpu"]
    assert plan is not None
    if any(o not in m.values for o in m.outputs):
        return "an output the plan does not write"
    return declined(plan, len(m.input_ids))


@dataclass(frozen=True)
class Prepared:
    words: np.ndarray  # the launch words of the kept launches
    arena_bytes: int
    out_shapes: tuple[tuple[int, ...], ...]


class _Scratch(threading.local):
    def __init__(self, nregs: int, nwords: int, nout: int, nslots: int, ndims: int) -> None:
        self.regs = np.zeros(max(nregs, 1), dtype=np.int64)
        self.words = np.zeros(max(nwords, 1), dtype=np.int64)
        self.out_dims = np.zeros(max(nout, 1), dtype=np.int64)
        self.slots = np.zeros(max(nslots, 1), dtype=np.int64)
        self.dims = np.zeros(max(ndims, 1), dtype=np.int64)
        self.info = np.zeros(4, dtype=np.int64)
        self.ptrs = tuple(
            int(a.ctypes.data) for a in (self.dims, self.regs, self.words, self.out_dims, self.slots, self.info)
        )


class NativePreparation:
    """Note [Native preparation]. `build` gives None for a plan it does not cover."""

    def __init__(
        self,
        program: np.ndarray,
        fn: Any,
        ranks: tuple[int, ...],
        out_ranks: tuple[int, ...],
        sizes: tuple[int, int, int],
    ) -> None:
        self.program = program
        self._fn = fn
        self._ptr = int(program.ctypes.data)
        self.ranks = ranks
        self._spans: list[tuple[int, int]] = []
        at = 0
        for r in out_ranks:
            self._spans.append((at, at + r))
            at += r
        nregs, nwords, nslots = sizes
        self._scratch = _Scratch(nregs, nwords, at, nslots, sum(ranks))

    @staticmethod
    def build(m: Manifest, fn: Any, words: LaunchWords, memory: int) -> NativePreparation | None:
        """The program of `m`'s CPU plan for the library entry point `fn`, its launch words from the
        plan's template `words`, or None where Note [Native preparation] leaves the plan to the Python
        path; `memory`: the bytes a call may need."""
        if fn is None or eligible(m) is not None:
            return None
        plan = m.native["cpu"]
        assert plan is not None
        prog = _Program(m.program.num_registers)
        ref = prog.ref
        ranks = tuple(len(t.shape) for t in m.signature.inputs)
        starts = np.cumsum((0,) + ranks)
        inputs: list[int] = []
        for t, at in zip(m.signature.inputs, starts):
            inputs += [int(at), len(t.shape), BYTE_SIZES[t.dtype]]
            inputs += [d if isinstance(d, int) else -1 for d in t.shape]
        code: list[int] = []
        for op, d, a, b, c in m.program.code:
            if op == _DIM:
                a, b = int(starts[a]) + b, 0
            code += [op, d, a, b, c]
        outputs: list[int] = []
        out_ranks = []
        for o in m.outputs:
            shape = m.values[o]["shape"]
            outputs += [BYTE_SIZES[m.values[o]["dtype"]], len(shape), *(ref(d) for d in shape)]
            out_ranks.append(len(shape))
        weights = [element_count(w["shape"]) * BYTE_SIZES[w["dtype"]] for w in m.weight_rows]
        buffers: list[int] = []
        for b in plan["buffers"]:
            buffers += [ref(b["offset"]), BYTE_SIZES[b["dtype"]], len(b["shape"]), *(ref(d) for d in b["shape"])]
        pointers: list[int] = []
        gemms: list[int] = []
        for lr in plan["launches"]:
            first = len(pointers) // 2
            pointers += [x for slot, off in lr["ptrs"] for x in (int(slot), ref(off))]
            if lr["op"] == "gemm":
                ints = [ref(v) for v in lr["ints"]]
                gemms += [first, len(lr["ptrs"]), BYTE_SIZES[lr["dtype"]], len(ints), *ints]
        template = words.template.words
        fills = [x for pos, reg in words.template.register_words for x in (pos, reg)]
        launches: list[int] = []
        conds: list[int] = []
        for ln in words.launches:
            data = [(int(slot), ref(off), int(taken)) for slot, off, taken in ln.data_when]
            conds += [x for slot, off, _ in data for x in (slot, off)]
            launches += [
                ln.start,
                ln.end,
                len(ln.shape_when),
                *(x for r, want in ln.shape_when for x in (r, int(want))),
            ]
            launches += [len(data), *(x for d in data for x in d), ln.fn_at, len(ln.variants)]
            launches += [x for pred, f in ln.variants for x in (pred, f)]
        n_in, n_out = len(m.input_ids), len(m.outputs)
        n_slots = 1 + n_in + n_out + len(weights)
        writable = np.zeros(-(-n_slots // 8) * 8, dtype=np.uint8)
        writable[0] = 1
        writable[1 + n_in : 1 + n_in + n_out] = 1
        arena = ref(plan["arena_bytes"])
        if not (prog.exact and words.template.exact) or any(not _I64[0] <= v < _I64[1] for v in (*weights, memory)):
            return None
        consts = sorted(prog.consts, key=prog.consts.__getitem__)
        head = dict.fromkeys(HEADER, 0)
        body: list[int] = []

        def section(name: str, words: Sequence[int], count: int | None = None) -> None:
            if count is not None:
                head[name] = count
            head[name + "_at"] = len(HEADER) + len(body)
            body.extend(words)

        section("inputs", inputs, n_in)
        section("constants", consts, len(consts))
        section("code", code)
        head["instructions"] = len(m.program.code)
        section("outputs", outputs, n_out)
        section("weights", weights, len(weights))
        section("buffers", buffers, len(plan["buffers"]))
        section("pointers", pointers, len(pointers) // 2)
        section("gemms", gemms, sum(lr["op"] == "gemm" for lr in plan["launches"]))
        section("words", template, len(template))
        section("fills", fills, len(fills) // 2)
        section("launches", launches, len(plan["launches"]))
        section("writable", writable.view(np.int64).tolist())
        section("conds", conds, len(conds) // 2)
        head.update(magic=MAGIC, registers=prog.nregs, arena=arena, memory=memory)
        program = np.array([head[k] for k in HEADER] + body, dtype=np.int64)
        return NativePreparation(
            program,
            fn,
            ranks,
            tuple(out_ranks),
            (prog.nregs + len(consts), 2 * len(template) + 7 * len(conds) // 2, n_slots),
        )

    def stage(self, shapes: Sequence[tuple[int, ...]]) -> int:
        """Prepare these input shapes (ranks already those of the signature) into this thread's
        scratch arrays: 0, or the `STAGES` entry that left them to the Python path."""
        s = self._scratch
        s.dims[: s.dims.size] = [d for shape in shapes for d in shape] or [0]
        dims, regs, words, out_dims, slots, info = s.ptrs
        return int(self._fn(self._ptr, dims, regs, words, out_dims, slots, info))

    def __call__(self, shapes: Sequence[tuple[int, ...]]) -> Prepared | None:
        """The signature of these input shapes, or None (the Python path prepares it)."""
        if self.stage(shapes):
            return None
        s = self._scratch
        n, arena = s.info[:2].tolist()
        od = s.out_dims.tolist()
        return Prepared(s.words[:n].copy(), arena, tuple(tuple(od[a:b]) for a, b in self._spans))


def entry_point(lib: ctypes.CDLL) -> Any:
    """The library's bpk_prepare, None for libraries from before it."""
    if not hasattr(lib, "bpk_prepare"):
        return None
    fn = lib.bpk_prepare
    fn.restype = ctypes.c_int64
    fn.argtypes = [ctypes.c_void_p] * 7
    return fn
