"""The manifest as the loader reads it: parsed and checked once, then shared by every executor.

In: a `BpkFile`. Out: `Manifest` — the signature, the shape program, the value table, the reference
steps with the values each one frees, the outputs and inputs, the weights (zero-copy views of their
sections), and per plan kind ("cpu", "cuda") its kernel rows and native plan. A malformed manifest
raises BpkFormatError naming the file. Executors read only this object, never each other.
"""

from __future__ import annotations

import functools
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.artifact.format import BpkFile
from bladepack.artifact.shape_program import ShapeProgram
from bladepack.artifact.writer import weight_section_name
from bladepack.dtypes import DType
from bladepack.errors import BpkFormatError, IndexRangeError
from bladepack.loader import reference
from bladepack.loader.signature import Signature

Key = tuple[tuple[int, ...], ...]
MAX_ATTR_DEPTH = 8  # plan attributes nest two levels at most (a list of lists, register references)  # the input shapes of a call: its shape signature


def resolve(v: Any, regs: Sequence[int]) -> Any:
    """An attribute or dim of the manifest with its register references ({"r": k}) replaced by values."""
    if isinstance(v, dict) and set(v) == {"r"}:
        return regs[v["r"]]
    if isinstance(v, list):
        return [resolve(x, regs) for x in v]
    return v


def element_count(shape: Sequence[int]) -> int:
    """The number of elements of a shape (exact: Python integers)."""
    n = 1
    for d in shape:
        n *= int(d)
    return n


@functools.cache
def host_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of a value, None for bfloat16 (the CPU executors refuse bfloat16 artifacts at
    load; the CUDA path keeps such values on the device and reads dtypes by name)."""
    return None if name == "bfloat16" else DType(name).to_numpy()


@dataclass(frozen=True)
class Manifest:
    source: str
    signature: Signature
    program: ShapeProgram
    values: dict[int, dict[str, Any]]  # value id -> {"id", "dtype", "shape"}
    steps: list[dict[str, Any]]  # the reference plan, one step per value
    free: list[tuple[int, ...]]  # per step, the values whose last reader it is
    step_index: dict[int, int]  # value id -> its step
    outputs: list[int]  # value ids
    input_ids: list[int]
    input_pos: dict[int, int]  # input value id -> position
    tuple_output: bool
    weight_rows: list[dict[str, Any]]
    weights: dict[int, np.ndarray]  # bfloat16 weights as uint16 bits
    kernels: dict[str, list[dict[str, Any]]]  # plan kind -> its kernel rows, in manifest order
    native: dict[str, dict[str, Any] | None]  # plan kind -> its native plan
    bfloat16: bool  # some input, value or weight is bfloat16

    @staticmethod
    def read(bpk: BpkFile) -> Manifest:
        m = bpk.manifest
        try:
            signature = Signature.from_manifest(m)
            program = ShapeProgram.from_manifest(m["shape_program"])
            program.validate([len(t.shape) for t in signature.inputs])
            values = {v["id"]: v for v in m["values"]}
            steps = m["plan"]["steps"]
            outputs = [o["id"] for o in m["outputs"]]
            input_ids = [i["id"] for i in m["inputs"]]
            tuple_output = m.get("output_structure") == "tuple"
            weights = {w["id"]: _weight(bpk, w) for w in m["weights"]}
            manifest = Manifest(
                source=bpk.source,
                signature=signature,
                program=program,
                values=values,
                steps=steps,
                free=_free_lists(steps, set(outputs) | set(weights) | set(input_ids)),
                step_index={s["out"]: k for k, s in enumerate(steps)},
                outputs=outputs,
                input_ids=input_ids,
                input_pos={vid: k for k, vid in enumerate(input_ids)},
                tuple_output=tuple_output,
                weight_rows=list(m["weights"]),
                weights=weights,
                kernels={
                    kind: [k for k in m.get("kernels", ()) if k.get("target", "cpu") == kind]
                    for kind in ("cpu", "cuda")
                },
                native={"cpu": m.get("native_cpu"), "cuda": m.get("native_cuda")},
                bfloat16=any(v["dtype"] == "bfloat16" for v in [*m["values"], *m["weights"], *m["inputs"]]),
            )
            unknown = sorted({s["op"] for s in steps} - set(reference.OPS))
            deep = next((k for k, s in enumerate(steps) if _depth(s["attrs"]) > MAX_ATTR_DEPTH), None)
            problem = _references(manifest)
        except BpkFormatError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise BpkFormatError(f"{bpk.source}: malformed manifest ({type(e).__name__}: {describe(e)})") from None
        if problem:
            raise BpkFormatError(f"{bpk.source}: malformed manifest: {problem}")
        if deep is not None:
            raise BpkFormatError(
                f"{bpk.source}: malformed manifest: step {deep}'s attributes nest deeper than {MAX_ATTR_DEPTH} levels"
            )
        if unknown:
            raise BpkFormatError(
                f"{bpk.source}: the plan uses ops this loader does not know: {unknown}; upgrade bladepack"
            )
        return manifest

    def reference_nodes(self, kind: str) -> frozenset[int]:
        """The values the `kind` native plan leaves to reference steps (its "ref" launches)."""
        plan = self.native[kind]
        assert plan is not None
        return frozenset(int(lr["node"]) for lr in plan["launches"] if lr["op"] == "ref")

    def registers(self, key: Key) -> tuple[int, ...]:
        """The shape program's registers for these input shapes (every guard checked)."""
        return tuple(self.program.evaluate(key))

    def shape(self, enc: list[Any], regs: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(resolve(d, regs)) for d in enc)

    def output_specs(self, regs: Sequence[int]) -> tuple[tuple[tuple[int, ...], np.dtype | None], ...]:
        """Shape and host dtype of each output (None: bfloat16)."""
        return tuple(
            (self.shape(self.values[o]["shape"], regs), host_dtype(self.values[o]["dtype"]))
            if o in self.values
            else ((), np.dtype(np.float32))
            for o in self.outputs
        )


