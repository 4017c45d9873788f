"""An ONNX backend (`onnx.backend.base.Backend`) that runs models through bladepack.

`prepare` optimizes the model into an artifact (in memory) and loads it; `run` calls it. This is how
the ONNX backend node tests exercise the front end, the generated kernels and the loader together.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep

from bladepack.loader import LoadedModule, load


class BladepackRep(BackendRep):
    def __init__(self, module: LoadedModule) -> None:
        self.module = module

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        arrays = [np.asarray(x) for x in (inputs if isinstance(inputs, (list, tuple)) else [inputs])]
        return tuple(self.module.run(arrays))


class BladepackBackend(Backend):
    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU", **kwargs: Any) -> BladepackRep:
        """`executor` ("auto", "native" or "reference") chooses what runs the artifact's steps."""
        from bladepack.api import optimize

        art = optimize(model)
        return BladepackRep(load(art.to_bytes(), executor=kwargs.get("executor", "auto")))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"
