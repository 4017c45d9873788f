"""Lowering: an optimized IR `Program` and its fusion plans → an `ExecPlan` and its kernel sources.

`build_plan` is the stage's entry: value table, guards and shape program (`shape_compiler`), the
arena (`memory_plan`), and per target a native plan (`lower_native`) whose kernels come from the
emitters in `codegen/` and whose GEMMs come from `library_ops/`.
"""
