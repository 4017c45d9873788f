// The C ABI and the C++ header on a real artifact (tests/test_cpp_runtime.py passes the MLP sample:
// x: float32[batch, 64] -> float32[batch, 10], batch in [1, 4096]).
//
//   test_api MLP.bpk          -> "test_api: N checks passed", exit 0; else each failure and exit 1
//   test_api MLP.bpk cuda[:N] -> the same for a model on that device (tests/test_cuda_cpp.py runs it on
//                                the fake driver): its executor, results against the CPU model, and 8
//                                threads on their own streams bit-identical to serial calls
#include <dlfcn.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "bladepack/runtime.h"
#include "bladepack/runtime.hpp"
#include "checks.h"

namespace {

std::vector<float> input(int64_t batch, int seed) {
  std::vector<float> x(size_t(batch * 64));
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(std::sin(0.37 * double(i) + seed));
  return x;
}

bpk_tensor tensor(void* data, int32_t dtype, std::initializer_list<int64_t> shape) {
  bpk_tensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = int32_t(shape.size());
  int i = 0;
  for (int64_t d : shape) t.shape[i++] = d;
  return t;
}

double max_rel(const float* a, const float* b, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::fmax(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::fmax(scale, std::fabs(double(b[i])));
  }
  return scale > 0 ? diff / scale : diff;
}

std::vector<float> run_alloc(bpk_model* m, int64_t batch, int seed) {
  std::vector<float> x = input(batch, seed);
  bpk_tensor in = tensor(x.data(), BPK_FLOAT32, {batch, 64});
  bpk_tensor out = tensor(nullptr, 0, {});
  if (bpk_model_run(m, &in, 1, &out, 1) != BPK_OK) return {};
  std::vector<float> y(static_cast<float*>(out.data), static_cast<float*>(out.data) + batch * 10);
  bpk_free(out.data);
  return y;
}

void signature(bpk_model* m) {
  const bpk_signature* s = nullptr;
  CHECK(bpk_model_signature(m, &s) == BPK_OK, "%s", bpk_last_error());
  CHECK(s->num_inputs == 1 && s->num_outputs == 1 && s->num_symbols == 1, "counts");
  CHECK(std::strcmp(s->inputs[0].name, "x") == 0, "input name %s", s->inputs[0].name);
  CHECK(s->inputs[0].dtype == BPK_FLOAT32 && s->inputs[0].ndim == 2, "input type");
  CHECK(s->inputs[0].dims[0] == -1 && s->inputs[0].dims[1] == 64, "input dims");
  CHECK(std::strcmp(s->inputs[0].dim_exprs[0], "batch") == 0, "dim expr %s", s->inputs[0].dim_exprs[0]);
  CHECK(std::strcmp(s->symbols[0].name, "batch") == 0 && s->symbols[0].min == 1 && s->symbols[0].max == 4096,
        "symbol");
  CHECK(contains(s->text, "(x: float32[batch, 64]) -> (output0: float32[batch, 10]) where batch in [1, 4096]"),
        "text %s", s->text);
  CHECK(contains(bpk_model_executor(m), "native ("), "executor %s", bpk_model_executor(m));
}

void runs(bpk_model* path_model, bpk_model* mem_model) {
  for (int64_t batch : {int64_t(1), int64_t(3), int64_t(64), int64_t(4096)}) {
    std::vector<float> a = run_alloc(path_model, batch, 1), b = run_alloc(mem_model, batch, 1);
    CHECK(a.size() == size_t(batch * 10) && a == b, "path and memory loads differ at batch %lld", (long long)batch);
    // caller-allocated output, shapes asked first
    std::vector<float> x = input(batch, 1);
    bpk_tensor in = tensor(x.data(), BPK_FLOAT32, {batch, 64});
    bpk_tensor shape = tensor(nullptr, 0, {});
    CHECK(bpk_model_output_shapes(path_model, &in, 1, &shape, 1) == BPK_OK, "%s", bpk_last_error());
    CHECK(shape.ndim == 2 && shape.shape[0] == batch && shape.shape[1] == 10 && shape.dtype == BPK_FLOAT32,
          "output_shapes");
    CHECK(shape.data == nullptr, "output_shapes wrote data");
    std::vector<float> y(size_t(batch * 10), -1.f);
    bpk_tensor out = tensor(y.data(), BPK_FLOAT32, {batch, 10});
    CHECK(bpk_model_run(path_model, &in, 1, &out, 1) == BPK_OK, "%s", bpk_last_error());
    CHECK(y == a, "caller buffer differs from runtime buffer at batch %lld", (long long)batch);
    CHECK(bpk_last_error()[0] == '\0', "last error after success: %s", bpk_last_error());
    // log_softmax rows: logsumexp is 0
    double worst = 0;
    for (int64_t r = 0; r < batch; ++r) {
      double s = 0;
      for (int c = 0; c < 10; ++c) s += std::exp(double(y[size_t(r * 10 + c)]));
      worst = std::fmax(worst, std::fabs(s - 1));
    }
    CHECK(worst < 1e-5, "softmax rows sum to %g", 1 + worst);
  }
}

void errors(bpk_model* m) {
  std::vector<float> x = input(2, 0);
  std::vector<double> xd(2 * 64);
  bpk_tensor out = tensor(nullptr, 0, {});
  bpk_tensor in = tensor(x.data(), BPK_FLOAT32, {2, 64});
  CHECK(bpk_model_run(m, &in, 0, &out, 1) == BPK_ERR_INPUT, "count");
  CHECK(std::strcmp(bpk_last_error(), "expected 1 inputs (x), got 0") == 0, "%s", bpk_last_error());
  bpk_tensor rank = tensor(x.data(), BPK_FLOAT32, {128});
  CHECK(bpk_model_run(m, &rank, 1, &out, 1) == BPK_ERR_INPUT, "rank");
  CHECK(std::strcmp(bpk_last_error(),
                    "input 'x' has rank 1 (shape (128,)); expected rank 2: x: float32[batch, 64]") == 0,
        "%s", bpk_last_error());
  bpk_tensor dt = tensor(xd.data(), BPK_FLOAT64, {2, 64});
  CHECK(bpk_model_run(m, &dt, 1, &out, 1) == BPK_ERR_INPUT, "dtype");
  CHECK(std::strcmp(bpk_last_error(), "input 'x' has dtype float64; expected float32") == 0, "%s", bpk_last_error());
  bpk_tensor st = tensor(x.data(), BPK_FLOAT32, {4, 32});
  CHECK(bpk_model_run(m, &st, 1, &out, 1) == BPK_ERR_INPUT, "static dim");
  bpk_tensor big = tensor(x.data(), BPK_FLOAT32, {4097, 64});
  CHECK(bpk_model_run(m, &big, 1, &out, 1) == BPK_ERR_SHAPE_GUARD, "range");
  CHECK(contains(bpk_last_error(), "is 4097; the allowed range is [1, 4096]"), "%s", bpk_last_error());
  CHECK(out.data == nullptr, "a failed run left an output allocated");
  std::vector<float> y(30);
  bpk_tensor wrong = tensor(y.data(), BPK_FLOAT32, {3, 10});
  CHECK(bpk_model_run(m, &in, 1, &wrong, 1) == BPK_ERR_INPUT, "output buffer shape");
  CHECK(std::strcmp(bpk_last_error(), "output buffer 'output0' is float32[3, 10]; the result is float32[2, 10]") == 0,
        "%s", bpk_last_error());
  CHECK(bpk_model_run(m, &in, 1, &out, 2) == BPK_ERR_ARGUMENT, "output count");
  CHECK(bpk_model_run(nullptr, &in, 1, &out, 1) == BPK_ERR_ARGUMENT, "null model");
  bpk_tensor nodata = tensor(nullptr, BPK_FLOAT32, {2, 64});
  CHECK(bpk_model_run(m, &nodata, 1, &out, 1) == BPK_ERR_ARGUMENT, "null input data");
  bpk_tensor baddt = tensor(x.data(), 99, {2, 64});
  CHECK(bpk_model_run(m, &baddt, 1, &out, 1) == BPK_ERR_ARGUMENT, "invalid dtype code");
  bpk_model* none = nullptr;
  CHECK(bpk_model_load("/nonexistent/model.bpk", nullptr, &none) == BPK_ERR_IO && none == nullptr, "missing file");
  CHECK(std::strcmp(bpk_last_error(), "no artifact at /nonexistent/model.bpk") == 0, "%s", bpk_last_error());
  bpk_load_options bad_flags{0x80, 0};
  CHECK(bpk_model_load_from_memory("x", 1, &bad_flags, &none) == BPK_ERR_ARGUMENT, "unknown flags");
}

void truncations(const std::string& bytes) {
  // every prefix length class: header, manifest, sections, all but the last byte
  const size_t lens[] = {0, 1, 8, 63, 64, 100, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1};
  for (size_t n : lens) {
    bpk_model* m = nullptr;
    const bpk_status s = bpk_model_load_from_memory(bytes.data(), n, nullptr, &m);
    CHECK(s == BPK_ERR_FORMAT && m == nullptr, "truncated to %zu bytes: status %d", n, int(s));
    CHECK(std::strncmp(bpk_last_error(), "<memory>: ", 10) == 0, "%s", bpk_last_error());
  }
}

void threads(bpk_model* m, double tolerance = 1e-6) {
  // serial references, then 8 threads running mixed shapes at once
  const int64_t batches[] = {1, 2, 5, 17, 64, 257};
  std::vector<std::vector<float>> ref;
  for (int64_t b : batches) ref.push_back(run_alloc(m, b, int(b)));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 8; ++t)
    ts.emplace_back([&, t] {
      for (int r = 0; r < 40; ++r) {
        const size_t k = size_t(t + r) % 6;
        std::vector<float> y = run_alloc(m, batches[k], int(batches[k]));
        if (y.size() != ref[k].size() || max_rel(y.data(), ref[k].data(), y.size()) > tolerance) ++mismatches;
      }
    });
  for (auto& t : ts) t.join();
  CHECK(mismatches == 0, "%d concurrent runs differ from the serial ones", mismatches.load());
}

