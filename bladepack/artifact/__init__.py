"""The .bpk artifact: container format, execution plan and shape program (loader-safe)."""

from bladepack.artifact.format import FORMAT_MAJOR, FORMAT_MINOR, BpkFile, Section, read, write
from bladepack.artifact.plan import ExecPlan
from bladepack.artifact.shape_program import Op, ShapeProgram

__all__ = ["FORMAT_MAJOR", "FORMAT_MINOR", "BpkFile", "ExecPlan", "Op", "Section", "ShapeProgram", "read", "write"]
