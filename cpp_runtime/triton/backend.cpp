// libtriton_bladepack.so: a Triton Inference Server backend that runs .bpk artifacts on the C++
// runtime, with no Python in the server process.
//
// A model directory written by `bladepack triton-repo --backend cpp` holds config.pbtxt (backend
// "bladepack") and <version>/model.bpk. Each model instance loads the artifact once
// (bpk_model_load: memory-mapped, kernels for this CPU). Each execute merges the requests that may
// share a call and answers every request with its own rows or its own error, as the Python backend
// does (Note [Serving batches] in bladepack/serving/batching.py): merging happens only when the
// config has max_batch_size > 0 — which triton-repo writes only for a dim the compiler proved
// batch-like at axis 0 of every tensor — and only among requests whose other dims and dtypes agree,
// or differ only along a dim the artifact proves paddable with those rows (bpk_model_padded_dims):
// then each request is padded to its group's longest with the proof's pad values and gets its result
// cut to its own length, groups cut where padding would pass the "pad_budget" parameter (default 1.5
// on a GPU instance, 1 (no padding) on a CPU one: Note [Padded merging]); a
// merged call that fails is retried request by request. Input errors (count, dtype, rank, a dim out
// of range) are INVALID_ARG (HTTP 400); anything else is INTERNAL. A KIND_GPU instance on device N
// loads the artifact with device "cuda:N" (its CUDA plan, CUDA graphs per call context: Note [CUDA
// graphs] in cpp_runtime/src/native_cuda.h); tensors cross in host memory, copied to the GPU and back.
// The config's "sha256" and "trusted_keys" parameters (bladepack/serving/trust.py) are the load's trust
// (BPK_LOAD_TRUST): an instance refuses an artifact that is not the pinned file or not signed by one
// of the keys, before any of its code runs. A bad index in an input is INVALID_ARG too. A CPU instance
// of an artifact with a packed form merges requests of any lengths along its ragged dim with no padding
// (Note [Packed merging]): each row of each request one sequence of bpk_model_run_packed, cut where the
// tokens would pass the packed plan's maximum.

#include <bladepack/runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "dtypes.h"
#include "packing.h"
#include "padding.h"
#include "triton_abi.h"