// A model freed right after loading: its kernel pool is destroyed before the workers first ran (a
// worker that had not yet read the job counter used to wait for a job that never came).
void load_unload(const std::string& path) {
  int ok = 0;
  bpk_load_options opts{BPK_LOAD_SKIP_SECTION_CHECKSUMS, 4};
  for (int i = 0; i < 50; ++i) {
    bpk_model* m = nullptr;
    if (bpk_model_load(path.c_str(), &opts, &m) == BPK_OK) ++ok;
    bpk_model_free(m);
  }
  CHECK(ok == 50, "%d of 50 loads succeeded", ok);
}

// Note [Mapped or private]: a model loaded with mmap = 0 keeps running, with the same results, after its
// file is overwritten and truncated to nothing (a mapped one would fault); a bad mmap value is refused.
void private_copy(const std::string& bytes) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/bladepack-test-api-private.bpk";
  std::ofstream(path, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  bpk_load_options opts{BPK_LOAD_MAPPING, 2, nullptr, nullptr, 0, nullptr, nullptr, 0, 0};
  bpk_model* m = nullptr;
  CHECK(bpk_model_load(path.c_str(), &opts, &m) == BPK_OK, "%s", bpk_last_error());
  const std::vector<float> before = run_alloc(m, 5, 3);
  {
    std::ofstream zeros(path, std::ios::binary | std::ios::in);
    const std::string z(bytes.size(), '\0');
    zeros.write(z.data(), std::streamsize(z.size()));
  }
  CHECK(run_alloc(m, 5, 3) == before, "results changed after the file was overwritten");
  CHECK(std::ofstream(path, std::ios::binary | std::ios::trunc).good(), "truncate");
  CHECK(run_alloc(m, 5, 3) == before && before.size() == 50, "results changed after the file was truncated");
  bpk_model_free(m);
  opts.mmap = 2;
  CHECK(bpk_model_load(path.c_str(), &opts, &m) == BPK_ERR_ARGUMENT, "mmap = 2 accepted");
  CHECK(contains(bpk_last_error(), "mmap must be 1 (map the file), 0 (read it privately) or -1"), "%s",
        bpk_last_error());
  std::remove(path.c_str());
}

