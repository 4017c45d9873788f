// GEMM launches of a CUDA plan: cuBLAS (`gemm`), cuBLASLt (`cublaslt`) and CUTLASS (`cutlass`), as the
// Python loader runs them (bladepack/loader/cublas.py, cublaslt.py, cutlass_gemm.py, gemm_args.py).
//
// In: a GEMM record's resolved integers (Note [GEMM records] in bladepack/loader/plan_check.py, and
// for a CUTLASS epilogue source four more), the operands' device addresses and the stream. Out:
// `GemmArgs` (the batch dim the library runs itself and the host loop's byte offsets, resolved once
// per signature), `Cublas` and `CutlassGemms` (kernels loaded once per model, Params built by the
// artifact's packer library loaded from memory, Hopper TMA descriptors through the driver's
// cuTensorMapEncodeTiled, cluster launches through cuLaunchKernelEx).
//
// cuBLAS is found as the Python loader finds it, less Python's own package directories:
// BLADEPACK_CUBLAS=path wins; else libcublas.so.13 / .12 / libcublas.so on the loader's search path;
// else $CUDA_HOME/lib64 and /usr/local/cuda/lib64. cuBLASLt the same way (BLADEPACK_CUBLASLT,
// libcublasLt.so.13 / .12 / libcublasLt.so).
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "artifact.h"
#include "cuda_driver.h"
#include "library_memory.h"
#include "manifest.h"

namespace bpk::cuda {

struct GemmArgs {
  int64_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  int64_t count = 1;  // the library's own batch
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  int64_t ld_src = 0, stride_src = 0;  // the epilogue source's (0 for a bias row or no source)
  std::vector<std::array<int64_t, 4>> steps;  // byte offsets of A, B, C, source per host-loop step
};
GemmArgs gemm_args(const std::vector<int64_t>& ints, int64_t itemsize);

class Cublas {
 public:
  Cublas();  // BPK_ERR_UNSUPPORTED with the paths tried when no libcublas loads
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;
  // C = A.B for one `gemm` record (dtype code: 0 f32, 1 f64, 2 f16, 3 bf16); thread-safe.
  void gemm(int64_t dtype, CUdeviceptr a, CUdeviceptr b, CUdeviceptr c, const GemmArgs& g, CUstream stream) const;

 private:
  void* lib_ = nullptr;
  void* handle_ = nullptr;
  int (*set_stream_)(void*, void*) = nullptr;
  int (*destroy_)(void*) = nullptr;
  int (*gemm_)(void*, int, int, int, int, int, const void*, const void*, int, int, long long, const void*, int, int,
               long long, const void*, void*, int, int, long long, int, int, int) = nullptr;
  mutable std::mutex mu_;  // one handle: its stream is set per call
};

// Note [cuBLASLt GEMMs] (bladepack/loader/cublaslt.py): D = act(A.B [+ C]) through cublasLtMatmul, the
// descriptors made once per distinct shape and epilogue, the algorithm cuBLASLt's heuristic's first
// answer per operand alignment, a fixed workspace per call context.
struct LtPlan;
struct LtLaunch {
  std::shared_ptr<LtPlan> plan;  // shared with the plan cache (descriptors destroyed with the last holder)
  std::vector<std::array<int64_t, 4>> steps;
  uint64_t step_bits = 0;  // every step offset OR-ed (with the addresses: the operands' alignment)
};

class CublasLt {
 public:
  static constexpr size_t kWorkspace = size_t(32) << 20;  // bytes per call context
  static constexpr size_t kPlansMax = 1024;  // shapes the plan cache keeps (emptied when full)
  CublasLt();  // BPK_ERR_UNSUPPORTED with the paths tried when no libcublasLt loads
  ~CublasLt();  // the library stays loaded: descriptors prepared signatures still hold are destroyed later
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;
  // the launch of `l` (dtype code as `Cublas::gemm`) with its ints resolved to `g`; thread-safe
  LtLaunch prepare(const LaunchDecl& l, int64_t dtype, const GemmArgs& g) const;
  // `src` 0 without an epilogue source; `workspace`: kWorkspace bytes of the caller's stream
  void launch(const LtLaunch& l, CUdeviceptr a, CUdeviceptr b, CUdeviceptr d, CUdeviceptr src, bool has_src,
              CUstream stream, CUdeviceptr workspace) const;

 private:
  using SetAttr = int (*)(void*, int, const void*, size_t);
  const void* algo(LtPlan& p, uint32_t align) const;
  void* lib_ = nullptr;
  void* handle_ = nullptr;
  int (*destroy_)(void*) = nullptr;
  int (*desc_create_)(void**, int, int) = nullptr;
  SetAttr desc_set_ = nullptr;
  int (*desc_destroy_)(void*) = nullptr;
  int (*layout_create_)(void**, int, uint64_t, uint64_t, int64_t) = nullptr;
  SetAttr layout_set_ = nullptr;
  int (*layout_destroy_)(void*) = nullptr;
  int (*pref_create_)(void**) = nullptr;
  SetAttr pref_set_ = nullptr;
  int (*pref_destroy_)(void*) = nullptr;
  int (*heuristic_)(void*, void*, void*, void*, void*, void*, void*, int, void*, int*) = nullptr;
  int (*matmul_)(void*, void*, const void*, const void*, void*, const void*, void*, const void*, const void*, void*,
                 void*, void*, const void*, void*, size_t, void*) = nullptr;
  mutable std::mutex plans_mu_;
  mutable std::map<std::vector<int64_t>, std::shared_ptr<LtPlan>> plans_;
};

// One `cutlass` record resolved for a signature (CutlassLaunch in cutlass_gemm.py).
struct CutlassLaunch {
  int64_t kernel = 0, fallback = 0, align_bytes = 1, split = 1;
  std::array<int64_t, 13> ins{};
  std::vector<std::array<int64_t, 4>> steps;
};

class CutlassGemms {
 public:
  CutlassGemms(const Artifact& artifact, const NativePlan& plan, const Device& device);
  ~CutlassGemms();
  CutlassGemms(const CutlassGemms&) = delete;
  CutlassGemms& operator=(const CutlassGemms&) = delete;

  CutlassLaunch prepare(const LaunchDecl& l, const int64_t* regs, const std::vector<int64_t>& ints,
                        int64_t itemsize) const;
  // D = act(A.B [+ C]); `src` 0 without an epilogue source; `semaphores` grows the caller's zeroed
  // split-K buffer (per stream) to at least n bytes and returns its address.
  void launch(const CutlassLaunch& l, CUdeviceptr a, CUdeviceptr b, CUdeviceptr d, CUdeviceptr src, bool has_src,
              CUstream stream, const std::function<CUdeviceptr(size_t)>& semaphores) const;

 private:
  using PackFn = int (*)(const int64_t*, const uint64_t*, const double*, int32_t, void*, int64_t, int64_t*);
  const Device& device_;
  std::unique_ptr<MemoryLibrary> packer_;
  bool hopper_ = false;
  std::vector<std::string> names_;
  std::vector<PackFn> pack_;
  std::vector<std::unique_ptr<Module>> modules_;
  std::vector<std::unique_ptr<Kernel>> kernels_;  // nullptr: a Hopper kernel on another GPU
  std::vector<bool> grid_constant_;               // Params passed as __grid_constant__ (the Hopper kernels)
};

}  // namespace bpk::cuda
