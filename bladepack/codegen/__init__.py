"""Kernel code generation from `KernelSpec`s (ir/fusion_plan.py): C++ for CPUs, CUDA C for GPUs.

`emitter` is the machinery both backends share (loads through views, inlined expressions, reduction
and row schedules); `cpu_emitter` / `cuda_emitter` render a kernel each, `cpu_conv` / `cuda_conv` the
convolution and pooling kernels; `toolchain` / `cuda_toolchain` compile whole translation units and
cache the results by content hash.
"""
