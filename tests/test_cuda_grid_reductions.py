"""Note [Grid reductions] (codegen/cuda_grid_reduce.py): reductions of fewer than 32 outputs over at least
two chunks of elements each are split over several blocks per output, whose parts a second kernel combines.
On the fake driver (kernels emulated on the CPU), against eager at reduction lengths around the chunk
bounds, output counts around 32, size 1 and the range's end, in float32, float16 and int64, in both
loaders; which variant ran, and whether the combining kernel did, is read from the launch log."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import bladepack
from bladepack.codegen.cuda_grid_reduce import GRID_CHUNK
from tests.cuda_harness import FakeGpu, ptxas_reports
from tests.helpers import rel_err

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found (CUDA targets need it)")

N_MAX = 300_000


class _Long(torch.nn.Module):
    """Every combining kind over trailing, leading and all axes, with a fused producer and a consumer."""

    def forward(self, x: torch.Tensor, z: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        total = x.sum()  # one output over everything
        rows = x.mean(1)  # c outputs over n
        top = x.amax(1)
        low = x.amin(1, keepdim=True)
        prod = (1.0 + x * 1e-5).prod(1)
        energy = (x * x).mean()  # the producer computed inside the reduction
        centered = x - x.mean()  # a consumer reading the combined output
        cols = z.sum(0)  # few columns over many rows: strided reads
        colmax = z.amax(0)
        count = ids.sum(1)  # int64 parts
        return total, rows, top, low, prod, energy, centered, cols, colmax, count


@pytest.fixture(scope="module")
def dump(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grid")


@pytest.fixture(scope="module")
def long(dump: Path) -> bladepack.api.Artifact:
    c, n = torch.export.Dim("c", min=1, max=64), torch.export.Dim("n", min=1, max=N_MAX)
    m, k = torch.export.Dim("m", min=1, max=N_MAX), torch.export.Dim("k", min=1, max=40)
    sample = (torch.randn(3, 70), torch.randn(50, 3), torch.randint(0, 9, (3, 70)))
    return bladepack.optimize(
        _Long(),
        [sample],
        ({0: c, 1: n}, {0: m, 1: k}, {0: c, 1: n}),
        targets=("cuda:sm_90",),
        options=bladepack.CompileOptions(dump_dir=dump),
    )


def _inputs(c: int, n: int, m: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(c, n, generator=g) * 3
    if c > 2 and n > 10:  # NaN and -inf reach the sums, max and min as torch's do
        x[1, n - 3] = float("nan")
        x[2, n // 2] = float("-inf")
    z = torch.randn(m, k, generator=g)
    ids = torch.randint(-1000, 1000, (c, n), generator=g)
    return x, z, ids


def _check(out: list[np.ndarray], args: tuple[torch.Tensor, ...], where: str) -> None:
    """Each float output within 1e-5 of float64 eager, or within twice torch's own float32 error there (a
    float32 product of 20000 factors is 1.8e-4 off in torch); integers exact."""
    with torch.no_grad():
        want = _Long()(*args)
        exact = _Long()(*(a.double() if a.is_floating_point() else a for a in args))
    for i, (o, w, e) in enumerate(zip(out, want, exact)):
        w, e = w.numpy(), e.numpy()
        assert o.dtype == w.dtype and o.shape == w.shape, (i, where)
        assert np.array_equal(np.isnan(o), np.isnan(w)), f"output {i} at {where}: NaN positions differ"
        if w.dtype.kind == "i":
            assert np.array_equal(o, w), f"output {i} at {where}"
            continue
        inf = np.isinf(e)
        assert np.array_equal(o[inf], e[inf].astype(o.dtype)), f"output {i} at {where}: infinities differ"
        fine = np.isfinite(e)
        ours, torch_err = (rel_err(v[fine].astype(np.float64), e[fine]) for v in (o, w))
        assert ours <= max(1e-5, 2 * torch_err), f"output {i} at {where}: {ours:.3g} (torch {torch_err:.3g})"


def _launched(log: str) -> list[str]:
    return [line.split()[1] for line in log.splitlines() if line.startswith("launch ")]


# (c rows of n, m rows of k columns): lengths one below, at and above two chunks (the smallest split),
# a part count capped by the block budget, 31 / 32 outputs, size 1, the range's end
CASES = [
    (1, 1, 1, 1),
    (1, 2 * GRID_CHUNK - 1, 2 * GRID_CHUNK - 1, 1),
    (1, 2 * GRID_CHUNK, 2 * GRID_CHUNK, 3),
    (3, 2 * GRID_CHUNK + 1, 40_001, 31),
    (31, 20_000, 20_000, 32),
    (32, 9_000, 17_000, 7),
    (2, N_MAX, N_MAX, 2),
]


@pytest.mark.parametrize("c,n,m,k", CASES)
def test_grid_reductions_match_eager(
    gpu: FakeGpu, long: bladepack.api.Artifact, c: int, n: int, m: int, k: int
) -> None:
    args = _inputs(c, n, m, k, c * 7919 + n + k)
    _, results, log = gpu.run(long, [tuple(a.numpy() for a in args)])
    assert not isinstance(results[0], str), results[0]
    _check(results[0], args, f"{c}x{n}, {m}x{k}")
    launched = _launched(log)
    grid = [name for name in launched if name.endswith("_grid")]
    # kernels splitting here: the two reductions of all of x (c x n elements, one output), the five over
    # its rows (n elements, c < 32 outputs: row kernels), the two over z's columns (m, k < 32: reduce
    # kernels); x's mean under the subtraction stays in its row kernel (not the root)
    both = 2 * GRID_CHUNK
    expect = 2 * (c * n >= both) + 5 * (c < 32 and n >= both) + 2 * (k < 32 and m >= both)
    assert len(grid) == expect, launched
    # each split kernel is followed by the kernel combining its parts (no suffix: one variant)
    for name in grid:
        following = launched[launched.index(name) + 1]
        assert re.fullmatch(r"k\d+", following), (name, following, launched)


def test_split_and_unsplit_shapes_share_one_artifact(gpu: FakeGpu, long: bladepack.api.Artifact) -> None:
    """Signatures that split and signatures that do not alternate in one process, CUDA graphs replayed:
    each call matches eager (the combining launch is skipped where its condition fails)."""
    cases = [_inputs(*shape, 5) for shape in ((1, 40_000, 3, 2), (40, 50, 60, 33), (1, 40_000, 3, 2))]
    _, results, log = gpu.run(long, [tuple(a.numpy() for a in case) for case in cases], calls=3)
    for case, out in zip(cases, results):
        assert not isinstance(out, str), out
        _check(out, case, "alternating")
    assert "graph_launch" in log


def test_float16_parts_accumulate_in_float32(gpu: FakeGpu, dump: Path) -> None:
    """float16 input: the parts are float32, the combined output float16 (within float16's rounding)."""

    class Half(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.sum(), x.float().mean(1)

    n = torch.export.Dim("n", min=1, max=N_MAX)
    art = bladepack.optimize(Half(), [(torch.randn(2, 64).half(),)], ({1: n},), targets=("cuda:sm_90",))
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(2, 50_000, generator=g) - 0.5).half()
    _, results, log = gpu.run(art, [(x.numpy(),)])
    assert not isinstance(results[0], str), results[0]
    total, means = results[0]
    want_total, want_means = (t.double() for t in Half()(x.float().half().float()))
    assert total.dtype == np.float16 and abs(float(total) - float(want_total)) <= 2e-3 * (1 + abs(float(want_total)))
    assert rel_err(means.astype(np.float64), want_means.numpy()) <= 1e-5
    assert any(name.endswith("_grid") for name in _launched(log)), log


def test_the_cpp_runtime_runs_them_alike(gpu: FakeGpu, long: bladepack.api.Artifact) -> None:
    """The C++ runtime chooses the same variants, launches the same combining kernels and gets the same
    bits as the Python loader."""
    args = tuple(a.numpy() for a in _inputs(3, 2 * GRID_CHUNK + 1, 40_001, 31, 11))
    _, ours, log = gpu.run(long, [args])
    _, theirs, cpp_log = gpu.run_cpp(long, [args], calls=1)
    assert not isinstance(theirs[0], str), theirs[0]
    for a, b in zip(ours[0], theirs[0]):
        assert a.tobytes() == b.tobytes()
    assert any(name.endswith("_grid") for name in _launched(cpp_log)), cpp_log
    assert _launched(cpp_log) == _launched(log)


def test_inspect_names_the_combining_kernel(long: bladepack.api.Artifact) -> None:
    from bladepack.inspect import inspect_text, manifest_summary

    text = inspect_text(manifest_summary(long._parts()[0]))
    assert "reduce_combine (the parts of the reductions the kernel before it split over blocks" in text, text


def test_grid_variants_keep_registers(long: bladepack.api.Artifact, dump: Path) -> None:
    """ptxas: the split and combining kernels use no stack frame and spill nothing."""
    (src,) = dump.rglob("*.cu")
    reports = ptxas_reports(src, "sm_90")
    grid = {name: r for name, r in reports.items() if name.endswith("_grid")}
    assert len(grid) >= 3, sorted(reports)
    for name, r in reports.items():
        assert "0 bytes stack frame" in r and "0 bytes spill stores" in r, (name, r)
