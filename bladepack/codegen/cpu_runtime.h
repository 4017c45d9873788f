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
// record ops are BPK_OP_KERNEL (a = index into the kernel table: kernel base + variant), BPK_OP_GEMM
// (a = 0 for float32, 1 for float64, 2 for float16, 3 for bfloat16; ints in the order of bpk_gemm
// below) and BPK_OP_WHEN (a = the expected truth of the byte its one pointer addresses; its one int is
// how many words after the record to skip when the byte says otherwise: a run-time branch inside one
// word list, Note [Native preparation] in bladepack/loader/native_prepare.py). A WHEN record is not a
// launch: it takes no launch index and no time.
//
// Note [A slim prelude]: every unit of a library loads this prelude as a precompiled header, so what it
// includes is paid once per unit: <mutex>, <condition_variable>, <thread>, <memory> and <chrono> made
// the header 47 MB, 0.16 s to load per unit and 1.9 s to precompile per ISA level. Kernels need of the
// pool only its size and `Pool::run`; the threads, locks and clock live in the runtime unit
// (cpu_pool_run.h: `ThreadPool`, `yield_thread`, `now_ns`), which includes those headers itself.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <type_traits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#define BPK_ABI_VERSION 1
#define BPK_OP_KERNEL 1
#define BPK_OP_GEMM 2
#define BPK_OP_WHEN 3
#ifndef BPK_SMALL_M_ROWS
#define BPK_SMALL_M_ROWS 3
#endif
#define BPK_RESTRICT __restrict__
// A kernel's functions (Note [Split kernel libraries] in codegen/toolchain.py): static in the one
// translation unit a dump shows, external and hidden when the library is built from units.
#ifndef BPK_KERNEL
#define BPK_KERNEL static
#endif

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

// A per-thread buffer of at least `bytes`, shared by the kernels of the library: what a chunk of rows
// stages for itself (Note [Staged bands] in bladepack/codegen/cpu_conv_band.py), valid until the
// thread's next call. Out of line, in the library's runtime unit (cpu_pool_run.h): one buffer per
// thread for the whole library, not one per kernel.
void* stage_scratch(int64_t bytes);

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

// A persistent pool as kernels see it: its size and `run` (Note [Pool jobs], Note [Chunk owners] in
// cpu_pool_run.h, which defines the threads behind it).
struct Pool {
  int nthreads = 1;
  explicit Pool(int threads) : nthreads(threads < 1 ? 1 : threads) {}
  static void relax() {
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  // out of line (cpu_pool_run.h, in the library's runtime unit): every kernel unit calls it, and
  // compiled inline it was half of a small unit's compile time (Note [Split kernel libraries]); the
  // pool is always a ThreadPool there (Note [A slim prelude])
  void run(int64_t count, RangeFn f, void* c);
};
// the runtime unit's: std::this_thread::yield() and the steady clock in nanoseconds (Note [A slim prelude])
void yield_thread();
int64_t now_ns();

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

// Note [Teams]: a loop whose iterations depend on each other (a recurrent layer's steps: each needs
// the whole state the last one wrote) splits each iteration's work over a team of threads that meet at
// a barrier between iterations. The pool's jobs never make the caller wait for a thread that has not
// started (Note [Pool jobs] in cpu_pool_run.h), and a team keeps that: a job of one chunk per thread,
// each chunk a member that registers when it starts; the first (the leader) waits up to kTeamFormNs for
// the others, then fixes the team to those that came; a later chunk finds the team formed and leaves,
// and a thread that runs several chunks (the pool held by another run: all inline) is one member. The barrier
// (`sync`) waits only on members, all running. body(member, size, team) must call `sync` the same
// number of times in every member.
struct Team {
  static constexpr int64_t kTeamFormNs = 50000;  // a sleeping worker wakes in tens of microseconds
  std::atomic<int> members{0};
  std::atomic<int> size{0};  // 0 while forming
  std::atomic<int64_t> arrived{0};

