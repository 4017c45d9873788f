// Model's CUDA half: loading the artifact's CUDA plan onto a device and running a prepared signature on
// it (call contexts, graphs, the caller's stream: native_cuda.h). The CPU half is model.cpp.
#include "model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "dtype.h"
#include "errors.h"
#include "util.h"

namespace bpk {

void Model::load_cuda(const std::string& device, int max_graphs) {
  const std::string& src = artifact_->source();
  int ordinal = 0;
  const bool digits = device.size() > 5 && device.size() < 15 &&
                      std::all_of(device.begin() + 5, device.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (device == "cuda")
    ordinal = 0;
  else if (device.rfind("cuda:", 0) == 0 && digits)
    ordinal = std::stoi(device.substr(5));
  else
    fail(BPK_ERR_ARGUMENT, "device must be 'cpu', 'cuda' or 'cuda:N', got " + py_repr(device));
  try {
    parse_cuda_plan(artifact_->manifest(), m_);
  } catch (const Error& e) {
    if (e.status() == BPK_ERR_UNSUPPORTED)
      fail(BPK_ERR_UNSUPPORTED,
           src + " has no CUDA kernels; optimize it with targets=('cpu', 'cuda') to run it on a GPU");
    fail(e.status(), src + ": " + e.what());
  }
  refuse_ref_launches(*m_.native_cuda, "CUDA");
  const NativePlan& plan = *m_.native_cuda;
  for (size_t i = 0; i < plan.launches.size(); ++i) {  // Note [Kernel operand checks]: validated at load
    const LaunchDecl& l = plan.launches[i];
    if (l.op != LaunchDecl::kKernel || !m_.cuda_kernels[size_t(l.kernel)].check) continue;
    const KernelDecl& k = m_.cuda_kernels[size_t(l.kernel)];
    try {
      k.check->validate({int32_t(l.ints.size()), int32_t(l.ptrs.size())});
    } catch (const Error& e) {
      artifact_->fail("corrupt plan: launch " + std::to_string(i) + " (kernel " + k.name +
                      "): its operand check is malformed (" + e.what() + ")");
    }
  }
  cuda_ = std::make_unique<cuda::NativeCuda>(*artifact_, m_, ordinal, max_graphs);
  executor_ = cuda_->description();
}

void Model::run_cuda(const Prepared& p, const bpk_tensor* in, bpk_tensor* out, const Placement& where) const {
  const NativePlan& nat = *m_.native_cuda;
  const cuda::Driver& drv = cuda_->driver();
  const size_t n_in = m_.inputs.size(), n_out = m_.outputs.size();
  constexpr size_t kRound = 256;
  auto round = [](size_t n) { return (n + kRound - 1) / kRound * kRound; };
  auto on_device = [](const uint8_t* flags, size_t i) { return flags != nullptr && flags[i] != 0; };
  // the call's device memory: status words | arena | inputs | the outputs the plan writes; a device
  // tensor is used in place unless the call launches a graph (Note [CUDA graphs]: staged)
  std::vector<size_t> in_bytes(n_in), at(n_in + n_out);
  size_t total = kRound;
  const size_t arena_at = total;
  total += round(p.arena_bytes);
  for (size_t i = 0; i < n_in; ++i) {
    byte_count(in[i].shape, in[i].ndim, dtype_size(in[i].dtype), &in_bytes[i]);
    at[i] = total;
    total += round(in_bytes[i]);
  }
  for (size_t k = 0; k < n_out; ++k) {
    at[n_in + k] = total;
    if (nat.outputs[k] >= 0) total += round(p.outs[k].nbytes);
  }
  auto* stream = static_cast<cuda::CUstream>(where.stream);
  cuda::NativeCuda::CallContext* c = cuda_->take(total, stream);
  struct GiveBack {
    const cuda::NativeCuda& exe;
    cuda::NativeCuda::CallContext* c;
    ~GiveBack() {  // on an error a pool stream may still hold work: wait for it before reuse
      if (!c->callers) exe.driver().StreamSynchronize(c->stream);
      exe.give(c);
    }
  } give_back{*cuda_, c};
  if (c->host_status != nullptr && c->host_status[0] != 0) {  // Note [Device errors]: an earlier call's
    const std::array<int64_t, 3> e = cuda_->take_error(*c, c->memory->ptr());
    if (e[0] != 0) raise_index_error(e, "when this call began (it did not run)");
  }
  size_t device_bytes = 0;  // Note [Graph staging cost]: what staging would copy in and out
  for (size_t i = 0; i < n_in; ++i)
    if (on_device(where.in_device, i)) device_bytes += in_bytes[i];
  for (size_t k = 0; k < n_out; ++k)
    if (on_device(where.out_device, k)) device_bytes += p.outs[k].nbytes;
  const bool graphs = cuda::NativeCuda::stage_pays(*p.cuda, device_bytes);
  const bool staged = graphs && cuda_->will_graph(p.cuda, *c);
  const cuda::CUdeviceptr base = c->memory->ptr();
  std::vector<cuda::CUdeviceptr> slots(size_t(m_.num_slots()), 0);
  slots[0] = base + arena_at;
  for (size_t i = 0; i < n_in; ++i) {
    const auto src = reinterpret_cast<cuda::CUdeviceptr>(in[i].data);
    if (on_device(where.in_device, i) && !staged) {
      slots[1 + i] = src;
      continue;
    }
    slots[1 + i] = base + at[i];
    if (in_bytes[i] == 0) continue;
    if (on_device(where.in_device, i))
      drv.check(drv.MemcpyDtoDAsync(slots[1 + i], src, in_bytes[i], c->stream), "cuMemcpyDtoDAsync");
    else
      drv.check(drv.MemcpyHtoDAsync(slots[1 + i], in[i].data, in_bytes[i], c->stream), "cuMemcpyHtoDAsync");
  }
  for (size_t k = 0; k < n_out; ++k) {
    if (nat.outputs[k] < 0) continue;
    slots[1 + n_in + k] = on_device(where.out_device, k) && !staged ? reinterpret_cast<cuda::CUdeviceptr>(out[k].data)
                                                                    : base + at[n_in + k];
  }
  const auto& w = cuda_->weight_ptrs();
  std::copy(w.begin(), w.end(), slots.begin() + int64_t(1 + n_in + n_out));
  cuda_->run(p.cuda, slots.data(), base, *c, graphs);
  if (cuda_->checks_errors() && cuda_->strict_errors()) {  // each call waits for its own
    const std::array<int64_t, 3> e = cuda_->take_error(*c, base);
    if (e[0] != 0) raise_index_error(e, "");
  }
  // each output from where the plan left it (an input, a weight or an arena value is copied, never
  // aliased) to where the caller wants it
  std::vector<cuda::CUdeviceptr> from(n_out, 0);
  bool host_out = false;
  for (size_t k = 0; k < n_out; ++k) {
    const OutSource& s = out_source_[k];
    switch (s.kind) {
      case OutSource::kNative: from[k] = slots[1 + n_in + k]; break;
      case OutSource::kInput: from[k] = slots[1 + size_t(s.index)]; break;
      case OutSource::kWeight: from[k] = w[size_t(s.index)]; break;
      case OutSource::kArena: from[k] = slots[0] + uint64_t(p.copy_offset[k]); break;
      case OutSource::kOutput: break;
    }
  }
  for (size_t k = 0; k < n_out; ++k)
    if (out_source_[k].kind == OutSource::kOutput) from[k] = from[size_t(out_source_[k].index)];
  for (size_t k = 0; k < n_out; ++k) {
    const size_t n = p.outs[k].nbytes;
    const auto dst = reinterpret_cast<cuda::CUdeviceptr>(out[k].data);
    if (n == 0) continue;
    if (!on_device(where.out_device, k)) {
      host_out = true;
      drv.check(drv.MemcpyDtoHAsync(out[k].data, from[k], n, c->stream), "cuMemcpyDtoHAsync");
    } else if (dst != from[k]) {
      drv.check(drv.MemcpyDtoDAsync(dst, from[k], n, c->stream), "cuMemcpyDtoDAsync");
    }
  }
  if (host_out || stream == nullptr) {
    drv.check(drv.StreamSynchronize(c->stream), "cuStreamSynchronize");
    if (c->host_status != nullptr && c->host_status[0] != 0) {  // the call waited: its own error
      const std::array<int64_t, 3> e = cuda_->take_error(*c, base);
      if (e[0] != 0) raise_index_error(e, "");
    }
  }
}

void Model::raise_index_error(const std::array<int64_t, 3>& e, const char* found) const {
  std::string text = status_error_text(m_.cuda_kernels, e.data());
  if (*found)
    text += "; reported by an earlier call on this stream and found " + std::string(found) +
            ": the results of the calls on this stream since its last check may be wrong "
            "(BLADEPACK_CUDA_STRICT_ERRORS=1 makes each call check its own)";
  fail(BPK_ERR_INDEX, text);
}

void Model::synchronize(void* stream) const {
  if (!cuda_) return;
  const std::array<int64_t, 3> e = cuda_->synchronize(static_cast<cuda::CUstream>(stream));
  if (e[0] != 0) raise_index_error(e, "by bpk_model_synchronize");
}

}  // namespace bpk
