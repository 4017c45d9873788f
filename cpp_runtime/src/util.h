// Small helpers shared by the reader and the evaluator.
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <cstring>

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

}  // namespace bpk
