"""The package as users get it: `python -m build` gives an sdist and a wheel holding everything the
compiler needs (the kernel preludes included), and the wheel, installed with pip into a fresh virtual
environment, runs the README's quick start — optimize a model, save it, load it in a fresh process
that never imports torch, and check it against eager."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what a wheel must hold beyond the Python modules: the generated kernels' preludes
PACKAGE_DATA = (
    "bladepack/codegen/cpu_runtime.h",
    "bladepack/codegen/cpu_gemm.h",
    "bladepack/codegen/cpu_pool_run.h",
    "bladepack/codegen/scalar_ops.h",
    "bladepack/codegen/cuda_runtime.cuh",
)
MODULES = ("bladepack/opset/table.py", "bladepack/backends/cpu.py", "bladepack/stages.py", "bladepack/loader/module.py")


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("dist")
    src = tmp_path_factory.mktemp("src") / "bladepack"  # a copy: the build writes its metadata beside the sources
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "__pycache__", "*.egg-info", ".*cache*", ".whl", ".gpu-*"
        ),
    )
    r = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (sdist,) = out.glob("bladepack-*.tar.gz")
    (wheel,) = out.glob("bladepack-*.whl")
    return sdist, wheel


def test_sdist_and_wheel_hold_the_package(dists: tuple[Path, Path]) -> None:
    sdist, wheel = dists
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [n for n in (*PACKAGE_DATA, *MODULES) if n not in names]
    assert not missing, f"the wheel lacks {missing}"
    assert not any(n.startswith("tests/") for n in names)
    with tarfile.open(sdist) as tar:
        held = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    missing = [n for n in (*PACKAGE_DATA, *MODULES, "pyproject.toml", "README.md") if n not in held]
    assert not missing, f"the sdist lacks {missing}"


QUICK_START = """
import sys, torch, bladepack

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)
        self.fc = torch.nn.Linear(64, 64)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(self.norm(x)))

torch.manual_seed(0)
model = Block().eval()
art = bladepack.optimize(model, [(torch.randn(2, 16, 64),), (torch.randn(4, 9, 64),)])  # batch, seq dynamic
art.save(sys.argv[1])
x = torch.randn(3, 11, 64)
torch.save((x, model(x).detach()), sys.argv[2])
"""

LOAD = """
import sys, numpy as np, bladepack

m = bladepack.load(sys.argv[1])
x, want = np.load(sys.argv[2] + ".x.npy"), np.load(sys.argv[2] + ".y.npy")
got = m(x)
assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), np.abs(got - want).max()
assert m.verify()["passed"], "the artifact's reference cases failed"
assert "torch" not in sys.modules and "sympy" not in sys.modules, "the loader imported the compiler's dependencies"
print(m.signature)
"""


@pytest.mark.slow
def test_wheel_installs_and_runs_the_quick_start(dists: tuple[Path, Path], tmp_path: Path) -> None:
    """pip installs the wheel (torch 2.13.0 first, as the README says, so that nothing pulls a CUDA
    build) into a fresh environment, where the quick start optimizes, saves and reloads the model."""
    _, wheel = dists
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")

    def pip(*args: str) -> None:
        r = subprocess.run([py, "-m", "pip", "install", "-q", *args], capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    pip("torch==2.13.0")
    pip(f"{wheel}[export]")
    art, data = tmp_path / "block.bpk", tmp_path / "io.pt"
    r = subprocess.run([py, "-c", QUICK_START, str(art), str(data)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    to_numpy = "import sys, torch, numpy as np; x, y = torch.load(sys.argv[1]); "
    to_numpy += "np.save(sys.argv[1] + '.x.npy', x.numpy()); np.save(sys.argv[1] + '.y.npy', y.numpy())"
    subprocess.run([py, "-c", to_numpy, str(data)], check=True, timeout=300)
    r = subprocess.run(
        [py, "-c", textwrap.dedent(LOAD), str(art), str(data)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "x_dim0" in r.stdout, r.stdout
