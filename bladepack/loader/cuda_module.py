"""The CUDA executor: tensors in and out, the stream, reference steps, errors.

In: a `Manifest`, the artifact, the reference executor (for the steps the plan leaves to numpy) and
a device ordinal. Out: `CudaExecutor` (the `Executor` contract of executor.py). Inputs:
- torch CUDA tensors are read in place (non-contiguous ones are made contiguous first); the work runs
  on torch's current stream of that device, and the outputs are torch tensors made by torch's caching
  allocator (torch is already imported by the caller; this module never imports it);
- `__cuda_array_interface__` objects (CuPy, Numba) are read in place and the work runs on their
  stream; other device tensors (JAX, anything with `__dlpack__` on a CUDA device) are read through
  DLPack on the legacy default stream; both give `DeviceTensor` outputs (pooled device memory,
  exported through DLPack and the CUDA array interface);
- host arrays (numpy, CPU tensors) are copied to the device and the outputs come back as numpy arrays
  (the call waits for the device).
At a repeated signature with CUDA graphs, each kind takes a replay path (Note [Framework replay]).

Note [First calls on the device]: a signature's first call on a stream can replay nothing, and a
decode loop makes every call one (its cache is one token longer each time). Such a call with device
tensors used to go the full way: a DLPack capsule per input (~10 µs each for torch's `__dlpack__`),
then staging — each input copied into the stream's graph buffer, which grew (an allocation, a free and
a wait) whenever the signature was the largest yet, the launches run uncaptured on those copies, each
output copied out — work done only so that a second call could capture a graph at the same addresses.
Now the replay paths' readers (torch's `data_ptr` and shape, a CAI dict, one capsule for other DLPack
producers) hand an unseen signature straight to `_device_call`: the input ranks and static dims
checked (anything else wrong goes the full path, which explains), then the launches on the caller's
tensors in place, outputs from the caller's framework, nothing staged, the graph buffer untouched —
and the run counted, so the signature's second call is captured as before (Note [CUDA graphs]; its
buffer growth, if any, happens there). The signature's preparation is compiled (Note [Compiled CUDA
preparation] in cuda_prepare.py). Host arrays keep the staged first run: their copies happen anyway,
and in place they would need a device allocation per call.

Note [Device errors] (device_errors.py): index errors are raised without a wait per call.
"""

from __future__ import annotations

import math
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
from bladepack.loader.cuda_prepare import CudaPreparation
from bladepack.loader.cuda_replay import ReplayPaths, nbytes, round_up
from bladepack.loader.device_errors import DeviceErrors
from bladepack.loader.device_inputs import (
    CaiView,
    OutputPool,
    TorchKind,
    cai_stream,
    cai_view,
    typestr,
)
from bladepack.loader.dlpack import KDL_CUDA, KDL_CUDA_MANAGED, Imported, import_tensor
from bladepack.loader.executor import ShapeCache
from bladepack.loader.manifest import Key, Manifest
from bladepack.loader.native_cuda import CudaPrepared, NativeCuda
from bladepack.loader.plan_check import check_plan, operand_programs
from bladepack.loader.reference_executor import ReferenceExecutor, RefPrepared
from bladepack.loader.signature import check_inputs
from bladepack.loader.tensors import is_torch_tensor, resolve_views, to_numpy
from bladepack.options import LoaderOptions


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


@dataclass(frozen=True)
class Prepared:
    ref: RefPrepared  # registers, output shapes, and the steps run on the host
    cuda: CudaPrepared


