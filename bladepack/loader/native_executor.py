"""The native CPU executor: the artifact's generated kernel library runs the plan's launches.

In: a `Manifest`, the artifact (for the kernel library's section) and the reference executor (for the
steps the plan leaves to numpy). Out: `NativeExecutor` (the `Executor` contract of executor.py), with
the fast path (Note [Fast path] in fast_call.py; new signatures prepared by the kernel library, Note
[Native preparation] in native_prepare.py) and per-launch `profile`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.artifact.format import BpkFile
from bladepack.dtypes import DType
from bladepack.errors import ExecutionError
from bladepack.loader.executor import ShapeCache, check_memory, host_call, physical_memory
from bladepack.loader.fast_call import FastCalls
from bladepack.loader.launch_checks import LaunchChecks
from bladepack.loader.manifest import Key, Manifest, element_count, index_error
from bladepack.loader.native_cpu import NativeCpu, Prepared
from bladepack.loader.native_prepare import NativePreparation
from bladepack.loader.plan_check import check_plan, operand_error
from bladepack.loader.reference_executor import ReferenceExecutor, RefPrepared
from bladepack.loader.signature import check_inputs
from bladepack.loader.tensors import BFLOAT16_BITS, to_numpy
from bladepack.options import LoaderOptions


def _check_bfloat16_steps(m: Manifest, plan: dict[str, Any]) -> None:
    """A bfloat16 value the plan leaves to a reference step cannot run (numpy has no bfloat16): refused
    at load, naming the steps, rather than at the first call that reaches one."""
    if not m.bfloat16:
        return
    bad = []
    for lr in plan["launches"]:
        if lr["op"] != "ref":
            continue
        step = m.steps[m.step_index[lr["node"]]]
        if any(m.values[v]["dtype"] == "bfloat16" for v in (step["out"], *step["inputs"]) if v in m.values):
            bad.append(f"{step['op']} -> %{step['out']}")
    if bad:
        raise ValueError(
            f"{m.source} leaves bfloat16 steps to the reference executor, which numpy cannot run: {', '.join(bad)}; "
            "compile with dtype='float16' or 'float32' for the CPU, or load it with device='cuda'"
        )


@dataclass(frozen=True)
class NativePrepared:
    ref: RefPrepared  # registers, output specs, and the steps reference segments run
    native: Prepared
    fixed_bytes: int  # the arena and the outputs: what every call at this signature allocates


class NativeExecutor:
    """Raises NativeUnavailable when the artifact's kernel library cannot run here."""

    def __init__(
        self, m: Manifest, bpk: BpkFile, reference: ReferenceExecutor, cache_limit: int, options: LoaderOptions
    ) -> None:
        plan = m.native["cpu"]
        assert plan is not None, "the caller checks that the artifact has a native CPU plan"
        self.m = m
        self.reference = reference
        self.native = NativeCpu(bpk, plan, [m.weights[w["id"]] for w in m.weight_rows], options)
        check_plan(m, "cpu", self.native.nfn)  # Note [Plan checks]: before any launch can run
        self._checks = LaunchChecks(m, "cpu")  # Note [Vectorized launch checks]
        _check_bfloat16_steps(m, plan)
        self.prepare = ShapeCache(self._build, cache_limit)
        self._kernels = m.kernels["cpu"]
        self._launches: list[dict[str, Any]] = plan["launches"]
        self._ref_nodes = m.reference_nodes("cpu")
        self._out_slot = list(plan["outputs"])
        self._n_in = len(m.input_ids)
        self._n_slots = 1 + self._n_in + len(m.outputs) + len(m.weight_rows)
        # per slot, whether a launch may write it: the arena and the outputs the plan writes
        self._writable = np.zeros(self._n_slots, dtype=np.uint8)
        self._writable[0] = 1
        self._writable[1 + self._n_in : 1 + self._n_in + len(m.outputs)] = [s != -1 for s in self._out_slot]
        self.fast: FastCalls | None = None  # Note [Fast path] in fast_call.py
        in_place = all(slot == 1 + self._n_in + k for k, slot in enumerate(self._out_slot))
        try:
            if in_place:
                self.fast = FastCalls(
                    self.native,
                    [DType(t.dtype).to_numpy() for t in m.signature.inputs],
                    [DType(m.values[o]["dtype"]).to_numpy() for o in m.outputs],
                    self._n_slots,
                    cache_limit,
                    NativePreparation.build(
                        m, self.native.prepare_entry, self.native.launch_words(self._kernels), physical_memory()
                    ),
                )
        except TypeError:  # a bfloat16 input or output: no numpy dtype, so the full path only
            self.fast = None

    @property
    def description(self) -> str:
        return f"native ({self.native.isa})"

    def _build(self, key: Key) -> NativePrepared:
        ref = self.reference.build(key, self._ref_nodes)
        slots = self._checks(key, ref.registers, [s for s, _ in ref.outputs])
        native = self.native.prepare(ref.registers, self._kernels)
        failed = self.native.check_operands(native, slots, self._writable)
        if failed is not None:
            raise operand_error(self.m, "cpu", [int(x) for x in failed], ref.registers, slots)
        outputs = sum(element_count(s) * (dt.itemsize if dt is not None else 2) for s, dt in ref.outputs)
        return NativePrepared(ref, native, native.arena_bytes + outputs)

    def run(self, inputs: Sequence[Any], outputs: Sequence[Any] | None) -> list[Any]:
        if outputs is None and self.fast is not None:
            fast = self.fast(inputs)
            if fast is not None:
                return fast
        return self.run_checked(inputs, outputs)

    def run_checked(self, inputs: Sequence[Any], outputs: Sequence[Any] | None) -> list[Any]:
        """The full path: every input checked, the signature prepared (and registered with the fast
        path), then run; what `run` falls back to and `LoadedModule` calls once its direct call declined."""
        return host_call(self.m, inputs, outputs, self._call)

    def _call(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        key = tuple(a.shape for a in arrays)
        prep = self.prepare(key)
        results = self.execute(prep, arrays)
        if self.fast is not None:
            self.fast.add(key, prep.native, [s for s, _ in prep.ref.outputs])
        return results

    def profile(self, args: Sequence[Any], repeat: int) -> list[dict[str, Any]]:
        """Per-launch median wall time (µs) at these inputs: one row per kernel, GEMM or reference step,
        with what it computes and where it came from."""
        arrays = [to_numpy(x, t.name) for x, t in zip(args, self.m.signature.inputs)]
        check_inputs(self.m.signature, arrays)
        times = np.zeros((repeat, len(self._launches)), dtype=np.int64)
        for r in range(repeat):
            self.execute(self.prepare(tuple(a.shape for a in arrays)), arrays, times[r])
        med = np.median(times, axis=0) / 1e3
        rows = []
        for k, lr in enumerate(self._launches):
            if lr["op"] == "kernel":
                kr = self._kernels[lr["k"]]
                rows.append(
                    {"launch": k, "what": f"{kr['name']} {kr['kind']}", "us": float(med[k]), "loc": kr.get("loc", "")}
                )
            else:
                rows.append({"launch": k, "what": lr["op"], "us": float(med[k]), "loc": ""})
        return rows

    def execute(
        self, prep: NativePrepared, arrays: Sequence[np.ndarray], times: np.ndarray | None = None
    ) -> list[np.ndarray]:
        m, native, nat = self.m, self.native, prep.native
        copies = sum(a.nbytes for a in arrays if not (a.flags.c_contiguous and a.dtype.isnative))
        check_memory(
            prep.fixed_bytes + copies,
            lambda: (
                tuple(a.shape for a in arrays),
                {
                    "arena": nat.arena_bytes,
                    "outputs": prep.fixed_bytes - nat.arena_bytes,
                    "contiguous input copies": copies,
                },
            ),
        )
        arrays = [
            a if a.flags.c_contiguous and a.dtype.isnative else np.ascontiguousarray(a, a.dtype.newbyteorder("="))
            for a in arrays
        ]
        n_in = len(arrays)
        outs: list[np.ndarray | None] = [None] * len(m.outputs)
        slots = np.empty(self._n_slots, dtype=np.uint64)
        buf, base = native.arena(nat.arena_bytes)
        skew = base - int(buf.ctypes.data)
        arena = buf[skew:]
        slots[0] = base
        for k, a in enumerate(arrays):
            slots[1 + k] = a.__array_interface__["data"][0]
        for k, (spec, slot) in enumerate(zip(prep.ref.outputs, self._out_slot)):
            if slot == 1 + n_in + k:
                o = np.empty(spec[0], dtype=spec[1] if spec[1] is not None else BFLOAT16_BITS)
                outs[k] = o
                slots[slot] = o.__array_interface__["data"][0]
            else:
                slots[1 + n_in + k] = 0
        slots[1 + n_in + len(m.outputs) :] = native.weight_slots
        status = np.zeros(4, dtype=np.int64)
        for seg in nat.segments:
            if seg.when and not seg.wanted(slots):
                continue
            if seg.ref is None:
                rc = native.run_segment(seg, slots, status, times)
                if rc:
                    raise self._error(seg.first_launch + int(status[0]), rc, status)
            else:
                st = prep.ref.step_of(seg.ref["node"])
                y = st.run([self._locate(i, nat, arrays, outs, arena) for i in st.inputs])
                np.copyto(self._locate(st.out, nat, arrays, outs, arena), y)
        for k, vid in enumerate(m.outputs):
            if outs[k] is None:  # an input, a weight or a repeated output: copy, never alias
                outs[k] = np.array(self._locate(vid, nat, arrays, outs, arena), order="C", copy=True)
        return outs  # type: ignore[return-value]

    def _locate(
        self, vid: int, nat: Prepared, arrays: Sequence[np.ndarray], outs: list[np.ndarray | None], arena: np.ndarray
    ) -> np.ndarray:
        m = self.m
        if vid in m.input_pos:
            return arrays[m.input_pos[vid]]
        if vid in m.weights:
            return m.weights[vid]
        for k, o in enumerate(m.outputs):
            if o == vid and outs[k] is not None:
                return outs[k]  # type: ignore[return-value]
        off, shape, dt = nat.buffer(vid)
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(arena, dtype=dt, count=count, offset=off).reshape(shape)

    def _error(self, launch: int, rc: int, status: np.ndarray) -> ExecutionError:
        code, value, size = int(status[1]), int(status[2]), int(status[3])
        lr = self._launches[launch] if 0 <= launch < len(self._launches) else {}
        if rc != 1 or lr.get("op") != "kernel":
            return ExecutionError(f"native launch {launch} failed (code {rc}); the artifact may be corrupt")
        return index_error(self._kernels[lr["k"]], code, value, size)
