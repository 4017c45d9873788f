"""The replay paths of the CUDA executor: a repeated signature's call in a few driver calls.

In: a call's inputs (torch CUDA tensors, `__cuda_array_interface__` objects, DLPack producers, numpy
arrays) and the graphs the executor's full path captured. Out: the call's results, or None when the call
must take the full path. `ReplayPaths` is a base of `CudaExecutor` (cuda_module.py), which sets the
attributes declared below.

Note [Framework replay]: once a signature's graph exists on a stream, everything a later call does
is fixed except the caller's addresses: the staging address and byte count of each input, the graph,
the copies of outputs that alias inputs or weights, and each output's address, shape and dtype are
recorded with the graph (`Replay`). A call then reads its inputs' addresses (torch's data_ptr, a CAI
dict, a DLPack capsule, or a numpy array's buffer), takes the stream's lock, copies the inputs in,
launches the graph, makes its outputs (torch.empty, pooled device memory, or numpy arrays) and copies
them out: no shape checks (the key matched a checked signature), no numpy in the device paths, no
per-call allocation besides the outputs, no synchronization unless the caller wants host arrays.
Anything unusual (another dtype, device or layout, caller output buffers, a first or uncaptured
signature) takes the full path, which checks and explains.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bladepack.dtypes import DType
from bladepack.loader.cuda_graphs import CudaGraphs
from bladepack.loader.device_errors import DeviceErrors
from bladepack.loader.device_inputs import DeviceTensor, OutputPool, TorchKind, read_cai
from bladepack.loader.dlpack import KDL_CUDA, KDL_CUDA_MANAGED, Imported, import_tensor
from bladepack.loader.manifest import Key
from bladepack.loader.native_cuda import NativeCuda
from bladepack.loader.tensors import is_torch_tensor

_ALIGN = 256  # results carved out of one pooled block start on 256-byte boundaries


def nbytes(shape: Sequence[int], dtype: str) -> int:
    return math.prod(shape) * DType(dtype).itemsize


def round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class ReplayPaths:
    graphs: CudaGraphs | None
    exe: NativeCuda
    errors: DeviceErrors
    ordinal: int
    _torch: TorchKind | None
    _pool: OutputPool
    _replay_dtypes: tuple[np.dtype[Any], ...] | None
    _typestrs: tuple[str | None, ...]
    _in_dtypes: list[str]
    _out_dtypes: list[str]
    _stream_locks: dict[int, threading.Lock]
    _locks_lock: threading.Lock

    def _device_call(self, stream: int, key: Key, ptrs: Sequence[int], torch: Any) -> list[Any] | None:
        raise NotImplementedError  # CudaExecutor's

    def _stream_lock(self, stream: int) -> threading.Lock:
        """Calls on one stream enqueue their work one at a time: the stream's arena and graph buffer
        are reused by the next call, which is safe only in stream order."""
        lock = self._stream_locks.get(stream)
        if lock is None:
            with self._locks_lock:
                lock = self._stream_locks.setdefault(stream, threading.Lock())
        return lock

    def _new_outputs(
        self, out_specs: Sequence[tuple[tuple[int, ...], str]], torch: Any, stream: int
    ) -> tuple[list[Any], list[int]]:
        """Device results (torch tensors from torch's allocator, else DeviceTensors in one pooled
        block) and their addresses."""
        if torch is not None:
            tk = self._torch
            assert tk is not None
            results = [tk.empty(s, dtype=t, device=tk.device) for (s, _), t in zip(out_specs, tk.outputs)]
            return results, [int(t.data_ptr()) for t in results]
        layout = [(tuple(s), d, nbytes(s, d)) for s, d in out_specs]
        return self._pooled(layout, sum(round_up(n) for _, _, n in layout), stream)

    def _pooled(
        self, layout: Iterable[tuple[tuple[int, ...], str, int]], total: int, stream: int
    ) -> tuple[list[Any], list[int]]:
        """DeviceTensors of (shape, dtype, bytes) `layout`, carved in order out of one pooled block of
        `total` bytes (each result starting on a 256-byte boundary), and their addresses."""
        owner = self._pool.take(max(total, _ALIGN))
        cursor, where, cuda = owner.ptr, (KDL_CUDA, self.ordinal), self.exe.device
        results: list[Any] = []
        ptrs: list[int] = []
        for shape, dt, n in layout:
            results.append(DeviceTensor(cursor, where, dt, shape, owner, stream, cuda))
            ptrs.append(cursor)
            cursor += round_up(n)
        return results, ptrs

    # -- the replay paths (Note [Framework replay])
    def _fast(self, inputs: Sequence[Any]) -> list[Any] | None:
        """A call's results through its signature's graph, or None when it must take the full path."""
        x = inputs[0]
        kind = type(x)
        if kind is np.ndarray:
            return self._replay_host(inputs) if self._replay_dtypes is not None else None
        tk = self._torch
        if tk is not None and kind is tk.tensor:
            got = tk.read(inputs)
            return None if got is None else self._replay_device(tk.stream(self.ordinal), got[0], got[1], tk)
        if is_torch_tensor(x):
            return None  # the full path learns the caller's torch
        if hasattr(x, "__cuda_array_interface__"):
            cai = read_cai(inputs, self._typestrs)
            return None if cai is None else self._replay_device(cai[2], cai[0], cai[1], None)
        if hasattr(x, "__dlpack__"):
            return self._replay_dlpack(inputs)
        return None

    def _replay_dlpack(self, inputs: Sequence[Any]) -> list[Any] | None:
        """DLPack producers: one capsule per input, handed back after the work is enqueued."""
        held: list[Imported] = []
        try:
            for x, dt in zip(inputs, self._in_dtypes):
                try:
                    dev = x.__dlpack_device__()
                    if int(dev[0]) not in (KDL_CUDA, KDL_CUDA_MANAGED) or int(dev[1]) != self.ordinal:
                        return None
                    imp = import_tensor(x, 1)
                except (ValueError, TypeError, RuntimeError, BufferError, AttributeError):
                    return None
                held.append(imp)
                if imp.view.dtype != dt or not imp.view.contiguous:
                    return None
            key = tuple(imp.view.shape for imp in held)
            return self._replay_device(0, key, [imp.view.ptr for imp in held], None)
        finally:
            for imp in held:
                imp.close()

    def _replay_device(self, stream: int, key: Key, ptrs: Sequence[int], tk: TorchKind | None) -> list[Any] | None:
        """Device inputs at `ptrs`: copied into the graph's buffer, the graph, the outputs copied out into
        torch tensors (`tk`) or pooled DeviceTensors, all enqueued on `stream`; None: the full path."""
        graphs = self.graphs
        assert graphs is not None
        ctx = graphs.peek(stream)
        entry = ctx.graphs.get(key) if ctx is not None else None
        if ctx is None or entry is None or entry.replay is None:  # (an entry never outlives its buffer)
            return self._device_call(stream, key, ptrs, tk)  # Note [First calls on the device]
        r = entry.replay
        drv, s = self.exe._drv, ctx.handle
        copy = drv.cuMemcpyDtoDAsync
        lock = self._stream_locks.get(stream) or self._stream_lock(stream)
        with lock:
            if self.errors.pending(stream):
                self.errors.raise_reported(stream, "when this call began (it did not run)")
            ctx.graphs.move_to_end(key)
            failed = False  # CUresult is an int enum: non-zero is an error
            for p, (addr, n) in zip(ptrs, r.inputs):
                failed = bool(copy(addr, p, n, s)[0]) or failed
            failed = bool(drv.cuGraphLaunch(entry.exec, s)[0]) or failed
            for src, dst, n in r.copies:
                failed = bool(copy(dst, src, n, s)[0]) or failed
            outs: list[Any] = []
            if tk is not None:
                empty, device = tk.empty, tk.device
                for (addr, shape, _, n), dt in zip(r.outputs, tk.outputs):
                    o = empty(shape, dtype=dt, device=device)
                    failed = bool(copy(o.data_ptr(), addr, n, s)[0]) or failed
                    outs.append(o)
            else:
                layout = ((shape, dt, n) for (_, shape, _, n), dt in zip(r.outputs, self._out_dtypes))
                outs, dsts = self._pooled(layout, r.pooled, stream)
                for d, (addr, _, _, n) in zip(dsts, r.outputs):
                    failed = bool(copy(d, addr, n, s)[0]) or failed
            if failed:
                return None  # the full path runs the call again and raises the detailed error
            if self.exe.strict and self.exe.checks_errors:
                self.errors.raise_reported(stream, "")
        return outs

    def _replay_host(self, inputs: Sequence[Any]) -> list[np.ndarray] | None:
        """Note [Graph replay]: host arrays on the legacy default stream."""
        assert self.graphs is not None and self._replay_dtypes is not None
        ctx = self.graphs.peek(0)
        if ctx is None:
            return None
        shapes = []
        for x, dt in zip(inputs, self._replay_dtypes):
            if type(x) is not np.ndarray or x.dtype != dt or not x.flags.c_contiguous:
                return None
            shapes.append(x.shape)
        key = tuple(shapes)
        with self._stream_lock(0):
            entry = ctx.graphs.get(key)
            if entry is None or entry.replay is None:
                return None
            if self.errors.pending(0):
                self.errors.raise_reported(0, "when this call began (it did not run)")
            ctx.graphs.move_to_end(key)
            r = entry.replay
            drv, stream = self.exe._drv, ctx.handle
            failed = False  # CUresult is an int enum: non-zero is an error
            for x, (addr, n) in zip(inputs, r.inputs):
                failed = bool(drv.cuMemcpyHtoDAsync(addr, x.ctypes.data, n, stream)[0]) or failed
            failed = bool(drv.cuGraphLaunch(entry.exec, stream)[0]) or failed
            for src, dst, n in r.copies:
                failed = bool(drv.cuMemcpyDtoDAsync(dst, src, n, stream)[0]) or failed
            outs = []
            for addr, shape, dt, n in r.outputs:
                a = np.empty(shape, dtype=dt)
                failed = bool(drv.cuMemcpyDtoHAsync(a.ctypes.data, addr, n, stream)[0]) or failed
                outs.append(a)
            failed = bool(drv.cuStreamSynchronize(stream)[0]) or failed
            if failed:
                return None  # the full path runs the call again and raises the detailed error
            self.errors.raise_reported(0, "")
            return outs


__all__ = ["ReplayPaths", "nbytes", "round_up"]
