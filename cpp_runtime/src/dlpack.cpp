#include "dlpack.h"

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dtype.h"
#include "errors.h"
#include "output_blocks.h"
#include "util.h"

namespace bpk {
namespace {

// bpk_dtype -> DLPack (code, bits); lanes are 1
constexpr DLDataType kDL[] = {
    {kDLFloat, 32, 1}, {kDLFloat, 64, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLInt, 64, 1},
    {kDLInt, 32, 1},   {kDLInt, 16, 1},   {kDLInt, 8, 1},    {kDLUInt, 8, 1},    {kDLBool, 8, 1},
};

std::string dl_text(DLDataType t) {
  return "DLPack dtype (code " + std::to_string(t.code) + ", bits " + std::to_string(t.bits) + ", lanes " +
         std::to_string(t.lanes) + ")";
}

int32_t from_dl(DLDataType t, const std::string& what) {
  for (int32_t d = 0; d < kNumDTypes; ++d)
    if (kDL[d].code == t.code && kDL[d].bits == t.bits && kDL[d].lanes == t.lanes) return d;
  fail(BPK_ERR_INPUT, what + " has " + dl_text(t) +
                          ", which is no bpk_dtype (float32/64/16, bfloat16, int64/32/16/8, uint8, bool)");
}

std::string device_text(DLDevice d) {
  if (d.device_type == kDLCPU || d.device_type == kDLCUDAHost) return "cpu";
  if (d.device_type == kDLCUDA || d.device_type == kDLCUDAManaged) return "cuda:" + std::to_string(d.device_id);
  return "DLPack device type " + std::to_string(int(d.device_type));
}

// `t` as a bpk_tensor; *on_device set for memory of the model's device. BPK_ERR_INPUT for another
// device, a rank above BPK_MAX_RANK, a non-contiguous layout or an unknown dtype.
bpk_tensor from_dlpack(const Model& m, const DLTensor& t, const std::string& what, uint8_t* on_device) {
  const int ordinal = m.device_ordinal();
  const bool host = t.device.device_type == kDLCPU || t.device.device_type == kDLCUDAHost;
  const bool cuda = t.device.device_type == kDLCUDA || t.device.device_type == kDLCUDAManaged;
  const std::string runs = ordinal < 0 ? std::string("cpu") : "cuda:" + std::to_string(ordinal);
  if (!host && !(cuda && ordinal >= 0 && t.device.device_id == ordinal))
    fail(BPK_ERR_INPUT, what + " is on " + device_text(t.device) + "; this model runs on " + runs);
  *on_device = cuda ? 1 : 0;
  if (t.ndim < 0 || t.ndim > BPK_MAX_RANK)
    fail(BPK_ERR_INPUT, what + " has rank " + std::to_string(t.ndim) + "; allowed: 0 to " + std::to_string(BPK_MAX_RANK));
  if (t.ndim > 0 && t.shape == nullptr) fail(BPK_ERR_ARGUMENT, what + " has no shape array");
  bpk_tensor out;
  std::memset(&out, 0, sizeof out);
  out.ndim = t.ndim;
  out.dtype = from_dl(t.dtype, what);
  int64_t expect = 1;
  for (int32_t a = t.ndim - 1; a >= 0; --a) {
    out.shape[a] = t.shape[a];
    if (t.strides != nullptr && t.shape[a] != 1 && t.strides[a] != expect) {
      std::string strides;
      for (int32_t b = 0; b < t.ndim; ++b) strides += (b ? ", " : "") + std::to_string(t.strides[b]);
      fail(BPK_ERR_INPUT, what + " is not contiguous (strides [" + strides + "]); pass a C-contiguous tensor");
    }
    expect *= t.shape[a] < 1 ? 1 : t.shape[a];
  }
  out.data = t.data == nullptr ? nullptr : static_cast<char*>(t.data) + t.byte_offset;
  return out;
}

// Note [Owned outputs]: one allocation holds the managed tensor, its shape and the memory's owner.
struct Owned {
  DLManagedTensorVersioned managed{};
  int64_t shape[BPK_MAX_RANK] = {};
  std::shared_ptr<void> memory;  // device memory (its driver and context) or host memory
};

void release(DLManagedTensorVersioned* self) {
  delete static_cast<Owned*>(self->manager_ctx);
}

}  // namespace

void run_dlpack(const Model& m, const DLTensor* const* in, int64_t n_in, DLManagedTensorVersioned** out,
                int64_t n_out, const bpk_run_options* options) {
  if (options != nullptr && options->flags != 0)
    fail(BPK_ERR_ARGUMENT, "unknown run flags " + std::to_string(options->flags));
  const bpk_signature& sig = m.signature();
  if (n_in != sig.num_inputs)
    fail(BPK_ERR_INPUT, "expected " + std::to_string(sig.num_inputs) + " inputs, got " + std::to_string(n_in));
  if (n_out != sig.num_outputs)
    fail(BPK_ERR_ARGUMENT, "expected " + std::to_string(sig.num_outputs) + " outputs, got " + std::to_string(n_out));
  if ((n_in > 0 && in == nullptr) || (n_out > 0 && out == nullptr)) fail(BPK_ERR_ARGUMENT, "inputs or outputs is NULL");
  std::vector<bpk_tensor> ins(static_cast<size_t>(n_in)), outs(static_cast<size_t>(n_out));
  std::vector<uint8_t> in_dev(size_t(n_in) + 1, 0), out_dev(size_t(n_out) + 1, 0);
  for (int64_t i = 0; i < n_in; ++i) {
    if (in[i] == nullptr) fail(BPK_ERR_ARGUMENT, "input " + std::to_string(i) + " is NULL");
    ins[size_t(i)] = from_dlpack(m, *in[i], "input '" + std::string(sig.inputs[i].name) + "'", &in_dev[size_t(i)]);
  }
  m.output_shapes(ins.data(), n_in, outs.data(), n_out);  // every input check and shape guard first
  std::vector<std::unique_ptr<Owned>> made(static_cast<size_t>(n_out));
  for (int64_t k = 0; k < n_out; ++k) {
    bpk_tensor& o = outs[size_t(k)];
    const std::string what = "output buffer '" + std::string(sig.outputs[k].name) + "'";
    if (out[k] != nullptr) {  // the caller's: checked against the result by the run
      const bpk_tensor spec = o;
      o = from_dlpack(m, out[k]->dl_tensor, what, &out_dev[size_t(k)]);
      if (o.data == nullptr && spec.ndim >= 0) {
        size_t n = 0;
        byte_count(spec.shape, spec.ndim, dtype_size(spec.dtype), &n);
        if (n) fail(BPK_ERR_ARGUMENT, what + " has no data");
      }
      continue;
    }
    size_t bytes = 0;
    byte_count(o.shape, o.ndim, dtype_size(o.dtype), &bytes);
    auto owned = std::make_unique<Owned>();
    if (const cuda::NativeCuda* c = m.cuda()) {
      std::shared_ptr<cuda::DeviceBuffer> buf = c->alloc_owned(bytes);
      o.data = reinterpret_cast<void*>(buf->ptr());
      owned->memory = std::move(buf);
      out_dev[size_t(k)] = 1;
    } else {
      void* p = alloc_output(bytes);
      if (p == nullptr) fail(BPK_ERR_MEMORY, "cannot allocate output '" + std::string(sig.outputs[k].name) + "'");
      owned->memory = std::shared_ptr<void>(p, release_output);
      o.data = p;
    }
    std::copy(o.shape, o.shape + o.ndim, owned->shape);
    DLManagedTensorVersioned& t = owned->managed;
    t.version = {DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    t.manager_ctx = owned.get();
    t.deleter = release;
    t.flags = 0;
    t.dl_tensor.data = o.data;
    t.dl_tensor.device = m.cuda() ? DLDevice{kDLCUDA, m.device_ordinal()} : DLDevice{kDLCPU, 0};
    t.dl_tensor.ndim = o.ndim;
    t.dl_tensor.dtype = kDL[o.dtype];
    t.dl_tensor.shape = owned->shape;
    t.dl_tensor.strides = nullptr;
    t.dl_tensor.byte_offset = 0;
    made[size_t(k)] = std::move(owned);
  }
  Model::Placement where;
  where.in_device = in_dev.data();
  where.out_device = out_dev.data();
  where.stream = options ? options->stream : nullptr;
  if (m.device_ordinal() < 0) where = Model::Placement{};  // a CPU model: everything is host memory
  m.run(ins.data(), n_in, outs.data(), n_out, where);
  for (int64_t k = 0; k < n_out; ++k)
    if (made[size_t(k)]) out[k] = &made[size_t(k)].release()->managed;
}

}  // namespace bpk
