//! The CPU prelude's GEMMs: cblas dispatch over the host's BLAS, the small-M, mid-M and 16-bit paths.
//! Spliced into cpu_runtime.h (namespace bpk) at its "@splice cpu_gemm.h" line; these //! lines are left
//! out (c_render.prelude).
// -------------------------------------------------------------------------- GEMM

// cblas_?gemm with 32-bit (LP64, I = int) or 64-bit (ILP64, I = int64_t) integers; the host says which
// it passed. Arguments: order, transa, transb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc.
template <class I, class T>
using CblasGemm = void (*)(int, int, int, I, I, I, T, const T*, I, const T*, I, T, T*, I);

template <class I, class T>
static void cblas_gemm(void* fn, int a_t, int b_t, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                       const T* B, int64_t ldb, T* C, int64_t ldc) {
  const int row_major = 101;
  reinterpret_cast<CblasGemm<I, T>>(fn)(row_major, a_t, b_t, I(M), I(N), I(K), T(1), A, I(lda), B, I(ldb), T(0), C,
                                        I(ldc));
}

struct Blas {
  void* sgemm = nullptr;
  void* dgemm = nullptr;
  int ilp64 = 0;
  // openblas_set_num_threads_local, when the BLAS has it: the executor runs BLAS single-threaded and
  // splits large GEMMs over its own pool, so two thread pools never spin against each other
  int (*set_threads_local)(int) = nullptr;
};

// C[m, n] = op(A)[m, k] @ op(B)[k, n]; row-major; used when the host supplied no BLAS.
template <class T>
static void gemm_fallback(RunState* st, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A,
                          int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) {
  parallel_for(st, M, N * K, [&](int64_t lo, int64_t hi) {
    std::vector<T> brow(N);
    for (int64_t i = lo; i < hi; ++i) {
      T* c = C + i * ldc;
      for (int64_t j = 0; j < N; ++j) c[j] = T(0);
      for (int64_t p = 0; p < K; ++p) {
        T a = ta ? A[p * lda + i] : A[i * lda + p];
        if (tb) {
          for (int64_t j = 0; j < N; ++j) brow[j] = B[j * ldb + p];
          for (int64_t j = 0; j < N; ++j) c[j] += a * brow[j];
        } else {
          const T* b = B + p * ldb;
          for (int64_t j = 0; j < N; ++j) c[j] += a * b[j];
        }
      }
    }
  });
}

template <class T>
static void gemm_call(RunState* st, const Blas& blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A,
                      int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc);

