"""Note [Trust model]: pinning by digest and Ed25519 signatures, in the Python loader and bpk-run alike;
Note [Private library cache]: a planted or damaged kernel library in the cache is never run."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bladepack
from bladepack.artifact import format as bpk_format
from bladepack.artifact.signing import generate_key, sign_file
from bladepack.artifact.trust import SIG_SIZE, TrustError, key_id
from bladepack.errors import BpkFormatError
from bladepack.options import LoaderOptions
from tests import cpp_build
from tests.helpers import rel_err

pytest.importorskip("cryptography")


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, mlp_artifact: bladepack.api.Artifact) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("trust")
    mlp_artifact.save(d / "m.bpk")
    generate_key(d / "k")
    generate_key(d / "other")
    sign_file(d / "m.bpk", d / "k", d / "s.bpk")
    return {"dir": d, "plain": d / "m.bpk", "signed": d / "s.bpk", "key": d / "k.pub", "other": d / "other.pub"}


def _raw(pub: Path) -> bytes:
    from bladepack.artifact.trust import public_key_bytes

    return public_key_bytes(pub)


def _tampered(signed: dict[str, Path]) -> dict[str, bytes]:
    """Signed files changed after signing: each must be refused."""
    data = signed["signed"].read_bytes()
    plain = signed["plain"].read_bytes()
    # a weight changed and every checksum recomputed: the manifest digest in the header changes
    bpk = bpk_format.read(signed["plain"])
    manifest = {k: v for k, v in bpk.manifest.items() if k != "sections"}
    sections = [bpk_format.Section(n, bytes(bpk.section(n))) for n in bpk.section_names]
    w = next(i for i, s in enumerate(sections) if s.name.startswith("weight/"))
    changed = bytearray(sections[w].data)
    changed[0] ^= 0x40
    sections[w] = bpk_format.Section(sections[w].name, bytes(changed))
    rehashed = b"".join(bytes(c) for c in bpk_format.encode(manifest, sections))
    block = data[len(plain) :]
    assert len(block) == SIG_SIZE
    return {
        "weights re-hashed": rehashed + block,  # the old signature over a different manifest
        "signature bit": data[:-20] + bytes([data[-20] ^ 1]) + data[-19:],
    }


def test_signed_artifact_loads_with_every_key_form(signed: dict[str, Path]) -> None:
    x = np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)
    want = bladepack.load(signed["plain"])(x)
    raw = _raw(signed["key"])
    for key in (
        signed["key"],
        str(signed["key"]),
        raw,
        raw.hex(),
        signed["key"].read_text(),
        signed["key"].read_bytes(),
    ):
        got = bladepack.load(signed["signed"], trusted_keys=[signed["other"], key])(x)
        assert rel_err(got, want) == 0.0
    # format 1.1 readers ignore the block: the signed file loads without keys too, unchanged
    assert rel_err(bladepack.load(signed["signed"])(x), want) == 0.0
    summary = subprocess.run(
        [sys.executable, "-m", "bladepack.cli", "inspect", str(signed["signed"]), "--json"],
        capture_output=True,
        text=True,
    )
    assert json.loads(summary.stdout)["signature"] == {"key_id": key_id(raw), "public_key": raw.hex()}


def test_untrusted_artifacts_are_refused(signed: dict[str, Path]) -> None:
    kid, other = key_id(_raw(signed["key"])), key_id(_raw(signed["other"]))
    with pytest.raises(TrustError, match=rf"m.bpk is not signed; trusted keys: {kid} \(sign it"):
        bladepack.load(signed["plain"], trusted_keys=[signed["key"]])
    with pytest.raises(TrustError, match=rf"signed by key {kid}, which is not among the trusted keys \({other}\)"):
        bladepack.load(signed["signed"], trusted_keys=[signed["other"]])
    for data in _tampered(signed).values():
        with pytest.raises(TrustError, match=f"the signature by key {kid} does not match the artifact"):
            bladepack.load(data, trusted_keys=[signed["key"]])
    with pytest.raises(ValueError, match="trusted_keys is empty"):
        bladepack.load(signed["signed"], trusted_keys=[])
    with pytest.raises(ValueError, match="a trusted key is 32 raw bytes"):
        bladepack.load(signed["signed"], trusted_keys=[b"short"])


def test_sha256_pin(signed: dict[str, Path]) -> None:
    digest = hashlib.sha256(signed["plain"].read_bytes()).hexdigest()
    bladepack.load(signed["plain"], sha256=digest.upper())
    bladepack.load(signed["plain"].read_bytes(), sha256=digest)
    with pytest.raises(TrustError, match=f"SHA-256 is {digest}, not the pinned {'0' * 64}; refusing"):
        bladepack.load(signed["plain"], sha256="0" * 64)
    with pytest.raises(ValueError, match="sha256 must be 64 hex digits"):
        bladepack.load(signed["plain"], sha256="abc")


def test_bpk_run_trust_matches_python(signed: dict[str, Path]) -> None:
    build = cpp_build.build("release")

    def run(path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(build / "bpk-run"), str(path), *flags], capture_output=True, text=True, timeout=60)

    assert run(signed["signed"], "--trusted-key", str(signed["key"])).returncode == 0
    assert run(signed["signed"], "--trusted-key", _raw(signed["key"]).hex()).returncode == 0
    digest = hashlib.sha256(signed["plain"].read_bytes()).hexdigest()
    assert run(signed["plain"], "--sha256", digest).returncode == 0
    cases = [
        (signed["plain"], ["--trusted-key", str(signed["key"])], [signed["key"]], None),
        (signed["signed"], ["--trusted-key", str(signed["other"])], [signed["other"]], None),
        (signed["plain"], ["--sha256", "0" * 64], None, "0" * 64),
    ]
    for name, data in _tampered(signed).items():
        path = signed["dir"] / f"tampered-{name.replace(' ', '-')}.bpk"
        path.write_bytes(data)
        cases.append((path, ["--trusted-key", str(signed["key"])], [signed["key"]], None))
    for path, flags, keys, pin in cases:
        r = run(path, *flags)
        with pytest.raises(TrustError) as e:
            bladepack.load(path, trusted_keys=keys, sha256=pin)
        assert r.returncode == 1 and r.stderr.strip() == f"bpk-run: untrusted artifact: {e.value}", (r.stderr, e.value)


def test_planted_library_in_the_cache_is_never_run(mlp_artifact: bladepack.api.Artifact, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    (cache / "lib").mkdir(parents=True)
    os.chmod(cache / "lib", 0o755)
    options = LoaderOptions.from_env(cache_dir=cache)
    data = mlp_artifact.to_bytes()
    bpk = bpk_format.read(data)
    lib = bpk.manifest["native_cpu"]["libraries"][0]["section"]
    digest = bpk.section_digest(lib)
    planted = cache / "lib" / f"{digest}.so"
    planted.write_bytes(b"\x7fELF planted, not the artifact's library")
    x = np.random.default_rng(1).standard_normal((2, 64), dtype=np.float32)
    m = bladepack.load(data, executor="native", options=options)
    assert rel_err(m(x), bladepack.load(data, executor="reference")(x)) <= 1e-6
    assert hashlib.sha256(planted.read_bytes()).hexdigest() == digest  # replaced by the real library


def test_library_bytes_checked_even_without_section_checksums(mlp_artifact: bladepack.api.Artifact) -> None:
    data = bytearray(mlp_artifact.to_bytes())
    bpk = bpk_format.read(bytes(data))
    lib = bpk.manifest["native_cpu"]["libraries"][0]["section"]
    entry = next(e for e in bpk.manifest["sections"] if e["name"] == lib)
    at = bpk.data_start + entry["offset"] + entry["length"] // 2
    data[at] ^= 0xFF
    with pytest.raises(BpkFormatError, match="checksum mismatch in section"):
        bladepack.load(bytes(data))
    with pytest.raises(BpkFormatError, match="CPU kernel library: its bytes do not match the manifest's checksum"):
        bladepack.load(bytes(data), verify=False, executor="native")


def test_keygen_and_sign_cli(signed: dict[str, Path]) -> None:
    d = signed["dir"]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "bladepack.cli", *args], capture_output=True, text=True)

    r = cli("keygen", str(d / "cli-key"))
    assert r.returncode == 0 and stat.S_IMODE(os.stat(d / "cli-key").st_mode) == 0o600, r.stderr
    assert cli("keygen", str(d / "cli-key")).returncode == 1  # never overwrites a key
    r = cli("sign", str(signed["plain"]), "--key", str(d / "cli-key"), "-o", str(d / "cli.bpk"))
    assert r.returncode == 0, r.stderr
    r = cli("sign", str(d / "cli.bpk"), "--key", str(d / "k"))  # re-signing replaces the block
    assert r.returncode == 0 and (d / "cli.bpk").stat().st_size == signed["plain"].stat().st_size + SIG_SIZE
    bladepack.load(d / "cli.bpk", trusted_keys=[signed["key"]])
    r = cli("run", str(d / "cli.bpk"), "--trusted-key", str(d / "cli-key.pub"))
    assert r.returncode == 1 and "not among the trusted keys" in r.stderr
    # signing leaves the manifest untouched
    assert bpk_format.read(d / "cli.bpk").manifest == bpk_format.read(signed["plain"]).manifest
