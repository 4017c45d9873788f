// Host emulation of the CUDA features bladepack's generated kernels use, so that the very CUDA C the
// CUDA emitter writes can be compiled with g++ and run on a CPU in tests (numerics of every schedule
// without a GPU). Included by codegen/cuda_runtime.cuh when BPK_EMULATE is defined.
//
// Blocks run one after another. A kernel without barriers runs its threads as plain calls; a
// cooperative kernel (warp shuffles, __syncthreads) runs each thread of the block as a fiber and a
// small scheduler releases a warp barrier when every live thread of the warp reached it, a block
// barrier when every live thread of the block did; a barrier that can never be released (divergent
// barriers: a kernel bug) aborts with a message. Fibers are made once per block size (makecontext) and
// run block after block; they switch with _setjmp / _longjmp, which keep the signal mask where
// swapcontext makes a system call per switch (an encoder's cooperative kernels switch millions of
// times), so the emulation is compiled with -U_FORTIFY_SOURCE (its longjmp check refuses a jump to
// another stack). `__shared__` variables are `static`, which
// is exact because one block runs at a time. float16 is _Float16 (IEEE binary16, round to nearest
// even); bfloat16 is 16 bits with round-to-nearest-even conversion.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <setjmp.h>
#include <ucontext.h>

#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)

#if defined(_FORTIFY_SOURCE) && _FORTIFY_SOURCE > 0
#error "compile the CUDA emulation with -U_FORTIFY_SOURCE: its fibers switch stacks with _longjmp"
#endif

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
inline dim3 threadIdx, blockIdx, blockDim, gridDim;

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) uint2 {
  unsigned x, y;
};

struct __half {
  _Float16 v;
};
inline float __half2float(__half h) { return static_cast<float>(h.v); }
inline unsigned short __half_as_ushort(__half h) {
  unsigned short u;
  memcpy(&u, &h.v, 2);
  return u;
}
inline __half __float2half_rn(float f) { return __half{static_cast<_Float16>(f)}; }

