// bladepack CUDA prelude: pasted at the top of every generated CUDA translation unit.
//
// In: nothing (CUDA's own fp16 / bf16 headers). Out: the helpers generated kernels use — loads and
// stores converting 16-bit floats to and from float registers (Note [Register types] in
// codegen/cuda_emitter.py), vector loads and stores with a run-time alignment test, warp and block
// reductions that leave the result in every thread, the math helpers the C renderer names (bpk::vexp,
// sigmoid, verf, gelu_*, fmax_nan, ...) with torch's NaN semantics, and error reporting into the
// launch's status words (st[0] = first error code, st[1] = value, st[2] = the size it broke).
//
// With BPK_EMULATE defined, the CUDA builtins come from the host emulation header instead
// (tests/fake_cuda/cuda_emulation.h: threads as fibers, so the same source runs on a CPU in tests).
#ifdef BPK_EMULATE
#include "cuda_emulation.h"
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#endif
#include <cmath>
#include <limits>
#include <type_traits>

#define BPK_D __device__ __forceinline__
#ifndef BPK_DYN_SMEM
#define BPK_DYN_SMEM(type, name) extern __shared__ __align__(16) type name[]
#endif

namespace bpk {

template <class T>
struct Reg {
  using type = T;
};
template <>
struct Reg<__half> {
  using type = float;
};
template <>
struct Reg<__nv_bfloat16> {
  using type = float;
};

template <class T>
BPK_D typename Reg<T>::type to_reg(T x) {
  return x;
}
template <>
BPK_D float to_reg<__half>(__half x) {
  return __half2float(x);
}
template <>
BPK_D float to_reg<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <class T, class V>
BPK_D T from_reg(V x) {
  return T(x);
}
template <>
BPK_D __half from_reg<__half, float>(float x) {
  return __float2half_rn(x);
}
template <>
BPK_D __nv_bfloat16 from_reg<__nv_bfloat16, float>(float x) {
  return __float2bfloat16_rn(x);
}

// a read of a buffer the kernel never writes, by the read-only path (ld.global.nc): asked for, as
// Note [Vector stores] costs NVVM its own proof of it
template <class T>
BPK_D T ldg(const T* p) {
#ifdef BPK_EMULATE
  return *p;
#else
  if constexpr (std::is_same<T, bool>::value) {
    return __ldg(reinterpret_cast<const unsigned char*>(p)) != 0;
  } else {
    return __ldg(p);
  }
#endif
}

// one element in, one element out
template <class T>
BPK_D typename Reg<T>::type ld(const T* p) {
  return to_reg<T>(ldg(p));
}
template <class T, class V>
BPK_D void st(T* p, V v) {
  *p = from_reg<T>(static_cast<typename Reg<T>::type>(v));
}

// a cast to a 16-bit float inside a fused kernel rounds as torch's would
BPK_D float round_f16(float x) { return __half2float(__float2half_rn(x)); }
BPK_D float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

template <int Bytes>
struct Raw;
template <>
struct Raw<16> {
  using type = uint4;
};
template <>
struct Raw<8> {
  using type = uint2;
};
template <>
struct Raw<4> {
  using type = unsigned int;
};
template <>
struct Raw<2> {
  using type = unsigned short;
};

// W consecutive elements from p into registers: one vector access when p is aligned to the vector's
// size (16 bytes at most), element by element otherwise
template <int W, class T>
BPK_D void ldv(typename Reg<T>::type (&out)[W], const T* p) {
  constexpr int bytes = W * int(sizeof(T));
  if constexpr (bytes == 16 || bytes == 8 || bytes == 4 || bytes == 2) {
    if (W > 1 && (reinterpret_cast<uintptr_t>(p) & uintptr_t(bytes - 1)) == 0) {
      using V = typename Raw<bytes>::type;
      const V v = ldg(reinterpret_cast<const V*>(p));
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int i = 0; i < W; ++i) out[i] = to_reg<T>(e[i]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < W; ++i) out[i] = to_reg<T>(ldg(p + i));
}

template <int W, class T, class V>
BPK_D void stv(T* p, const V (&in)[W]) {
  constexpr int bytes = W * int(sizeof(T));
  if constexpr (bytes == 16 || bytes == 8 || bytes == 4 || bytes == 2) {
    if (W > 1 && (reinterpret_cast<uintptr_t>(p) & uintptr_t(bytes - 1)) == 0) {
      using R = typename Raw<bytes>::type;
      R v;
      T* e = reinterpret_cast<T*>(&v);
#pragma unroll
      for (int i = 0; i < W; ++i) e[i] = from_reg<T>(static_cast<typename Reg<T>::type>(in[i]));
#ifndef BPK_EMULATE
      // Note [Vector stores]: an instruction of its own. NVVM turns a plain store of `v` into the
      // element stores below and merges both paths into those; an intrinsic (__stcg) keeps it but
      // costs the loads their read-only path (ld.global.nc). No memory clobber: generated kernels
      // never read what they store, and a clobber would cost the same.
      if constexpr (bytes == 16) {
        asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w));
        return;
      } else if constexpr (bytes == 8) {
        asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(v.x), "r"(v.y));
        return;
      }
#endif
      *reinterpret_cast<R*>(p) = v;
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < W; ++i) p[i] = from_reg<T>(static_cast<typename Reg<T>::type>(in[i]));
}

