// libFuzzer target: the artifact reader, the manifest parser, the shape program, and the model: kernel
// library loaded, plans checked and prepared, and each prepared plan run; the CUDA plan's keys
// (native_cuda, the CUDA kernel rows and their operand check programs) parsed and validated as a CUDA
// load does before it opens the driver.
//
// Built with FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, where the manifest checksum is ignored so that
// mutations reach the msgpack parser, the manifest checks and the plan checks (Note [Plan checks] in
// bladepack/loader/plan_check.py). Section checksums still hold: a kernel library's bytes are code,
// so only the seed's own library ever loads, driven by whatever plan the mutated manifest describes.
// Any input must end in a run or a bpk::Error; a crash, a sanitizer report (an out-of-bounds kernel
// access included: inputs, outputs and arena are heap blocks of exactly their size) or an uncaught
// exception is a bug. fuzz/replay.cpp runs the same function over files, without libFuzzer.
#include <cstdint>
#include <memory>
#include <vector>

#include "artifact.h"
#include "dtype.h"
#include "errors.h"
#include "manifest.h"
#include "model.h"

namespace {

// The model's inputs with every dynamic dim `fill` (static dims their size), as owned zeroed buffers.
void run_at(const bpk::Model& model, int64_t fill) {
  const bpk_signature& sig = model.signature();
  std::vector<bpk_tensor> in(size_t(sig.num_inputs));
  std::vector<std::unique_ptr<uint8_t[]>> data;
  for (int64_t i = 0; i < sig.num_inputs; ++i) {
    const bpk_tensor_spec& s = sig.inputs[i];
    bpk_tensor& t = in[size_t(i)];
    t.ndim = s.ndim;
    t.dtype = s.dtype;
    int64_t n = 1;
    for (int32_t a = 0; a < s.ndim; ++a) {
      t.shape[a] = s.dims[a] >= 0 ? s.dims[a] : fill;
      n *= t.shape[a];
    }
    if (n > (int64_t(1) << 24)) return;  // the fuzzer's memory is bounded; such shapes are not its concern
    data.emplace_back(new uint8_t[size_t(n * bpk::dtype_size(s.dtype)) + 1]());
    t.data = data.back().get();
  }
  std::vector<bpk_tensor> out(size_t(sig.num_outputs));
  model.output_shapes(in.data(), int64_t(in.size()), out.data(), int64_t(out.size()));
  std::vector<std::unique_ptr<uint8_t[]>> out_data;
  for (auto& o : out) {
    int64_t n = 1;
    for (int32_t a = 0; a < o.ndim; ++a) n *= o.shape[a];
    if (n > (int64_t(1) << 24)) return;
    out_data.emplace_back(new uint8_t[size_t(n * bpk::dtype_size(o.dtype)) + 1]());
    o.data = out_data.back().get();
  }
  model.run(in.data(), int64_t(in.size()), out.data(), int64_t(out.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto artifact = bpk::Artifact::copy_from(data, size, true);
    bpk::Manifest m = bpk::parse_manifest(artifact->manifest());
    std::vector<int32_t> ranks;
    for (const auto& t : m.inputs) ranks.push_back(int32_t(t.shape.size()));
    m.shape_program.validate(ranks);
    // evaluate at a few shapes: every dim 1, then each dim its static size or 7
    for (int64_t fill : {int64_t(1), int64_t(7)}) {
      std::vector<std::vector<int64_t>> dims;
      std::vector<const int64_t*> ptrs;
      for (const auto& t : m.inputs) {
        dims.emplace_back();
        for (const auto& d : t.shape) dims.back().push_back(d.is_static ? d.size : fill);
      }
      for (const auto& d : dims) ptrs.push_back(d.data());
      std::vector<int64_t> regs(size_t(m.shape_program.num_registers));
      try {
        m.shape_program.evaluate(ptrs.data(), regs.data());
      } catch (const bpk::Error&) {
      }
    }
    // the CUDA plan, as a load with device "cuda" reads it (no driver here: nothing is launched)
    try {
      bpk::parse_cuda_plan(artifact->manifest(), m);
      for (const auto& l : m.native_cuda->launches)
        if (l.op == bpk::LaunchDecl::kKernel && m.cuda_kernels[size_t(l.kernel)].check)
          m.cuda_kernels[size_t(l.kernel)].check->validate({int32_t(l.ints.size()), int32_t(l.ptrs.size())});
    } catch (const bpk::Error&) {
    }
    // the whole model: library, plan checks at load, then per shape the plan and its run
    bpk_load_options options{0, 1, nullptr, nullptr, 0, nullptr};
    const bpk::Model model(std::move(artifact), options);
    for (int64_t fill : {int64_t(1), int64_t(7)}) {
      try {
        run_at(model, fill);
      } catch (const bpk::Error&) {
      }
    }
  } catch (const bpk::Error&) {
  }
  return 0;
}
