#include "native_cpu.h"

#include <dlfcn.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "errors.h"

#ifdef BPK_HAVE_CBLAS
extern "C" {
// The two cblas entry points, declared here so no cblas.h is needed (LP64: 32-bit int sizes).
void cblas_sgemm(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*, int);
void cblas_dgemm(int, int, int, int, int, int, double, const double*, int, const double*, int, double, double*,
                 int);
}
#endif

namespace bpk {
namespace {

constexpr int kAbiVersion = 1;

// Note [Unloading kernel libraries]: each kernel library links libstdc++ statically, which costs two
// things per load from memory unless the library is built for unloading. (1) libstdc++ defines
// STB_GNU_UNIQUE symbols, and glibc never unloads an object that exports one: dlclose was a no-op and
// every load mapped another copy (measured: +16 KB resident per load / unload cycle, linear over
// 2,000 cycles). Libraries are linked with --exclude-libs,ALL and -fno-gnu-unique, so they export none.
// (2) GCC 12's libstdc++ allocates a 71 KB exception-handling pool when it loads that nothing frees at
// dlclose; libraries export bpk_library_release (libstdc++'s __freeres), called before dlclose.
// Libraries built before either keep their per-load cost. Sanitizer builds keep the libraries mapped
// (RTLD_NODELETE) so that LeakSanitizer reports leaks of the runtime itself.
#ifdef BPK_SANITIZER_BUILD
constexpr int kDlopenFlags = RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE;
#else
constexpr int kDlopenFlags = RTLD_NOW | RTLD_LOCAL;
#endif

[[noreturn]] void unavailable(const std::string& what) { fail(BPK_ERR_UNSUPPORTED, what); }

bool machine_is_x86() {
#if defined(__x86_64__)
  return true;
#else
  return false;
#endif
}

const LibraryDecl& choose(const std::vector<LibraryDecl>& libraries) {
  const std::vector<std::string> have = cpu_flags();
  const LibraryDecl* best = nullptr;
  for (const auto& lib : libraries) {
    bool fits;
    if (lib.isa == "generic") {
      fits = !machine_is_x86();
    } else {
      fits = machine_is_x86();
      for (const auto& f : lib.requires_flags) fits = fits && std::find(have.begin(), have.end(), f) != have.end();
    }
    if (fits) best = &lib;
  }
  if (best == nullptr) {
    std::string built;
    for (const auto& lib : libraries) built += (built.empty() ? "" : ", ") + lib.isa;
    unavailable("the artifact's CPU kernels were built for " + (built.empty() ? std::string("none") : built) +
                "; none runs on this CPU");
  }
  return *best;
}

int default_threads() {
  if (const char* env = std::getenv("BLADEPACK_NUM_THREADS")) {
    const int n = std::atoi(env);
    if (n > 0) return n;
  }
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

// Note [BLAS threads]: the kernel library splits large GEMMs over its own pool and wants every BLAS
// call on one thread; it asks for that per thread through openblas_set_num_threads_local. OpenBLAS
// builds without that entry point (Debian 12's 0.3.21) would otherwise start their own threads inside
// every piece, oversubscribing the cores the pool already spins on: measured on 2 cores, the MLP at
// batch 255 took 806 us instead of 225 and the encoder at 33 x 300 81 ms instead of 34. For those the
// runtime sets OpenBLAS to one thread process-wide when a model loads.

}  // namespace

std::vector<std::string> cpu_flags() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("flags", 0) == 0) {
      const size_t colon = line.find(':');
      std::istringstream words(colon == std::string::npos ? "" : line.substr(colon + 1));
      std::vector<std::string> out;
      for (std::string w; words >> w;) out.push_back(w);
      return out;
    }
  }
  return {};
}

