/* What the fake cuBLAS and cuBLASLt share: cudaDataType codes, element loads and stores in double
 * precision (one rounding to the result type), the log line writer (FAKE_CUDA_LOG) and the hand-off of
 * a GEMM to the fake driver, which records it into a CUDA graph when its stream is capturing. */
#pragma once
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { R_32F = 0, R_64F = 1, R_16F = 2, R_16BF = 14 };

static void logf_(const char* line) {
  const char* path = getenv("FAKE_CUDA_LOG");
  if (!path) return;
  FILE* f = fopen(path, "a");
  if (!f) return;
  fputs(line, f);
  fputc('\n', f);
  fclose(f);
}

static double load(const void* p, long long i, int t) {
  switch (t) {
    case R_32F:
      return ((const float*)p)[i];
    case R_64F:
      return ((const double*)p)[i];
    case R_16F:
      return (double)((const _Float16*)p)[i];
    default: {
      uint32_t u = (uint32_t)((const uint16_t*)p)[i] << 16;
      float f;
      memcpy(&f, &u, 4);
      return f;
    }
  }
}

static void store(void* p, long long i, int t, double v) {
  switch (t) {
    case R_32F:
      ((float*)p)[i] = (float)v;
      break;
    case R_64F:
      ((double*)p)[i] = v;
      break;
    case R_16F:
      ((_Float16*)p)[i] = (_Float16)(float)v;
      break;
    default: {
      float f = (float)v;
      uint32_t u;
      memcpy(&u, &f, 4);
      u += 0x7fffu + ((u >> 16) & 1u);
      ((uint16_t*)p)[i] = (uint16_t)(u >> 16);
    }
  }
}

/* Run `work(data)` now, or, when `stream` is capturing a graph under the fake driver, record it as a
 * host node that runs when the graph is launched; `data` is freed after its last run. */
static void fake_blas_enqueue(void* stream, void (*work)(void*), void* data) {
  typedef int (*HostWork)(void*, void (*)(void*), void*, void (*)(void*));
  void* cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  HostWork record = cuda ? (HostWork)dlsym(cuda, "fake_cuda_host_work") : NULL;
  const int recorded = record && record(stream, work, data, free);
  if (cuda) dlclose(cuda);
  if (!recorded) {
    work(data);
    free(data);
  }
}
