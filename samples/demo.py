"""The main demo: optimize a sample, save it, load it in a fresh process without torch, check it.

    python -m samples.demo [--sample encoder|llama|cnn|mlp] [--onnx] [--cpp] [--out out/]

With --onnx the sample is first exported to ONNX (dynamic axes, TorchScript exporter) and bladepack
optimizes the .onnx file instead of the module. With --cpp the C++ runtime is built (CMake; the
system packages of scripts/system_deps.sh) and `bpk-run` runs the same artifact at the same shapes,
checked against eager too.

The child process blocks `import torch` and `import sympy`, loads the .bpk with the numpy loader, runs
the reference cases recorded in it (`verify()`) and runs it at shapes the optimizer never saw; the parent compares with PyTorch eager and exits non-zero
when the maximum relative error exceeds 1e-5.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import bladepack
from samples.registry import SAMPLES

CHILD = """
import sys, time
sys.modules["torch"] = None   # the deployment side must not need torch ...
sys.modules["sympy"] = None   # ... nor the compiler's symbolic algebra
import numpy as np
import bladepack
t0 = time.perf_counter()
m = bladepack.load(sys.argv[1])
print(f"  child: loaded in {1e3 * (time.perf_counter() - t0):.1f} ms without torch: {m.signature}")
report = m.verify()  # the reference cases optimize recorded, run on this machine
passed = sum(c["passed"] for c in report["cases"])
print(f"  child: bladepack verify: {passed} of {len(report['cases'])} reference cases pass here "
      f"(oracle: {report['oracle']})")
if report["passed"] is False:
    sys.exit("  child: the artifact does not reproduce its recorded outputs here")
cases = np.load(sys.argv[2])
n = int(cases["n"])
outs = {}
for k in range(n):
    args = [cases[f"{k}_in{i}"] for i in range(int(cases[f"{k}_nin"]))]
    res = m(*args)
    res = res if isinstance(res, tuple) else (res,)
    for j, r in enumerate(res):
        outs[f"{k}_out{j}"] = r
np.savez(sys.argv[3], **outs)
"""


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sample", default="encoder", choices=sorted(SAMPLES))
    p.add_argument("--onnx", action="store_true", help="go through an ONNX export of the sample")
    p.add_argument("--cpp", action="store_true", help="also run the artifact with the C++ runtime (bpk-run)")
    p.add_argument("--out", default="out")
    args = p.parse_args()
    s = SAMPLES[args.sample]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = s.build()
    samples = s.export_samples()
    t0 = time.perf_counter()
    if args.onnx:
        from samples.onnx_export import export_onnx, sample_axes

        onnx_path = out / f"{s.name}.onnx"
        onnx_path.write_bytes(export_onnx(model, samples[0], sample_axes(s.dynamic_shapes), "torchscript"))
        print(f"[1/4] optimize {onnx_path} (exported with dynamic axes {sample_axes(s.dynamic_shapes)})")
        art = bladepack.optimize(onnx_path, dynamic_shapes=s.dynamic_shapes)
    else:
        print(f"[1/4] optimize {s.name}: samples {[tuple(tuple(t.shape) for t in a) for a in samples]}")
        art = bladepack.optimize(model, samples, s.dynamic_shapes)
    path = out / f"{s.name}.bpk"
    art.save(path)
    print(f"      {time.perf_counter() - t0:.1f} s -> {path} ({path.stat().st_size / 1024:.0f} KiB)")
    print("[2/4] bladepack inspect")
    from bladepack.artifact import read
    from bladepack.inspect import inspect_text, manifest_summary

    print("      " + inspect_text(manifest_summary(read(path).manifest)).replace("\n", "\n      ").rstrip())
    g = torch.Generator().manual_seed(123)
    cases = [c for c in s.test_cases() if c not in s.export_dims]
    arrays: dict[str, np.ndarray] = {"n": np.array(len(cases))}
    refs = []
    for k, c in enumerate(cases):
        inputs = s.make_inputs(g, **c)
        with torch.no_grad():
            r = model(*inputs)
        refs.append(r if isinstance(r, tuple) else (r,))
        arrays[f"{k}_nin"] = np.array(len(inputs))
        for i, t in enumerate(inputs):
            arrays[f"{k}_in{i}"] = t.numpy()
    np.savez(out / f"{s.name}_cases.npz", **arrays)
    print(f"[3/4] run in a fresh process without torch at {len(cases)} unseen shapes")
    res_path = out / f"{s.name}_results.npz"
    subprocess.run(
        [sys.executable, "-c", CHILD, str(path), str(out / f"{s.name}_cases.npz"), str(res_path)], check=True
    )
    print("[4/4] compare with PyTorch eager (max |out - ref| / max |ref| per output)")
    res = np.load(res_path)
    worst = _compare(cases, refs, lambda k, j: res[f"{k}_out{j}"])
    ok = worst <= 1e-5
    print(f"max relative error {worst:.2e} over {len(cases)} unseen shapes: {'OK' if ok else 'FAILED'} (limit 1e-5)")
    if args.cpp:
        ok = _run_cpp(path, cases, refs, arrays, out) and ok
    return 0 if ok else 1


def _compare(
    cases: list[dict[str, int]], refs: list[tuple[Any, ...]], result: Callable[[int, int], np.ndarray]
) -> float:
    worst = 0.0
    for k, (c, ref) in enumerate(zip(cases, refs)):
        errs = []
        for j, r in enumerate(ref):
            o, rr = result(k, j), r.numpy()
            errs.append(float(np.abs(o.astype(np.float64) - rr).max() / max(np.abs(rr).max(), 1e-30)))
        worst = max(worst, *errs)
        print(f"      {c}: " + ", ".join(f"{e:.1e}" for e in errs))
    return worst


def _run_cpp(
    path: Path, cases: list[dict[str, int]], refs: list[tuple[Any, ...]], arrays: dict[str, np.ndarray], out: Path
) -> bool:
    from tests import cpp_build

    subprocess.run(["bash", str(cpp_build.ROOT / "scripts" / "system_deps.sh")], check=True)
    print("[cpp] build cpp_runtime (CMake) and run bpk-run on the same artifact, no Python involved")
    bpk_run = cpp_build.build("release") / "bpk-run"
    verify = subprocess.run([str(bpk_run), str(path), "--verify"], capture_output=True, text=True)
    print(
        f"      bpk-run --verify: {verify.stdout.strip().splitlines()[-1] if verify.stdout else verify.stderr.strip()}"
    )
    sig = bladepack.load(path).signature
    for k in range(len(cases)):
        flags = []
        for i, spec in enumerate(sig.inputs):
            f = out / f"cpp_{k}_{spec.name}.npy"
            np.save(f, arrays[f"{k}_in{i}"])
            flags += ["--input", f"{spec.name}={f}"]
        d = out / f"cpp_{k}"
        d.mkdir(exist_ok=True)
        subprocess.run([str(bpk_run), str(path), *flags, "--output-dir", str(d)], check=True, capture_output=True)
    names = [t.name for t in sig.outputs]
    worst = _compare(cases, refs, lambda k, j: np.load(out / f"cpp_{k}" / f"{names[j]}.npy"))
    ok = worst <= 1e-5 and verify.returncode == 0
    print(f"C++ runtime: max relative error {worst:.2e} over {len(cases)} shapes: {'OK' if ok else 'FAILED'}")
    return ok


if __name__ == "__main__":
    sys.exit(main())
