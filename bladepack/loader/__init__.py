"""The Python loader: runs .bpk artifacts with numpy and msgpack only (never torch or sympy)."""

from __future__ import annotations

import os

from bladepack.artifact.format import read
from bladepack.loader.module import ExecutionError, LoadedModule
from bladepack.loader.signature import Signature, TensorSpec


def load(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    device: str = "cpu",
    verify: bool = True,
    executor: str = "auto",
) -> LoadedModule:
    """Load an artifact from a path (memory-mapped) or from bytes.

    `verify=False` skips the per-section sha256 check (the manifest is always verified).
    `executor`: "auto" (generated kernels when they run on this CPU), "native" or "reference".
    """
    return LoadedModule(read(source, verify=verify), device, executor)


__all__ = ["ExecutionError", "LoadedModule", "Signature", "TensorSpec", "load"]