// Note [Small-M GEMMs]: a product with one to three rows (a decoder step, a small batch through a
// linear layer) is a few multiply-adds per weight element; BLAS libraries pack B for it first, which
// costs more than the product (OpenBLAS's Haswell kernels: 23 us for 3x256x256). Here B [K, N] is
// streamed once with rows x SMALL_CH accumulators in registers, and B^T [N, K] gives rows dot products
// per column sharing each load. Columns split over the pool in chunks of SMALL_CH; inside a chunk every
// block of SMALL_M rows reuses the chunk's columns of B from L1. Measured on the MLP sample (2-core
// AVX-512): GEMM time at batch 1 17.3 -> 4.4 us, batch 3 26.7 -> 10.2 us; LLaMA step at batch 1 10.4 ->
// 6.1 us. From four rows on, BLAS was as fast or faster than the B^T kernel (batch 8 18 against 25 us),
// so B^T products of more rows stay on BLAS. B [K, N] products (linear layers' weights are stored so,
// Note [Packed linear weights] in passes/pack_linear.py) of more rows take this path where measured
// faster than OpenBLAS on the same weights (`small_m_applies`): up to 16 rows on B of 8K elements and
// more whose columns are whole chunks (a column tail is copied into a padded chunk per row block, which
// costs more than OpenBLAS there), up to 64 rows on B of 64K elements and more — but on B of 512K
// elements (2 MB) and more only up to 16 rows per thread the kernel runs on, and on 1M (4 MB) and more
// up to 8 per thread. Those caps are measured in the kernel library, this kernel against the BLAS path
// (OpenBLAS on the same [K, N] weights; at two threads the rows split over the pool, each piece one
// BLAS call), built both ways and timed alternately in one process:
//   - One thread: on 768 x 3072 and 1024 x 1024 this kernel took 1.2-1.4x less time at 8 rows, the
//     same at 12 and 1.25-3x more at 16-64. On 512 x 1024, 1024 x 768 and 768 x 768 it won up to 16
//     rows (1.1-1.7x) and lost at 32-64 (0.53-0.80x; 768 x 768 still won 1.07x at 32).
//   - Two threads (columns split, against rows split): it won at 17 and 32 rows (1.17-1.53x) and lost
//     or tied at 64 (0.78-0.98x) on the 2 MB weights, and won at 8-12 rows, tied at 16 and lost at 32
//     (0.59-0.65x) on the 4 MB and larger ones.
#if defined(__AVX512F__)
constexpr int64_t SMALL_M = 4;  // rows per register block: SMALL_M x SMALL_CH accumulators (8 zmm)
#else
constexpr int64_t SMALL_M = 2;  // 8 ymm accumulators: AVX2 has 16 registers
#endif
constexpr int64_t SMALL_CH = 32;
constexpr int64_t SMALL_M_ROWS = BPK_SMALL_M_ROWS;  // products with at most this many rows ...
constexpr int64_t SMALL_M_MIN_NK = 4096;            // ... and at least this much of B take this path
constexpr int64_t SMALL_M_NN_ROWS = 16;             // B [K, N] products up to this many rows ...
constexpr int64_t SMALL_M_NN_MIN_NK = 8192;         // ... with at least this much of B, whole chunks of columns
constexpr int64_t SMALL_M_NN_WIDE_ROWS = 64;        // ... and up to this many rows ...
constexpr int64_t SMALL_M_NN_WIDE_NK = 65536;       // ... with at least this much of B
constexpr int64_t SMALL_M_NN_LARGE = int64_t(1) << 19;  // B of at least this many elements ...
constexpr int64_t SMALL_M_NN_LARGE_ROWS = 16;           // ... up to this many rows per thread,
constexpr int64_t SMALL_M_NN_HUGE = int64_t(1) << 20;   // of at least this many ...
constexpr int64_t SMALL_M_NN_HUGE_ROWS = 8;             // ... up to this many per thread

// The B [K, N] bounds are measured (bench/results/profiles.md "Small-M GEMMs on [K, N] weights"): this
// kernel against OpenBLAS on the same weights, 10 weight shapes x 10 row counts, in the kernel library.
// `threads`: how many threads the kernel would run on (a piece of rows inside a parallel loop: one).
static inline bool small_m_applies(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int threads = 1) {
  if (ta) return false;
  if (M <= SMALL_M_ROWS) return N * K >= SMALL_M_MIN_NK;
  if (tb || (N * K >= SMALL_M_NN_LARGE && M > SMALL_M_NN_LARGE_ROWS * threads)) return false;
  if (N * K >= SMALL_M_NN_HUGE && M > SMALL_M_NN_HUGE_ROWS * threads) return false;
  if (M <= SMALL_M_NN_ROWS && N * K >= SMALL_M_NN_MIN_NK && N % SMALL_CH == 0) return true;
  return M <= SMALL_M_NN_WIDE_ROWS && N * K >= SMALL_M_NN_WIDE_NK;
}

// Note [Small-M prefetch]: a chunk reads SMALL_CH columns (128 bytes of float) from each of K rows of B,
// ldb apart. Once B is out of cache and the rows are pages apart (a 768 x 3072 weight: 12 KB), the
// hardware prefetchers see no stream and each row is a memory round trip; the one-row loop prefetches
// the rows SMALL_M_PREFETCH ahead (both cache lines of each of its two rows) when rows are more than
// 4 KB apart. Measured in the kernel library, built with and without it, one thread, alternating: 768 x
// 3072 at one row 1200 -> 564-616 µs (2x); on rows 3-4 KB apart (1024 x 1024, 768 x 768, 256 x 1024)
// it measured 0.85-1.03x, inside this machine's noise but never a gain, so those go without. Blocks of
// two rows and more, measured with it too, gained nothing on the large weight and lost up to 23% on
// smaller ones.
constexpr int64_t SMALL_M_PREFETCH = 16;

template <class T>
static inline void small_m_prefetch(const T* row, int64_t next) {  // `row` and the row `next` after it
  __builtin_prefetch(row);
  __builtin_prefetch(row + SMALL_CH - 1);
  __builtin_prefetch(row + next);
  __builtin_prefetch(row + next + SMALL_CH - 1);
}

