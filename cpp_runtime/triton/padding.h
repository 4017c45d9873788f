// Padding requests to a merged call's longest and trimming their results back (Note [Padded merging]
// in bladepack/serving/batching.py): the byte-level helpers of backend.cpp.
#pragma once

#include <bladepack/runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace bpk_triton {

// The bytes of `v` as one element of `dtype` (round to nearest even for float16, as numpy's astype;
// toward zero for bfloat16: the pad values are 0 and a dtype's minimum).
std::vector<uint8_t> element(int32_t dtype, double v);

// Copies the leading `box` of src (shape `from`) into dst (shape `to`); both C-contiguous, `ndim`
// dims of `elem` bytes.
void copy_box(const uint8_t* src, const int64_t* from, uint8_t* dst, const int64_t* to, const int64_t* box, int ndim,
              size_t elem);

}  // namespace bpk_triton
