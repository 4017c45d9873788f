// Reference cases (Note [Reference cases] in bladepack/artifact/reference_cases.py; docs/format.md
// "Reference cases"): Model::verify runs each recorded case with its seeded inputs and compares the
// results with the recorded outputs by the Python loader's rule, writing the report lines
// bladepack/loader/verify.py's report_text writes (the verdict lines are the same text). Each case's
// coverage items are derived again from this runtime's shape-program registers and must be the recorded
// ones, as the Python loader requires.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include <unistd.h>

#include "dtype.h"
#include "errors.h"
#include "model.h"
#include "util.h"

namespace bpk {
namespace {

using Obj = msgpack::object;

// The machine's physical memory in bytes, 0 where sysconf does not say.
size_t machine_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || size <= 0) return 0;
  return size_t(pages) > SIZE_MAX / size_t(size) ? SIZE_MAX : size_t(pages) * size_t(size);
}

[[noreturn]] void malformed(const std::string& what) {
  fail(BPK_ERR_FORMAT, "malformed manifest: reference_cases (" + what + ")");
}

const Obj& get(const Obj& m, const char* key) {
  const Obj* v = map_find(m, key);
  if (v == nullptr) malformed(std::string("KeyError: '") + key + "'");
  return *v;
}

const Obj* list(const Obj& o, const char* what) {
  if (o.type != msgpack::type::ARRAY) malformed(std::string(what) + " is not a list");
  return o.via.array.ptr;
}

std::string str(const Obj& o) {
  if (o.type != msgpack::type::STR) malformed("expected a string");
  return std::string(o.via.str.ptr, o.via.str.size);
}

int64_t integer(const Obj& o) {
  if (o.type == msgpack::type::POSITIVE_INTEGER && o.via.u64 <= uint64_t(INT64_MAX)) return int64_t(o.via.u64);
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return o.via.i64;
  if (o.type == msgpack::type::BOOLEAN) return o.via.boolean;
  malformed("expected an integer");
}

uint64_t seed_of(const Obj& o) {  // Python: int(seed) % 2**64
  if (o.type == msgpack::type::POSITIVE_INTEGER) return o.via.u64;
  if (o.type == msgpack::type::NEGATIVE_INTEGER) return uint64_t(o.via.i64);
  malformed("seed is not an integer");
}

double real(const Obj& o) {
  if (o.type == msgpack::type::FLOAT32 || o.type == msgpack::type::FLOAT64) return o.via.f64;
  return double(integer(o));
}

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool is_float(int32_t d) { return d == BPK_FLOAT32 || d == BPK_FLOAT64; }

template <class T>
void put(void* out, size_t i, T v) {
  std::memcpy(static_cast<char*>(out) + i * sizeof(T), &v, sizeof(T));
}

// Stores an integer (C conversion, as numpy's astype) or a double into element i of dtype d.
void store_int(void* out, size_t i, int32_t d, int64_t v) {
  switch (d) {
    case BPK_INT64: return put<int64_t>(out, i, v);
    case BPK_INT32: return put<int32_t>(out, i, int32_t(v));
    case BPK_INT16: return put<int16_t>(out, i, int16_t(v));
    case BPK_INT8: return put<int8_t>(out, i, int8_t(v));
    case BPK_UINT8: return put<uint8_t>(out, i, uint8_t(v));
    case BPK_BOOL: return put<uint8_t>(out, i, uint8_t(v != 0));
    default: malformed("an integer input of a floating dtype");
  }
}

void store_real(void* out, size_t i, int32_t d, double v) {
  if (d == BPK_FLOAT32) return put<float>(out, i, float(v));
  if (d == BPK_FLOAT64) return put<double>(out, i, v);
  malformed("a real-valued input of an integer dtype");
}