// One chunk of SMALL_CH columns: C[R, :w] = A[R, K] . b[K, SMALL_CH] (b's rows ldb apart; all SMALL_CH
// columns are read, the first w stored).
template <class T, int R>
static void small_m_nn_chunk(int64_t K, const T* A, int64_t lda, const T* b, int64_t ldb, T* C, int64_t ldc,
                             int64_t w) {
  T acc[R][SMALL_CH] = {};
  if (R == 1) {  // one row: two partial sums over alternate k, so the multiply-adds do not wait on each other
    T acc1[SMALL_CH] = {};
    const bool prefetch = ldb * int64_t(sizeof(T)) > 4096;  // Note [Small-M prefetch]
    int64_t p = 0;
    for (; p + 2 <= K; p += 2) {
      const T a0 = A[p], a1 = A[p + 1];
      const T* b0 = b + p * ldb;
      const T* b1 = b0 + ldb;
      if (prefetch && p + SMALL_M_PREFETCH + 2 <= K) small_m_prefetch(b0 + SMALL_M_PREFETCH * ldb, ldb);
#pragma omp simd
      for (int64_t q = 0; q < SMALL_CH; ++q) {
        acc[0][q] += a0 * b0[q];
        acc1[q] += a1 * b1[q];
      }
    }
    if (p < K) {
      const T a0 = A[p];
      const T* b0 = b + p * ldb;
#pragma omp simd
      for (int64_t q = 0; q < SMALL_CH; ++q) acc[0][q] += a0 * b0[q];
    }
#pragma omp simd
    for (int64_t q = 0; q < SMALL_CH; ++q) acc[0][q] += acc1[q];
  } else {
    for (int64_t p = 0; p < K; ++p) {
      const T* bp = b + p * ldb;
      for (int r = 0; r < R; ++r) {
        const T a = A[r * lda + p];
#pragma omp simd
        for (int64_t q = 0; q < SMALL_CH; ++q) acc[r][q] += a * bp[q];
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int64_t q = 0; q < w; ++q) C[r * ldc + q] = acc[r][q];
}

template <class T, int R>
static void small_m_nn(int64_t n0, int64_t n1, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                       int64_t ldc) {
  int64_t j = n0;
  for (; j + SMALL_CH <= n1; j += SMALL_CH) small_m_nn_chunk<T, R>(K, A, lda, B + j, ldb, C + j, ldc, SMALL_CH);
  if (j < n1) {  // a column tail: its columns of B copied into a zero-padded full-width chunk
    const int64_t w = n1 - j;
    static thread_local std::vector<T> tail_;
    if (int64_t(tail_.size()) < K * SMALL_CH) tail_.resize(size_t(K * SMALL_CH));
    T* bt = tail_.data();
    for (int64_t p = 0; p < K; ++p) {
      for (int64_t q = 0; q < w; ++q) bt[p * SMALL_CH + q] = B[p * ldb + j + q];
      for (int64_t q = w; q < SMALL_CH; ++q) bt[p * SMALL_CH + q] = T(0);
    }
    small_m_nn_chunk<T, R>(K, A, lda, bt, SMALL_CH, C + j, ldc, w);
  }
}

template <class T, int R>
static void small_m_nt(int64_t n0, int64_t n1, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                       int64_t ldc) {
  if (K < 16) {  // short dot products (a head dim of 8): the columns are the vector lanes
    for (int64_t j = n0; j < n1; j += SMALL_CH) {
      const int64_t w = std::min(SMALL_CH, n1 - j);
      for (int r = 0; r < R; ++r) {
        T acc[SMALL_CH] = {};
        for (int64_t p = 0; p < K; ++p) {
          const T a = A[r * lda + p];
          const T* b = B + j * ldb + p;
#pragma omp simd
          for (int64_t q = 0; q < w; ++q) acc[q] += a * b[q * ldb];
        }
        for (int64_t q = 0; q < w; ++q) C[r * ldc + j + q] = acc[q];
      }
    }
    return;
  }
  for (int64_t j = n0; j < n1; ++j) {
    const T* b = B + j * ldb;
    T s[R] = {};
    for (int r = 0; r < R; ++r) {
      const T* a = A + r * lda;
      T acc = T(0);
#pragma omp simd reduction(+ : acc)
      for (int64_t p = 0; p < K; ++p) acc += a[p] * b[p];
      s[r] = acc;
    }
    for (int r = 0; r < R; ++r) C[r * ldc + j] = s[r];
  }
}

template <class T, int R>
static void small_m_rows(bool tb, int64_t n0, int64_t n1, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
                         T* C, int64_t ldc) {
  if (tb)
    small_m_nt<T, R>(n0, n1, K, A, lda, B, ldb, C, ldc);
  else
    small_m_nn<T, R>(n0, n1, K, A, lda, B, ldb, C, ldc);
}

// Note [Recurrent products]: C[:M, n0:n1] = A[M, K] . B[K, n0:n1] (B's rows ldb apart) on the calling
// thread: a team member's share of a recurrent step, h @ W_hh^T for a block of sequences and the
// member's columns (Note [Recurrent kernel] in codegen/recurrent_kernel.py). The member reads the same
// slice of B every step: columns in groups of REC_GROUP (a [K, 128] slice, 128 KB at K = 256), every
// block of up to 4 rows of A over a group before the next, so a group is read from L2 once per block
// of rows rather than from memory; inside a group, panels as wide as REC_ACC vector accumulators allow
// (16 of AVX-512's 32 registers, 12 of AVX2's 16; at most 128 columns) held across all of K, B's rows
// REC_PREFETCH ahead prefetched into L1. Measured with standalone copies of these loops, one thread,
// on a 2-core Xeon at x86-64-v4 and -v3, H = 128 / 256 / 512 with 4 gates: against small_m_nn's
// 32-column chunks 1.1-1.6x less time at 1 to 4 rows but at one point (H = 128, 4 rows, v3: even),
// e.g. H = 256, one row 50 -> 39 us. The prefetch pays even where a member's slice stays in L2: in the
// kernel, a bidirectional LSTM of 128 at one sequence of 256 steps took 3.6 ms without it on slices
// under 256 KB, 2.3 ms with it (bench.recurrent, paired runs).
#if defined(__AVX512F__)
constexpr int REC_VBYTES = 64;
constexpr int REC_ACC = 16;  // of 32 vector registers
#elif defined(__AVX__)
constexpr int REC_VBYTES = 32;
constexpr int REC_ACC = 12;  // of 16: the rest hold B's vectors and A's broadcast
#else
constexpr int REC_VBYTES = 16;
constexpr int REC_ACC = 12;
#endif
constexpr int64_t REC_PREFETCH = 4;

template <class T, int R>
constexpr int rec_width() {
  return (REC_ACC / R) * (REC_VBYTES / int(sizeof(T))) > 128 ? 128 : (REC_ACC / R) * (REC_VBYTES / int(sizeof(T)));
}

template <class T, int R, int W>
static void rec_panel(int64_t K, const T* A, int64_t lda, const T* b, int64_t ldb, T* C, int64_t ldc) {
  T acc[R][W] = {};
  constexpr int line = 64 / int(sizeof(T));
  for (int64_t p = 0; p < K; ++p) {
    const T* bp = b + p * ldb;
    if (p + REC_PREFETCH < K)
      for (int q = 0; q < W; q += line) __builtin_prefetch(bp + REC_PREFETCH * ldb + q);
    for (int r = 0; r < R; ++r) {
      const T a = A[r * lda + p];
#pragma omp simd
      for (int q = 0; q < W; ++q) acc[r][q] += a * bp[q];
    }
  }
  // Note [Accumulator stores] (codegen/cpu_conv_winograd.py): a plain copy of acc kept one accumulator
  // on the stack through the loop above (AVX2: a store and a reload per row of B)
  for (int r = 0; r < R; ++r)
#pragma omp simd
    for (int q = 0; q < W; ++q) C[r * ldc + q] = acc[r][q] + T(0);
}

// The last w < W columns (a width that is no multiple of the panel's).
template <class T, int R>
static void rec_tail(int64_t K, const T* A, int64_t lda, const T* b, int64_t ldb, T* C, int64_t ldc, int64_t w) {
  for (int r = 0; r < R; ++r)
    for (int64_t q = 0; q < w; ++q) C[r * ldc + q] = T(0);
  for (int64_t p = 0; p < K; ++p)
    for (int r = 0; r < R; ++r) {
      const T a = A[r * lda + p];
      for (int64_t q = 0; q < w; ++q) C[r * ldc + q] += a * b[p * ldb + q];
    }
}

template <class T, int R>
static void rec_rows(int64_t n0, int64_t n1, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                     int64_t ldc) {
  constexpr int W = rec_width<T, R>();
  constexpr int V = REC_VBYTES / int(sizeof(T));
  int64_t j = n0;
  for (; j + W <= n1; j += W) rec_panel<T, R, W>(K, A, lda, B + j, ldb, C + j, ldc);
  // Note [Vector remainders]: what the full panels leave (a team member's share of the columns is a
  // multiple of 16) in at most one panel each of 8, 4, 2 and 1 whole vectors narrower than W (W is a
  // whole number of vectors, so what is left after the 2-vector panel is under 2): halving W left widths
  // of part of a vector (AVX2's 24-column panel for 4 rows: 6, then 2 columns in rec_tail's loops over
  // C in memory)
  if (8 * V < W && j + 8 * V <= n1) rec_panel<T, R, (8 * V < W ? 8 * V : V)>(K, A, lda, B + j, ldb, C + j, ldc), j += 8 * V;
  if (4 * V < W && j + 4 * V <= n1) rec_panel<T, R, (4 * V < W ? 4 * V : V)>(K, A, lda, B + j, ldb, C + j, ldc), j += 4 * V;
  if (2 * V < W && j + 2 * V <= n1) rec_panel<T, R, (2 * V < W ? 2 * V : V)>(K, A, lda, B + j, ldb, C + j, ldc), j += 2 * V;
  if (V <= W && j + V <= n1) rec_panel<T, R, V>(K, A, lda, B + j, ldb, C + j, ldc), j += V;
  if (j < n1) rec_tail<T, R>(K, A, lda, B + j, ldb, C + j, ldc, n1 - j);
}

constexpr int64_t REC_GROUP = 128;

template <class T>
static void recurrent_product(int64_t M, int64_t n0, int64_t n1, int64_t K, const T* A, int64_t lda,
                              const T* B, int64_t ldb, T* C, int64_t ldc) {
  for (int64_t g0 = n0; g0 < n1; g0 += REC_GROUP) {
    const int64_t g1 = std::min(n1, g0 + REC_GROUP);
    for (int64_t i = 0; i < M; i += 4) {
      const T* a = A + i * lda;
      T* c = C + i * ldc;
      switch (std::min<int64_t>(4, M - i)) {
        case 1: rec_rows<T, 1>(g0, g1, K, a, lda, B, ldb, c, ldc); break;
        case 2: rec_rows<T, 2>(g0, g1, K, a, lda, B, ldb, c, ldc); break;
        case 3: rec_rows<T, 3>(g0, g1, K, a, lda, B, ldb, c, ldc); break;
        default: rec_rows<T, 4>(g0, g1, K, a, lda, B, ldb, c, ldc); break;
      }
    }
  }
}


template <class T>
static void small_m_gemm(RunState* st, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                         const T* B, int64_t ldb, T* C, int64_t ldc) {
  const int64_t chunks = (N + SMALL_CH - 1) / SMALL_CH;
  parallel_for(st, chunks, SMALL_CH * K * M, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      const int64_t n0 = ch * SMALL_CH, n1 = std::min(N, n0 + SMALL_CH);
      for (int64_t i = 0; i < M; i += SMALL_M) {
        const T* a = A + i * lda;
        T* c = C + i * ldc;
        switch (std::min(SMALL_M, M - i)) {
          case 1: small_m_rows<T, 1>(tb, n0, n1, K, a, lda, B, ldb, c, ldc); break;
          case 2: small_m_rows<T, 2>(tb, n0, n1, K, a, lda, B, ldb, c, ldc); break;
          case 3: small_m_rows<T, 3>(tb, n0, n1, K, a, lda, B, ldb, c, ldc); break;
          default: small_m_rows<T, SMALL_M>(tb, n0, n1, K, a, lda, B, ldb, c, ldc); break;
        }
      }
    }
  });
}

