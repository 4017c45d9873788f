/* A fake cuBLASLt for tests without a GPU: the entry points bladepack's loaders call, as strict as the
 * real library about what they are given, computing cublasLtMatmul on the host (device memory is host
 * memory under the fake driver) in double precision from the operands' own types, rounding once to
 * the result type, with the epilogues bladepack uses (bias, ReLU, GELU in its tanh form, beta.C).
 *
 * Strict: an attribute id or size outside the ones cublasLt.h defines for them, a layout whose leading
 * dim is below its rows, descriptors whose shapes do not chain (op(A): rows(D) x k, op(B): k x cols(D),
 * C as D, one batch count), a bias epilogue without a bias pointer, an algorithm from no heuristic
 * query, a workspace smaller than the algorithm asked for, or an operand address less aligned than the
 * heuristic query promised (CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*): each returns a failing status and
 * writes why to stderr. Calls are logged to FAKE_CUDA_LOG ("ltmatmul" with the transposes, sizes,
 * leading dims, batch, type, epilogue, beta and alignment; matmul descriptors made and destroyed).
 * FAKE_CUDA_NO_MATH skips the arithmetic.
 */
#include <math.h>

#include "fake_blas.h"

enum { OK = 0, INVALID = 7, NOT_SUPPORTED = 15 };
enum { EPI_DEFAULT = 1, EPI_RELU = 2, EPI_BIAS = 4, EPI_GELU = 32 };
#define ALGO_TAG 0x4250414c474fULL /* what a heuristic answer carries in data[0] */
#define WORKSPACE_ASKED (1u << 20)

static int refuse(const char* why) {
  fprintf(stderr, "fake cuBLASLt: %s\n", why);
  return INVALID;
}

typedef struct {
  int compute, scale, transa, transb;
  uint32_t epilogue;
  uint64_t bias;
  int64_t bias_stride;
} Desc;

typedef struct {
  int type;
  uint64_t rows, cols;
  int64_t ld;
  int32_t batch;
  int64_t stride;
} Layout;

typedef struct {
  uint64_t workspace;
  uint32_t align[4];
} Pref;

typedef struct {
  uint64_t data[8];
} Algo;

typedef struct {
  Algo algo;
  size_t workspaceSize;
  int state;
  float wavesCount;
  int reserved[4];
} HeuristicResult;

int cublasLtCreate(void** handle) {
  *handle = calloc(1, 16);
  logf_("cublaslt_create");
  return OK;
}
int cublasLtDestroy(void* handle) {
  free(handle);
  return OK;
}

int cublasLtMatmulDescCreate(Desc** desc, int compute, int scale) {
  if (!((compute == 68 && scale == R_32F) || (compute == 70 && scale == R_64F)))
    return refuse("cublasLtMatmulDescCreate: compute / scale type pair not one bladepack uses");
  *desc = (Desc*)calloc(1, sizeof(Desc));
  (*desc)->compute = compute, (*desc)->scale = scale, (*desc)->epilogue = EPI_DEFAULT;
  logf_("lt_desc_create");
  return OK;
}
int cublasLtMatmulDescDestroy(Desc* desc) {
  free(desc);
  logf_("lt_desc_destroy");
  return OK;
}
int cublasLtMatmulDescSetAttribute(Desc* d, int attr, const void* buf, size_t size) {
  switch (attr) {
    case 3: /* TRANSA: int32 */
    case 4: /* TRANSB */
      if (size != 4) return refuse("TRANSA / TRANSB take an int32_t");
      {
        int32_t v;
        memcpy(&v, buf, 4);
        if (v != 0 && v != 1) return refuse("a transpose is CUBLAS_OP_N or CUBLAS_OP_T here");
        *(attr == 3 ? &d->transa : &d->transb) = v;
      }
      return OK;
    case 7: /* EPILOGUE: uint32 */
      if (size != 4) return refuse("EPILOGUE takes a uint32_t");
      memcpy(&d->epilogue, buf, 4);
      switch (d->epilogue) { /* cublasLtEpilogue_t: DEFAULT, RELU, BIAS, RELU_BIAS, GELU, GELU_BIAS */
        case 1: case 2: case 4: case 6: case 32: case 36:
          break;
        default:
          return refuse("an epilogue other than DEFAULT, RELU, BIAS, GELU and their BIAS forms");
      }
      return OK;
    case 8: /* BIAS_POINTER: a device pointer */
      if (size != 8) return refuse("BIAS_POINTER takes a pointer");
      memcpy(&d->bias, buf, 8);
      return OK;
    case 10: /* BIAS_BATCH_STRIDE: int64 */
      if (size != 8) return refuse("BIAS_BATCH_STRIDE takes an int64_t");
      memcpy(&d->bias_stride, buf, 8);
      return OK;
    default:
      return refuse("a matmul descriptor attribute bladepack does not set");
  }
}

