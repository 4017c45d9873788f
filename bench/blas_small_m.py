"""Single-threaded sgemm at the samples' weight shapes, M from 1 to 255: numpy's OpenBLAS against MKL.

In: numpy's bundled OpenBLAS (always) and MKL's libmkl_rt (the `mkl` wheel: `pip install mkl`, or
`--mkl PATH`; sequential threading layer). Out: a markdown table of median µs per call and the ratio
OpenBLAS / MKL (printed; `--out FILE` also writes it). Both are called through cblas_sgemm, row-major,
A [M, K] times the weight W [N, K] transposed — how the CPU kernels call BLAS for a linear layer —
one library after the other at each shape, results checked against each other. Each figure includes
the cost of a ctypes call, printed first (the median of an empty call, M = 0): figures within a few µs
of it say little about the library. The kernel library's own GEMM times are in m.profile().

    python -m bench.blas_small_m [--mkl /path/to/libmkl_rt.so.3] [--out bench/results/blas_small_m.md]
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

SHAPES = [(64, 256), (256, 256), (256, 10), (64, 192), (256, 64), (256, 768), (256, 1024), (1024, 256)]
ROWS = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 48, 64, 128, 255]
Gemm = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def _cblas(lib: ctypes.CDLL, names: tuple[str, ...]) -> Gemm:
    for name in names:
        f = getattr(lib, name, None)
        if f is not None:
            break
    else:
        raise SystemExit(f"no cblas_sgemm in {lib._name}")
    wide = name.endswith("64_")  # numpy's OpenBLAS is ILP64
    i = ctypes.c_int64 if wide else ctypes.c_int
    f.restype = None
    f.argtypes = [ctypes.c_int] * 3 + [i] * 3 + [ctypes.c_float, ctypes.c_void_p, i, ctypes.c_void_p, i]
    f.argtypes += [ctypes.c_float, ctypes.c_void_p, i]

    def gemm(a: np.ndarray, w: np.ndarray, c: np.ndarray) -> None:
        m, k = a.shape
        n = w.shape[0]
        f(101, 111, 112, m, n, k, 1.0, a.ctypes.data, k, w.ctypes.data, k, 0.0, c.ctypes.data, n)

    return gemm


def openblas_library() -> ctypes.CDLL:
    """numpy's bundled OpenBLAS, set to one thread."""
    found = sorted(glob.glob(str(Path(np.__file__).parent.parent / "numpy.libs" / "libscipy_openblas*.so*")))
    if not found:
        raise SystemExit("numpy's bundled OpenBLAS not found")
    lib = ctypes.CDLL(found[0])
    for name in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads"):
        if hasattr(lib, name):
            getattr(lib, name)(1)
    return lib


def _openblas() -> Gemm:
    return _cblas(openblas_library(), ("scipy_cblas_sgemm64_", "scipy_cblas_sgemm", "cblas_sgemm"))


def _mkl(path: str | None) -> Gemm:
    if path is None:
        found = sorted(glob.glob(os.path.join(sys.prefix, "lib", "libmkl_rt.so*")))
        if not found:
            raise SystemExit("MKL not found: pip install mkl, or pass --mkl /path/to/libmkl_rt.so.3")
        path = found[0]
    lib = ctypes.CDLL(path)
    lib.MKL_Set_Threading_Layer(1)  # MKL_THREADING_SEQUENTIAL
    return _cblas(lib, ("cblas_sgemm",))


def _median_us(fn: Callable[[], None], repeat: int = 300) -> float:
    for _ in range(20):
        fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mkl", help="libmkl_rt.so (default: the mkl wheel's, under sys.prefix/lib)")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    libs = {"OpenBLAS": _openblas(), "MKL": _mkl(args.mkl)}
    rng = np.random.default_rng(0)
    empty = (np.zeros((0, 8), np.float32), np.zeros((8, 8), np.float32), np.zeros((0, 8), np.float32))
    call = {name: _median_us(lambda g=g: g(*empty)) for name, g in libs.items()}
    overhead = "an empty call (ctypes' own cost): " + ", ".join(f"{k} {v:.1f} µs" for k, v in call.items())
    print(overhead)
    lines = ["| K x N | " + " | ".join(f"M={m}" for m in ROWS) + " |", "|---" * (len(ROWS) + 1) + "|"]
    for k, n in SHAPES:
        w = rng.random((n, k), dtype=np.float32)
        cells = []
        for m in ROWS:
            a = rng.random((m, k), dtype=np.float32)
            out = {name: np.zeros((m, n), np.float32) for name in libs}
            t = {name: _median_us(lambda g=g, c=out[name]: g(a, w, c)) for name, g in libs.items()}
            np.testing.assert_allclose(out["MKL"], out["OpenBLAS"], rtol=1e-4, atol=1e-4)
            cells.append(f"{t['OpenBLAS']:.1f} / {t['MKL']:.1f} ({t['OpenBLAS'] / t['MKL']:.2f}x)")
        lines.append(f"| {k} x {n} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print("µs per call, OpenBLAS / MKL (OpenBLAS time over MKL time)\n")
    print(table)
    if args.out:
        Path(args.out).write_text(
            "# Single-threaded sgemm, OpenBLAS (numpy's) / MKL (`python -m bench.blas_small_m`)\n\n"
            f"µs per call, A [M, K] @ W [N, K]^T; in brackets OpenBLAS time over MKL time; {overhead}.\n\n"
            + table
            + "\n"
        )


if __name__ == "__main__":
    main()
