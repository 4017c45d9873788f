"""The .bpk container: fixed header, msgpack manifest, 64-byte-aligned checksummed sections.

In (writer): a manifest dict and a list of named byte sections. Out: one file, written atomically and
byte-for-byte reproducible. In (reader): a path (memory-mapped, or read once into private memory) or
a bytes-like object. Out: the manifest and zero-copy views of the sections, or `BpkFormatError` saying
exactly what is wrong.

Note [Mapped or private] (docs/format.md "Trust"): a mapped file is read where it lies, so another
process that rewrites it in place changes what later reads see, and one that truncates it makes a
later read fault (SIGBUS). The reader therefore copies the header and the manifest once and checks
and parses only the copies, and `section_copy` gives code (kernel libraries, GPU images) as a private
copy checked against the manifest's digest; but weights read through a mapping are the file's bytes
at the time of use. `read(..., map_file=False)` reads the whole file once into private anonymous
memory instead: then nothing later depends on the file at all (it may be rewritten, truncated or
deleted), at the cost of one copy of the file in this process's memory.

Layout (all integers little-endian; see docs/format.md):

    0   magic            8 bytes  b"\\x89BPK\\r\\n\\x1a\\n"
    8   major, minor     u16, u16
    12  header_size      u32 (64)
    16  manifest_offset  u64 (64)
    24  manifest_length  u64
    32  manifest_sha256  32 bytes
    64  manifest (msgpack), zero padding to a multiple of 64
    data_start = align64(64 + manifest_length); section offsets are relative to data_start.
"""

from __future__ import annotations

import hashlib
import hmac
import mmap
import os
import struct
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack

from bladepack.artifact import trust
from bladepack.errors import BpkFormatError

MAGIC = b"\x89BPK\r\n\x1a\n"
FORMAT_MAJOR = 1
FORMAT_MINOR = 14
HEADER_SIZE = 64
ALIGN = 64
_HEADER = struct.Struct("<8sHHIQQ32s")
assert _HEADER.size == HEADER_SIZE


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class Section:
    name: str
    data: bytes | memoryview


def encode(manifest: dict[str, Any], sections: Sequence[Section]) -> list[bytes | memoryview]:
    """The file's bytes as a list of chunks (avoids copying large weights)."""
    table: list[dict[str, Any]] = []
    offset = 0
    for s in sections:
        view = memoryview(s.data).cast("B")
        table.append(
            {"name": s.name, "offset": offset, "length": view.nbytes, "sha256": hashlib.sha256(view).hexdigest()}
        )
        offset = _align(offset + view.nbytes)
    body = msgpack.packb({**manifest, "sections": table}, use_bin_type=True)
    header = _HEADER.pack(
        MAGIC, FORMAT_MAJOR, FORMAT_MINOR, HEADER_SIZE, HEADER_SIZE, len(body), hashlib.sha256(body).digest()
    )
    chunks: list[bytes | memoryview] = [
        header,
        body,
        b"\0" * (_align(HEADER_SIZE + len(body)) - HEADER_SIZE - len(body)),
    ]
    for k, (s, entry) in enumerate(zip(sections, table)):
        n = int(entry["length"])
        chunks.append(memoryview(s.data).cast("B"))
        if k + 1 < len(sections):  # no padding after the last section: any truncation cuts data
            chunks.append(b"\0" * (_align(n) - n))
    return chunks


def write(path: str | os.PathLike[str], manifest: dict[str, Any], sections: Sequence[Section]) -> None:
    """Write atomically: a temporary file in the same directory, fsync, then rename over `path`."""
    write_chunks(path, encode(manifest, sections))


