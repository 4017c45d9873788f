"""The reference executor: every step of the plan run by numpy (loader/reference.py), the oracle.

In: a `Manifest`. Out: `ReferenceExecutor` (the `Executor` contract of executor.py). Its prepared
form of a shape signature, `RefPrepared` — registers, each step with resolved attributes, result
shape and the values it frees, the output shapes — is also what the native and CUDA executors use
for the steps they hand back to numpy (`build` with those steps' values, uncached: they cache their
own prepared form).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.errors import BladepackError, ExecutionError, IndexRangeError
from bladepack.loader import reference
from bladepack.loader.executor import ShapeCache, check_memory, host_call
from bladepack.loader.manifest import Key, Manifest, conditions_hold, element_count, host_dtype, resolve
from bladepack.loader.tensors import export_array


@dataclass(frozen=True)
class Step:
    impl: reference.Impl
    op: str
    out: int
    inputs: tuple[int, ...]
    attrs: dict[str, Any]
    shape: tuple[int, ...]
    dtype: np.dtype | None  # None: bfloat16 (no numpy type; only the CUDA path meets it)
    free: tuple[int, ...]  # values whose last reader is this step
    loc: str
    # Note [Guarded steps] (artifact/plan.py): True runs, False skips at this signature, else the data
    # conditions (value id, expected) read when the step is reached
    when: bool | tuple[tuple[int, bool], ...] = True

    def wanted(self, env: dict[int, np.ndarray]) -> bool:
        if isinstance(self.when, bool):
            return self.when
        return all(bool(env[v].reshape(-1)[0]) == taken for v, taken in self.when)

    def skipped(self) -> np.ndarray:
        """A skipped step's value: zeros (Note [Guarded nodes]: only a branch merge reads it, and
        discards it)."""
        return np.zeros(self.shape, dtype=self.dtype if self.dtype is not None else np.uint16)

    def run(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        """The step's result from its operands, or ExecutionError naming the step and its source."""
        where = f"(from {self.loc or 'unknown source'})"
        if self.dtype is None:
            raise ExecutionError(f"step {self.op} -> %{self.out} computes in bfloat16, which numpy cannot {where}")
        try:
            y = self.impl(xs, self.attrs, self.shape, self.dtype)
        except IndexRangeError as e:
            raise IndexRangeError(f"step {self.op} -> %{self.out} failed: {e} {where}") from None
        except BladepackError:
            raise
        except Exception as e:  # a step's numpy code on operands or attributes the plan got wrong
            raise ExecutionError(f"step {self.op} -> %{self.out} failed: {e} {where}") from None
        if y.shape != self.shape:
            raise ExecutionError(
                f"step {self.op} -> %{self.out} produced shape {y.shape}, the plan says {self.shape} {where}"
            )
        return y


@dataclass(frozen=True)
class RefPrepared:
    registers: tuple[int, ...]
    # every step in plan order, or only those asked for (`ReferenceExecutor.build`'s `nodes`)
    steps: tuple[Step, ...]
    outputs: tuple[tuple[tuple[int, ...], np.dtype | None], ...]  # shape and dtype of each output
    largest: int = 0  # bytes of the largest step result (Note [Bytes before allocation])

    def step_of(self, vid: int) -> Step:
        """The step computing `vid` (a native plan's few reference steps are all `steps` holds)."""
        return next(st for st in self.steps if st.out == vid)


class ReferenceExecutor:
    def __init__(self, m: Manifest, cache_limit: int) -> None:
        self.m = m
        self.prepare = ShapeCache(self.build, cache_limit)

    @property
    def description(self) -> str:
        return "reference"

    def build(self, key: Key, nodes: frozenset[int] | None = None) -> RefPrepared:
        """The prepared form at input shapes `key`: every step, or with `nodes` only the steps that
        compute those values (a native plan's reference launches: resolving the ~200 steps of a small
        encoder costs ~0.8 ms, the larger part of a new shape's first call, and a native plan runs few
        or none of them)."""
        m = self.m
        regs = m.registers(key)
        order = range(len(m.steps)) if nodes is None else sorted(m.step_index[v] for v in nodes)
        steps = [self._step(m.steps[k], m.free[k], regs) for k in order]
        largest = max((element_count(st.shape) * (st.dtype.itemsize if st.dtype else 2) for st in steps), default=0)
        return RefPrepared(regs, tuple(steps), m.output_specs(regs), largest)

    def _step(self, s: dict[str, Any], free: tuple[int, ...], regs: tuple[int, ...]) -> Step:
        v = self.m.values[s["out"]]
        when = s.get("when", ())
        hold = conditions_hold(when, regs)
        return Step(
            reference.OPS[s["op"]],
            s["op"],
            s["out"],
            tuple(s["in"]),
            {name: resolve(a, regs) for name, a in s["attrs"].items()},
            self.m.shape(v["shape"], regs),
            host_dtype(v["dtype"]),
            free,
            s.get("loc", ""),
            hold if hold is not None else tuple((c["v"], c["is"]) for c in when if "v" in c),
        )

    def run(self, inputs: Sequence[Any], outputs: Sequence[Any] | None) -> list[Any]:
        return host_call(self.m, inputs, outputs, self.execute)

    def execute(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        m = self.m
        prep = self.prepare(tuple(a.shape for a in arrays))
        check_memory(prep.largest, lambda: (tuple(a.shape for a in arrays), {"largest step result": prep.largest}))
        env: dict[int, np.ndarray] = dict(m.weights)
        env.update(zip(m.input_ids, arrays))
        for st in prep.steps:
            env[st.out] = st.run([env[i] for i in st.inputs]) if st.wanted(env) else st.skipped()
            for i in st.free:
                del env[i]
        outs, seen = [], set()
        for o in m.outputs:
            a = env[o]
            # An output that is an input, a weight or an earlier output must not alias it.
            outs.append(np.array(a, order="C") if o in seen or o not in m.values else export_array(a))
            seen.add(o)
        return outs