int cublasLtMatrixLayoutCreate(Layout** layout, int type, uint64_t rows, uint64_t cols, int64_t ld) {
  if (type != R_32F && type != R_64F && type != R_16F && type != R_16BF) return refuse("a layout type bladepack never uses");
  if (ld < (int64_t)(rows > 0 ? rows : 1)) return refuse("a column-major layout's leading dim is below its rows");
  *layout = (Layout*)calloc(1, sizeof(Layout));
  **layout = (Layout){type, rows, cols, ld, 1, 0};
  return OK;
}
int cublasLtMatrixLayoutDestroy(Layout* layout) {
  free(layout);
  return OK;
}
int cublasLtMatrixLayoutSetAttribute(Layout* l, int attr, const void* buf, size_t size) {
  if (attr == 5) { /* BATCH_COUNT: int32 */
    if (size != 4) return refuse("BATCH_COUNT takes an int32_t");
    memcpy(&l->batch, buf, 4);
    return l->batch >= 1 ? OK : refuse("a batch count below 1");
  }
  if (attr == 6) { /* STRIDED_BATCH_OFFSET: int64 */
    if (size != 8) return refuse("STRIDED_BATCH_OFFSET takes an int64_t");
    memcpy(&l->stride, buf, 8);
    return OK;
  }
  return refuse("a layout attribute bladepack does not set");
}

int cublasLtMatmulPreferenceCreate(Pref** pref) {
  *pref = (Pref*)calloc(1, sizeof(Pref));
  for (int i = 0; i < 4; ++i) (*pref)->align[i] = 256; /* cublasLt.h's default */
  return OK;
}
int cublasLtMatmulPreferenceDestroy(Pref* pref) {
  free(pref);
  return OK;
}
int cublasLtMatmulPreferenceSetAttribute(Pref* p, int attr, const void* buf, size_t size) {
  if (attr == 1) { /* MAX_WORKSPACE_BYTES: uint64 */
    if (size != 8) return refuse("MAX_WORKSPACE_BYTES takes a uint64_t");
    memcpy(&p->workspace, buf, 8);
    return OK;
  }
  if (attr >= 5 && attr <= 8) { /* MIN_ALIGNMENT_{A,B,C,D}_BYTES: uint32 */
    if (size != 4) return refuse("MIN_ALIGNMENT_*_BYTES take a uint32_t");
    memcpy(&p->align[attr - 5], buf, 4);
    return OK;
  }
  return refuse("a preference attribute bladepack does not set");
}

/* op(X)'s rows and cols */
static void op_shape(const Layout* l, int trans, uint64_t* r, uint64_t* c) {
  *r = trans ? l->cols : l->rows;
  *c = trans ? l->rows : l->cols;
}

static int chained(const Desc* d, const Layout* a, const Layout* b, const Layout* c, const Layout* dl) {
  uint64_t ar, ac, br, bc;
  op_shape(a, d->transa, &ar, &ac);
  op_shape(b, d->transb, &br, &bc);
  if (ar != dl->rows || bc != dl->cols || ac != br) return 0;
  if (c->rows != dl->rows || c->cols != dl->cols || c->type != dl->type) return 0;
  if (a->type != dl->type || b->type != dl->type) return 0;
  return a->batch == dl->batch && b->batch == dl->batch && c->batch == dl->batch;
}

int cublasLtMatmulAlgoGetHeuristic(void* handle, const Desc* d, const Layout* a, const Layout* b, const Layout* c,
                                   const Layout* dl, const Pref* pref, int requested, HeuristicResult* results,
                                   int* count) {
  (void)handle;
  if (requested < 1) return INVALID;
  if (!chained(d, a, b, c, dl)) return refuse("cublasLtMatmulAlgoGetHeuristic: the layouts do not chain");
  memset(results, 0, sizeof *results);
  uint32_t align = 256;
  for (int i = 0; i < 4; ++i) align = pref->align[i] < align ? pref->align[i] : align;
  results->algo.data[0] = ALGO_TAG;
  results->algo.data[1] = align;
  results->workspaceSize = pref->workspace >= WORKSPACE_ASKED ? WORKSPACE_ASKED : 0;
  results->algo.data[2] = results->workspaceSize;
  results->wavesCount = 1.0f;
  *count = 1;
  char line[160];
  snprintf(line, sizeof line, "lt_heuristic align %u workspace %llu", align, (unsigned long long)pref->workspace);
  logf_(line);
  return OK;
}

