// bpk-run: run a .bpk artifact on .npy inputs without Python.
//
//   bpk-run MODEL.bpk --input NAME=FILE.npy ... [--output-dir DIR] [--device cpu|cuda[:N]] [--repeat N]
//           [--cuda-graphs N] [--threads N] [--no-verify] [--sha256 HEX] [--trusted-key KEY ...]
//           [--on-out-of-range DIM=POLICY ...] [--mmap | --no-mmap] [--dlpack-device] [--lengths N,N,...]
//   bpk-run MODEL.bpk --verify
//
// --sha256 refuses the file unless its SHA-256 is HEX; --trusted-key (64 hex digits, or a file holding
// them or a PEM Ed25519 public key such as `bladepack keygen` writes) refuses it unless one of the keys
// signed it (docs/format.md "Trust"). --on-out-of-range DIM=split runs a batch above DIM's maximum as
// several calls whose results are concatenated, where the compiler proved DIM batch-like
// (docs/format.md "Batch-like dims"). --mmap maps the file, --no-mmap reads it once into private memory
// (the default: private with --sha256 / --trusted-key, else mapped; bpk_load_options.mmap). --verify runs the reference cases recorded at optimize time and
// prints the report `bladepack verify` prints (exit status 1 when a case fails).
//
// --device cuda[:N] runs the artifact's native CUDA plan on that GPU (the inputs are copied to the
// device and the outputs back per call; latency statistics then include those copies). With
// --dlpack-device and --repeat N it also times N calls of bpk_model_run_dlpack the way a framework
// makes them: the inputs in device memory (copied there once), a stream of its own, results allocated
// by the runtime and released after each call; each call's time is its enqueue (nothing waits).
//
// --lengths N,N,... makes a packed call (bpk_model_run_packed: an artifact optimized with packed=True),
// the inputs holding the sequences one after the other, one length per sequence.
//
// Without inputs it prints the signature. Each output is written as DIR/<name>.npy; with --repeat N
// the model runs N more times (the files hold the last call's results) and latency statistics are
// printed. --cuda-graphs N keeps N CUDA graphs per stream (-1: off; the default 64; Note [CUDA graphs]). Exit status: 0, 1 for a load or run
// error (the runtime's reason on stderr), 2 for a usage error.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <numeric>
#include <string>
#include <vector>

#include "bladepack/runtime.h"
#include "npy.h"

namespace {

const char kUsage[] =
    "usage: bpk-run MODEL.bpk [--input NAME=FILE.npy ...] [--output-dir DIR] [--device cpu|cuda[:N]]\n"
    "               [--repeat N] [--cuda-graphs N] [--threads N] [--no-verify] [--sha256 HEX] [--trusted-key KEY ...]\n"
    "               [--on-out-of-range DIM=POLICY ...] [--mmap | --no-mmap] [--dlpack-device] [--lengths N,N,...]\n"
    "       bpk-run MODEL.bpk --verify [--threads N] [--no-verify] [--sha256 HEX] [--trusted-key KEY ...]\n";

int usage(const std::string& why) {
  std::fprintf(stderr, "bpk-run: %s\n%s", why.c_str(), kUsage);
  return 2;
}

bool from_hex(const std::string& text, uint8_t* out, size_t n) {
  if (text.size() != 2 * n) return false;
  for (size_t i = 0; i < n; ++i) {
    unsigned v = 0;
    if (std::sscanf(text.c_str() + 2 * i, "%2x", &v) != 1 || !std::isxdigit(text[2 * i]) ||
        !std::isxdigit(text[2 * i + 1]))
      return false;
    out[i] = uint8_t(v);
  }
  return true;
}

// The 32-byte key of a PEM Ed25519 public key (SubjectPublicKeyInfo: a fixed 12-byte DER prefix, then the key).
bool from_pem(const std::string& pem, uint8_t* out) {
  const size_t b = pem.find("-----BEGIN PUBLIC KEY-----"), e = pem.find("-----END PUBLIC KEY-----");
  if (b == std::string::npos || e == std::string::npos || e < b) return false;
  static const std::string kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::vector<uint8_t> der;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = b + 26; i < e; ++i) {
    const size_t v = kAlphabet.find(pem[i]);
    if (v == std::string::npos) continue;  // line breaks, padding
    acc = (acc << 6) | uint32_t(v);
    if ((bits += 6) >= 8) {
      bits -= 8;
      der.push_back(uint8_t(acc >> bits));
    }
  }
  static const uint8_t kPrefix[12] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00};
  if (der.size() != 44 || std::memcmp(der.data(), kPrefix, 12) != 0) return false;
  std::memcpy(out, der.data() + 12, 32);
  return true;
}

