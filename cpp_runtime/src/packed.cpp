// Packed execution (Note [Packed sequences] in bladepack/passes/pack_sequences.py): several sequences of
// different lengths in one call, without padding — bpk_model_run_packed, as the Python loader's
// LoadedModule.run_packed (bladepack/loader/packed.py), with the same checks and the same error texts.
//
// In: the call's inputs, every ragged input holding the sequences one after the other along its
// sequence axis (its rows axis 1), and each sequence's length. Out: the packed plan's outputs, the
// sequences one after the other along their sequence axis. Each length is checked as a call of that one
// sequence would be (this model's own shape checks); the packed plan, a Model over a view of this
// artifact (Artifact::packed_view), gets each token's sequence bounds as its two extra inputs.
#include <algorithm>
#include <set>

#include "errors.h"
#include "model.h"
#include "util.h"

namespace bpk {

struct Model::Packed {
  std::unique_ptr<Model> model;
  std::vector<std::pair<int64_t, int64_t>> axes;  // per input: (rows axis, sequence axis), or (-1, -1)
  bool firsts = false;  // the plan reads each sequence's first token (outputs with a row per sequence)
  // a sequence alone is a batch of this many rows: the rows dim's least size (2 where the torch that
  // exported the model could not prove a batch of 1; the rows are proven independent), as the Python
  // loader's rows_min
  int64_t rows = 1;
};

namespace {

bool int_of(const msgpack::object& o, int64_t* v) {
  if (o.type == msgpack::type::POSITIVE_INTEGER && o.via.u64 <= uint64_t(INT64_MAX)) {
    *v = int64_t(o.via.u64);
    return true;
  }
  return false;
}

}  // namespace

const Model::Packed& Model::packed() const {
  std::lock_guard<std::mutex> lock(packed_mutex_);
  if (packed_) return *packed_;
  const msgpack::object& rec = *map_find(artifact_->manifest(), "packed");
  const msgpack::object* plan = map_find(rec, "plan");
  if (cuda_ && (plan == nullptr || plan->type != msgpack::type::MAP || map_find(*plan, "native_cuda") == nullptr ||
                map_find(*plan, "native_cuda")->type == msgpack::type::NIL))
    fail(BPK_ERR_UNSUPPORTED, "the packed form of " + artifact_->source() +
                                  " is a CPU plan (built before packed CUDA plans, or without a CUDA target): load "
                                  "the artifact on the CPU to run it packed");
  std::unique_ptr<Artifact> view = artifact_->packed_view();
  auto p = std::make_shared<Packed>();
  const msgpack::object* ins = map_find(rec, "inputs");
  if (ins == nullptr || ins->type != msgpack::type::MAP)
    artifact_->fail("malformed manifest: packed lacks its inputs");
  p->axes.assign(m_.inputs.size(), {-1, -1});
  for (uint32_t i = 0; i < ins->via.map.size; ++i) {
    const msgpack::object_kv& kv = ins->via.map.ptr[i];
    int64_t at = -1;
    for (size_t k = 0; kv.key.type == msgpack::type::STR && k < m_.inputs.size(); ++k)
      if (m_.inputs[k].name == kv.key.as<std::string>()) at = int64_t(k);
    int64_t r = -1, q = -1;
    const bool pair = kv.val.type == msgpack::type::ARRAY && kv.val.via.array.size == 2 &&
                      int_of(kv.val.via.array.ptr[0], &r) && int_of(kv.val.via.array.ptr[1], &q);
    const int64_t rank = at < 0 ? 0 : int64_t(m_.inputs[size_t(at)].shape.size());
    if (at < 0 || !pair || r < 0 || q < 0 || r >= rank || q >= rank || r == q)
      artifact_->fail("malformed manifest: packed.inputs names an input or its axes wrongly");
    p->axes[size_t(at)] = {r, q};
    const DimDecl& d = m_.inputs[size_t(at)].shape[size_t(r)];
    for (const SymbolDecl& sym : m_.symbols)
      if (!d.is_static && sym.name == d.text) p->rows = std::max(p->rows, sym.min);
  }
  const msgpack::object* firsts = map_find(rec, "firsts");
  p->firsts = firsts != nullptr && firsts->type == msgpack::type::STR;
  bpk_load_options opts{};
  opts.num_threads = num_threads_;
  opts.device = device_.c_str();  // the packed plan runs where this model does
  opts.cuda_graphs = cuda_graphs_;
  p->model = std::make_unique<Model>(std::move(view), opts);
  if (p->model->signature().num_inputs != int64_t(m_.inputs.size()) + (p->firsts ? 3 : 2))
    artifact_->fail("malformed manifest: the packed plan does not take the model's inputs and the two bounds");
  packed_ = p;
  return *packed_;
}

void Model::run_packed(const bpk_tensor* in, int64_t n_in, const int64_t* lengths, int64_t n_len, bpk_tensor* out,
                       int64_t n_out) const {
  const Packed& p = packed();
  const int64_t want = int64_t(m_.inputs.size());
  if (n_in != want) {
    std::string names;
    for (const auto& t : m_.inputs) names += (names.empty() ? "" : ", ") + py_repr(t.name);
    fail(BPK_ERR_INPUT, "run_packed takes " + std::to_string(want) + " inputs ([" + names + "]), got " +
                            std::to_string(n_in));
  }
  if (n_in > 0 && in == nullptr) fail(BPK_ERR_ARGUMENT, "inputs is NULL");
  if (n_len > 0 && lengths == nullptr) fail(BPK_ERR_ARGUMENT, "lengths is NULL");
  if (n_len <= 0) fail(BPK_ERR_INPUT, "lengths is empty: run_packed needs at least one sequence");
  int64_t total = 0;
  bool negative = false;
  for (int64_t i = 0; i < n_len; ++i) {
    negative = negative || lengths[i] < 0;
    total += lengths[i];
  }
  if (negative) {
    std::string list;
    for (int64_t i = 0; i < n_len; ++i) list += (i ? ", " : "") + std::to_string(lengths[i]);
    fail(BPK_ERR_INPUT, "lengths must be whole numbers >= 0, got [" + list + "]");
  }
  for (int64_t k = 0; k < n_in; ++k) {
    const auto [rows, seq] = p.axes[size_t(k)];
    if (rows < 0) continue;
    const bpk_tensor& x = in[k];
    const std::string name = py_repr(m_.inputs[size_t(k)].name);
    const int32_t nd = std::clamp<int32_t>(x.ndim, 0, BPK_MAX_RANK);
    if (x.ndim <= std::max(rows, seq))
      fail(BPK_ERR_INPUT, "packed input " + name + " has shape " + py_tuple(x.shape, nd) + "; it needs its rows on axis " +
                              std::to_string(rows) + " and the sequences on axis " + std::to_string(seq));
    if (x.shape[rows] != 1 || x.shape[seq] != total)
      fail(BPK_ERR_INPUT, "packed input " + name + " has shape " + py_tuple(x.shape, nd) + ": axis " +
                              std::to_string(rows) + " (the rows) must be 1 and axis " + std::to_string(seq) +
                              " the sum of the lengths, " + std::to_string(total));
  }
  // each length as a call of that one sequence would be checked (this model's checks and guards)
  std::vector<bpk_tensor> one(in, in + n_in), shapes(m_.outputs.size());
  for (int64_t n : std::set<int64_t>(lengths, lengths + n_len)) {
    for (int64_t k = 0; k < n_in; ++k)
      if (p.axes[size_t(k)].first >= 0) {
        one[size_t(k)].shape[p.axes[size_t(k)].first] = p.rows;
        one[size_t(k)].shape[p.axes[size_t(k)].second] = n;
      }
    try {
      output_shapes(one.data(), n_in, shapes.data(), int64_t(shapes.size()));
    } catch (const Error& e) {
      fail(e.status(), "a sequence of length " + std::to_string(n) + ": " + e.what());
    }
  }
  std::vector<int64_t> starts(static_cast<size_t>(total)), ends(static_cast<size_t>(total));
  std::vector<int64_t> firsts(static_cast<size_t>(n_len));
  int64_t at = 0;
  for (int64_t i = 0; i < n_len; ++i) {
    firsts[size_t(i)] = at;
    for (int64_t t = 0; t < lengths[i]; ++t, ++at) {
      starts[size_t(at)] = at - t;
      ends[size_t(at)] = at - t + lengths[i];
    }
  }
  std::vector<bpk_tensor> all(in, in + n_in);
  for (std::vector<int64_t>* v : {&starts, &ends, &firsts}) {
    if (v == &firsts && !p.firsts) break;
    bpk_tensor b{};
    b.data = v->data();
    b.dtype = BPK_INT64;
    b.ndim = 1;
    b.shape[0] = int64_t(v->size());
    all.push_back(b);
  }
  p.model->run(all.data(), int64_t(all.size()), out, n_out);
}

}  // namespace bpk
