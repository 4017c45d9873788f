"""Compute-intensive ops served by libraries: GEMM / batched GEMM / linear and convolution.

`cpu_gemm`: matmul and conv2d lowered to batched BLAS calls on strided views (CPU; the same records
drive cuBLAS on CUDA). `cutlass_configs`: the CUTLASS GEMM configuration space. `gemm_select`: the
cost model that picks a few configs per GEMM and their dispatch ranges over the dynamic extents.
"""
