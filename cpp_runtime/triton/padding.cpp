#include "padding.h"

#include <cstring>

namespace bpk_triton {
namespace {

// Round to nearest even, as numpy's astype does.
uint16_t half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
  if (exp == 0xffu) return uint16_t(sign | 0x7c00u | (man ? 0x200u : 0u));
  const int e = int(exp) - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return uint16_t(sign);
    const uint32_t m = man | 0x800000u;
    const int shift = 14 - e;
    uint32_t h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) ++h;
    return uint16_t(sign | h);
  }
  uint32_t h = (uint32_t(e) << 10) | (man >> 13);
  const uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return uint16_t(sign | h);
}

}  // namespace

std::vector<uint8_t> element(int32_t dtype, double v) {
  std::vector<uint8_t> out(bpk_dtype_size(dtype));
  auto put = [&](auto x) { std::memcpy(out.data(), &x, sizeof(x)); };
  switch (dtype) {
    case BPK_FLOAT32: put(float(v)); break;
    case BPK_FLOAT64: put(v); break;
    case BPK_FLOAT16: put(half_bits(float(v))); break;
    case BPK_BFLOAT16: {
      const float f = float(v);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      put(uint16_t(x >> 16));  // toward zero: the pad values are 0 and a dtype's minimum
      break;
    }
    case BPK_BOOL: put(uint8_t(v != 0)); break;
    case BPK_UINT8: put(uint8_t(v)); break;
    case BPK_INT8: put(int8_t(v)); break;
    case BPK_INT16: put(int16_t(v)); break;
    case BPK_INT32: put(int32_t(v)); break;
    default: put(int64_t(v)); break;
  }
  return out;
}

void copy_box(const uint8_t* src, const int64_t* from, uint8_t* dst, const int64_t* to, const int64_t* box, int ndim,
              size_t elem) {
  if (ndim == 0) {
    std::memcpy(dst, src, elem);
    return;
  }
  size_t src_row = elem, dst_row = elem;
  bool whole = true;
  for (int d = 1; d < ndim; ++d) {
    src_row *= size_t(from[d]);
    dst_row *= size_t(to[d]);
    whole = whole && from[d] == box[d] && to[d] == box[d];
  }
  if (whole) {
    std::memcpy(dst, src, size_t(box[0]) * src_row);
    return;
  }
  for (int64_t i = 0; i < box[0]; ++i)
    copy_box(src + size_t(i) * src_row, from + 1, dst + size_t(i) * dst_row, to + 1, box + 1, ndim - 1, elem);
}

}  // namespace bpk_triton
