// .npy files (format 1.0 / 2.0 / 3.0) for bpk-run: little-endian, C order, the dtypes of bpk_dtype
// (bfloat16 has no numpy type and is refused). Errors are std::runtime_error naming the file.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace npy {

struct Array {
  int32_t dtype = 0;  // bpk_dtype
  std::vector<int64_t> shape;
  void* aligned = nullptr;  // the data, 64-byte aligned
  Array() = default;
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  Array(Array&& o) noexcept;
  ~Array();
};

Array read(const std::string& path);
void write(const std::string& path, int32_t dtype, const std::vector<int64_t>& shape, const void* data);

}  // namespace npy
