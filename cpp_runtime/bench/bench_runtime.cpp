// Benchmarks of the C++ runtime (bench/cpp_runtime.py drives them and records the results).
//
//   bench_runtime host ARTIFACT --shape NAME=D0,D1,... ... [--repeat N]
//     per call at a repeated shape: the whole bpk_model_run, and the kernel library's run of the same
//     prepared launch list with nothing around it, interleaved call by call; prints JSON with both
//     medians (us) and the median of the per-pair differences (the host overhead).
//   bench_runtime walk ARTIFACT --shape NAME=D0,D1,... ... --grow NAME:AXIS ... [--repeat N] [--device cuda]
//     a decode loop: N calls, each with every --grow dim one longer than the call before (every call a
//     shape the model has not prepared); outputs allocated by the runtime and freed per call, as a
//     caller without buffers of its own does; prints JSON with the median and mean per call (us) and
//     the process's peak resident memory (KiB). --device cuda: the CUDA plan (host inputs copied in).
//   bench_runtime load ARTIFACT [--repeat N] [--no-verify]
//     bpk_model_load (memory-mapped) wall time; prints JSON with the median and minimum (ms).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bladepack/runtime.h"
#include "dtype.h"
#include "errors.h"
#include "model.h"

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The inputs at `shapes`, each with room for `extra` more along its `grow` axis (the walk's longest
// call); floats in [-1, 1), integers 1 (a valid token id, an unmasked position). Buffers go to `bufs`.
std::vector<bpk_tensor> inputs(const bpk_signature& sig, const std::map<std::string, std::vector<int64_t>>& shapes,
                               const std::map<std::string, int>& grow, int extra, std::vector<void*>& bufs) {
  std::vector<bpk_tensor> in(size_t(sig.num_inputs));
  for (int64_t i = 0; i < sig.num_inputs; ++i) {
    auto it = shapes.find(sig.inputs[i].name);
    if (it == shapes.end()) bpk::fail(BPK_ERR_ARGUMENT, std::string("no --shape for input ") + sig.inputs[i].name);
    auto g = grow.find(sig.inputs[i].name);
    bpk_tensor& t = in[size_t(i)];
    std::memset(&t, 0, sizeof t);
    t.dtype = sig.inputs[i].dtype;
    t.ndim = int32_t(it->second.size());
    size_t n = 1;
    for (int32_t a = 0; a < t.ndim; ++a) {
      t.shape[a] = it->second[size_t(a)];
      n *= size_t(t.shape[a] + (g != grow.end() && g->second == a ? extra : 0));
    }
    const size_t item = bpk::dtype_size(t.dtype);
    t.data = std::aligned_alloc(64, (n * item + 64) / 64 * 64);
    bufs.push_back(t.data);
    for (size_t e = 0; e < n; ++e) {
      char* p = static_cast<char*>(t.data) + e * item;
      if (t.dtype == BPK_FLOAT32) *reinterpret_cast<float*>(p) = float((e * 7919) % 2000) / 1000.f - 1.f;
      else if (t.dtype == BPK_FLOAT64) *reinterpret_cast<double*>(p) = double((e * 7919) % 2000) / 1000. - 1.;
      else if (t.dtype == BPK_INT64) *reinterpret_cast<int64_t*>(p) = 1;
      else if (t.dtype == BPK_INT32) *reinterpret_cast<int32_t*>(p) = 1;
      else std::memset(p, 0, item);
    }
  }
  return in;
}

int host(const std::string& path, const std::map<std::string, std::vector<int64_t>>& shapes, int repeat) {
  bpk_load_options opts{0, 0};
  bpk::Model model(bpk::Artifact::open(path, true), opts);
  const auto& sig = model.signature();
  std::vector<void*> bufs;
  std::vector<bpk_tensor> in = inputs(sig, shapes, {}, 0, bufs);
  std::vector<bpk_tensor> out(size_t(sig.num_outputs));
  for (auto& o : out) std::memset(&o, 0, sizeof o);
  model.run(in.data(), int64_t(in.size()), out.data(), int64_t(out.size()));  // allocates the outputs once
  auto prep = model.prepared(in.data());
  // the same slot table the runtime builds, for the library alone
  const auto& m = model.manifest();
  std::vector<void*> slots(size_t(m.num_slots()));
  void* arena = std::aligned_alloc(64, (prep->arena_bytes + 64) / 64 * 64);
  slots[0] = arena;
  for (size_t i = 0; i < in.size(); ++i) slots[1 + i] = in[i].data;
  for (size_t k = 0; k < out.size(); ++k) slots[1 + in.size() + k] = out[k].data;
  for (size_t w = 0; w < model.weight_ptrs().size(); ++w)
    slots[1 + in.size() + out.size() + w] = const_cast<void*>(model.weight_ptrs()[w]);
  int64_t status[4];
  for (int r = 0; r < 50; ++r) model.run(in.data(), int64_t(in.size()), out.data(), int64_t(out.size()));
  std::vector<double> call, native, diff;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = Clock::now();
    model.run(in.data(), int64_t(in.size()), out.data(), int64_t(out.size()));
    const auto t1 = Clock::now();
    if (model.library().run(prep->words.data(), int64_t(prep->words.size()), slots.data(), status))
      bpk::fail(BPK_ERR_EXECUTION, "the library run failed");
    const auto t2 = Clock::now();
    call.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    native.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
    diff.push_back(call.back() - native.back());
  }
  size_t launches = m.native->launches.size();
  std::printf("{\"call_us\": %.3f, \"native_us\": %.3f, \"overhead_us\": %.3f, \"launches\": %zu, \"threads\": %d, "
              "\"isa\": \"%s\", \"blas\": \"%s\"}\n",
              median(call), median(native), median(diff), launches, model.library().threads(),
              model.library().isa().c_str(), model.library().blas().c_str());
  for (auto& o : out) bpk_free(o.data);
  for (void* b : bufs) std::free(b);
  std::free(arena);
  return 0;
}

