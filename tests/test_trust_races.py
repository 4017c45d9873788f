"""Note [Hash what runs] and Note [Mapped or private]: bytes rewritten in the artifact file while it
loads never run, and a privately read artifact keeps its results when the file changes under it.

An attacker who can write the artifact file flips the CPU kernel library's first bytes between a
library of its own (whose constructor leaves a marker file) and the real ones, in another process,
as fast as it can, while the Python loader and bpk-run load the signed or pinned artifact over and
over. Each load must either run the real kernels (correct results) or refuse the file (TrustError /
a checksum mismatch); the marker must never appear. Bounded: a few seconds per loader.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import bladepack
from bladepack.artifact import format as bpk_format
from bladepack.artifact.signing import generate_key, sign_file
from bladepack.errors import BpkFormatError
from bladepack.loader import TrustError
from bladepack.options import LoaderOptions
from tests import cpp_build

pytest.importorskip("cryptography")

RACE_S, RACE_MAX_S = 3.0, 60.0  # race at least this long, and until both outcomes were seen 3 times
ATTACK_C = """
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void planted(void) {
  int fd = open(MARKER, O_CREAT | O_WRONLY, 0600);
  if (fd >= 0) close(fd);
}
"""
FLIPPER = textwrap.dedent(
    """
    import os, random, sys, time
    path, spans, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    attack = open(sys.argv[4], "rb").read()
    fd = os.open(path, os.O_RDWR)
    offsets = [int(s) for s in spans.split(",")]
    original = [os.pread(fd, len(attack), off) for off in offsets]
    flips, end = 0, time.monotonic() + seconds
    stop = path + ".stop"
    while time.monotonic() < end and not os.path.exists(stop):  # each state held a while: loads see both
        for off in offsets:
            os.pwrite(fd, attack, off)
        time.sleep(random.uniform(0, 0.002))
        for off, data in zip(offsets, original):
            os.pwrite(fd, data, off)
        time.sleep(random.uniform(0, 0.002))
        flips += 1
    print(flips)
    """
)


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory, mlp_artifact: bladepack.api.Artifact) -> dict[str, Path]:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the attacker's library")
    d = tmp_path_factory.mktemp("race")
    mlp_artifact.save(d / "plain.bpk")
    generate_key(d / "k")
    sign_file(d / "plain.bpk", d / "k", d / "signed.bpk")
    (d / "attack.c").write_text(ATTACK_C)
    marker = d / "attacker-ran"
    r = subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", f'-DMARKER="{marker}"', str(d / "attack.c"), "-o", str(d / "attack.so")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return {"dir": d, "plain": d / "plain.bpk", "signed": d / "signed.bpk", "key": d / "k.pub", "marker": marker}


def _library_offsets(path: Path) -> list[int]:
    bpk = bpk_format.read(path)
    names = {lib["section"] for lib in bpk.manifest["native_cpu"]["libraries"]}
    return [bpk.data_start + e["offset"] for e in bpk.manifest["sections"] if e["name"] in names]


def _flipper(setting: dict[str, Path], path: Path) -> subprocess.Popen[str]:
    offsets = ",".join(map(str, _library_offsets(path)))
    attack = str(setting["dir"] / "attack.so")
    cmd = [sys.executable, "-c", FLIPPER, str(path), offsets, str(RACE_MAX_S), attack]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)


def _racing(flipper: subprocess.Popen[str], path: Path, start: float, ran: int, refused: int) -> bool:
    """Whether to load again: for RACE_S at least, then until each outcome was seen 3 times (a loaded
    machine loads slowly), at most RACE_MAX_S; once done, the flipper is told to stop."""
    more = flipper.poll() is None and (time.monotonic() - start < RACE_S or min(ran, refused) < 3)
    if not more:
        Path(f"{path}.stop").touch()
    return more


def test_the_attackers_library_would_leave_its_marker(setting: dict[str, Path]) -> None:
    """The detector works: loading the attacker's library runs its constructor."""
    code = f"import ctypes; ctypes.CDLL({str(setting['dir'] / 'attack.so')!r})"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert setting["marker"].exists()
    setting["marker"].unlink()


@pytest.mark.parametrize("how", ["signed", "signed, mapped", "pinned"])
def test_python_loads_never_run_bytes_flipped_in_place(setting: dict[str, Path], how: str) -> None:
    path = setting["dir"] / f"py-{how.replace(', ', '-')}.bpk"
    shutil.copyfile(setting["plain" if how == "pinned" else "signed"], path)
    trust: dict[str, Any] = (
        {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
        if how == "pinned"
        else {"trusted_keys": [setting["key"]]}
    )
    mapped: dict[str, Any] = {"mmap": True} if how.endswith("mapped") else {}
    x = np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)
    want = bladepack.load(setting["plain"], executor="reference")(x)
    flipper = _flipper(setting, path)
    ran = refused = 0
    k, start = 0, time.monotonic()
    while _racing(flipper, path, start, ran, refused):
        k += 1
        options = LoaderOptions.from_env(cache_dir=setting["dir"] / f"cache-{how}-{k % 2 and k}")
        try:
            m = bladepack.load(path, executor="native", options=options, **trust, **mapped)
        except (TrustError, BpkFormatError):
            refused += 1
            continue
        np.testing.assert_allclose(m(x), want, rtol=1e-5, atol=1e-6)
        ran += 1
    flips = int(flipper.communicate()[0])
    assert not setting["marker"].exists(), "the attacker's library ran"
    assert flips > 0 and ran > 0 and refused > 0, (flips, ran, refused)  # the race was really run