// Note [Mid-M GEMMs]: a linear layer's product A [M, K] @ W [N, K]^T (B transposed, as nn.Linear and
// ONNX Gemm(transB=1) store weights) with a large W and 4 <= M <= min(MID_M_ROWS, K / MID_M_K_PER_ROW)
// rows runs on a register-blocked kernel here rather than BLAS: OpenBLAS leaves its small-matrix path
// above four rows and packs all of W on every call. A block is MID_R rows x MID_C columns of C held in
// vector accumulators across the whole of K (each lane a partial dot product over K), so each vector
// of A and of W loaded feeds MID_C or MID_R multiply-adds; the lanes are summed once per output at the
// end, which is what a short K pays for. Columns split over the pool in chunks of MID_CHUNK; inside a
// chunk every row block reuses the chunk's W rows from L1 / L2. The bounds are measured, in the kernel
// library against numpy's OpenBLAS on the samples' and larger weight shapes at 1 and 2 threads
// (bench/results/profiles.md "Mid-M GEMMs"): with W of 64K elements or more (256 x 256 up) this kernel
// took 1.5-9x less time up to 32 rows at K = 256 and up to 64 rows at K = 1024 (about even at K = 256,
// 48-64 rows); with smaller W (64 x 172, 128 x 128, 256 x 64) OpenBLAS, whose packing then fits in
// cache, was faster at most row counts, so those stay on BLAS.
#if defined(__AVX512F__)
constexpr int MID_VBYTES = 64;
constexpr int MID_C = 4;
#else
constexpr int MID_VBYTES = 32;
constexpr int MID_C = 2;
#endif
constexpr int MID_R = 4;
constexpr int64_t MID_CHUNK = 16;
constexpr int64_t MID_M_ROWS = 64;      // products with SMALL_M_ROWS+1 .. this many rows ...
constexpr int64_t MID_M_K_PER_ROW = 8;  // ... and at most K / this many ...
constexpr int64_t MID_M_MIN_K = 32;     // ... a reduction at least this long ...
constexpr int64_t MID_M_MIN_N = 32;     // ... at least this many columns ...
constexpr int64_t MID_M_MIN_NK = 65536;  // ... and at least this much of W take this path (smaller: BLAS)

