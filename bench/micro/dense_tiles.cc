// The dense kernel's register tiles on two weight layouts, one thread, against the FMA peak
// (Note [Dense weight panels] in bladepack/passes/dense_layers.py): a 256 x 256 float32 layer over M rows,
// W row-major [K, N] or in column panels [N / 16, K, 16], the tiles' rows outer.
//
//   g++ -O3 -std=c++17 -pthread -march=x86-64-v3 bench/micro/dense_tiles.cc -o /tmp/dense_tiles
//   /tmp/dense_tiles ROWS ROUNDS [THREADS: 1 or 2]
// (-march=x86-64-v4 for the AVX-512 tile). With 2 threads each takes half of the rows and of the peak loop.
//
// Built for AVX2 it times the 6 x 16 tile (12 accumulators, the AVX2 library's); for AVX-512 the 6 x 64 tile
// (24 accumulators). Each layout's best of `rounds` runs, alternating; "peak" is 12 independent FMA chains
// doing the same multiply-adds. The tiles are written with intrinsics so that no accumulator spills.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

constexpr int64_t K = 256, N = 256, PANEL = 16;

#if defined(__AVX512F__)
constexpr int64_t BLOCK = 64;
// rows x 64 columns: W run j (16 columns) at w + j * run + k * ldw
void tile(const float* const* x, const float* w, int64_t ldw, int64_t run, float* y, int rows) {
  __m512 c[6][4];
  for (auto& r : c)
    for (auto& v : r) v = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 b[4];
    for (int j = 0; j < 4; ++j) b[j] = _mm512_loadu_ps(w + j * run + k * ldw);
    for (int p = 0; p < 6; ++p) {
      const __m512 a = _mm512_set1_ps(x[p][k]);
      for (int j = 0; j < 4; ++j) c[p][j] = _mm512_fmadd_ps(a, b[j], c[p][j]);
    }
  }
  for (int p = 0; p < rows; ++p)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(y + p * N + 16 * j, c[p][j]);
}
#else
constexpr int64_t BLOCK = 16;
// rows x 16 columns: W's 16 columns at w + k * ldw (`run` unused: one panel)
void tile(const float* const* x, const float* w, int64_t ldw, int64_t, float* y, int rows) {
  __m256 c[6][2];
  for (auto& r : c)
    for (auto& v : r) v = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(w + k * ldw), b1 = _mm256_loadu_ps(w + k * ldw + 8);
    for (int p = 0; p < 6; ++p) {
      const __m256 a = _mm256_broadcast_ss(x[p] + k);
      c[p][0] = _mm256_fmadd_ps(a, b0, c[p][0]);
      c[p][1] = _mm256_fmadd_ps(a, b1, c[p][1]);
    }
  }
  for (int p = 0; p < rows; ++p) {
    _mm256_storeu_ps(y + p * N, c[p][0]);
    _mm256_storeu_ps(y + p * N + 8, c[p][1]);
  }
}
#endif

__attribute__((noinline)) void dense(const float* x, const float* w, bool panels, float* y, int64_t m) {
  for (int64_t q0 = 0; q0 < m; q0 += 6) {
    const float* rows[6];
    for (int p = 0; p < 6; ++p) rows[p] = x + std::min(q0 + p, m - 1) * K;
    const int n = int(std::min<int64_t>(6, m - q0));
    for (int64_t cb = 0; cb < N; cb += BLOCK) {
      if (panels)
        tile(rows, w + (cb / PANEL) * K * PANEL, PANEL, K * PANEL, y + q0 * N + cb, n);
      else
        tile(rows, w + cb, N, PANEL, y + q0 * N + cb, n);
    }
  }
}

__attribute__((noinline)) float peak(int64_t iterations) {
  __m256 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(float(i) * 1e-9f);
  const __m256 b = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  for (int64_t i = 0; i < iterations; ++i)
    for (auto& v : a) v = _mm256_fmadd_ps(v, b, c);
  float s = 0;
  for (auto& v : a) s += _mm256_cvtss_f32(v);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t m = argc > 1 ? std::atoll(argv[1]) : 4096;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 20;
  const int threads = argc > 3 ? std::atoi(argv[3]) : 1;
  std::vector<float> x(m * K), w(K * N), wp(K * N), y(m * N), want(m * N);
  for (auto& v : x) v = float(std::rand()) / RAND_MAX - 0.5f;
  for (auto& v : w) v = float(std::rand()) / RAND_MAX - 0.5f;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n) wp[(n / PANEL) * K * PANEL + k * PANEL + n % PANEL] = w[k * N + n];
  dense(x.data(), w.data(), false, want.data(), m);
  const double flop = 2.0 * m * K * N;
  double best[3] = {1e30, 1e30, 1e30};
  for (int r = 0; r < rounds; ++r) {
    for (int v = 0; v < 3; ++v) {
      const auto t0 = std::chrono::steady_clock::now();
      if (v == 2) {
        const int64_t iterations = int64_t(flop / 192 / threads);  // 12 FMAs x 8 lanes x 2 flop each
        if (threads == 2) {
          std::thread other([&] { volatile float s = peak(iterations); (void)s; });
          volatile float s = peak(iterations);
          (void)s;
          other.join();
        } else {
          volatile float s = peak(iterations);
          (void)s;
        }
      } else {
        if (threads == 2) {  // rows split in two at a tile boundary, as the pool splits row tiles
          const int64_t half = (m / 2 + 5) / 6 * 6;
          std::thread other([&] { dense(x.data() + half * K, v ? wp.data() : w.data(), v == 1, y.data() + half * N, m - half); });
          dense(x.data(), v ? wp.data() : w.data(), v == 1, y.data(), half);
          other.join();
        } else {
          dense(x.data(), v ? wp.data() : w.data(), v == 1, y.data(), m);
        }
      }
      best[v] = std::min(best[v], std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      if (v < 2)
        for (int64_t i = 0; i < m * N; ++i)
          if (std::fabs(y[i] - want[i]) > 1e-4f) {
            std::printf("layout %d differs at %lld\n", v, (long long)i);
            return 1;
          }
    }
  }
  const char* names[3] = {"row-major W [K, N]", "column panels", "FMA peak"};
  std::printf("%d x %d tile, %lld rows, %d thread(s)\n", 6, int(BLOCK), (long long)m, threads);
  for (int v = 0; v < 3; ++v)
    std::printf("%-20s %9.1f us %7.1f GFLOP/s %6.1f%% of peak\n", names[v], best[v], flop / best[v] / 1e3,
                100 * best[2] / best[v]);
}
