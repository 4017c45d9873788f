"""Graph passes over the IR, one per file, run in the order of `pipeline.PIPELINE`.

In: an IR `Program` from a front end. Out: an optimized `Program` (`pipeline.run_pipeline`), then a
`FusionPlan` (`fusion.plan_fusion`) saying which values live in memory and which generated kernel or
library call computes each. Imports only the IR and the leaf modules: emitting code and building the
execution plan are later stages (`codegen/`, `library_ops/`, `lowering/`).
"""
