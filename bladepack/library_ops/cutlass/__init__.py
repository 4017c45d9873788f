"""CUTLASS GEMMs for CUDA plans, in one place.

`configs`: the configuration space (tiles, stages, split-K, Hopper schedules). `select`: the cost model
and the dispatch tables over the dynamic extents. `emitter`: kernel and Params-packer C++ per instance.
`toolchain`: nvcc builds of the kernels (fatbins) and the packer, cached by content. `profile`: timing
candidates on a CUDA device at optimize time.
"""
