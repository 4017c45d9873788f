"""bladepack IR: a closed op set over tensors with symbolic (sympy) dimensions."""

from bladepack.ir.graph import Graph, GraphBuilder, Guard, Node, Param, Program, rebuild_graph
from bladepack.ir.ops import OP_INFO, OpClass, OpKind
from bladepack.ir.printer import print_graph
from bladepack.ir.shape_env import ShapeEnv, SymbolRange, Tri
from bladepack.ir.types import IRDim, TensorType
from bladepack.ir.verifier import IRVerificationError, verify

__all__ = [
    "OP_INFO",
    "Graph",
    "GraphBuilder",
    "Guard",
    "IRDim",
    "IRVerificationError",
    "Node",
    "OpClass",
    "OpKind",
    "Param",
    "Program",
    "ShapeEnv",
    "SymbolRange",
    "TensorType",
    "Tri",
    "print_graph",
    "rebuild_graph",
    "verify",
]