typedef struct {
  Desc d;
  Layout a, b, c, dl;
  double alpha, beta;
  const void *A, *B, *C;
  void* D;
} Matmul;

static double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

static void matmul_run(void* data) {
  const Matmul* g = (const Matmul*)data;
  if (getenv("FAKE_CUDA_NO_MATH")) return;
  uint64_t rows, k, tmp, cols;
  op_shape(&g->a, g->d.transa, &rows, &k);
  op_shape(&g->b, g->d.transb, &tmp, &cols);
  const int t = g->dl.type;
  for (int32_t s = 0; s < g->dl.batch; ++s)
    for (uint64_t j = 0; j < cols; ++j)
      for (uint64_t i = 0; i < rows; ++i) {
        double acc = 0;
        for (uint64_t p = 0; p < k; ++p) {
          const long long ai = g->d.transa ? (long long)(i * g->a.ld + p) : (long long)(p * g->a.ld + i);
          const long long bi = g->d.transb ? (long long)(p * g->b.ld + j) : (long long)(j * g->b.ld + p);
          acc += load(g->A, s * g->a.stride + ai, t) * load(g->B, s * g->b.stride + bi, t);
        }
        double v = g->alpha * acc;
        if (g->beta != 0) v += g->beta * load(g->C, s * g->c.stride + (long long)(j * g->c.ld + i), t);
        if (g->d.epilogue & EPI_BIAS) v += load((const void*)g->d.bias, s * g->d.bias_stride + (long long)i, t);
        if (g->d.epilogue & EPI_RELU) v = v > 0 ? v : 0;
        if (g->d.epilogue & EPI_GELU) v = gelu_tanh(v);
        store(g->D, s * g->dl.stride + (long long)(j * g->dl.ld + i), t, v);
      }
}

int cublasLtMatmul(void* handle, const Desc* d, const void* alpha, const void* A, const Layout* a, const void* B,
                   const Layout* b, const void* beta, const void* C, const Layout* c, void* D, const Layout* dl,
                   const Algo* algo, void* workspace, size_t workspace_size, void* stream) {
  (void)handle;
  if (!algo || algo->data[0] != ALGO_TAG) return refuse("cublasLtMatmul: an algorithm no heuristic query returned");
  if (!chained(d, a, b, c, dl)) return refuse("cublasLtMatmul: the layouts do not chain");
  if (workspace_size < algo->data[2] || (algo->data[2] && !workspace))
    return refuse("cublasLtMatmul: less workspace than the algorithm asked for");
  const uint64_t align = algo->data[1];
  uint64_t addresses = (uint64_t)A | (uint64_t)B | (uint64_t)C | (uint64_t)D;
  if (d->epilogue & EPI_BIAS) {
    if (!d->bias) return refuse("cublasLtMatmul: a bias epilogue without BIAS_POINTER");
    addresses |= d->bias;
  }
  if (addresses % align) return refuse("cublasLtMatmul: an operand less aligned than the heuristic query said");
  const int wide = d->compute == 70;
  Matmul* g = (Matmul*)malloc(sizeof *g);
  *g = (Matmul){*d, *a, *b, *c, *dl, wide ? *(const double*)alpha : *(const float*)alpha,
                wide ? *(const double*)beta : *(const float*)beta, A, B, C, D};
  char line[256];
  snprintf(line, sizeof line,
           "ltmatmul %c%c rows %llu cols %llu lda %lld ldb %lld ldc %lld ldd %lld batch %d type %d epilogue %u beta %g "
           "align %llu",
           d->transa ? 'T' : 'N', d->transb ? 'T' : 'N', (unsigned long long)dl->rows, (unsigned long long)dl->cols,
           (long long)a->ld, (long long)b->ld, (long long)c->ld, (long long)dl->ld, dl->batch, dl->type, d->epilogue,
           g->beta, (unsigned long long)align);
  logf_(line);
  fake_blas_enqueue(stream, matmul_run, g);
  return OK;
}
