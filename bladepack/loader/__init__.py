"""The Python loader: runs .bpk artifacts with numpy and msgpack only (never torch or sympy)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from bladepack.artifact.format import read
from bladepack.artifact.trust import TrustError, check_signature
from bladepack.loader.module import ExecutionError, LoadedModule
from bladepack.loader.signature import Signature, TensorSpec
from bladepack.options import LoaderOptions

_PINNED_MAPPED = (
    "sha256 pins the bytes read, so a pinned load reads the file privately (mmap=False); "
    "to map a large file, sign it and load it with trusted_keys"
)


def load(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    device: str = "cpu",
    verify: bool = True,
    executor: str = "auto",
    sha256: str | None = None,
    trusted_keys: Sequence[Any] | None = None,
    on_out_of_range: dict[str, str] | None = None,
    graphs: bool = True,
    options: LoaderOptions | None = None,
    mmap: bool | None = None,
) -> LoadedModule:
    """Load an artifact from a path (memory-mapped, or read into private memory) or from bytes.

    `verify=False` skips the per-section sha256 check (the manifest is always verified).
    `executor`: "auto" (generated kernels when they run on this CPU), "native" or "reference".

    An artifact carries native code: loading it runs code from it (Note [Trust model] in
    artifact/trust.py). `sha256` pins the whole file's digest (hex), checked before anything is parsed;
    `trusted_keys` (Ed25519 public keys: 32 bytes, hex, PEM, or a .pub file) refuses an artifact that
    is not signed by one of them, before any native code is loaded, and checks every section. Both
    raise `TrustError`.

    `mmap` (a path only): True maps the file, so its pages are shared with other processes, but the
    file must not change while loaded (weights are read from it when used; truncating it faults the
    process); False reads it once into private memory, after which the file may be rewritten,
    truncated or deleted (a pinned load must: the pin covers the bytes read, not a mapping that may
    change after the check). None (the default) reads a pinned or signed load privately, so what was
    checked is what runs, weights included, and maps every other (Note [Mapped or private] in
    artifact/format.py; kernel code is always loaded from a checked private copy).

    `on_out_of_range` sets a policy per dynamic dim for sizes above its range: "error" (the default) or
    "split", which runs a larger batch as several calls and concatenates the results; allowed only for
    a dim the compiler proved batch-like (`bladepack inspect` lists them), else ValueError with why.

    `graphs` (device="cuda"): from a shape signature's second call on a stream its kernels replay as one
    CUDA graph (Note [CUDA graphs] in loader/cuda_graphs.py; at most BLADEPACK_CUDA_GRAPHS per stream,
    default 64); False launches every kernel by itself.

    `options`: how the module runs (`LoaderOptions`: threads, BLAS, cuBLAS, caches; docs/configuration.md);
    None reads them from the environment, once, here.
    """
    if sha256 is not None and mmap:
        raise ValueError(_PINNED_MAPPED)
    map_file = mmap if mmap is not None else (sha256 is None and trusted_keys is None)
    bpk = read(source, verify=verify or trusted_keys is not None, sha256=sha256, map_file=map_file)
    if trusted_keys is not None:
        check_signature(bpk.header, bpk.signature, list(trusted_keys), bpk.source)
    return LoadedModule(bpk, device, executor, on_out_of_range, graphs, options or LoaderOptions.from_env())


__all__ = ["ExecutionError", "LoadedModule", "LoaderOptions", "Signature", "TensorSpec", "TrustError", "load"]
