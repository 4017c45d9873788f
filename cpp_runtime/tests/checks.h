// What the C ABI test programs share (test_api.cpp, test_device_errors.cpp): CHECK, which counts and
// reports a failed condition without stopping; a DLTensor maker; the CUDA driver calls a test needs to
// hold device memory (the fake driver's, under tests/test_cuda_cpp.py).
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "bladepack/runtime.h"

namespace {

int g_checks = 0, g_failed = 0;

#define CHECK(cond, ...)                                                            \
  do {                                                                              \
    ++g_checks;                                                                     \
    if (!(cond)) {                                                                  \
      ++g_failed;                                                                   \
      std::fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                            \
      std::fprintf(stderr, "\n");                                                   \
    }                                                                               \
  } while (0)

// "<program>: N checks passed" and 0, or "<program>: F of N checks failed" and 1
int report(const char* program) {
  if (g_failed) {
    std::fprintf(stderr, "%s: %d of %d checks failed\n", program, g_failed, g_checks);
    return 1;
  }
  std::printf("%s: %d checks passed\n", program, g_checks);
  return 0;
}

bool contains(const char* s, const char* part) { return std::strstr(s, part) != nullptr; }

DLTensor dl(void* data, DLDevice device, DLDataType dtype, int64_t* shape, int32_t ndim, int64_t* strides = nullptr) {
  DLTensor t;
  std::memset(&t, 0, sizeof t);
  t.data = data;
  t.device = device;
  t.dtype = dtype;
  t.shape = shape;
  t.ndim = ndim;
  t.strides = strides;
  return t;
}

struct Driver {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  int (*alloc)(uint64_t*, size_t) = nullptr;
  int (*free_)(uint64_t) = nullptr;
  int (*htod)(uint64_t, const void*, size_t) = nullptr;
  int (*dtoh)(void*, uint64_t, size_t) = nullptr;
  int (*stream_create)(void**, unsigned) = nullptr;
  int (*sync)(void*) = nullptr;
  Driver() {
    if (!lib) return;
    alloc = reinterpret_cast<decltype(alloc)>(dlsym(lib, "cuMemAlloc_v2"));
    free_ = reinterpret_cast<decltype(free_)>(dlsym(lib, "cuMemFree_v2"));
    htod = reinterpret_cast<decltype(htod)>(dlsym(lib, "cuMemcpyHtoD_v2"));
    dtoh = reinterpret_cast<decltype(dtoh)>(dlsym(lib, "cuMemcpyDtoH_v2"));
    stream_create = reinterpret_cast<decltype(stream_create)>(dlsym(lib, "cuStreamCreate"));
    sync = reinterpret_cast<decltype(sync)>(dlsym(lib, "cuStreamSynchronize"));
  }
  ~Driver() {
    if (lib) dlclose(lib);
  }
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;
};

}  // namespace