template <class T>
struct MidVec {
  typedef T V __attribute__((vector_size(MID_VBYTES)));
  static constexpr int64_t L = MID_VBYTES / sizeof(T);
  static V load(const T* p) {
    V v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
  }
  static T sum(V v) {
    T s = T(0);
    for (int64_t q = 0; q < L; ++q) s += v[q];
    return s;
  }
};

// C[rows, cols] = A[rows, K] . B[cols, K] for rows <= MID_R and cols <= MID_C (R, CN: the full block)
template <class T, int R, int CN>
static void mid_m_block(int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) {
  typedef MidVec<T> M;
  typename M::V acc[R][CN];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < CN; ++c) acc[r][c] = typename M::V{};
  int64_t p = 0;
  for (; p + M::L <= K; p += M::L) {
    typename M::V a[R];
    for (int r = 0; r < R; ++r) a[r] = M::load(A + r * lda + p);
    for (int c = 0; c < CN; ++c) {
      const typename M::V b = M::load(B + c * ldb + p);
      for (int r = 0; r < R; ++r) acc[r][c] += a[r] * b;
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < CN; ++c) {
      T s = M::sum(acc[r][c]);
      for (int64_t q = p; q < K; ++q) s += A[r * lda + q] * B[c * ldb + q];
      C[r * ldc + c] = s;
    }
}

