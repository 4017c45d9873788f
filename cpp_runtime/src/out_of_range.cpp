#include "out_of_range.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "artifact.h"
#include "dtype.h"
#include "errors.h"
#include "model.h"
#include "util.h"

namespace bpk {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// "batch=split,seq=error" as (dim, policy) pairs in order.
std::vector<std::pair<std::string, std::string>> parse_request(const std::string& text) {
  std::vector<std::pair<std::string, std::string>> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    const size_t eq = item.find('=');
    if (eq == std::string::npos || trim(item.substr(0, eq)).empty())
      fail(BPK_ERR_ARGUMENT, "on_out_of_range must read DIM=POLICY[,DIM=POLICY...], got " + py_repr(text));
    out.emplace_back(trim(item.substr(0, eq)), trim(item.substr(eq + 1)));
    at = end + 1;
  }
  return out;
}

// The axes of a proof record (`inputs` / `outputs`): one per tensor, -1 or an axis whose dim is `dim`.
bool axes_of(const msgpack::object* list, const std::vector<TensorDecl>& ts, const std::string& dim,
             std::vector<int64_t>& out) {
  if (list == nullptr || list->type != msgpack::type::ARRAY || list->via.array.size != ts.size()) return false;
  for (size_t i = 0; i < ts.size(); ++i) {
    const msgpack::object& v = list->via.array.ptr[i];
    int64_t ax;
    if (v.type == msgpack::type::POSITIVE_INTEGER && v.via.u64 < ts[i].shape.size())
      ax = int64_t(v.via.u64);
    else if (v.type == msgpack::type::NEGATIVE_INTEGER && v.via.i64 == -1)
      ax = -1;
    else
      return false;
    if (ax >= 0 && (ts[i].shape[size_t(ax)].is_static || ts[i].shape[size_t(ax)].text != dim)) return false;
    out.push_back(ax);
  }
  return true;
}

// A tensor seen as [outer, n, inner bytes] around axis `ax`.
struct Rows {
  int64_t outer = 1, n = 0;
  size_t inner = 0;
};

Rows rows_of(const bpk_tensor& t, int64_t ax) {
  Rows r;
  size_t inner = dtype_size(t.dtype);
  for (int32_t a = 0; a < t.ndim; ++a) {
    if (a < ax) r.outer *= t.shape[a];
    if (a > ax) inner *= size_t(t.shape[a]);
  }
  r.n = t.shape[ax];
  r.inner = inner;
  return r;
}

// Copies rows [lo, hi) of every outer block between a whole tensor and a piece (to_piece) or back.
void copy_rows(const Rows& r, int64_t lo, int64_t hi, char* whole, char* piece, bool to_piece) {
  const size_t len = size_t(hi - lo) * r.inner;
  if (len == 0) return;
  for (int64_t o = 0; o < r.outer; ++o) {
    char* w = whole + (size_t(o) * size_t(r.n) + size_t(lo)) * r.inner;
    char* p = piece + size_t(o) * len;
    std::memcpy(to_piece ? p : w, to_piece ? w : p, len);
  }
}

struct FreeAll {
  std::vector<void*> ptrs;
  ~FreeAll() {
    for (void* p : ptrs) std::free(p);
  }
  char* take(size_t bytes) {
    void* p = alloc_aligned(bytes);
    if (p == nullptr) fail(BPK_ERR_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes for a split piece");
    ptrs.push_back(p);
    return static_cast<char*>(p);
  }
};

}  // namespace

