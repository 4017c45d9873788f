// libbladepack_runtime's C++ interface: RAII over the C ABI in runtime.h (header-only).
//
//   bladepack::Model model = bladepack::Model::load("model.bpk");
//   std::vector<float> x(batch * 64);
//   auto outs = model.run({bladepack::Tensor::view(x.data(), {batch, 64})});
//   const float* y = outs[0].data<float>();   // outs own their memory
//
// Errors throw bladepack::Error, whose status() is the C status and what() the runtime's reason.
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "bladepack/runtime.h"

namespace bladepack {

class Error : public std::runtime_error {
 public:
  Error(bpk_status status, const char* what) : std::runtime_error(what), status_(status) {}
  bpk_status status() const { return status_; }

 private:
  bpk_status status_;
};

inline void check(bpk_status s) {
  if (s != BPK_OK) throw Error(s, bpk_last_error());
}

template <class T>
constexpr bpk_dtype dtype_of() {
  static_assert(std::is_arithmetic<T>::value, "no bpk_dtype for this type");
  if (std::is_same<T, float>::value) return BPK_FLOAT32;
  if (std::is_same<T, double>::value) return BPK_FLOAT64;
  if (std::is_same<T, int64_t>::value) return BPK_INT64;
  if (std::is_same<T, int32_t>::value) return BPK_INT32;
  if (std::is_same<T, int16_t>::value) return BPK_INT16;
  if (std::is_same<T, int8_t>::value) return BPK_INT8;
  if (std::is_same<T, uint8_t>::value) return BPK_UINT8;
  if (std::is_same<T, bool>::value) return BPK_BOOL;
  return BPK_FLOAT32;
}

// A C-contiguous tensor: a view of memory someone else owns, or memory the runtime allocated.
class Tensor {
 public:
  Tensor() { std::memset(&t_, 0, sizeof t_); }

  static Tensor view(void* data, bpk_dtype dtype, const std::vector<int64_t>& shape) {
    if (shape.size() > BPK_MAX_RANK) throw Error(BPK_ERR_ARGUMENT, "rank above BPK_MAX_RANK");
    Tensor t;
    t.t_.data = data;
    t.t_.dtype = dtype;
    t.t_.ndim = int32_t(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) t.t_.shape[i] = shape[i];
    return t;
  }
  template <class T>
  static Tensor view(T* data, const std::vector<int64_t>& shape) {
    return view(const_cast<typename std::remove_const<T>::type*>(data), dtype_of<typename std::remove_const<T>::type>(),
                shape);
  }

  void* data() const { return t_.data; }
  template <class T>
  T* data() const {
    return static_cast<T*>(t_.data);
  }
  bpk_dtype dtype() const { return bpk_dtype(t_.dtype); }
  int32_t ndim() const { return t_.ndim; }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(t_.shape, t_.shape + t_.ndim); }
  int64_t numel() const {
    int64_t n = 1;
    for (int32_t i = 0; i < t_.ndim; ++i) n *= t_.shape[i];
    return n;
  }
  size_t nbytes() const { return size_t(numel()) * bpk_dtype_size(t_.dtype); }
  bool owns_data() const { return owned_ != nullptr; }
  const bpk_tensor& raw() const { return t_; }

 private:
  friend class Model;
  struct Free {
    void operator()(void* p) const { bpk_free(p); }
  };
  bpk_tensor t_;
  std::shared_ptr<void> owned_;  // runtime-allocated data (shared by copies of this Tensor)
};

// A DLPack result of Model::run_dlpack, released (its deleter run) when destroyed.
struct DLPackDeleter {
  void operator()(DLManagedTensorVersioned* t) const {
    if (t != nullptr && t->deleter != nullptr) t->deleter(t);
  }
};
using DLPackTensor = std::unique_ptr<DLManagedTensorVersioned, DLPackDeleter>;

class Model {
 public:
  // device: "cpu", "cuda" or "cuda:N"; cuda_graphs as bpk_load_options.cuda_graphs (0: 64 per stream)
  static Model load(const std::string& path, const std::string& device, int32_t cuda_graphs = 0) {
    bpk_load_options options{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, device.c_str(), cuda_graphs, -1};
    return load(path, &options);
  }
  static Model load(const std::string& path, const bpk_load_options* options = nullptr) {
    bpk_model* m = nullptr;
    check(bpk_model_load(path.c_str(), options, &m));
    return Model(m);
  }
  static Model from_memory(const void* data, size_t size, const bpk_load_options* options = nullptr) {
    bpk_model* m = nullptr;
    check(bpk_model_load_from_memory(data, size, options, &m));
    return Model(m);
  }