template <class T, int R>
static void mid_m_cols(int64_t cols, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) {
  switch (cols) {
    case 1: mid_m_block<T, R, 1>(K, A, lda, B, ldb, C, ldc); break;
#if defined(__AVX512F__)
    case 2: mid_m_block<T, R, 2>(K, A, lda, B, ldb, C, ldc); break;
    case 3: mid_m_block<T, R, 3>(K, A, lda, B, ldb, C, ldc); break;
#endif
    default: mid_m_block<T, R, MID_C>(K, A, lda, B, ldb, C, ldc); break;
  }
}

template <class T>
static void mid_m_gemm(RunState* st, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                       int64_t ldb, T* C, int64_t ldc) {
  const int64_t chunks = (N + MID_CHUNK - 1) / MID_CHUNK;
  parallel_for(st, chunks, MID_CHUNK * K * M, [&](int64_t lo, int64_t hi) {
    const int64_t n1 = std::min(N, hi * MID_CHUNK);
    for (int64_t j = lo * MID_CHUNK; j < n1; j += MID_C) {
      const int64_t cols = std::min<int64_t>(MID_C, n1 - j);
      for (int64_t i = 0; i < M; i += MID_R) {
        const T* a = A + i * lda;
        const T* b = B + j * ldb;
        T* c = C + i * ldc + j;
        switch (std::min<int64_t>(MID_R, M - i)) {
          case 1: mid_m_cols<T, 1>(cols, K, a, lda, b, ldb, c, ldc); break;
          case 2: mid_m_cols<T, 2>(cols, K, a, lda, b, ldb, c, ldc); break;
          case 3: mid_m_cols<T, 3>(cols, K, a, lda, b, ldb, c, ldc); break;
          default: mid_m_cols<T, MID_R>(cols, K, a, lda, b, ldb, c, ldc); break;
        }
      }
    }
  });
}

