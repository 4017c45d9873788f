"""The fast path of the native CPU executor.

In: the prepared launch lists of input-shape signatures (checked by the full path, or prepared by the
kernel library). Out: `FastCalls`, a callable that, for calls with such shapes, writes the input and
output pointers into this thread's slot table and makes one foreign call — nothing else.

Note [Fast path]: the full path (`NativeExecutor.run`) checks ranks, dtypes and every shape guard, then
prepares the signature. A signature whose plan is one native segment with every output written in
place is then registered here under its input shapes. A call takes the fast path only when each input
is exactly the type the first one was (a C-contiguous numpy array of the declared dtype, or a
contiguous CPU torch tensor of it) and its shapes are registered or the kernel library prepares them
here (Note [Native preparation] in native_prepare.py: one more foreign call, which declines wherever
the full path would raise); anything else returns None and goes the full path, which checks and
explains. A native failure also returns None: the full path runs the same inputs again and raises its
detailed error. The thread's arena is asked for only when it is not the one slot 0 already points into
(the full path replaced it) or no longer fits this call (Note [Arena high-water mark]); the foreign
call is made directly. Signatures are kept up to the shape cache's limit, the oldest registered out
first.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from bladepack.loader.native_cpu import NativeCpu, Prepared, arena_fits
from bladepack.loader.native_prepare import NativePreparation

_view_of: Callable[[Any], ctypes.c_char] = ctypes.c_char.from_buffer  # numpy arrays export the buffer protocol


def _address(a: np.ndarray) -> int:
    """The data address of a C-contiguous array. Note [Array addresses]: `a.ctypes.data` builds a
    ctypes helper object per access (about 1 us here, two per call of a one-input one-output model);
    a ctypes view of a writable buffer costs a third of that. Read-only or empty arrays take the
    general route."""
    try:
        return ctypes.addressof(_view_of(a))
    except (TypeError, ValueError, BufferError):
        return int(a.ctypes.data)


class _Plan:
    """A registered signature's launch words (kept alive: the library reads them through their
    address), arena need and output shapes, with the foreign call's word arguments made once (Note
    [Foreign arguments])."""

    __slots__ = ("arena_bytes", "count_arg", "out_shapes", "words", "words_arg")

    def __init__(self, words: np.ndarray, arena_bytes: int, out_shapes: tuple[tuple[int, ...], ...]) -> None:
        self.words = words
        self.arena_bytes = arena_bytes
        self.out_shapes = out_shapes
        self.words_arg = ctypes.c_void_p(int(words.ctypes.data))
        self.count_arg = ctypes.c_long(words.size)


class _ThreadState:
    """This thread's slot table (arena, inputs, outputs, weights) and status words, with their addresses.

    Note [Foreign arguments]: the table is a ctypes array (an element write costs less than a numpy
    array's; `slots` is a numpy view of the same memory for bulk writes), and the foreign call's
    pointer arguments are ctypes objects made once, which ctypes passes without converting a Python
    int per call. With Note [Direct calls] (module.py) and torch outputs made by `torch.empty(size=...)`
    (1.0 µs where a positional shape took 1.5), a one-kernel model's whole call measured 4.15 -> 3.49 µs
    with numpy inputs and 6.21 -> 4.30 µs with torch tensors (Zen 4 EPYC, 200,000 calls); the MLP
    sample's at batch 1 7.5 -> 6.9 and 9.0 -> 7.9 µs."""

    def __init__(self, native: NativeCpu, n_slots: int, n_io: int) -> None:
        self.table = (ctypes.c_uint64 * n_slots)()
        self.slots = np.ctypeslib.as_array(self.table)
        self.slots[1 + n_io :] = native.weight_slots
        self.slots_arg = ctypes.c_void_p(ctypes.addressof(self.table))
        self.status = np.zeros(4, dtype=np.int64)
        self.status_arg = ctypes.c_void_p(int(self.status.ctypes.data))
        self.arena: tuple[np.ndarray, int] | None = None  # the native arena slot 0 points into


class FastCalls:
    def __init__(
        self,
        native: NativeCpu,
        in_dtypes: Sequence[np.dtype],
        out_dtypes: Sequence[np.dtype],
        n_slots: int,
        limit: int,
        prepare: NativePreparation | None = None,
    ) -> None:
        """`prepare`: new signatures prepared in the kernel library (Note [Native preparation]), or
        None (only signatures the full path registered)."""
        self._native = native
        self._prepare = prepare
        self._in_dtypes = tuple(in_dtypes)
        self._out_dtypes = tuple(out_dtypes)
        self._n_in = len(in_dtypes)
        self._n_slots = n_slots
        self._plans: dict[tuple[tuple[int, ...], ...], _Plan] = {}  # at most `limit`, oldest out first
        self._limit = limit
        self._local = threading.local()
        self._torch: tuple[Any, tuple[Any, ...], tuple[Any, ...]] | None = None  # (Tensor, in, out dtypes)
        self._arenas = native.arenas
        self._run, self._ctx = native.foreign_run  # the foreign call itself (Note [Fast path])

    def add(self, shapes: tuple[tuple[int, ...], ...], prep: Prepared, out_shapes: Sequence[tuple[int, ...]]) -> None:
        """Register a checked signature whose plan is a single native segment writing every output."""
        if len(prep.segments) != 1 or prep.segments[0].words is None or prep.segments[0].when:
            return
        words = prep.segments[0].words
        self._keep(shapes, _Plan(words, prep.arena_bytes, tuple(tuple(s) for s in out_shapes)))

    def _new(self, shapes: tuple[tuple[int, ...], ...]) -> _Plan | None:
        """A signature no call registered, prepared by the kernel library (Note [Native preparation]),
        or None (the full path prepares it, or explains why not)."""
        prepare = self._prepare
        if prepare is None or any(len(s) != r for s, r in zip(shapes, prepare.ranks)):
            return None
        got = prepare(shapes)
        if got is None:
            return None
        plan = _Plan(got.words, got.arena_bytes, got.out_shapes)
        self._keep(shapes, plan)
        return plan

    def _keep(self, shapes: tuple[tuple[int, ...], ...], plan: _Plan) -> None:
        self._plans.setdefault(shapes, plan)
        while len(self._plans) > self._limit:  # a signature evicted here goes the full path (and back) again
            try:
                del self._plans[next(iter(self._plans))]
            except (KeyError, StopIteration, RuntimeError):  # another thread evicted it first
                break

    def _torch_types(self, tensor_type: type) -> tuple[Any, tuple[Any, ...], tuple[Any, ...]] | None:
        if self._torch is None:
            torch = sys.modules.get("torch")
            if torch is None or tensor_type is not torch.Tensor:
                return None
            try:
                ins = tuple(getattr(torch, dt.name) for dt in self._in_dtypes)
                outs = tuple(getattr(torch, dt.name) for dt in self._out_dtypes)
            except AttributeError:
                return None
            self._torch = (torch.Tensor, ins, outs)
        return self._torch

    def _state(self, arena_bytes: int) -> _ThreadState:
        st: _ThreadState | None = getattr(self._local, "state", None)
        if st is None:
            st = _ThreadState(self._native, self._n_slots, self._n_in + len(self._out_dtypes))
            self._local.state = st
        # Looked at every call: the full path may have grown (replaced) this thread's arena meanwhile.
        held: tuple[np.ndarray, int] | None = getattr(self._arenas, "arena", None)
        if held is None or held is not st.arena or not arena_fits(held[0].nbytes, arena_bytes):
            fresh = self._native.arena(arena_bytes)
            st.arena = fresh
            st.slots[0] = fresh[1]
        return st

    def __call__(self, inputs: Sequence[Any]) -> list[Any] | None:
        if len(inputs) != self._n_in or not inputs:
            return None
        ptrs = []
        first = type(inputs[0])
        if first is np.ndarray:
            shapes = []
            for a, dt in zip(inputs, self._in_dtypes):
                if type(a) is not np.ndarray or a.dtype is not dt or not a.flags.c_contiguous:
                    return None
                shapes.append(a.shape)
                ptrs.append(_address(a))
            key = tuple(shapes)
            torch = None
        else:
            tt = self._torch_types(first)
            if tt is None:
                return None
            tensor, in_dt, out_dt = tt
            shapes = []
            for t, dt in zip(inputs, in_dt):
                if type(t) is not tensor or t.dtype is not dt or not t.is_cpu or not t.is_contiguous() or t.is_neg():
                    return None  # a negative-bit view holds the values negated: the full path resolves it
                shapes.append(t.shape)  # a torch.Size: a tuple, equal and hashed as one
                ptrs.append(t.data_ptr())
            key = tuple(shapes)
            torch = sys.modules["torch"]
        plan = self._plans.get(key) or self._new(key)
        if plan is None:
            return None
        st = self._state(plan.arena_bytes)
        table = st.table
        slot = 1
        for p in ptrs:
            table[slot] = p
            slot += 1
        outs: list[Any] = []
        if torch is None:
            for shape, dt in zip(plan.out_shapes, self._out_dtypes):
                o = np.empty(shape, dt)
                table[slot] = _address(o)
                slot += 1
                outs.append(o)
        else:
            for shape, tdt in zip(plan.out_shapes, out_dt):
                o = torch.empty(size=shape, dtype=tdt)  # a third faster than a positional shape
                table[slot] = o.data_ptr()
                slot += 1
                outs.append(o)
        if self._run(self._ctx, plan.words_arg, plan.count_arg, st.slots_arg, st.status_arg, None):
            st.status[:] = 0
            return None
        return outs