// -------------------------------------------------------------------------- math (torch semantics)
BPK_D float vexp(float x) { return expf(x); }
BPK_D double vexp(double x) { return exp(x); }
// a softmax's exp(x - max), x <= 0 (Note [Softmax exponentials] in cpu_runtime.h): expf here
BPK_D float vexp_nonpos(float x) { return expf(x); }
BPK_D double vexp_nonpos(double x) { return exp(x); }
BPK_D float verf(float x) { return erff(x); }
BPK_D double verf(double x) { return erf(x); }
#define BPK_SCALAR BPK_D
// @splice scalar_ops.h

// Note [Sort kernel]: one thread sorts a line of n elements (`key(i)`: the value at position i) into
// positions (`at(k)`: a reference to the k-th position of the result) by heapsort, in place in the
// output (no scratch memory); the order is total (sort_before breaks ties by position), so the
// unstable heapsort gives the stable result. O(n log n) comparisons, each two reads of the input.
// Lines of up to 4096 elements take block_sort_line below instead (Note [Block sort]).
template <class T, class Key, class At>
BPK_D void sort_line(int64_t n, bool descending, Key key, At at) {
  for (int64_t k = 0; k < n; ++k) at(k) = k;
  auto before = [&](int64_t i, int64_t j) { return sort_before(T(key(i)), i, T(key(j)), j, descending); };
  auto sift = [&](int64_t root, int64_t end) {
    for (;;) {
      int64_t child = 2 * root + 1;
      if (child >= end) return;
      if (child + 1 < end && before(at(child), at(child + 1))) ++child;
      if (!before(at(root), at(child))) return;
      const int64_t t = at(root);
      at(root) = at(child);
      at(child) = t;
      root = child;
    }
  };
  for (int64_t s = n / 2 - 1; s >= 0; --s) sift(s, n);
  for (int64_t e = n - 1; e > 0; --e) {
    const int64_t t = at(0);
    at(0) = at(e);
    at(e) = t;
    sift(0, e);
  }
}

// Note [Block sort]: one block sorts a line of n <= P elements (P a power of two, the variant's bound:
// 256, 1024 or 4096; lines of up to 64 elements stay one thread's heapsort, cheaper than a block's
// network when lines are many and short) by a bitonic network over (value, position) pairs in shared
// memory: log2(P) (log2(P) + 1) / 2 compare-exchange stages, each of P / 2 independent pairs spread over
// the block's threads (P / 2 of them, at most 512), a barrier between stages. The order is
// sort_before's, total (ties broken by position), so the network's result is the stable order; the
// padding past n sorts after every element. Then the block writes the positions. Every thread of the
// block must call it (barriers), for the same line.
template <class T, int P, class Key, class At>
BPK_D void block_sort_line(int64_t n, bool descending, Key key, At at, T* keys, int* pos) {
  for (int i = int(threadIdx.x); i < P; i += int(blockDim.x)) {
    pos[i] = i;
    keys[i] = i < n ? T(key(i)) : T(0);
  }
  __syncthreads();
  const int m = int(n);
  auto before = [&](int a, int b) {  // entry a sorts before entry b
    if (pos[a] >= m) return false;
    if (pos[b] >= m) return true;
    return sort_before(keys[a], int64_t(pos[a]), keys[b], int64_t(pos[b]), descending);
  };
  for (int k = 2; k <= P; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = int(threadIdx.x); i < P; i += int(blockDim.x)) {
        const int l = i ^ j;
        if (l > i && ((i & k) == 0 ? before(l, i) : before(i, l))) {
          const T kv = keys[i];
          keys[i] = keys[l];
          keys[l] = kv;
          const int pv = pos[i];
          pos[i] = pos[l];
          pos[l] = pv;
        }
      }
      __syncthreads();
    }
  }
  for (int i = int(threadIdx.x); i < m; i += int(blockDim.x)) at(i) = int64_t(pos[i]);
  __syncthreads();  // the arrays are the next line's
}

// -------------------------------------------------------------------------- reductions
struct Sum {
  template <class T>
  BPK_D T operator()(T a, T b) const {
    return T(a + b);
  }
};
struct Prod {
  template <class T>
  BPK_D T operator()(T a, T b) const {
    return T(a * b);
  }
};
struct Max {
  template <class T>
  BPK_D T operator()(T a, T b) const {
    return fmax_nan(a, b);
  }
};
struct Min {
  template <class T>
  BPK_D T operator()(T a, T b) const {
    return fmin_nan(a, b);
  }
};