// Note [Reference cases]: a seeded input.
void generate(const Obj& rec, int32_t dtype, size_t n, void* out) {
  const uint64_t seed = seed_of(get(rec, "seed"));
  if (const Obj* r = map_find(rec, "uniform")) {
    if (r->type != msgpack::type::ARRAY || r->via.array.size != 2 || !is_float(dtype)) malformed("uniform");
    const double lo = real(r->via.array.ptr[0]), hi = real(r->via.array.ptr[1]);
    for (size_t i = 0; i < n; ++i) {
      const double f = double(splitmix64(seed + i) >> 11) * 0x1p-53;
      store_real(out, i, dtype, lo + (hi - lo) * f);
    }
  } else if (const Obj* r = map_find(rec, "integers")) {
    if (r->type != msgpack::type::ARRAY || r->via.array.size != 2 || is_float(dtype)) malformed("integers");
    const int64_t lo = integer(r->via.array.ptr[0]), hi = integer(r->via.array.ptr[1]);
    if (hi < lo) malformed("integers range is empty");
    const uint64_t span = uint64_t(hi) - uint64_t(lo) + 1;
    for (size_t i = 0; i < n; ++i) store_int(out, i, dtype, lo + int64_t(splitmix64(seed + i) % span));
  } else if (const Obj* r = map_find(rec, "choice")) {
    if (r->type != msgpack::type::ARRAY || r->via.array.size == 0) malformed("choice");
    const uint32_t k = r->via.array.size;
    for (size_t i = 0; i < n; ++i) {
      const Obj& v = r->via.array.ptr[splitmix64(seed + i) % k];
      if (is_float(dtype))
        store_real(out, i, dtype, real(v));
      else
        store_int(out, i, dtype, integer(v));
    }
  } else {
    malformed("a seeded input needs uniform, integers or choice");
  }
}

double half_to_double(uint16_t h) {
  const int e = (h >> 10) & 31, f = h & 1023;
  const double s = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 0) return s * std::ldexp(double(f), -24);
  if (e == 31) return f ? std::numeric_limits<double>::quiet_NaN() : s * std::numeric_limits<double>::infinity();
  return s * std::ldexp(double(f | 1024), e - 25);
}