def describe(e: BaseException) -> str:
    """An exception's text, bounded (a hostile manifest's values may nest too deeply to print)."""
    try:
        text = str(e)
    except RecursionError:
        text = "a value nested too deeply to print"
    return text if len(text) <= 300 else text[:300] + "..."


_DTYPES = tuple(d.value for d in DType)


def _references(m: Manifest) -> str | None:
    """What a step, value or output names that the manifest does not define (values, inputs, weights,
    registers), or None. Checked at load so that no shape's first call meets it."""
    n = m.program.num_registers
    known = set(m.values) | set(m.input_pos) | set(m.weights)

    def regs_ok(v: Any) -> bool:
        todo = [v]
        while todo:
            x = todo.pop()
            if isinstance(x, dict):
                if set(x) == {"r"} and not (isinstance(x["r"], int) and 0 <= x["r"] < n):
                    return False
                todo.extend(x.values())
            elif isinstance(x, list):
                todo.extend(x)
        return True

    def symint(d: Any) -> bool:
        return (isinstance(d, int) and not isinstance(d, bool)) or (
            isinstance(d, dict) and set(d) == {"r"} and isinstance(d["r"], int) and 0 <= d["r"] < n
        )

    for vid, v in m.values.items():
        if not isinstance(v.get("dtype"), str) or not isinstance(v.get("shape"), list):
            return f"value %{reprlib.repr(vid)} has a malformed dtype or shape"
        if v["dtype"] not in _DTYPES:
            return f"value %{reprlib.repr(vid)} has dtype {reprlib.repr(v['dtype'])}; known: {', '.join(_DTYPES)}"
        if not all(symint(d) for d in v["shape"]):
            return (
                f"value %{reprlib.repr(vid)}'s shape has an entry that is neither an integer nor a register below {n}"
            )
    ready = set(m.input_pos) | set(m.weights)
    for k, s in enumerate(m.steps):
        if s["out"] not in m.values or not isinstance(s["in"], list) or any(i not in known for i in s["in"]):
            return f"step {k} reads or writes a value the manifest does not define"
        if not isinstance(s["attrs"], dict) or not regs_ok(s["attrs"]):
            return f"step {k}'s attributes name a register outside the shape program's {n}"
        problem = condition_problem(
            s.get("when", []), n, lambda v: v in ready and m.values.get(v, {}).get("dtype", "bool") == "bool"
        )
        if problem:
            return f"step {k}'s condition {problem}"
        ready.add(s["out"])
    if any(o not in known for o in m.outputs):
        return "an output is a value the manifest does not define"
    return None


