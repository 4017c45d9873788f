"""Note [Split reductions] (codegen/cuda_emitter.py): reduce kernels with few outputs share each
output's reduction among a block's threads. On the fake driver (kernels emulated, the block's threads as
fibers with real barriers), against eager at output counts around the block's 32 and reduction lengths
around the variants' bounds, in both loaders' Python path; which variant ran is read from the launch log."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bladepack
from tests.cuda_harness import FakeGpu, ptxas_reports
from tests.helpers import rel_err

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found (CUDA targets need it)")


class _Columns(torch.nn.Module):
    """Reductions over leading and middle axes, every combining kind, and a mean over a sequence."""

    def forward(self, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        total = x.sum(0)
        top = x.amax(0)
        low = x.amin(0)
        prod = (1.0 + x * 1e-3).prod(0)
        pooled = y.mean(1)  # [b, s, h] -> [b, h]: a sentence embedding's pooling
        both = y.sum((0, 2))  # two reduced axes around a kept one
        count = ids.sum(0)  # int64
        most = ids.amax(0)
        return total, top, low, prod, pooled, both, count, most


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("columns")


@pytest.fixture(scope="module")
def columns(dump: Path) -> bladepack.api.Artifact:
    r, c = torch.export.Dim("r", min=1, max=4096), torch.export.Dim("c", min=1, max=40000)
    b, s = torch.export.Dim("b", min=1, max=64), torch.export.Dim("s", min=1, max=2048)
    h = torch.export.Dim("h", min=1, max=1024)
    sample = (torch.randn(70, 33), torch.randn(2, 65, 40), torch.randint(0, 9, (70, 33)))
    options = bladepack.CompileOptions(dump_dir=dump)
    return bladepack.optimize(
        _Columns(),
        [sample],
        ({0: r, 1: c}, {0: b, 1: s, 2: h}, {0: r, 1: c}),
        targets=("cuda:sm_90",),
        options=options,
    )


def _inputs(rows: int, cols: int, seq: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * 3
    if rows > 2 and cols > 3:  # NaN and -inf reach max / min as torch's do
        x[rows // 2, 1] = float("nan")
        x[rows - 1, 2] = float("-inf")
        x[0, 3] = float("inf")
    y = torch.randn(2, seq, 40, generator=g)
    ids = torch.randint(-1000, 1000, (rows, cols), generator=g)
    return x, y, ids


# (rows reduced, columns kept, sequence): around 32 outputs a block, the 64- and 256-element bounds
@pytest.mark.parametrize(
    "rows,cols,seq",
    [
        (1, 1, 1),
        (63, 31, 63),
        (64, 32, 64),
        (65, 33, 65),
        (255, 1, 300),
        (256, 7, 256),
        (257, 31, 257),
        (1000, 97, 1000),
        (300, 2049, 17),
    ],
)
def test_split_reductions_match_eager(
    gpu: FakeGpu, columns: bladepack.api.Artifact, rows: int, cols: int, seq: int
) -> None:
    args = _inputs(rows, cols, seq, rows * 7919 + cols)
    _, results, log = gpu.run(columns, [tuple(a.numpy() for a in args)])
    out = results[0]
    assert not isinstance(out, str), out
    with torch.no_grad():
        want = _Columns()(*args)
    for k, (o, w) in enumerate(zip(out, want)):
        w = w.numpy()
        assert o.dtype == w.dtype and o.shape == w.shape, k
        assert np.array_equal(np.isnan(o), np.isnan(w)), f"output {k}: NaN positions differ"
        fine = ~np.isnan(w)
        if w.dtype.kind == "i":
            assert np.array_equal(o, w), f"output {k} at {rows}x{cols}"
        else:
            assert rel_err(o[fine], w[fine]) <= 1e-5, (
                f"output {k} at {rows}x{cols}x{seq}: {rel_err(o[fine], w[fine]):.3g}"
            )
    launched = [line.split()[1] for line in log.splitlines() if line.startswith("launch ")]
    split = [name for name in launched if "_split" in name]
    if rows >= 256 and cols < 32:
        assert any(name.endswith("_split1") for name in split), launched
    if rows >= 64 and 32 <= cols:
        assert any(name.endswith("_split32") for name in split), launched
    if rows < 64 and seq < 64:  # only the two-axis sum (2 x 40 elements an output) splits
        assert len(split) == 1, launched


def test_split_reductions_keep_registers(columns: bladepack.api.Artifact, dump: Path) -> None:
    """ptxas: the split variants use no stack frame and spill nothing."""
    variants = {v.name for k in columns.plan.kernels if k.target == "cuda" for v in k.variants}
    assert any(v.endswith("_split1") for v in variants) and any(v.endswith("_split32") for v in variants), variants
    (src,) = dump.rglob("*.cu")
    split = {name: r for name, r in ptxas_reports(src, "sm_90").items() if re.search(r"_split(1|32)$", name)}
    assert split
    for name, r in split.items():
        assert "0 bytes stack frame" in r and "0 bytes spill stores" in r, (name, r)


def test_the_cpp_runtime_runs_them_alike(gpu: FakeGpu, columns: bladepack.api.Artifact) -> None:
    """The C++ runtime chooses the same variants and gets the same bits as the Python loader."""
    args = tuple(a.numpy() for a in _inputs(300, 40, 300, 11))
    _, ours, log = gpu.run(columns, [args])
    _, theirs, cpp_log = gpu.run_cpp(columns, [args], calls=1)
    assert not isinstance(theirs[0], str), theirs[0]
    for a, b in zip(ours[0], theirs[0]):
        assert a.tobytes() == b.tobytes()

    def launched(text: str) -> list[str]:
        return [line.split()[1] for line in text.splitlines() if line.startswith("launch ")]

    assert any(name.endswith("_split32") for name in launched(cpp_log)), launched(cpp_log)
    assert launched(cpp_log) == launched(log)