// Note [Row moments]: a row op's statistics combined across threads in one reduction (cuda_loops.py's
// CudaEmitter._stats): each thread first finds its own elements' statistics (two passes over its own
// registers or loads), then one warp / block reduction merges them. Moments are (count, sum, sum of
// squared deviations from the part's mean), merged as Chan et al. do: the sums add as a plain sum
// does (so the mean is as exact as the two-reduction form's; a running mean would round at the mean's
// scale in every merge), and the squared deviations gain d^2 n_a n_b / n with d the parts' means'
// difference (no cancellation of E[x^2] - E[x]^2). MaxSum is a softmax's (maximum, sum of
// exp(x - maximum)), merged by rescaling each sum to the larger maximum. A part without elements is
// (0, 0, 0) / (-inf, 0) and leaves the other as it is; NaN propagates, and +inf gives NaN as
// exp(inf - inf) does in the two-reduction form.
template <class T>
struct Moments {
  T n, sum, m2;
};
struct MergeMoments {
  template <class T>
  BPK_D Moments<T> operator()(Moments<T> a, Moments<T> b) const {
    if (b.n == T(0)) return a;
    if (a.n == T(0)) return b;
    const T n = a.n + b.n, d = b.sum / b.n - a.sum / a.n;
    return {n, a.sum + b.sum, a.m2 + b.m2 + d * d * (a.n * b.n / n)};
  }
};
template <class T>
struct MaxSum {
  T max, sum;
};
struct MergeMaxSum {
  template <class T>
  BPK_D MaxSum<T> operator()(MaxSum<T> a, MaxSum<T> b) const {
    const T m = fmax_nan(a.max, b.max), lowest = -std::numeric_limits<T>::infinity();
    const T sa = a.max == lowest ? T(0) : a.sum * vexp(a.max - m);
    const T sb = b.max == lowest ? T(0) : b.sum * vexp(b.max - m);
    return {m, sa + sb};
  }
};

// one value of another lane: shuffles move 4 or 8 bytes, so narrower values travel as int, and the
// row statistics above field by field
template <class T>
BPK_D T shuffle_xor(T v, int o) {
  using S = typename std::conditional<(sizeof(T) < 4), int, T>::type;
  return static_cast<T>(__shfl_xor_sync(0xffffffffu, static_cast<S>(v), o));
}
template <class T>
BPK_D Moments<T> shuffle_xor(Moments<T> v, int o) {
  return {shuffle_xor(v.n, o), shuffle_xor(v.sum, o), shuffle_xor(v.m2, o)};
}
template <class T>
BPK_D MaxSum<T> shuffle_xor(MaxSum<T> v, int o) {
  return {shuffle_xor(v.max, o), shuffle_xor(v.sum, o)};
}

// every lane of the (full, converged) warp gets the combination of all 32 lanes' values
template <class T, class F>
BPK_D T warp_all(T v, F f) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = f(v, shuffle_xor(v, o));
  return v;
}

// every thread of the block gets the combination of all threads' values; `scratch` holds one value
// per warp and may be reused by the next call (the first barrier waits for its readers)
template <class T, class F>
BPK_D T block_all(T v, F f, T* scratch) {
  v = warp_all(v, f);
  const int lane = int(threadIdx.x & 31u), warp = int(threadIdx.x >> 5), warps = int((blockDim.x + 31u) >> 5);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T out = scratch[0];
  for (int w = 1; w < warps; ++w) out = f(out, scratch[w]);
  return out;
}

// -------------------------------------------------------------------------- tensor cores
// Note [Tensor-core fragments]: mma.sync.m16n8k16 (sm_80 and later) of a warp, D += A B with A 16 x 16
// (row-major), B 16 x 8 (column-major) of float16 or bfloat16 and D 16 x 8 of float. With g = lane / 4
// and t = lane % 4, a lane holds A's rows g and g + 8 at columns 2t, 2t + 1 and 2t + 8, 2t + 9 (four
// registers of two values: (g, 2t..), (g + 8, 2t..), (g, 2t + 8..), (g + 8, 2t + 8..)), B's column g
// at rows 2t, 2t + 1 and 2t + 8, 2t + 9 (two registers), and D's rows g and g + 8 at columns 2t and
// 2t + 1 (d[0], d[1] in row g; d[2], d[3] in row g + 8). The emulation computes the same product from
// every lane's registers (tests/fake_cuda/cuda_emulation.h).
template <class H>
BPK_D uint16_t bits16(float x) {
  if constexpr (std::is_same<H, __half>::value) {
    return __half_as_ushort(__float2half_rn(x));
  } else {
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
  }
}
template <class H>
BPK_D uint32_t pack2(float lo, float hi) {  // a register of two 16-bit values, `lo` first in memory
  return uint32_t(bits16<H>(lo)) | (uint32_t(bits16<H>(hi)) << 16);
}
template <class H>
BPK_D void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef BPK_EMULATE
  bpk_emu::mma16816<std::is_same<H, __nv_bfloat16>::value>(d, a, b);
#else
  if constexpr (std::is_same<H, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// the first error of a launch wins; the kernel continues with a safe index
BPK_D void fail(int64_t* st, int64_t code, int64_t value, int64_t size) {
  if (atomicCAS(reinterpret_cast<unsigned long long*>(st), 0ull, static_cast<unsigned long long>(code)) == 0ull) {
    st[1] = value;
    st[2] = size;
  }
}

}  // namespace bpk