static inline bool mid_m_applies(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  return !ta && tb && M > SMALL_M_ROWS && M <= MID_M_ROWS && M * MID_M_K_PER_ROW <= K && K >= MID_M_MIN_K &&
         N >= MID_M_MIN_N && N * K >= MID_M_MIN_NK;
}

// Splits M over the pool when the GEMM is large enough; each piece is one single-threaded BLAS call.
template <class T>
static void gemm_one(RunState* st, const Blas& blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A,
                     int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) {
  if (mid_m_applies(ta, tb, M, N, K)) {  // Note [Mid-M GEMMs]: splits its columns over the pool itself
    mid_m_gemm<T>(st, M, N, K, A, lda, B, ldb, C, ldc);
    return;
  }
  const int threads = st->pool ? st->pool->nthreads : 1;
  if (small_m_applies(ta, tb, M, N, K, threads)) {  // Note [Small-M GEMMs]: splits its columns over the pool
    small_m_gemm<T>(st, tb, M, N, K, A, lda, B, ldb, C, ldc);
    return;
  }
  if (threads > 1 && M >= 2 * threads && M * N * K >= (int64_t(1) << 18) && blas.sgemm != nullptr) {
    const int64_t parts = threads;
    parallel_for(st, parts, int64_t(1) << 20, [&](int64_t lo, int64_t hi) {
      for (int64_t p = lo; p < hi; ++p) {
        const int64_t m0 = M * p / parts, m1 = M * (p + 1) / parts;
        const T* a = ta ? A + m0 : A + m0 * lda;
        gemm_call<T>(st, blas, ta, tb, m1 - m0, N, K, a, lda, B, ldb, C + m0 * ldc, ldc);
      }
    });
    return;
  }
  gemm_call<T>(st, blas, ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
}

template <class T>
static void gemm_call(RunState* st, const Blas& blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A,
                      int64_t lda, const T* B, int64_t ldb, T* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = T(0);
    return;
  }
  if (small_m_applies(ta, tb, M, N, K)) {  // Note [Small-M GEMMs]
    small_m_gemm<T>(st, tb, M, N, K, A, lda, B, ldb, C, ldc);
    return;
  }
  if (mid_m_applies(ta, tb, M, N, K)) {  // Note [Mid-M GEMMs] (a batch entry, or a piece of rows)
    mid_m_gemm<T>(st, M, N, K, A, lda, B, ldb, C, ldc);
    return;
  }
  const int no_trans = 111, trans = 112;
  void* fn = sizeof(T) == 4 ? blas.sgemm : blas.dgemm;
  if (fn == nullptr) {
    gemm_fallback<T>(st, ta, tb, M, N, K, A, lda, B, ldb, C, ldc);
    return;
  }
  int a_t = ta ? trans : no_trans, b_t = tb ? trans : no_trans;
  if (blas.set_threads_local) blas.set_threads_local(1);  // pool threads too (thread-local setting)
  if (blas.ilp64)
    cblas_gemm<int64_t, T>(fn, a_t, b_t, M, N, K, A, lda, B, ldb, C, ldc);
  else
    cblas_gemm<int, T>(fn, a_t, b_t, M, N, K, A, lda, B, ldb, C, ldc);
}