struct __nv_bfloat16 {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 b) {
  const uint32_t u = uint32_t(b.bits) << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{uint16_t((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{uint16_t(u >> 16)};
}

inline unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp, unsigned long long val) {
  const unsigned long long old = *p;
  if (old == cmp) *p = val;
  return old;
}

namespace bpk_emu {

enum State { kReady, kWarpWait, kBlockWait, kDone };

struct Fiber {
  ucontext_t ctx;  // where a new fiber starts
  jmp_buf at;  // where it waits
  bool started;
  State state;
  unsigned tid;
  unsigned char slot[8];  // this thread's value in the current shuffle
  uint32_t frag[6];  // its A and B registers in the current tensor-core product
};

inline ucontext_t g_main;
inline jmp_buf g_main_at;
inline std::vector<Fiber> g_fibers;
inline std::vector<char> g_stacks;
inline std::vector<unsigned char> g_dynamic;
inline int g_cur = -1;
inline void (*g_entry)(const uint64_t*) = nullptr;
inline const uint64_t* g_words = nullptr;
constexpr size_t kStack = 64 * 1024;

inline void set_thread(unsigned t) {
  threadIdx.x = t % blockDim.x;
  threadIdx.y = (t / blockDim.x) % blockDim.y;
  threadIdx.z = t / (blockDim.x * blockDim.y);
}

inline void wait(State s) {
  if (g_cur < 0) {
    fprintf(stderr, "cuda emulation: a barrier in a kernel marked non-cooperative\n");
    abort();
  }
  Fiber& f = g_fibers[size_t(g_cur)];
  f.state = s;
  if (_setjmp(f.at) == 0) _longjmp(g_main_at, 1);
}

// a fiber runs the kernel once per block: after a block it waits as done until the next one
inline void fiber_main() {
  for (;;) {
    g_entry(g_words);
    wait(kDone);
  }
}

template <class T>
T shfl_xor(T v, int mask) {
  static_assert(sizeof(T) <= 8, "shuffle of more than 8 bytes");
  const size_t me = size_t(g_cur);
  memcpy(g_fibers[me].slot, &v, sizeof(T));
  wait(kWarpWait);
  const unsigned t = g_fibers[me].tid;
  const unsigned partner = (t & ~31u) | ((t & 31u) ^ unsigned(mask));
  T out = v;
  if (partner < g_fibers.size()) memcpy(&out, g_fibers[partner].slot, sizeof(T));
  wait(kWarpWait);  // nobody overwrites a slot before every lane has read it
  return out;
}

// one 16-bit value of a register as float: bfloat16 or float16 bits
inline float half_value(uint32_t reg, int half, bool bf16) {
  const uint16_t u = uint16_t(reg >> (16 * half));
  if (bf16) {
    const uint32_t w = uint32_t(u) << 16;
    float f;
    memcpy(&f, &w, 4);
    return f;
  }
  _Float16 h;
  memcpy(&h, &u, 2);
  return float(h);
}

// mma.sync.m16n8k16 of the warp (Note [Tensor-core fragments] in codegen/cuda_runtime.cuh): every lane
// publishes its A and B registers, then computes its four D elements from all of them in float
template <bool BF16>
void mma16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const size_t me = size_t(g_cur);
  memcpy(g_fibers[me].frag, a, 16);
  memcpy(g_fibers[me].frag + 4, b, 8);
  wait(kWarpWait);
  const unsigned base = g_fibers[me].tid & ~31u, lane = g_fibers[me].tid & 31u;
  const unsigned g = lane >> 2, t = lane & 3u;
  auto A = [&](unsigned row, unsigned k) {
    const Fiber& f = g_fibers[base + (row % 8) * 4 + (k % 8) / 2];
    return half_value(f.frag[(row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0)], int(k & 1u), BF16);
  };
  auto B = [&](unsigned k, unsigned col) {
    const Fiber& f = g_fibers[base + col * 4 + (k % 8) / 2];
    return half_value(f.frag[4 + (k >= 8 ? 1 : 0)], int(k & 1u), BF16);
  };
  float out[4];
  for (unsigned i = 0; i < 4; ++i) {
    const unsigned row = g + 8 * (i >> 1), col = 2 * t + (i & 1u);
    float acc = d[i];
    for (unsigned k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    out[i] = acc;
  }
  wait(kWarpWait);  // nobody overwrites its registers before every lane has read them
  memcpy(d, out, 16);
}

inline void run_block(unsigned n, bool coop) {
  if (!coop) {
    g_cur = -1;
    for (unsigned t = 0; t < n; ++t) {
      set_thread(t);
      g_entry(g_words);
    }
    return;
  }
  if (g_fibers.size() != n) {  // new fibers for a new block size; the old ones, all done, are dropped
    g_fibers.assign(n, Fiber{});
    if (g_stacks.size() < n * kStack) g_stacks.resize(n * kStack);
    for (unsigned t = 0; t < n; ++t) {
      Fiber& f = g_fibers[t];
      f.tid = t;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = g_stacks.data() + size_t(t) * kStack;
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = nullptr;  // fiber_main never returns
      makecontext(&f.ctx, fiber_main, 0);
    }
  }
  for (Fiber& f : g_fibers) f.state = kReady;
  const unsigned warps = (n + 31) / 32;
  for (;;) {
    bool ran = false;
    for (unsigned t = 0; t < n; ++t) {
      if (g_fibers[t].state != kReady) continue;
      g_cur = int(t);
      set_thread(t);
      Fiber& f = g_fibers[t];
      if (_setjmp(g_main_at) == 0) {
        if (f.started) _longjmp(f.at, 1);
        f.started = true;
        swapcontext(&g_main, &f.ctx);  // the fiber's first run; it comes back through g_main_at
      }
      ran = true;
    }
    g_cur = -1;
    bool live = false, released = false;
    for (unsigned w = 0; w < warps; ++w) {
      bool any = false, all = true;
      for (unsigned t = w * 32; t < n && t < w * 32 + 32; ++t) {
        if (g_fibers[t].state == kDone) continue;
        any = true;
        all = all && g_fibers[t].state == kWarpWait;
      }
      live = live || any;
      if (any && all) {
        for (unsigned t = w * 32; t < n && t < w * 32 + 32; ++t)
          if (g_fibers[t].state == kWarpWait) g_fibers[t].state = kReady;
        released = true;
      }
    }
    if (!live) return;
    bool any = false, all = true;
    for (unsigned t = 0; t < n; ++t) {
      if (g_fibers[t].state == kDone) continue;
      any = true;
      all = all && g_fibers[t].state == kBlockWait;
    }
    if (any && all) {
      for (unsigned t = 0; t < n; ++t)
        if (g_fibers[t].state == kBlockWait) g_fibers[t].state = kReady;
      released = true;
    }
    if (!ran && !released) {
      fprintf(stderr, "cuda emulation: threads of block (%u, %u, %u) wait at barriers that never complete\n",
              blockIdx.x, blockIdx.y, blockIdx.z);
      abort();
    }
  }
}

}  // namespace bpk_emu

inline void __syncthreads() { bpk_emu::wait(bpk_emu::kBlockWait); }
inline void __syncwarp(unsigned = 0xffffffffu) { bpk_emu::wait(bpk_emu::kWarpWait); }

template <class T>
T __shfl_xor_sync(unsigned, T v, int mask) {
  return bpk_emu::shfl_xor(v, mask);
}

#define BPK_DYN_SMEM(type, name) type* name = reinterpret_cast<type*>(bpk_emu::g_dynamic.data())

// the launcher the fake driver calls: every block of the grid, one after another
extern "C" __attribute__((visibility("default"))) void bpk_emu_launch(void (*entry)(const uint64_t*), int coop,
                                                                      const unsigned* grid, const unsigned* block,
                                                                      size_t shared_bytes, const uint64_t* words) {
  gridDim = dim3{grid[0], grid[1], grid[2]};
  blockDim = dim3{block[0], block[1], block[2]};
  bpk_emu::g_entry = entry;
  bpk_emu::g_words = words;
  bpk_emu::g_dynamic.assign(shared_bytes + 16, 0xCD);  // garbage, as on a GPU
  const unsigned n = block[0] * block[1] * block[2];
  for (unsigned z = 0; z < grid[2]; ++z)
    for (unsigned y = 0; y < grid[1]; ++y)
      for (unsigned x = 0; x < grid[0]; ++x) {
        blockIdx = dim3{x, y, z};
        bpk_emu::run_block(n, coop != 0);
      }
}
