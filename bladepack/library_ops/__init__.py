"""Compute-intensive ops served by libraries (GEMM / batched GEMM / linear, later convolution).

Empty in format 1.0: MATMUL and CONV2D run on the reference executor (numpy's BLAS). CPU BLAS calls and
CUTLASS configs with shape-bucketed dispatch arrive with their issues.
"""
