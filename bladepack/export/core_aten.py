"""PyTorch's core ATen opset (the ops tagged `torch.Tag.core`, what torch.export lowers to for
backends) against the torch front end: every core op has a converter, is handled without one, or is
listed here with the reason it is not converted. tests/test_core_aten.py enumerates the set from
torch's tags and fails on an op none of these explains; the reasons are what an UnsupportedOpsError
says, and docs/ops.md lists them.
"""

from __future__ import annotations

# Evaluated, not converted: symbolic sizes are sympy expressions the shape program computes.
SYMBOLIC = {
    "aten.sym_size.int",
    "aten.sym_numel.default",
    "aten.sym_stride.int",
    "aten.sym_storage_offset.default",
    "aten.sym_is_contiguous.default",
}

_BACKWARD = "a training (backward) op: an artifact runs inference"
_RANDOM = "a random op: an artifact computes the same result for the same inputs"

# By design: what an inference artifact with data-independent shapes does not do.
BY_DESIGN = {
    "aten._adaptive_avg_pool2d_backward.default": _BACKWARD,
    "aten.avg_pool2d_backward.default": _BACKWARD,
    "aten.convolution_backward.default": _BACKWARD,
    "aten.embedding_dense_backward.default": _BACKWARD,
    "aten.max_pool2d_with_indices_backward.default": _BACKWARD,
    "aten.native_group_norm_backward.default": _BACKWARD,
    "aten.native_layer_norm_backward.default": _BACKWARD,
    "aten.rand.default": _RANDOM,
    "aten.randn.default": _RANDOM,
    "aten.randperm.default": _RANDOM,
    "aten.nonzero.default": "its result's shape depends on the input's values",
    "aten._local_scalar_dense.default": "a tensor's value read into Python (.item()): shapes or control flow "
    "that depend on the input's values",
    "aten.as_strided.default": "a view by raw strides over storage (bladepack values have no storage to alias)",
    "aten.atan2.out": "an out= variant (exported programs are functional; atan2 itself converts)",
    "aten.resize_.default": "an in-place resize of storage (exported programs are functional)",
    "aten._fft_r2c.default": "complex tensors (bladepack has no complex dtype)",
    "aten._fft_c2r.default": "complex tensors (bladepack has no complex dtype)",
}

# Not yet: inference ops that need kernels (or index machinery) of their own (none today).
NOT_YET: dict[str, str] = {}

REASONS = {**BY_DESIGN, **NOT_YET}
