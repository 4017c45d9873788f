"""Which artifacts to trust: pinning by digest and Ed25519 signatures. Loader-safe.

Note [Trust model]: a .bpk carries native code (CPU kernel libraries, CUDA images, the CUTLASS packer),
so loading one runs code from it. Checksums only catch accidents: whoever can edit the file can
recompute them. To say which artifacts may run, a loader can be given
- `sha256`: the digest of the whole file, checked before anything in it is parsed or mapped executable;
- `trusted_keys`: Ed25519 public keys; the artifact must carry a signature by one of them, checked
  before any native code is loaded (and every section's checksum with it).

The signature is a 128-byte block after the last section (format 1.1 readers ignore it):

    0    8   magic b"BPKSIG\\x00\\x01"
    8    4   algorithm (u32) = 1, Ed25519
    12   4   reserved (zero)
    16   32  the signer's public key
    48   64  the signature
    112  16  zero

over b"bladepack signature v1\\x00" followed by the file's 64-byte header, which holds the manifest's
SHA-256; the manifest holds every section's SHA-256. Signing (`bladepack sign`) needs the optional
`cryptography` package (`pip install bladepack[sign]`), and so does checking a signature in Python;
the C++ runtime uses OpenSSL's libcrypto.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bladepack.errors import BladepackError

SIG_MAGIC = b"BPKSIG\x00\x01"
SIG_SIZE = 128
ED25519 = 1
DOMAIN = b"bladepack signature v1\x00"
_BLOCK = struct.Struct("<8sII32s64s16s")
assert _BLOCK.size == SIG_SIZE


class TrustError(BladepackError):
    """The artifact is not one the caller said to trust: wrong digest, unsigned, or not signed by a
    trusted key."""


@dataclass(frozen=True)
class Signature:
    public_key: bytes  # 32 bytes
    signature: bytes  # 64 bytes

    @property
    def key_id(self) -> str:
        """The key's short name in messages: the first 16 hex digits of its SHA-256."""
        return key_id(self.public_key)


def key_id(public_key: bytes) -> str:
    return hashlib.sha256(public_key).hexdigest()[:16]


def signed_message(header: bytes | memoryview) -> bytes:
    return DOMAIN + bytes(header[:64])


def find_signature(buf: memoryview, data_end: int) -> Signature | None:
    """The signature block right after `data_end` (the end of the last section), if there is one."""
    if len(buf) != data_end + SIG_SIZE:
        return None
    magic, alg, _reserved, key, sig, _pad = _BLOCK.unpack_from(buf, data_end)
    if magic != SIG_MAGIC or alg != ED25519:
        return None
    return Signature(bytes(key), bytes(sig))


def block(public_key: bytes, signature: bytes) -> bytes:
    return _BLOCK.pack(SIG_MAGIC, ED25519, 0, public_key, signature, b"\0" * 16)


def check_digest(buf: memoryview, expected: str, source: str) -> None:
    """TrustError unless the whole file's SHA-256 is `expected` (hex)."""
    want = expected.strip().lower()
    if len(want) != 64 or any(c not in "0123456789abcdef" for c in want):
        raise ValueError(f"sha256 must be 64 hex digits, got {expected!r}")
    got = hashlib.sha256(buf).hexdigest()
    if not hmac.compare_digest(got, want):
        raise TrustError(f"{source}: the file's SHA-256 is {got}, not the pinned {want}; refusing to load it")


def public_key_bytes(key: Any) -> bytes:
    """A 32-byte Ed25519 public key from raw bytes, 64 hex digits, a PEM public key (str or bytes), or
    a path to a file holding one of those."""
    if isinstance(key, os.PathLike) or (isinstance(key, str) and os.path.isfile(key)):
        key = Path(key).read_bytes()
    raw = key.strip().encode() if isinstance(key, str) else bytes(key) if isinstance(key, (bytes, bytearray)) else None
    if raw is not None:
        if len(raw) == 32 and not isinstance(key, str):
            return raw
        text = raw.strip()
        if text.startswith(b"-----BEGIN"):
            serialization = crypto("reading a PEM public key").serialization
            loaded = serialization.load_pem_public_key(text)
            return bytes(loaded.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw))
        if len(text) == 64:
            try:
                return bytes.fromhex(text.decode("ascii"))
            except ValueError:
                pass
    raise ValueError(
        "a trusted key is 32 raw bytes, 64 hex digits, a PEM Ed25519 public key, or a file holding one; "
        f"got {type(key).__name__}"
    )


def check_signature(header: memoryview, sig: Signature | None, trusted: Sequence[Any], source: str) -> None:
    """TrustError unless `sig` is a valid signature of the header by one of the `trusted` keys."""
    keys = [public_key_bytes(k) for k in trusted]
    if not keys:
        raise ValueError("trusted_keys is empty: name at least one Ed25519 public key")
    ids = ", ".join(key_id(k) for k in keys)
    if sig is None:
        raise TrustError(f"{source} is not signed; trusted keys: {ids} (sign it with `bladepack sign`)")
    if sig.public_key not in keys:
        raise TrustError(f"{source} is signed by key {sig.key_id}, which is not among the trusted keys ({ids})")
    ed = crypto("checking an artifact's signature").ed25519
    try:
        ed.Ed25519PublicKey.from_public_bytes(sig.public_key).verify(sig.signature, signed_message(header))
    except Exception:  # cryptography raises InvalidSignature
        raise TrustError(f"{source}: the signature by key {sig.key_id} does not match the artifact") from None


def crypto(what: str) -> Any:
    """The `cryptography` primitives, or a BladepackError saying how to get them."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise BladepackError(
            f"{what} needs the 'cryptography' package: pip install 'bladepack[sign]' (or cryptography)"
        ) from None

    return SimpleNamespace(serialization=serialization, ed25519=ed25519)
