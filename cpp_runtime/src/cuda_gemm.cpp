#include "cuda_gemm.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>

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
  // as bladepack/loader/gemm_args.py: the library's batch is the innermost dim that is not 1, merged
  // with each dim outside it whose strides are its own times its length; the host loops over the rest
  struct Dim {
    int64_t n;
    std::array<int64_t, 4> s;
  };
  const std::array<int64_t, 4> src0{0, 0, 0, 0};
  std::array<Dim, 3> dims{};
  for (int i = 0; i < 3; ++i)
    dims[size_t(i)] = {v[size_t(i)], {v[size_t(3 + i)], v[size_t(6 + i)], v[size_t(9 + i)], v.size() > 20 ? v[size_t(20 + i)] : 0}};
  GemmArgs g;
  g.m = v[12], g.n = v[13], g.k = v[14], g.ta = v[15] != 0, g.tb = v[16] != 0, g.lda = v[17], g.ldb = v[18],
  g.ldc = v[19];
  if (v.size() > 20) g.ld_src = v[23];
  if (g.m == 0 || g.n == 0 || dims[0].n == 0 || dims[1].n == 0 || dims[2].n == 0) return g;
  std::vector<Dim> outer;
  for (const Dim& d : dims)
    if (d.n != 1) outer.push_back(d);
  Dim lib{1, src0};
  if (!outer.empty()) lib = outer.back(), outer.pop_back();
  int64_t count = lib.n;
  while (!outer.empty()) {
    const Dim& o = outer.back();
    bool chains = true;
    for (size_t j = 0; j < 4; ++j) chains = chains && o.s[j] == lib.s[j] * count;
    if (!chains) break;
    count *= o.n;
    outer.pop_back();
  }
  g.count = count, g.stride_a = lib.s[0], g.stride_b = lib.s[1], g.stride_c = lib.s[2], g.stride_src = lib.s[3];
  std::vector<std::array<int64_t, 4>> offsets{src0};
  for (const Dim& d : outer) {
    std::vector<std::array<int64_t, 4>> next;
    for (const auto& base : offsets)
      for (int64_t j = 0; j < d.n; ++j)
        next.push_back({base[0] + j * d.s[0] * item, base[1] + j * d.s[1] * item, base[2] + j * d.s[2] * item,
                        base[3] + j * d.s[3] * item});
    offsets = std::move(next);
  }
  g.steps = std::move(offsets);
  return g;
}

namespace {

// The first of `names` (with `knob`'s path alone when set, else each name as is, then in $CUDA_HOME/lib64
// and /usr/local/cuda/lib64) that dlopen loads; BPK_ERR_UNSUPPORTED listing what was tried otherwise.
void* open_library(const char* knob, const std::vector<std::string>& names, const std::string& what,
                   std::string* path) {
  std::vector<std::string> candidates;
  const char* env = std::getenv(knob);
  if (env && *env) {
    candidates.push_back(env);
  } else {
    candidates = names;
    const char* home = std::getenv("CUDA_HOME");
    for (const std::string& root : {std::string(home && *home ? home : ""), std::string("/usr/local/cuda")})
      if (!root.empty())
        for (const std::string& name : names) candidates.push_back(root + "/lib64/" + name);
  }
  std::string list;
  for (const auto& c : candidates) {
    list += (list.empty() ? "" : ", ") + c;
    if (void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *path = c;
      return lib;
    }
  }
  fail(BPK_ERR_UNSUPPORTED, "this artifact runs its GEMMs with " + what + ", and no " + names.back().substr(0, names.back().find('.')) +
                                " was found (tried: " + list + "); install nvidia-cublas or set " + knob + "=path");
}

}  // namespace

