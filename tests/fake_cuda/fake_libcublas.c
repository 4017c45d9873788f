/* A fake cuBLAS for tests without a GPU: the entry points bladepack's loader calls, computing
 * cublasGemmStridedBatchedEx on the host (device memory is host memory under the fake driver) in
 * double precision from the operands' own types, rounding once to the result type. Calls are logged
 * to FAKE_CUDA_LOG like the fake driver's ("gemm" with transposes, sizes, leading dims, batch, types).
 * FAKE_CUDA_NO_MATH (set) skips the arithmetic: host-cost benchmarks time the loader's own work.
 */
#include "fake_blas.h"

int cublasCreate_v2(void** handle) {
  *handle = calloc(1, 16); /* the stream set last */
  logf_("cublas_create");
  return 0;
}
int cublasDestroy_v2(void* handle) {
  free(handle);
  return 0;
}
int cublasSetStream_v2(void* handle, void* stream) {
  *(void**)handle = stream;
  return 0;
}

/* A GEMM's arguments, run now or, when its stream is capturing a graph (the fake driver's
 * fake_cuda_host_work), recorded as a node that runs when the graph is launched. */
typedef struct {
  int transa, transb, m, n, k;
  double al, be;
  const void *A, *B;
  void* C;
  int atype, btype, ctype, lda, ldb, ldc, batch;
  long long sa, sb, sc;
} Gemm;

static void gemm_run(void* data) {
  const Gemm* g = (const Gemm*)data;
  if (getenv("FAKE_CUDA_NO_MATH")) return; /* host-cost benchmarks: the loader's work alone */
  for (int b = 0; b < g->batch; ++b)
    for (int j = 0; j < g->n; ++j)
      for (int i = 0; i < g->m; ++i) {
        double acc = 0;
        for (int p = 0; p < g->k; ++p) {
          const double a =
              load(g->A, b * g->sa + (g->transa ? (long long)i * g->lda + p : (long long)p * g->lda + i), g->atype);
          const double x =
              load(g->B, b * g->sb + (g->transb ? (long long)p * g->ldb + j : (long long)j * g->ldb + p), g->btype);
          acc += a * x;
        }
        const long long at = b * g->sc + (long long)j * g->ldc + i;
        store(g->C, at, g->ctype, g->al * acc + (g->be != 0 ? g->be * load(g->C, at, g->ctype) : 0));
      }
}

/* column-major: C (m x n, ldc) = op(A) (m x k) . op(B) (k x n), per batch */
int cublasGemmStridedBatchedEx(void* handle, int transa, int transb, int m, int n, int k, const void* alpha,
                               const void* A, int atype, int lda, long long sa, const void* B, int btype, int ldb,
                               long long sb, const void* beta, void* C, int ctype, int ldc, long long sc, int batch,
                               int compute, int algo) {
  (void)handle;
  (void)algo;
  char line[256];
  snprintf(line, sizeof line, "gemm %c%c m %d n %d k %d lda %d ldb %d ldc %d batch %d types %d %d %d compute %d",
           transa ? 'T' : 'N', transb ? 'T' : 'N', m, n, k, lda, ldb, ldc, batch, atype, btype, ctype, compute);
  logf_(line);
  Gemm* g = (Gemm*)malloc(sizeof *g);
  *g = (Gemm){transa, transb, m, n, k, compute == 70 ? *(const double*)alpha : *(const float*)alpha,
              compute == 70 ? *(const double*)beta : *(const float*)beta, A, B, C, atype, btype, ctype, lda, ldb, ldc,
              batch, sa, sb, sc};
  fake_blas_enqueue(*(void**)handle, gemm_run, g);
  return 0;
}
