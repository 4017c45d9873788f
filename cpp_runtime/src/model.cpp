#include "model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "dtype.h"
#include "errors.h"
#include "output_blocks.h"
#include "util.h"

namespace bpk {
namespace {

constexpr int64_t kOpKernel = 1, kOpGemm = 2;

std::string shape_list(const int64_t* dims, int32_t n) {
  std::string s = "[";
  for (int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace

const PaddedDims& Model::padded_dims() const {
  std::lock_guard<std::mutex> lock(padded_mutex_);  // read when a server asks, as the Python loader does
  if (!padded_) padded_ = std::make_unique<PaddedDims>(artifact_->manifest(), m_, artifact_->source());
  return *padded_;
}

size_t Model::KeyHash::operator()(const std::vector<int64_t>& k) const {
  uint64_t h = 1469598103934665603ull;
  for (int64_t v : k) h = (h ^ uint64_t(v)) * 1099511628211ull;
  return size_t(h ^ (h >> 29));
}

Model::Model(std::unique_ptr<Artifact> artifact, const bpk_load_options& options) : artifact_(std::move(artifact)) {
  const std::string& src = artifact_->source();
  try {
    m_ = parse_manifest(artifact_->manifest());
    std::vector<int32_t> ranks;
    for (const auto& t : m_.inputs) ranks.push_back(int32_t(t.shape.size()));
    m_.shape_program.validate(ranks);
  } catch (const Error& e) {
    fail(e.status(), src + ": " + e.what());
  }
  for (const auto& w : m_.weights) {
    const Bytes b = artifact_->section("weight/" + w.name);
    size_t want = 0;
    if (!byte_count(w.shape.data(), int32_t(w.shape.size()), dtype_size(w.dtype), &want) || b.size != want)
      artifact_->fail("weight " + py_repr(w.name) + " has " + std::to_string(b.size) + " bytes, expected " +
                      std::to_string(want));
    weight_ptrs_.push_back(b.data);
  }
  build_signature();
  num_threads_ = options.num_threads;
  if (const msgpack::object* rec = map_find(artifact_->manifest(), "packed"); rec && rec->type == msgpack::type::MAP)
    if (const msgpack::object* sym = map_find(*rec, "symbol"); sym && sym->type == msgpack::type::STR)
      packed_symbol_ = sym->as<std::string>();
  split_ = SplitPolicy(artifact_->manifest(), m_, options.on_out_of_range, src);
  const std::string device = options.device ? options.device : "cpu";
  device_ = device;
  cuda_graphs_ = options.cuda_graphs;
  if (device != "cpu") {
    if (options.cuda_graphs < -1)
      fail(BPK_ERR_ARGUMENT, "cuda_graphs is " + std::to_string(options.cuda_graphs) +
                                 "; allowed: -1 (off), 0 (the default, 64) or a positive count");
    load_cuda(device, options.cuda_graphs == 0 ? 64 : options.cuda_graphs < 0 ? 0 : options.cuda_graphs);
    plan_outputs();
    return;
  }
  if (!m_.native)
    fail(BPK_ERR_UNSUPPORTED, src +
                                  " has no CPU kernel library (it was built without a C++ compiler); the C++ "
                                  "runtime runs native plans only");
  refuse_ref_launches(*m_.native, "CPU");
  lib_ = std::make_unique<KernelLibrary>(*artifact_, m_.native->libraries, options.num_threads);
  for (size_t k = 0; k < m_.kernels.size(); ++k)
    for (const auto& v : m_.kernels[k].variants)
      if (v.fn < 0 || v.fn >= lib_->num_functions())
        artifact_->fail("corrupt plan: kernel " + std::to_string(k) + " names function " +
                        std::to_string(v.fn) + "; the library has " + std::to_string(lib_->num_functions()));
  executor_ = "native (" + lib_->isa() + ")";
  plan_outputs();
}

void Model::refuse_ref_launches(const NativePlan& plan, const char* target) const {
  std::string refs;
  for (const auto& l : plan.launches) {
    if (l.op != LaunchDecl::kRef) continue;
    std::string what = "%" + std::to_string(l.node), loc;
    for (const auto& s : m_.steps)
      if (s.out == l.node) {
        what += " " + s.op;
        loc = s.loc;
      }
    refs += "\n  " + what + ": " + l.reason + " (from " + (loc.empty() ? "unknown source" : loc) + ")";
  }
  if (!refs.empty())
    fail(BPK_ERR_UNSUPPORTED, artifact_->source() + ": these plan steps have no generated " + target +
                                  " kernel and run on the Python reference executor, which the C++ runtime does "
                                  "not have:" + refs);
}

Model::~Model() {
  for (Arena* a : arenas_) {
    std::free(a->data);
    delete a;
  }
}

// Position of the first element of `items` whose id is `id` and that `ok` accepts, or -1.
template <class T, class Ok>
int64_t find_id(const std::vector<T>& items, int64_t id, Ok ok) {
  for (size_t i = 0; i < items.size(); ++i)
    if (items[i].id == id && ok(i)) return int64_t(i);
  return -1;
}

void Model::plan_outputs() {
  const auto& slots = plan().outputs;
  const auto any = [](size_t) { return true; };
  for (size_t k = 0; k < slots.size(); ++k) {
    const int64_t id = m_.outputs[k].id;
    if (slots[k] >= 0) {
      out_source_.push_back({OutSource::kNative, 0});
      continue;
    }
    // Python's _locate order: an input, a weight, an output already written (natively, or copied
    // earlier in this loop), an arena buffer
    const auto written = [&](size_t j) { return j != k && (slots[j] >= 0 || j < k); };
    int64_t at;
    if ((at = find_id(m_.inputs, id, any)) >= 0) {
      out_source_.push_back({OutSource::kInput, at});
    } else if ((at = find_id(m_.weights, id, any)) >= 0) {
      out_source_.push_back({OutSource::kWeight, at});
    } else if ((at = find_id(m_.outputs, id, written)) >= 0) {
      out_source_.push_back({OutSource::kOutput, at});
    } else if ((at = find_id(plan().buffers, id, any)) >= 0) {
      out_source_.push_back({OutSource::kArena, at});
    } else {
      artifact_->fail("malformed manifest: output " + std::to_string(k) + " (value %" + std::to_string(id) +
                      ") is neither written by the native plan nor found anywhere");
    }
  }
}

std::string Model::spec_text(const TensorDecl& t) const {
  std::string s = t.name + ": " + dtype_name(t.dtype) + "[";
  for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + t.shape[i].text;
  return s + "]";
}

void Model::build_signature() {
  auto specs = [this](const std::vector<TensorDecl>& ts, std::vector<bpk_tensor_spec>& out) {
    for (const auto& t : ts) {
      spec_dims_.emplace_back();
      spec_exprs_.emplace_back();
      for (const auto& d : t.shape) {
        spec_dims_.back().push_back(d.is_static ? d.size : -1);
        spec_exprs_.back().push_back(d.text.c_str());
      }
    }
    for (size_t i = 0; i < ts.size(); ++i) {
      const size_t at = spec_dims_.size() - ts.size() + i;
      out.push_back({ts[i].name.c_str(), ts[i].dtype, int32_t(ts[i].shape.size()), spec_dims_[at].data(),
                     spec_exprs_[at].data()});
    }
  };
  specs(m_.inputs, in_specs_);
  specs(m_.outputs, out_specs_);
  std::string ins, outs, syms;
  for (const auto& t : m_.inputs) ins += (ins.empty() ? "" : ", ") + spec_text(t);
  for (const auto& t : m_.outputs) outs += (outs.empty() ? "" : ", ") + spec_text(t);
  for (const auto& s : m_.symbols) {
    sym_specs_.push_back({s.name.c_str(), s.min, s.max ? *s.max : -1});
    syms += (syms.empty() ? "" : "; ") + s.name + " in [" + std::to_string(s.min) + ", " +
            (s.max ? std::to_string(*s.max) : "inf") + "]";
  }
  sig_text_ = "(" + ins + ") -> (" + outs + ")" + (syms.empty() ? "" : " where " + syms);
  sig_ = {int64_t(in_specs_.size()), in_specs_.data(), int64_t(out_specs_.size()), out_specs_.data(),
          int64_t(sym_specs_.size()), sym_specs_.data(), sig_text_.c_str()};
}

void Model::check_inputs(const bpk_tensor* in, int64_t n) const {
  const auto& specs = m_.inputs;
  if (n != int64_t(specs.size())) {
    std::string names;
    for (const auto& t : specs) names += (names.empty() ? "" : ", ") + t.name;
    fail(BPK_ERR_INPUT, "expected " + std::to_string(specs.size()) + " inputs (" + names + "), got " + std::to_string(n));
  }
  if (n > 0 && in == nullptr) fail(BPK_ERR_ARGUMENT, "inputs is NULL");
  for (size_t i = 0; i < specs.size(); ++i) {
    const TensorDecl& t = specs[i];
    const bpk_tensor& x = in[i];
    const std::string name = "input '" + t.name + "'";
    if (x.ndim < 0 || x.ndim > BPK_MAX_RANK)
      fail(BPK_ERR_ARGUMENT, name + " has ndim " + std::to_string(x.ndim) + "; allowed: 0 to " +
                                 std::to_string(BPK_MAX_RANK));
    if (!valid_dtype(x.dtype)) fail(BPK_ERR_ARGUMENT, name + " has an invalid dtype code " + std::to_string(x.dtype));
    for (int32_t a = 0; a < x.ndim; ++a)
      if (x.shape[a] < 0)
        fail(BPK_ERR_ARGUMENT, name + " dimension " + std::to_string(a) + " is " + std::to_string(x.shape[a]));
    if (x.ndim != int32_t(t.shape.size()))
      fail(BPK_ERR_INPUT, name + " has rank " + std::to_string(x.ndim) + " (shape " + py_tuple(x.shape, x.ndim) +
                              "); expected rank " + std::to_string(t.shape.size()) + ": " + spec_text(t));
    if (x.dtype != t.dtype)
      fail(BPK_ERR_INPUT, name + " has dtype " + dtype_name(x.dtype) + "; expected " + dtype_name(t.dtype));
    for (int32_t a = 0; a < x.ndim; ++a)
      if (t.shape[size_t(a)].is_static && t.shape[size_t(a)].size != x.shape[a])
        fail(BPK_ERR_INPUT, name + " dimension " + std::to_string(a) + " is " + std::to_string(x.shape[a]) +
                                "; it is static and must be " + std::to_string(t.shape[size_t(a)].size) + " (" +
                                spec_text(t) + ")");
  }
}

std::shared_ptr<const Model::Prepared> Model::prepared(const bpk_tensor* in) const {
  std::vector<int64_t> key;
  for (size_t i = 0; i < m_.inputs.size(); ++i) key.insert(key.end(), in[i].shape, in[i].shape + in[i].ndim);
  {
    std::shared_lock<std::shared_mutex> lock(cache_mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
  }
  std::shared_ptr<const Prepared> p = prepare(in);
  std::unique_lock<std::shared_mutex> lock(cache_mu_);
  if (cache_.size() >= kMaxShapes) cache_.clear();
  return cache_.emplace(std::move(key), std::move(p)).first->second;
}

std::shared_ptr<const Model::Prepared> Model::prepare(const bpk_tensor* in) const {
  auto p = std::make_shared<Prepared>();
  const ShapeProgram& prog = m_.shape_program;
  p->regs.assign(size_t(prog.num_registers), 0);
  std::vector<const int64_t*> dims;
  for (size_t i = 0; i < m_.inputs.size(); ++i) dims.push_back(in[i].shape);
  prog.evaluate(dims.data(), p->regs.data());
  const int64_t* r = p->regs.data();
  auto corrupt = [this](const std::string& what) { artifact_->fail("corrupt plan: " + what); };
  const NativePlan& nat = plan();

  const int64_t arena = nat.arena_bytes.resolve(r);
  if (arena < 0) corrupt("negative arena size");
  p->arena_bytes = size_t(arena);
  if (cuda_) p->cuda = cuda_->prepare(r);
  for (size_t li = 0; li < (cuda_ ? 0 : nat.launches.size()); ++li) {
    const LaunchDecl& l = nat.launches[li];
    bool skip = false;
    std::vector<Prepared::ByteCond> when;
    for (const CondDecl& c : l.when) {
      if (c.reg >= 0)
        skip = skip || (r[c.reg] != 0) != c.is;
      else
        when.push_back({c.slot, c.offset.resolve(r), c.is});
    }
    if (skip) continue;
    auto same = [&when](const Prepared::Segment& s) {
      if (s.when.size() != when.size()) return false;
      for (size_t k = 0; k < when.size(); ++k)
        if (s.when[k].slot != when[k].slot || s.when[k].offset != when[k].offset || s.when[k].is != when[k].is)
          return false;
      return true;
    };
    // a new segment where the data conditions change, or after a launch the shape conditions dropped
    if (p->segments.empty() || !same(p->segments.back()) ||
        p->launch_index.back() + 1 != int64_t(li)) {
      Prepared::Segment s;
      s.begin = s.end = p->words.size();
      s.first = p->launch_index.size();
      s.when = when;
      p->segments.push_back(std::move(s));
    }
    p->launch_index.push_back(int64_t(li));
    int64_t head[2];
    if (l.op == LaunchDecl::kKernel) {
      const KernelDecl& k = m_.kernels[size_t(l.kernel)];
      int64_t fn = -1;
      for (const auto& v : k.variants)
        if (r[v.pred]) {
          fn = v.fn;
          break;
        }
      if (fn < 0) fail(BPK_ERR_FORMAT, artifact_->source() + ": kernel " + k.name + ": no variant applies (corrupt plan)");
      head[0] = kOpKernel;
      head[1] = fn;
    } else {
      head[0] = kOpGemm;
      head[1] = l.gemm_dtype;
    }
    p->words.insert(p->words.end(), {head[0], head[1], int64_t(l.ptrs.size()), int64_t(l.ints.size())});
    for (const auto& [slot, off] : l.ptrs) {
      p->words.push_back(slot);
      p->words.push_back(off.resolve(r));  // checked against the slot's tensor in check_launches
    }
    for (const auto& v : l.ints) p->words.push_back(v.resolve(r));
    p->segments.back().end = p->words.size();
  }
  std::vector<int64_t> buf_offsets(nat.buffers.size());
  for (size_t b = 0; b < nat.buffers.size(); ++b) {
    const BufferDecl& d = nat.buffers[b];
    std::vector<int64_t> shape;
    for (const auto& s : d.shape) shape.push_back(s.resolve(r));
    size_t bytes = 0;
    const int64_t off = d.offset.resolve(r);
    if (!byte_count(shape.data(), int32_t(shape.size()), dtype_size(d.dtype), &bytes) || off < 0 ||
        uint64_t(off) > uint64_t(arena) || bytes > size_t(arena) - size_t(off))
      corrupt("arena buffer %" + std::to_string(d.id) + " (" + std::to_string(bytes) + " bytes at " +
              std::to_string(off) + ") does not fit in the " + std::to_string(arena) + "-byte arena");
    buf_offsets[b] = off;
  }
  p->copy_offset.assign(m_.outputs.size(), 0);
  for (size_t k = 0; k < m_.outputs.size(); ++k) {
    OutSpec o;
    const int64_t id = m_.outputs[k].id;
    const OutSource& src = out_source_[k];
    auto v = m_.values.find(id);
    if (src.kind == OutSource::kInput) {
      const bpk_tensor& x = in[src.index];
      o.dtype = x.dtype;
      o.ndim = x.ndim;
      std::copy(x.shape, x.shape + x.ndim, o.shape);
    } else if (src.kind == OutSource::kWeight) {
      const WeightDecl& w = m_.weights[size_t(src.index)];
      o.dtype = w.dtype;
      o.ndim = int32_t(w.shape.size());
      std::copy(w.shape.begin(), w.shape.end(), o.shape);
    } else {
      if (v == m_.values.end()) corrupt("output " + std::to_string(k) + " has no value entry");
      o.dtype = v->second.dtype;
      o.ndim = int32_t(v->second.shape.size());
      if (o.ndim > BPK_MAX_RANK) corrupt("output rank above " + std::to_string(BPK_MAX_RANK));
      for (int32_t a = 0; a < o.ndim; ++a) o.shape[a] = v->second.shape[size_t(a)].resolve(r);
      if (src.kind == OutSource::kArena) p->copy_offset[k] = buf_offsets[size_t(src.index)];
    }
    if (!byte_count(o.shape, o.ndim, dtype_size(o.dtype), &o.nbytes))
      corrupt("output " + std::to_string(k) + " has an invalid shape " + shape_list(o.shape, o.ndim));
    if (src.kind == OutSource::kArena && o.nbytes > p->arena_bytes - size_t(p->copy_offset[k]))
      corrupt("output " + std::to_string(k) + " does not fit in the arena");
    p->outs.push_back(o);
  }
  check_launches(*p, in);
  return p;
}


void Model::output_shapes(const bpk_tensor* in, int64_t n_in, bpk_tensor* out, int64_t n_out) const {
  check_inputs(in, n_in);
  if (split_)
    if (std::optional<Pieces> pc = split_.pieces(in)) return split_shapes(*pc, in, out, n_out);
  if (n_out != int64_t(m_.outputs.size()))
    fail(BPK_ERR_ARGUMENT, "expected " + std::to_string(m_.outputs.size()) + " outputs, got " + std::to_string(n_out));
  if (n_out > 0 && out == nullptr) fail(BPK_ERR_ARGUMENT, "outputs is NULL");
  auto p = prepared(in);
  for (size_t k = 0; k < p->outs.size(); ++k) {
    out[k].dtype = p->outs[k].dtype;
    out[k].ndim = p->outs[k].ndim;
    std::copy(p->outs[k].shape, p->outs[k].shape + p->outs[k].ndim, out[k].shape);
  }
}

void Model::check_outputs(const std::vector<OutSpec>& outs, const bpk_tensor* out, int64_t n) const {
  if (n != int64_t(m_.outputs.size()))
    fail(BPK_ERR_ARGUMENT, "expected " + std::to_string(m_.outputs.size()) + " outputs, got " + std::to_string(n));
  if (n > 0 && out == nullptr) fail(BPK_ERR_ARGUMENT, "outputs is NULL");
  for (size_t k = 0; k < outs.size(); ++k) {
    const bpk_tensor& o = out[k];
    if (o.data == nullptr) continue;
    const OutSpec& s = outs[k];
    const bool same = o.dtype == s.dtype && o.ndim == s.ndim && std::equal(s.shape, s.shape + s.ndim, o.shape);
    if (!same) {
      const int32_t nd = o.ndim < 0 ? 0 : std::min<int32_t>(o.ndim, BPK_MAX_RANK);
      fail(BPK_ERR_INPUT, "output buffer '" + m_.outputs[k].name + "' is " + dtype_name(o.dtype) +
                              shape_list(o.shape, nd) + "; the result is " + dtype_name(s.dtype) +
                              shape_list(s.shape, s.ndim));
    }
  }
}

Model::Arena* Model::take_arena(size_t bytes) const {
  Arena* a = nullptr;
  {
    std::lock_guard<std::mutex> lock(arena_mu_);
    if (!arenas_.empty()) {
      a = arenas_.back();
      arenas_.pop_back();
    }
  }
  if (a == nullptr) a = new Arena;
  if (a->bytes < bytes || a->data == nullptr) {
    std::free(a->data);
    a->data = alloc_aligned(bytes);
    a->bytes = a->data ? alloc_size(bytes) : 0;
    if (!a->data) {
      delete a;
      fail(BPK_ERR_MEMORY, "cannot allocate a " + std::to_string(bytes) + "-byte arena");
    }
  }
  return a;
}

void Model::give_arena(Arena* a) const {
  std::lock_guard<std::mutex> lock(arena_mu_);
  arenas_.push_back(a);
}

void Model::native_error(int64_t rc, const int64_t* status) const {
  const int64_t launch = status[0], code = status[1], value = status[2], size = status[3];
  const auto& ls = m_.native->launches;
  if (rc != 1 || launch < 0 || launch >= int64_t(ls.size()) || ls[size_t(launch)].op != LaunchDecl::kKernel)
    fail(BPK_ERR_EXECUTION, "native launch " + std::to_string(launch) + " failed (code " + std::to_string(rc) +
                                "); the artifact may be corrupt");
  index_error(m_.kernels[size_t(ls[size_t(launch)].kernel)], code, value, size);
}

void Model::run(const bpk_tensor* in, int64_t n_in, bpk_tensor* out, int64_t n_out) const {
  run(in, n_in, out, n_out, Placement{});
}

void Model::run(const bpk_tensor* in, int64_t n_in, bpk_tensor* out, int64_t n_out, const Placement& where) const {
  check_inputs(in, n_in);
  const bool placed = where.in_device || where.out_device || where.stream;
  if (split_ && !placed)
    if (std::optional<Pieces> pc = split_.pieces(in)) return run_split(*pc, in, out, n_out);
  std::shared_ptr<const Prepared> p = prepared(in);
  check_outputs(p->outs, out, n_out);
  const size_t n_inputs = m_.inputs.size(), n_outputs = m_.outputs.size();
  for (size_t i = 0; i < n_inputs; ++i) {
    size_t bytes = 0;
    byte_count(in[i].shape, in[i].ndim, dtype_size(in[i].dtype), &bytes);
    if (in[i].data == nullptr && bytes > 0) fail(BPK_ERR_ARGUMENT, "input '" + m_.inputs[i].name + "' has no data");
  }
  OwnedOutputs owned(*this, p->outs, out);
  if (cuda_) {
    run_cuda(*p, in, out, where);
    owned.keep();
    return;
  }
  const size_t n_slots = size_t(m_.num_slots());
  void* stack_slots[64];
  std::vector<void*> heap_slots;
  void** slots = stack_slots;
  if (n_slots > 64) {
    heap_slots.resize(n_slots);
    slots = heap_slots.data();
  }
  alignas(kAlign) static char empty_tensor[kAlign];  // data for zero-element inputs given as NULL
  for (size_t i = 0; i < n_inputs; ++i) slots[1 + i] = in[i].data ? in[i].data : empty_tensor;
  for (size_t k = 0; k < n_outputs; ++k) slots[1 + n_inputs + k] = m_.native->outputs[k] >= 0 ? out[k].data : nullptr;
  for (size_t w = 0; w < weight_ptrs_.size(); ++w) slots[1 + n_inputs + n_outputs + w] = const_cast<void*>(weight_ptrs_[w]);

  Arena* arena = take_arena(p->arena_bytes);
  slots[0] = arena->data;
  int64_t status[4] = {0, 0, 0, 0};
  int64_t rc = 0;
  for (const Prepared::Segment& s : p->segments) {
    bool wanted = true;  // Note [Branch predicates] (bladepack/ir/guards.py): outermost first, stop at a miss
    for (const auto& c : s.when)
      if (wanted) wanted = (*(static_cast<const uint8_t*>(slots[c.slot]) + c.offset) != 0) == c.is;
    if (!wanted || s.end == s.begin) continue;
    rc = lib_->run(p->words.data() + s.begin, int64_t(s.end - s.begin), slots, status);
    if (rc != 0) {
      const size_t at = s.first + size_t(status[0] < 0 ? 0 : status[0]);
      status[0] = at < p->launch_index.size() ? p->launch_index[at] : -1;
      break;
    }
  }
  if (rc == 0) {
    for (size_t k = 0; k < n_outputs; ++k) {  // an input, a weight or a repeated output: copy, never alias
      const OutSource& s = out_source_[k];
      const void* from = nullptr;
      switch (s.kind) {
        case OutSource::kNative:
          continue;
        case OutSource::kInput:
          from = slots[1 + size_t(s.index)];
          break;
        case OutSource::kWeight:
          from = weight_ptrs_[size_t(s.index)];
          break;
        case OutSource::kOutput:
          from = out[s.index].data;
          break;
        case OutSource::kArena:
          from = static_cast<const char*>(arena->data) + p->copy_offset[k];
          break;
      }
      if (p->outs[k].nbytes) std::memmove(out[k].data, from, p->outs[k].nbytes);
    }
  }
  give_arena(arena);
  if (rc != 0) native_error(rc, status);
  owned.keep();
}

// Note [Negative indices] (bladepack/opset/attrs.py): code 1 + 16 x site for an index that may count from
// the end, 2 + 16 x site for one that may not (torch's embedding, index_select, gather)
std::string index_error_text(const KernelDecl& k, int64_t code, int64_t value, int64_t size) {
  constexpr int64_t kErrIndexNonneg = 2;
  const int64_t site = floordiv(code - 1, 16);
  const std::string what = site >= 0 && site < int64_t(k.errors.size()) ? k.errors[size_t(site)] : "an index";
  const std::string lowest = code - 16 * site == kErrIndexNonneg ? "0" : "-" + std::to_string(size);
  return "index out of range in " + what + ": " + std::to_string(value) + " is not in [" + lowest + ", " +
         std::to_string(size - 1) + "] (kernel " + k.name + ", from " + (k.loc.empty() ? "unknown source" : k.loc) +
         ")";
}

std::string status_error_text(const std::vector<KernelDecl>& kernels, const int64_t* words) {
  constexpr int64_t kCodeBits = 24;
  static const KernelDecl kUnknown{"?", "", "", {}, {}, std::nullopt};
  const int64_t k = words[0] >> kCodeBits;
  const KernelDecl& row = k >= 0 && k < int64_t(kernels.size()) ? kernels[size_t(k)] : kUnknown;
  return index_error_text(row, words[0] & ((int64_t(1) << kCodeBits) - 1), words[1], words[2]);
}

void Model::index_error(const KernelDecl& k, int64_t code, int64_t value, int64_t size) const {
  fail(BPK_ERR_INDEX, index_error_text(k, code, value, size));
}

Model::OwnedOutputs::OwnedOutputs(const Model& m, const std::vector<OutSpec>& specs, bpk_tensor* out) : out_(out) {
  for (size_t k = 0; k < specs.size(); ++k) {
    if (out[k].data != nullptr) continue;
    const OutSpec& s = specs[k];
    out[k].data = alloc_output(s.nbytes);
    if (out[k].data == nullptr) fail(BPK_ERR_MEMORY, "cannot allocate output '" + m.m_.outputs[k].name + "'");
    owned_.push_back(k);
    out[k].dtype = s.dtype;
    out[k].ndim = s.ndim;
    std::copy(s.shape, s.shape + s.ndim, out[k].shape);
  }
}

Model::OwnedOutputs::~OwnedOutputs() {
  for (size_t k : owned_) {
    release_output(out_[k].data);
    out_[k].data = nullptr;
  }
}

}  // namespace bpk