// A trusted key from 64 hex digits, or a file holding them or a PEM Ed25519 public key.
bool read_key(const std::string& arg, uint8_t* out) {
  if (from_hex(arg, out, 32)) return true;
  std::ifstream f(arg);
  if (!f) return false;
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  return from_hex(text, out, 32) || from_pem(text, out);
}

int runtime_error(bpk_status s) {
  std::fprintf(stderr, "bpk-run: %s: %s\n", bpk_status_name(s), bpk_last_error());
  return 1;
}

std::string shape_text(const int64_t* d, int32_t n) {
  std::string s = "[";
  for (int32_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double pos = q * double(v.size() - 1);
  const size_t lo = size_t(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

}  // namespace

// --dlpack-device: `repeat` calls of bpk_model_run_dlpack on device copies of `in`, on a stream of its
// own, each call's enqueue time; the driver (libcuda.so.1, as the runtime finds it) makes the copies.
int time_dlpack(bpk_model* model, const std::vector<bpk_tensor>& in, long repeat) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  using Alloc = int (*)(uint64_t*, size_t);
  using Copy = int (*)(uint64_t, const void*, size_t);
  using Free = int (*)(uint64_t);
  using StreamCreate = int (*)(void**, unsigned);
  using Sync = int (*)(void*);
  auto alloc = lib ? reinterpret_cast<Alloc>(dlsym(lib, "cuMemAlloc_v2")) : nullptr;
  auto htod = lib ? reinterpret_cast<Copy>(dlsym(lib, "cuMemcpyHtoD_v2")) : nullptr;
  auto free_ = lib ? reinterpret_cast<Free>(dlsym(lib, "cuMemFree_v2")) : nullptr;
  auto stream_create = lib ? reinterpret_cast<StreamCreate>(dlsym(lib, "cuStreamCreate")) : nullptr;
  auto sync = lib ? reinterpret_cast<Sync>(dlsym(lib, "cuStreamSynchronize")) : nullptr;
  if (!alloc || !htod || !free_ || !stream_create || !sync) {
    std::fprintf(stderr, "bpk-run: --dlpack-device needs the CUDA driver (libcuda.so.1)\n");
    if (lib) dlclose(lib);
    return 1;
  }
  static constexpr DLDataType kDL[] = {
      {kDLFloat, 32, 1}, {kDLFloat, 64, 1}, {kDLFloat, 16, 1}, {kDLBfloat, 16, 1}, {kDLInt, 64, 1},
      {kDLInt, 32, 1},   {kDLInt, 16, 1},   {kDLInt, 8, 1},    {kDLUInt, 8, 1},    {kDLBool, 8, 1},
  };
  std::vector<uint64_t> mem(in.size(), 0);
  std::vector<DLTensor> dl(in.size());
  std::vector<std::vector<int64_t>> shapes(in.size());
  for (size_t k = 0; k < in.size(); ++k) {
    size_t n = bpk_dtype_size(in[k].dtype);
    for (int32_t a = 0; a < in[k].ndim; ++a) n *= size_t(in[k].shape[a]);
    alloc(&mem[k], std::max<size_t>(n, 1));
    htod(mem[k], in[k].data, n);
    shapes[k].assign(in[k].shape, in[k].shape + in[k].ndim);
    std::memset(&dl[k], 0, sizeof dl[k]);
    dl[k].data = reinterpret_cast<void*>(mem[k]);
    dl[k].device = {kDLCUDA, 0};
    dl[k].ndim = in[k].ndim;
    dl[k].dtype = kDL[in[k].dtype];
    dl[k].shape = shapes[k].data();
  }
  std::vector<const DLTensor*> ins;
  for (const DLTensor& t : dl) ins.push_back(&t);
  const bpk_signature* sig = nullptr;
  bpk_model_signature(model, &sig);
  std::vector<DLManagedTensorVersioned*> outs(size_t(sig->num_outputs), nullptr);
  void* stream = nullptr;
  stream_create(&stream, 1);
  const bpk_run_options options{0, stream};
  std::vector<double> us;
  int rc = 0;
  for (long r = 0; r < repeat + 3 && rc == 0; ++r) {  // three warm-up calls: plain, captured, replayed
    std::fill(outs.begin(), outs.end(), nullptr);
    const auto a = std::chrono::steady_clock::now();
    const bpk_status s = bpk_model_run_dlpack(model, ins.data(), int64_t(ins.size()), outs.data(), int64_t(outs.size()),
                                              &options);
    const double t = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count();
    if (s != BPK_OK) rc = runtime_error(s);
    if (r >= 3) us.push_back(t);
    for (DLManagedTensorVersioned* o : outs)
      if (o != nullptr) o->deleter(o);
  }
  sync(stream);
  if (rc == 0 && bpk_model_synchronize(model, stream) != BPK_OK) rc = runtime_error(BPK_ERR_INDEX);
  if (rc == 0)
    std::printf("dlpack device latency over %ld runs (us): min %.1f  median %.1f  p90 %.1f\n", repeat,
                *std::min_element(us.begin(), us.end()), percentile(us, 0.5), percentile(us, 0.9));
  for (uint64_t p : mem) free_(p);
  dlclose(lib);
  return rc;
}

int main(int argc, char** argv) {
  std::string model_path, out_dir, device = "cpu";
  std::vector<std::pair<std::string, std::string>> inputs;
  long repeat = 0;
  long graphs = 0;
  bool verify = false;
  bool dlpack_device = false;
  bpk_load_options opts{0, 0, nullptr, nullptr, 0, nullptr, nullptr, 0, -1};
  std::string pinned, policies;
  std::vector<uint8_t> keys;
  std::vector<int64_t> lengths;  // --lengths: a packed call (bpk_model_run_packed), one length per sequence
  bool packed = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bpk-run: %s needs a value\n%s", flag, kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--input") {
      const std::string v = value("--input");
      const size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) return usage("--input takes NAME=FILE.npy, got '" + v + "'");
      inputs.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (a == "--output-dir") {
      out_dir = value("--output-dir");
    } else if (a == "--device") {
      device = value("--device");
    } else if (a == "--cuda-graphs") {
      char* end = nullptr;
      const std::string v = value("--cuda-graphs");
      graphs = std::strtol(v.c_str(), &end, 10);
      if (*end || v.empty() || graphs < -1 || graphs > 1 << 20)
        return usage("--cuda-graphs takes -1 (off) or a count, got '" + v + "'");
    } else if (a == "--repeat") {
      char* end = nullptr;
      const std::string v = value("--repeat");
      repeat = std::strtol(v.c_str(), &end, 10);
      if (*end || repeat < 0) return usage("--repeat takes a non-negative count, got '" + v + "'");
    } else if (a == "--threads") {
      const std::string v = value("--threads");
      char* end = nullptr;
      opts.num_threads = int32_t(std::strtol(v.c_str(), &end, 10));
      if (*end || opts.num_threads < 1) return usage("--threads takes a positive count, got '" + v + "'");
    } else if (a == "--lengths") {
      const std::string v = value("--lengths");
      packed = true;
      for (size_t at = 0; at <= v.size();) {
        const size_t comma = std::min(v.find(',', at), v.size());
        char* end = nullptr;
        const std::string item = v.substr(at, comma - at);
        lengths.push_back(std::strtoll(item.c_str(), &end, 10));
        if (item.empty() || *end) return usage("--lengths takes comma-separated integers, got '" + v + "'");
        at = comma + 1;
      }
    } else if (a == "--no-verify") {
      opts.flags |= BPK_LOAD_SKIP_SECTION_CHECKSUMS;
    } else if (a == "--mmap" || a == "--no-mmap") {
      opts.flags |= BPK_LOAD_MAPPING;
      opts.mmap = a == "--mmap" ? 1 : 0;
    } else if (a == "--sha256") {
      pinned = value("--sha256");
      opts.flags |= BPK_LOAD_TRUST;
    } else if (a == "--trusted-key") {
      const std::string v = value("--trusted-key");
      uint8_t key[32];
      if (!read_key(v, key))
        return usage("--trusted-key takes 64 hex digits or a file with them or a PEM Ed25519 public key, got '" + v +
                     "'");
      keys.insert(keys.end(), key, key + 32);
      opts.flags |= BPK_LOAD_TRUST;
    } else if (a == "--on-out-of-range") {
      const std::string v = value("--on-out-of-range");
      if (v.find('=') == std::string::npos) return usage("--on-out-of-range takes DIM=POLICY, got '" + v + "'");
      policies += (policies.empty() ? "" : ",") + v;
      opts.flags |= BPK_LOAD_OUT_OF_RANGE;
    } else if (a == "--verify") {
      verify = true;
    } else if (a == "--dlpack-device") {
      dlpack_device = true;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (!a.empty() && a[0] == '-') {
      return usage("unknown option " + a);
    } else if (model_path.empty()) {
      model_path = a;
    } else {
      return usage("more than one model given: " + model_path + ", " + a);
    }
  }
  if (model_path.empty()) return usage("no model given");
  opts.sha256 = pinned.empty() ? nullptr : pinned.c_str();
  opts.trusted_keys = keys.empty() ? nullptr : keys.data();
  opts.n_trusted_keys = keys.size() / 32;
  opts.on_out_of_range = policies.empty() ? nullptr : policies.c_str();
  const bool cuda_n = device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
                      device.find_first_not_of("0123456789", 5) == std::string::npos;
  if (device != "cpu" && device != "cuda" && !cuda_n)
    return usage("--device is cpu, cuda or cuda:N, got '" + device + "'");
  if (device != "cpu") {
    opts.flags |= BPK_LOAD_DEVICE;
    opts.device = device.c_str();
    opts.cuda_graphs = int32_t(graphs);
  }

  bpk_model* model = nullptr;
  const auto t0 = std::chrono::steady_clock::now();
  if (bpk_status s = bpk_model_load(model_path.c_str(), &opts, &model)) return runtime_error(s);
  const double load_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const bpk_signature* sig = nullptr;
  bpk_model_signature(model, &sig);
  if (verify) {
    if (!inputs.empty()) {
      bpk_model_free(model);
      return usage("--verify runs the recorded reference cases: give no --input");
    }
    char* report = nullptr;
    const bpk_status s = bpk_model_verify(model, &report);
    if (report != nullptr) std::fputs(report, stdout);
    bpk_free(report);
    bpk_model_free(model);
    if (s == BPK_ERR_VERIFY) return 1;
    return s == BPK_OK ? 0 : runtime_error(s);
  }
  if (inputs.empty()) {
    std::printf("%s\nexecutor: %s\nloaded in %.2f ms\n", sig->text, bpk_model_executor(model), load_ms);
    bpk_model_free(model);
    return 0;
  }

  std::map<std::string, npy::Array> arrays;
  for (const auto& [name, file] : inputs) {
    bool known = false;
    for (int64_t k = 0; k < sig->num_inputs; ++k) known |= name == sig->inputs[k].name;
    if (!known) {
      std::string names;
      for (int64_t k = 0; k < sig->num_inputs; ++k) names += (k ? ", " : "") + std::string(sig->inputs[k].name);
      bpk_model_free(model);
      return usage("unknown input '" + name + "'; the model's inputs are " + names);
    }
    try {
      arrays.emplace(name, npy::read(file));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bpk-run: %s\n", e.what());
      bpk_model_free(model);
      return 1;
    }
  }
  std::vector<bpk_tensor> in(size_t(sig->num_inputs));
  for (int64_t k = 0; k < sig->num_inputs; ++k) {
    auto it = arrays.find(sig->inputs[k].name);
    if (it == arrays.end()) {
      bpk_model_free(model);
      return usage(std::string("missing --input ") + sig->inputs[k].name + "=FILE.npy");
    }
    bpk_tensor& t = in[size_t(k)];
    std::memset(&t, 0, sizeof t);
    t.data = it->second.aligned;
    t.dtype = it->second.dtype;
    t.ndim = int32_t(it->second.shape.size());
    std::copy(it->second.shape.begin(), it->second.shape.end(), t.shape);
  }
  std::vector<bpk_tensor> out(size_t(sig->num_outputs));
  for (auto& o : out) std::memset(&o, 0, sizeof o);
  const auto call = [&] {
    return packed ? bpk_model_run_packed(model, in.data(), int64_t(in.size()), lengths.data(), int64_t(lengths.size()),
                                         out.data(), int64_t(out.size()))
                  : bpk_model_run(model, in.data(), int64_t(in.size()), out.data(), int64_t(out.size()));
  };
  if (bpk_status s = call()) {
    bpk_model_free(model);
    return runtime_error(s);
  }
  int rc = 0;
  std::vector<double> us;  // --repeat: into the same buffers, what a server does call after call
  for (long r = 0; r < repeat; ++r) {
    const auto a = std::chrono::steady_clock::now();
    if (bpk_status s = call()) {
      rc = runtime_error(s);
      break;
    }
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - a).count());
  }
  for (int64_t k = 0; k < sig->num_outputs && rc == 0; ++k) {  // the last call's results
    const bpk_tensor& o = out[size_t(k)];
    std::printf("%s: %s%s\n", sig->outputs[k].name, bpk_dtype_name(o.dtype), shape_text(o.shape, o.ndim).c_str());
    if (!out_dir.empty()) {
      try {
        npy::write(out_dir + "/" + sig->outputs[k].name + ".npy", o.dtype, std::vector<int64_t>(o.shape, o.shape + o.ndim),
                   o.data);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "bpk-run: %s\n", e.what());
        rc = 1;
      }
    }
  }
  if (repeat > 0 && rc == 0)
    std::printf("latency over %ld runs (us): min %.1f  median %.1f  mean %.1f  p90 %.1f  p99 %.1f  max %.1f\n",
                repeat, *std::min_element(us.begin(), us.end()), percentile(us, 0.5),
                std::accumulate(us.begin(), us.end(), 0.0) / double(us.size()), percentile(us, 0.9),
                percentile(us, 0.99), *std::max_element(us.begin(), us.end()));
  if (dlpack_device && repeat > 0 && rc == 0) rc = time_dlpack(model, in, repeat);
  for (auto& o : out) bpk_free(o.data);
  bpk_model_free(model);
  return rc;
}
