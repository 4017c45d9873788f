"""bladepack: ahead-of-time packaging of dynamic-shape models.

    art = bladepack.optimize(model, sample_inputs)   # compile side (imports torch)
    art.save("model.bpk")
    m = bladepack.load("model.bpk")                  # deploy side (numpy + msgpack only)
    y = m(x)

Importing this package never imports torch or sympy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bladepack.dims import DerivedDim, Dim
from bladepack.errors import (
    BladepackError,
    BpkFormatError,
    ExecutionError,
    ExportError,
    IndexRangeError,
    InputError,
    ShapeGuardError,
    UnsupportedOpsError,
)
from bladepack.loader import LoadedModule, TrustError, load
from bladepack.options import CompileOptions, LoaderOptions
from bladepack.version import __version__

if TYPE_CHECKING:
    from bladepack.api import Artifact


def optimize(
    model: Any,
    sample_inputs: Any = None,
    dynamic_shapes: Any = None,
    targets: Any = ("cpu",),
    dtype: str | None = None,
    gemm_library: str = "cublas",
    reference_cases: bool | int = True,
    options: CompileOptions | None = None,
    packed: bool = False,
) -> Artifact:
    """See `bladepack.api.optimize`: a torch module with sample inputs, or an ONNX model (path or
    ModelProto). Imported lazily so that loading never needs torch or onnx."""
    from bladepack.api import optimize as _optimize

    return _optimize(
        model,
        sample_inputs,
        dynamic_shapes=dynamic_shapes,
        targets=targets,
        dtype=dtype,
        gemm_library=gemm_library,
        reference_cases=reference_cases,
        options=options,
        packed=packed,
    )


def save(artifact: Artifact, path: Any) -> None:
    artifact.save(path)


__all__ = [
    "BladepackError",
    "BpkFormatError",
    "CompileOptions",
    "DerivedDim",
    "Dim",
    "ExecutionError",
    "ExportError",
    "IndexRangeError",
    "InputError",
    "LoadedModule",
    "LoaderOptions",
    "ShapeGuardError",
    "TrustError",
    "UnsupportedOpsError",
    "__version__",
    "load",
    "optimize",
    "save",
]
