"""Loading an artifact's shared library (CPU kernels, the CUTLASS packer) without trusting the disk.

In: the library's bytes and the SHA-256 the (verified) manifest gives for them. Out: a `ctypes.CDLL`.

Note [Hash what runs]: the bytes are copied once into private memory, that copy is checked against
the manifest's digest, and only that copy is ever written out and loaded: nothing is read from the
artifact file again, so a process that rewrites the file in place between the check and the load
changes nothing that runs.

Note [Library paths]: the dynamic loader reuses an already loaded object whose path matches, so every
library gets a path named by its content hash: equal paths then mean equal code. Note [Private
library cache]: that path is in BLADEPACK_CACHE_DIR/lib when the directory passes Note [Cache
ownership] (private_files.py: this user's, not group- or world-writable, checked on its descriptor);
an entry there is used only when it is this user's with one link and hashes to the digest, and is
opened through the directory's descriptor (/proc/self/fd/N/<sha>.so), so neither it nor the
directory can be swapped before the load. A missing or failing entry is replaced atomically. Without
a usable cache the copy goes to a sealed memfd (no write, grow or shrink is possible after the check)
that stays open for the life of the process: its /proc/self/fd path then never names another file,
which the dynamic loader, matching by path, would otherwise mistake for this library.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import hmac
import os
import tempfile
from pathlib import Path

from bladepack.errors import BpkFormatError
from bladepack.private_files import PrivateDir


def open_library(data: bytes | memoryview, sha256: str, what: str, cache_dir: Path) -> ctypes.CDLL:
    """dlopen `data` (which must hash to `sha256`), kept under `cache_dir`/lib by content (LoaderOptions.
    cache_dir); OSError when the dynamic loader refuses it."""
    data = bytes(data)  # Note [Hash what runs]: the one read of the artifact's bytes
    digest = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(digest, str(sha256)):
        raise BpkFormatError(f"{what}: its bytes do not match the manifest's checksum: the file is corrupt")
    cache = PrivateDir.open(cache_dir / "lib", "CPU kernel libraries")
    if cache is not None:
        with cache:
            name = f"{digest}.so"
            try:
                held = cache.read(name)
                if held is None or not hmac.compare_digest(hashlib.sha256(held).hexdigest(), digest):
                    cache.write(name, data)
                return ctypes.CDLL(cache.entry_path(name), mode=ctypes.RTLD_LOCAL)
            except OSError:
                pass  # e.g. a noexec cache: private memory may still work
    return _from_memory(data, digest)


def _from_memory(data: bytes, digest: str) -> ctypes.CDLL:
    """`data` loaded from a sealed memfd (kept open: Note [Private library cache]), or where memfd or
    executing it is unavailable, from an unlinked 0600 temporary file."""
    try:
        fd = os.memfd_create(f"bladepack-{digest[:16]}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        try:
            with open(fd, "wb", closefd=False) as f:
                f.write(data)
            fcntl.fcntl(
                fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL
            )
            return ctypes.CDLL(f"/proc/self/fd/{fd}", mode=ctypes.RTLD_LOCAL)  # fd stays open on success
        except OSError:
            os.close(fd)
    tfd, name = tempfile.mkstemp(prefix=f"bladepack-{digest[:16]}-", suffix=".so")
    try:
        with os.fdopen(tfd, "wb") as f:
            f.write(data)
        return ctypes.CDLL(name, mode=ctypes.RTLD_LOCAL)
    finally:
        os.unlink(name)