class CudaExecutor(ReplayPaths):
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
        0 turns them off; `options`: where the libraries are found and kept, strict error checks."""
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
        self.kernels = kernels
        self._ref_nodes = m.reference_nodes("cuda")
        self.n_in = len(m.input_ids)
        self.out_slot = list(native["outputs"])
        first_weight = 1 + self.n_in + len(self.out_slot)
        self.weight_slot = {w["id"]: first_weight + k for k, w in enumerate(m.weight_rows)}
        self.n_slots = first_weight + len(self.weight_slot)  # then one more: the stream's status words
        self.exe = NativeCuda(bpk, native, kernels, ordinal, self.n_slots, options)
        self.exe.upload_weights([bpk.section(weight_section_name(w["name"])) for w in m.weight_rows])
        # Note [Compiled CUDA preparation]: the launch checks, the kernels' operand checks and the launches
        self._prepare_signature = CudaPreparation(
            m, self.exe.params, operand_programs(m), self.exe.cutlass, self.exe.cublaslt
        )
        self.prepare = ShapeCache(self._build, cache_limit)
        self.graphs = CudaGraphs(self.exe.device, graphs) if graphs > 0 else None
        self._stream_locks: dict[int, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._in_dtypes = [t.dtype for t in m.signature.inputs]
        self._out_dtypes = [m.values[o]["dtype"] for o in m.outputs]
        # Note [Graph replay]: the dtypes a host array must have (None: no short path, bfloat16 inputs)
        in_types = [DType(d) for d in self._in_dtypes]
        self._replay_dtypes = (
            None if any(d.value == "bfloat16" for d in in_types) else tuple(np.dtype(d.to_numpy()) for d in in_types)
        )
        self._typestrs = tuple(typestr(d) for d in self._in_dtypes)
        self._in_sizes = tuple(DType(d).itemsize for d in self._in_dtypes)
        self._static = tuple(
            (len(t.shape), tuple((axis, d) for axis, d in enumerate(t.shape) if isinstance(d, int)))
            for t in m.signature.inputs
        )
        self._torch: TorchKind | None = None  # the caller's torch, once a call passed torch tensors
        self._pool = OutputPool(self.exe.device)
        self.errors = DeviceErrors(self, self.exe, kernels)  # Note [Device errors]
        self._closed = False

    @property
    def description(self) -> str:
        info = self.exe.device.info
        return f"cuda ({self.exe.image} image on {info.name}, {info.arch})"

    def _build(self, key: Key) -> Prepared:
        ref = self.reference.build(key, self._ref_nodes)
        _, cuda = self._prepare_signature(key, ref.registers, [s for s, _ in ref.outputs])
        return Prepared(ref, cuda)

    # -- inputs
    def _take(
        self, inputs: Sequence[Any], stream: int
    ) -> tuple[list[Any], list[tuple[int, int] | None], list[Imported], list[np.ndarray | None]]:
        """(metas, per input its device (address, bytes) or None, imported tensors to release, per
        input its host array or None)."""
        names = [t.name for t in self.m.signature.inputs]
        if len(inputs) != len(names):
            raise InputError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
        metas: list[Any] = []
        devs: list[tuple[int, int] | None] = []
        held: list[Imported] = []
        hosts: list[np.ndarray | None] = []
        for x, name in zip(inputs, names):
            x = resolve_views(x, name)
            cai = None if is_torch_tensor(x) else getattr(x, "__cuda_array_interface__", None)
            if cai is not None:
                try:
                    view: CaiView | Any = cai_view(cai, name)
                except (ValueError, KeyError, TypeError) as e:
                    raise InputError(
                        f"input '{name}' could not be read through __cuda_array_interface__: {e}"
                    ) from None
                metas.append(_Meta(view.shape, _Dtype(view.dtype)))
                devs.append((view.ptr, nbytes(view.shape, view.dtype)))
                hosts.append(None)
                continue
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
                devs.append((imp.view.ptr, nbytes(imp.view.shape, imp.view.dtype)))
                hosts.append(None)
            else:
                a = to_numpy(x, name)
                a = (
                    a
                    if a.flags.c_contiguous and a.dtype.isnative
                    else np.ascontiguousarray(a, a.dtype.newbyteorder("="))
                )
                metas.append(a)
                devs.append(None)
                hosts.append(a)
        check_inputs(self.m.signature, metas)
        return metas, devs, held, hosts

    def _stream_of(self, inputs: Sequence[Any]) -> tuple[int, Any]:
        """(the stream a call runs on, the caller's torch module or None): torch's current stream when
        an input is a torch tensor, else the first CAI input's stream, else the legacy default stream."""
        if any(is_torch_tensor(x) for x in inputs):
            torch = sys.modules.get("torch")
            if self._torch is None and torch is not None:
                self._torch = TorchKind(torch, self._in_dtypes, self._out_dtypes, self.ordinal)
            return (self._torch.stream(self.ordinal) if self._torch is not None else 0), torch
        for x in inputs:
            cai = getattr(x, "__cuda_array_interface__", None)
            if isinstance(cai, dict):
                return cai_stream(cai.get("stream")), None
        return 0, None

    # -- a call
    def run(self, inputs: Sequence[Any], outputs: Sequence[Any] | None) -> list[Any]:
        if self._closed:
            raise ExecutionError("this module was closed; load the artifact again to run it")
        if outputs is None and self.graphs is not None and len(inputs) == self.n_in and self.n_in:
            fast = self._fast(inputs)
            if fast is not None:
                return fast
        stream, torch = self._stream_of(inputs)
        self.exe.device.activate()
        metas, devs, held, hosts = self._take(inputs, stream)
        try:
            with self._stream_lock(stream):
                self.errors.raise_reported(stream, "when this call began (it did not run)")
                key = tuple(tuple(int(d) for d in meta.shape) for meta in metas)
                return self._run(key, devs, hosts, outputs, torch, stream)
        finally:
            for imp in held:
                imp.close()

    def _device_call(self, stream: int, key: Key, ptrs: Sequence[int], torch: Any) -> list[Any] | None:
        """Note [First calls on the device]: device inputs at `ptrs` whose signature has no replay yet,
        run in place; None when an input's rank or a static dim is wrong (the full path explains)."""
        for shape, (rank, static) in zip(key, self._static):
            if len(shape) != rank or any(shape[axis] != size for axis, size in static):
                return None
        devs: list[tuple[int, int] | None] = [(p, math.prod(s) * size) for p, s, size in zip(ptrs, key, self._in_sizes)]
        self.exe.device.activate()
        with self._stream_lock(stream):
            self.errors.raise_reported(stream, "when this call began (it did not run)")
            return self._run(key, devs, [None] * len(devs), None, torch, stream)

    def _run(
        self,
        key: Key,
        devs: list[tuple[int, int] | None],
        hosts: list[np.ndarray | None],
        outputs: Sequence[Any] | None,
        torch: Any,
        stream: int,
    ) -> list[Any]:
        m = self.m
        prep = self.prepare(key)
        cp = prep.cuda
        out_specs = [(shape, m.values[o]["dtype"]) for (shape, _), o in zip(prep.ref.outputs, m.outputs)]
        device_out = torch is not None or any(d is not None for d in devs)  # the results stay on the device
        if self.graphs is not None and not cp.no_graph:
            device_bytes = sum(d[1] for d in devs if d is not None)
            if device_out:
                device_bytes += sum(nbytes(s, d) for s, d in out_specs)
            # Note [Graph staging cost]; Note [First calls on the device]: a device call's first run of a
            # signature on a stream is never staged (no graph can exist yet), only counted
            if stage_pays(device_bytes, len(cp.launches)) and (
                not device_out or any(h is not None for h in hosts) or not self.graphs.first_run(stream, key)
            ):
                return self._run_graph(key, prep, out_specs, devs, hosts, outputs, torch, stream)
        # staging for host inputs and host outputs, one buffer per call
        staging_bytes = sum(round_up(h.nbytes) for h in hosts if h is not None)
        if not device_out:
            staging_bytes += sum(round_up(nbytes(s, d)) for s, d in out_specs)
        staging: DeviceBuffer | None = self.exe.alloc(staging_bytes) if staging_bytes else None
        cursor = staging.ptr if staging is not None else 0
        slots = np.zeros(self.n_slots + 1, dtype=np.uint64)
        slots[self.n_slots] = self.exe.status(stream)
        slots[0] = self.exe.arena(cp.arena_bytes, stream)
        for k, h in enumerate(hosts):
            if h is None:
                slots[1 + k] = devs[k][0]  # type: ignore[index]
            else:
                slots[1 + k] = cursor
                self.exe.to_device(h, cursor, stream)
                cursor += round_up(h.nbytes)
        results: list[Any] = []
        if device_out:
            results, ptrs = self._new_outputs(out_specs, torch, stream)
        else:
            ptrs = []
            for shape, dt in out_specs:
                ptrs.append(cursor)
                cursor += round_up(nbytes(shape, dt))
        slots[1 + self.n_in : 1 + self.n_in + len(out_specs)] = ptrs
        slots[1 + self.n_in + len(out_specs) : self.n_slots] = self.exe.weight_ptrs
        self.exe.run(cp, slots, stream, lambda node: self._reference(node, prep, slots, stream, key))
        # outputs that are inputs, weights or repeated outputs: device-to-device copies, never aliases
        for k, o in enumerate(m.outputs):
            if self.out_slot[k] != 1 + self.n_in + k:
                dst = int(slots[1 + self.n_in + k])
                self.exe.copy(self._locate(o, cp, slots), dst, nbytes(*out_specs[k]), stream)
        if not device_out:
            return self._to_host(slots, out_specs, outputs, stream)
        if self.exe.strict:
            self.errors.raise_reported(stream, "")
        return results if outputs is None else self._copy_out(results, outputs)

    def _run_graph(
        self,
        key: Key,
        prep: Prepared,
        out_specs: list[tuple[tuple[int, ...], str]],
        devs: list[tuple[int, int] | None],
        hosts: list[np.ndarray | None],
        outputs: Sequence[Any] | None,
        torch: Any,
        stream: int,
    ) -> list[Any]:
        """Note [CUDA graphs]: the call through the stream's graph buffer (arena, inputs, outputs)."""
        assert self.graphs is not None
        m, cp, exe = self.m, prep.cuda, self.exe
        ctx = self.graphs.context(stream)
        in_bytes = [h.nbytes if h is not None else d[1] for h, d in zip(hosts, devs)]  # type: ignore[index]
        at, cursor = [], round_up(cp.arena_bytes)
        for n in [*in_bytes, *(nbytes(s, d) for s, d in out_specs)]:
            at.append(cursor)
            cursor += round_up(n)
        base = self.graphs.memory(ctx, cursor, key)
        slots = np.zeros(self.n_slots + 1, dtype=np.uint64)
        slots[0] = base
        slots[1 : 1 + len(at)] = [base + a for a in at]
        slots[1 + len(at) : self.n_slots] = exe.weight_ptrs
        slots[self.n_slots] = exe.status(stream)
        for k, h in enumerate(hosts):  # the caller's tensors into the graph's buffer
            if h is not None:
                exe.to_device(h, int(slots[1 + k]), stream)
            else:
                exe.copy(devs[k][0], int(slots[1 + k]), in_bytes[k], stream)  # type: ignore[index]

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
            (self._locate(o, cp, slots), int(slots[1 + self.n_in + k]), nbytes(*out_specs[k]))
            for k, o in enumerate(m.outputs)
            if self.out_slot[k] != 1 + self.n_in + k
        )
        for src, dst, n in copies:
            exe.copy(src, dst, n, stream)
        if entry.exec is not None and entry.replay is None:  # Note [Framework replay]
            entry.replay = Replay(
                tuple((int(slots[1 + k]), in_bytes[k]) for k in range(len(hosts))),
                copies,
                tuple(
                    (int(slots[1 + self.n_in + k]), tuple(shape), DType(dt).storage_numpy(), nbytes(shape, dt))
                    for k, (shape, dt) in enumerate(out_specs)
                ),
                sum(round_up(nbytes(shape, dt)) for shape, dt in out_specs),
            )
        device_out = torch is not None or any(d is not None for d in devs)
        out_at = [int(slots[1 + self.n_in + k]) for k in range(len(out_specs))]
        if not device_out:
            return self._to_host(slots, out_specs, outputs, stream)
        results, ptrs = self._new_outputs(out_specs, torch, stream)
        for (shape, dt), s, d in zip(out_specs, out_at, ptrs):
            exe.copy(s, d, nbytes(shape, dt), stream)
        if exe.strict:
            self.errors.raise_reported(stream, "")
        return results if outputs is None else self._copy_out(results, outputs)

    # -- errors (Note [Device errors] in device_errors.py)
    def synchronize(self) -> None:
        """Wait for every stream this module ran on and raise an index error a call reported."""
        for stream in list(self._stream_locks):
            with self._stream_lock(stream):
                self.exe.synchronize(stream)
                self.errors.raise_reported(stream, "by synchronize()")

    def close(self) -> None:
        """synchronize(), then free the graphs, buffers and host copies (the module cannot run again)."""
        if self._closed:
            return
        try:
            self.synchronize()
        finally:
            self._closed = True
            self.errors.close()
            if self.graphs is not None:
                self.graphs.close()
            if self.exe.cublaslt is not None:
                self.exe.cublaslt.close()
            self._pool.free()

    def _to_host(
        self,
        slots: np.ndarray,
        out_specs: list[tuple[tuple[int, ...], str]],
        outputs: Sequence[Any] | None,
        stream: int,
    ) -> list[Any]:
        """The outputs in their slots copied to numpy arrays (the call waits for the stream and raises
        its index error)."""
        host_out = []
        for k, (shape, dt) in enumerate(out_specs):
            a = np.empty(shape, dtype=DType(dt).storage_numpy())  # Note [bfloat16 on the host]
            self.exe.to_host(int(slots[1 + self.n_in + k]), a, stream)
            host_out.append(a)
        self.exe.synchronize(stream)
        self.errors.raise_reported(stream, "")
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
        st = prep.ref.step_of(node)
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
