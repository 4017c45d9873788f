"""Artifacts built on a machine without a GPU, run on one: the deployment story checked end to end.

    python scripts/gpu_portable.py prepare DIR   # here: optimize every sample (float32: cpu + cuda
                                                 # targets; float16: cuda; both again with cuBLASLt GEMMs:
                                                 # cuda), save the .bpk, the weights, the inputs of
                                                 # every test case and float64 references
    python scripts/gpu_portable.py check DIR [--bpk-run PATH] [--out FILE.json]
                                                 # on the GPU machine: no optimize, no compiler

`check` loads each artifact with device="cuda" and runs every case four ways: numpy inputs (host in,
host out), torch CUDA tensors through DLPack with CUDA graphs (three calls: plain, captured, replayed),
the same with graphs off, and the C++ runtime's `bpk-run --device cuda` when a binary is given. Each
result is compared with the float64 reference computed where the artifact was built; torch eager on
the GPU in the artifact's dtype gives the yardstick for float16 (within 2x its error + 1e-3), float32
must be within 1e-4. It also times bladepack (torch tensors, graphs on) against eager per case (CUDA
events, median of 20). Every failure is reported, none stops the run; exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import bladepack  # noqa: E402
from bench.cuda_samples import _time_us  # noqa: E402
from samples.registry import SAMPLES  # noqa: E402

NAMES = ("mlp", "encoder", "llama", "cnn")
# (dtype, GEMM library): the cuBLASLt artifacts fuse their GEMMs' epilogues (Note [cuBLASLt GEMMs])
KINDS = (("float32", "cublas"), ("float16", "cublas"), ("float32", "cublaslt"), ("float16", "cublaslt"))


def _stem(name: str, dtype: str, library: str) -> str:
    return f"{name}_{dtype}" + ("" if library == "cublas" else f"_{library}")


def _tuple(x: Any) -> tuple[Any, ...]:
    return x if isinstance(x, tuple) else (x,)


def _cast(a: torch.Tensor, dtype: str) -> torch.Tensor:
    return a.to(getattr(torch, dtype)) if a.is_floating_point() else a


def prepare(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in NAMES:
        s = SAMPLES[name]
        model = s.build().eval()
        torch.save(model.state_dict(), out / f"{name}.pt")
        ref_model = s.build().eval().double()
        ref_model.load_state_dict(
            {k: v.double() if v.is_floating_point() else v for k, v in model.state_dict().items()}
        )
        for dtype, library in KINDS:
            t0 = time.time()
            stem = _stem(name, dtype, library)
            targets = ("cpu", "cuda") if (dtype, library) == ("float32", "cublas") else ("cuda",)
            art = bladepack.optimize(
                model,
                s.export_samples(),
                s.dynamic_shapes,
                targets=targets,
                dtype=None if dtype == "float32" else dtype,
                gemm_library=library,
            )
            art.save(out / f"{stem}.bpk")
            g = torch.Generator().manual_seed(0)
            cases = []
            for k, dims in enumerate(s.test_cases()):
                args = tuple(_cast(a, dtype) for a in s.make_inputs(g, **dims))
                with torch.no_grad():
                    ref = _tuple(ref_model(*(a.double() if a.is_floating_point() else a for a in args)))
                arrays = {f"in{i}": a.numpy() for i, a in enumerate(args)}
                arrays |= {f"ref{i}": r.numpy() for i, r in enumerate(ref)}
                np.savez(out / f"{stem}_{k}.npz", **arrays)
                cases.append({"dims": dims, "file": f"{stem}_{k}.npz", "n_in": len(args), "n_out": len(ref)})
            meta = {
                "inputs": [t.name for t in art.plan.inputs],
                "outputs": [t.name for t in art.plan.outputs],
                "cases": cases,
            }
            (out / f"{stem}.json").write_text(json.dumps(meta))
            print(f"prepared {stem}: {len(cases)} cases, {time.time() - t0:.0f} s", flush=True)


def _host(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if hasattr(x, "__dlpack__") and not isinstance(x, np.ndarray):
        return torch.from_dlpack(x).cpu().numpy()
    return np.asarray(x)


def _rel(out: Any, ref: np.ndarray) -> float:
    o = _host(out)
    if o.shape != ref.shape:
        return math.inf
    if ref.dtype.kind not in "fc":
        return 0.0 if np.array_equal(o, ref) else math.inf
    o64, r64 = o.astype(np.float64), ref.astype(np.float64)
    if not np.array_equal(np.isnan(o64), np.isnan(r64)):
        return math.inf
    ok = ~np.isnan(r64)
    scale = float(np.abs(r64[ok]).max()) if ok.any() else 1.0
    return float(np.abs(o64[ok] - r64[ok]).max()) / (scale or 1.0)


def _cpp(bpk_run: Path, bpk: Path, meta: dict[str, Any], data: Any, n_in: int, tmp: Path) -> list[np.ndarray]:
    flags = []
    for i, name in enumerate(meta["inputs"][:n_in]):
        np.save(tmp / f"{name}.npy", data[f"in{i}"])
        flags += ["--input", f"{name}={tmp / f'{name}.npy'}"]
    outdir = tmp / "out"
    outdir.mkdir(exist_ok=True)
    r = subprocess.run(
        [str(bpk_run), str(bpk), "--device", "cuda", *flags, "--output-dir", str(outdir), "--repeat", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if r.returncode:
        raise RuntimeError(f"bpk-run exit {r.returncode}: {r.stderr[-2000:]}")
    return [np.load(outdir / f"{name}.npy") for name in meta["outputs"]]


def check(d: Path, bpk_run: Path | None, out_json: Path | None) -> int:
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for name in NAMES:
        for dtype, library in KINDS:
            stem = _stem(name, dtype, library)
            bpk = d / f"{stem}.bpk"
            if not bpk.exists():  # prepared before this kind existed
                continue
            meta = json.loads((d / f"{stem}.json").read_text())
            tdt = getattr(torch, dtype)
            label = stem[len(name) + 1 :]
            try:
                t0 = time.time()
                m = bladepack.load(bpk, device="cuda")
                plain = bladepack.load(bpk, device="cuda", graphs=False)
                load_s = time.time() - t0
                eager = SAMPLES[name].build().eval()
                eager.load_state_dict(torch.load(d / f"{name}.pt"))
                eager = eager.to("cuda", tdt)
            except Exception:
                failures.append(f"{name} {label}: load: {traceback.format_exc(limit=4)}")
                print(failures[-1], flush=True)
                continue
            for case in meta["cases"]:
                data = np.load(d / case["file"])
                ins = [data[f"in{i}"] for i in range(case["n_in"])]
                refs = [data[f"ref{i}"] for i in range(case["n_out"])]
                row: dict[str, Any] = {"sample": name, "dtype": dtype, "library": library, "dims": case["dims"]}
                row["load_s"] = load_s
                targs = tuple(torch.from_numpy(a).cuda() for a in ins)
                with torch.no_grad():
                    ev = _tuple(eager(*targs))
                yard = max(_rel(e, r) for e, r in zip(ev, refs))
                limit = 1e-4 if dtype == "float32" else 2 * yard + 1e-3
                row["eager_err"], row["limit"] = yard, limit
                ways: dict[str, Any] = {
                    "numpy": lambda: m(*ins),
                    "torch_graphs": lambda: [m(*targs) for _ in range(3)][-1],
                    "torch_plain": lambda: plain(*targs),
                }
                if bpk_run is not None:
                    ways["cpp"] = lambda: _cpp(bpk_run, bpk, meta, data, case["n_in"], Path(tempfile.mkdtemp()))
                for way, fn in ways.items():
                    try:
                        res = fn()
                        outs = tuple(res) if isinstance(res, list) else _tuple(res)
                        if len(outs) != len(refs):
                            raise RuntimeError(f"{len(outs)} outputs, the reference has {len(refs)}")
                        err = max(_rel(o, r) for o, r in zip(outs, refs))
                    except Exception:
                        err = math.inf
                        failures.append(f"{name} {label} {case['dims']} {way}: {traceback.format_exc(limit=4)}")
                    row[f"{way}_err"] = err
                    if not err <= limit:
                        failures.append(f"{name} {label} {case['dims']} {way}: error {err:.3g} > {limit:.3g}")
                try:
                    with torch.no_grad():
                        row["eager_us"] = _time_us(lambda: eager(*targs), 20)
                    row["bladepack_us"] = _time_us(lambda: m(*targs), 20)
                except Exception:
                    failures.append(f"{name} {label} {case['dims']} timing: {traceback.format_exc(limit=4)}")
                rows.append(row)
                errs = " ".join(f"{k[:-4]}={v:.2g}" for k, v in row.items() if k.endswith("_err"))
                speed = (
                    f"{row['eager_us']:.0f}/{row['bladepack_us']:.0f} us = x{row['eager_us'] / row['bladepack_us']:.2f}"
                    if "bladepack_us" in row
                    else "untimed"
                )
                print(f"{name} {label} {case['dims']}: {errs} (limit {limit:.2g}); eager/bladepack {speed}", flush=True)
    for f in failures:
        print("FAIL", f, flush=True)
    print(f"{len(rows)} cases, {len(failures)} failures", flush=True)
    if out_json:
        out_json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows, "failures": failures}))
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("prepare", "check"))
    ap.add_argument("dir", type=Path)
    ap.add_argument("--bpk-run", type=Path)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.mode == "prepare":
        prepare(a.dir)
        return 0
    return check(a.dir, a.bpk_run, a.out)


if __name__ == "__main__":
    raise SystemExit(main())
