"""How long `optimize` takes, stage by stage, with a cold and a warm kernel cache, and its peak memory.

Each model is optimized in a fresh process twice: first with an empty kernel cache (cold: every kernel
library compiles), then again with the cache the first run filled (warm). The process reports its wall
time, the stage times optimize logs (BLADEPACK_LOG=info) and its peak RSS, and the compilers' peak
RSS. Models: a 2-layer Hugging Face BERT (samples/zoo.py), ResNet-18 (samples/zoo.py) and EfficientNet-B0
(defined here as torchvision defines it, random weights, no downloads), at the ISA levels `--isas` names (default:
every level, as optimize builds by default); `bert_base` is a 12-layer BERT-base (bench/bert_base.py).
`--targets`, `--gemm-library` and `--dtype` are optimize's (a CUDA build: `--targets cuda --gemm-library
cutlass --dtype float16`, `cuda,cuda:sm_90a` with the Hopper GEMMs; no GPU is needed).

    python -m bench.compile_time [--models bert,resnet18,efficientnet_b0,bert_base] [--isas all|host]
        [--targets cpu] [--gemm-library cublas] [--dtype float16] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from samples.zoo import ResNet18

ROOT = Path(__file__).resolve().parent.parent


# --------------------------------------------------------------------------- models


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, kernel: int, stride: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = (
            nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU()) if expand != 1 else None
        )
        self.depthwise = nn.Sequential(
            nn.Conv2d(mid, mid, kernel, stride, kernel // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.SiLU()
        )
        squeeze = max(1, cin // 4)
        self.se = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, squeeze, 1), nn.SiLU(), nn.Conv2d(squeeze, mid, 1), nn.Sigmoid()
        )
        self.project = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x if self.expand is None else self.expand(x)
        y = self.depthwise(y)
        y = self.project(y * self.se(y))
        return x + y if self.residual else y


class EfficientNetB0(nn.Module):
    # (expand ratio, channels, repeats, stride, kernel) per stage
    STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
              (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))  # fmt: skip

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU())
        blocks, cin = [], 32
        for expand, cout, repeats, stride, kernel in self.STAGES:
            for r in range(repeats):
                blocks.append(MBConv(cin, cout, expand, kernel, stride if r == 0 else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Sequential(nn.Conv2d(cin, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU())
        self.fc = nn.Linear(1280, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(y, 1), 1))


def _images() -> list[tuple[torch.Tensor, ...]]:
    return [(torch.randn(2, 3, 96, 96),), (torch.randn(3, 3, 128, 112),)]


def build(name: str) -> tuple[nn.Module, Any, Any]:
    """(model, samples, dynamic_shapes)."""
    torch.manual_seed(0)
    if name == "bert":
        from samples.zoo import ZOO

        z = ZOO["bert"]
        g = torch.Generator().manual_seed(0)
        return z.build(), [z.make(g, s) for s in z.samples], z.dynamic_shapes()
    if name == "bert_base":
        from bench.bert_base import _Encoder, _inputs

        return _Encoder(12), [_inputs(2, 16), _inputs(3, 24)], None
    model = {"resnet18": ResNet18, "efficientnet_b0": EfficientNetB0}[name]().eval()
    return model, _images(), None


# --------------------------------------------------------------------------- one run (a child process)

_STAGE = re.compile(r"^bladepack: (?!optimized)(.+?) \(([0-9.]+) s\)$")


def _child(name: str, cache: str, a: argparse.Namespace) -> None:
    import resource

    import bladepack

    model, samples, shapes = build(name)
    options = bladepack.CompileOptions.from_env(cache_dir=Path(cache), cpu_isas=a.isas, quiet=True)
    start = time.perf_counter()
    bladepack.optimize(
        model,
        samples,
        shapes,
        targets=a.targets.split(","),
        dtype=a.dtype,
        gemm_library=a.gemm_library,
        options=options,
    )
    wall = time.perf_counter() - start
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "peak_rss_mib": own, "compiler_peak_rss_mib": children}))


def run_once(name: str, cache: str, a: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "BLADEPACK_LOG": "info", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bench.compile_time", "--child", name, "--cache", cache, "--isas", a.isas]
    cmd += ["--targets", a.targets, "--gemm-library", a.gemm_library] + (["--dtype", a.dtype] if a.dtype else [])
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{name}: optimize failed:\n{r.stderr[-3000:]}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    stages: dict[str, float] = {}
    for line in r.stderr.splitlines():
        m = _STAGE.match(line.strip())
        if m:
            stages[m.group(1)] = stages.get(m.group(1), 0.0) + float(m.group(2))
    result["stages"] = stages
    return result


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--models", default="bert,resnet18,efficientnet_b0")
    p.add_argument("--isas", default="all")
    p.add_argument("--targets", default="cpu")
    p.add_argument("--gemm-library", default="cublas")
    p.add_argument("--dtype", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--child", default=None)
    p.add_argument("--cache", default=None)
    a = p.parse_args()
    if a.child:
        _child(a.child, a.cache, a)
        return
    rows = []
    for name in a.models.split(","):
        with tempfile.TemporaryDirectory() as cache:
            cold = run_once(name, cache, a)
            warm = run_once(name, cache, a)
        setup = {"isas": a.isas, "targets": a.targets, "gemm_library": a.gemm_library, "dtype": a.dtype}
        rows.append({"model": name, **setup, "cold": cold, "warm": warm})
        print(
            f"{name}: cold {cold['wall_s']:.1f} s (peak RSS {cold['peak_rss_mib']:.0f} MiB, compilers "
            f"{cold['compiler_peak_rss_mib']:.0f} MiB), warm {warm['wall_s']:.1f} s; cold stages: "
            + ", ".join(f"{k} {v:.1f}" for k, v in cold["stages"].items()),
            flush=True,
        )
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