Cublas::Cublas() {
  std::string path;
  lib_ = open_library("BLADEPACK_CUBLAS", {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, "cuBLAS", &path);
  auto create = reinterpret_cast<int (*)(void**)>(dlsym(lib_, "cublasCreate_v2"));
  set_stream_ = reinterpret_cast<decltype(set_stream_)>(dlsym(lib_, "cublasSetStream_v2"));
  destroy_ = reinterpret_cast<decltype(destroy_)>(dlsym(lib_, "cublasDestroy_v2"));
  gemm_ = reinterpret_cast<decltype(gemm_)>(dlsym(lib_, "cublasGemmStridedBatchedEx"));
  if (!create || !set_stream_ || !destroy_ || !gemm_) {
    dlclose(lib_);
    fail(BPK_ERR_UNSUPPORTED, path + " lacks cublasCreate_v2 / cublasGemmStridedBatchedEx");
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

// cublasLt.h's values (CUDA 12 and 13 ABI): matmul descriptor, layout and preference attributes
constexpr int kDescTransA = 3, kDescTransB = 4, kDescEpilogue = 7, kDescBiasPointer = 8, kDescBiasBatchStride = 10;
constexpr int kLayoutBatchCount = 5, kLayoutStridedBatchOffset = 6;
constexpr int kPrefMaxWorkspace = 1, kPrefMinAlignment[4] = {5, 6, 7, 8};
constexpr int kScale32F = 0, kScale64F = 1;

struct LtPlan {
  void* desc = nullptr;
  void* layouts[4] = {};  // cuBLASLt's A (our B), B (our A), C, D
  bool bias = false, residual = false, wide = false;
  std::mutex mu;  // the bias pointer attribute, set per call; the algorithms
  std::map<uint32_t, std::array<uint64_t, 8>> algos;  // operand alignment -> the heuristic's algorithm
  int (*layout_destroy)(void*) = nullptr;
  int (*desc_destroy)(void*) = nullptr;
  ~LtPlan() {
    for (void* l : layouts)
      if (l) layout_destroy(l);
    if (desc) desc_destroy(desc);
  }
};

namespace {
struct HeuristicResult {  // cublasLtMatmulHeuristicResult_t
  uint64_t algo[8];
  size_t workspace;
  int state;
  float waves;
  int reserved[4];
};
void lt_check(int status, const char* call) {
  if (status) fail(BPK_ERR_EXECUTION, std::string(call) + " failed: cublasStatus_t " + std::to_string(status));
}
}  // namespace

CublasLt::CublasLt() {
  std::string path;
  lib_ = open_library("BLADEPACK_CUBLASLT", {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"}, "cuBLASLt",
                      &path);
  bool all = true;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib_, name));
    all = all && fn != nullptr;
  };
  int (*create)(void**) = nullptr;
  sym(create, "cublasLtCreate");
  sym(destroy_, "cublasLtDestroy");
  sym(desc_create_, "cublasLtMatmulDescCreate");
  sym(desc_set_, "cublasLtMatmulDescSetAttribute");
  sym(desc_destroy_, "cublasLtMatmulDescDestroy");
  sym(layout_create_, "cublasLtMatrixLayoutCreate");
  sym(layout_set_, "cublasLtMatrixLayoutSetAttribute");
  sym(layout_destroy_, "cublasLtMatrixLayoutDestroy");
  sym(pref_create_, "cublasLtMatmulPreferenceCreate");
  sym(pref_set_, "cublasLtMatmulPreferenceSetAttribute");
  sym(pref_destroy_, "cublasLtMatmulPreferenceDestroy");
  sym(heuristic_, "cublasLtMatmulAlgoGetHeuristic");
  sym(matmul_, "cublasLtMatmul");
  if (!all) {
    dlclose(lib_);
    fail(BPK_ERR_UNSUPPORTED, path + " lacks the cublasLt entry points (not a cuBLASLt library)");
  }
  if (const int status = create(&handle_)) {
    dlclose(lib_);
    fail(BPK_ERR_EXECUTION, "cublasLtCreate failed: cublasStatus_t " + std::to_string(status));
  }
}

CublasLt::~CublasLt() {
  plans_.clear();
  if (handle_) destroy_(handle_);
}

LtLaunch CublasLt::prepare(const LaunchDecl& l, int64_t dtype, const GemmArgs& g) const {
  if (std::max({g.m, g.n, g.k, g.count}) > kIntMax)
    fail(BPK_ERR_EXECUTION, "GEMM " + std::to_string(g.m) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k) +
                                " (batch " + std::to_string(g.count) + ") exceeds cuBLASLt's 32-bit sizes");
  const bool bias = l.lt_source == "bias", residual = l.lt_source == "residual";
  std::vector<int64_t> key{dtype,      int64_t(l.lt_epilogue), residual, g.m,        g.n,        g.k,
                           g.ta,       g.tb,                   g.lda,    g.ldb,      g.ldc,      g.count,
                           g.stride_a, g.stride_b,             g.stride_c, g.ld_src, g.stride_src};
  LtLaunch out;
  out.steps = g.steps;
  for (const auto& st : g.steps)
    for (int64_t o : st) out.step_bits |= uint64_t(o);
  std::lock_guard<std::mutex> lock(plans_mu_);
  auto it = plans_.find(key);
  if (it != plans_.end()) {
    out.plan = it->second;
    return out;
  }
  if (plans_.size() >= kPlansMax) plans_.clear();  // a bound across shapes; prepared signatures keep theirs
  auto p = std::make_shared<LtPlan>();  // (what a failing call below leaves is destroyed with it)
  p->bias = bias, p->residual = residual, p->wide = dtype == 1;
  p->layout_destroy = layout_destroy_, p->desc_destroy = desc_destroy_;
  LtPlan& plan = *p;
  lt_check(desc_create_(&plan.desc, plan.wide ? kCompute64F : kCompute32F, plan.wide ? kScale64F : kScale32F),
           "cublasLtMatmulDescCreate");
  auto desc_set = [&](int attr, const void* v, size_t n) {
    lt_check(desc_set_(plan.desc, attr, v, n), "cublasLtMatmulDescSetAttribute");
  };
  const int32_t transa = g.tb ? kOpT : kOpN, transb = g.ta ? kOpT : kOpN;
  const uint32_t epilogue = l.lt_epilogue;
  const int64_t zero = 0;
  desc_set(kDescTransA, &transa, 4);
  desc_set(kDescTransB, &transb, 4);
  desc_set(kDescEpilogue, &epilogue, 4);
  if (bias) desc_set(kDescBiasBatchStride, &zero, 8);
  struct Shape {
    uint64_t rows, cols;
    int64_t ld, stride;
  };
  const Shape shapes[4] = {
      {uint64_t(g.tb ? g.k : g.n), uint64_t(g.tb ? g.n : g.k), g.ldb, g.stride_b},  // cuBLASLt's A: our B
      {uint64_t(g.ta ? g.m : g.k), uint64_t(g.ta ? g.k : g.m), g.lda, g.stride_a},  // its B: our A
      residual ? Shape{uint64_t(g.n), uint64_t(g.m), g.ld_src, g.stride_src} : Shape{uint64_t(g.n), uint64_t(g.m), g.ldc, g.stride_c},
      {uint64_t(g.n), uint64_t(g.m), g.ldc, g.stride_c},
  };
  const int type = kCudaTypes[dtype];
  const int32_t count = int32_t(g.count);
  for (int i = 0; i < 4; ++i) {
    lt_check(layout_create_(&plan.layouts[i], type, shapes[i].rows, shapes[i].cols, shapes[i].ld),
             "cublasLtMatrixLayoutCreate");
    lt_check(layout_set_(plan.layouts[i], kLayoutBatchCount, &count, 4), "cublasLtMatrixLayoutSetAttribute");
    lt_check(layout_set_(plan.layouts[i], kLayoutStridedBatchOffset, &shapes[i].stride, 8),
             "cublasLtMatrixLayoutSetAttribute");
  }
  plans_[key] = p;
  out.plan = std::move(p);
  return out;
}

