"""Digests of the generated kernel sources and manifests of every single-op case, without compiling.

    python scripts/source_digests.py > before.txt      # on the old tree
    python scripts/source_digests.py > after.txt       # on the new tree
    diff before.txt after.txt

The companion of artifact_digests.py for refactors that must leave generated code byte-identical:
that script compiles and covers the samples; this one covers every case of tests/test_ops.py (every
op kind, each elementwise op on its own), planned for the CPU and for CUDA (cuBLAS and CUTLASS GEMMs)
with nothing compiled, so it needs no nvcc and runs in a few minutes. One line per (case, plan): the
SHA-256 of the manifest and of the CPU / CUDA sources.
"""

from __future__ import annotations

import hashlib
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from bladepack.artifact.writer import assemble
from bladepack.backends import backends_for
from bladepack.export import capture, to_program
from bladepack.library_ops.cutlass.select import CUBLAS, GemmPolicy
from bladepack.lowering.build_plan import build_plan
from bladepack.options import CompileOptions
from bladepack.passes.pipeline import run_pipeline
from bladepack.target import Target
from tests.test_ops import CASES, EXPORT, Fn, make


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def main() -> int:
    warnings.filterwarnings("ignore")
    options = CompileOptions.from_env()
    plans = [
        ("cpu", Target.parse(["cpu"]), CUBLAS),
        ("cuda", Target.parse(["cuda"]), CUBLAS),
        ("cuda-cutlass", Target.parse(["cuda", "cuda:sm_90a"]), GemmPolicy("cutlass", 4, hopper=True)),
    ]
    for case in CASES:
        torch.manual_seed(0)
        model = case.module() if case.module is not None else Fn(case.fn)
        g = torch.Generator().manual_seed(0)
        samples = [tuple(make(i, d, g) for i in case.inputs) for d in EXPORT]
        try:
            program = to_program(capture(model, samples, None))
        except Exception as e:
            print(f"{case.name:<28} export failed: {type(e).__name__}", flush=True)
            continue
        for label, target, gemm in plans:
            try:
                backends = backends_for(target)
                p = run_pipeline(program, options, [b.caps for b in backends])
                low = build_plan(p, backends, gemm)
            except Exception as e:
                print(f"{case.name:<28} {label:<13} failed: {type(e).__name__}: {e}", flush=True)
                continue
            s = low.sources
            manifest, _ = assemble(low.plan, dict(p.weight_data), {})
            gemms = ",".join(i.name for u in s.units.values() for i in u.gemm_instances)
            print(
                f"{case.name:<28} {label:<13} manifest {_sha(repr(manifest))}  cpu {_sha(s.unit('cpu'))}  "
                f"cuda {_sha(s.unit('cuda'))}  gemms {_sha(gemms)}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
