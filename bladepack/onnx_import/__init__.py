"""The ONNX front end: an ONNX model (path or ModelProto) → bladepack IR `Program`.

Imports onnx (compile side only); the loader never needs it.
"""

from bladepack.onnx_import.model import MIN_OPSET, OnnxModelError, import_onnx, is_onnx_model

__all__ = ["MIN_OPSET", "OnnxModelError", "import_onnx", "is_onnx_model"]
