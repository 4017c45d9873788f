"""The model zoo (samples/zoo.py: real architectures built from transformers configs, random weights,
no downloads, two layers, ResNet-18 and a MobileNet-style CNN in plain torch), each through both front ends — torch.export, and the
ONNX files of torch's TorchScript and dynamo exporters — optimized, loaded torch-free from bytes and
compared with eager at shapes no sample had: batch 1, length 1, odd lengths, a padded row.

Every case is marked `zoo`; `bash scripts/test.sh -m zoo` runs them all. The suite's default run takes
the spread in `SPREAD` (one or two per family of front end and architecture) and leaves the rest to
`-m zoo` (they carry `zoo_full`, which the default run deselects)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import bladepack
from samples.zoo import ZOO, ZooModel
from tests.helpers import narrowed

transformers = pytest.importorskip("transformers")

FRONT_ENDS = ("torch", "onnx-torchscript", "onnx-dynamo")

# The first sample is the one exported to ONNX: a ViT's must not be square at the configured size, or
# the exporter takes the no-interpolation branch and fixes the image size.
# The default run's spread: every architecture family and every front end at least once.
SPREAD = {
    ("bert", "torch"),
    ("t5", "torch"),
    ("bart", "onnx-torchscript"),
    ("vit", "torch"),
    ("whisper-encoder", "onnx-dynamo"),
    ("mobilenet", "onnx-dynamo"),
    ("resnet18", "torch"),
    ("falcon", "torch"),
}


def _cases() -> list[Any]:
    out = []
    for name in ZOO:
        for fe in FRONT_ENDS:
            marks = [pytest.mark.zoo] + ([] if (name, fe) in SPREAD else [pytest.mark.zoo_full])
            out.append(pytest.param(name, fe, marks=marks, id=f"{name}-{fe}"))
    return out


def _artifact(z: ZooModel, model: torch.nn.Module, front_end: str, tmp_path: Path) -> bladepack.api.Artifact:
    g = torch.Generator().manual_seed(1)
    samples = [z.make(g, s) for s in z.samples]
    if front_end == "torch":
        return bladepack.optimize(model, samples, dynamic_shapes=z.dynamic_shapes())
    path = tmp_path / "model.onnx"
    if front_end == "onnx-dynamo":
        tdims: dict[str, Any] = {}
        for axes in z.dims.values():
            for dname, lo, hi in axes.values():
                tdims.setdefault(dname, torch.export.Dim(dname, min=max(lo, 2), max=hi))
        spec = tuple({a: tdims[d[0]] for a, d in z.dims.get(n, {}).items()} for n in z.names)
        try:
            torch.onnx.export(
                model, samples[0], path, dynamo=True, input_names=list(z.names), dynamic_shapes=spec, verbose=False
            )
        except Exception as e:  # torch's exporter, before bladepack sees a file
            pytest.skip(f"torch.onnx.export(dynamo=True) cannot export this model: {str(e).splitlines()[0]}")
    else:
        axes_of = {n: {a: d[0] for a, d in z.dims.get(n, {}).items()} for n in z.names}
        torch.onnx.export(
            model,
            samples[0],
            path,
            dynamo=False,
            input_names=list(z.names),
            output_names=["out"],
            dynamic_axes=axes_of,
        )
    return bladepack.optimize(str(path))


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(("name", "front_end"), _cases())
def test_zoo_model_matches_eager(name: str, front_end: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    z = ZOO[name]
    model = z.build()
    art = _artifact(z, model, front_end, tmp_path)
    loaded = bladepack.load(art.to_bytes())
    names = list(dict.fromkeys(d[0] for axes in z.dims.values() for d in axes.values()))  # a size's order
    g = torch.Generator().manual_seed(2)
    for size in z.checks:
        inputs = z.make(g, size)
        if narrowed(art, dict(zip(names, size, strict=True))):
            continue
        with torch.no_grad():
            want = model(*inputs).numpy()
        got = loaded(*[t.numpy() for t in inputs])
        where = f"{name} via {front_end} at {size}"
        assert got.shape == want.shape, where
        assert np.isfinite(got).all(), f"{where}: non-finite outputs"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=where)
