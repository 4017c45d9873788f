"""The main demo: optimize a sample, save it, load it in a fresh process without torch, check it.

    python -m samples.demo [--sample encoder|llama|cnn|mlp] [--onnx] [--out out/]

With --onnx the sample is first exported to ONNX (dynamic axes, TorchScript exporter) and bladepack
optimizes the .onnx file instead of the module.

The child process blocks `import torch` and `import sympy`, loads the .bpk with the numpy loader and
runs it at shapes the optimizer never saw; the parent compares with PyTorch eager and exits non-zero
when the maximum relative error exceeds 1e-5.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

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
    worst = 0.0
    for k, (c, ref) in enumerate(zip(cases, refs)):
        errs = []
        for j, r in enumerate(ref):
            o, rr = res[f"{k}_out{j}"], r.numpy()
            e = float(np.abs(o.astype(np.float64) - rr).max() / max(np.abs(rr).max(), 1e-30))
            errs.append(e)
        worst = max(worst, *errs)
        print(f"      {c}: " + ", ".join(f"{e:.1e}" for e in errs))
    ok = worst <= 1e-5
    print(f"max relative error {worst:.2e} over {len(cases)} unseen shapes: {'OK' if ok else 'FAILED'} (limit 1e-5)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