@pytest.mark.parametrize("flags", [["--trusted-key"], ["--trusted-key", "--mmap"], ["--sha256"]])
def test_bpk_run_never_runs_bytes_flipped_in_place(setting: dict[str, Path], flags: list[str]) -> None:
    build = cpp_build.build("release")
    path = setting["dir"] / f"cpp-{'-'.join(f.strip('-') for f in flags)}.bpk"
    pinned = flags[0] == "--sha256"
    shutil.copyfile(setting["plain" if pinned else "signed"], path)
    args = [flags[0], hashlib.sha256(path.read_bytes()).hexdigest() if pinned else str(setting["key"]), *flags[1:]]
    x = setting["dir"] / "x.npy"
    np.save(x, np.random.default_rng(1).standard_normal((3, 64), dtype=np.float32))
    flipper = _flipper(setting, path)
    ran = refused = 0
    start = time.monotonic()
    while _racing(flipper, path, start, ran, refused):
        r = subprocess.run(
            [str(build / "bpk-run"), str(path), *args, "--input", f"x={x}", "--output-dir", str(setting["dir"])],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if r.returncode == 0:
            ran += 1
        else:
            assert r.returncode == 1 and ("untrusted artifact" in r.stderr or "checksum mismatch" in r.stderr), r.stderr
            refused += 1
    flips = int(flipper.communicate()[0])
    assert not setting["marker"].exists(), "the attacker's library ran"
    assert flips > 0 and ran > 0 and refused > 0, (flips, ran, refused)


def _first_weight(path: Path) -> tuple[int, int]:
    bpk = bpk_format.read(path)
    entry = next(e for e in bpk.manifest["sections"] if e["name"].startswith("weight/"))
    return bpk.data_start + entry["offset"], entry["length"]


def test_a_signed_load_keeps_its_weights_when_the_file_is_rewritten(setting: dict[str, Path]) -> None:
    """Note [Mapped or private]: a signed load reads privately by default (weights included); with
    mmap=True weights are the file's bytes when used, as documented."""
    x = np.random.default_rng(2).standard_normal((2, 64), dtype=np.float32)
    outs = {}
    for mapped in (None, True):
        path = setting["dir"] / f"weights-{mapped}.bpk"
        shutil.copyfile(setting["signed"], path)
        m = bladepack.load(path, trusted_keys=[setting["key"]], mmap=mapped)
        before = m(x)
        at, n = _first_weight(path)
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(bytes(n))  # the weights zeroed in place
        outs[mapped] = (before, m(x))
    np.testing.assert_array_equal(outs[None][1], outs[None][0])
    assert not np.array_equal(outs[True][1], outs[True][0])


def test_a_private_load_survives_truncation(setting: dict[str, Path]) -> None:
    """`mmap=False`: the file may be truncated or replaced in place (`cp new.bpk model.bpk`) under a
    loaded model: no SIGBUS, the same results. Run in a child so that a fault fails the test instead
    of killing the test process."""
    path = setting["dir"] / "truncated.bpk"
    shutil.copyfile(setting["plain"], path)
    code = textwrap.dedent(
        f"""
        import os, numpy as np, bladepack
        m = bladepack.load({str(path)!r}, mmap=False)
        x = np.ones((4, 64), np.float32)
        before = m(x)
        os.truncate({str(path)!r}, 0)
        after = m(x)
        open({str(path)!r}, "wb").write(b"not an artifact")
        assert np.array_equal(after, before) and np.array_equal(m(x), before)
        print("same results")
        """
    )
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "same results" in r.stdout, (r.returncode, r.stderr[-2000:], time.monotonic() - start)


def test_a_file_that_shrinks_while_read_is_a_clean_error(setting: dict[str, Path], tmp_path: Path) -> None:
    """A private read that finds fewer bytes than the file had says so (a writer truncated it)."""
    path = tmp_path / "shrinks.bpk"
    shutil.copyfile(setting["plain"], path)
    size = path.stat().st_size

    class Shrinking:
        def __init__(self) -> None:
            self.f = open(path, "rb")  # noqa: SIM115

        def readinto(self, view: memoryview) -> int:
            n = self.f.readinto(view[: min(len(view), 4096)])
            os.truncate(path, 8192)
            return n or 0

    with pytest.raises(BpkFormatError, match=rf"the file shrank while being read \(8192 of {size} bytes\)"):
        bpk_format._read_private(Shrinking(), size, str(path))


def test_a_pinned_load_is_never_mapped(setting: dict[str, Path]) -> None:
    """The pin covers the bytes read: mapping a pinned file would check one state of it and run
    another, so both loaders refuse the combination with the same words."""
    digest = hashlib.sha256(setting["plain"].read_bytes()).hexdigest()
    with pytest.raises(ValueError, match="a pinned load reads the file privately") as e:
        bladepack.load(setting["plain"], sha256=digest, mmap=True)
    r = subprocess.run(
        [str(cpp_build.build("release") / "bpk-run"), str(setting["plain"]), "--sha256", digest, "--mmap"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and r.stderr.strip() == f"bpk-run: invalid argument: {e.value}", r.stderr
    bladepack.load(setting["plain"], sha256=digest, mmap=False)
