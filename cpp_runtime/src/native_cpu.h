// The artifact's generated CPU kernel library (docs/format.md "Native CPU plan").
//
// In: the library rows of the native plan and their section bytes. Out: `KernelLibrary`, which picks
// the highest ISA level this CPU runs (the /proc/cpuinfo flags, as the Python loader reads them),
// loads that shared object from memory (memfd; else an unlinked temporary file), creates its context
// (thread pool) and hands it a cblas sgemm / dgemm, then runs prepared launch words in one call.
//
// BLAS: BLADEPACK_BLAS=path (a library exporting cblas_sgemm / cblas_dgemm) wins, BLADEPACK_BLAS=none
// uses the library's own blocked GEMM, else the BLAS this runtime was linked with (CMake's FindBLAS).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <memory>

#include "artifact.h"
#include "library_memory.h"
#include "manifest.h"

namespace bpk {

class KernelLibrary {
 public:
  KernelLibrary(const Artifact& artifact, const std::vector<LibraryDecl>& libraries, int num_threads);
  ~KernelLibrary();
  KernelLibrary(const KernelLibrary&) = delete;
  KernelLibrary& operator=(const KernelLibrary&) = delete;

  const std::string& isa() const { return isa_; }
  const std::string& blas() const { return blas_; }
  int64_t num_functions() const { return nfn_; }
  int threads() const { return threads_; }
  // 0, or 1 / 2 with status filled (see docs/format.md); thread-safe.
  int64_t run(const int64_t* words, int64_t nwords, void* const* slots, int64_t* status) const {
    return run_(ctx_, words, nwords, slots, status, nullptr);
  }
  // Note [Kernel operand checks] (bladepack/codegen/operand_check.py): 0, or the failing check's code
  // with status = [launch, code, value, extra]; runs no kernel. Libraries from before it: always 0.
  int64_t check(const int64_t* words, int64_t nwords, const int64_t* slot_bytes, const uint8_t* writable,
                int64_t nslots, int64_t* status) const {
    return check_ ? check_(words, nwords, slot_bytes, writable, nslots, status) : 0;
  }

 private:
  using RunFn = int64_t (*)(void*, const int64_t*, int64_t, void* const*, int64_t*, int64_t*);
  std::string isa_, blas_;
  std::unique_ptr<MemoryLibrary> lib_;
  void* handle_ = nullptr;  // lib_'s
  void* blas_handle_ = nullptr;
  void* ctx_ = nullptr;
  void (*destroy_)(void*) = nullptr;
  RunFn run_ = nullptr;
  int64_t (*check_)(const int64_t*, int64_t, const int64_t*, const uint8_t*, int64_t, int64_t*) = nullptr;
  int64_t nfn_ = 0;
  int threads_ = 1;
};

// The /proc/cpuinfo flags of this CPU (empty where unknown).
std::vector<std::string> cpu_flags();

}  // namespace bpk
