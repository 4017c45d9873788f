"""`bladepack inspect` (text and the stable JSON contract) and `bladepack run`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import bladepack
from bladepack.cli import main

KEYS = {
    "format_version",
    "producer",
    "inputs",
    "outputs",
    "symbols",
    "plan",
    "kernels",
    "gemm_configs",
    "weights_bytes",
    "arena_bytes",
    "cpu_libraries",
    "reference_steps",
}


def test_inspect_json_contract(mlp_artifact, tmp_path: Path, capsys) -> None:
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    assert main(["inspect", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert KEYS <= set(data)
    assert data["format_version"] == "1.4"
    assert {"bladepack", "torch"} <= set(data["producer"])
    assert data["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 64]}]
    assert data["symbols"] == {"batch": {"min": 1, "max": 64}}
    assert data["plan"]["steps"] == sum(data["plan"]["by_kind"].values()) and data["plan"]["by_kind"]["matmul"] == 3
    # three GEMMs through BLAS; their epilogues (bias, ReLU, GELU, residual, log-softmax) in generated kernels
    assert [g["library"] for g in data["gemm_configs"]] == ["blas"] * 3
    assert [g["m"] for g in data["gemm_configs"]] == ["batch"] * 3
    assert [(k["target"], k["kind"]) for k in data["kernels"]] == [("cpu", "loop"), ("cpu", "loop"), ("cpu", "row")]
    assert len(data["cpu_libraries"]) == 1
    assert data["reference_steps"] == []
    assert data["weights_bytes"] == 4 * (64 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10)
    assert "batch" in data["arena_bytes"]


def test_inspect_text(mlp_artifact, tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    r = subprocess.run([sys.executable, "-m", "bladepack.cli", "inspect", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "x: float32[batch, 64]" in r.stdout and "batch in [1, 64]" in r.stdout and "plan:" in r.stdout
    assert "reference steps: none" in r.stdout


def test_inspect_corrupt_file_is_an_error_not_a_crash(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.bpk"
    bad.write_bytes(b"\x89BPK\r\n\x1a\n" + b"\0" * 10)
    assert main(["inspect", str(bad)]) == 1
    assert "truncated" in capsys.readouterr().err


def test_run_writes_npy(mlp_artifact, tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    x = np.random.default_rng(0).standard_normal((3, 64), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", str(tmp_path / "out")]) == 0
    assert np.array_equal(np.load(tmp_path / "out" / "output0.npy"), bladepack.load(path)(x))


def test_run_refuses_unknown_input_names(mlp_artifact, tmp_path: Path) -> None:
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    np.save(tmp_path / "x.npy", np.ones((3, 64), np.float32))
    given = ["--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'x.npy'}"]
    with pytest.raises(SystemExit, match="unknown --input y; the inputs are x"):
        main(["run", str(path), *given, "--output-dir", str(tmp_path / "out")])