namespace {

using bpk_triton::bpk_to_triton;
using bpk_triton::bytes_of;
using bpk_triton::copy_box;
using bpk_triton::element;
using bpk_triton::max_batch_size;
using bpk_triton::parse_keys;
using bpk_triton::string_parameter;
using bpk_triton::triton_to_bpk;

uint64_t now_ns() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

TRITONSERVER_Error* error(TRITONSERVER_Error_Code code, const std::string& msg) {
  return TRITONSERVER_ErrorNew(code, msg.c_str());
}

void ignore(TRITONSERVER_Error* e) {
  if (e != nullptr) TRITONSERVER_ErrorDelete(e);
}

TRITONSERVER_Error_Code code_of(bpk_status s) {
  return s == BPK_ERR_INPUT || s == BPK_ERR_SHAPE_GUARD || s == BPK_ERR_ARGUMENT || s == BPK_ERR_INDEX
             ? TRITONSERVER_ERROR_INVALID_ARG
                                                                               : TRITONSERVER_ERROR_INTERNAL;
}

struct ModelState {
  std::string path;
  int64_t max_batch_size = 0;
  std::string sha256;         // the "sha256" parameter, or empty
  std::vector<uint8_t> keys;  // the "trusted_keys" parameter: 32 bytes per key
  std::string pad_budget;     // the "pad_budget" parameter, or empty (the device's default)
};


struct InstanceState {
  bpk_model* model = nullptr;
  const bpk_signature* sig = nullptr;
  int64_t max_batch_size = 0;
  std::vector<const bpk_padded_dim*> padded;  // proven paddable with the batch's rows (merging on only)
  double pad_budget = 1.0;                    // Note [Padded merging]: the "pad_budget" parameter
  bool pack = false;                          // Note [Packed merging]: padded[0] merges packed
  int64_t pack_tokens = -1;                   // the packed plan's most tokens (-1: no limit)
  ~InstanceState() { bpk_model_free(model); }
};

// One request's inputs in signature order, in host memory (borrowed from Triton or gathered).
struct Request {
  TRITONBACKEND_Request* handle = nullptr;
  std::vector<bpk_tensor> inputs;
  std::vector<std::vector<uint8_t>> owned;
  TRITONSERVER_Error* error = nullptr;
  std::vector<bpk_tensor> outputs;  // runtime-allocated (bpk_free) or views into a merged call's
  std::vector<int64_t> offsets;     // per output, the byte offset of this request's rows (merged calls)
  std::vector<int64_t> lengths;     // per padded dim, its length here (-1: the inputs disagree)
};

TRITONSERVER_Error* read_request(const InstanceState& st, Request& req) {
  uint32_t count = 0;
  if (auto* e = TRITONBACKEND_RequestInputCount(req.handle, &count)) return e;
  const bpk_signature& sig = *st.sig;
  if (count != sig.num_inputs) {  // the loader's words: "expected 2 inputs (ids, mask), got 1"
    std::string names;
    for (int64_t k = 0; k < sig.num_inputs; ++k) names += (k ? ", " : "") + std::string(sig.inputs[k].name);
    return error(TRITONSERVER_ERROR_INVALID_ARG, "expected " + std::to_string(sig.num_inputs) + " inputs (" + names +
                                                     "), got " + std::to_string(count));
  }
  req.inputs.assign(static_cast<size_t>(sig.num_inputs), bpk_tensor{});
  req.owned.resize(static_cast<size_t>(sig.num_inputs));
  std::vector<bool> seen(static_cast<size_t>(sig.num_inputs), false);
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Input* in = nullptr;
    if (auto* e = TRITONBACKEND_RequestInputByIndex(req.handle, i, &in)) return e;
    const char* name = nullptr;
    TRITONSERVER_DataType dt;
    const int64_t* shape = nullptr;
    uint32_t ndim = 0, buffers = 0;
    uint64_t byte_size = 0;
    if (auto* e = TRITONBACKEND_InputProperties(in, &name, &dt, &shape, &ndim, &byte_size, &buffers)) return e;
    int64_t k = 0;
    while (k < sig.num_inputs && std::strcmp(sig.inputs[k].name, name) != 0) ++k;
    if (k == sig.num_inputs) return error(TRITONSERVER_ERROR_INVALID_ARG, std::string("unknown input '") + name + "'");
    if (ndim > BPK_MAX_RANK) return error(TRITONSERVER_ERROR_INVALID_ARG, std::string("input '") + name + "': rank too large");
    bpk_tensor& t = req.inputs[static_cast<size_t>(k)];
    t.ndim = static_cast<int32_t>(ndim);
    t.dtype = triton_to_bpk(dt);
    for (uint32_t d = 0; d < ndim; ++d) t.shape[d] = shape[d];
    seen[static_cast<size_t>(k)] = true;
    if (t.dtype < 0) return error(TRITONSERVER_ERROR_INVALID_ARG, std::string("input '") + name + "': unsupported datatype");
    std::vector<uint8_t>& owned = req.owned[static_cast<size_t>(k)];
    for (uint32_t b = 0; b < buffers; ++b) {
      const void* data = nullptr;
      uint64_t size = 0;
      TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
      int64_t mem_id = 0;
      if (auto* e = TRITONBACKEND_InputBuffer(in, b, &data, &size, &mem, &mem_id)) return e;
      if (mem == TRITONSERVER_MEMORY_GPU)
        return error(TRITONSERVER_ERROR_UNSUPPORTED, std::string("input '") + name + "' is in GPU memory; this backend takes inputs in CPU memory");
      if (buffers == 1) {
        t.data = const_cast<void*>(data);
      } else {
        owned.insert(owned.end(), static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + size);
      }
    }
    if (buffers != 1) t.data = owned.data();
    if (bytes_of(t) != byte_size)
      return error(TRITONSERVER_ERROR_INVALID_ARG, std::string("input '") + name + "': its bytes do not fill its shape");
  }
  return nullptr;
}

// Runs `inputs` and leaves the runtime-allocated outputs in `outs` (nullptr: success).
TRITONSERVER_Error* run(const InstanceState& st, const std::vector<bpk_tensor>& inputs, std::vector<bpk_tensor>& outs) {
  outs.assign(static_cast<size_t>(st.sig->num_outputs), bpk_tensor{});
  bpk_status s = bpk_model_run(st.model, inputs.data(), static_cast<int64_t>(inputs.size()), outs.data(),
                               static_cast<int64_t>(outs.size()));
  if (s != BPK_OK) {
    std::string msg = bpk_last_error();
    for (auto& o : outs) bpk_free(o.data);
    outs.clear();
    return error(code_of(s), msg);
  }
  return nullptr;
}