def condition_problem(when: Any, n_regs: int, value_ok: Callable[[Any], bool], key: str = "v") -> str | None:
    """What is wrong with a step's or launch's `when` list (Note [Guarded steps] in artifact/plan.py), or
    None: each entry {"is": bool} with a register below `n_regs` ("r") or a value / pointer (`key`)
    that `value_ok` accepts."""
    if not isinstance(when, list):
        return f"{reprlib.repr(when)} is not a list"
    for c in when:
        if not isinstance(c, dict) or not isinstance(c.get("is"), bool) or len(c) != 2:
            return f"{reprlib.repr(c)} is not a map of a predicate and 'is'"
        if "r" in c:
            if not (isinstance(c["r"], int) and not isinstance(c["r"], bool) and 0 <= c["r"] < n_regs):
                return f"names register {reprlib.repr(c['r'])}, not below {n_regs}"
        elif key not in c or not value_ok(c[key]):
            what = "a boolean value computed before it" if key == "v" else "a [slot, byte offset] of the plan's slots"
            return f"reads {reprlib.repr(c.get(key))}, which is not {what}"
    return None


def conditions_hold(when: Sequence[dict[str, Any]], regs: Sequence[int]) -> bool | None:
    """False when a shape condition of `when` fails for these registers (the step never runs at this
    signature); None when data conditions remain to be read at run time; True when it always runs."""
    data = False
    for c in when:
        if "r" in c:
            if bool(regs[c["r"]]) != c["is"]:
                return False
        else:
            data = True
    return None if data else True


def _depth(v: Any) -> int:
    """How deeply lists and maps nest in `v` (iteratively: a hostile manifest cannot exhaust the stack)."""
    deepest, todo = 0, [(v, 1)]
    while todo:
        x, d = todo.pop()
        if isinstance(x, dict):
            todo.extend((y, d + 1) for y in x.values())
        elif isinstance(x, list):
            todo.extend((y, d + 1) for y in x)
        else:
            continue
        deepest = max(deepest, d)
        if deepest > MAX_ATTR_DEPTH:
            break
    return deepest


def _free_lists(steps: list[dict[str, Any]], keep: set[int]) -> list[tuple[int, ...]]:
    """Per step, the values whose last reader it is (shape-independent, so computed once)."""
    last: dict[int, int] = {}
    reads = [[*s["in"], *(c["v"] for c in s.get("when", ()) if isinstance(c, dict) and "v" in c)] for s in steps]
    for k, ins in enumerate(reads):
        for i in ins:
            last[i] = k
    return [tuple(i for i in dict.fromkeys(ins) if last.get(i) == k and i not in keep) for k, ins in enumerate(reads)]


def _weight(bpk: BpkFile, w: dict[str, Any]) -> np.ndarray:
    # bfloat16 has no numpy dtype: its bits are kept as uint16 (only the CUDA path reads them; the
    # host executors refuse bfloat16 at load)
    if not isinstance(w.get("dtype"), str) or w["dtype"] not in _DTYPES:
        raise BpkFormatError(
            f"{bpk.source}: weight {reprlib.repr(w.get('name'))} has dtype {reprlib.repr(w.get('dtype'))}"
        )
    dt = np.dtype(np.uint16) if w["dtype"] == "bfloat16" else DType(w["dtype"]).to_numpy()
    view = bpk.section(weight_section_name(w["name"]))
    count = int(np.prod(w["shape"], dtype=np.int64))
    if view.nbytes != count * dt.itemsize:
        raise BpkFormatError(
            f"{bpk.source}: weight {w['name']!r} has {view.nbytes} bytes, expected {count * dt.itemsize}"
        )
    return np.frombuffer(view, dtype=dt.newbyteorder("<"), count=count).reshape(w["shape"])


def index_error(k: dict[str, Any], code: int, value: int, size: int) -> IndexRangeError:
    """The error a kernel (row `k`) reported through its status words: ERR_INDEX (an index may count from
    the end) or ERR_INDEX_NONNEG (it may not: Note [Negative indices] in opset/attrs.py), + 16 x site."""
    site = (code - 1) // 16
    what = k["errors"][site] if 0 <= site < len(k["errors"]) else "an index"
    lowest = 0 if code - 16 * site == _ERR_INDEX_NONNEG else -size
    return IndexRangeError(
        f"index out of range in {what}: {value} is not in [{lowest}, {size - 1}] "
        f"(kernel {k['name']}, from {k.get('loc') or 'unknown source'})"
    )


_ERR_INDEX_NONNEG = 2  # codegen/kernel.py
