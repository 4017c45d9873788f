"""`bladepack inspect` (text and the stable JSON contract) and `bladepack run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

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
    assert data["format_version"] == "1.14"
    assert data["padding"] == {}  # its one dim is batch-like: nothing to pad
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
    assert "new input shapes (Python loader): prepared by the kernel library, one native call each" in r.stdout


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


def test_run_refuses_unknown_input_names(mlp_artifact, tmp_path: Path, capsys) -> None:
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    np.save(tmp_path / "x.npy", np.ones((3, 64), np.float32))
    given = ["--input", f"x={tmp_path / 'x.npy'}", "--input", f"y={tmp_path / 'x.npy'}"]
    assert main(["run", str(path), *given, "--output-dir", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == "bladepack: error: unknown --input y; the inputs are x\n"


def test_version_and_python_m_bladepack() -> None:
    r = subprocess.run([sys.executable, "-m", "bladepack", "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == f"bladepack {bladepack.__version__}\n", (r.stdout, r.stderr)


def test_errors_are_one_prefixed_line(mlp_artifact, tmp_path: Path) -> None:
    """Usage and file errors alike: `bladepack: error: ...` on stderr, exit status 1, no traceback."""
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    for argv in (
        ["inspect", str(tmp_path / "missing.bpk")],
        ["run", str(path), "--input", "x"],
        ["run", str(path)],
        ["optimize", str(path), "-o", str(tmp_path / "o.bpk")],
    ):
        r = subprocess.run([sys.executable, "-m", "bladepack", *argv], capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.startswith("bladepack: error: "), (argv, r.stderr)
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (argv, r.stderr)


def test_output_into_a_closed_pipe_is_quiet(mlp_artifact, tmp_path: Path) -> None:
    """`bladepack verify --json | head -c 10`: the reader has gone; exit 1 with no BrokenPipeError traceback
    (here the pipe's read end is closed before the command starts, so its first write fails)."""
    path = tmp_path / "m.bpk"
    mlp_artifact.save(path)
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        cmd = [sys.executable, "-m", "bladepack", "verify", "--json", str(path)]
        r = subprocess.run(cmd, stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert r.returncode == 1 and r.stderr == "", r.stderr


def test_artifact_repr_is_a_summary(mlp_artifact) -> None:
    """print(artifact) is one line naming the signature, not every weight and kernel source."""
    text = repr(mlp_artifact)
    assert text.startswith("<bladepack Artifact: inputs (x: float32[batch, 64]); outputs (output0: float32[batch, 10])")
    assert "weights (" in text and "cpu kernels: " in text and len(text) < 500 and str(mlp_artifact) == text
