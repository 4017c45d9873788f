// bladepack CPU runtime prelude: pasted at the top of every generated kernel library.
//
// In: nothing (only the C++17 standard library). Out: the executor that runs a prepared launch list in
// one native call (Note [Launch words]), a small persistent thread pool (no OpenMP: a process that has
// torch already holds one OpenMP runtime), the GEMM dispatcher over a host-supplied cblas_?gemm with a
// portable blocked fallback, and the helpers generated kernels use.
//
// Note [Launch words]: the loader resolves the plan for one input-shape signature into a flat int64
// array of records  [op, a, nptr, nint, (slot, byte offset) x nptr, int x nint]; a pointer argument is
// slots[slot] + offset, where slot 0 is the arena and the others are inputs, outputs and weights. The
// record ops are BPK_OP_KERNEL (a = index into the kernel table: kernel base + variant) and BPK_OP_GEMM
// (a = 0 for float32, 1 for float64, 2 for float16, 3 for bfloat16; ints in the order of bpk_gemm
// below).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <type_traits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#define BPK_ABI_VERSION 1
#define BPK_OP_KERNEL 1
#define BPK_OP_GEMM 2
#ifndef BPK_SMALL_M_ROWS
#define BPK_SMALL_M_ROWS 3
#endif
#define BPK_RESTRICT __restrict__

namespace bpk {

struct Pool;

// One run: the failure a kernel reports (the first one wins) and the pool it may use.
struct RunState {
  Pool* pool;
  std::atomic<int64_t> err_code{0};
  std::atomic<int64_t> err_value{0};
  std::atomic<int64_t> err_extra{0};
  void fail(int64_t code, int64_t value, int64_t extra = 0) {
    int64_t expected = 0;
    if (err_code.compare_exchange_strong(expected, code)) {
      err_value.store(value);
      err_extra.store(extra);
    }
  }
};

typedef void (*KernelFn)(RunState*, void* const*, const int64_t*);
typedef int64_t (*CheckFn)(const int64_t*, const int64_t*, int64_t*);

// Checked int64 arithmetic for the kernels' operand checks (Note [Kernel operand checks] in
// bladepack/codegen/operand_check.py): the shape program's semantics, with *o set instead of a guard
// error on overflow or a zero divisor.
namespace chk {
inline int64_t add(int64_t a, int64_t b, bool* o) {
  int64_t v = 0;
  if (__builtin_add_overflow(a, b, &v)) *o = true;
  return v;
}
inline int64_t sub(int64_t a, int64_t b, bool* o) {
  int64_t v = 0;
  if (__builtin_sub_overflow(a, b, &v)) *o = true;
  return v;
}
inline int64_t mul(int64_t a, int64_t b, bool* o) {
  int64_t v = 0;
  if (__builtin_mul_overflow(a, b, &v)) *o = true;
  return v;
}
inline int64_t floordiv(int64_t a, int64_t b, bool* o) {
  if (b == 0 || (b == -1 && a == std::numeric_limits<int64_t>::min())) {
    *o = true;
    return 0;
  }
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
inline int64_t ceildiv(int64_t a, int64_t b, bool* o) {
  if (a == std::numeric_limits<int64_t>::min()) {
    *o = true;
    return 0;
  }
  return -floordiv(-a, b, o);
}
inline int64_t mod(int64_t a, int64_t b, bool* o) {
  if (b == 0) {
    *o = true;
    return 0;
  }
  if (b == -1) return 0;
  const int64_t v = a % b;
  return (v != 0 && ((v < 0) != (b < 0))) ? v + b : v;
}
inline int64_t min(int64_t a, int64_t b, bool*) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b, bool*) { return a > b ? a : b; }
inline int64_t lt(int64_t a, int64_t b, bool*) { return a < b; }
inline int64_t le(int64_t a, int64_t b, bool*) { return a <= b; }
inline int64_t eq(int64_t a, int64_t b, bool*) { return a == b; }
inline int64_t ne(int64_t a, int64_t b, bool*) { return a != b; }
// status = [launch (filled by bpk_check), code, value, extra]
inline int64_t fail(int64_t* status, int64_t code, int64_t value, int64_t extra = 0) {
  status[1] = code;
  status[2] = value;
  status[3] = extra;
  return code;
}
}  // namespace chk
typedef void (*RangeFn)(void*, int64_t, int64_t);

// A persistent pool. Note [Pool jobs]: a job is [0, n) cut into up to 4 chunks per thread that the
// caller and the workers claim from one counter, so the caller never waits for a worker that has not
// started: a worker that the OS has not scheduled (the machine busy with another runtime's threads)
// simply finds no chunk left. A worker takes part only by joining the job (a CAS on `job` while it is
// open); the caller closes the job when the chunks run out and waits only for the workers that joined,
// which are running. Workers spin briefly between jobs, then sleep on a condition variable, so
// back-to-back kernels pay no wake-up while an idle process does not burn a core.
struct Pool {
  static constexpr uint64_t kClosed = uint64_t(1) << 16, kJoinMask = kClosed - 1;
  int nthreads = 1;
  std::vector<std::thread> workers;
  std::mutex mu, run_mu;
  std::condition_variable cv;
  std::atomic<uint64_t> job{kClosed};  // (id << 17) | closed bit | joined workers
  std::atomic<int64_t> next{0};        // next chunk to claim
  std::atomic<int> left{0};            // joined workers that have finished
  std::atomic<int> sleepers{0};
  std::atomic<bool> stop{false};
  RangeFn fn = nullptr;
  void* closure = nullptr;
  int64_t n = 0, chunks = 0;

