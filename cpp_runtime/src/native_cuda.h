// The CUDA executor of the C++ runtime: an artifact's `native_cuda` plan through the driver API, with
// the Python loader's choices (bladepack/loader/native_cuda.py, cuda_module.py).
//
// In: the artifact (cubin / PTX / CUTLASS sections), the parsed plan and CUDA kernel rows, the weights
// and a device ordinal. Out: `NativeCuda` — the image for this GPU (Note [Kernel images]) loaded once
// into the device's primary context, a function per kernel variant, the weights in one device buffer,
// cuBLAS and the CUTLASS kernels loaded when the plan has such GEMMs; per input-shape signature a
// `CudaPrepared` (every launch's function, geometry and parameter words with the pointer words left as
// (slot, byte offset) to fill per call); per call `run`, which enqueues the launches on the call's
// stream. Note [CUDA calls]: each concurrent call takes a `CallContext` from a pool — its own stream
// and one device buffer holding its status words, arena and staged host tensors, grown on demand —
// and gives it back when it returns; at most kIdleContexts idle contexts are kept.
//
// Note [CUDA graphs]: the second call of a signature on a call context captures its launches into a
// graph (stream capture on the context's stream, thread-local mode) and every later one launches that
// graph: one driver call instead of one per kernel. A graph is exact for later calls because everything
// it addresses stays put: the context's device buffer (status words, arena, staged inputs and
// outputs: a caller's tensors are copied in and out around the graph, never captured) and the weights;
// when the context's buffer grows, its graphs are dropped. Staging was chosen over updating kernel
// parameters per call because cuBLAS and CUTLASS nodes have parameter layouts this runtime does not
// know, and a host-memory model stages its tensors anyway. Graphs are per context (so per stream and
// device), at most `max_graphs` signatures per context, warming or captured (least recently used
// dropped first, so a stream cycling through more signatures than that never captures); a plan with a data
// predicate (a launch whose condition reads a byte on the host) is never captured — it runs plain
// launches, and `bladepack inspect` says why. A capture the driver refuses runs plain instead.
// Note [Graph staging cost] (bladepack/loader/cuda_graphs.py): a call whose device tensors add more than
// kStageBytesPerLaunch per launch runs plain launches on them in place (staging would cost two passes over
// their bytes, more than the launches a graph saves); `stage_pays` decides, as in the Python loader.
//
// Note [Device errors] (bladepack/loader/cuda_module.py): a context's status words (the first bad index
// its kernels found) are never reset by a call; every call ends with a copy of them into the context's
// page-locked `host_status` (a node of its graph), read without a driver call. A call that waits anyway
// (host outputs, a pool stream) raises its own error; a call on the caller's stream with device results
// leaves it to the next call on that stream, bpk_model_synchronize, or a line on stderr when the model
// is freed. BLADEPACK_CUDA_STRICT_ERRORS=1 resets the words per call and makes each call wait for them.
//
// Not here: `ref` launches (steps without a CUDA kernel) need the Python reference executor; such
// plans are refused at load, as the CPU plan's are.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "artifact.h"
#include "cuda_driver.h"
#include "cuda_gemm.h"
#include "manifest.h"

namespace bpk::cuda {

struct ByteCond {
  int64_t slot, offset;
  bool is;
  bool operator==(const ByteCond& o) const { return slot == o.slot && offset == o.offset && is == o.is; }
};

struct CudaPrepared {
  struct Launch {
    enum Kind { kKernel, kGemm, kCutlass, kCublasLt } kind = kKernel;
    int64_t plan_index = 0;
    // kKernel: function, geometry, parameter words [start, start + count)
    size_t fn = 0;
    unsigned grid = 1, block = 1, smem = 0;
    size_t start = 0, count = 0;
    // kGemm / kCutlass / kCublasLt: operands (slot, byte offset): A, B, D and the epilogue source if any
    int64_t dtype = 0;
    std::vector<std::pair<int64_t, int64_t>> ptrs;
    GemmArgs gemm;
    CutlassLaunch cutlass;
    LtLaunch lt;
    // Note [Guarded launches]: the data conditions to read before it (shape conditions already applied)
    std::vector<ByteCond> when;
  };
  std::vector<Launch> launches;
  std::vector<uint64_t> words;  // every kernel launch's parameter words, pointer words zero
  struct PtrWord {
    size_t pos;
    int64_t slot, offset;
  };
  std::vector<PtrWord> ptr_words;
  std::string no_graph;  // why this signature is never captured (Note [CUDA graphs]); "" when it may be
};

struct OutputPool;  // Note [Output pool] (native_cuda.cpp)

class NativeCuda {
 public:
  // max_graphs: graphs kept per call context (Note [CUDA graphs]); 0 turns them off
  NativeCuda(const Artifact& artifact, const Manifest& m, int ordinal, int max_graphs);
  ~NativeCuda();
  NativeCuda(const NativeCuda&) = delete;
  NativeCuda& operator=(const NativeCuda&) = delete;

  // "cuda (sm_90 image on NVIDIA H100 80GB HBM3, sm_90)", as the Python loader describes it
  std::string description() const;
  const Driver& driver() const { return *drv_; }
  const Device& device() const { return *device_; }
  // `bytes` of device memory that keeps the driver and the device's primary context alive until it is
  // freed (an output the caller releases, maybe after the model): bpk_model_run_dlpack's results
  // Note [Output pool]: reused by size once the last owner lets it go (no cuMemAlloc / cuMemFree per call,
  // which would wait for the device, at a repeated signature)
  std::shared_ptr<DeviceBuffer> alloc_owned(size_t bytes) const;
  bool checks_errors() const { return checks_errors_; }
  bool strict_errors() const { return strict_; }
  const std::vector<CUdeviceptr>& weight_ptrs() const { return weight_ptrs_; }

