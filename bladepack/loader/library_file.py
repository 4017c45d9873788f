"""Loading an artifact's shared library (CPU kernels, the CUTLASS packer) without trusting the disk.

In: the library's bytes and the SHA-256 the (verified) manifest gives for them. Out: a `ctypes.CDLL`.

Note [Library paths]: the dynamic loader reuses an already loaded object whose path matches, so every
library gets a path named by its content hash: equal paths then mean equal code. Note [Private
library cache]: that path is in BLADEPACK_CACHE_DIR/lib, a directory this user owns with mode 0700
(a group- or world-writable one is made private, or not used), and a file there is hashed on every
load before it is opened: a planted or damaged file is replaced (atomically: written under a fresh
name, then renamed), never run. Without a usable cache the library goes to a fresh temporary file
(mkstemp, 0600) that is removed once loaded. The bytes are checked against the manifest's digest
first, so what runs is what the manifest names even when section checksums were skipped.
"""

from __future__ import annotations

import ctypes
import hashlib
import hmac
import os
import stat
import tempfile
from pathlib import Path

from bladepack.errors import BpkFormatError


def open_library(data: memoryview, sha256: str, what: str, cache_dir: Path) -> ctypes.CDLL:
    """dlopen `data` (which must hash to `sha256`), kept under `cache_dir`/lib by content (LoaderOptions.
    cache_dir); OSError when the dynamic loader refuses it."""
    digest = hashlib.sha256(data).hexdigest()
    if not hmac.compare_digest(digest, str(sha256)):
        raise BpkFormatError(f"{what}: its bytes do not match the manifest's checksum: the file is corrupt")
    cache = _private_dir(cache_dir / "lib")
    if cache is not None:
        path = cache / f"{digest}.so"
        try:
            if not _holds(path, digest):
                _write_atomically(cache, path, data)
            return ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
        except OSError:
            pass  # e.g. a noexec cache: a temporary file may still work
    fd, name = tempfile.mkstemp(prefix=f"bladepack-{digest[:16]}-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return ctypes.CDLL(name, mode=ctypes.RTLD_LOCAL)
    finally:
        os.unlink(name)


def _private_dir(path: Path) -> Path | None:
    """`path`, created or made private (0700, owned by this user), or None when it cannot be."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return None
        if st.st_mode & 0o077:
            os.chmod(path, 0o700)
        return path
    except OSError:
        return None


def _holds(path: Path, digest: str) -> bool:
    """Whether `path` is a regular file (not a link) whose content hashes to `digest`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return False
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return hmac.compare_digest(h.hexdigest(), digest)


def _write_atomically(directory: Path, path: Path, data: memoryview) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
