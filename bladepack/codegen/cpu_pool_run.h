//! Pool::run and stage_scratch, defined once per kernel library in its runtime unit (Note [Split
//! kernel libraries] in toolchain.py; Note [Pool jobs] in cpu_runtime.h). Spliced into
//! cpu_library.py's runtime text.
void bpk::Pool::run(int64_t count, RangeFn f, void* c) {
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

void* bpk::stage_scratch(int64_t bytes) {
  static thread_local std::vector<char> buf;
  if (int64_t(buf.size()) < bytes) buf.resize(size_t(bytes));
  return buf.data();
}