SplitPolicy::SplitPolicy(const msgpack::object& root, const Manifest& m, const char* requested,
                         const std::string& source) {
  if (requested == nullptr) return;
  const msgpack::object* proofs = map_find(root, "batch_dims");
  for (const auto& [dim, policy] : parse_request(requested)) {
    if (policy != "error" && policy != "split")
      fail(BPK_ERR_ARGUMENT, "on_out_of_range[" + py_repr(dim) + "] is " + py_repr(policy) +
                                 "; the policies are error, split");
    const SymbolDecl* sym = nullptr;
    std::vector<std::string> known;
    for (const auto& s : m.symbols) {
      known.push_back(s.name);
      if (s.name == dim) sym = &s;
    }
    if (sym == nullptr) {
      std::sort(known.begin(), known.end());
      std::string names;
      for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
      fail(BPK_ERR_ARGUMENT, "on_out_of_range names dim " + py_repr(dim) + "; the artifact's dynamic dims are: " +
                                 (names.empty() ? "none" : names));
    }
    if (policy == "error") continue;
    if (proofs == nullptr)
      fail(BPK_ERR_ARGUMENT, source + " was built before bladepack proved batch-like dims; optimize it again to split " +
                                 py_repr(dim));
    const msgpack::object* proof = map_find(*proofs, dim.c_str());
    const msgpack::object* split = proof ? map_find(*proof, "split") : nullptr;
    if (split == nullptr || split->type != msgpack::type::BOOLEAN || !split->via.boolean) {
      const msgpack::object* why = proof ? map_find(*proof, "reason") : nullptr;
      const std::string reason = proof == nullptr ? "no input binds it"
                                 : why && why->type == msgpack::type::STR
                                     ? std::string(why->via.str.ptr, why->via.str.size)
                                     : "no reason recorded";
      fail(BPK_ERR_ARGUMENT, "on_out_of_range: dim " + py_repr(dim) +
                                 " cannot be split, because it is not proven batch-like: " + reason);
    }
    SplitDim sd;
    sd.dim = dim;
    if (!axes_of(map_find(*proof, "inputs"), m.inputs, dim, sd.inputs) ||
        !axes_of(map_find(*proof, "outputs"), m.outputs, dim, sd.outputs) ||
        std::all_of(sd.inputs.begin(), sd.inputs.end(), [](int64_t a) { return a < 0; }))
      fail(BPK_ERR_FORMAT, source + ": malformed manifest: batch_dims[" + py_repr(dim) + "] does not give the axis of " +
                               py_repr(dim) + " in each input and output");
    if (!sym->max) continue;  // no maximum: nothing is ever above it
    sd.min = sym->min;
    sd.max = *sym->max;
    splits_.push_back(std::move(sd));
  }
}

std::optional<Pieces> SplitPolicy::pieces(const bpk_tensor* in) const {
  std::vector<std::pair<const SplitDim*, int64_t>> over;
  for (const SplitDim& sp : splits_) {
    int64_t n = -1;
    for (size_t i = 0; i < sp.inputs.size(); ++i) {
      if (sp.inputs[i] < 0) continue;
      const int64_t size = in[i].shape[sp.inputs[i]];
      if (n >= 0 && size != n) return std::nullopt;  // inconsistent: the plain call says what is wrong
      n = size;
    }
    if (n > sp.max) over.emplace_back(&sp, n);
  }
  if (over.empty()) return std::nullopt;
  if (over.size() > 1) {
    std::string names;
    for (const auto& [sp, n] : over) names += (names.empty() ? "" : ", ") + sp->dim + "=" + std::to_string(n);
    fail(BPK_ERR_INPUT, "more than one dim is above its range (" + names +
                            "); the split policy splits one at a time");
  }
  const auto [sp, n] = over[0];
  const int64_t count = ceildiv(n, sp->max), base = n / count, extra = n % count;
  if (base < sp->min)
    fail(BPK_ERR_INPUT, "dim " + py_repr(sp->dim) + " is " + std::to_string(n) +
                            ": it cannot be split into pieces inside its range [" + std::to_string(sp->min) + ", " +
                            std::to_string(sp->max) + "]");
  Pieces p;
  p.split = sp;
  int64_t lo = 0;
  for (int64_t k = 0; k < count; ++k) {
    const int64_t hi = lo + base + (k < extra ? 1 : 0);
    p.bounds.emplace_back(lo, hi);
    lo = hi;
  }
  return p;
}

