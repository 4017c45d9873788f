// Generated from the op table (bladepack/opset/table.py) by scripts/generate.py: do not edit.
// The IR ops a plan may name; parse_manifest refuses a plan with any other (manifest.cpp).
#pragma once

namespace bpk {

inline constexpr const char* kPlanOps[] = {
    "neg", "abs", "exp", "log", "sqrt", "rsqrt", "reciprocal", "tanh", "sigmoid", "relu", "gelu", "silu", "erf", "sin",
    "cos", "floor", "leaky_relu", "clamp", "cast", "logical_not", "bitwise_not", "sign", "ceil", "trunc", "round",
    "log1p", "expm1", "log2", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "add",
    "sub", "mul", "div", "pow", "maximum", "minimum", "fmod", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
    "logical_or", "bitwise_and", "bitwise_or", "bitwise_xor", "logical_xor", "atan2", "remainder", "where", "constant",
    "full", "arange", "reshape", "expand", "permute", "slice", "concat", "take", "gather", "index", "pad", "sum",
    "mean", "amax", "amin", "prod", "argmax", "argmin", "cumsum", "topk", "sort", "scatter", "recurrent",
    "selective_scan", "softmax", "log_softmax", "layer_norm", "rms_norm", "matmul", "conv2d", "max_pool2d",
    "avg_pool2d",
};

}  // namespace bpk