// The key requests must share to merge: every dim but the first and the padded ones, and the dtypes
// ("" : never merge).
std::string merge_key(const InstanceState& st, Request& r) {
  r.lengths.assign(st.padded.size(), -1);
  for (size_t d = 0; d < st.padded.size(); ++d) {
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      const int32_t ax = st.padded[d]->input_axes[i];
      if (ax < 0) continue;
      if (ax >= r.inputs[i].ndim) return "";
      const int64_t n = r.inputs[i].shape[ax];
      if (r.lengths[d] >= 0 && r.lengths[d] != n) return "";
      r.lengths[d] = n;
    }
    if (r.lengths[d] < 0) return "";
    for (int64_t k = 0; k < st.sig->num_symbols; ++k)  // above the range: alone, its own call says why
      if (std::strcmp(st.sig->symbols[k].name, st.padded[d]->name) == 0 && st.sig->symbols[k].max >= 0 &&
          r.lengths[d] > st.sig->symbols[k].max)
        return "";
  }
  std::string key;
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    const auto& t = r.inputs[i];
    if (t.ndim == 0 || t.shape[0] != r.inputs[0].shape[0]) return "";
    key += std::to_string(t.dtype) + ":" + std::to_string(t.ndim) + ":";
    for (int d = 1; d < t.ndim; ++d) {
      bool free = false;
      for (const auto* p : st.padded) free = free || p->input_axes[i] == d;
      key += (free ? std::string("*") : std::to_string(t.shape[d])) + ",";
    }
    key += ";";
  }
  return key;
}

int64_t product(const std::vector<int64_t>& lengths) {
  int64_t n = 1;
  for (int64_t x : lengths) n *= std::max<int64_t>(x, 1);
  return n;
}

// The group cut into parts, shortest first, each within the padding budget and the batch maximum
// (Note [Padded merging] in bladepack/serving/batching.py; the same cuts as the Python backend).
std::vector<std::vector<Request*>> within_budget(std::vector<Request*> group, int64_t top, double budget) {
  std::stable_sort(group.begin(), group.end(), [](const Request* a, const Request* b) { return a->lengths < b->lengths; });
  std::vector<std::vector<Request*>> parts;
  std::vector<Request*> part;
  int64_t real = 0, rows = 0;
  std::vector<int64_t> longest;
  for (Request* r : group) {
    const int64_t n = r->inputs[0].shape[0];
    std::vector<int64_t> grown = r->lengths;
    if (!part.empty())
      for (size_t d = 0; d < grown.size(); ++d) grown[d] = std::max(grown[d], longest[d]);
    const bool over = top > 0 && rows + n > top;
    if (!part.empty() && (over || double((rows + n) * product(grown)) > budget * double(real + n * product(r->lengths)))) {
      parts.push_back(std::move(part));
      part.clear();
      real = rows = 0;
      grown = r->lengths;
    }
    part.push_back(r);
    real += n * product(r->lengths);
    rows += n;
    longest = grown;
  }
  if (!part.empty()) parts.push_back(std::move(part));
  return parts;
}