const void* CublasLt::algo(LtPlan& p, uint32_t align) const {
  // (under p.mu) cuBLASLt's heuristic's first algorithm for operands aligned to `align` bytes
  auto it = p.algos.find(align);
  if (it != p.algos.end()) return it->second.data();
  void* pref = nullptr;
  lt_check(pref_create_(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = kWorkspace;
  int status = pref_set_(pref, kPrefMaxWorkspace, &workspace, 8);
  for (int attr : kPrefMinAlignment) status = status ? status : pref_set_(pref, attr, &align, 4);
  HeuristicResult r{};
  int count = 0;
  if (status == 0)
    status = heuristic_(handle_, p.desc, p.layouts[0], p.layouts[1], p.layouts[2], p.layouts[3], pref, 1, &r, &count);
  pref_destroy_(pref);
  if (status != 0 || count < 1 || r.state != 0)
    fail(BPK_ERR_EXECUTION, std::string("cuBLASLt has no algorithm for this GEMM (epilogue ") +
                                (p.bias ? "bias" : p.residual ? "residual" : "none") + ", operands aligned to " +
                                std::to_string(align) + " bytes): cublasLtMatmulAlgoGetHeuristic returned status " +
                                std::to_string(status) + ", " + std::to_string(count) + " results");
  if (r.workspace > kWorkspace)
    fail(BPK_ERR_EXECUTION, "cuBLASLt asked for " + std::to_string(r.workspace) +
                                " bytes of workspace; it was offered " + std::to_string(kWorkspace));
  auto& slot = p.algos[align];
  std::copy(std::begin(r.algo), std::end(r.algo), slot.begin());
  return slot.data();
}

void CublasLt::launch(const LtLaunch& l, CUdeviceptr a, CUdeviceptr b, CUdeviceptr d, CUdeviceptr src, bool has_src,
                      CUstream stream, CUdeviceptr workspace) const {
  if (l.steps.empty()) return;
  LtPlan& p = *l.plan;
  uint64_t bits = a | b | d | (has_src ? src : 0) | l.step_bits;
  const uint32_t align = bits ? uint32_t(std::min<uint64_t>(bits & (~bits + 1), 256)) : 256u;
  const float one32 = 1.0f, zero32 = 0.0f;
  const double one64 = 1.0, zero64 = 0.0;
  const void* one = p.wide ? static_cast<const void*>(&one64) : &one32;
  const void* beta = p.residual ? one : (p.wide ? static_cast<const void*>(&zero64) : &zero32);
  std::lock_guard<std::mutex> lock(p.mu);  // the algorithms; a bias GEMM's pointer attribute
  const void* algo = this->algo(p, align);
  for (const auto& st : l.steps) {
    const CUdeviceptr dd = d + uint64_t(st[2]);
    const CUdeviceptr cc = p.residual && has_src ? src + uint64_t(st[3]) : dd;
    if (p.bias && has_src) {
      const uint64_t bias = src + uint64_t(st[3]);
      lt_check(desc_set_(p.desc, kDescBiasPointer, &bias, 8), "cublasLtMatmulDescSetAttribute");
    }
    lt_check(matmul_(handle_, p.desc, one, reinterpret_cast<const void*>(b + uint64_t(st[1])), p.layouts[0],
                     reinterpret_cast<const void*>(a + uint64_t(st[0])), p.layouts[1], beta,
                     reinterpret_cast<const void*>(cc), p.layouts[2], reinterpret_cast<void*>(dd), p.layouts[3], algo,
                     reinterpret_cast<void*>(workspace), kWorkspace, stream),
             "cublasLtMatmul");
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
