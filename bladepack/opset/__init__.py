"""The op set: the op table (`OP_INFO`, table.py) and the ops' attribute types (attrs.py).

Loader-safe (numpy only) and importable by every layer: the compile side reads the table through
`bladepack.ir`, the loader's reference executor reads the numpy references from it.
"""

from bladepack.opset.table import COMPARISONS, OP_INFO, Batch, Cost, CSpelling, OpClass, OpInfo, OpKind

__all__ = ["COMPARISONS", "OP_INFO", "Batch", "CSpelling", "Cost", "OpClass", "OpInfo", "OpKind"]