def write_chunks(path: str | os.PathLike[str], chunks: Sequence[bytes | memoryview]) -> None:
    """Write `chunks` to `path` atomically: a temporary file in the same directory, fsync, rename."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class BpkFile:
    """A parsed artifact: the manifest plus zero-copy section views over the file's buffer."""

    def __init__(self, buffer: memoryview, source: str, verify: bool = True, keepalive: object = None) -> None:
        self._buf = buffer
        self._keepalive = keepalive  # the mmap, kept open as long as views exist
        self.source = source
        self.manifest = self._read_manifest()
        self._sections = self._read_sections(verify)

    def _fail(self, what: str) -> BpkFormatError:
        return BpkFormatError(f"{self.source}: {what}")

    def _read_manifest(self) -> dict[str, Any]:
        buf = self._buf
        self._header = bytes(buf[:HEADER_SIZE])  # Note [Mapped or private]: checked and signed as copied
        if len(buf) < HEADER_SIZE:
            if bytes(buf[: len(MAGIC)]) != MAGIC[: len(buf)]:
                raise self._fail("not a .bpk artifact (bad magic)")
            raise self._fail(f"truncated: the file has {len(buf)} bytes, the header alone needs {HEADER_SIZE}")
        magic, major, minor, hsize, moff, mlen, digest = _HEADER.unpack_from(self._header, 0)
        if magic != MAGIC:
            raise self._fail(f"not a .bpk artifact (bad magic {bytes(magic)!r}, expected {MAGIC!r})")
        if major > FORMAT_MAJOR:
            raise self._fail(
                f"format version {major}.{minor} is newer than this loader supports "
                f"({FORMAT_MAJOR}.{FORMAT_MINOR}); upgrade bladepack to load it"
            )
        if major < 1 or hsize != HEADER_SIZE or moff != HEADER_SIZE:
            raise self._fail(f"corrupt header (version {major}.{minor}, header size {hsize}, manifest offset {moff})")
        if moff + mlen > len(buf):
            raise self._fail(f"truncated: the manifest needs bytes up to {moff + mlen}, the file has {len(buf)}")
        body = bytes(buf[moff : moff + mlen])
        if hashlib.sha256(body).digest() != digest:
            raise self._fail("manifest checksum mismatch: the file is corrupt")
        try:
            manifest = msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as e:  # msgpack raises several unrelated types
            raise self._fail(f"manifest is not valid msgpack ({e})") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("sections"), list):
            raise self._fail("manifest is not a map with a 'sections' list")
        self.data_start = _align(HEADER_SIZE + mlen)
        return manifest

    @property
    def buffer(self) -> memoryview:
        """The whole file."""
        return self._buf

    @property
    def header(self) -> memoryview:
        """The header as read when the file was opened (what the manifest's checksum was checked against)."""
        return memoryview(self._header)

    def section_digest(self, name: str) -> str:
        """The SHA-256 (hex) the manifest gives section `name`."""
        self.section(name)
        return str(self._digests[name])

    def _read_sections(self, verify: bool) -> dict[str, memoryview]:
        out: dict[str, memoryview] = {}
        self._digests: dict[str, object] = {}
        self.data_end = self.data_start  # where the last section ends; a signature block may follow
        checks: list[tuple[str, memoryview, object]] = []
        for i, entry in enumerate(self.manifest["sections"]):
            try:
                name, off, n, digest = entry["name"], int(entry["offset"]), int(entry["length"]), entry["sha256"]
            except (KeyError, TypeError, ValueError):
                raise self._fail(f"section {i} has a malformed entry") from None
            start = self.data_start + off
            if off < 0 or n < 0 or off % ALIGN:
                raise self._fail(f"section {name!r} has an invalid offset {off} / length {n}")
            if start + n > len(self._buf):
                raise self._fail(
                    f"truncated: section {name!r} needs bytes up to {start + n}, the file has {len(self._buf)}"
                )
            view = self._buf[start : start + n]
            self._digests[name] = digest
            self.data_end = max(self.data_end, start + n)
            if verify:
                checks.append((name, view, digest))
            out[name] = view
        if checks:
            self._verify(checks)
        self.signature = trust.find_signature(self._buf, self.data_end)
        return out

    def _verify(self, checks: list[tuple[str, memoryview, object]]) -> None:
        """Note [Parallel checksums] (as in the C++ reader): hashlib releases the GIL on large buffers, so
        sections are hashed on up to one thread per CPU (one per 8 MB at most); the first mismatch in
        manifest order is reported."""
        total = sum(v.nbytes for _, v, _ in checks)
        threads = min(len(os.sched_getaffinity(0)), len(checks), total // (8 << 20) + 1)
        if threads <= 1:
            digests = [hashlib.sha256(v).hexdigest() for _, v, _ in checks]
        else:
            with ThreadPoolExecutor(threads) as pool:
                digests = list(pool.map(lambda c: hashlib.sha256(c[1]).hexdigest(), checks))
        for (name, _, digest), got in zip(checks, digests):
            if got != digest:
                raise self._fail(f"checksum mismatch in section {name!r}: the file is corrupt")

    def section_copy(self, name: str) -> bytes:
        """Section `name` copied once into private memory and checked against the manifest's digest:
        what native code (kernel libraries, GPU images) is loaded from (Note [Mapped or private])."""
        data = bytes(self.section(name))
        if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), str(self._digests[name])):
            raise self._fail(f"checksum mismatch in section {name!r}: the file is corrupt (or changed while loading)")
        return data

    def section(self, name: str) -> memoryview:
        try:
            return self._sections[name]
        except KeyError:
            raise self._fail(f"missing section {name!r}") from None

    @property
    def section_names(self) -> list[str]:
        return list(self._sections)


def read(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview,
    verify: bool = True,
    sha256: str | None = None,
    map_file: bool = True,
) -> BpkFile:
    """Open an artifact from a path (memory-mapped read-only, or with `map_file=False` read once into
    private memory: Note [Mapped or private]) or from bytes in memory. `sha256` pins the whole file's
    digest (Note [Trust model] in trust.py), checked before anything is parsed."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        buf = memoryview(source).cast("B")
        if sha256 is not None:
            trust.check_digest(buf, sha256, "<bytes>")
        return BpkFile(buf, "<bytes>", verify)
    path = os.fspath(source)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise BpkFormatError(f"{path}: empty file, not a .bpk artifact")
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if map_file else _read_private(f, size, path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no artifact at {path}") from None
    view = memoryview(mm).toreadonly()
    if sha256 is not None:
        trust.check_digest(view, sha256, path)
    return BpkFile(view, path, verify, keepalive=mm)


def _read_private(f: Any, size: int, path: str) -> mmap.mmap:
    """The file's `size` bytes read into anonymous memory (page-aligned, like a mapping); BpkFormatError
    when it shrinks while being read."""
    mm = mmap.mmap(-1, size)
    view = memoryview(mm)
    done = 0
    while done < size:
        n = f.readinto(view[done:])
        if not n:
            view.release()
            raise BpkFormatError(
                f"{path}: the file shrank while being read ({done} of {size} bytes); it changed under the loader"
            )
        done += n
    view.release()
    return mm