  // every member of a team of `n` waits here until all have arrived for the `round`-th time (from 1)
  void sync(int n, int64_t round) {
    arrived.fetch_add(1, std::memory_order_acq_rel);
    const int64_t want = int64_t(n) * round;
    for (int spins = 0; arrived.load(std::memory_order_acquire) < want; ++spins) {
      if (spins < 4000) {
        Pool::relax();
      } else {
        yield_thread();
      }
    }
  }
};

template <class F>
inline void team_run(RunState* st, F&& body) {
  Team team;
  const int threads = st->pool != nullptr ? st->pool->nthreads : 1;
  auto member = [&]() {
    const int m = team.members.fetch_add(1, std::memory_order_acq_rel);
    if (m == 0) {
      const int64_t start = now_ns();
      while (team.members.load(std::memory_order_acquire) < threads && now_ns() - start < Team::kTeamFormNs)
        Pool::relax();
      const int n = team.members.load(std::memory_order_acquire);
      team.size.store(n < threads ? n : threads, std::memory_order_release);
    } else {
      while (team.size.load(std::memory_order_acquire) == 0) Pool::relax();
      if (m >= team.size.load(std::memory_order_acquire)) return;
    }
    body(m, team.size.load(std::memory_order_acquire), team);
  };
  if (threads == 1) {
    team.members.store(1);
    team.size.store(1);
    body(0, 1, team);
    return;
  }
  struct Closure {
    decltype(member)* f;
  } c{&member};
  st->pool->run(
      threads,
      [](void* p, int64_t lo, int64_t hi) {
        for (int64_t k = lo; k < hi; ++k) (*static_cast<Closure*>(p)->f)();
      },
      &c);
}

// -------------------------------------------------------------------------- math helpers

// Branch-free float exp and erf that the compiler vectorizes (the libm calls stay scalar without
// -ffast-math). exp: Cephes-style range reduction and a degree-6 polynomial, ~1 ulp, 0 below -87.3,
// inf above 88.7, NaN stays NaN. erf: a rational approximation on [-4, 4] (odd degree-13 numerator,
// even degree-8 denominator), a few ulp; erf(+-4) rounds to +-1 in float. Doubles use libm.
constexpr float kExpLo = -87.33654022216797f, kExpHi = 88.72283935546875f;  // exp's float range
// exp(xc) for xc in [kExpLo, kExpHi] (what vexp and vexp_nonpos share): NaN gives NaN
inline float exp_in_range(float xc) {
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
  return y * scale;
}
inline float vexp(float x) {
  float xc = x < kExpLo ? kExpLo : x;
  xc = xc > kExpHi ? kExpHi : xc;
  float out = exp_in_range(xc);
  out = x < kExpLo ? 0.0f : out;
  out = x > kExpHi ? std::numeric_limits<float>::infinity() : out;
  return x != x ? x : out;
}
inline double vexp(double x) { return std::exp(x); }
// Note [Softmax exponentials]: exp of a score minus its row's maximum, an argument x <= 0 (or -inf, or
// NaN where a score or the maximum is NaN or +inf): vexp without the overflow clamp and the +inf and
// NaN selects, which only such arguments need (a NaN runs through the arithmetic to a NaN result; -inf
// goes to 0 like any x below -87.3). The same values as vexp on that domain, five of its thirty-odd
// vector instructions fewer: a softmax over a head of 16 spends as much on its exponentials as on
// both products.
inline float vexp_nonpos(float x) { return x < kExpLo ? 0.0f : exp_in_range(x < kExpLo ? kExpLo : x); }
inline double vexp_nonpos(double x) { return std::exp(x); }
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
// Note [Invariant selects] (codegen/cpu_loops.py): c ? a : b through the bits, which vectorizes where
// c does not vary in the loop. AVX-512 only: without it the and / andnot / or costs three instructions
// per vector against one blend, and GCC unswitches the few conditions of a small attention block itself
template <class T>
inline T select_bits(bool c, T a, T b) {
#if defined(__AVX512F__)
  typedef typename std::conditional<sizeof(T) == 8, uint64_t, uint32_t>::type U;
  U ua, ub;
  std::memcpy(&ua, &a, sizeof(T));
  std::memcpy(&ub, &b, sizeof(T));
  const U m = U(0) - U(c);
  const U r = (ua & m) | (ub & ~m);
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
#else
  return c ? a : b;
#endif
}

#define BPK_SCALAR inline
// @splice scalar_ops.h

// Note [Sort kernel]: a line of n elements (`key(i)`: the value at position i) sorted into positions
// (`at(k)`: a reference to the k-th position of the result), in torch's stable order. Each value becomes
// an unsigned key whose order is the sort's (order_bits: NaN largest, -0 equal to 0, inverted when
// descending), so equal keys are exactly the ties and a stable sort of the keys is the answer: up to 32
// elements by insertion, up to 256 as (key, position) pairs through std::sort (the position breaks
// ties), longer lines by an LSD radix sort, 8 bits a pass, skipping a pass where every key has the
// same byte (small integers, a narrow range of floats).
template <class T>
using SortKey = typename std::conditional<(sizeof(T) <= 4), uint32_t, uint64_t>::type;

template <class T>
inline SortKey<T> order_bits(T v, bool descending) {
  using K = SortKey<T>;
  constexpr K top = K(1) << (8 * sizeof(K) - 1);
  K k;
  if constexpr (std::is_floating_point<T>::value) {
    if (v != v) return descending ? K(0) : ~K(0);
    if (v == T(0)) v = T(0);  // -0 sorts as 0
    typename std::conditional<(sizeof(T) == 4), uint32_t, uint64_t>::type b;
    std::memcpy(&b, &v, sizeof(T));
    k = K(b);
    k = (k & top) ? K(~k) : K(k | top);
  } else if constexpr (std::is_signed<T>::value) {
    k = K(v) ^ top;  // sign-extended: the signed order shifted to unsigned
  } else {
    k = K(v);
  }
  return descending ? K(~k) : k;
}

template <class T, class Key, class At>
inline void sort_line(int64_t n, bool descending, Key key, At at) {
  using K = SortKey<T>;
  if (n <= 32) {
    K keys[32];
    for (int64_t k = 0; k < n; ++k) {
      const K v = order_bits<T>(key(k), descending);
      int64_t j = k;
      while (j > 0 && v < keys[j - 1]) {  // strictly less: an equal key stays after (stable)
        keys[j] = keys[j - 1];
        at(j) = at(j - 1);
        --j;
      }
      keys[j] = v;
      at(j) = k;
    }
    return;
  }
  if (n <= 256) {
    std::pair<K, int64_t> line[256];
    for (int64_t k = 0; k < n; ++k) line[k] = {order_bits<T>(key(k), descending), k};
    std::sort(line, line + n);
    for (int64_t k = 0; k < n; ++k) at(k) = line[k].second;
    return;
  }
  std::vector<K> keys(static_cast<size_t>(2 * n));
  std::vector<uint32_t> pos(static_cast<size_t>(2 * n));  // a line is shorter than 2^32
  K* kin = keys.data();
  K* kout = kin + n;
  uint32_t* pin = pos.data();
  uint32_t* pout = pin + n;
  for (int64_t k = 0; k < n; ++k) {
    kin[k] = order_bits<T>(key(k), descending);
    pin[k] = uint32_t(k);
  }
  for (unsigned shift = 0; shift < 8 * sizeof(K); shift += 8) {
    int64_t count[257] = {0};
    for (int64_t k = 0; k < n; ++k) ++count[((kin[k] >> shift) & 0xFF) + 1];
    if (count[((kin[0] >> shift) & 0xFF) + 1] == n) continue;  // every key has this byte
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (int64_t k = 0; k < n; ++k) {
      const int64_t d = count[(kin[k] >> shift) & 0xFF]++;
      kout[d] = kin[k];
      pout[d] = pin[k];
    }
    std::swap(kin, kout);
    std::swap(pin, pout);
  }
  for (int64_t k = 0; k < n; ++k) at(k) = int64_t(pin[k]);
}

// @splice cpu_gemm.h
}  // namespace bpk
