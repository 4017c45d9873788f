"""The documentation: the site builds with warnings as errors (every page in the nav, every link
between pages resolving, anchors included), and the README stays a front door."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mkdocs is not installed (pip install mkdocs-material: the dev extra has it)")
    mkdocs = str(Path(sys.executable).parent / "mkdocs")
    r = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (tmp_path / "site" / "architecture" / "index.html").is_file()


def test_readme_is_a_front_door() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md grows past 200 lines: move details to a page under docs/"
    assert "bash scripts/demo.sh" in text and "bash scripts/test.sh" in text  # the two set-up commands