void send(TRITONBACKEND_ModelInstance* instance, const InstanceState& st, Request& r, const std::vector<bpk_tensor>& outs,
          const std::vector<int64_t>& row_offsets, int64_t rows, uint64_t t0, uint64_t t1, uint64_t t2) {
  TRITONBACKEND_Response* resp = nullptr;
  TRITONSERVER_Error* e = TRITONBACKEND_ResponseNew(&resp, r.handle);
  if (e == nullptr && r.error == nullptr) {
    for (size_t k = 0; k < outs.size() && e == nullptr; ++k) {
      bpk_tensor view = outs[k];
      if (rows >= 0) view.shape[0] = rows;  // this request's rows of a merged call
      TRITONBACKEND_Output* out = nullptr;
      e = TRITONBACKEND_ResponseOutput(resp, &out, st.sig->outputs[k].name, bpk_to_triton(view.dtype), view.shape,
                                       static_cast<uint32_t>(view.ndim));
      if (e != nullptr) break;
      void* buf = nullptr;
      TRITONSERVER_MemoryType mem = TRITONSERVER_MEMORY_CPU;
      int64_t mem_id = 0;
      size_t n = bytes_of(view);
      e = TRITONBACKEND_OutputBuffer(out, &buf, n, &mem, &mem_id);
      if (e == nullptr && mem == TRITONSERVER_MEMORY_GPU) e = error(TRITONSERVER_ERROR_INTERNAL, "output buffer in GPU memory");
      if (e == nullptr && n > 0) std::memcpy(buf, static_cast<uint8_t*>(outs[k].data) + row_offsets[k], n);
    }
  }
  TRITONSERVER_Error* outcome = r.error != nullptr ? r.error : e;
  uint64_t t3 = now_ns();
  ignore(TRITONBACKEND_ModelInstanceReportStatistics(instance, r.handle, outcome == nullptr, t0, t1, t2, t3));
  if (resp != nullptr) ignore(TRITONBACKEND_ResponseSend(resp, kTritonResponseCompleteFinal, outcome));
  ignore(r.error);  // the sender keeps ownership of the error it sent
  ignore(e);
  r.error = nullptr;
  ignore(TRITONBACKEND_RequestRelease(r.handle, kTritonRequestReleaseAll));
}

void run_alone(TRITONBACKEND_ModelInstance* instance, const InstanceState& st, Request& r, uint64_t t0) {
  std::vector<bpk_tensor> outs;
  uint64_t t1 = now_ns();
  if (r.error == nullptr) r.error = run(st, r.inputs, outs);
  uint64_t t2 = now_ns();
  if (r.error == nullptr) ignore(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, 1, t0, t1, t2, now_ns()));
  send(instance, st, r, outs, std::vector<int64_t>(outs.size(), 0), -1, t0, t1, t2);
  for (auto& o : outs) bpk_free(o.data);
}


// One call for the group (each request padded to the group's longest along the padded dims), each
// request answered with its rows cut to its own lengths; any failure runs them alone.
void run_part(TRITONBACKEND_ModelInstance* instance, const InstanceState& st, std::vector<Request*>& group, uint64_t t0) {
  if (group.size() == 1) {
    run_alone(instance, st, *group[0], t0);
    return;
  }
  int64_t total = 0;
  std::vector<int64_t> longest(st.padded.size(), 0);
  for (auto* r : group) {
    total += r->inputs[0].shape[0];
    for (size_t d = 0; d < longest.size(); ++d) longest[d] = std::max(longest[d], r->lengths[d]);
  }
  std::vector<std::vector<uint8_t>> merged(group[0]->inputs.size());
  std::vector<bpk_tensor> inputs = group[0]->inputs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    bpk_tensor& t = inputs[i];
    const size_t elem = bpk_dtype_size(t.dtype);
    t.shape[0] = total;
    const double* pad = nullptr;
    for (size_t d = 0; d < st.padded.size(); ++d) {
      const int32_t ax = st.padded[d]->input_axes[i];
      if (ax < 0) continue;
      t.shape[ax] = longest[d];
      if (pad == nullptr) pad = &st.padded[d]->input_pads[i];
    }
    merged[i].resize(bytes_of(t));
    const size_t row_bytes = total > 0 ? merged[i].size() / size_t(total) : 0;
    bool padding = false;
    for (auto* r : group)
      for (int d = 1; d < t.ndim; ++d) padding = padding || r->inputs[i].shape[d] != t.shape[d];
    if (padding) {
      const std::vector<uint8_t> value = element(t.dtype, *pad);
      for (size_t at = 0; at + elem <= merged[i].size(); at += elem) std::memcpy(merged[i].data() + at, value.data(), elem);
    }
    size_t offset = 0;
    for (auto* r : group) {
      const bpk_tensor& x = r->inputs[i];
      int64_t to[BPK_MAX_RANK];
      std::copy(t.shape, t.shape + t.ndim, to);
      to[0] = x.shape[0];
      copy_box(static_cast<const uint8_t*>(x.data), x.shape, merged[i].data() + offset, to, x.shape, t.ndim, elem);
      offset += size_t(x.shape[0]) * row_bytes;
    }
    t.data = merged[i].data();
  }
  std::vector<bpk_tensor> outs;
  uint64_t t1 = now_ns();
  TRITONSERVER_Error* e = run(st, inputs, outs);
  uint64_t t2 = now_ns();
  bool rows_first = e == nullptr;
  for (const auto& o : outs) rows_first = rows_first && o.ndim > 0 && o.shape[0] == total;
  if (!rows_first) {  // one request's error must reach only that request; outputs without the rows
    ignore(e);        // first (a config edited by hand) cannot be cut into requests
    for (auto& o : outs) bpk_free(o.data);
    for (auto* r : group) run_alone(instance, st, *r, t0);
    return;
  }
  ignore(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, static_cast<uint64_t>(total), t0, t1, t2, now_ns()));
  std::vector<size_t> row_bytes(outs.size());
  for (size_t k = 0; k < outs.size(); ++k) row_bytes[k] = bytes_of(outs[k]) / size_t(total);
  int64_t row = 0;
  for (auto* r : group) {
    const int64_t n = r->inputs[0].shape[0];
    std::vector<bpk_tensor> views(outs.size());
    std::vector<std::vector<uint8_t>> cut(outs.size());
    for (size_t k = 0; k < outs.size(); ++k) {
      bpk_tensor v = outs[k];
      v.shape[0] = n;
      v.data = static_cast<uint8_t*>(outs[k].data) + size_t(row) * row_bytes[k];
      int64_t box[BPK_MAX_RANK];
      std::copy(v.shape, v.shape + v.ndim, box);
      bool trimmed = false;
      for (size_t d = 0; d < st.padded.size(); ++d)
        for (int ax = 1; ax < v.ndim; ++ax)
          if ((st.padded[d]->output_axes[k] >> ax) & 1u) {
            box[ax] = r->lengths[d];
            trimmed = trimmed || box[ax] != v.shape[ax];
          }
      if (trimmed) {
        bpk_tensor c = v;
        std::copy(box, box + v.ndim, c.shape);
        cut[k].resize(bytes_of(c));
        copy_box(static_cast<const uint8_t*>(v.data), v.shape, cut[k].data(), box, box, v.ndim, bpk_dtype_size(v.dtype));
        c.data = cut[k].data();
        v = c;
      }
      views[k] = v;
    }
    send(instance, st, *r, views, std::vector<int64_t>(outs.size(), 0), -1, t0, t1, t2);
    row += n;
  }
  for (auto& o : outs) bpk_free(o.data);
}

