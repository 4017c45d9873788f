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
) -> LoadedModule:
    """Load an artifact from a path (memory-mapped) or from bytes.

    `verify=False` skips the per-section sha256 check (the manifest is always verified).
    `executor`: "auto" (generated kernels when they run on this CPU), "native" or "reference".

    An artifact carries native code: loading it runs code from it (Note [Trust model] in
    artifact/trust.py). `sha256` pins the whole file's digest (hex), checked before anything is parsed;
    `trusted_keys` (Ed25519 public keys: 32 bytes, hex, PEM, or a .pub file) refuses an artifact that
    is not signed by one of them, before any native code is loaded, and checks every section. Both
    raise `TrustError`.

    `on_out_of_range` sets a policy per dynamic dim for sizes above its range: "error" (the default) or
    "split", which runs a larger batch as several calls and concatenates the results; allowed only for
    a dim the compiler proved batch-like (`bladepack inspect` lists them), else ValueError with why.

    `graphs` (device="cuda"): from a shape signature's second call on a stream its kernels replay as one
    CUDA graph (Note [CUDA graphs] in loader/cuda_graphs.py; at most BLADEPACK_CUDA_GRAPHS per stream,
    default 64); False launches every kernel by itself.

    `options`: how the module runs (`LoaderOptions`: threads, BLAS, cuBLAS, caches; docs/configuration.md);
    None reads them from the environment, once, here.
    """
    bpk = read(source, verify=verify or trusted_keys is not None, sha256=sha256)
    if trusted_keys is not None:
        check_signature(bpk.header, bpk.signature, list(trusted_keys), bpk.source)
    return LoadedModule(bpk, device, executor, on_out_of_range, graphs, options or LoaderOptions.from_env())


__all__ = ["ExecutionError", "LoadedModule", "LoaderOptions", "Signature", "TensorSpec", "TrustError", "load"]
