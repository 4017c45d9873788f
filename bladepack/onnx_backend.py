"""An ONNX backend (`onnx.backend.base.Backend`) that runs models through bladepack.

`prepare` optimizes the model into an artifact (in memory) and loads it; `run` calls it. This is how
the ONNX backend node tests exercise the front end, the generated kernels and the loader together.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from bladepack.loader import LoadedModule, load
from bladepack.options import CompileOptions


class BladepackRep(BackendRep):
    def __init__(self, module: LoadedModule) -> None:
        self.module = module

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        arrays = [np.asarray(x) for x in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
        return tuple(self.module.run(arrays))


class BladepackBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> BladepackRep:
        """`executor` ("auto", "native" or "reference") chooses what runs the artifact's steps (for the
        reference executor no kernel library is built); `options` are `optimize`'s (`CompileOptions`)."""
        from bladepack.api import optimize

        executor = kwargs.get("executor", "auto")
        options = kwargs.get("options") or CompileOptions.from_env()
        if executor == "reference":
            options = dataclasses.replace(options, native=False)
        art = optimize(model, options=options)
        return BladepackRep(load(art.to_bytes(), executor=executor))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"