// Note [Packed merging]: one packed call for the group, every row a sequence, each request answered
// with its tokens' rows (and its sequences' rows of an output with one row per sequence); any failure
// runs them alone.
void run_packed_part(TRITONBACKEND_ModelInstance* instance, const InstanceState& st, std::vector<Request*>& group,
                     uint64_t t0) {
  if (group.size() == 1) {
    run_alone(instance, st, *group[0], t0);
    return;
  }
  std::vector<const std::vector<bpk_tensor>*> ins;
  std::vector<int64_t> lengths;
  for (auto* r : group) {
    ins.push_back(&r->inputs);
    lengths.push_back(r->lengths[0]);
  }
  const bpk_triton::PackedInputs pk = bpk_triton::pack(ins, lengths);
  std::vector<bpk_tensor> outs(static_cast<size_t>(st.sig->num_outputs), bpk_tensor{});
  uint64_t t1 = now_ns();
  const bpk_status s = bpk_model_run_packed(st.model, pk.inputs.data(), int64_t(pk.inputs.size()), pk.lengths.data(),
                                            int64_t(pk.lengths.size()), outs.data(), int64_t(outs.size()));
  uint64_t t2 = now_ns();
  if (s != BPK_OK) {  // one request's error must reach only that request
    for (auto& o : outs) bpk_free(o.data);
    for (auto* r : group) run_alone(instance, st, *r, t0);
    return;
  }
  ignore(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, uint64_t(pk.lengths.size()), t0, t1, t2, now_ns()));
  int64_t token_at = 0, seq_at = 0;
  for (auto* r : group) {
    const int64_t n = r->inputs[0].shape[0], len = r->lengths[0];
    std::vector<bpk_tensor> views(outs.size());
    for (size_t k = 0; k < outs.size(); ++k)
      views[k] = bpk_triton::part(outs[k], (st.padded[0]->output_axes[k] >> 1) & 1u, n, len, token_at, seq_at);
    send(instance, st, *r, views, std::vector<int64_t>(outs.size(), 0), -1, t0, t1, t2);
    token_at += n * len;
    seq_at += n;
  }
  for (auto& o : outs) bpk_free(o.data);
}

