"""Single-threaded float32 GEMMs at the samples' linear-layer shapes: bladepack's dense kernel against the
libraries that could replace it — numpy's OpenBLAS, oneDNN and BLIS (issue 21's library survey; MKL
against OpenBLAS is in bench/results/blas_small_m.md).

In: numpy's bundled OpenBLAS (cblas_sgemm), oneDNN's `dnnl_sgemm` (the `onednn-cpu-gomp` wheel's libdnnl.so,
OMP_NUM_THREADS=1), BLIS's `bli_sgemm` (the `blis` wheel's extension, which exports the BLIS API), and
bladepack's dense kernel (Note [Dense layers]) for a bias-free Linear(K, N) built with one thread. Out:
a markdown table of µs per product A [M, K] @ W [N, K]^T per library (printed; `--out FILE` writes it).

Library calls go through ctypes with their arguments prepared once; each library's figure is its median
call less the median of the same call with M = 0 (ctypes' own cost), so it is the library's time. The
dense kernel's figure is its launch time from `m.profile()`, measured inside the kernel library. Every
result is checked against float64 numpy.

    pip install onednn-cpu-gomp blis
    python -m bench.gemm_libraries [--onednn /path/to/libdnnl.so.3] [--out bench/results/gemm_libraries.md]
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

os.environ.setdefault("OMP_NUM_THREADS", "1")  # oneDNN's OpenMP runtime reads it at load
os.environ.setdefault("BLADEPACK_NUM_THREADS", "1")

import numpy as np

SHAPES = [(64, 256), (256, 256), (256, 10), (256, 64), (256, 512), (512, 256), (768, 768), (768, 3072)]
ROWS = [1, 4, 17, 64, 255, 1024]
Call = Callable[[int], None]  # run the product with M rows (0: only the call's own cost)


def _addr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def _openblas(a: np.ndarray, w: np.ndarray, c: np.ndarray) -> Call:
    from bench.blas_small_m import openblas_library

    lib = openblas_library()
    f = getattr(lib, "scipy_cblas_sgemm64_", None) or lib.cblas_sgemm
    i = ctypes.c_int64
    f.restype = None
    f.argtypes = [ctypes.c_int] * 3 + [i] * 3 + [ctypes.c_float, ctypes.c_void_p, i, ctypes.c_void_p, i]
    f.argtypes += [ctypes.c_float, ctypes.c_void_p, i]
    k, n = a.shape[1], w.shape[0]
    pa, pw, pc = _addr(a), _addr(w), _addr(c)
    return lambda m: f(101, 111, 112, m, n, k, 1.0, pa, k, pw, k, 0.0, pc, n)


def _onednn(path: str, a: np.ndarray, w: np.ndarray, c: np.ndarray) -> Call:
    lib = ctypes.CDLL(path)
    f = lib.dnnl_sgemm  # row-major: C = alpha op(A) op(B) + beta C
    i = ctypes.c_int64
    f.restype = ctypes.c_int
    f.argtypes = [ctypes.c_char, ctypes.c_char, i, i, i, ctypes.c_float, ctypes.c_void_p, i, ctypes.c_void_p, i]
    f.argtypes += [ctypes.c_float, ctypes.c_void_p, i]
    k, n = a.shape[1], w.shape[0]
    pa, pw, pc = _addr(a), _addr(w), _addr(c)

    def call(m: int) -> None:
        if f(b"N", b"T", m, n, k, 1.0, pa, k, pw, k, 0.0, pc, n):
            raise RuntimeError("dnnl_sgemm failed")

    return call


def _blis(a: np.ndarray, w: np.ndarray, c: np.ndarray) -> Call:
    import blis

    found = sorted(glob.glob(str(Path(blis.__file__).parent / "cy*.so")))
    lib = ctypes.CDLL(found[0])
    f = lib.bli_sgemm  # typed API, general strides: B = W viewed [K, N] (row stride 1, column stride K)
    i = ctypes.c_int64
    f.restype = None
    f.argtypes = [ctypes.c_int, ctypes.c_int, i, i, i, ctypes.c_void_p, ctypes.c_void_p, i, i]
    f.argtypes += [ctypes.c_void_p, i, i, ctypes.c_void_p, ctypes.c_void_p, i, i]
    k, n = a.shape[1], w.shape[0]
    one, zero = ctypes.c_float(1.0), ctypes.c_float(0.0)
    p1, p0 = ctypes.addressof(one), ctypes.addressof(zero)
    pa, pw, pc = _addr(a), _addr(w), _addr(c)
    return lambda m: f(0, 0, m, n, k, p1, pa, k, 1, pw, 1, k, p0, pc, n, 1)


def _median_us(fn: Callable[[], None], seconds: float = 0.05, least: int = 50) -> float:
    for _ in range(5):
        fn()
    ts = []
    start = time.perf_counter()
    while len(ts) < least or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return float(np.median(ts)) * 1e6


def _dense(w: np.ndarray) -> Callable[[np.ndarray], tuple[float, str, np.ndarray]]:
    """bladepack's plan for Linear(K, N, bias=False): per input, its one launch's time, what that launch
    is (the dense kernel; a BLAS GEMM for weights over 512 KB, Note [Dense weight sizes]) and the result."""
    import torch

    import bladepack

    n, k = w.shape
    layer = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
    samples = [(torch.randn(2, k),), (torch.randn(5, k),)]
    art = bladepack.optimize(layer, samples, {"input": {0: bladepack.Dim("rows", 1, max(ROWS))}})
    m = bladepack.load(art.to_bytes())

    def run(a: np.ndarray) -> tuple[float, str, np.ndarray]:
        rows = m.profile(a, repeat=200)
        if len(rows) != 1:
            raise SystemExit(f"expected one launch for a bias-free linear layer, got {rows}")
        what = "dense" if "conv" in rows[0]["what"] else rows[0]["what"]
        return float(rows[0]["us"]), what, np.asarray(m(a))

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--onednn", help="libdnnl.so (default: the onednn-cpu-gomp wheel's, under sys.prefix/lib)")
    ap.add_argument("--out", help="also write the table to this file")
    args = ap.parse_args()
    onednn = args.onednn or next(iter(sorted(glob.glob(os.path.join(sys.prefix, "lib", "libdnnl.so*")))), None)
    if onednn is None:
        raise SystemExit("oneDNN not found: pip install onednn-cpu-gomp, or pass --onednn /path/to/libdnnl.so.3")
    rng = np.random.default_rng(0)
    names = ["bladepack dense", "OpenBLAS", "oneDNN", "BLIS"]
    lines = ["| K x N | M | " + " | ".join(names) + " | best library / dense |", "|---" * (len(names) + 3) + "|"]
    for k, n in SHAPES:
        w = rng.standard_normal((n, k), dtype=np.float32)
        dense = _dense(w)
        for m in ROWS:
            a = rng.standard_normal((m, k), dtype=np.float32)
            ref = a.astype(np.float64) @ w.astype(np.float64).T
            outs = {name: np.zeros((m, n), np.float32) for name in names[1:]}
            calls = {
                "OpenBLAS": _openblas(a, w, outs["OpenBLAS"]),
                "oneDNN": _onednn(onednn, a, w, outs["oneDNN"]),
                "BLIS": _blis(a, w, outs["BLIS"]),
            }
            t = {name: _median_us(lambda c=c: c(m)) - _median_us(lambda c=c: c(0)) for name, c in calls.items()}
            t["bladepack dense"], what, outs["bladepack dense"] = dense(a)
            scale = np.abs(ref).max()
            for name, o in outs.items():
                err = np.abs(o - ref).max() / scale
                if not err < 1e-5:
                    raise SystemExit(f"{name} at K={k} N={n} M={m}: error {err:.3g}")
            best = min(t[name] for name in names[1:])
            marks = {"bladepack dense": "" if what == "dense" else f" ({what})"}
            cells = " | ".join(f"{t[name]:.1f}{marks.get(name, '')}" for name in names)
            lines.append(f"| {k} x {n} | {m} | {cells} | {best / t['bladepack dense']:.2f}x |")
            print(lines[-1], flush=True)
    table = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(
            "# Single-threaded float32 GEMMs: bladepack's dense kernel against OpenBLAS, oneDNN and BLIS "
            "(`python -m bench.gemm_libraries`)\n\n"
            "µs per product A [M, K] @ W [N, K]^T: a library's median call less its empty call's; the dense "
            "kernel's launch time from m.profile(). The last column is the fastest library's time over the "
            "dense kernel's (above 1: the dense kernel is faster). Weights over 512 KB stay BLAS GEMMs in "
            "bladepack's plans (Note [Dense weight sizes]): their first column is that GEMM, marked.\n\n" + table + "\n"
        )


if __name__ == "__main__":
    main()
