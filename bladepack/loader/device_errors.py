"""Index errors that CUDA kernels report, raised without a wait per call and never lost.

In: the CUDA executor's `NativeCuda` (status words per stream and their page-locked host copies) and
the plan's kernel rows. Out: `DeviceErrors`, which the executor asks at the start of a call
(`pending`: one read of host memory), after a call that waited (`raise_reported(stream, "")`), and at
`synchronize()` / `close()`; at interpreter exit it prints what nobody asked for.

Note [Device errors]: kernels that read indices from data report the first bad one in their stream's
status words (an atomic compare-and-swap, never reset by a call). Every call ends with a copy of those
words into page-locked host memory (a node of the graph), so the host reads them without a driver call
or a wait: a call that waits anyway (host results) raises its own error at its end; a call that does
not (device results) leaves it to be raised at the next call on that stream (before it runs anything),
by `synchronize()` and `close()`, or printed at interpreter exit if nobody asked: the error names the
kernel, the op and its source line, and that the results of the calls on that stream since the last
check may be wrong. `LoaderOptions.cuda_strict_errors` (BLADEPACK_CUDA_STRICT_ERRORS=1) makes every
call reset the words, wait for its kernels and raise its own error, as before. The C++ runtime does
the same per call context (cpp_runtime/src/native_cuda.h).
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from bladepack.errors import IndexRangeError
from bladepack.loader.manifest import index_error
from bladepack.loader.native_cuda import KERNEL_SHIFT, NativeCuda


def _error(kernels: Sequence[dict[str, Any]], code: int, value: int, size: int) -> IndexRangeError:
    k = code >> KERNEL_SHIFT
    row = kernels[k] if 0 <= k < len(kernels) else {"name": "?", "errors": []}
    return index_error(row, code & ((1 << KERNEL_SHIFT) - 1), value, size)


class DeviceErrors:
    def __init__(self, owner: object, exe: NativeCuda, kernels: Sequence[dict[str, Any]]) -> None:
        """`owner`: the executor, whose collection (or the interpreter's exit) prints an unraised error."""
        self.exe, self.kernels = exe, kernels
        self.words: dict[int, np.ndarray] = {}  # stream -> host copy of its status words
        self._finalizer = weakref.finalize(owner, _unreported, exe, self.words, kernels)

    def pending(self, stream: int) -> bool:
        """Whether `stream`'s host copy holds an error (no driver call, no wait)."""
        words = self.words.get(stream)
        return words is not None and bool(words[0])

    def raise_reported(self, stream: int, found: str) -> None:
        """Raise the index error `stream`'s kernels reported, if any. `found` "": the call that just
        waited for the stream (its own error); else where an earlier call's error was found."""
        exe = self.exe
        if not exe.checks_errors:
            return
        if exe.strict:
            if found:
                return  # every call raised its own
            code, value, size = exe.read_status(stream)
        else:
            words = self.words.get(stream)
            if words is None:
                words = self.words[stream] = exe.mirror(exe.status(stream))[1]
            if not words[0]:
                return
            exe.device.synchronize(stream)  # the words final
            code, value, size = int(words[0]), int(words[1]), int(words[2])
        if not code:
            return
        exe.clear_status(stream)
        err = _error(self.kernels, code, value, size)
        if found:
            err = IndexRangeError(
                f"{err}; reported by an earlier call on this stream and found {found}: the results of the "
                "calls on this stream since its last check may be wrong (LoaderOptions.cuda_strict_errors "
                "makes each call check its own)"
            )
        raise err

    def close(self) -> None:
        """Nothing left to report at exit (the caller synchronized); the host copies freed."""
        self._finalizer.detach()
        self.exe.free_mirrors()
        self.words.clear()


def _unreported(exe: NativeCuda, words: dict[int, np.ndarray], kernels: Sequence[dict[str, Any]]) -> None:
    """At interpreter exit (or when the executor is collected): an index error no call, synchronize()
    or close() raised is printed, never lost."""
    for stream, w in list(words.items()):
        try:
            exe.device.synchronize(stream)
        except Exception:  # a torn-down driver at exit: nothing left to read
            continue
        if w[0]:
            err = _error(kernels, int(w[0]), int(w[1]), int(w[2]))
            sys.stderr.write(
                "bladepack: a CUDA call reported an error that nothing raised (no later call, synchronize() "
                f"or close() on its stream): IndexRangeError: {err}\n"
            )


__all__ = ["DeviceErrors"]
