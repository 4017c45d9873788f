"""Note [Cache ownership] (bladepack/private_files.py): the loader's library cache and the builder's
compile caches use an entry only when this user wrote it — the directory this user's and not group-
or world-writable, the entry this user's with one link — checked on the open descriptors. A second
user (uid 65534, where these tests run as root) plants files the way the trust review did."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import bladepack
from bladepack.artifact import format as bpk_format
from bladepack.codegen.toolchain import build_libraries, cached_build, find_compiler
from bladepack.options import LoaderOptions
from bladepack.private_files import PrivateDir

OTHER = 65534  # nobody
as_root = pytest.mark.skipif(os.getuid() != 0, reason="a second user needs root to act as one")


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Path]:
    """A directory another user can reach (pytest's own is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="bladepack-shared-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as_other(script: str) -> None:
    """Run the shell `script` as the second user (who cannot reach this interpreter)."""

    def drop() -> None:
        os.setgid(OTHER)
        os.setuid(OTHER)

    subprocess.run(["/bin/sh", "-c", script], check=True, preexec_fn=drop, cwd="/")


def _library(artifact: bladepack.api.Artifact) -> tuple[bytes, str]:
    bpk = bpk_format.read(artifact.to_bytes())
    section = bpk.manifest["native_cpu"]["libraries"][-1]["section"]
    return bytes(bpk.section(section)), bpk.section_digest(section)


def _load(artifact: bladepack.api.Artifact, cache: Path) -> None:
    x = np.random.default_rng(0).standard_normal((2, 64), dtype=np.float32)
    m = bladepack.load(artifact.to_bytes(), executor="native", options=LoaderOptions.from_env(cache_dir=cache))
    np.testing.assert_allclose(m(x), bladepack.load(artifact.to_bytes(), executor="reference")(x), rtol=1e-5)


def test_a_directory_others_may_write_is_not_used(mlp_artifact: bladepack.api.Artifact, tmp_path: Path) -> None:
    lib = tmp_path / "cache" / "lib"
    lib.mkdir(parents=True)
    os.chmod(lib, 0o777)
    with pytest.warns(RuntimeWarning, match=r"not using the cache .*/lib for CPU kernel libraries: other users may"):
        _load(mlp_artifact, tmp_path / "cache")
    assert list(lib.iterdir()) == []  # loaded from a sealed memfd instead


def test_a_hard_linked_entry_is_replaced(mlp_artifact: bladepack.api.Artifact, tmp_path: Path) -> None:
    """Even this user's own bytes: a second link could rewrite the inode after the check."""
    data, digest = _library(mlp_artifact)
    lib = tmp_path / "cache" / "lib"
    lib.mkdir(parents=True, mode=0o700)
    elsewhere = tmp_path / "elsewhere.so"
    elsewhere.write_bytes(data)
    os.link(elsewhere, lib / f"{digest}.so")
    _load(mlp_artifact, tmp_path / "cache")
    entry = os.stat(lib / f"{digest}.so")
    assert entry.st_nlink == 1 and entry.st_ino != os.stat(elsewhere).st_ino


@as_root
def test_another_users_link_into_the_cache_is_never_run(mlp_artifact: bladepack.api.Artifact, shared: Path) -> None:
    """The reported attack: `lib/` left 0777, the second user hard-links a file it owns (the right
    bytes) as lib/<sha>.so, and rewrites that inode after a load. Here the owner has since made the
    directory private again; the foreign entry is refused and replaced, and the rewrite reaches only
    the second user's own file."""
    data, digest = _library(mlp_artifact)
    cache = shared / "cache"
    lib = cache / "lib"
    lib.mkdir(parents=True)
    os.chmod(cache, 0o755)
    os.chmod(lib, 0o777)
    (shared / "theirs").mkdir()
    os.chown(shared / "theirs", OTHER, OTHER)
    theirs = shared / "theirs" / "lib.so"
    (shared / "bytes").write_bytes(data)
    _as_other(f"cp '{shared / 'bytes'}' '{theirs}' && ln '{theirs}' '{lib / (digest + '.so')}'")
    assert os.stat(lib / f"{digest}.so").st_uid == OTHER
    os.chmod(lib, 0o700)
    _load(mlp_artifact, cache)
    entry = os.stat(lib / f"{digest}.so")
    assert entry.st_uid == os.getuid() and entry.st_nlink == 1
    _as_other(f"printf 'planted code' | dd of='{theirs}' conv=notrunc status=none")
    assert hashlib.sha256((lib / f"{digest}.so").read_bytes()).hexdigest() == digest
    _load(mlp_artifact, cache)


def test_private_dir_rules(tmp_path: Path) -> None:
    d = tmp_path / "c"
    with PrivateDir.open(d, "tests") as cache:  # type: ignore[union-attr]
        cache.write("a", b"mine")
        assert cache.read("a") == b"mine"
        assert cache.read("missing") is None
        os.symlink(d / "a", d / "link")
        assert cache.read("link") is None  # never through a symbolic link
        os.chmod(d / "a", 0o666)
        assert cache.read("a") is None  # others could have written it
        cache.write("a", b"again")
        assert cache.read("a") == b"again" and (os.stat(d / "a").st_mode & 0o777) == 0o600
    assert sorted(p.name for p in d.iterdir()) == ["a", "link"]  # no temporary left behind
    os.chmod(d, 0o770)
    with pytest.warns(RuntimeWarning, match=r"other users may write to it \(mode 0770\)"):
        assert PrivateDir.open(d, "tests") is None


def test_builder_cache_entries_must_be_this_users(tmp_path: Path) -> None:
    built: list[int] = []

    def build() -> bytes:
        built.append(1)
        return b"built"

    d = tmp_path / "cpu"
    assert cached_build(d, "k.so", build, "tests") == (b"built", False)
    assert cached_build(d, "k.so", build, "tests") == (b"built", True) and len(built) == 1
    (tmp_path / "planted").write_bytes(b"planted")
    os.unlink(d / "k.so")
    os.link(tmp_path / "planted", d / "k.so")  # a second link: not an entry this build wrote
    assert cached_build(d, "k.so", build, "tests") == (b"built", False) and len(built) == 2
    assert (d / "k.so").read_bytes() == b"built" and (tmp_path / "planted").read_bytes() == b"planted"
    os.chmod(d, 0o777)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert cached_build(d, "k.so", build, "tests") == (b"built", False) and len(built) == 3
    assert any("not using the cache" in str(w.message) for w in seen)


@as_root
def test_optimize_never_packs_a_library_another_user_planted(shared: Path) -> None:
    """The builder's CPU cache (BLADEPACK_CACHE_DIR/cpu/<key>.so, a predictable key): an entry the
    second user wrote is rebuilt, not packed."""
    cxx = find_compiler()
    if cxx is None:
        pytest.skip("no C++ compiler")
    source = 'extern "C" int bpk_probe() { return 7; }\n'
    cache = shared / "cache"
    (first,) = build_libraries(source, cache, cxx, "x86-64")
    (entry,) = list((cache / "cpu").iterdir())
    os.chmod(cache / "cpu", 0o777)
    os.unlink(entry)
    _as_other(f"printf 'planted library' > '{entry}'")
    os.chmod(cache / "cpu", 0o755)
    (again,) = build_libraries(source, cache, cxx, "x86-64")
    assert not again.cached and again.data == first.data
    assert entry.read_bytes() == first.data and os.stat(entry).st_uid == os.getuid()