double element(const void* p, size_t i, int32_t d) {
  const char* c = static_cast<const char*>(p);
  auto at = [&](auto v) {
    std::memcpy(&v, c + i * sizeof(v), sizeof(v));
    return v;
  };
  switch (d) {
    case BPK_FLOAT32: return at(float());
    case BPK_FLOAT64: return at(double());
    case BPK_FLOAT16: return half_to_double(at(uint16_t()));
    case BPK_BFLOAT16: {
      const uint32_t bits = uint32_t(at(uint16_t())) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    case BPK_INT64: return double(at(int64_t()));
    case BPK_INT32: return at(int32_t());
    case BPK_INT16: return at(int16_t());
    case BPK_INT8: return at(int8_t());
    default: return at(uint8_t());
  }
}

double tolerance(int32_t d) {  // bladepack/artifact/reference_cases.py TOLERANCE
  switch (d) {
    case BPK_FLOAT64: return 1e-9;
    case BPK_FLOAT32: return 1e-4;
    case BPK_FLOAT16: return 1e-2;
    case BPK_BFLOAT16: return 4e-2;
    default: return 0;
  }
}

struct Verdict {
  bool passed;
  double err, scaled;
};

// bladepack/artifact/reference_cases.py compare(); `tol`: the record's tolerance of this output
Verdict compare(const void* got, const void* want, size_t n, int32_t d, double tol) {
  const bool fl = d == BPK_FLOAT32 || d == BPK_FLOAT64 || d == BPK_FLOAT16 || d == BPK_BFLOAT16;
  double err = 0, scale = 1;
  bool special_ok = true, exact = true;
  for (size_t i = 0; i < n; ++i) {
    const double g = element(got, i, d), w = element(want, i, d);
    if (!fl) {
      exact = exact && g == w;
      err = std::max(err, std::fabs(g - w));
      continue;
    }
    if (std::isnan(g) != std::isnan(w)) special_ok = false;
    if (std::isinf(w)) {
      if (g != w) special_ok = false;
      continue;
    }
    if (std::isnan(w)) continue;
    const double diff = std::fabs(g - w);
    err = std::isnan(diff) ? std::numeric_limits<double>::infinity() : std::max(err, diff);
    scale = std::max(scale, std::fabs(w));
  }
  if (!fl) return {exact, err, 0};
  return {special_ok && err <= tol * scale, err, err / scale};
}

bool truthy(const Obj& o) { return o.type == msgpack::type::BOOLEAN ? o.via.boolean : integer(o) != 0; }

int64_t reg(const Obj& o, const std::vector<int64_t>& regs) {
  const int64_t r = integer(o);
  if (r < 0 || size_t(r) >= regs.size()) malformed("IndexError: register " + std::to_string(r));
  return regs[size_t(r)];
}

const Obj* items_of(const Obj* list) {
  return list != nullptr && list->type == msgpack::type::ARRAY ? list->via.array.ptr : nullptr;
}
uint32_t count(const Obj* list) { return list != nullptr && list->type == msgpack::type::ARRAY ? list->via.array.size : 0; }

// False when a shape condition rules the launch out at these registers (data conditions may hold).
bool may_run(const Obj& launch, const std::vector<int64_t>& regs) {
  const Obj* when = map_find(launch, "when");
  for (uint32_t i = 0; i < count(when); ++i) {
    const Obj& c = items_of(when)[i];
    const Obj* r = map_find(c, "r");
    if (r != nullptr && (reg(*r, regs) != 0) != truthy(get(c, "is"))) return false;
  }
  return true;
}

// bladepack/artifact/reference_cases.py covered(): the coverage items these registers exercise.
std::vector<std::string> covered(const Obj& root, const std::vector<int64_t>& regs) {
  std::vector<std::string> items;
  std::map<std::string, int64_t> rows;
  const Obj* kernels = map_find(root, "kernels");
  for (uint32_t i = 0; i < count(kernels); ++i) {
    const Obj& k = items_of(kernels)[i];
    const Obj* t = map_find(k, "target");
    const std::string target = t == nullptr ? "cpu" : str(*t);
    const int64_t row = rows[target]++;
    const Obj* plan = map_find(root, target == "cpu" ? "native_cpu" : "native_cuda");
    const Obj* launches = plan != nullptr ? map_find(*plan, "launches") : nullptr;
    bool runs = false;
    for (uint32_t j = 0; j < count(launches) && !runs; ++j) {
      const Obj& l = items_of(launches)[j];
      const Obj *op = map_find(l, "op"), *kk = map_find(l, "k");
      runs = op != nullptr && op->type == msgpack::type::STR && str(*op) == "kernel" && kk != nullptr &&
             integer(*kk) == row && may_run(l, regs);
    }
    if (!runs) continue;
    const Obj& variants = get(k, "variants");
    for (uint32_t v = 0; v < count(&variants); ++v) {
      const Obj& var = items_of(&variants)[v];
      if (reg(get(var, "pred"), regs)) {
        items.push_back(target + " " + str(get(k, "name")) + " " + str(get(var, "name")));
        break;
      }
    }
  }
  std::vector<const Obj*> cutlass, launches;
  const Obj* gemms = map_find(root, "gemm_configs");
  for (uint32_t i = 0; i < count(gemms); ++i) {
    const Obj* lib = map_find(items_of(gemms)[i], "library");
    if (lib != nullptr && lib->type == msgpack::type::STR && str(*lib) == "cutlass") cutlass.push_back(&items_of(gemms)[i]);
  }
  const Obj* cuda = map_find(root, "native_cuda");
  const Obj* cl = cuda != nullptr ? map_find(*cuda, "launches") : nullptr;
  for (uint32_t i = 0; i < count(cl); ++i) {
    const Obj* op = map_find(items_of(cl)[i], "op");
    if (op != nullptr && op->type == msgpack::type::STR && str(*op) == "cutlass") launches.push_back(&items_of(cl)[i]);
  }
  for (size_t i = 0; i < std::min(cutlass.size(), launches.size()); ++i) {
    if (!may_run(*launches[i], regs)) continue;
    for (const auto& [table, key] : {std::pair<const char*, const char*>{"dispatch", "entries"},
                                     std::pair<const char*, const char*>{"dispatch_sm90", "entries_sm90"}}) {
      const Obj* entries = map_find(*launches[i], key);
      for (uint32_t e = 0; e < count(entries); ++e)
        if (reg(get(items_of(entries)[e], "pred"), regs)) {
          items.push_back("gemm %" + std::to_string(integer(get(*cutlass[i], "node"))) + " " + table + " " +
                          std::to_string(e));
          break;
        }
    }
  }
  return items;
}

std::string py_list(std::vector<std::string> v) {  // Python's repr of sorted(v)
  std::sort(v.begin(), v.end());
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + py_repr(v[i]);
  return s + "]";
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

bool Model::verify(std::string& report) const {
  const Obj* rec = map_find(artifact_->manifest(), "reference_cases");
  const std::string& src = artifact_->source();
  if (rec == nullptr) {
    report = src + ": no reference cases recorded (optimize with reference_cases=True)\n";
    return true;
  }
  struct Case {
    std::map<std::string, int64_t> dims;
    std::vector<std::vector<int64_t>> shapes;
    const Obj* inputs;
    const Obj* outputs;
    std::vector<std::string> covers;
  };
  std::vector<Case> cases;
  std::vector<std::string> uncovered;
  std::string oracle;
  // Note [Verdict tolerance] (reference_cases.py computed_in): the record's tolerance per output, or
  // (a record without one) the output dtype's
  std::vector<double> tol;
  for (const auto& o : m_.outputs) tol.push_back(tolerance(o.dtype));
  try {
    oracle = str(get(*rec, "oracle"));
    if (const Obj* t = map_find(*rec, "tolerance")) {
      const Obj* ts = list(*t, "tolerance");
      if (t->via.array.size != m_.outputs.size())
        malformed("ValueError: tolerance is not a list with one number per output");
      for (uint32_t j = 0; j < t->via.array.size; ++j) {
        if (ts[j].type == msgpack::type::BOOLEAN) malformed("ValueError: tolerance is not a number in [0, 1)");
        const double v = real(ts[j]);
        if (!(v >= 0.0 && v < 1.0)) malformed("ValueError: tolerance is not a number in [0, 1)");
        tol[j] = v;
      }
    }
    const Obj& cs = get(*rec, "cases");
    const Obj* c = list(cs, "cases");
    for (uint32_t k = 0; k < cs.via.array.size; ++k) {
      Case x;
      const Obj& dims = get(c[k], "dims");
      if (dims.type != msgpack::type::MAP) malformed("dims is not a map");
      for (uint32_t i = 0; i < dims.via.map.size; ++i) x.dims[str(dims.via.map.ptr[i].key)] = integer(dims.via.map.ptr[i].val);
      bool inside = x.dims.size() == m_.symbols.size();
      for (const auto& sym : m_.symbols) {
        auto it = x.dims.find(sym.name);
        inside = inside && it != x.dims.end() && it->second >= sym.min && (!sym.max || it->second <= *sym.max);
      }
      if (!inside) malformed("ValueError: a case's dims are not the symbols inside their ranges");
      // an input dim that is an expression of the symbols (past+1) comes from the case's shapes, which
      // must agree with the static dims and the symbols (reference_record.py records them then)
      const Obj* given = map_find(c[k], "shapes");
      const Obj* rows = nullptr;
      if (given != nullptr) {
        rows = list(*given, "shapes");
        if (given->via.array.size != m_.inputs.size()) malformed("ValueError: a case's shapes do not match the inputs' ranks");
      }
      for (size_t i = 0; i < m_.inputs.size(); ++i) {
        const auto& t = m_.inputs[i];
        const Obj* row = nullptr;
        if (rows != nullptr) {
          row = list(rows[i], "shapes");
          if (rows[i].via.array.size != t.shape.size()) malformed("ValueError: a case's shapes do not match the inputs' ranks");
        }
        x.shapes.emplace_back();
        for (size_t axis = 0; axis < t.shape.size(); ++axis) {
          const auto& d = t.shape[axis];
          int64_t size;
          auto it = x.dims.find(d.text);
          if (d.is_static) {
            size = d.size;
          } else if (it != x.dims.end()) {
            size = it->second;
          } else if (row != nullptr) {
            size = integer(row[axis]);
          } else {
            malformed("ValueError: input " + std::to_string(i) + " dimension " + std::to_string(axis) + " is " +
                      py_repr(d.text) + ", and the case records no shapes");
          }
          if (row != nullptr && integer(row[axis]) != size)
            malformed("ValueError: a case's shapes disagree with its dims");
          x.shapes.back().push_back(size);
        }
      }
      x.inputs = &get(c[k], "inputs");
      x.outputs = &get(c[k], "outputs");
      list(*x.inputs, "inputs");
      list(*x.outputs, "outputs");
      if (x.inputs->via.array.size != m_.inputs.size() || x.outputs->via.array.size != m_.outputs.size())
        malformed("ValueError: a case's inputs or outputs do not match the signature");
      const Obj& covers = get(c[k], "covers");
      const Obj* cv = list(covers, "covers");
      for (uint32_t i = 0; i < covers.via.array.size; ++i) x.covers.push_back(str(cv[i]));
      cases.push_back(std::move(x));
    }
    const Obj& un = get(*rec, "uncovered");
    const Obj* u = list(un, "uncovered");
    for (uint32_t i = 0; i < un.via.array.size; ++i)
      uncovered.push_back(str(get(u[i], "item")) + " (" + str(get(u[i], "why")) + ")");
  } catch (const Error& e) {
    fail(e.status(), src + ": " + e.what());
  }

  std::vector<std::string> lines;
  std::set<std::string> ran;
  for (const auto& c : cases) ran.insert(c.covers.begin(), c.covers.end());
  lines.push_back(src + ": " + std::to_string(cases.size()) + " reference cases (oracle: " + oracle + ") on " +
                  executor_ + "; " + std::to_string(ran.size()) + " variants and dispatch entries ran, " +
                  std::to_string(uncovered.size()) + " not covered");
  size_t passed_cases = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    const Case& c = cases[k];
    std::string dims, shapes;
    for (const auto& [name, v] : c.dims) dims += (dims.empty() ? "" : ", ") + name + "=" + std::to_string(v);
    for (const auto& s : c.shapes) {
      std::string one;
      for (int64_t d : s) one += (one.empty() ? "" : "x") + std::to_string(d);
      shapes += (shapes.empty() ? "" : " ") + (one.empty() ? std::string("scalar") : one);
    }
    const std::string head =
        "case " + std::to_string(k) + ": " + (dims.empty() ? "static shapes" : dims) + " (" + shapes + "): ";
    std::vector<std::string> detail;
    std::string failure;
    std::vector<bpk_tensor> in(m_.inputs.size()), out(m_.outputs.size());
    std::vector<std::unique_ptr<void, void (*)(void*)>> owned;
    try {
      // Note [Reference input sizes] in bladepack/loader/verify.py: refused before any input is made
      std::vector<size_t> sizes(in.size());
      size_t need = 0;
      for (size_t i = 0; i < in.size(); ++i) {
        bpk_tensor& t = in[i];
        std::memset(&t, 0, sizeof t);
        t.dtype = m_.inputs[i].dtype;
        t.ndim = int32_t(c.shapes[i].size());
        if (t.ndim > BPK_MAX_RANK) malformed("an input shape");
        std::copy(c.shapes[i].begin(), c.shapes[i].end(), t.shape);
        if (!byte_count(t.shape, t.ndim, dtype_size(t.dtype), &sizes[i])) malformed("an input shape");
        need = need + sizes[i] < need ? SIZE_MAX : need + sizes[i];
      }
      const size_t have = machine_bytes();
      if (have != 0 && need > have)
        fail(BPK_ERR_MEMORY, "cannot allocate a reference input: the case's inputs need " + std::to_string(need) +
                                 " bytes, more than this machine's " + std::to_string(have) + " bytes of memory");
      for (size_t i = 0; i < in.size(); ++i) {
        bpk_tensor& t = in[i];
        const size_t bytes = sizes[i];
        owned.emplace_back(alloc_aligned(bytes), std::free);
        if (!owned.back()) fail(BPK_ERR_MEMORY, "cannot allocate a reference input");
        t.data = owned.back().get();
        generate(c.inputs->via.array.ptr[i], t.dtype, bytes / dtype_size(t.dtype), t.data);
      }
      for (auto& o : out) std::memset(&o, 0, sizeof o);
    } catch (const Error& e) {
      fail(e.status(), src + ": " + e.what());
    }
    try {
      // the items the loader's own shape program picks must be the recorded ones (as in Python)
      std::vector<int64_t> regs = prepared(in.data())->regs;
      std::vector<std::string> ran;
      try {
        ran = covered(artifact_->manifest(), regs);
      } catch (const Error& e) {
        fail(e.status(), src + ": " + e.what());
      }
      if (py_list(ran) != py_list(c.covers))
        failure = "the shape program picks " + py_list(ran) + ", the record says " + py_list(c.covers);
      else
        run(in.data(), int64_t(in.size()), out.data(), int64_t(out.size()));
    } catch (const Error& e) {
      if (e.status() == BPK_ERR_FORMAT && std::string(e.what()).find("reference_cases") != std::string::npos) throw;
      failure = std::string(bpk_status_name(e.status())) + ": " + e.what();
    }
    for (auto& o : out)
      if (o.data) owned.emplace_back(o.data, std::free);
    bool ok = failure.empty();
    for (size_t j = 0; ok && j < out.size(); ++j) {
      const Obj& rec_out = c.outputs->via.array.ptr[j];
      std::vector<int64_t> shape;
      const Obj& sh = get(rec_out, "shape");
      const Obj* s = list(sh, "shape");
      for (uint32_t a = 0; a < sh.via.array.size; ++a) shape.push_back(integer(s[a]));
      const int32_t d = out[j].dtype;
      const Bytes want = artifact_->section(str(get(rec_out, "section")));
      size_t bytes = 0;
      if (str(get(rec_out, "dtype")) != dtype_name(m_.outputs[j].dtype) ||
          !byte_count(shape.data(), int32_t(shape.size()), dtype_size(d), &bytes) || want.size != bytes)
        fail(BPK_ERR_FORMAT, src + ": malformed manifest: reference_cases (ValueError: output " + std::to_string(j) + ")");
      const bool same_shape = shape == std::vector<int64_t>(out[j].shape, out[j].shape + out[j].ndim);
      const Verdict v = same_shape ? compare(out[j].data, want.data, bytes / dtype_size(d), d, tol[j])
                                   : Verdict{false, INFINITY, INFINITY};
      detail.push_back("  " + m_.outputs[j].name + ": max abs " + fmt("%.3g", v.err) + ", scaled " +
                       fmt("%.3g", v.scaled) + " (tolerance " + fmt("%.0e", tol[j]) + ")" +
                       (v.passed ? "" : "  FAIL"));
      if (!v.passed && failure.empty()) failure = "output '" + m_.outputs[j].name + "' differs";
    }
    ok = failure.empty();
    passed_cases += ok;
    lines.push_back(head + (ok ? "pass" : "FAIL: " + failure));
    lines.insert(lines.end(), detail.begin(), detail.end());
    if (!c.covers.empty()) {
      std::string r;
      for (const auto& i : c.covers) r += (r.empty() ? "" : ", ") + i;
      lines.push_back("  ran: " + r);
    }
  }
  for (const auto& u : uncovered) lines.push_back("not covered: " + u);
  const bool all = passed_cases == cases.size();
  const std::string total = std::to_string(cases.size()), passed = std::to_string(passed_cases);
  lines.push_back(all ? "verify: passed (" + passed + " of " + total + " cases passed)"
                      : "verify: FAILED (" + std::to_string(cases.size() - passed_cases) + " of " + total +
                            " cases failed, " + passed + " passed)");
  report.clear();
  for (const auto& l : lines) report += l + "\n";
  return all;
}

}  // namespace bpk