// This process's peak resident memory (VmHWM, KiB; -1 where /proc is missing): the kernel's own figure
// for this program, where getrusage's would include what the parent held when it forked.
long peak_rss_kb() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kb = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::strncmp(line, "VmHWM:", 6) == 0) kb = std::strtol(line + 6, nullptr, 10);
  std::fclose(f);
  return kb;
}

int walk(const std::string& path, const std::map<std::string, std::vector<int64_t>>& shapes,
         const std::map<std::string, int>& grow, int repeat, const std::string& device) {
  bpk_load_options opts{0, 0};
  if (!device.empty()) {
    opts.flags |= BPK_LOAD_DEVICE;
    opts.device = device.c_str();
  }
  bpk::Model model(bpk::Artifact::open(path, true), opts);
  const auto& sig = model.signature();
  std::vector<void*> bufs;
  std::vector<bpk_tensor> in = inputs(sig, shapes, grow, repeat, bufs);
  std::vector<bpk_tensor> out(size_t(sig.num_outputs));
  std::vector<double> call;
  for (int r = 0; r < repeat; ++r) {
    for (auto& o : out) std::memset(&o, 0, sizeof o);
    const auto t0 = Clock::now();
    model.run(in.data(), int64_t(in.size()), out.data(), int64_t(out.size()));
    call.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    for (auto& o : out) bpk_free(o.data);
    for (int64_t i = 0; i < sig.num_inputs; ++i) {
      auto g = grow.find(sig.inputs[i].name);
      if (g != grow.end()) in[size_t(i)].shape[g->second] += 1;
    }
  }
  double mean = 0;
  for (double c : call) mean += c / double(call.size());
  std::printf("{\"median_us\": %.3f, \"mean_us\": %.3f, \"calls\": %d, \"peak_rss_kb\": %ld}\n", median(call), mean,
              repeat, peak_rss_kb());
  for (void* b : bufs) std::free(b);
  return 0;
}

int load(const std::string& path, int repeat, bool verify) {
  bpk_load_options opts{verify ? 0u : BPK_LOAD_SKIP_SECTION_CHECKSUMS, 0};
  std::vector<double> ms;
  for (int r = 0; r < repeat; ++r) {
    bpk_model* m = nullptr;
    const auto t0 = Clock::now();
    if (bpk_model_load(path.c_str(), &opts, &m) != BPK_OK) bpk::fail(BPK_ERR_FORMAT, bpk_last_error());
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    bpk_model_free(m);
  }
  std::printf("{\"median_ms\": %.3f, \"min_ms\": %.3f, \"verify\": %s}\n", median(ms),
              *std::min_element(ms.begin(), ms.end()), verify ? "true" : "false");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_runtime host|walk|load ARTIFACT [options]\n");
    return 2;
  }
  const std::string mode = argv[1], path = argv[2];
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, int> grow;
  int repeat = 1000;
  bool verify = true;
  std::string device;  // walk: "cuda" runs the CUDA plan (host inputs copied in, as bpk-run does)
  for (int i = 3; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--repeat" && i + 1 < argc) {
      repeat = std::atoi(argv[++i]);
    } else if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else if (a == "--no-verify") {
      verify = false;
    } else if (a == "--grow" && i + 1 < argc) {
      const std::string v = argv[++i];
      const size_t colon = v.find(':');
      grow[v.substr(0, colon)] = std::atoi(v.substr(colon + 1).c_str());
    } else if (a == "--shape" && i + 1 < argc) {
      const std::string v = argv[++i];
      const size_t eq = v.find('=');
      std::vector<int64_t> dims;
      for (size_t p = eq + 1; p < v.size();) {
        size_t q = v.find(',', p);
        if (q == std::string::npos) q = v.size();
        dims.push_back(std::atoll(v.substr(p, q - p).c_str()));
        p = q + 1;
      }
      shapes[v.substr(0, eq)] = dims;
    } else {
      std::fprintf(stderr, "bench_runtime: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  try {
    if (mode == "walk") return walk(path, shapes, grow, repeat, device);
    return mode == "host" ? host(path, shapes, repeat) : load(path, repeat, verify);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_runtime: %s\n", e.what());
    return 1;
  }
}