KernelLibrary::KernelLibrary(const Artifact& artifact, const std::vector<LibraryDecl>& libraries, int num_threads) {
  const LibraryDecl& row = choose(libraries);
  isa_ = row.isa;
  const std::vector<uint8_t> so = artifact.section_copy(row.section);  // Note [Hash what runs]
  lib_ = std::make_unique<MemoryLibrary>(so, isa_, kDlopenFlags);  // Note [Library from memory]
  handle_ = lib_->handle();
  if (!handle_) unavailable("the " + isa_ + " CPU kernel library failed to load: " + lib_->error());
  auto sym = [this](const char* name) {
    void* p = dlsym(handle_, name);
    if (!p) unavailable(std::string("the CPU kernel library lacks ") + name);
    return p;
  };
  try {
    // Note [Library CPU features] (bladepack/codegen/cpu_library.py): data, so no library code runs first
    if (void* f = dlsym(handle_, "bpk_cpu_features")) {
      const std::vector<std::string> have = cpu_flags();
      std::istringstream words(*static_cast<const char* const*>(f));
      std::string missing;
      for (std::string w; words >> w;)
        if (std::find(have.begin(), have.end(), w) == have.end()) missing += (missing.empty() ? "" : ", ") + w;
      if (!missing.empty())
        unavailable("the " + isa_ + " CPU kernel library uses " + missing + ", which this CPU lacks");
    }
    auto abi = reinterpret_cast<int (*)()>(sym("bpk_abi_version"));
    if (abi() != kAbiVersion) unavailable("the CPU kernel library has a different ABI version");
    nfn_ = reinterpret_cast<int64_t (*)()>(sym("bpk_num_functions"))();
    auto create = reinterpret_cast<void* (*)(int)>(sym("bpk_ctx_create"));
    destroy_ = reinterpret_cast<void (*)(void*)>(sym("bpk_ctx_destroy"));
    auto set_blas = reinterpret_cast<void (*)(void*, void*, void*, int, void*)>(sym("bpk_ctx_set_blas"));
    run_ = reinterpret_cast<RunFn>(sym("bpk_run"));
    check_ = reinterpret_cast<decltype(check_)>(dlsym(handle_, "bpk_check"));
    threads_ = num_threads > 0 ? num_threads : default_threads();
    ctx_ = create(threads_);
    if (!ctx_) unavailable("the CPU kernel library could not start its thread pool");

    void *sgemm = nullptr, *dgemm = nullptr, *local = nullptr;
    const char* env = std::getenv("BLADEPACK_BLAS");
    if (env && std::strcmp(env, "none") == 0) {
      blas_ = "none (the kernel library's blocked GEMM)";
    } else if (env && *env) {
      blas_handle_ = dlopen(env, RTLD_NOW | RTLD_LOCAL);
      if (blas_handle_) {
        sgemm = dlsym(blas_handle_, "cblas_sgemm");
        dgemm = dlsym(blas_handle_, "cblas_dgemm");
        local = dlsym(blas_handle_, "openblas_set_num_threads_local");
      }
      if (!sgemm || !dgemm) unavailable(std::string("BLADEPACK_BLAS=") + env + " has no cblas_sgemm / cblas_dgemm");
      blas_ = env;
    } else {
#ifdef BPK_HAVE_CBLAS
      sgemm = reinterpret_cast<void*>(&cblas_sgemm);
      dgemm = reinterpret_cast<void*>(&cblas_dgemm);
      local = dlsym(RTLD_DEFAULT, "openblas_set_num_threads_local");
      blas_ = BPK_BLAS_NAME;
#else
      blas_ = "none (the kernel library's blocked GEMM)";
#endif
    }
    if (sgemm && !local) {  // Note [BLAS threads]
      void* scope = blas_handle_ ? blas_handle_ : RTLD_DEFAULT;
      if (auto set_global = reinterpret_cast<void (*)(int)>(dlsym(scope, "openblas_set_num_threads"))) {
        set_global(1);
        blas_ += " (set to one thread process-wide)";
      }
    }
    set_blas(ctx_, sgemm, dgemm, 0, local);
  } catch (...) {
    if (ctx_) destroy_(ctx_);
    if (blas_handle_) dlclose(blas_handle_);
    throw;
  }
}

KernelLibrary::~KernelLibrary() {
  if (ctx_) destroy_(ctx_);
  if (handle_) {  // Note [Unloading kernel libraries]
    if (auto release = reinterpret_cast<void (*)()>(dlsym(handle_, "bpk_library_release"))) release();
    lib_->close();
  }
  if (blas_handle_) dlclose(blas_handle_);
}

}  // namespace bpk
