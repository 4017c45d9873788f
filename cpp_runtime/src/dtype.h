// Element types: the manifest's names, the C ABI codes and sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "bladepack/runtime.h"

namespace bpk {

struct DTypeInfo {
  const char* name;
  size_t size;
};

// Indexed by bpk_dtype.
inline constexpr DTypeInfo kDTypes[] = {
    {"float32", 4}, {"float64", 8}, {"float16", 2}, {"bfloat16", 2}, {"int64", 8},
    {"int32", 4},   {"int16", 2},   {"int8", 1},    {"uint8", 1},    {"bool", 1},
};
inline constexpr int32_t kNumDTypes = int32_t(sizeof(kDTypes) / sizeof(kDTypes[0]));

inline bool valid_dtype(int32_t d) { return d >= 0 && d < kNumDTypes; }
inline const char* dtype_name(int32_t d) { return valid_dtype(d) ? kDTypes[d].name : "invalid"; }
inline size_t dtype_size(int32_t d) { return valid_dtype(d) ? kDTypes[d].size : 0; }

// -1 when `name` is not a dtype.
inline int32_t dtype_from_name(const std::string& name) {
  for (int32_t d = 0; d < kNumDTypes; ++d)
    if (name == kDTypes[d].name) return d;
  return -1;
}

}  // namespace bpk