void cpp_header(const std::string& path) {
  bladepack::Model model = bladepack::Model::load(path);
  std::vector<float> x = input(5, 1);
  auto outs = model.run({bladepack::Tensor::view(x.data(), {5, 64})});
  CHECK(outs.size() == 1 && outs[0].owns_data() && outs[0].shape() == std::vector<int64_t>({5, 10}), "C++ run");
  auto shapes = model.output_shapes({bladepack::Tensor::view(x.data(), {5, 64})});
  std::vector<float> y(50);
  model.run({bladepack::Tensor::view(x.data(), {5, 64})}, {bladepack::Tensor::view(y.data(), shapes[0].shape())});
  CHECK(std::memcmp(y.data(), outs[0].data<float>(), 50 * sizeof(float)) == 0, "C++ caller buffer");
  bool threw = false;
  try {
    model.run({bladepack::Tensor::view(x.data(), {5, 63})});
  } catch (const bladepack::Error& e) {
    threw = e.status() == BPK_ERR_INPUT && contains(e.what(), "dimension 1 is 63; it is static and must be 64");
  }
  CHECK(threw, "C++ errors throw bladepack::Error with the reason");
  bladepack::Model on_cpu = bladepack::Model::load(path, "cpu");
  int64_t shape[2] = {5, 64};
  const DLTensor in = dl(x.data(), {kDLCPU, 0}, {kDLFloat, 32, 1}, shape, 2);
  std::vector<bladepack::DLPackTensor> r = on_cpu.run_dlpack({&in});
  CHECK(r.size() == 1 && r[0] && std::memcmp(r[0]->dl_tensor.data, outs[0].data<float>(), 50 * sizeof(float)) == 0,
        "C++ DLPack run");
}

