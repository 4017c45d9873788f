//! The pool's threads (ThreadPool behind the prelude's Pool), Pool::run, stage_scratch and the
//! clock, defined once per kernel library in its runtime unit (Note [Split kernel libraries] in
//! toolchain.py; Note [A slim prelude] in cpu_runtime.h). Spliced into cpu_library.py's runtime text.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace bpk {
// Note [Pool jobs]: a job is [0, n) cut into up to 4 chunks per thread that the caller and the workers
// claim from one counter, so the caller never waits for a worker that has not started: a worker that
// the OS has not scheduled (the machine busy with another runtime's threads) simply finds no chunk
// left. A worker takes part only by joining the job (a CAS on `job` while it is open); the caller
// closes the job when the chunks run out and waits only for the workers that joined, which are
// running. Workers spin briefly between jobs, then sleep on a condition variable, so back-to-back
// kernels pay no wake-up while an idle process does not burn a core.
//
// Note [Chunk owners]: the chunks are cut into one contiguous block per thread (the caller's first)
// and each thread claims from its own block before it takes what is left of the others'. Consecutive
// kernels walk their rows in the same order (image, then tile or row), so a thread mostly reads what
// it wrote itself in the kernel before, from its own cache, where one shared counter dealt the chunks
// out by arrival and half the reads went to the other core's cache. A block whose owner never joins
// (not scheduled) is taken by the others as before.
struct ThreadPool final : Pool {
  static constexpr uint64_t kClosed = uint64_t(1) << 16, kJoinMask = kClosed - 1;
  std::vector<std::thread> workers;
  std::mutex mu, run_mu;
  std::condition_variable cv;
  std::atomic<uint64_t> job{kClosed};  // (id << 17) | closed bit | joined workers
  struct alignas(64) Block {
    std::atomic<int64_t> next{0};  // the block's next chunk to claim
    int64_t end = 0;
  };
  std::unique_ptr<Block[]> blocks;  // Note [Chunk owners]: thread t's own chunks are blocks[t]
  std::atomic<int> left{0};            // joined workers that have finished
  std::atomic<int> sleepers{0};
  std::atomic<bool> stop{false};
  RangeFn fn = nullptr;
  void* closure = nullptr;
  int64_t n = 0, chunks = 0;

  explicit ThreadPool(int threads) : Pool(threads), blocks(new Block[size_t(nthreads)]) {
    for (int t = 1; t < nthreads; ++t) workers.emplace_back([this, t] { loop(t); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> g(mu);
      stop.store(true);
      job.fetch_add(uint64_t(1) << 17);
    }
    cv.notify_all();
    for (auto& w : workers) w.join();
  }
  void work(int self) {  // thread `self`'s own block first, then the others' (Note [Chunk owners])
    for (int k = 0; k < nthreads; ++k) {
      Block& b = blocks[size_t((self + k) % nthreads)];
      for (;;) {
        int64_t c = b.next.fetch_add(1, std::memory_order_relaxed);
        if (c >= b.end) break;
        int64_t lo = n * c / chunks, hi = n * (c + 1) / chunks;
        fn(closure, lo, hi);
      }
    }
  }
  void loop(int self) {
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
          work(self);
          left.fetch_add(1, std::memory_order_release);
          break;
        }
      }
    }
  }
  void start(int64_t count, RangeFn f, void* c);
};
}  // namespace bpk

// every Pool a library creates is a ThreadPool (its Ctx holds one)
void bpk::Pool::run(int64_t count, RangeFn f, void* c) { static_cast<ThreadPool*>(this)->start(count, f, c); }

void bpk::ThreadPool::start(int64_t count, RangeFn f, void* c) {
  std::unique_lock<std::mutex> busy(run_mu, std::try_to_lock);
  if (!busy.owns_lock() || nthreads == 1) {  // another thread's run holds the pool: run inline
    f(c, 0, count);
    return;
  }
  fn = f;
  closure = c;
  n = count;
  chunks = count < 4 * nthreads ? count : 4 * nthreads;
  for (int t = 0; t < nthreads; ++t) {  // Note [Chunk owners]
    blocks[size_t(t)].next.store(chunks * t / nthreads, std::memory_order_relaxed);
    blocks[size_t(t)].end = chunks * (t + 1) / nthreads;
  }
  left.store(0, std::memory_order_relaxed);
  uint64_t id = (job.load() >> 17) + 1;
  job.store(id << 17, std::memory_order_release);  // open, nobody joined
  if (sleepers.load() > 0) {
    std::lock_guard<std::mutex> g(mu);
    cv.notify_all();
  }
  work(0);
  int joined = int(job.fetch_or(kClosed, std::memory_order_acq_rel) & kJoinMask);
  for (int spins = 0; left.load(std::memory_order_acquire) != joined; ++spins) {
    if (spins < 2000) {
      relax();
    } else {
      std::this_thread::yield();  // a joined worker was preempted: let it have this core
    }
  }
}

void bpk::yield_thread() { std::this_thread::yield(); }

int64_t bpk::now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void* bpk::stage_scratch(int64_t bytes) {
  static thread_local std::vector<char> buf;
  if (int64_t(buf.size()) < bytes) buf.resize(size_t(bytes));
  return buf.data();
}
