// The C ABI (include/bladepack/runtime.h): every entry point catches, records the reason for
// bpk_last_error() and returns a status. Nothing propagates an exception across the boundary.
#include <array>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "artifact.h"
#include "bladepack/runtime.h"
#include "dlpack.h"
#include "dtype.h"
#include "errors.h"
#include "output_blocks.h"
#include "model.h"

struct bpk_model {
  std::unique_ptr<bpk::Model> impl;
};

namespace {

// The C ABI's error channel: one message per thread, as errno is (the only thread-local state).
thread_local std::string t_last_error;

bpk_status record(bpk_status s, const char* what) {
  try {
    t_last_error = what;
  } catch (...) {
  }
  return s;
}

template <class F>
bpk_status guarded(F&& f) {
  try {
    t_last_error.clear();
    f();
    return BPK_OK;
  } catch (const bpk::Error& e) {
    return record(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return record(BPK_ERR_MEMORY, "out of memory");
  } catch (const std::exception& e) {
    return record(BPK_ERR_FORMAT, e.what());
  } catch (...) {
    return record(BPK_ERR_FORMAT, "unknown error");
  }
}

// Only the two original fields unless BPK_LOAD_TRUST / BPK_LOAD_OUT_OF_RANGE say the caller's struct has
// the others.
bpk_load_options options_or_default(const bpk_load_options* o) {
  bpk_load_options out{0, 0, nullptr, nullptr, 0, nullptr, nullptr, 0, -1};
  if (o == nullptr) return out;
  out.flags = o->flags;
  out.num_threads = o->num_threads;
  if (o->flags & BPK_LOAD_TRUST) {
    out.sha256 = o->sha256;
    out.trusted_keys = o->trusted_keys;
    out.n_trusted_keys = o->n_trusted_keys;
  }
  if (o->flags & BPK_LOAD_OUT_OF_RANGE) out.on_out_of_range = o->on_out_of_range;
  if (o->flags & BPK_LOAD_DEVICE) {
    out.device = o->device;
    out.cuda_graphs = o->cuda_graphs;
  }
  if (o->flags & BPK_LOAD_MAPPING) out.mmap = o->mmap;
  return out;
}

bpk::Trust trust_of(const bpk_load_options& o) {
  bpk::Trust t;
  if (o.sha256 != nullptr) {
    t.sha256 = o.sha256;
    if (t.sha256.empty()) bpk::fail(BPK_ERR_ARGUMENT, "sha256 is empty: give 64 hex digits or NULL");
  }
  if (o.n_trusted_keys > 0 && o.trusted_keys == nullptr) bpk::fail(BPK_ERR_ARGUMENT, "trusted_keys is NULL");
  for (size_t k = 0; k < o.n_trusted_keys; ++k) {
    std::array<uint8_t, 32> key{};
    std::memcpy(key.data(), o.trusted_keys + 32 * k, 32);
    t.keys.push_back(key);
  }
  return t;
}

}  // namespace

extern "C" {

const char* bpk_last_error(void) { return t_last_error.c_str(); }

const char* bpk_status_name(bpk_status s) {
  switch (s) {
    case BPK_OK: return "ok";
    case BPK_ERR_ARGUMENT: return "invalid argument";
    case BPK_ERR_IO: return "I/O error";
    case BPK_ERR_FORMAT: return "format error";
    case BPK_ERR_UNSUPPORTED: return "unsupported";
    case BPK_ERR_INPUT: return "input error";
    case BPK_ERR_SHAPE_GUARD: return "shape guard";
    case BPK_ERR_EXECUTION: return "execution error";
    case BPK_ERR_MEMORY: return "out of memory";
    case BPK_ERR_TRUST: return "untrusted artifact";
    case BPK_ERR_VERIFY: return "verification failed";
    case BPK_ERR_INDEX: return "bad index";
  }
  return "unknown status";
}

const char* bpk_dtype_name(int32_t dtype) { return bpk::dtype_name(dtype); }
size_t bpk_dtype_size(int32_t dtype) { return bpk::dtype_size(dtype); }

static bpk_status load(std::unique_ptr<bpk::Artifact> (*open)(const void*, size_t, bool, const bpk::Trust&, bool),
                       const void* a, size_t b, const bpk_load_options* options, bpk_model** model) {
  if (model == nullptr) return record(BPK_ERR_ARGUMENT, "model is NULL");
  *model = nullptr;
  return guarded([&] {
    const bpk_load_options o = options_or_default(options);
    if (o.flags & ~uint32_t(BPK_LOAD_SKIP_SECTION_CHECKSUMS | BPK_LOAD_TRUST | BPK_LOAD_OUT_OF_RANGE | BPK_LOAD_DEVICE |
                            BPK_LOAD_MAPPING))
      bpk::fail(BPK_ERR_ARGUMENT, "unknown load flags " + std::to_string(o.flags));
    if (o.mmap < -1 || o.mmap > 1)
      bpk::fail(BPK_ERR_ARGUMENT, "mmap must be 1 (map the file), 0 (read it privately) or -1 (the default), got " +
                                      std::to_string(o.mmap));
    const bpk::Trust trust = trust_of(o);
    if (!trust.sha256.empty() && o.mmap == 1)
      bpk::fail(BPK_ERR_ARGUMENT,
                "sha256 pins the bytes read, so a pinned load reads the file privately (mmap=False); "
                "to map a large file, sign it and load it with trusted_keys");
    // Note [Mapped or private]: a pinned or signed load reads privately unless told to map
    const bool map_file = o.mmap == -1 ? trust.sha256.empty() && trust.keys.empty() : o.mmap == 1;
    auto artifact = open(a, b, (o.flags & BPK_LOAD_SKIP_SECTION_CHECKSUMS) == 0, trust, map_file);
    auto m = std::make_unique<bpk_model>();
    m->impl = std::make_unique<bpk::Model>(std::move(artifact), o);
    *model = m.release();
  });
}

bpk_status bpk_model_load(const char* path, const bpk_load_options* options, bpk_model** model) {
  if (path == nullptr) return record(BPK_ERR_ARGUMENT, "path is NULL");
  return load(
      [](const void* p, size_t, bool verify, const bpk::Trust& t, bool map_file) {
        return bpk::Artifact::open(static_cast<const char*>(p), verify, t, map_file);
      },
      path, 0, options, model);
}

bpk_status bpk_model_load_from_memory(const void* data, size_t size, const bpk_load_options* options,
                                      bpk_model** model) {
  return load(
      [](const void* p, size_t n, bool verify, const bpk::Trust& t, bool) {
        return bpk::Artifact::copy_from(p, n, verify, t);
      },
      data, size, options, model);
}

void bpk_model_free(bpk_model* model) { delete model; }

bpk_status bpk_model_signature(const bpk_model* model, const bpk_signature** signature) {
  if (model == nullptr || signature == nullptr) return record(BPK_ERR_ARGUMENT, "model or signature is NULL");
  *signature = &model->impl->signature();
  return BPK_OK;
}

bpk_status bpk_model_padded_dims(const bpk_model* model, const bpk_padded_dim** dims, int64_t* num_dims) {
  if (model == nullptr || dims == nullptr || num_dims == nullptr) return record(BPK_ERR_ARGUMENT, "model, dims or num_dims is NULL");
  return guarded([&] {
    *dims = model->impl->padded_dims().data();
    *num_dims = model->impl->padded_dims().size();
  });
}

const char* bpk_model_executor(const bpk_model* model) { return model ? model->impl->executor().c_str() : ""; }

bpk_status bpk_model_output_shapes(const bpk_model* model, const bpk_tensor* inputs, int64_t num_inputs,
                                   bpk_tensor* outputs, int64_t num_outputs) {
  if (model == nullptr) return record(BPK_ERR_ARGUMENT, "model is NULL");
  return guarded([&] { model->impl->output_shapes(inputs, num_inputs, outputs, num_outputs); });
}

bpk_status bpk_model_run(const bpk_model* model, const bpk_tensor* inputs, int64_t num_inputs, bpk_tensor* outputs,
                         int64_t num_outputs) {
  if (model == nullptr) return record(BPK_ERR_ARGUMENT, "model is NULL");
  return guarded([&] { model->impl->run(inputs, num_inputs, outputs, num_outputs); });
}

bpk_status bpk_model_run_packed(const bpk_model* model, const bpk_tensor* inputs, int64_t num_inputs,
                                const int64_t* lengths, int64_t num_lengths, bpk_tensor* outputs, int64_t num_outputs) {
  if (model == nullptr) return record(BPK_ERR_ARGUMENT, "model is NULL");
  return guarded([&] { model->impl->run_packed(inputs, num_inputs, lengths, num_lengths, outputs, num_outputs); });
}

int bpk_model_has_packed(const bpk_model* model) { return model != nullptr && model->impl->has_packed() ? 1 : 0; }

const char* bpk_model_packed_symbol(const bpk_model* model) {
  return model != nullptr && model->impl->has_packed() ? model->impl->packed_symbol().c_str() : nullptr;
}

bpk_status bpk_model_synchronize(const bpk_model* model, void* stream) {
  if (model == nullptr) return record(BPK_ERR_ARGUMENT, "model is NULL");
  return guarded([&] { model->impl->synchronize(stream); });
}

bpk_status bpk_model_run_dlpack(const bpk_model* model, const DLTensor* const* inputs, int64_t num_inputs,
                                DLManagedTensorVersioned** outputs, int64_t num_outputs,
                                const bpk_run_options* options) {
  if (model == nullptr) return record(BPK_ERR_ARGUMENT, "model is NULL");
  return guarded([&] { bpk::run_dlpack(*model->impl, inputs, num_inputs, outputs, num_outputs, options); });
}

bpk_status bpk_model_verify(const bpk_model* model, char** report) {
  if (model == nullptr || report == nullptr) return record(BPK_ERR_ARGUMENT, "model or report is NULL");
  *report = nullptr;
  bool passed = false;
  const bpk_status s = guarded([&] {
    std::string text;
    passed = model->impl->verify(text);
    *report = static_cast<char*>(std::malloc(text.size() + 1));
    if (*report == nullptr) throw std::bad_alloc();
    std::memcpy(*report, text.c_str(), text.size() + 1);
  });
  if (s != BPK_OK || passed) return s;
  return record(BPK_ERR_VERIFY, "a reference case failed (see the report)");
}

void bpk_free(void* data) { bpk::release_output(data); }

}  // extern "C"
