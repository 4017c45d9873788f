// Small helpers shared by the reader and the evaluator.
#pragma once

#include <msgpack.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace bpk {

// The value under string key `key` of a msgpack map, or null (also when `m` is not a map).
inline const msgpack::object* map_find(const msgpack::object& m, const char* key) {
  if (m.type != msgpack::type::MAP) return nullptr;
  const size_t n = std::strlen(key);
  for (uint32_t i = 0; i < m.via.map.size; ++i) {
    const msgpack::object& k = m.via.map.ptr[i].key;
    if (k.type == msgpack::type::STR && k.via.str.size == n && std::memcmp(k.via.str.ptr, key, n) == 0)
      return &m.via.map.ptr[i].val;
  }
  return nullptr;
}

// floor(a / b) for b != 0 (Python's //); INT64_MIN / -1 is the caller's to rule out.
inline int64_t floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// ceil(a / b) for b != 0 (Python's -(-a // b)), without negating a; INT64_MIN / -1 likewise.
inline int64_t ceildiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) == (b < 0))) ++q;
  return q;
}

// A shape as Python writes a tuple: "(2, 3)", "(5,)", "()" (error texts read as the Python loader's).
inline std::string py_tuple(const int64_t* dims, int32_t n) {
  std::string s = "(";
  for (int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (n == 1 ? ",)" : ")");
}

constexpr size_t kAlign = 64;

// n * size with overflow checks; false when it does not fit.
inline bool byte_count(const int64_t* dims, int32_t n, size_t item, size_t* out) {
  uint64_t total = item;
  for (int32_t i = 0; i < n; ++i) {
    if (dims[i] < 0 || __builtin_mul_overflow(total, uint64_t(dims[i]), &total)) return false;
  }
  *out = size_t(total);
  return true;
}

// The bytes alloc_aligned takes for a request of `bytes`: a multiple of kAlign and, from 64 KiB, rounded
// up to one of eight steps per power of two (at most 12.5% more), so that memory sized by a growing dim
// (an arena, a decode loop's outputs: Note [Output blocks] in output_blocks.h) is reallocated only when
// the size passes its class.
inline size_t alloc_size(size_t bytes) {
  size_t n = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  if (n >= (size_t(1) << 16)) {
    const size_t step = (size_t(1) << (63 - __builtin_clzll(uint64_t(n)))) / 8;
    if (n <= SIZE_MAX - step) n = (n + step - 1) / step * step;
  }
  return n;
}

// kAlign-aligned memory for at least one byte (release with std::free), or null.
inline void* alloc_aligned(size_t bytes) { return std::aligned_alloc(kAlign, alloc_size(bytes)); }

}  // namespace bpk
