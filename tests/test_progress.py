"""Note [Progress]: an optimize reports its stages and kernel compiles (BLADEPACK_LOG=info), and draws
a bar only where asked (a terminal, or BLADEPACK_PROGRESS=1)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
import torch

import bladepack
from bladepack.progress import Progress, configure_logging


def test_stages_and_compiles_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    with caplog.at_level(logging.INFO, logger="bladepack"):
        bladepack.optimize(m, [(torch.randn(2, 8),), (torch.randn(3, 8),)])
    text = caplog.text
    for stage in ("front end", "torch.export", "graph passes", "fusion (cpu)", "plan (", "build (cpu)", "optimized in"):
        assert stage in text, text
    assert "kernel library:" in text and ("compiled in" in text or "from the cache" in text), text


def test_bladepack_log_info_prints_to_stderr() -> None:
    """BLADEPACK_LOG=info alone (no logging set-up in the program) prints the stages."""
    code = (
        "import torch, bladepack\n"
        "bladepack.optimize(torch.nn.Linear(4, 4), [(torch.randn(2, 4),), (torch.randn(3, 4),)])\n"
    )
    env = {"BLADEPACK_LOG": "info", "PATH": "/usr/bin:/bin"}
    import os

    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, **env}, timeout=600
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "bladepack: front end" in r.stderr and "torch.export (symbolic shapes)" in r.stderr, r.stderr
    assert "bladepack: optimized in" in r.stderr


def test_bar_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    p = Progress(2, "auto")  # pytest's stderr is no terminal: no bar
    with p.stage("one"):
        pass
    p.close()
    assert "one" not in capsys.readouterr().err
    p = Progress(2, "1")
    with p.stage("two"):
        p.done("a unit")
    p.close()
    assert "two" in capsys.readouterr().err


def test_configure_logging_adds_one_handler() -> None:
    log = logging.getLogger("bladepack")
    before = list(log.handlers), log.level
    try:
        configure_logging("INFO")
        configure_logging("INFO")
        assert sum(h.get_name() == "bladepack-stderr" for h in log.handlers) == 1
    finally:
        log.handlers[:] = before[0]
        log.setLevel(before[1])


def test_a_slow_stage_says_so_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """Note [Progress]: off a terminal and without BLADEPACK_LOG, a stage running past the threshold
    prints that it runs, the work it finishes, and its end; a fast one and a quiet run print nothing."""
    import time

    progress = Progress(2, "0", slow_s=0.05)
    with progress.stage("fast"):
        pass
    with progress.stage("build (cpu)"):
        time.sleep(1.5)  # long past the threshold, also on a loaded machine
        progress.done("x86-64 kernel library: compiled in 0.3 s")
    lines = capsys.readouterr().err.splitlines()
    assert (
        lines[0] == "bladepack: build (cpu) ..." and lines[1] == "bladepack:   x86-64 kernel library: compiled in 0.3 s"
    )
    assert lines[2].startswith("bladepack: build (cpu) done (") and len(lines) == 3, lines
    quiet = Progress(1, "0", quiet=True, slow_s=0.05)
    with quiet.stage("build (cpu)"):
        time.sleep(0.2)
    assert capsys.readouterr().err == ""
