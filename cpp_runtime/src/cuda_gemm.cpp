#include "cuda_gemm.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "errors.h"

namespace bpk::cuda {
namespace {

constexpr int64_t kIntMax = 2147483647;
constexpr int kOpN = 0, kOpT = 1, kCompute32F = 68, kCompute64F = 70, kGemmDefault = -1;
constexpr int kCudaTypes[4] = {0, 1, 2, 14};  // cudaDataType of f32, f64, f16, bf16 (the record's codes)
constexpr int64_t kParamsCapacity = 4096;

std::string list_text(const int64_t* v, size_t n) {
  std::string s = "[";
  for (size_t i = 0; i < n; ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

GemmArgs gemm_args(const std::vector<int64_t>& v, int64_t item) {
  std::array<int64_t, 3> batch{v[0], v[1], v[2]}, sa{v[3], v[4], v[5]}, sb{v[6], v[7], v[8]}, sc{v[9], v[10], v[11]};
  std::array<int64_t, 3> ss{0, 0, 0};
  GemmArgs g;
  g.m = v[12], g.n = v[13], g.k = v[14], g.ta = v[15] != 0, g.tb = v[16] != 0, g.lda = v[17], g.ldb = v[18],
  g.ldc = v[19];
  if (v.size() > 20) ss = {v[20], v[21], v[22]}, g.ld_src = v[23];
  if (batch[2] == 1) {  // the middle batch dim as the library's batch
    batch = {batch[0], 1, batch[1]};
    for (auto* s : {&sa, &sb, &sc, &ss}) *s = {(*s)[0], 0, (*s)[1]};
  }
  g.count = batch[2], g.stride_a = sa[2], g.stride_b = sb[2], g.stride_c = sc[2], g.stride_src = ss[2];
  const bool empty = g.m == 0 || g.n == 0 || batch[0] == 0 || batch[1] == 0 || batch[2] == 0;
  for (int64_t b0 = 0; b0 < (empty ? 0 : batch[0]); ++b0)
    for (int64_t b1 = 0; b1 < batch[1]; ++b1)
      g.steps.push_back({(b0 * sa[0] + b1 * sa[1]) * item, (b0 * sb[0] + b1 * sb[1]) * item,
                         (b0 * sc[0] + b1 * sc[1]) * item, (b0 * ss[0] + b1 * ss[1]) * item});
  return g;
}

Cublas::Cublas() {
  std::vector<std::string> tried;
  const char* env = std::getenv("BLADEPACK_CUBLAS");
  std::vector<std::string> candidates;
  if (env && *env) {
    candidates.push_back(env);
  } else {
    candidates = {"libcublas.so.13", "libcublas.so.12", "libcublas.so"};
    const char* home = std::getenv("CUDA_HOME");
    for (const std::string& root : {std::string(home && *home ? home : ""), std::string("/usr/local/cuda")})
      if (!root.empty())
        for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so"})
          candidates.push_back(root + "/lib64/" + name);
  }
  for (const auto& path : candidates) {
    tried.push_back(path);
    if ((lib_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL))) break;
  }
  if (lib_ == nullptr) {
    std::string list;
    for (const auto& t : tried) list += (list.empty() ? "" : ", ") + t;
    fail(BPK_ERR_UNSUPPORTED, "this artifact runs its GEMMs with cuBLAS, and no libcublas was found (tried: " + list +
                                  "); install nvidia-cublas or set BLADEPACK_CUBLAS=path");
  }
  auto create = reinterpret_cast<int (*)(void**)>(dlsym(lib_, "cublasCreate_v2"));
  set_stream_ = reinterpret_cast<decltype(set_stream_)>(dlsym(lib_, "cublasSetStream_v2"));
  destroy_ = reinterpret_cast<decltype(destroy_)>(dlsym(lib_, "cublasDestroy_v2"));
  gemm_ = reinterpret_cast<decltype(gemm_)>(dlsym(lib_, "cublasGemmStridedBatchedEx"));
  if (!create || !set_stream_ || !destroy_ || !gemm_) {
    dlclose(lib_);
    fail(BPK_ERR_UNSUPPORTED, tried.back() + " lacks cublasCreate_v2 / cublasGemmStridedBatchedEx");
  }
  if (const int status = create(&handle_)) {
    dlclose(lib_);
    fail(BPK_ERR_EXECUTION, "cublasCreate failed: cublasStatus_t " + std::to_string(status));
  }
}

Cublas::~Cublas() {
  if (handle_) destroy_(handle_);
  if (lib_) dlclose(lib_);
}

void Cublas::gemm(int64_t dtype, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, const GemmArgs& g,
                  CUstream stream) const {
  if (std::max({g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.count}) > kIntMax)
    fail(BPK_ERR_EXECUTION, "GEMM " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) +
                                " exceeds cuBLAS's 32-bit sizes");
  if (g.steps.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (const int s = set_stream_(handle_, stream))
    fail(BPK_ERR_EXECUTION, "cublasSetStream failed: cublasStatus_t " + std::to_string(s));
  const int t = kCudaTypes[dtype];
  const bool wide = dtype == 1;
  const float one32 = 1.0f, zero32 = 0.0f;
  const double one64 = 1.0, zero64 = 0.0;
  const void* one = wide ? static_cast<const void*>(&one64) : &one32;
  const void* zero = wide ? static_cast<const void*>(&zero64) : &zero32;
  for (const auto& st : g.steps) {
    // column-major C^T (n x m) = op(B)^T . op(A)^T
    const int s = gemm_(handle_, g.tb ? kOpT : kOpN, g.ta ? kOpT : kOpN, int(g.n), int(g.m), int(g.k), one,
                        reinterpret_cast<const void*>(b + uint64_t(st[1])), t, int(g.ldb), g.stride_b,
                        reinterpret_cast<const void*>(a + uint64_t(st[0])), t, int(g.lda), g.stride_a, zero,
                        reinterpret_cast<void*>(c + uint64_t(st[2])), t, int(g.ldc), g.stride_c, int(g.count),
                        wide ? kCompute64F : kCompute32F, kGemmDefault);
    if (s) fail(BPK_ERR_EXECUTION, "cublasGemmStridedBatchedEx failed: cublasStatus_t " + std::to_string(s));
  }
}

CutlassGemms::CutlassGemms(const Artifact& artifact, const NativePlan& plan, const Device& device) : device_(device) {
#if !defined(__x86_64__)
  fail(BPK_ERR_UNSUPPORTED, artifact.source() +
                                ": its CUTLASS GEMM packer is built for x86_64 Linux (optimize with "
                                "gemm_library='cublas' for this machine)");
#endif
  const Driver& drv = device.driver();
  packer_ = std::make_unique<MemoryLibrary>(artifact.section_copy(plan.gemm_packer), "cutlass-packer", RTLD_NOW | RTLD_LOCAL);
  if (!packer_->handle())
    fail(BPK_ERR_UNSUPPORTED, artifact.source() + ": the CUTLASS packer failed to load: " + packer_->error());
  // sm_90a kernels dispatch on compute capability 9.0 only with BLADEPACK_HOPPER_GEMMS=1, until their epilogues
  // and speed are measured on a GPU (Note [Hopper GEMMs] in bladepack/library_ops/cutlass/emitter.py); the
  // sm80-class entries run there
  const char* hopper_env = std::getenv("BLADEPACK_HOPPER_GEMMS");
  hopper_ = device.info().major == 9 && device.info().minor == 0 && hopper_env && std::string(hopper_env) == "1";
  const bool any_hopper = std::any_of(plan.gemm_kernels.begin(), plan.gemm_kernels.end(),
                                      [](const GemmKernelDecl& k) { return k.arch == "sm_90a"; });
  if (hopper_ && any_hopper) {
    auto setter = reinterpret_cast<void (*)(void*)>(dlsym(packer_->handle(), "bpk_set_tensor_map_encoder"));
    if (!setter) artifact.fail("the GEMM packer cannot take a TMA encoder (corrupt artifact)");
    void* encode = drv.symbol("cuTensorMapEncodeTiled");
    if (!encode) fail(BPK_ERR_UNSUPPORTED, "the CUDA driver has no cuTensorMapEncodeTiled (it needs CUDA 12.0 or newer)");
    setter(encode);
  }
  for (const GemmKernelDecl& k : plan.gemm_kernels) {
    auto pack = reinterpret_cast<PackFn>(dlsym(packer_->handle(), ("bpk_pack_" + k.name).c_str()));
    if (!pack) artifact.fail("the GEMM packer has no entry for " + k.name);
    names_.push_back(k.name);
    pack_.push_back(pack);
    grid_constant_.push_back(k.arch == "sm_90a");
    if (k.arch == "sm_90a" && !hopper_) {
      kernels_.emplace_back();
      continue;
    }
    const std::vector<uint8_t> image = artifact.section_copy(k.section);  // Note [Hash what runs]
    modules_.push_back(std::make_unique<Module>(drv, image.data(), image.size()));
    kernels_.push_back(std::make_unique<Kernel>(drv, *modules_.back(), k.name));
  }
}

CutlassGemms::~CutlassGemms() = default;

CutlassLaunch CutlassGemms::prepare(const LaunchDecl& l, const int64_t* regs, const std::vector<int64_t>& ints,
                                    int64_t itemsize) const {
  const std::vector<GemmEntry>& entries = hopper_ && !l.entries_sm90.empty() ? l.entries_sm90 : l.entries;
  const GemmEntry* chosen = nullptr;
  for (const GemmEntry& e : entries)
    if (regs[e.pred]) {
      chosen = &e;
      break;
    }
  if (chosen == nullptr) fail(BPK_ERR_FORMAT, "a CUTLASS GEMM launch has no dispatch entry for this shape (corrupt plan)");
  const GemmArgs g = gemm_args(ints, itemsize);
  if (std::max({g.m, g.n, g.k, g.count}) > kIntMax)
    fail(BPK_ERR_EXECUTION, "GEMM " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) +
                                " (batch " + std::to_string(g.count) + ") exceeds CUTLASS's 32-bit problem sizes");
  const bool batched = g.count > 1;
  CutlassLaunch c;
  c.split = batched ? 1 : chosen->split;
  c.ins = {g.m,        g.n,        g.k,          batched ? g.count : c.split, g.lda, g.ldb, g.ld_src, g.ldc,
           g.stride_a, g.stride_b, g.stride_src, g.stride_c,                  int64_t(batched)};
  c.kernel = chosen->kernel;
  c.fallback = entries.back().kernel;
  c.align_bytes = chosen->align * itemsize;
  c.steps = g.steps;
  return c;
}

void CutlassGemms::launch(const CutlassLaunch& l, CUdeviceptr a, CUdeviceptr b, CUdeviceptr d, CUdeviceptr src,
                          bool has_src, CUstream stream, const std::function<CUdeviceptr(size_t)>& semaphores) const {
  if (l.steps.empty()) return;
  int64_t kernel = l.kernel;
  if ((a | b | d | (has_src ? src : 0)) % uint64_t(l.align_bytes)) kernel = l.fallback;  // unaligned operand
  alignas(64) uint8_t params[kParamsCapacity];
  int64_t geometry[10] = {};
  const double scalars[2] = {1.0, has_src ? 1.0 : 0.0};
  const int32_t sms = device_.info().sm_count;
  CUdeviceptr sem = l.split > 1 ? semaphores(0) : 0;
  for (const auto& st : l.steps) {
    uint64_t ptrs[5] = {a + uint64_t(st[0]), b + uint64_t(st[1]), has_src ? src + uint64_t(st[3]) : d + uint64_t(st[2]),
                        d + uint64_t(st[2]), sem};
    auto pack = [&](int64_t k) { return pack_[size_t(k)](l.ins.data(), ptrs, scalars, sms, params, kParamsCapacity, geometry); };
    int rc = pack(kernel);
    if (rc == 1 && kernel != l.fallback) {  // CUTLASS refused the shape: the SIMT fallback runs any
      kernel = l.fallback;
      rc = pack(kernel);
    }
    if (rc == 0 && l.split > 1 && geometry[6] > 0) {
      ptrs[4] = sem = semaphores(size_t(geometry[6]));
      rc = pack(kernel);
    }
    const Kernel* fn = kernels_[size_t(kernel)].get();
    if (rc != 0 || fn == nullptr) {
      const char* why = rc == 1   ? "cannot run this problem"
                        : rc == 2 ? "its Params do not fit"
                        : rc == 3 ? "the driver refused a TMA descriptor"
                        : rc      ? nullptr
                                  : "its sm_90a kernel is not loaded";
      fail(BPK_ERR_EXECUTION, "CUTLASS GEMM " + names_[size_t(kernel)] + ": " +
                                  (why ? std::string(why) : "packer error " + std::to_string(rc)) +
                                  " (in = " + list_text(l.ins.data(), l.ins.size()) + ")");
    }
    const unsigned grid[3] = {unsigned(geometry[0]), unsigned(geometry[1]), unsigned(geometry[2])};
    const unsigned block[3] = {unsigned(geometry[3]), 1, 1};
    const unsigned cluster[3] = {unsigned(geometry[7]), unsigned(geometry[8]), unsigned(geometry[9])};
    if (grid_constant_[size_t(kernel)])  // Note [Grid-constant parameters] in bladepack/loader/cuda_driver.py
      fn->launch_grid_constant(grid, block, params, unsigned(geometry[4]), stream, cluster);
    else
      fn->launch(grid, block, params, size_t(geometry[5]), unsigned(geometry[4]), stream, cluster);
  }
}

}  // namespace bpk::cuda
