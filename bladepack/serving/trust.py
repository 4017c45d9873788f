"""Which artifacts a server may load: the trust options of `load`, carried into serving.

In: `--sha256` / `--trusted-key` (or the same keyword arguments of `write_repository` and the Ray
`deployment`). Out: `ServingTrust`, checked once where the repository or deployment is made (so a
wrong artifact is refused before a server starts) and again by every model instance when it loads
(the Python backend, the C++ backend, each Ray replica), since the file it loads is the one in the
repository, not the one that was checked. In a Triton repository the choice is recorded in
config.pbtxt as the parameters "sha256" (64 hex digits) and "trusted_keys" (keys as 64 hex digits,
comma-separated), which both backends read.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bladepack.artifact.format import read
from bladepack.artifact.trust import check_signature, public_key_bytes

SHA256, TRUSTED_KEYS = "sha256", "trusted_keys"


@dataclass(frozen=True)
class ServingTrust:
    """`sha256`: the whole file's digest (lowercase hex) or None; `trusted_keys`: Ed25519 public keys
    as 64 hex digits, one of which must have signed the artifact (empty: unsigned is fine)."""

    sha256: str | None = None
    trusted_keys: tuple[str, ...] = ()

    @staticmethod
    def of(sha256: str | None = None, trusted_keys: Sequence[Any] | None = None) -> ServingTrust:
        """From `load`'s arguments: keys in any form `load` takes (raw, hex, PEM, a .pub file)."""
        pin = None
        if sha256 is not None:
            pin = sha256.strip().lower()
            if len(pin) != 64 or any(c not in "0123456789abcdef" for c in pin):
                raise ValueError(f"sha256 must be 64 hex digits, got {sha256!r}")
        return ServingTrust(pin, tuple(public_key_bytes(k).hex() for k in trusted_keys or ()))

    @staticmethod
    def from_parameters(parameters: Mapping[str, Any]) -> ServingTrust:
        """From a Triton model config's `parameters` as JSON ({key: {"string_value": ...}})."""

        def value(key: str) -> str:
            entry = parameters.get(key)
            return str(entry.get("string_value", "")) if isinstance(entry, Mapping) else ""

        keys = [k for k in value(TRUSTED_KEYS).split(",") if k]
        return ServingTrust.of(value(SHA256) or None, keys)

    @property
    def active(self) -> bool:
        return self.sha256 is not None or bool(self.trusted_keys)

    def load_arguments(self) -> dict[str, Any]:
        """`sha256=` and `trusted_keys=` for `bladepack.load`."""
        return {"sha256": self.sha256, "trusted_keys": self._keys() or None}

    def _keys(self) -> list[bytes]:
        return [bytes.fromhex(k) for k in self.trusted_keys]

    def check(self, path: str | os.PathLike[str]) -> None:
        """TrustError unless the artifact at `path` is one this trusts (nothing in it runs); without a
        pin or keys there is nothing to check, and the file is not read."""
        if not self.active:
            return
        bpk = read(path, verify=bool(self.trusted_keys), sha256=self.sha256, map_file=False)
        if self.trusted_keys:
            check_signature(bpk.header, bpk.signature, self._keys(), bpk.source)

    def parameters(self) -> list[tuple[str, str]]:
        """The config.pbtxt parameters that record this."""
        out = [(SHA256, self.sha256)] if self.sha256 else []
        return out + ([(TRUSTED_KEYS, ",".join(self.trusted_keys))] if self.trusted_keys else [])
