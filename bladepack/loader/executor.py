"""The contract every executor of a loaded module keeps, and the per-shape cache they share.

In: a `Manifest` (and the artifact's sections). Out: an `Executor` — the reference executor (numpy,
the oracle), the native CPU executor (the generated kernel library) or the CUDA executor — which
`LoadedModule` only dispatches to:
- `prepare(key)`: everything that depends only on the input shapes `key` (Note [Prepared plans]),
  computed once per shape signature and kept in a `ShapeCache`;
- `run(inputs, outputs)`: one call, inputs checked against the signature, results returned (or
  written into `outputs`).

Note [Prepared plans]: the register file, each step's resolved attributes and result shape, when each
value can be freed, the kernels' launch words: all of it depends only on the input shapes, so it is
computed once per shape signature and reused; a repeated shape costs one dictionary lookup plus the
kernels. The cache is bounded (least recently used out first; LoaderOptions.shape_cache entries, the
C++ runtime's bound by default), so a stream of distinct shapes cannot grow memory without limit.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from bladepack.errors import InputError
from bladepack.loader.manifest import Key, Manifest
from bladepack.loader.signature import check_inputs
from bladepack.loader.tensors import is_torch_tensor, to_numpy, to_torch

T = TypeVar("T")


class Executor(Protocol):
    @property
    def description(self) -> str:
        """What runs the steps, for `LoadedModule.executor`."""
        ...

    def prepare(self, key: Key) -> Any: ...

    def run(self, inputs: Sequence[Any], outputs: Sequence[Any] | None) -> list[Any]: ...


class ShapeCache(Generic[T]):
    """`make(key)` per shape signature, kept for the `limit` most recently used signatures. Safe to
    call from several threads (two threads may both make a missing entry; one of them is kept)."""

    def __init__(self, make: Callable[[Key], T], limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a shape cache holds at least one signature, got {limit}")
        self._make = make
        self._limit = limit
        self._entries: OrderedDict[Key, T] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, key: Key) -> T:
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                return hit
        made = self._make(key)
        with self._lock:
            kept = self._entries.setdefault(key, made)
            self._entries.move_to_end(key)
            while len(self._entries) > self._limit:
                self._entries.popitem(last=False)
            return kept

    def get(self, key: Key) -> T | None:
        with self._lock:
            return self._entries.get(key)

    def signatures(self) -> list[Key]:
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


@functools.cache
def physical_memory() -> int:
    """Bytes of memory this machine has (no call can need more and succeed)."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):
        return 1 << 62


def check_memory(need: int, details: Callable[[], tuple[Key, dict[str, int]]]) -> None:
    """Note [Bytes before allocation]: the guards bound each dim by its declared range, which may be
    open; the bytes a call implies (`need`) are checked against the machine's memory before anything
    is allocated, so a huge (for instance stride-0 expanded) input is an InputError, not a MemoryError
    or an allocation the kernel cannot back. `details` (called only to explain a refusal) gives the
    input shapes and what the bytes are for."""
    have = physical_memory()
    if need > have:
        key, parts = details()
        what = ", ".join(f"{k} {v}" for k, v in parts.items() if v)
        raise InputError(
            f"input shapes {[list(s) for s in key]} need {need} bytes ({what}), more than this machine's "
            f"{have} bytes of memory"
        )


def host_call(
    m: Manifest,
    inputs: Sequence[Any],
    outputs: Sequence[Any] | None,
    execute: Callable[[list[np.ndarray]], list[np.ndarray]],
) -> list[Any]:
    """A call on host memory: inputs as checked numpy arrays, `execute` on them, results as torch
    tensors when any input was one, or copied into `outputs` when given."""
    names = [t.name for t in m.signature.inputs]
    if len(inputs) != len(names):
        raise InputError(f"expected {len(names)} inputs ({', '.join(names)}), got {len(inputs)}")
    as_torch = any(is_torch_tensor(x) for x in inputs)
    # Note [bfloat16 on the host] (tensors.py): the extension dtype an input brought, for the outputs
    extension = next((x.dtype for x in inputs if isinstance(x, np.ndarray) and x.dtype.name == "bfloat16"), None)
    arrays = [to_numpy(x, n) for x, n in zip(inputs, names)]
    check_inputs(m.signature, arrays)
    results = execute(arrays)
    if outputs is not None:
        if len(outputs) != len(results):
            raise InputError(f"expected {len(results)} output buffers, got {len(outputs)}")
        for spec, buf, r in zip(m.signature.outputs, outputs, results):
            view = to_numpy(buf, spec.name)
            if view.shape != r.shape or view.dtype != r.dtype:
                raise InputError(
                    f"output buffer '{spec.name}' is {view.dtype.name}{list(view.shape)}; "
                    f"the result is {r.dtype.name}{list(r.shape)}"
                )
            np.copyto(view, r)
        return list(outputs)
    bf16 = [spec.dtype == "bfloat16" for spec in m.signature.outputs]
    if as_torch:
        return [to_torch(r, b) for r, b in zip(results, bf16)]
    if extension is not None:
        return [r.view(extension) if b else r for r, b in zip(results, bf16)]
    return results
