"""Front ends: torch.export (and later ONNX) into the bladepack IR. Imports torch."""

from bladepack.export.capture import Captured, capture
from bladepack.export.from_torch import to_program

__all__ = ["Captured", "capture", "to_program"]