void run_group(TRITONBACKEND_ModelInstance* instance, const InstanceState& st, std::vector<Request*>& group, uint64_t t0) {
  if (!st.pack) {
    for (auto& part : within_budget(group, st.max_batch_size, st.pad_budget)) run_part(instance, st, part, t0);
    return;
  }
  std::vector<Request*> part;
  int64_t tokens = 0;
  for (auto* r : group) {  // cut where the tokens would pass the packed plan's maximum
    const int64_t size = r->inputs[0].shape[0] * r->lengths[0];
    if (!part.empty() && st.pack_tokens >= 0 && tokens + size > st.pack_tokens) {
      run_packed_part(instance, st, part, t0);
      part.clear();
      tokens = 0;
    }
    part.push_back(r);
    tokens += size;
  }
  if (!part.empty()) run_packed_part(instance, st, part, t0);
}


}  // namespace

extern "C" {

__attribute__((visibility("default"))) TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) {
  uint32_t major = 0, minor = 0;
  if (auto* e = TRITONBACKEND_ApiVersion(&major, &minor)) return e;
  if (major != kTritonBackendApiMajor)
    return error(TRITONSERVER_ERROR_UNSUPPORTED, "built for Triton backend API 1.x, the server has " +
                                                     std::to_string(major) + "." + std::to_string(minor));
  return nullptr;
}

__attribute__((visibility("default"))) TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  TRITONBACKEND_ArtifactType type;
  const char* location = nullptr;
  uint64_t version = 0;
  if (auto* e = TRITONBACKEND_ModelRepository(model, &type, &location)) return e;
  if (auto* e = TRITONBACKEND_ModelVersion(model, &version)) return e;
  TRITONSERVER_Message* config = nullptr;
  if (auto* e = TRITONBACKEND_ModelConfig(model, 1, &config)) return e;
  const char* base = nullptr;
  size_t size = 0;
  TRITONSERVER_Error* e = TRITONSERVER_MessageSerializeToJson(config, &base, &size);
  auto state = std::make_unique<ModelState>();
  std::string keys;
  if (e == nullptr) {
    const std::string json(base, size);
    state->max_batch_size = max_batch_size(json);
    state->sha256 = string_parameter(json, "sha256");
    keys = string_parameter(json, "trusted_keys");
    state->pad_budget = string_parameter(json, "pad_budget");
  }
  TRITONSERVER_MessageDelete(config);
  if (e != nullptr) return e;
  if (!parse_keys(keys, &state->keys))
    return error(TRITONSERVER_ERROR_INVALID_ARG,
                 "the config's trusted_keys parameter must list Ed25519 public keys as 64 hex digits, "
                 "comma-separated; got '" + keys + "'");
  state->path = std::string(location) + "/" + std::to_string(version) + "/model.bpk";
  if (auto* e2 = TRITONBACKEND_ModelSetState(model, state.get())) return e2;
  state.release();
  return nullptr;
}

__attribute__((visibility("default"))) TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  void* state = nullptr;
  if (auto* e = TRITONBACKEND_ModelState(model, &state)) return e;
  delete static_cast<ModelState*>(state);
  return nullptr;
}

