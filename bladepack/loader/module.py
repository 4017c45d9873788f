"""A loaded artifact as a callable module.

In: a parsed `BpkFile`. Out: `LoadedModule`, which checks inputs, evaluates the shape program once per
distinct input-shape signature (cached, thread-safe), and runs the plan.

Note [Prepared plans]: everything that depends only on the input shapes — the register file, each
step's resolved attributes and result shape, and when each value can be freed — is computed once per
shape signature into a `_Prepared` and reused, so a repeated shape costs one dictionary lookup plus
the kernels.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.artifact.format import BpkFile
from bladepack.artifact.shape_program import ShapeProgram
from bladepack.artifact.writer import weight_section_name
from bladepack.dtypes import DType
from bladepack.errors import BladepackError, BpkFormatError, InputError
from bladepack.loader import reference
from bladepack.loader.signature import Signature, check_inputs
from bladepack.loader.tensors import export_array, is_torch_tensor, to_numpy, to_torch


class ExecutionError(BladepackError, RuntimeError):
    """A step failed at run time (for example an index outside its table)."""


@dataclass(frozen=True)
class _Step:
    impl: reference.Impl
    op: str
    out: int
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    dtype: np.dtype
    free: tuple[int, ...]  # values whose last reader is this step
    loc: str


@dataclass(frozen=True)
class _Prepared:
    registers: tuple[int, ...]
    steps: tuple[_Step, ...]


def _resolve(v: Any, regs: Sequence[int]) -> Any:
    if isinstance(v, dict) and set(v) == {"r"}:
        return regs[v["r"]]
    if isinstance(v, list):
        return [_resolve(x, regs) for x in v]
    return v


class LoadedModule:
    def __init__(self, bpk: BpkFile, device: str = "cpu") -> None:
        if device != "cpu":
            raise ValueError(f"device {device!r} is not available in this build; the artifact runs on 'cpu'")
        m = bpk.manifest
        self._bpk = bpk
        self.device = device
        try:
            self.signature = Signature.from_manifest(m)
            self._program = ShapeProgram.from_manifest(m["shape_program"])
            self._values = {v["id"]: v for v in m["values"]}
            self._steps = m["plan"]["steps"]
            self._outputs = [o["id"] for o in m["outputs"]]
            self._input_ids = [i["id"] for i in m["inputs"]]
            self._tuple = m.get("output_structure") == "tuple"
            self._weights = {w["id"]: self._weight(w) for w in m["weights"]}
            unknown = sorted({s["op"] for s in self._steps} - set(reference.OPS))
        except BpkFormatError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise BpkFormatError(f"{bpk.source}: malformed manifest ({type(e).__name__}: {e})") from None
        if unknown:
            raise BpkFormatError(
                f"{bpk.source}: the plan uses ops this loader does not know: {unknown}; upgrade bladepack"
            )
        self._free = self._free_lists()
        self._cache: dict[tuple[tuple[int, ...], ...], _Prepared] = {}
        self._lock = threading.Lock()

    def _free_lists(self) -> list[tuple[int, ...]]:
        """Per step, the values whose last reader it is (shape-independent, so computed once)."""
        last: dict[int, int] = {}
        for k, s in enumerate(self._steps):
            for i in s["in"]:
                last[i] = k
        keep = set(self._outputs) | set(self._weights) | set(self._input_ids)
        return [
            tuple(i for i in dict.fromkeys(s["in"]) if last.get(i) == k and i not in keep)
            for k, s in enumerate(self._steps)
        ]

    def _weight(self, w: dict[str, Any]) -> np.ndarray:
        dt = DType(w["dtype"]).to_numpy()
        view = self._bpk.section(weight_section_name(w["name"]))
        count = int(np.prod(w["shape"], dtype=np.int64))
        if view.nbytes != count * dt.itemsize:
            raise BpkFormatError(
                f"{self._bpk.source}: weight {w['name']!r} has {view.nbytes} bytes, expected {count * dt.itemsize}"
            )
        return np.frombuffer(view, dtype=dt.newbyteorder("<"), count=count).reshape(w["shape"])

    # -- public API
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs:
            names = [t.name for t in self.signature.inputs]
            unknown = sorted(set(kwargs) - set(names))
            if unknown:
                raise InputError(f"unknown input name(s) {unknown}; inputs are {names}")
            twice = [n for n in names[: len(args)] if n in kwargs]
            if twice:
                raise InputError(f"input(s) {twice} given both by position and by name")
            missing = [n for n in names[len(args) :] if n not in kwargs]
            if missing:
                raise InputError(f"missing input(s) {missing}; inputs are {names}")
            args = args + tuple(kwargs[n] for n in names[len(args) :])
        outs = self.run(list(args))
        return tuple(outs) if self._tuple or len(outs) != 1 else outs[0]

    def run(self, inputs: Sequence[Any], outputs: Sequence[Any] | None = None) -> list[Any]:
        """Run on a list of inputs; with `outputs`, results are also copied into those arrays."""
        names = [t.name for t in self.signature.inputs]
        if len(inputs) != len(names):
            raise InputError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        as_torch = any(is_torch_tensor(x) for x in inputs)
        arrays = [to_numpy(x, n) for x, n in zip(inputs, names)]
        check_inputs(self.signature, arrays)
        results = self._execute(arrays)
        if outputs is not None:
            if len(outputs) != len(results):
                raise InputError(f"expected {len(results)} output buffers, got {len(outputs)}")
            for spec, buf, r in zip(self.signature.outputs, outputs, results):
                view = to_numpy(buf, spec.name)
                if view.shape != r.shape or view.dtype != r.dtype:
                    raise InputError(
                        f"output buffer '{spec.name}' is {view.dtype.name}{list(view.shape)}; "
                        f"the result is {r.dtype.name}{list(r.shape)}"
                    )
                np.copyto(view, r)
            return list(outputs)
        return [to_torch(r) for r in results] if as_torch else results

    def output_shapes(self, *input_shapes: Sequence[int]) -> list[tuple[int, ...]]:
        """Result shapes for the given input shapes, with every guard checked (no kernels run)."""
        prep = self._prepare(tuple(tuple(int(d) for d in s) for s in input_shapes))
        regs = prep.registers
        return [self._shape(self._values[o]["shape"], regs) if o in self._values else () for o in self._outputs]

    # -- execution
    def _shape(self, enc: list[Any], regs: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(_resolve(d, regs)) for d in enc)

    def _prepare(self, key: tuple[tuple[int, ...], ...]) -> _Prepared:
        prep = self._cache.get(key)
        if prep is not None:
            return prep
        regs = tuple(self._program.evaluate(key))
        steps = []
        for s, free in zip(self._steps, self._free):
            v = self._values[s["out"]]
            attrs = {name: _resolve(a, regs) for name, a in s["attrs"].items()}
            steps.append(
                _Step(
                    reference.OPS[s["op"]],
                    s["op"],
                    s["out"],
                    tuple(s["in"]),
                    attrs,
                    self._shape(v["shape"], regs),
                    DType(v["dtype"]).to_numpy(),
                    free,
                    s.get("loc", ""),
                )
            )
        prep = _Prepared(regs, tuple(steps))
        with self._lock:
            return self._cache.setdefault(key, prep)

    def _execute(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        prep = self._prepare(tuple(a.shape for a in arrays))
        env: dict[int, np.ndarray] = dict(self._weights)
        env.update(zip(self._input_ids, arrays))
        for st in prep.steps:
            try:
                y = st.impl([env[i] for i in st.inputs], st.attrs, st.shape, st.dtype)
            except (IndexError, ValueError, FloatingPointError) as e:
                raise ExecutionError(
                    f"step {st.op} -> %{st.out} failed: {e} (from {st.loc or 'unknown source'})"
                ) from None
            if y.shape != st.shape:
                raise ExecutionError(
                    f"step {st.op} -> %{st.out} produced shape {y.shape}, the plan says {st.shape} "
                    f"(from {st.loc or 'unknown source'})"
                )
            env[st.out] = y
            for i in st.free:
                del env[i]
        outs, seen = [], set()
        for o in self._outputs:
            a = env[o]
            # An output that is an input, a weight or an earlier output must not alias it.
            outs.append(np.array(a, order="C") if o in seen or o not in self._values else export_array(a))
            seen.add(o)
        return outs