// bpk_model_run_dlpack on a CPU model: host tensors in, a runtime-allocated kDLCPU result out (its
// deleter frees it), the caller's output written in place; device and layout errors name the tensor.
void dlpack_cpu(bpk_model* m) {
  std::vector<float> x = input(5, 2);
  int64_t shape[2] = {5, 64};
  const DLTensor in = dl(x.data(), {kDLCPU, 0}, {kDLFloat, 32, 1}, shape, 2);
  const DLTensor* ins[1] = {&in};
  DLManagedTensorVersioned* out[1] = {nullptr};
  CHECK(bpk_model_run_dlpack(m, ins, 1, out, 1, nullptr) == BPK_OK, "%s", bpk_last_error());
  std::vector<float> want = run_alloc(m, 5, 2);
  if (out[0] != nullptr) {
    const DLTensor& r = out[0]->dl_tensor;
    CHECK(r.device.device_type == kDLCPU && r.ndim == 2 && r.shape[0] == 5 && r.shape[1] == 10 &&
              r.dtype.code == kDLFloat && r.dtype.bits == 32 && out[0]->version.major == 1,
          "result tensor");
    CHECK(std::memcmp(r.data, want.data(), 50 * sizeof(float)) == 0, "DLPack result equals bpk_model_run's");
    out[0]->deleter(out[0]);
  }
  std::vector<float> y(50);
  int64_t yshape[2] = {5, 10};
  DLManagedTensorVersioned mine;
  std::memset(&mine, 0, sizeof mine);
  mine.dl_tensor = dl(y.data(), {kDLCPU, 0}, {kDLFloat, 32, 1}, yshape, 2);
  DLManagedTensorVersioned* into[1] = {&mine};
  CHECK(bpk_model_run_dlpack(m, ins, 1, into, 1, nullptr) == BPK_OK && into[0] == &mine &&
            std::memcmp(y.data(), want.data(), 50 * sizeof(float)) == 0,
        "caller output: %s", bpk_last_error());
  int64_t strides[2] = {1, 5};
  const DLTensor strided = dl(x.data(), {kDLCPU, 0}, {kDLFloat, 32, 1}, shape, 2, strides);
  const DLTensor* bad[1] = {&strided};
  CHECK(bpk_model_run_dlpack(m, bad, 1, out, 1, nullptr) == BPK_ERR_INPUT &&
            contains(bpk_last_error(), "input 'x' is not contiguous (strides [1, 5]); pass a C-contiguous tensor"),
        "%s", bpk_last_error());
  const DLTensor gpu = dl(x.data(), {kDLCUDA, 0}, {kDLFloat, 32, 1}, shape, 2);
  const DLTensor* on_gpu[1] = {&gpu};
  CHECK(bpk_model_run_dlpack(m, on_gpu, 1, out, 1, nullptr) == BPK_ERR_INPUT &&
            contains(bpk_last_error(), "input 'x' is on cuda:0; this model runs on cpu"),
        "%s", bpk_last_error());
  const DLTensor half = dl(x.data(), {kDLCPU, 0}, {kDLFloat, 16, 1}, shape, 2);
  const DLTensor* halves[1] = {&half};
  CHECK(bpk_model_run_dlpack(m, halves, 1, out, 1, nullptr) == BPK_ERR_INPUT &&
            contains(bpk_last_error(), "input 'x' has dtype float16; expected float32"),
        "%s", bpk_last_error());
}

