// A minimal C++ application running a .bpk artifact through the installed bladepack runtime.
//
//   consumer MODEL.bpk N   -> every dynamic dim set to N, float inputs 0.5, integer inputs 1; prints
//                             each output's name, shape and sum
#include <bladepack/runtime.hpp>

#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: consumer MODEL.bpk N\n");
    return 2;
  }
  try {
    bladepack::Model model = bladepack::Model::load(argv[1]);
    const bpk_signature& sig = model.signature();
    std::printf("%s\n", sig.text);
    const int64_t n = std::atoll(argv[2]);
    std::vector<std::vector<char>> storage;
    std::vector<bladepack::Tensor> inputs;
    for (int64_t i = 0; i < sig.num_inputs; ++i) {
      const bpk_tensor_spec& spec = sig.inputs[i];
      std::vector<int64_t> shape;
      int64_t count = 1;
      for (int32_t a = 0; a < spec.ndim; ++a) {
        shape.push_back(spec.dims[a] < 0 ? n : spec.dims[a]);
        count *= shape.back();
      }
      storage.emplace_back(size_t(count) * bpk_dtype_size(spec.dtype));
      char* p = storage.back().data();
      for (int64_t e = 0; e < count; ++e) {
        if (spec.dtype == BPK_FLOAT32) reinterpret_cast<float*>(p)[e] = 0.5f;
        else if (spec.dtype == BPK_INT64) reinterpret_cast<int64_t*>(p)[e] = 1;
      }
      inputs.push_back(bladepack::Tensor::view(p, bpk_dtype(spec.dtype), shape));
    }
    std::vector<bladepack::Tensor> outputs = model.run(inputs);
    for (size_t k = 0; k < outputs.size(); ++k) {
      double sum = 0;
      if (outputs[k].dtype() == BPK_FLOAT32)
        for (int64_t e = 0; e < outputs[k].numel(); ++e) sum += outputs[k].data<float>()[e];
      std::printf("%s:", sig.outputs[k].name);
      for (int64_t d : outputs[k].shape()) std::printf(" %lld", static_cast<long long>(d));
      std::printf(" sum %.9g\n", sum);
    }
  } catch (const bladepack::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
