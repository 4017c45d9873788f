// A loaded model: signature checks, per-shape prepared launch lists, and thread-safe runs.
//
// In: an Artifact and load options. Out: `Model`. Note [Prepared shapes]: everything that depends only
// on the input shapes (the shape program's registers, the launch words with every SymInt resolved and
// every kernel variant chosen, the arena size, the output shapes) is computed once per distinct
// tuple of input shapes and cached; a repeated shape then costs a hash lookup, an arena from the free
// list, a slot table and one call into the kernel library. The cache holds at most kMaxShapes
// signatures (it is cleared when full; preparing again takes microseconds).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "artifact.h"
#include "bladepack/runtime.h"
#include "manifest.h"
#include "native_cpu.h"
#include "native_cuda.h"
#include "out_of_range.h"
#include "padded_dims.h"

namespace bpk {

class Model {
 public:
  Model(std::unique_ptr<Artifact> artifact, const bpk_load_options& options);
  ~Model();

  const bpk_signature& signature() const { return sig_; }
  // The manifest's padding proofs (read on first use: a call never reads them); throws BPK_ERR_FORMAT.
  const PaddedDims& padded_dims() const;
  const std::string& executor() const { return executor_; }
  const Manifest& manifest() const { return m_; }
  void output_shapes(const bpk_tensor* inputs, int64_t num_inputs, bpk_tensor* outputs, int64_t num_outputs) const;
  void run(const bpk_tensor* inputs, int64_t num_inputs, bpk_tensor* outputs, int64_t num_outputs) const;
  // Note [Device errors] (native_cuda.h): wait for the calls on caller stream `stream` (every caller
  // stream when NULL) and raise an index error one reported; nothing for a CPU model
  void synchronize(void* stream) const;
  // Where a call's tensors live (bpk_model_run_dlpack): in_device[i] / out_device[k] non-zero for
  // memory of this model's device (a CUDA model only), and the caller's CUstream (NULL: the runtime's).
  struct Placement {
    const uint8_t* in_device = nullptr;
    const uint8_t* out_device = nullptr;
    void* stream = nullptr;
  };
  void run(const bpk_tensor* inputs, int64_t num_inputs, bpk_tensor* outputs, int64_t num_outputs,
           const Placement& where) const;
  // -1 for a CPU model, else the CUDA device ordinal
  int device_ordinal() const { return cuda_ ? cuda_->device().info().ordinal : -1; }
  const cuda::NativeCuda* cuda() const { return cuda_.get(); }
  // Note [Reference cases] (verify.cpp): runs them; the report text; true when every case passed
  bool verify(std::string& report) const;
  // Note [Packed sequences] (packed.cpp): several sequences of different lengths in one call, as the
  // Python loader's LoadedModule.run_packed; the packed plan is loaded on first use
  void run_packed(const bpk_tensor* inputs, int64_t num_inputs, const int64_t* lengths, int64_t num_lengths,
                  bpk_tensor* outputs, int64_t num_outputs) const;
  bool has_packed() const { return !packed_symbol_.empty(); }
  // the ragged dim the packed form runs along ("" when the artifact has none): for servers
  const std::string& packed_symbol() const { return packed_symbol_; }

  static constexpr size_t kMaxShapes = 4096;

  struct OutSpec {
    int32_t dtype = 0;
    int32_t ndim = 0;
    int64_t shape[BPK_MAX_RANK] = {};
    size_t nbytes = 0;
  };
  struct Prepared {
    std::vector<int64_t> regs;
    std::vector<int64_t> words;
    // Note [Guarded launches]: the launches a shape condition rules out are not in `words`; the rest
    // run in segments (word ranges) whose data conditions (slot, byte offset, expected) are read first
    struct ByteCond {
      int64_t slot, offset;
      bool is;
    };
    struct Segment {
      size_t begin = 0, end = 0, first = 0;  // words [begin, end); `first`: its first launch in launch_index
      std::vector<ByteCond> when;
    };
    std::vector<Segment> segments;
    std::vector<int64_t> launch_index;  // per launch in `words`, its index in the plan
    size_t arena_bytes = 0;
    std::vector<OutSpec> outs;
    std::vector<int64_t> copy_offset;  // per output copied from the arena: its byte offset there
    std::shared_ptr<const cuda::CudaPrepared> cuda;  // a CUDA model's launches (`words` is then empty)
  };
  // The prepared launch list for these (checked) inputs, and the library that runs it: for benchmarks.
  std::shared_ptr<const Prepared> prepared(const bpk_tensor* inputs) const;
  const KernelLibrary& library() const { return *lib_; }  // CPU models
  bool on_cuda() const { return cuda_ != nullptr; }
  const std::vector<const void*>& weight_ptrs() const { return weight_ptrs_; }