// The pieces' inputs are views where the dim is the outermost axis that has elements, else copies; a
// piece's outputs are written straight into the whole result the same way, else copied there after.
void Model::run_split(const Pieces& pc, const bpk_tensor* in, bpk_tensor* out, int64_t n_out) const {
  const SplitDim& sp = *pc.split;
  const size_t n_in = m_.inputs.size();
  if (n_out != int64_t(m_.outputs.size()))
    fail(BPK_ERR_ARGUMENT, "expected " + std::to_string(m_.outputs.size()) + " outputs, got " + std::to_string(n_out));
  if (n_out > 0 && out == nullptr) fail(BPK_ERR_ARGUMENT, "outputs is NULL");
  for (size_t i = 0; i < n_in; ++i) {
    size_t bytes = 0;
    if (!byte_count(in[i].shape, in[i].ndim, dtype_size(in[i].dtype), &bytes))
      fail(BPK_ERR_INPUT, "input '" + m_.inputs[i].name + "' has more elements than memory holds");
    if (in[i].data == nullptr && bytes > 0) fail(BPK_ERR_ARGUMENT, "input '" + m_.inputs[i].name + "' has no data");
  }
  auto piece_inputs = [&](int64_t lo, int64_t hi, FreeAll& mem) {
    std::vector<bpk_tensor> t(in, in + n_in);
    for (size_t i = 0; i < n_in; ++i) {
      const int64_t ax = sp.inputs[i];
      if (ax < 0) continue;
      const Rows r = rows_of(in[i], ax);
      t[i].shape[ax] = hi - lo;
      char* whole = static_cast<char*>(in[i].data);
      if (r.outer == 1 || r.inner == 0) {
        t[i].data = whole ? whole + size_t(lo) * r.inner : nullptr;
      } else {
        t[i].data = mem.take(size_t(r.outer) * size_t(hi - lo) * r.inner);
        copy_rows(r, lo, hi, whole, static_cast<char*>(t[i].data), true);
      }
    }
    return t;
  };
  std::vector<bpk_tensor> whole(static_cast<size_t>(n_out));
  split_shapes(pc, in, whole.data(), n_out);
  std::vector<OutSpec> specs(static_cast<size_t>(n_out));
  for (size_t k = 0; k < specs.size(); ++k) {
    specs[k].dtype = whole[k].dtype;
    specs[k].ndim = whole[k].ndim;
    std::copy(whole[k].shape, whole[k].shape + whole[k].ndim, specs[k].shape);
    if (!byte_count(specs[k].shape, specs[k].ndim, dtype_size(specs[k].dtype), &specs[k].nbytes))
      fail(BPK_ERR_MEMORY, "cannot allocate output '" + m_.outputs[k].name + "'");
  }
  check_outputs(specs, out, n_out);
  OwnedOutputs owned(*this, specs, out);  // released again if a piece fails
  for (size_t p = 0; p < pc.bounds.size(); ++p) {
    const auto [lo, hi] = pc.bounds[p];
    FreeAll mem;
    std::vector<bpk_tensor> pin = piece_inputs(lo, hi, mem);
    std::vector<bpk_tensor> pout(whole);
    std::vector<std::pair<size_t, Rows>> scatter;  // outputs computed into a copy, and their rows
    for (size_t k = 0; k < size_t(n_out); ++k) {
      const int64_t ax = sp.outputs[k];
      size_t bytes = 0;
      if (ax < 0) {  // the same in every piece (Note [Batch-like dims]): the first piece's is kept
        byte_count(whole[k].shape, whole[k].ndim, dtype_size(whole[k].dtype), &bytes);
        pout[k].data = p == 0 ? out[k].data : mem.take(bytes);
        continue;
      }
      const Rows r = rows_of(out[k], ax);
      pout[k].shape[ax] = hi - lo;
      if (r.outer == 1 || r.inner == 0) {
        pout[k].data = static_cast<char*>(out[k].data) + size_t(lo) * r.inner;
      } else {
        pout[k].data = mem.take(size_t(r.outer) * size_t(hi - lo) * r.inner);
        scatter.emplace_back(k, r);
      }
    }
    run(pin.data(), int64_t(n_in), pout.data(), n_out);
    for (const auto& [k, r] : scatter)
      copy_rows(r, lo, hi, static_cast<char*>(out[k].data), static_cast<char*>(pout[k].data), false);
  }
  owned.keep();
}

void Model::split_shapes(const Pieces& pc, const bpk_tensor* in, bpk_tensor* out, int64_t n_out) const {
  const SplitDim& sp = *pc.split;
  std::vector<bpk_tensor> first(in, in + m_.inputs.size());
  for (size_t i = 0; i < first.size(); ++i)
    if (sp.inputs[i] >= 0) first[i].shape[sp.inputs[i]] = pc.bounds[0].second - pc.bounds[0].first;
  output_shapes(first.data(), int64_t(first.size()), out, n_out);
  for (size_t k = 0; k < size_t(n_out); ++k)
    if (sp.outputs[k] >= 0) out[k].shape[sp.outputs[k]] = pc.bounds.back().second;
}

}  // namespace bpk