// bpk_model_run_dlpack on a CUDA model: device inputs and outputs (runtime-allocated kDLCUDA results,
// the caller's device buffer), mixed host / device, the caller's stream, repeated calls (graphs),
// results equal to bpk_model_run's bit for bit; a result released after the model.
void dlpack_cuda(bpk_model* m, const std::string& path, const char* device) {
  Driver d;
  if (!d.lib || !d.alloc || !d.stream_create) {
    CHECK(false, "no driver to allocate device memory with");
    return;
  }
  for (int64_t b : {1, 7, 64}) {
    std::vector<float> x = input(b, int(b)), want = run_alloc(m, b, int(b));
    uint64_t dx = 0, dy = 0;
    d.alloc(&dx, x.size() * sizeof(float));
    d.alloc(&dy, size_t(b) * 10 * sizeof(float));
    d.htod(dx, x.data(), x.size() * sizeof(float));
    int64_t shape[2] = {b, 64}, yshape[2] = {b, 10};
    const DLTensor on_device = dl(reinterpret_cast<void*>(dx), {kDLCUDA, 0}, {kDLFloat, 32, 1}, shape, 2);
    const DLTensor on_host = dl(x.data(), {kDLCPU, 0}, {kDLFloat, 32, 1}, shape, 2);
    void* stream = nullptr;
    d.stream_create(&stream, 1);
    for (int call = 0; call < 4; ++call) {  // calls 3 and 4 replay the signature's graph
      const DLTensor* ins[1] = {call % 2 ? &on_host : &on_device};
      DLManagedTensorVersioned* out[1] = {nullptr};
      bpk_run_options opts{0, call >= 2 ? stream : nullptr};
      CHECK(bpk_model_run_dlpack(m, ins, 1, out, 1, &opts) == BPK_OK, "batch %lld call %d: %s",
            static_cast<long long>(b), call, bpk_last_error());
      if (out[0] == nullptr) continue;
      CHECK(out[0]->dl_tensor.device.device_type == kDLCUDA && out[0]->dl_tensor.device.device_id == 0,
            "a CUDA model's results are device tensors");
      if (opts.stream) d.sync(stream);
      std::vector<float> y(size_t(b) * 10);
      d.dtoh(y.data(), reinterpret_cast<uint64_t>(out[0]->dl_tensor.data), y.size() * sizeof(float));
      CHECK(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) == 0, "batch %lld call %d differs",
            static_cast<long long>(b), call);
      out[0]->deleter(out[0]);
    }
    DLManagedTensorVersioned mine;  // the caller's device buffer, written in place
    std::memset(&mine, 0, sizeof mine);
    mine.dl_tensor = dl(reinterpret_cast<void*>(dy), {kDLCUDA, 0}, {kDLFloat, 32, 1}, yshape, 2);
    DLManagedTensorVersioned* into[1] = {&mine};
    const DLTensor* ins[1] = {&on_device};
    CHECK(bpk_model_run_dlpack(m, ins, 1, into, 1, nullptr) == BPK_OK, "%s", bpk_last_error());
    std::vector<float> y(size_t(b) * 10);
    d.dtoh(y.data(), dy, y.size() * sizeof(float));
    CHECK(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) == 0, "caller device output differs");
    d.free_(dx);
    d.free_(dy);
  }
  int64_t shape[2] = {2, 64};
  std::vector<float> x = input(2, 0);
  const DLTensor other = dl(x.data(), {kDLCUDA, 3}, {kDLFloat, 32, 1}, shape, 2);
  const DLTensor* ins[1] = {&other};
  DLManagedTensorVersioned* out[1] = {nullptr};
  CHECK(bpk_model_run_dlpack(m, ins, 1, out, 1, nullptr) == BPK_ERR_INPUT &&
            contains(bpk_last_error(), "input 'x' is on cuda:3; this model runs on cuda:0"),
        "%s", bpk_last_error());
  // a result outlives its model
  bpk_load_options opts{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, device, 0};
  bpk_model* brief = nullptr;
  CHECK(bpk_model_load(path.c_str(), &opts, &brief) == BPK_OK, "%s", bpk_last_error());
  const DLTensor host = dl(x.data(), {kDLCPU, 0}, {kDLFloat, 32, 1}, shape, 2);
  const DLTensor* hs[1] = {&host};
  CHECK(bpk_model_run_dlpack(brief, hs, 1, out, 1, nullptr) == BPK_OK, "%s", bpk_last_error());
  bpk_model_free(brief);
  if (out[0]) {
    std::vector<float> y(20), want = run_alloc(m, 2, 0);
    d.dtoh(y.data(), reinterpret_cast<uint64_t>(out[0]->dl_tensor.data), y.size() * sizeof(float));
    CHECK(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) == 0, "result after bpk_model_free");
    out[0]->deleter(out[0]);
  }
}