 private:
  // Note [Plan checks]: per signature, pointer offsets against their slots and GEMM records
  void check_launches(const Prepared& p, const bpk_tensor* in) const;
  void check_gemm(size_t launch, const std::vector<int64_t>& ints, const std::vector<uint64_t>& room,
                  int64_t item) const;
  // Note [Kernel operand checks]: the error for a failed check of the kernel library (status words)
  [[noreturn]] void operand_error(const int64_t* status, const int64_t* regs, const std::vector<uint64_t>& slots) const;
  // Where output k comes from when the native plan does not write it (docs/format.md: slot -1).
  struct OutSource {
    enum Kind { kNative, kInput, kWeight, kOutput, kArena } kind = kNative;
    int64_t index = 0;  // input position, weight index, output index or buffer index
  };
  struct KeyHash {
    size_t operator()(const std::vector<int64_t>& k) const;
  };
  struct Arena {
    void* data = nullptr;
    size_t bytes = 0;
  };

  void check_inputs(const bpk_tensor* inputs, int64_t num_inputs) const;
  std::shared_ptr<const Prepared> prepare(const bpk_tensor* inputs) const;
  void check_outputs(const std::vector<OutSpec>& outs, const bpk_tensor* outputs, int64_t num_outputs) const;
  // The outputs a call leaves to the runtime (data NULL), allocated by their specs; freed again when the
  // call fails (the guard is destroyed before keep()).
  class OwnedOutputs {
   public:
    OwnedOutputs(const Model& m, const std::vector<OutSpec>& specs, bpk_tensor* outputs);
    ~OwnedOutputs();
    OwnedOutputs(const OwnedOutputs&) = delete;
    OwnedOutputs& operator=(const OwnedOutputs&) = delete;
    void keep() { owned_.clear(); }

   private:
    bpk_tensor* out_;
    std::vector<size_t> owned_;
  };
  // Note [Batch-like dims] (out_of_range.cpp): a call whose split dim is above its range, run in pieces
  void run_split(const Pieces& pieces, const bpk_tensor* inputs, bpk_tensor* outputs, int64_t num_outputs) const;
  void split_shapes(const Pieces& pieces, const bpk_tensor* inputs, bpk_tensor* outputs, int64_t num_outputs) const;
  [[noreturn]] void native_error(int64_t rc, const int64_t* status) const;
  std::string spec_text(const TensorDecl& t) const;
  // the plan this model runs (native_cpu, or native_cuda on a CUDA device) and its kernel rows
  const NativePlan& plan() const { return cuda_ ? *m_.native_cuda : *m_.native; }
  const std::vector<KernelDecl>& kernels() const { return cuda_ ? m_.cuda_kernels : m_.kernels; }
  [[noreturn]] void index_error(const KernelDecl& k, int64_t code, int64_t value, int64_t size) const;
  // Note [Device errors]: the error in status words `e`; `found` "" (the call's own) or where an earlier
  // call's was found
  [[noreturn]] void raise_index_error(const std::array<int64_t, 3>& e, const char* found) const;
  void refuse_ref_launches(const NativePlan& plan, const char* target) const;
  void load_cuda(const std::string& device, int max_graphs);
  // Note [CUDA calls] (native_cuda.h): host tensors staged through the call context's device memory
  void run_cuda(const Prepared& p, const bpk_tensor* inputs, bpk_tensor* outputs, const Placement& where) const;
  // Note [Kernel operand checks] for CUDA kernels: their check programs over (ints, room)
  void check_cuda_operands(const Prepared& p, const std::vector<uint64_t>& slots) const;
  void build_signature();
  void plan_outputs();
  Arena* take_arena(size_t bytes) const;
  void give_arena(Arena* a) const;

  std::unique_ptr<Artifact> artifact_;
  Manifest m_;
  std::unique_ptr<KernelLibrary> lib_;
  std::unique_ptr<cuda::NativeCuda> cuda_;
  std::string executor_;
  std::vector<const void*> weight_ptrs_;
  std::vector<OutSource> out_source_;
  SplitPolicy split_;  // the load option on_out_of_range
  mutable std::mutex padded_mutex_;
  mutable std::unique_ptr<PaddedDims> padded_;  // the manifest's padding proofs, for servers
  // Note [Packed sequences]: the packed plan (a model of its own over a view of this artifact) and, per
  // ragged input, its (rows axis, sequence axis) — (-1, -1) for the others; loaded on first use
  struct Packed;
  const Packed& packed() const;
  mutable std::mutex packed_mutex_;
  mutable std::shared_ptr<const Packed> packed_;
  int32_t num_threads_ = 0;
  std::string device_ = "cpu";  // the load options' device and CUDA graphs (the packed plan's too)
  int32_t cuda_graphs_ = 0;
  std::string packed_symbol_;
  // signature storage behind sig_
  bpk_signature sig_{};
  std::vector<bpk_tensor_spec> in_specs_, out_specs_;
  std::vector<bpk_symbol_spec> sym_specs_;
  std::vector<std::vector<int64_t>> spec_dims_;
  std::vector<std::vector<const char*>> spec_exprs_;
  std::string sig_text_;

  mutable std::shared_mutex cache_mu_;
  mutable std::unordered_map<std::vector<int64_t>, std::shared_ptr<const Prepared>, KeyHash> cache_;
  mutable std::mutex arena_mu_;
  mutable std::vector<Arena*> arenas_;  // free arenas; a run takes one and gives it back
};

}  // namespace bpk