  const bpk_signature& signature() const {
    const bpk_signature* s = nullptr;
    check(bpk_model_signature(m_.get(), &s));
    return *s;
  }
  std::string executor() const { return bpk_model_executor(m_.get()); }

  // Results in memory the runtime allocates (owned by the returned Tensors).
  std::vector<Tensor> run(const std::vector<Tensor>& inputs) const {
    std::vector<bpk_tensor> in = raw(inputs);
    std::vector<bpk_tensor> out(size_t(signature().num_outputs));
    for (auto& o : out) std::memset(&o, 0, sizeof o);
    check(bpk_model_run(m_.get(), in.data(), int64_t(in.size()), out.data(), int64_t(out.size())));
    std::vector<Tensor> result(out.size());
    for (size_t k = 0; k < out.size(); ++k) {
      result[k].t_ = out[k];
      result[k].owned_ = std::shared_ptr<void>(out[k].data, Tensor::Free());
    }
    return result;
  }
  // Several sequences of different lengths in one call (bpk_model_run_packed); results the runtime allocates.
  std::vector<Tensor> run_packed(const std::vector<Tensor>& inputs, const std::vector<int64_t>& lengths) const {
    std::vector<bpk_tensor> in = raw(inputs);
    std::vector<bpk_tensor> out(size_t(signature().num_outputs));
    for (auto& o : out) std::memset(&o, 0, sizeof o);
    check(bpk_model_run_packed(m_.get(), in.data(), int64_t(in.size()), lengths.data(), int64_t(lengths.size()),
                               out.data(), int64_t(out.size())));
    std::vector<Tensor> result(out.size());
    for (size_t k = 0; k < out.size(); ++k) {
      result[k].t_ = out[k];
      result[k].owned_ = std::shared_ptr<void>(out[k].data, Tensor::Free());
    }
    return result;
  }
  bool has_packed() const { return bpk_model_has_packed(m_.get()) != 0; }
  // Results written into the caller's tensors (shapes from output_shapes()).
  void run(const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) const {
    std::vector<bpk_tensor> in = raw(inputs), out = raw(outputs);
    for (const auto& o : out)
      if (o.data == nullptr) throw Error(BPK_ERR_ARGUMENT, "an output tensor has no data");
    check(bpk_model_run(m_.get(), in.data(), int64_t(in.size()), out.data(), int64_t(out.size())));
  }
  // Result shapes and dtypes (data null) for these inputs; guards are checked.
  std::vector<Tensor> output_shapes(const std::vector<Tensor>& inputs) const {
    std::vector<bpk_tensor> in = raw(inputs);
    std::vector<bpk_tensor> out(size_t(signature().num_outputs));
    for (auto& o : out) std::memset(&o, 0, sizeof o);
    check(bpk_model_output_shapes(m_.get(), in.data(), int64_t(in.size()), out.data(), int64_t(out.size())));
    std::vector<Tensor> result(out.size());
    for (size_t k = 0; k < out.size(); ++k) result[k].t_ = out[k];
    return result;
  }
  // DLPack tensors in (host, or the model's device), results allocated by the runtime on the model's
  // device; `stream`: the caller's CUstream (bpk_run_options.stream).
  std::vector<DLPackTensor> run_dlpack(const std::vector<const DLTensor*>& inputs, void* stream = nullptr) const {
    std::vector<DLManagedTensorVersioned*> out(size_t(signature().num_outputs), nullptr);
    const bpk_run_options options{0, stream};
    check(bpk_model_run_dlpack(m_.get(), inputs.data(), int64_t(inputs.size()), out.data(), int64_t(out.size()),
                               &options));
    std::vector<DLPackTensor> result;
    for (auto* t : out) result.emplace_back(t);
    return result;
  }
  // Waits for the calls on `stream` (every caller stream when nullptr) and throws the index error one of
  // them found that no later call reported (bpk_model_synchronize).
  void synchronize(void* stream = nullptr) const { check(bpk_model_synchronize(m_.get(), stream)); }
  bpk_model* handle() const { return m_.get(); }

 private:
  struct Free {
    void operator()(bpk_model* m) const { bpk_model_free(m); }
  };
  explicit Model(bpk_model* m) : m_(m, Free()) {}
  static std::vector<bpk_tensor> raw(const std::vector<Tensor>& ts) {
    std::vector<bpk_tensor> r;
    r.reserve(ts.size());
    for (const auto& t : ts) r.push_back(t.raw());
    return r;
  }
  std::shared_ptr<bpk_model> m_;
};

}  // namespace bladepack
