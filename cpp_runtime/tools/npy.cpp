#include "npy.h"

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include "bladepack/runtime.h"

namespace npy {
namespace {

struct Descr {
  const char* text;
  int32_t dtype;
};
// '|' for one-byte types; numpy writes '<' for the rest on little-endian hosts. numpy has no bfloat16:
// its tensors travel as uint16 bit patterns, as in the Python loader (Note [bfloat16 on the host]).
const Descr kDescrs[] = {{"<f4", BPK_FLOAT32}, {"<f8", BPK_FLOAT64}, {"<f2", BPK_FLOAT16}, {"<u2", BPK_BFLOAT16},
                         {"<i8", BPK_INT64},   {"<i4", BPK_INT32},   {"<i2", BPK_INT16},   {"|i1", BPK_INT8},
                         {"|u1", BPK_UINT8},   {"|b1", BPK_BOOL}};

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  throw std::runtime_error(path + ": " + what);
}

// The value text after 'key': in numpy's header dict.
std::string field(const std::string& header, const std::string& key, const std::string& path) {
  const size_t k = header.find("'" + key + "'");
  if (k == std::string::npos) bad(path, "the .npy header has no '" + key + "'");
  size_t p = header.find(':', k);
  if (p == std::string::npos) bad(path, "malformed .npy header");
  ++p;
  while (p < header.size() && header[p] == ' ') ++p;
  size_t end = p;
  if (p < header.size() && header[p] == '(') {
    end = header.find(')', p);
    if (end == std::string::npos) bad(path, "malformed .npy shape");
    return header.substr(p, end - p + 1);
  }
  if (p < header.size() && header[p] == '\'') {
    end = header.find('\'', p + 1);
    if (end == std::string::npos) bad(path, "malformed .npy header");
    return header.substr(p + 1, end - p - 1);
  }
  while (end < header.size() && header[end] != ',' && header[end] != '}') ++end;
  return header.substr(p, end - p);
}

}  // namespace

Array::Array(Array&& o) noexcept : dtype(o.dtype), shape(std::move(o.shape)), aligned(o.aligned) { o.aligned = nullptr; }
Array::~Array() { std::free(aligned); }

Array read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) bad(path, "cannot open");
  char magic[8];
  if (!f.read(magic, 8) || std::memcmp(magic, "\x93NUMPY", 6) != 0) bad(path, "not a .npy file");
  uint32_t hlen = 0;
  if (magic[6] == 1) {
    unsigned char b[2];
    if (!f.read(reinterpret_cast<char*>(b), 2)) bad(path, "truncated .npy header");
    hlen = uint32_t(b[0]) | uint32_t(b[1]) << 8;
  } else if (magic[6] == 2 || magic[6] == 3) {
    unsigned char b[4];
    if (!f.read(reinterpret_cast<char*>(b), 4)) bad(path, "truncated .npy header");
    hlen = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
  } else {
    bad(path, "unsupported .npy version " + std::to_string(int(magic[6])));
  }
  if (hlen > (1u << 20)) bad(path, "the .npy header is too large");
  std::string header(hlen, '\0');
  if (!f.read(&header[0], hlen)) bad(path, "truncated .npy header");
  Array a;
  const std::string descr = field(header, "descr", path);
  a.dtype = -1;
  for (const auto& d : kDescrs)
    if (descr == d.text || (descr.size() == 3 && descr[0] == '=' && descr.substr(1) == std::string(d.text).substr(1)))
      a.dtype = d.dtype;
  if (a.dtype < 0)
    bad(path, "dtype '" + descr + "' is not supported (little-endian float32/64/16, uint16 bfloat16 bits, int64/32/16/8, uint8, bool)");
  if (field(header, "fortran_order", path) != "False")
    bad(path, "the array is in Fortran order; save it C-contiguous (numpy.ascontiguousarray)");
  const std::string shape = field(header, "shape", path);
  size_t count = 1;
  for (size_t p = 1; p < shape.size();) {
    while (p < shape.size() && (shape[p] == ' ' || shape[p] == ',')) ++p;
    if (p >= shape.size() || shape[p] == ')') break;
    char* end = nullptr;
    const long long v = std::strtoll(shape.c_str() + p, &end, 10);
    if (end == shape.c_str() + p || v < 0) bad(path, "malformed .npy shape " + shape);
    a.shape.push_back(v);
    if (__builtin_mul_overflow(count, size_t(v), &count)) bad(path, "shape " + shape + " is too large");
    p = size_t(end - shape.c_str());
  }
  if (a.shape.size() > BPK_MAX_RANK) bad(path, "rank above " + std::to_string(BPK_MAX_RANK));
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, bpk_dtype_size(a.dtype), &bytes) || bytes > (size_t(1) << 46))
    bad(path, "shape " + shape + " is too large");
  a.aligned = std::aligned_alloc(64, (bytes + 64) / 64 * 64);
  if (!a.aligned) bad(path, "out of memory");
  if (bytes && !f.read(static_cast<char*>(a.aligned), std::streamsize(bytes))) bad(path, "truncated .npy data");
  return a;
}

void write(const std::string& path, int32_t dtype, const std::vector<int64_t>& shape, const void* data) {
  const char* descr = nullptr;
  for (const auto& d : kDescrs)
    if (d.dtype == dtype) descr = d.text;
  if (descr == nullptr) bad(path, std::string("dtype ") + bpk_dtype_name(dtype) + " has no .npy encoding");
  std::string s = "(";
  size_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    s += (i ? ", " : "") + std::to_string(shape[i]);
    count *= size_t(shape[i]);
  }
  s += shape.size() == 1 ? ",)" : ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + s + ", }";
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  if (!f) bad(path, "cannot create");
  const unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(header.size() & 0xff),
                                 (unsigned char)(header.size() >> 8)};
  f.write(reinterpret_cast<const char*>(pre), 10);
  f.write(header.data(), std::streamsize(header.size()));
  f.write(static_cast<const char*>(data), std::streamsize(count * bpk_dtype_size(dtype)));
  if (!f) bad(path, "write failed");
}

}  // namespace npy