  std::shared_ptr<const CudaPrepared> prepare(const int64_t* regs) const;

  struct Graph {
    std::shared_ptr<const CudaPrepared> prepared;  // kept alive: the key is its address
    CUgraphExec exec = nullptr;
    uint64_t used = 0;
    int runs = 0;
    bool refused = false;  // the driver refused its capture: plain launches
  };
  struct CallContext {
    CUstream stream = nullptr;
    bool callers = false;  // the caller's stream: not created, not destroyed here
    std::mutex busy;       // a caller-stream context: held from take to give
    std::unique_ptr<DeviceBuffer> memory;      // status words, arena, staged inputs and outputs
    std::unique_ptr<DeviceBuffer> semaphores;  // split-K semaphores (zeroed when allocated)
    std::vector<std::unique_ptr<DeviceBuffer>> retired;  // outgrown semaphores a captured graph may address
    std::unique_ptr<DeviceBuffer> lt_workspace;  // cuBLASLt's (CublasLt::kWorkspace bytes, never moved)
    std::unordered_map<const CudaPrepared*, Graph> graphs;
    uint64_t clock = 0;
    int64_t* host_status = nullptr;  // Note [Device errors]: page-locked copy of the status words
  };
  // Note [Device errors]: the error c's calls reported, after waiting for c.stream ({0, 0, 0}: none);
  // a non-zero one is cleared (device words and host copy) before it is returned
  std::array<int64_t, 3> take_error(CallContext& c, CUdeviceptr status) const;
  // wait for the caller-stream context of `stream` (every one when NULL) and return the first error
  // one of them holds, cleared ({0, 0, 0}: none)
  std::array<int64_t, 3> synchronize(CUstream stream) const;
  static constexpr size_t kIdleContexts = 16;
  // A context whose memory holds at least `bytes` (made current on this thread); give it back after.
  // `stream` NULL: one of the pool's, with a stream of its own, used by one call at a time; else the
  // context of the caller's stream (its memory reused in that stream's order), held until given back.
  CallContext* take(size_t bytes, CUstream stream = nullptr) const;
  void give(CallContext* c) const;
  // Note [CUDA graphs]: whether this call of `p` on `c` will launch a graph (so its tensors are staged)
  bool will_graph(const std::shared_ptr<const CudaPrepared>& p, const CallContext& c) const;
  // Note [Graph staging cost]: whether a call of `p` whose device tensors hold `device_bytes` may be a graph
  static bool stage_pays(const CudaPrepared& p, size_t device_bytes) {
    return device_bytes <= kStageBytesPerLaunch * std::max<size_t>(p.launches.size(), 1);
  }
  static constexpr size_t kStageBytesPerLaunch = size_t(4) << 20;

  // Enqueue every launch of `p` on c.stream; `slots`: the device address of each slot. Data
  // conditions read their byte after the launches before them (a synchronisation).
  // With graphs on, a signature's third and later calls on `c` launch its graph (Note [CUDA graphs]);
  // `graphs` false: plain launches for this call (Note [Graph staging cost]).
  void run(const std::shared_ptr<const CudaPrepared>& p, const CUdeviceptr* slots, CUdeviceptr status,
           CallContext& c, bool graphs = true) const;
  int max_graphs() const { return max_graphs_; }

 private:
  void destroy(CallContext* c) const;
  void drop_graphs(CallContext& c) const;
  // c's memory grown to at least `bytes` (its graphs dropped when it moves)
  void reserve(CallContext& c, size_t bytes) const;
  // Note [Device errors]: c's page-locked status copy, made once (not in strict mode)
  void mirror(CallContext& c) const;
  void launch_all(const CudaPrepared& p, const CUdeviceptr* slots, CUdeviceptr status, CallContext& c) const;
  // capture `p` on c's stream into an instantiated graph; nullptr when the driver refuses
  CUgraphExec capture(const CudaPrepared& p, const CUdeviceptr* slots, CUdeviceptr status, CallContext& c) const;
  CUdeviceptr semaphores(CallContext& c, size_t bytes) const;
  bool holds(const std::vector<ByteCond>& when, const CUdeviceptr* slots, CUstream stream) const;

  const Manifest& m_;
  std::shared_ptr<Driver> drv_;
  std::shared_ptr<Device> device_;
  std::shared_ptr<OutputPool> outputs_;  // Note [Output pool]; owners hold it weakly
  std::string image_;
  std::unique_ptr<Module> module_;
  std::vector<std::unique_ptr<Kernel>> functions_;  // by the variants' `fn`
  std::unique_ptr<DeviceBuffer> weights_;
  std::vector<CUdeviceptr> weight_ptrs_;
  std::unique_ptr<Cublas> cublas_;
  std::unique_ptr<CutlassGemms> cutlass_;
  std::unique_ptr<CublasLt> cublaslt_;
  bool checks_errors_ = false;
  bool strict_ = false;  // BLADEPACK_CUDA_STRICT_ERRORS=1
  int max_graphs_ = 0;
  mutable std::mutex pool_mu_;
  mutable std::vector<CallContext*> idle_;
  mutable std::unordered_map<CUstream, CallContext*> by_stream_;  // caller-stream contexts
};

}  // namespace bpk::cuda
