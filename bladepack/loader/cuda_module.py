"""The CUDA executor: tensors in and out, the stream, reference steps, errors.

In: a `Manifest`, the artifact, the reference executor (for the steps the plan leaves to numpy) and
a device ordinal. Out: `CudaExecutor` (the `Executor` contract of executor.py). Inputs:
- device tensors (torch, CuPy, JAX: anything with `__dlpack__` on a CUDA device) are read in place
  through DLPack (non-contiguous torch tensors are made contiguous first); with torch tensors the work
  runs on torch's current stream of that device, and the outputs are torch tensors made by torch's
  caching allocator (torch is already imported by the caller; this module never imports it);
- other device tensors give `DeviceTensor` outputs (DLPack exporters owning driver memory);
- host arrays (numpy, CPU tensors) are copied to the device and the outputs come back as numpy arrays
  (the call waits for the device).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.artifact.format import BpkFile
from bladepack.artifact.writer import weight_section_name
from bladepack.dtypes import DType
from bladepack.errors import ExecutionError, InputError
from bladepack.loader.cuda_driver import CudaUnavailable, DeviceBuffer
from bladepack.loader.cuda_graphs import DEFAULT_GRAPHS, CudaGraphs, Replay, stage_pays
from bladepack.loader.dlpack import KDL_CUDA, KDL_CUDA_MANAGED, Exported, Imported, import_tensor
from bladepack.loader.executor import ShapeCache
from bladepack.loader.manifest import Key, Manifest, index_error
from bladepack.loader.native_cuda import KERNEL_SHIFT, CudaPrepared, NativeCuda
from bladepack.loader.plan_check import (
    INT64_MAX,
    check_launches,
    check_operand_programs,
    check_plan,
    operand_programs,
)
from bladepack.loader.reference_executor import ReferenceExecutor, RefPrepared
from bladepack.loader.signature import check_inputs
from bladepack.loader.tensors import is_torch_tensor, resolve_views, to_numpy
from bladepack.options import LoaderOptions

_ALIGN = 256


def parse_device(device: str) -> tuple[str, int]:
    """("cpu", 0) or ("cuda", ordinal) from "cpu", "cuda", "cuda:N"."""
    if device == "cpu":
        return "cpu", 0
    if device == "cuda":
        return "cuda", 0
    if device.startswith("cuda:") and device[5:].isdigit():
        return "cuda", int(device[5:])
    raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {device!r}")


@dataclass(frozen=True)
class _Dtype:
    name: str


@dataclass(frozen=True)
class _Meta:
    """What check_inputs reads of an input (shape and dtype), for device tensors."""

    shape: tuple[int, ...]
    dtype: _Dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)


class DeviceTensor(Exported):
    """A result in device memory owned by bladepack; take it with `torch.from_dlpack`, `cupy.from_dlpack`."""


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * DType(dtype).itemsize


def _round(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class Prepared:
    ref: RefPrepared  # registers, output shapes, and the steps run on the host
    cuda: CudaPrepared


class CudaExecutor:
    def __init__(
        self,
        m: Manifest,
        bpk: BpkFile,
        reference: ReferenceExecutor,
        ordinal: int,
        cache_limit: int,
        options: LoaderOptions,
        graphs: int = DEFAULT_GRAPHS,
    ) -> None:
        """`graphs`: CUDA graphs kept per caller stream (Note [CUDA graphs] in loader/cuda_graphs.py);
        0 turns them off; `options`: where the libraries are found and kept."""
        native = m.native["cuda"]
        if native is None:
            raise CudaUnavailable(
                f"{bpk.source} has no CUDA kernels; optimize it with targets=('cpu', 'cuda') to run it on a GPU"
            )
        self.m = m
        self.reference = reference
        self.ordinal = ordinal
        kernels = m.kernels["cuda"]
        check_plan(m, "cuda", None)  # Note [Plan checks]: before anything is launched
        self.operand_checks = operand_programs(m)
        self.kernels = kernels
        self.n_in = len(m.input_ids)
        self.out_slot = list(native["outputs"])
        first_weight = 1 + self.n_in + len(self.out_slot)
        self.weight_slot = {w["id"]: first_weight + k for k, w in enumerate(m.weight_rows)}
        self.n_slots = first_weight + len(self.weight_slot)  # then one more: the stream's status words
        self.exe = NativeCuda(bpk, native, kernels, ordinal, self.n_slots, options)
        self.exe.upload_weights([bpk.section(weight_section_name(w["name"])) for w in m.weight_rows])
        self.prepare = ShapeCache(self._build, cache_limit)
        self.graphs = CudaGraphs(self.exe.device, graphs) if graphs > 0 else None
        self._stream_locks: dict[int, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        # Note [Graph replay]: the dtypes a host array must have (None: no short path, bfloat16 inputs)
        in_types = [DType(t.dtype) for t in m.signature.inputs]
        self._replay_dtypes = (
            None if any(d.value == "bfloat16" for d in in_types) else tuple(np.dtype(d.to_numpy()) for d in in_types)
        )

    @property
    def description(self) -> str:
        info = self.exe.device.info
        return f"cuda ({self.exe.image} image on {info.name}, {info.arch})"

    def _build(self, key: Key) -> Prepared:
        ref = self.reference.build(key)
        slots = check_launches(self.m, "cuda", key, ref.registers, [s for s, _ in ref.outputs])
        if max(slots, default=0) <= INT64_MAX:  # else the call's memory check refuses it first
            check_operand_programs(self.m, self.operand_checks, ref.registers, slots)
        return Prepared(ref, self.exe.prepare(ref.registers))

    # -- inputs
    def _take(self, inputs: Sequence[Any], stream: int) -> tuple[list[Any], list[Imported], list[np.ndarray | None]]:
        """(metas, imported device tensors to release, host arrays or None per input)."""
        names = [t.name for t in self.m.signature.inputs]
        if len(inputs) != len(names):
            raise InputError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        metas: list[Any] = []
        held: list[Imported] = []
        hosts: list[np.ndarray | None] = []
        for x, name in zip(inputs, names):
            x = resolve_views(x, name)
            try:
                dev = x.__dlpack_device__() if hasattr(x, "__dlpack_device__") else None
            except (ValueError, TypeError, RuntimeError, BufferError) as e:
                raise InputError(f"input '{name}' could not be read through DLPack: {e}") from None
            if dev is not None and int(dev[0]) in (KDL_CUDA, KDL_CUDA_MANAGED):
                if int(dev[1]) != self.ordinal:
                    raise InputError(
                        f"input '{name}' is on cuda:{int(dev[1])}; this module runs on cuda:{self.ordinal}"
                    )
                imp = import_tensor(x, stream or 1)
                if not imp.view.contiguous:
                    imp.close()
                    if not hasattr(x, "contiguous"):
                        raise InputError(f"input '{name}' is not contiguous; pass a contiguous device tensor")
                    x = x.contiguous()
                    imp = import_tensor(x, stream or 1)
                held.append(imp)
                metas.append(_Meta(imp.view.shape, _Dtype(imp.view.dtype)))
                hosts.append(None)
            else:
                a = to_numpy(x, name)
                a = (
                    a
                    if a.flags.c_contiguous and a.dtype.isnative
                    else np.ascontiguousarray(a, a.dtype.newbyteorder("="))
                )
                metas.append(a)
                hosts.append(a)
        check_inputs(self.m.signature, metas)
        return metas, held, hosts

    # -- a call
    def _stream_lock(self, stream: int) -> threading.Lock:
        """Calls on one stream enqueue their work one at a time: the stream's arena and graph buffer
        are reused by the next call, which is safe only in stream order."""
        with self._locks_lock:
            lock = self._stream_locks.get(stream)
            if lock is None:
                lock = self._stream_locks[stream] = threading.Lock()
            return lock

    def run(self, inputs: Sequence[Any], outputs: Sequence[Any] | None) -> list[Any]:
        if outputs is None and self.graphs is not None and self._replay_dtypes is not None:
            fast = self._replay(inputs)
            if fast is not None:
                return fast
        torch = sys.modules.get("torch") if any(is_torch_tensor(x) for x in inputs) else None
        stream = int(torch.cuda.current_stream(self.ordinal).cuda_stream) if torch is not None else 0
        self.exe.device.activate()
        metas, held, hosts = self._take(inputs, stream)
        try:
            with self._stream_lock(stream):
                return self._run(metas, held, hosts, outputs, torch, stream)
        finally:
            for imp in held:
                imp.close()

    def _run(
        self,
        metas: list[Any],
        held: list[Imported],
        hosts: list[np.ndarray | None],
        outputs: Sequence[Any] | None,
        torch: Any,
        stream: int,
    ) -> list[Any]:
        m = self.m
        key = tuple(tuple(int(d) for d in meta.shape) for meta in metas)
        prep = self.prepare(key)
        cp = prep.cuda
        out_specs = [(shape, m.values[o]["dtype"]) for (shape, _), o in zip(prep.ref.outputs, m.outputs)]
        on_host = all(h is not None for h in hosts) and torch is None and not held
        if self.graphs is not None and not cp.no_graph:
            device_bytes = sum(_nbytes(imp.view.shape, imp.view.dtype) for imp in held)
            if torch is not None or held:  # the results are device tensors too
                device_bytes += sum(_nbytes(s, d) for s, d in out_specs)
            if stage_pays(device_bytes, len(cp.launches)):  # Note [Graph staging cost]
                return self._run_graph(key, prep, out_specs, held, hosts, outputs, torch, stream)
        # staging for host inputs and (host or non-torch) outputs, one buffer per call
        staging_bytes = sum(_round(h.nbytes) for h in hosts if h is not None)
        if torch is None:
            staging_bytes += sum(_round(_nbytes(s, d)) for s, d in out_specs)
        staging: DeviceBuffer | None = self.exe.alloc(staging_bytes) if staging_bytes else None
        cursor = staging.ptr if staging is not None else 0
        slots = np.zeros(self.n_slots + 1, dtype=np.uint64)
        slots[self.n_slots] = self.exe.status(stream)
        slots[0] = self.exe.arena(cp.arena_bytes, stream)
        dev_iter = iter(held)
        for k, h in enumerate(hosts):
            if h is None:
                slots[1 + k] = next(dev_iter).view.ptr
            else:
                slots[1 + k] = cursor
                self.exe.to_device(h, cursor, stream)
                cursor += _round(h.nbytes)
        results: list[Any] = []
        for k, (shape, dt) in enumerate(out_specs):
            if torch is not None:
                t = torch.empty(shape, dtype=getattr(torch, dt), device=f"cuda:{self.ordinal}")
                results.append(t)
                ptr = int(t.data_ptr())
            else:
                ptr = cursor
                cursor += _round(_nbytes(shape, dt))
                results.append(None)
            slots[1 + self.n_in + k] = ptr
        slots[1 + self.n_in + len(out_specs) : self.n_slots] = self.exe.weight_ptrs
        self.exe.run(cp, slots, stream, lambda node: self._reference(node, prep, slots, stream, key))
        # outputs that are inputs, weights or repeated outputs: device-to-device copies, never aliases
        for k, o in enumerate(m.outputs):
            if self.out_slot[k] != 1 + self.n_in + k:
                dst = int(slots[1 + self.n_in + k])
                self.exe.copy(self._locate(o, cp, slots), dst, _nbytes(*out_specs[k]), stream)
        self._check_status(stream)
        if torch is not None:
            return results if outputs is None else self._copy_out(results, outputs)
        if on_host:
            return self._to_host(slots, out_specs, outputs, stream)
        # device inputs of another framework: results stay on the device, owned by the staging buffer
        self.exe.synchronize(stream)
        return [
            DeviceTensor(int(slots[1 + self.n_in + k]), (KDL_CUDA, self.ordinal), dt, tuple(shape), staging)
            for k, (shape, dt) in enumerate(out_specs)
        ]

    def _run_graph(
        self,
        key: Key,
        prep: Prepared,
        out_specs: list[tuple[tuple[int, ...], str]],
        held: list[Imported],
        hosts: list[np.ndarray | None],
        outputs: Sequence[Any] | None,
        torch: Any,
        stream: int,
    ) -> list[Any]:
        """Note [CUDA graphs]: the call through the stream's graph buffer (arena, inputs, outputs)."""
        assert self.graphs is not None
        m, cp, exe = self.m, prep.cuda, self.exe
        ctx = self.graphs.context(stream)
        in_bytes = [h.nbytes if h is not None else 0 for h in hosts]
        dev_iter = iter(held)
        dev_src: list[int] = []
        for k, h in enumerate(hosts):
            if h is None:
                imp = next(dev_iter)
                in_bytes[k] = _nbytes(imp.view.shape, imp.view.dtype)
                dev_src.append(imp.view.ptr)
        at, cursor = [], _round(cp.arena_bytes)
        for n in [*in_bytes, *(_nbytes(s, d) for s, d in out_specs)]:
            at.append(cursor)
            cursor += _round(n)
        base = self.graphs.memory(ctx, cursor)
        slots = np.zeros(self.n_slots + 1, dtype=np.uint64)
        slots[0] = base
        slots[1 : 1 + len(at)] = [base + a for a in at]
        slots[1 + len(at) : self.n_slots] = exe.weight_ptrs
        slots[self.n_slots] = exe.status(stream)
        src_iter = iter(dev_src)
        for k, h in enumerate(hosts):  # the caller's tensors into the graph's buffer
            if h is not None:
                exe.to_device(h, int(slots[1 + k]), stream)
            else:
                exe.copy(next(src_iter), int(slots[1 + k]), in_bytes[k], stream)

        def refuse(node: int) -> None:
            raise AssertionError(f"step %{node} in a captured plan")  # graph_obstacle keeps these out

        entry = self.graphs.entry(ctx, key)
        if entry.exec is None and not entry.refused and entry.runs > 0:
            entry.exec = self.graphs.capture(lambda s: exe.run(cp, slots, s, refuse, workspace_stream=stream))
            entry.refused = entry.exec is None
        entry.runs += 1
        if entry.exec is not None:
            self.graphs.launch(entry.exec, stream)
        else:  # the first call of the signature on this stream, or a capture the driver refused
            exe.run(cp, slots, stream, refuse)
        copies = tuple(  # outputs that are inputs, weights or repeats: (source, destination, bytes)
            (self._locate(o, cp, slots), int(slots[1 + self.n_in + k]), _nbytes(*out_specs[k]))
            for k, o in enumerate(m.outputs)
            if self.out_slot[k] != 1 + self.n_in + k
        )
        for src, dst, n in copies:
            exe.copy(src, dst, n, stream)
        self._check_status(stream)
        if entry.exec is not None and entry.replay is None and torch is None and not held and stream == 0:
            entry.replay = Replay(
                tuple((int(slots[1 + k]), in_bytes[k]) for k in range(len(hosts))),
                copies,
                tuple(
                    (int(slots[1 + self.n_in + k]), tuple(shape), DType(dt).storage_numpy(), _nbytes(shape, dt))
                    for k, (shape, dt) in enumerate(out_specs)
                ),
                int(slots[self.n_slots]) if exe.checks_errors else 0,
            )
            self.graphs.note_memory(ctx, entry)
        return self._results(slots, out_specs, outputs, torch, stream, held)

    def _replay(self, inputs: Sequence[Any]) -> list[np.ndarray] | None:
        """Note [Graph replay]: None when this call must take the full path."""
        assert self.graphs is not None and self._replay_dtypes is not None
        ctx = self.graphs.peek(0)
        if ctx is None or len(inputs) != len(self._replay_dtypes):
            return None
        shapes = []
        for x, dt in zip(inputs, self._replay_dtypes):
            if type(x) is not np.ndarray or x.dtype != dt or not x.flags.c_contiguous:
                return None
            shapes.append(x.shape)
        key = tuple(shapes)
        with self._stream_lock(0):
            entry = ctx.graphs.get(key)
            if entry is None or entry.replay is None or self.graphs.memory_changed(ctx, entry):
                return None
            ctx.graphs.move_to_end(key)
            r = entry.replay
            exe = self.exe
            drv, stream, ok = exe._drv, exe.null_stream, exe._drv.CUresult.CUDA_SUCCESS
            errs = [drv.cuMemcpyHtoDAsync(addr, x.ctypes.data, n, stream)[0] for x, (addr, n) in zip(inputs, r.inputs)]
            errs.append(drv.cuGraphLaunch(entry.exec, stream)[0])
            errs += [drv.cuMemcpyDtoDAsync(dst, src, n, stream)[0] for src, dst, n in r.copies]
            outs = []
            for addr, shape, dt, n in r.outputs:
                a = np.empty(shape, dtype=dt)
                errs.append(drv.cuMemcpyDtoHAsync(a.ctypes.data, addr, n, stream)[0])
                outs.append(a)
            status = np.zeros(1, dtype=np.int64)
            if r.status:
                errs.append(drv.cuMemcpyDtoHAsync(status.ctypes.data, r.status, 8, stream)[0])
            errs.append(drv.cuStreamSynchronize(stream)[0])
            if any(e != ok for e in errs) or status[0]:
                return None  # the full path runs the call again and raises the detailed error
            return outs

    def _check_status(self, stream: int) -> None:
        if self.exe.checks_errors:
            code, value, size = self.exe.read_status(stream)
            if code:
                k = code >> KERNEL_SHIFT
                row = self.kernels[k] if 0 <= k < len(self.kernels) else {"name": "?", "errors": []}
                raise index_error(row, code & ((1 << KERNEL_SHIFT) - 1), value, size)

    def _results(
        self,
        slots: np.ndarray,
        out_specs: list[tuple[tuple[int, ...], str]],
        outputs: Sequence[Any] | None,
        torch: Any,
        stream: int,
        held: list[Imported],
    ) -> list[Any]:
        """The results, copied out of the graph buffer: torch tensors (device to device, on the
        stream), numpy arrays (host inputs) or DeviceTensors owning a fresh device buffer."""
        exe, n_in = self.exe, self.n_in
        src = [int(slots[1 + n_in + k]) for k in range(len(out_specs))]
        if torch is not None:
            results = []
            for (shape, dt), ptr in zip(out_specs, src):
                t = torch.empty(shape, dtype=getattr(torch, dt), device=f"cuda:{self.ordinal}")
                exe.copy(ptr, int(t.data_ptr()), _nbytes(shape, dt), stream)
                results.append(t)
            return results if outputs is None else self._copy_out(results, outputs)
        if not held:
            return self._to_host(slots, out_specs, outputs, stream)
        sizes = [_round(_nbytes(s, d)) for s, d in out_specs]
        owner = exe.alloc(max(sum(sizes), 1))
        results, cursor = [], owner.ptr
        for (shape, dt), ptr, n in zip(out_specs, src, sizes):
            exe.copy(ptr, cursor, _nbytes(shape, dt), stream)
            results.append(DeviceTensor(cursor, (KDL_CUDA, self.ordinal), dt, tuple(shape), owner))
            cursor += n
        exe.synchronize(stream)
        return results

    def _to_host(
        self,
        slots: np.ndarray,
        out_specs: list[tuple[tuple[int, ...], str]],
        outputs: Sequence[Any] | None,
        stream: int,
    ) -> list[Any]:
        """The outputs in their slots copied to numpy arrays (the call waits for the stream)."""
        host_out = []
        for k, (shape, dt) in enumerate(out_specs):
            a = np.empty(shape, dtype=DType(dt).storage_numpy())  # Note [bfloat16 on the host]
            self.exe.to_host(int(slots[1 + self.n_in + k]), a, stream)
            host_out.append(a)
        self.exe.synchronize(stream)
        return host_out if outputs is None else self._copy_out(host_out, outputs)

    def _copy_out(self, results: list[Any], outputs: Sequence[Any]) -> list[Any]:
        if len(outputs) != len(results):
            raise InputError(f"expected {len(results)} output buffers, got {len(outputs)}")
        for spec, buf, r in zip(self.m.signature.outputs, outputs, results):
            if tuple(buf.shape) != tuple(r.shape) or str(buf.dtype).split(".")[-1] != str(r.dtype).split(".")[-1]:
                raise InputError(
                    f"output buffer '{spec.name}' is {buf.dtype}{list(buf.shape)}; the result is {r.dtype}{list(r.shape)}"
                )
            buf.copy_(r) if hasattr(buf, "copy_") else np.copyto(buf, r)
        return list(outputs)

    # -- reference steps and value locations
    def _locate(self, vid: int, cp: CudaPrepared, slots: np.ndarray) -> int:
        """Device address of value `vid` during a call."""
        m = self.m
        if vid in m.input_pos:
            return int(slots[1 + m.input_pos[vid]])
        if vid in self.weight_slot:
            return int(slots[self.weight_slot[vid]])
        for k, o in enumerate(m.outputs):
            if o == vid and self.out_slot[k] == 1 + self.n_in + k:
                return int(slots[1 + self.n_in + k])
        off = cp.buffers[vid][0]
        return int(slots[0]) + off

    def _reference(self, node: int, prep: Prepared, slots: np.ndarray, stream: int, key: Key) -> None:
        """Run reference step `node` on the host: operands down, numpy, result up."""
        m, cp = self.m, prep.cuda
        st = prep.ref.step_of(m, node)
        xs: list[np.ndarray] = []
        try:
            for i in st.inputs:
                if i in m.weights:
                    xs.append(m.weights[i])
                    continue
                if i in m.input_pos:
                    pos = m.input_pos[i]
                    shape: tuple[int, ...] = key[pos]
                    dt = DType(m.signature.inputs[pos].dtype).to_numpy()
                else:
                    shape = m.shape(m.values[i]["shape"], prep.ref.registers)
                    dt = DType(m.values[i]["dtype"]).to_numpy()
                a = np.empty(shape, dtype=dt)
                self.exe.to_host(self._locate(i, cp, slots), a, stream)
                xs.append(a)
        except TypeError as e:  # a bfloat16 operand: numpy has no such type
            raise ExecutionError(f"step {st.op} -> %{st.out} failed: {e} (from {st.loc or 'unknown source'})") from None
        self.exe.synchronize(stream)
        y = np.ascontiguousarray(st.run(xs), dtype=st.dtype)
        self.exe.to_device(y, self._locate(st.out, cp, slots), stream)
        self.exe.synchronize(stream)  # `y` is freed on return
