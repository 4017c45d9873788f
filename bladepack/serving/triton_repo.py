"""`bladepack triton-repo`: a Triton Inference Server model repository for one artifact.

In: an artifact file and the serving choices. Out: OUT_DIR/NAME/config.pbtxt (serving/triton_config.py),
OUT_DIR/NAME/1/model.bpk (the artifact, copied and checked) and, for the Python backend,
OUT_DIR/NAME/1/model.py (serving/triton_python.py); the C++ backend (backend "bladepack",
cpp_runtime/triton/backend.cpp) reads model.bpk itself. Other models already in OUT_DIR are left alone; an
existing OUT_DIR/NAME is replaced only with `overwrite=True`.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from bladepack.artifact.format import read
from bladepack.serving.triton_config import TritonModelConfig
from bladepack.serving.triton_python import ARTIFACT, MODEL_PY
from bladepack.serving.trust import ServingTrust


def write_repository(
    artifact: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    name: str | None = None,
    device: str = "cpu",
    instances: int = 1,
    max_queue_delay_us: int = 100,
    max_batch_size: int | None = None,
    overwrite: bool = False,
    dynamic_batching: bool = True,
    backend: str = "python",
    trust: ServingTrust | None = None,
    padding: bool = True,
    pad_budget: float | None = None,
) -> TritonModelConfig:
    """Write the model repository entry; returns its configuration (`.text()` is config.pbtxt). `trust`
    (serving/trust.py): the artifact must pass it here, and every model instance checks it again."""
    src = Path(artifact)
    trust = trust or ServingTrust()
    trust.check(src)  # TrustError before anything is written
    bpk = read(str(src))  # a corrupt or truncated artifact fails here, before anything is written
    model = name or src.stem
    config = TritonModelConfig.build(
        bpk.manifest,
        model,
        device,
        instances,
        max_queue_delay_us,
        max_batch_size,
        backend,
        dynamic_batching,
        padding,
        pad_budget,
    )
    config = dataclasses.replace(config, parameters=config.parameters + tuple(trust.parameters()))
    text = config.text()  # refuses what the backend cannot serve, before anything is written
    target = Path(out_dir) / model
    if target.exists():
        if not overwrite:
            raise FileExistsError(f"{target} exists; pass --force to replace it")
        shutil.rmtree(target)
    version = target / "1"
    version.mkdir(parents=True)
    shutil.copyfile(src, version / ARTIFACT)
    if backend == "python":
        (version / "model.py").write_text(MODEL_PY)
    (target / "config.pbtxt").write_text(text)
    return config
