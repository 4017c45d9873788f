"""Digests of every sample's artifact, for checking that a refactor leaves artifacts byte-identical.

    python scripts/artifact_digests.py > before.txt      # on the old tree
    python scripts/artifact_digests.py > after.txt       # on the new tree
    diff before.txt after.txt

One line per (sample, configuration): the SHA-256 of the whole .bpk, of its manifest, and of the
generated kernel sources. Configurations: the CPU plan of every sample and of the ONNX export of the
MLP; CPU + CUDA (cuBLAS) for every sample; CPU + CUDA in float16 with CUTLASS GEMMs (Hopper included)
for the MLP. CUDA configurations need nvcc (skipped without it). Compiled kernels come from the
content-hashed cache, so a second run takes seconds. `--quick` leaves out the CUTLASS configuration.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import bladepack
from bladepack.artifact import format as bpk_format
from samples.registry import SAMPLES


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:16]


def _line(label: str, art: Any) -> str:
    manifest, sections = art._parts()
    whole = b"".join(bytes(c) for c in bpk_format.encode(manifest, sections))
    head = bpk_format.encode(manifest, [])
    src = art.sources
    gemms = "\0".join(i.name for u in src.units.values() for i in u.gemm_instances)
    kernels = _sha(src.unit("cpu") + "\0" + src.unit("cuda") + "\0" + gemms)
    return f"{label:<32} bpk {_sha(whole)}  manifest {_sha(b''.join(bytes(c) for c in head))}  kernels {kernels}"


def _build(name: str) -> Any:
    """The sample's model with weights fixed by the seed (a model's init draws from torch's global RNG)."""
    torch.manual_seed(0)
    return SAMPLES[name].build()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="leave out the CUTLASS configuration")
    args = p.parse_args()
    cuda = shutil.which("nvcc") is not None or Path("/usr/local/cuda/bin/nvcc").exists()
    for name in sorted(SAMPLES):
        s = SAMPLES[name]
        model, samples = _build(name), s.export_samples()
        print(_line(f"{name} cpu", bladepack.optimize(model, samples, s.dynamic_shapes)), flush=True)
        if cuda:
            art = bladepack.optimize(model, samples, s.dynamic_shapes, targets=("cpu", "cuda"))
            print(_line(f"{name} cpu+cuda", art), flush=True)
    from samples.onnx_export import export_onnx, sample_axes

    mlp = SAMPLES["mlp"]
    onnx_bytes = export_onnx(_build("mlp"), mlp.export_samples()[0], sample_axes(mlp.dynamic_shapes), "torchscript")
    import onnx

    art = bladepack.optimize(onnx.load_from_string(onnx_bytes), dynamic_shapes=mlp.dynamic_shapes)
    print(_line("mlp onnx cpu", art), flush=True)
    if cuda and not args.quick:
        art = bladepack.optimize(
            _build("mlp"),
            mlp.export_samples(),
            mlp.dynamic_shapes,
            targets=("cpu", "cuda"),
            dtype="float16",
            gemm_library="cutlass",
        )
        print(_line("mlp cpu+cuda fp16 cutlass", art), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
