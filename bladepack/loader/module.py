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
import warnings
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
from bladepack.loader.cuda_module import CudaPath, parse_device
from bladepack.loader.fast_call import FastCalls
from bladepack.loader.native_cpu import NativeCpu, NativeUnavailable, Prepared
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
    dtype: np.dtype | None  # None: bfloat16 (no numpy type; only the CUDA path meets it)
    free: tuple[int, ...]  # values whose last reader is this step
    loc: str

    def run(self, xs: Sequence[np.ndarray]) -> np.ndarray:
        """The step's result from its operands, or ExecutionError naming the step and its source."""
        where = f"(from {self.loc or 'unknown source'})"
        if self.dtype is None:
            raise ExecutionError(f"step {self.op} -> %{self.out} computes in bfloat16, which numpy cannot {where}")
        try:
            y = self.impl(xs, self.attrs, self.shape, self.dtype)
        except (IndexError, ValueError, FloatingPointError) as e:
            raise ExecutionError(f"step {self.op} -> %{self.out} failed: {e} {where}") from None
        if y.shape != self.shape:
            raise ExecutionError(
                f"step {self.op} -> %{self.out} produced shape {y.shape}, the plan says {self.shape} {where}"
            )
        return y


@dataclass(frozen=True)
class _Prepared:
    registers: tuple[int, ...]
    steps: tuple[_Step, ...]
    native: Prepared | None = None
    outputs: tuple[tuple[tuple[int, ...], np.dtype | None], ...] = ()  # shape and dtype of each output
    cuda: Any = None  # CudaPrepared on a CUDA device


EXECUTORS = ("auto", "native", "reference")


def _host_dtype(name: str) -> np.dtype | None:
    """The numpy dtype of a value, None for bfloat16 (the CPU executors refuse bfloat16 artifacts at
    load; the CUDA path keeps such values on the device and reads dtypes by name)."""
    return None if name == "bfloat16" else DType(name).to_numpy()


def _resolve(v: Any, regs: Sequence[int]) -> Any:
    if isinstance(v, dict) and set(v) == {"r"}:
        return regs[v["r"]]
    if isinstance(v, list):
        return [_resolve(x, regs) for x in v]
    return v