__attribute__((visibility("default"))) TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(
    TRITONBACKEND_ModelInstance* instance) {
  TRITONSERVER_InstanceGroupKind kind;
  if (auto* e = TRITONBACKEND_ModelInstanceKind(instance, &kind)) return e;
  std::string device = "cpu";
  if (kind == TRITONSERVER_INSTANCEGROUPKIND_GPU) {
    int32_t id = 0;
    if (auto* e = TRITONBACKEND_ModelInstanceDeviceId(instance, &id)) return e;
    device = "cuda:" + std::to_string(id);
  }
  TRITONBACKEND_Model* model = nullptr;
  void* ms = nullptr;
  if (auto* e = TRITONBACKEND_ModelInstanceModel(instance, &model)) return e;
  if (auto* e = TRITONBACKEND_ModelState(model, &ms)) return e;
  auto state = std::make_unique<InstanceState>();
  const auto* mstate = static_cast<ModelState*>(ms);
  state->max_batch_size = mstate->max_batch_size;
  state->pad_budget = kind == TRITONSERVER_INSTANCEGROUPKIND_GPU ? 1.5 : 1.0;  // Note [Padded merging]
  if (!mstate->pad_budget.empty()) {
    char* end = nullptr;
    state->pad_budget = std::strtod(mstate->pad_budget.c_str(), &end);
    if (end == mstate->pad_budget.c_str() || *end != '\0' || !(state->pad_budget >= 1.0))
      return error(TRITONSERVER_ERROR_INVALID_ARG,
                   "the config's pad_budget parameter must be a number of at least 1; got '" + mstate->pad_budget + "'");
  }
  bpk_load_options options{BPK_LOAD_DEVICE | BPK_LOAD_TRUST,
                           0,
                           mstate->sha256.empty() ? nullptr : mstate->sha256.c_str(),
                           mstate->keys.empty() ? nullptr : mstate->keys.data(),
                           mstate->keys.size() / 32,
                           nullptr,
                           device.c_str(),
                           0,
                           -1};
  bpk_status s = bpk_model_load(mstate->path.c_str(), &options, &state->model);
  if (s != BPK_OK)
    return error(s == BPK_ERR_UNSUPPORTED ? TRITONSERVER_ERROR_UNSUPPORTED : TRITONSERVER_ERROR_INVALID_ARG,
                 mstate->path + ": " + bpk_last_error());
  if (bpk_model_signature(state->model, &state->sig) != BPK_OK)
    return error(TRITONSERVER_ERROR_INTERNAL, bpk_last_error());
  const bpk_padded_dim* dims = nullptr;
  int64_t num_dims = 0;
  if (state->max_batch_size > 0) {
    if (bpk_model_padded_dims(state->model, &dims, &num_dims) != BPK_OK)
      return error(TRITONSERVER_ERROR_INVALID_ARG, bpk_last_error());
    for (int64_t k = 0; k < num_dims; ++k) {  // padded along the rows the server merges (axis 0)
      bool rows = dims[k].rows != nullptr;
      for (int64_t i = 0; rows && i < state->sig->num_inputs; ++i) {
        const bpk_tensor_spec& t = state->sig->inputs[i];
        rows = t.ndim > 0 && std::strcmp(t.dim_exprs[0], dims[k].rows) == 0 && dims[k].input_axes[i] != 0;
      }
      if (rows) state->padded.push_back(&dims[k]);
    }
    for (const auto* d : state->padded)  // Note [Packed merging]: a CPU instance packs instead of padding
      if (kind != TRITONSERVER_INSTANCEGROUPKIND_GPU && bpk_triton::packs(state->model, *state->sig, *d, &state->pack_tokens)) {
        state->padded = {d};
        state->pack = true;
        break;
      }
  }
  if (auto* e = TRITONBACKEND_ModelInstanceSetState(instance, state.get())) return e;
  state.release();
  return nullptr;
}

__attribute__((visibility("default"))) TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(
    TRITONBACKEND_ModelInstance* instance) {
  void* state = nullptr;
  if (auto* e = TRITONBACKEND_ModelInstanceState(instance, &state)) return e;
  delete static_cast<InstanceState*>(state);
  return nullptr;
}

__attribute__((visibility("default"))) TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(
    TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests, const uint32_t count) {
  uint64_t t0 = now_ns();
  void* vs = nullptr;
  if (auto* e = TRITONBACKEND_ModelInstanceState(instance, &vs)) return e;
  const auto& st = *static_cast<InstanceState*>(vs);
  std::vector<Request> reqs(count);
  std::map<std::string, std::vector<Request*>> groups;
  std::vector<Request*> alone;
  for (uint32_t i = 0; i < count; ++i) {
    reqs[i].handle = requests[i];
    reqs[i].error = read_request(st, reqs[i]);
    std::string key = reqs[i].error == nullptr && st.max_batch_size > 0 ? merge_key(st, reqs[i]) : "";
    if (key.empty()) {
      alone.push_back(&reqs[i]);
    } else {
      groups[key].push_back(&reqs[i]);
    }
  }
  for (auto* r : alone) run_alone(instance, st, *r, t0);
  for (auto& [key, group] : groups) run_group(instance, st, group, t0);
  return nullptr;
}

}  // extern "C"
