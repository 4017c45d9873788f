"""Compute-intensive ops served by libraries, one place per library op.

`cpu_gemm`: matmul and conv2d lowered to batched GEMM calls on strided views (BLAS on CPU; the same
records drive cuBLAS on CUDA). `cutlass/`: the CUTLASS GEMMs — config space, selection and dispatch
tables, kernel and packer emitter, nvcc build, on-device profiling.
"""
