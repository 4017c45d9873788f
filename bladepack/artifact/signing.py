"""Making signing keys and signing artifacts (`bladepack keygen`, `bladepack sign`).

In: a key path, an artifact path. Out: a new Ed25519 key pair on disk; an artifact with its signature
block (Note [Trust model] in trust.py) written atomically. Needs the optional `cryptography` package.
"""

from __future__ import annotations

import os
from pathlib import Path

from bladepack.artifact.format import read, write_chunks
from bladepack.artifact.trust import block, crypto, key_id, signed_message


def generate_key(path: str | os.PathLike[str]) -> bytes:
    """Write a new Ed25519 private key to `path` (PEM, mode 0600) and its public key to `path`.pub (PEM);
    return the raw public key."""
    c = crypto("generating a signing key")
    private = c.ed25519.Ed25519PrivateKey.generate()
    s = c.serialization
    pem = private.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())
    target = Path(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    public = private.public_key()
    Path(f"{target}.pub").write_bytes(public.public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo))
    return bytes(public.public_bytes(s.Encoding.Raw, s.PublicFormat.Raw))


def sign_file(
    path: str | os.PathLike[str], key_path: str | os.PathLike[str], out: str | os.PathLike[str] | None
) -> str:
    """Sign the artifact at `path` with the PEM Ed25519 private key at `key_path` (a signature already
    there is replaced); write it to `out` (default: in place, atomically). Returns the key id."""
    c = crypto("signing an artifact")
    private = c.serialization.load_pem_private_key(Path(key_path).read_bytes(), password=None)
    if not isinstance(private, c.ed25519.Ed25519PrivateKey):
        raise ValueError(f"{key_path} is not an Ed25519 private key (make one with `bladepack keygen`)")
    bpk = read(path)  # every checksum verified: sign only what is intact
    body = bytes(bpk.buffer[: bpk.data_end])
    public = private.public_key().public_bytes(c.serialization.Encoding.Raw, c.serialization.PublicFormat.Raw)
    signed = body + block(bytes(public), private.sign(signed_message(body)))
    del bpk  # the file may be replaced in place: drop the mapping first
    write_chunks(out if out is not None else path, [signed])
    return key_id(bytes(public))