// ints: b0 b1 b2 (batch extents), sa0 sa1 sa2, sb0 sb1 sb2, sc0 sc1 sc2 (element strides per batch
// dim), M N K ta tb lda ldb ldc. Note [Batched GEMMs]: a batch of GEMMs each too small to split runs
// its batch entries in parallel, one single-threaded BLAS call each (attention's per-head products at
// moderate sequence lengths);
// a large GEMM splits its rows over the pool inside gemm_one. (Plain loops instead of BLAS for the
// tiniest products were measured slower: short runtime-length vector loops cost more than OpenBLAS's
// small-matrix path.)
template <class T>
static void gemm_batched(RunState* st, const Blas& blas, const T* A, const T* B, T* C, const int64_t* I) {
  const int64_t nb = I[0] * I[1] * I[2], M = I[12], N = I[13], K = I[14];
  const bool ta = I[15] != 0, tb = I[16] != 0;
  const int64_t work = M * N * K;
  // below ~16K multiply-adds per product, concurrent BLAS calls contend inside OpenBLAS (its buffer
  // pool) and the batch runs faster serially; measured on the encoder's per-head products. Products
  // the small-M kernels take (Note [Small-M GEMMs]) call no BLAS: a decoder step's per-head attention
  // over its KV cache (M = 1) splits its batch over the pool whatever its size.
  const bool small_m = small_m_applies(ta, tb, M, N, K);
  if (nb >= 2 && ((work >= (int64_t(1) << 14) && work < (int64_t(1) << 18)) || small_m)) {
    parallel_for(st, nb, work + 1, [&](int64_t lo, int64_t hi) {
      for (int64_t b = lo; b < hi; ++b) {
        const int64_t i2 = b % I[2], i1 = (b / I[2]) % I[1], i0 = b / (I[2] * I[1]);
        const T* a = A + i0 * I[3] + i1 * I[4] + i2 * I[5];
        const T* bb = B + i0 * I[6] + i1 * I[7] + i2 * I[8];
        T* c = C + i0 * I[9] + i1 * I[10] + i2 * I[11];
        gemm_call<T>(st, blas, ta, tb, M, N, K, a, I[17], bb, I[18], c, I[19]);
      }
    });
    return;
  }
  for (int64_t i0 = 0; i0 < I[0]; ++i0)
    for (int64_t i1 = 0; i1 < I[1]; ++i1)
      for (int64_t i2 = 0; i2 < I[2]; ++i2)
        gemm_one<T>(st, blas, ta, tb, M, N, K, A + i0 * I[3] + i1 * I[4] + i2 * I[5], I[17],
                    B + i0 * I[6] + i1 * I[7] + i2 * I[8], I[18], C + i0 * I[9] + i1 * I[10] + i2 * I[11], I[19]);
}

// Note [16-bit GEMMs]: float16 / bfloat16 products widen A and B to float32, run the float32 path
// (BLAS, the small-M kernels) and round C once, as cuBLAS computes them (float32 accumulation). Each
// batch entry converts its operands into thread-local scratch; the conversions are O(MK + KN + MN)
// against the product's O(MNK).
template <class H>
static void widen_rows(const H* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[r * cols + c] = src[r * ld + c];
}

template <class H>
static void gemm_half_one(RunState* st, const Blas& blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, const H* A,
                          int64_t lda, const H* B, int64_t ldb, H* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  thread_local std::vector<float> scratch;
  scratch.resize(size_t(M * K + K * N + M * N));
  float *a = scratch.data(), *b = a + M * K, *c = b + K * N;
  widen_rows(A, ta ? K : M, ta ? M : K, lda, a);
  widen_rows(B, tb ? N : K, tb ? K : N, ldb, b);
  gemm_one<float>(st, blas, ta, tb, M, N, K, a, ta ? M : K, b, tb ? K : N, c, N);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) C[i * ldc + j] = c[i * N + j];
}

template <class H>
static void gemm_batched_half(RunState* st, const Blas& blas, const H* A, const H* B, H* C, const int64_t* I) {
  for (int64_t i0 = 0; i0 < I[0]; ++i0)
    for (int64_t i1 = 0; i1 < I[1]; ++i1)
      for (int64_t i2 = 0; i2 < I[2]; ++i2)
        gemm_half_one<H>(st, blas, I[15] != 0, I[16] != 0, I[12], I[13], I[14], A + i0 * I[3] + i1 * I[4] + i2 * I[5],
                         I[17], B + i0 * I[6] + i1 * I[7] + i2 * I[8], I[18],
                         C + i0 * I[9] + i1 * I[10] + i2 * I[11], I[19]);
}