// A model on a CUDA device: its executor, results within float32 rounding of the CPU model's, errors
// as on the CPU, and concurrent calls (each on a stream of its own) equal to serial ones bit for bit.
void on_device(const std::string& path, const char* device) {
  bpk_load_options opts{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, device, 0};
  bpk_model *gpu = nullptr, *cpu = nullptr;
  if (bpk_model_load(path.c_str(), &opts, &gpu) != BPK_OK || bpk_model_load(path.c_str(), nullptr, &cpu) != BPK_OK) {
    CHECK(false, "load on %s: %s", device, bpk_last_error());
    return;
  }
  CHECK(std::strncmp(bpk_model_executor(gpu), "cuda (", 6) == 0, "executor %s", bpk_model_executor(gpu));
  for (int64_t b : {1, 2, 5, 17, 64, 257, 4096}) {
    std::vector<float> y = run_alloc(gpu, b, int(b)), want = run_alloc(cpu, b, int(b));
    CHECK(y.size() == size_t(b) * 10 && max_rel(y.data(), want.data(), y.size()) < 1e-5, "batch %lld on %s",
          static_cast<long long>(b), device);
  }
  std::vector<float> x = input(4097, 0);
  bpk_tensor in = tensor(x.data(), BPK_FLOAT32, {4097, 64});
  bpk_tensor out = tensor(nullptr, 0, {});
  CHECK(bpk_model_run(gpu, &in, 1, &out, 1) == BPK_ERR_SHAPE_GUARD && out.data == nullptr, "batch 4097: %s",
        bpk_last_error());
  std::vector<float> y(20);
  bpk_tensor in2 = tensor(x.data(), BPK_FLOAT32, {2, 64}), small = tensor(y.data(), BPK_FLOAT32, {2, 9});
  CHECK(bpk_model_run(gpu, &in2, 1, &small, 1) == BPK_ERR_INPUT &&
            contains(bpk_last_error(), "output buffer 'output0' is float32[2, 9]; the result is float32[2, 10]"),
        "%s", bpk_last_error());
  threads(gpu, 0.0);
  dlpack_cuda(gpu, path, device);
  // Note [CUDA graphs]: one graph per stream, batches alternating every three calls (the second call of
  // a run captures, the switch drops the other's graph), bit-identical to a model without graphs
  bpk_load_options one{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, device, 1};
  bpk_load_options none_{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, device, -1};
  bpk_model *lru = nullptr, *plain = nullptr;
  CHECK(bpk_model_load(path.c_str(), &one, &lru) == BPK_OK && bpk_model_load(path.c_str(), &none_, &plain) == BPK_OK,
        "%s", bpk_last_error());
  int differ = 0;
  for (int r = 0; r < 12 && lru && plain; ++r) {
    const int64_t b = (r / 3) % 2 ? 3 : 40;
    std::vector<float> y = run_alloc(lru, b, r), want = run_alloc(plain, b, r);
    differ += y.size() != want.size() || std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) != 0;
  }
  CHECK(differ == 0, "%d calls with one graph per stream differ from calls without graphs", differ);
  bpk_load_options negative{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, device, -2};
  bpk_model* refused = nullptr;
  CHECK(bpk_model_load(path.c_str(), &negative, &refused) == BPK_ERR_ARGUMENT &&
            contains(bpk_last_error(), "cuda_graphs is -2; allowed: -1 (off), 0 (the default, 64) or a positive count"),
        "%s", bpk_last_error());
  bpk_model_free(lru);
  bpk_model_free(plain);
  bpk_model_free(gpu);
  bpk_model_free(cpu);
  bpk_load_options bad{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, "gpu", 0};
  bpk_model* none = nullptr;
  CHECK(bpk_model_load(path.c_str(), &bad, &none) == BPK_ERR_ARGUMENT &&
            contains(bpk_last_error(), "device must be 'cpu', 'cuda' or 'cuda:N', got 'gpu'"),
        "%s", bpk_last_error());
}

}  // namespace

