// The manifest (docs/format.md "Manifest" and "Native CPU plan") as typed, validated data.
//
// In: the msgpack map an Artifact holds. Out: `Manifest`, with every index the runtime will follow
// checked (value ids, slots, registers, kernels, sections), or bpk::Error(BPK_ERR_FORMAT) naming the
// field ("malformed manifest: native_cpu.launches[3].ptrs[1]: expected [slot, offset]").
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "shape_program.h"

namespace bpk {

// An int, or register `reg` of the shape program's result.
struct SymInt {
  int64_t value = 0;
  int64_t reg = -1;
  int64_t resolve(const int64_t* regs) const { return reg < 0 ? value : regs[reg]; }
};

struct DimDecl {
  bool is_static = false;
  int64_t size = -1;
  std::string text;  // the expression over the symbols ("batch"), or the size as text
};

struct TensorDecl {
  std::string name;
  int64_t id = 0;
  int32_t dtype = 0;
  std::vector<DimDecl> shape;
};

struct SymbolDecl {
  std::string name;
  int64_t min = 0;
  std::optional<int64_t> max;
};

struct WeightDecl {
  std::string name;
  int64_t id = 0;
  int32_t dtype = 0;
  std::vector<int64_t> shape;
};

struct ValueDecl {
  int32_t dtype = 0;
  std::vector<SymInt> shape;
};

struct StepDecl {
  std::string op;
  int64_t out = 0;
  std::string loc;
};

struct KernelDecl {
  struct Variant {
    int64_t fn = 0;
    int64_t pred = 0;  // register
    // CUDA rows (docs/format.md "Native CUDA plan"): the function's symbol and launch geometry
    std::string name;
    SymInt grid, smem;
    int64_t block = 0;
  };
  std::string name, kind, loc;
  std::vector<Variant> variants;
  std::vector<std::string> errors;
  // CUDA rows: Note [Kernel operand checks] as a shape program over (ints, room per pointer)
  std::optional<ShapeProgram> check;
};

// The message of an index a kernel of row `k` reported through its status words: ERR_INDEX (an index
// may count from the end) or ERR_INDEX_NONNEG (it may not), + 16 x the error site.
std::string index_error_text(const KernelDecl& k, int64_t code, int64_t value, int64_t size);

// The same for a CUDA plan's status words {code, value, size}, whose code carries the kernel's row in
// `kernels` above bit 24 (Note [CUDA error codes] in codegen/cuda_loops.py).
std::string status_error_text(const std::vector<KernelDecl>& kernels, const int64_t* words);

// A CUTLASS dispatch entry: kernel `kernel` (index into NativePlan::gemm_kernels) with `split` split-K
// slices when register `pred` is non-zero, for operands aligned to `align` elements.
struct GemmEntry {
  int64_t kernel = 0, split = 1, pred = 0, align = 1;
};

// Note [Guarded launches] (bladepack/lowering/lower_native.py): a launch runs when each condition holds,
// read outermost first: register `reg` of the shape program (reg >= 0), else the byte at `offset` in
// `slot` (a data predicate), equal to `is`.
struct CondDecl {
  int64_t reg = -1;
  int64_t slot = 0;
  SymInt offset;
  bool is = true;
};

struct LaunchDecl {
  enum Op { kKernel, kGemm, kRef, kCutlass, kCublasLt } op = kKernel;
  std::vector<CondDecl> when;
  int64_t kernel = 0;   // kKernel: index into Manifest::kernels
  int64_t gemm_dtype = 0;  // kGemm: the record's dtype code, 0 float32, 1 float64, 2 float16, 3 bfloat16
  int64_t gemm_item = 4;   // kGemm: bytes per element
  std::vector<std::pair<int64_t, SymInt>> ptrs;  // (slot, byte offset)
  std::vector<SymInt> ints;
  int64_t node = 0;  // kRef
  std::string reason;
  std::vector<GemmEntry> entries, entries_sm90;  // kCutlass
  // kCublasLt: the epilogue (Note [cuBLASLt GEMMs] in bladepack/loader/cublaslt.py): its source ("none",
  // "bias", "residual") and cublasLtEpilogue_t code
  std::string lt_source = "none";
  uint32_t lt_epilogue = 1;
};

struct BufferDecl {
  int64_t id = 0;
  int32_t dtype = 0;
  std::vector<SymInt> shape;
  SymInt offset;
};

struct LibraryDecl {
  std::string isa, section;
  std::vector<std::string> requires_flags;
};

struct ImageDecl {
  std::string arch, section;  // "sm_90" / "sm_90a" (cubin) or "compute_90" (PTX)
};

struct GemmKernelDecl {
  std::string name, section, arch;  // arch "sm_80" (runs everywhere) or "sm_90a" (compute capability 9.0)
};

struct NativePlan {
  std::vector<LibraryDecl> libraries;  // native_cpu
  std::vector<ImageDecl> images;       // native_cuda, with the CUTLASS kernels and their Params packer:
  std::vector<GemmKernelDecl> gemm_kernels;
  std::string gemm_packer;  // its section ("" when the plan has no CUTLASS GEMMs)
  std::vector<LaunchDecl> launches;
  std::vector<BufferDecl> buffers;
  SymInt arena_bytes;
  std::vector<int64_t> outputs;  // slot per output, -1: copy it from where it lives
};

struct Manifest {
  int64_t format_major = 0, format_minor = 0;
  std::map<std::string, std::string> producer;
  bool tuple_output = false;
  std::vector<SymbolDecl> symbols;
  std::vector<TensorDecl> inputs, outputs;
  std::vector<WeightDecl> weights;
  ShapeProgram shape_program;
  std::unordered_map<int64_t, ValueDecl> values;
  std::vector<StepDecl> steps;
  std::vector<KernelDecl> kernels;
  std::optional<NativePlan> native;
  // read by parse_cuda_plan only (a CPU load never looks at them, as the Python loader does not)
  std::vector<KernelDecl> cuda_kernels;
  std::optional<NativePlan> native_cuda;

  // The slots of the native plan: arena, inputs, outputs, weights.
  int64_t num_slots() const { return 1 + int64_t(inputs.size() + outputs.size() + weights.size()); }
};

// Throws bpk::Error(BPK_ERR_FORMAT) with text that the caller prefixes with the artifact's source.
Manifest parse_manifest(const msgpack::object& root);
// The `native_cuda` plan and the CUDA kernel rows into `m` (parsed by parse_manifest); BPK_ERR_FORMAT
// as above, BPK_ERR_UNSUPPORTED when the artifact has no CUDA plan.
void parse_cuda_plan(const msgpack::object& root, Manifest& m);

// The plan ops of format 1.2 (docs/format.md "Plan ops").
bool known_plan_op(const std::string& op);

}  // namespace bpk
