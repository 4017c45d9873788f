"""Cache directories no other user can plant files in. Loader-safe (the standard library only).

In: a cache directory (BLADEPACK_CACHE_DIR/lib, /cpu, /cuda, /cutlass) and entry names. Out:
`PrivateDir`, which reads an entry only when it is this user's own and writes entries atomically.

Note [Cache ownership] (docs/format.md "Trust"): a cache entry is code that will run, so it is used
only when
- the directory is owned by this user and neither group- nor world-writable, and
- the entry is a regular file (not a symbolic link) owned by this user, with one link, and not
  group- or world-writable,
all checked with fstat on the open file descriptors (the directory's and the entry's), never on a
path that could be swapped between the check and the use; entries are opened relative to the
directory's descriptor. A directory that fails the rule is not used at all (the caller builds or
loads in private memory and is warned once per directory): making a group-writable directory private
would not remove what another user already put in it. Hard links are refused because another user
who linked a file it owns into the directory could rewrite that inode after the check.
"""

from __future__ import annotations

import contextlib
import os
import stat
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PrivateDir:
    """An open directory this user owns that only this user can write: entries are read and written
    through its descriptor `fd` (closed with `close`, or use it as a context manager)."""

    path: Path
    fd: int

    @staticmethod
    def open(path: Path, what: str) -> PrivateDir | None:
        """`path`, created 0700 if missing, when it passes Note [Cache ownership]; else None, with a
        RuntimeWarning naming `what` the directory holds and why it is not used."""
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            _warn(path, what, f"it cannot be opened ({e.strerror or e})")
            return None
        st = os.fstat(fd)
        why = None
        if st.st_uid != os.getuid():
            why = f"it is owned by uid {st.st_uid}, not this user (uid {os.getuid()})"
        elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            why = f"other users may write to it (mode {stat.S_IMODE(st.st_mode):04o}); make it 0700 to use it"
        if why is not None:
            os.close(fd)
            _warn(path, what, why)
            return None
        return PrivateDir(path, fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> PrivateDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def entry_path(self, name: str) -> str:
        """A path naming entry `name` through this directory's descriptor (valid while it is open): what
        dlopen is given, so the directory cannot be swapped between the check and the load."""
        return f"/proc/self/fd/{self.fd}/{name}"

    def read(self, name: str) -> bytes | None:
        """Entry `name`'s bytes when it passes Note [Cache ownership]; None when it is missing or fails
        it (a failing entry is later replaced by `write`, never read)."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not owned_alone(st):
                return None
            return f.read()

    def write(self, name: str, data: bytes | memoryview) -> None:
        """Store `data` as entry `name` atomically: written 0600 under a fresh name, then renamed over
        whatever `name` was (a link, another user's file), so readers never see a partial entry."""
        tmp = f".{name}.{os.getpid()}.{os.urandom(6).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise


def owned_alone(st: os.stat_result) -> bool:
    """Whether a file's fstat says: a regular file of this user's, one link, not group/world-writable."""
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_uid == os.getuid()
        and st.st_nlink == 1
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _warn(path: Path, what: str, why: str) -> None:
    warnings.warn(f"bladepack: not using the cache {path} for {what}: {why}", RuntimeWarning, stacklevel=3)