// Note [Graph staging cost]: an elementwise MODEL.bpk (x[rows, 64] -> [rows, 64]) called four times with a
// device input on a caller stream, results equal to the CPU model's; whether the later calls launch a
// graph (small) or run plain launches in place (large) the caller reads from the fake driver's log.
void staging(const std::string& path, const char* device, int64_t rows) {
  Driver d;
  bpk_load_options opts{BPK_LOAD_DEVICE, 0, nullptr, nullptr, 0, nullptr, device, 0};
  bpk_model *gpu = nullptr, *cpu = nullptr;
  if (!d.lib || bpk_model_load(path.c_str(), &opts, &gpu) != BPK_OK ||
      bpk_model_load(path.c_str(), nullptr, &cpu) != BPK_OK) {
    CHECK(false, "load on %s: %s", device, bpk_last_error());
    return;
  }
  std::vector<float> x = input(rows, 3), want(x.size()), y(x.size());
  bpk_tensor in = tensor(x.data(), BPK_FLOAT32, {rows, 64}), out = tensor(want.data(), BPK_FLOAT32, {rows, 64});
  CHECK(bpk_model_run(cpu, &in, 1, &out, 1) == BPK_OK, "%s", bpk_last_error());
  uint64_t dx = 0;
  d.alloc(&dx, x.size() * sizeof(float));
  d.htod(dx, x.data(), x.size() * sizeof(float));
  int64_t shape[2] = {rows, 64};
  const DLTensor on_device = dl(reinterpret_cast<void*>(dx), {kDLCUDA, 0}, {kDLFloat, 32, 1}, shape, 2);
  void* stream = nullptr;
  d.stream_create(&stream, 1);
  for (int call = 0; call < 4; ++call) {
    const DLTensor* ins[1] = {&on_device};
    DLManagedTensorVersioned* res[1] = {nullptr};
    bpk_run_options ro{0, stream};
    CHECK(bpk_model_run_dlpack(gpu, ins, 1, res, 1, &ro) == BPK_OK, "call %d: %s", call, bpk_last_error());
    if (res[0] == nullptr) continue;
    d.sync(stream);
    d.dtoh(y.data(), reinterpret_cast<uint64_t>(res[0]->dl_tensor.data), y.size() * sizeof(float));
    CHECK(max_rel(y.data(), want.data(), y.size()) < 1e-5, "rows %lld call %d differs from the CPU model",
          static_cast<long long>(rows), call);
    res[0]->deleter(res[0]);
  }
  d.free_(dx);
  bpk_model_free(gpu);
  bpk_model_free(cpu);
}

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    std::fprintf(stderr, "usage: test_api MLP.bpk [cuda[:N]] | test_api ELEMENTWISE.bpk cuda[:N] ROWS\n");
    return 2;
  }
  const std::string path = argv[1];
  if (argc >= 3) {
    if (argc == 4)
      staging(path, argv[2], std::atoll(argv[3]));
    else
      on_device(path, argv[2]);
    return report("test_api");
  }
  std::ifstream f(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  bpk_model *a = nullptr, *b = nullptr;
  bpk_load_options opts{BPK_LOAD_SKIP_SECTION_CHECKSUMS, 2};
  if (bpk_model_load(path.c_str(), nullptr, &a) != BPK_OK ||
      bpk_model_load_from_memory(bytes.data(), bytes.size(), &opts, &b) != BPK_OK) {
    std::fprintf(stderr, "load failed: %s\n", bpk_last_error());
    return 1;
  }
  signature(a);
  runs(a, b);
  errors(a);
  truncations(bytes);
  private_copy(bytes);
  threads(a);
  dlpack_cpu(a);
  cpp_header(path);
  load_unload(path);
  bpk_model_free(a);
  bpk_model_free(b);
  return report("test_api");
}