class LoadedModule:
    """A loaded artifact. `executor`: "auto" runs the generated CPU kernels when the artifact has a
    library for this CPU (else warns and uses the reference executor), "native" insists on them,
    "reference" runs the numpy reference executor (the oracle)."""

    def __init__(self, bpk: BpkFile, device: str = "cpu", executor: str = "auto") -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        kind, ordinal = parse_device(device)
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
        self._input_pos_all = {vid: k for k, vid in enumerate(self._input_ids)}
        self._step_index = {s["out"]: k for k, s in enumerate(self._steps)}
        self._cuda: CudaPath | None = None
        self._cache: dict[tuple[tuple[int, ...], ...], _Prepared] = {}
        self._lock = threading.Lock()
        self._native: NativeCpu | None = None
        self._fast: FastCalls | None = None  # Note [Fast path] in fast_call.py
        # launches index the kernel rows of their own target, in manifest order
        self._kernels: list[dict[str, Any]] = [k for k in m.get("kernels", ()) if k.get("target", "cpu") == "cpu"]
        native = m.get("native_cpu")
        if kind == "cpu" and any(v["dtype"] == "bfloat16" for v in [*m["values"], *m["weights"], *m["inputs"]]):
            raise ValueError(
                f"{bpk.source} computes in bfloat16, which has no CPU kernels or numpy type; load it with device='cuda'"
            )
        if kind == "cuda":
            if executor == "reference":
                raise ValueError("executor='reference' runs on the CPU; load with device='cpu'")
            self._cuda = CudaPath(self, bpk, m, ordinal)
            native = None
        elif executor != "reference" and native is not None:
            try:
                self._native = NativeCpu(bpk, native, [self._weights[w["id"]] for w in m["weights"]])
            except NativeUnavailable as e:
                if executor == "native":
                    raise
                warnings.warn(f"bladepack: {e}; running on the reference executor", RuntimeWarning, stacklevel=3)
        elif executor == "native":
            raise NativeUnavailable(f"{bpk.source} has no CPU kernel library (it was built without a C++ compiler)")
        if self._native is not None and native is not None:
            self._input_pos = {vid: k for k, vid in enumerate(self._input_ids)}
            self._out_slot = list(native["outputs"])
            self._n_slots = 1 + len(self._input_ids) + len(self._outputs) + len(m["weights"])
            self._launches = native["launches"]
            self._step_of = {s["out"]: k for k, s in enumerate(self._steps)}  # reference step per value
            in_place = all(slot == 1 + len(self._input_ids) + k for k, slot in enumerate(self._out_slot))
            try:
                if in_place:
                    self._fast = FastCalls(
                        self._native,
                        [DType(t.dtype).to_numpy() for t in self.signature.inputs],
                        [DType(self._values[o]["dtype"]).to_numpy() for o in self._outputs],
                        self._n_slots,
                    )
            except TypeError:  # a bfloat16 input or output: no numpy dtype, so the full path only
                self._fast = None

    @property
    def executor(self) -> str:
        """ "native (<isa>)", "cuda (<image> on <device>)" or "reference": what runs this module's steps."""
        if self._cuda is not None:
            info = self._cuda.exe.device.info
            return f"cuda ({self._cuda.exe.image} image on {info.name}, {info.arch})"
        return f"native ({self._native.isa})" if self._native is not None else "reference"

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
        # bfloat16 has no numpy dtype: its bits are kept as uint16 (only the CUDA path reads them; the
        # host executors refuse bfloat16 at load, see __init__)
        dt = np.dtype(np.uint16) if w["dtype"] == "bfloat16" else DType(w["dtype"]).to_numpy()
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
        outs = self.run(args)
        return tuple(outs) if self._tuple or len(outs) != 1 else outs[0]

    def run(self, inputs: Sequence[Any], outputs: Sequence[Any] | None = None) -> list[Any]:
        """Run on a list of inputs; with `outputs`, results are also copied into those arrays."""
        if self._cuda is not None:
            return self._cuda.run(inputs, outputs)
        if outputs is None and self._fast is not None:
            fast = self._fast(inputs)
            if fast is not None:
                return fast
        names = [t.name for t in self.signature.inputs]
        if len(inputs) != len(names):
            raise InputError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        as_torch = any(is_torch_tensor(x) for x in inputs)
        arrays = [to_numpy(x, n) for x, n in zip(inputs, names)]
        check_inputs(self.signature, arrays)
        results = self._execute(arrays)
        if self._fast is not None:
            key = tuple(a.shape for a in arrays)
            prep = self._cache[key]
            if prep.native is not None:
                self._fast.add(key, prep.native, [s for s, _ in prep.outputs])
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
                    _host_dtype(v["dtype"]),
                    free,
                    s.get("loc", ""),
                )
            )
        out_specs = tuple(
            (self._shape(self._values[o]["shape"], regs), _host_dtype(self._values[o]["dtype"]))
            if o in self._values
            else ((), np.dtype(np.float32))
            for o in self._outputs
        )
        native = self._native.prepare(regs, self._kernels) if self._native is not None else None
        cuda = self._cuda.exe.prepare(regs) if self._cuda is not None else None
        prep = _Prepared(regs, tuple(steps), native, out_specs, cuda)
        with self._lock:
            return self._cache.setdefault(key, prep)

    def _execute(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        prep = self._prepare(tuple(a.shape for a in arrays))
        if prep.native is not None:
            return self._execute_native(prep, prep.native, arrays)
        env: dict[int, np.ndarray] = dict(self._weights)
        env.update(zip(self._input_ids, arrays))
        for st in prep.steps:
            env[st.out] = st.run([env[i] for i in st.inputs])
            for i in st.free:
                del env[i]
        outs, seen = [], set()
        for o in self._outputs:
            a = env[o]
            # An output that is an input, a weight or an earlier output must not alias it.
            outs.append(np.array(a, order="C") if o in seen or o not in self._values else export_array(a))
            seen.add(o)
        return outs

    # -- native execution
    def profile(self, *args: Any, repeat: int = 10) -> list[dict[str, Any]]:
        """Per-launch median wall time (µs) at these inputs: one row per kernel, GEMM or reference step,
        with what it computes and where it came from. Native executor only."""
        if self._native is None:
            raise ValueError("profile() needs the native executor; this module runs on the reference executor")
        arrays = [to_numpy(x, t.name) for x, t in zip(args, self.signature.inputs)]
        check_inputs(self.signature, arrays)
        times = np.zeros((repeat, len(self._launches)), dtype=np.int64)
        for r in range(repeat):
            prep = self._prepare(tuple(a.shape for a in arrays))
            assert prep.native is not None
            self._execute_native(prep, prep.native, arrays, times[r])
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

    def _execute_native(
        self, prep: _Prepared, nat: Prepared, arrays: Sequence[np.ndarray], times: np.ndarray | None = None
    ) -> list[np.ndarray]:
        native = self._native
        assert native is not None
        arrays = [
            a if a.flags.c_contiguous and a.dtype.isnative else np.ascontiguousarray(a, a.dtype.newbyteorder("="))
            for a in arrays
        ]
        n_in = len(arrays)
        outs: list[np.ndarray | None] = [None] * len(self._outputs)
        slots = np.empty(self._n_slots, dtype=np.uint64)
        buf, base = native.arena(nat.arena_bytes)
        skew = base - int(buf.ctypes.data)
        arena = buf
        slots[0] = base
        for k, a in enumerate(arrays):
            slots[1 + k] = a.__array_interface__["data"][0]
        for k, (spec, slot) in enumerate(zip(prep.outputs, self._out_slot)):
            if slot == 1 + n_in + k:
                o = np.empty(spec[0], dtype=spec[1])
                outs[k] = o
                slots[slot] = o.__array_interface__["data"][0]
            else:
                slots[1 + n_in + k] = 0
        slots[1 + n_in + len(self._outputs) :] = native.weight_slots
        status = np.zeros(4, dtype=np.int64)
        for seg in nat.segments:
            if seg.ref is None:
                rc = native.run_segment(seg, slots, status, times)
                if rc:
                    raise self._native_error(seg.first_launch + int(status[0]), rc, status)
            else:
                self._run_ref(prep, nat, seg.ref, arrays, outs, arena[skew:])
        for k, o in enumerate(self._outputs):
            if outs[k] is None:  # an input, a weight or a repeated output: copy, never alias
                outs[k] = np.array(self._locate(o, prep, nat, arrays, outs, arena[skew:]), order="C", copy=True)
        return outs  # type: ignore[return-value]

    def _locate(
        self,
        vid: int,
        prep: _Prepared,
        nat: Prepared,
        arrays: Sequence[np.ndarray],
        outs: list[np.ndarray | None],
        arena: np.ndarray,
    ) -> np.ndarray:
        if vid in self._input_pos:
            return arrays[self._input_pos[vid]]
        if vid in self._weights:
            return self._weights[vid]
        for k, o in enumerate(self._outputs):
            if o == vid and outs[k] is not None:
                return outs[k]  # type: ignore[return-value]
        off, shape, dt = nat.buffers[vid]
        count = int(np.prod(shape, dtype=np.int64))
        return np.frombuffer(arena, dtype=dt, count=count, offset=off).reshape(shape)

    def _run_ref(
        self,
        prep: _Prepared,
        nat: Prepared,
        launch: dict[str, Any],
        arrays: Sequence[np.ndarray],
        outs: list[np.ndarray | None],
        arena: np.ndarray,
    ) -> None:
        st = prep.steps[self._step_of[launch["node"]]]
        y = st.run([self._locate(i, prep, nat, arrays, outs, arena) for i in st.inputs])
        np.copyto(self._locate(st.out, prep, nat, arrays, outs, arena), y)

    def _native_error(self, launch: int, rc: int, status: np.ndarray) -> ExecutionError:
        code, value, size = int(status[1]), int(status[2]), int(status[3])
        lr = self._launches[launch] if 0 <= launch < len(self._launches) else {}
        if rc != 1 or lr.get("op") != "kernel":
            return ExecutionError(f"native launch {launch} failed (code {rc}); the artifact may be corrupt")
        return index_error(self._kernels[lr["k"]], code, value, size)


def index_error(k: dict[str, Any], code: int, value: int, size: int) -> ExecutionError:
    """The error a kernel (row `k`) reported through its status words (ERR_INDEX + 16 x site)."""
    site = (code - 1) // 16
    what = k["errors"][site] if 0 <= site < len(k["errors"]) else "an index"
    return ExecutionError(
        f"index out of range in {what}: {value} is not in [-{size}, {size - 1}] "
        f"(kernel {k['name']}, from {k.get('loc') or 'unknown source'})"
    )
