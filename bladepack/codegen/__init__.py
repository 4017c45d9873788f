"""Kernel code generation (C++ for CPU, CUDA C for GPUs) from fusion plans.

Empty in format 1.0: plans run on the loader's reference executor. The generated, fused kernels and
their compile cache arrive with the fusion work; see ../shared/DESIGN.md "Fusion and code generation".
"""
