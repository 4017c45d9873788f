// Note [Device errors] through the C ABI (tests/test_cuda_cpp.py runs it on the fake driver), on a model
// x[:, idx] (x: float32[b, n], idx: int64[3]) with device tensors on the caller's stream:
//
//   test_device_errors GATHER.bpk cuda[:N]          -> a bad index raised by the next call, by
//       bpk_model_synchronize, or (the last one) printed on stderr when the model is freed
//   test_device_errors GATHER.bpk cuda[:N] strict   -> (BLADEPACK_CUDA_STRICT_ERRORS=1 set by the caller)
//       raised by the bad call itself
// "test_device_errors: N checks passed", exit 0; else each failure and exit 1.
#include <string>
#include <vector>

#include "bladepack/runtime.h"
#include "checks.h"

namespace {

// Note [Device errors]: index errors of calls on the caller's stream with device results.
void device_errors(const std::string& path, const char* device, bool strict) {
  Driver d;
  if (!d.lib || !d.alloc || !d.stream_create) {
    CHECK(false, "no driver to allocate device memory with");
    return;
  }
  bpk_load_options lo{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, device, 0};
  bpk_model* m = nullptr;
  if (bpk_model_load(path.c_str(), &lo, &m) != BPK_OK) {
    CHECK(false, "load: %s", bpk_last_error());
    return;
  }
  std::vector<float> x(20);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(i);
  const int64_t good[3] = {0, 9, 1}, bad[3] = {0, 10, 1};
  uint64_t dx = 0, dgood = 0, dbad = 0;
  d.alloc(&dx, sizeof(float) * 20);
  d.alloc(&dgood, sizeof good);
  d.alloc(&dbad, sizeof bad);
  d.htod(dx, x.data(), sizeof(float) * 20);
  d.htod(dgood, good, sizeof good);
  d.htod(dbad, bad, sizeof bad);
  int64_t xs[2] = {2, 10}, is[1] = {3};
  const DLTensor tx = dl(reinterpret_cast<void*>(dx), {kDLCUDA, 0}, {kDLFloat, 32, 1}, xs, 2);
  const DLTensor tgood = dl(reinterpret_cast<void*>(dgood), {kDLCUDA, 0}, {kDLInt, 64, 1}, is, 1);
  const DLTensor tbad = dl(reinterpret_cast<void*>(dbad), {kDLCUDA, 0}, {kDLInt, 64, 1}, is, 1);
  void* stream = nullptr;
  d.stream_create(&stream, 1);
  bpk_run_options opts{0, stream};
  auto call = [&](const DLTensor& idx) {
    const DLTensor* ins[2] = {&tx, &idx};
    DLManagedTensorVersioned* out[1] = {nullptr};
    const bpk_status st = bpk_model_run_dlpack(m, ins, 2, out, 1, &opts);
    if (out[0] != nullptr) out[0]->deleter(out[0]);
    return st;
  };
  for (int k = 0; k < 3; ++k) CHECK(call(tgood) == BPK_OK, "good call %d: %s", k, bpk_last_error());
  if (strict) {
    CHECK(call(tbad) == BPK_ERR_INDEX && contains(bpk_last_error(), "10 is not in [-10, 9]") &&
              !contains(bpk_last_error(), "earlier"),
          "strict: the bad call raises its own: %s", bpk_last_error());
    CHECK(call(tgood) == BPK_OK, "strict: the next call runs: %s", bpk_last_error());
  } else {
    CHECK(call(tbad) == BPK_OK, "the bad call returns without waiting: %s", bpk_last_error());
    CHECK(call(tgood) == BPK_ERR_INDEX && contains(bpk_last_error(), "10 is not in [-10, 9]") &&
              contains(bpk_last_error(), "earlier call on this stream and found when this call began"),
          "the next call raises it: %s", bpk_last_error());
    CHECK(call(tgood) == BPK_OK, "then calls run again: %s", bpk_last_error());
    CHECK(call(tbad) == BPK_OK, "%s", bpk_last_error());
    CHECK(bpk_model_synchronize(m, stream) == BPK_ERR_INDEX && contains(bpk_last_error(), "by bpk_model_synchronize"),
          "synchronize raises it: %s", bpk_last_error());
    CHECK(bpk_model_synchronize(m, nullptr) == BPK_OK, "once: %s", bpk_last_error());
    CHECK(call(tbad) == BPK_OK, "%s", bpk_last_error());  // left for bpk_model_free to print
  }
  bpk_model_free(m);
  d.free_(dx);
  d.free_(dgood);
  d.free_(dbad);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4 || (argc == 4 && std::strcmp(argv[3], "strict") != 0)) {
    std::fprintf(stderr, "usage: test_device_errors GATHER.bpk cuda[:N] [strict]\n");
    return 2;
  }
  device_errors(argv[1], argv[2], argc == 4);
  return report("test_device_errors");
}