  explicit Pool(int threads) : nthreads(threads < 1 ? 1 : threads) {
    for (int t = 1; t < nthreads; ++t) workers.emplace_back([this] { loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> g(mu);
      stop.store(true);
      job.fetch_add(uint64_t(1) << 17);
    }
    cv.notify_all();
    for (auto& w : workers) w.join();
  }
  static void relax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  void work() {
    for (;;) {
      int64_t c = next.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) return;
      int64_t lo = n * c / chunks, hi = n * (c + 1) / chunks;
      fn(closure, lo, hi);
    }
  }
  void loop() {
    uint64_t seen = job.load() >> 17;
    for (;;) {
      uint64_t j = job.load(std::memory_order_acquire);
      for (int spins = 0; (j >> 17) == seen && spins < 4000 && !stop.load(std::memory_order_relaxed); ++spins) {
        relax();
        j = job.load(std::memory_order_acquire);
      }
      if ((j >> 17) == seen) {
        // `stop` too: a pool destroyed before this worker first read `job` never changes it again
        std::unique_lock<std::mutex> lk(mu);
        sleepers.fetch_add(1);
        cv.wait(lk, [&] { return (job.load() >> 17) != seen || stop.load(); });
        sleepers.fetch_sub(1);
        j = job.load(std::memory_order_acquire);
      }
      if (stop.load()) return;
      seen = j >> 17;
      while (!(j & kClosed) && (j >> 17) == seen) {  // join while the job is open
        if (job.compare_exchange_weak(j, j + 1, std::memory_order_acq_rel)) {
          work();
          left.fetch_add(1, std::memory_order_release);
          break;
        }
      }
    }
  }
  void run(int64_t count, RangeFn f, void* c) {
    std::unique_lock<std::mutex> busy(run_mu, std::try_to_lock);
    if (!busy.owns_lock() || nthreads == 1) {  // another thread's run holds the pool: run inline
      f(c, 0, count);
      return;
    }
    fn = f;
    closure = c;
    n = count;
    chunks = count < 4 * nthreads ? count : 4 * nthreads;
    next.store(0, std::memory_order_relaxed);
    left.store(0, std::memory_order_relaxed);
    uint64_t id = (job.load() >> 17) + 1;
    job.store(id << 17, std::memory_order_release);  // open, nobody joined
    if (sleepers.load() > 0) {
      std::lock_guard<std::mutex> g(mu);
      cv.notify_all();
    }
    work();
    int joined = int(job.fetch_or(kClosed, std::memory_order_acq_rel) & kJoinMask);
    for (int spins = 0; left.load(std::memory_order_acquire) != joined; ++spins) {
      if (spins < 2000) {
        relax();
      } else {
        std::this_thread::yield();  // a joined worker was preempted: let it have this core
      }
    }
  }
};

// Runs body(lo, hi) over [0, n) on the pool when the work (n * cost, in rough element-operations) is
// large enough to pay for the hand-off, else inline.
template <class F>
inline void parallel_for(RunState* st, int64_t n, int64_t cost, F&& body) {
  if (n <= 0) return;
  if (st->pool == nullptr || st->pool->nthreads == 1 || n < 2 || n * cost < 32768) {
    body(int64_t(0), n);
    return;
  }
  struct Closure {
    F* f;
  } c{&body};
  st->pool->run(
      n, [](void* p, int64_t lo, int64_t hi) { (*static_cast<Closure*>(p)->f)(lo, hi); }, &c);
}

// -------------------------------------------------------------------------- math helpers

// Branch-free float exp and erf that the compiler vectorizes (the libm calls stay scalar without
// -ffast-math). exp: Cephes-style range reduction and a degree-6 polynomial, ~1 ulp, 0 below -87.3,
// inf above 88.7, NaN stays NaN. erf: a rational approximation on [-4, 4] (odd degree-13 numerator,
// even degree-8 denominator), a few ulp; erf(+-4) rounds to +-1 in float. Doubles use libm.
inline float vexp(float x) {
  const float hi = 88.72283935546875f, lo = -87.33654022216797f;
  float xc = x < lo ? lo : x;
  xc = xc > hi ? hi : xc;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick: float-to-int conversions and floor() keep GCC from
  // vectorizing this loop body on AVX2 / AVX-512 targets ("control flow in loop")
  const float fn = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = xc - fn * 0.693359375f + fn * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  const int32_t bits = (int32_t(fn) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  float out = y * scale;
  out = x < lo ? 0.0f : out;
  out = x > hi ? std::numeric_limits<float>::infinity() : out;
  return x != x ? x : out;
}
inline double vexp(double x) { return std::exp(x); }
inline float verf(float a) {
  const float x = a < -4.0f ? -4.0f : (a > 4.0f ? 4.0f : a);
  const float x2 = x * x;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 + -2.10102402082508e-06f;
  p = p * x2 + -5.69250639462346e-05f;
  p = p * x2 + -7.34990630326855e-04f;
  p = p * x2 + -2.95459980854025e-03f;
  p = p * x2 + -1.60960333262415e-02f;
  p = p * x;
  float q = -1.45660718464996e-05f;
  q = q * x2 + -2.13374055278905e-04f;
  q = q * x2 + -1.68282697438203e-03f;
  q = q * x2 + -7.37332916720468e-03f;
  q = q * x2 + -1.42647390514189e-02f;
  return a != a ? a : p / q;
}
inline double verf(double x) { return std::erf(x); }

// -------------------------------------------------------------------------- 16-bit floats

// Note [16-bit floats on CPU]: float16 and bfloat16 values are stored 16-bit and computed in float
// registers (codegen/c_render.CTYPE), as on CUDA: `f16` / `bf16` are the memory types, converting on
// each load and store, so a fused kernel rounds once, when it stores. The conversions are branch-free
// integer and float arithmetic (selects through masks) that GCC vectorizes on every ISA level; its
// _Float16 and the F16C scalar intrinsics stay scalar. Both round to nearest even, keep NaN a NaN
// (quiet) and +-inf, and are exact for every one of the 65536 float16 patterns (tests/test_half_cpu.py).
inline float bits_to_float(uint32_t u) { return __builtin_bit_cast(float, u); }
inline uint32_t float_to_bits(float f) { return __builtin_bit_cast(uint32_t, f); }
inline uint32_t mask_if(bool c) { return 0u - uint32_t(c); }

inline float f16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  const uint32_t normal = ((e + 112u) << 23) | (m << 13);  // rebias 15 -> 127
  const uint32_t special = 0x7F800000u | (m << 13);        // inf, NaN
  const uint32_t sub = float_to_bits(float(int32_t(m)) * 5.9604644775390625e-08f);  // m * 2^-24, exact
  const uint32_t is_sub = mask_if(e == 0), is_special = mask_if(e == 31);
  return bits_to_float(sign | (sub & is_sub) | (special & is_special) | (normal & ~(is_sub | is_special)));
}
inline uint16_t float_to_f16(float f) {
  const uint32_t u = float_to_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
  const uint32_t r = a - 0x38000000u;  // rebias 127 -> 15; a carry out of the mantissa bumps the exponent
  const uint32_t normal = (r + 0xFFFu + ((r >> 13) & 1u)) >> 13;
  // below 2^-14 the result is subnormal: |f| * 2^24 rounded to an integer by adding 2^23
  const uint32_t sub = float_to_bits(bits_to_float(a) * 16777216.0f + 8388608.0f) - 0x4B000000u;
  const uint32_t small = mask_if(a < 0x38800000u), big = mask_if(a >= 0x477FF000u), nan = mask_if(a > 0x7F800000u);
  uint32_t mag = (sub & small) | (normal & ~small);
  mag = (0x7C00u & big) | (mag & ~big);
  mag = ((0x7E00u | ((a >> 13) & 0x3FFu)) & nan) | (mag & ~nan);
  return uint16_t(sign | mag);
}
inline float bf16_to_float(uint16_t h) { return bits_to_float(uint32_t(h) << 16); }
inline uint16_t float_to_bf16(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = mask_if((u & 0x7FFFFFFFu) > 0x7F800000u);
  return uint16_t((((u >> 16) | 0x40u) & nan) | (rounded & ~nan));
}

struct f16 {
  uint16_t bits;
  operator float() const { return f16_to_float(bits); }
  f16& operator=(float f) {
    bits = float_to_f16(f);
    return *this;
  }
};
struct bf16 {
  uint16_t bits;
  operator float() const { return bf16_to_float(bits); }
  bf16& operator=(float f) {
    bits = float_to_bf16(f);
    return *this;
  }
};
static_assert(sizeof(f16) == 2 && sizeof(bf16) == 2, "16-bit memory types");
// a cast to a 16-bit float inside a fused kernel rounds as torch's would
inline float round_f16(float x) { return f16_to_float(float_to_f16(x)); }
inline float round_bf16(float x) { return bf16_to_float(float_to_bf16(x)); }

#define BPK_SCALAR inline
// @scalar_ops

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

}  // namespace bpk
