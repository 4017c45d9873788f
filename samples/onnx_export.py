"""Export a sample to ONNX with dynamic axes, with either of torch's exporters.

`export_onnx(model, args, axes, exporter)` writes nothing: it returns the serialized model. `axes` maps
input names to {axis: dim name} (the TorchScript exporter's `dynamic_axes`; the dynamo exporter marks
those axes `Dim.DYNAMIC` and names the dims itself).
"""

from __future__ import annotations

import inspect
import io
import warnings
from typing import Any

import torch

EXPORTERS = ("torchscript", "dynamo")


def export_onnx(model: torch.nn.Module, args: tuple[Any, ...], axes: dict[str, dict[int, str]], exporter: str) -> bytes:
    if exporter not in EXPORTERS:
        raise ValueError(f"exporter {exporter!r}; one of {EXPORTERS}")
    names = list(inspect.signature(model.forward).parameters)[: len(args)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            ds = {k: {ax: torch.export.Dim.DYNAMIC for ax in v} for k, v in axes.items()}
            prog = torch.onnx.export(model, args, dynamo=True, dynamic_shapes=ds, input_names=names, verbose=False)
            return bytes(prog.model_proto.SerializeToString())
        f = io.BytesIO()
        torch.onnx.export(model, args, f, dynamo=False, input_names=names, dynamic_axes=axes, opset_version=17)
        return f.getvalue()


def sample_axes(dynamic_shapes: dict[str, dict[int, Any]]) -> dict[str, dict[int, str]]:
    """{input: {axis: bladepack.Dim}} → {input: {axis: dim name}}."""
    return {name: {axis: d.name for axis, d in spec.items()} for name, spec in dynamic_shapes.items()}
