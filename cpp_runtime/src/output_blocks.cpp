// Note [Output blocks] (output_blocks.h).
#include "output_blocks.h"

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "util.h"

namespace bpk {
namespace {

constexpr size_t kLarge = size_t(1) << 16;  // smaller blocks go straight to malloc

struct Blocks {
  std::mutex mu;
  std::unordered_map<void*, size_t> live;  // large blocks handed out -> their class size
  std::vector<std::pair<size_t, void*>> kept;  // freed large blocks (class size, block), oldest first
  size_t kept_bytes = 0;
};

Blocks& blocks() {
  static Blocks* b = new Blocks;  // never destroyed: outputs may be freed during exit
  return *b;
}

}  // namespace

void* alloc_output(size_t bytes) {
  const size_t n = alloc_size(bytes);
  if (n < kLarge) return std::aligned_alloc(kAlign, n);
  Blocks& b = blocks();
  std::lock_guard<std::mutex> lock(b.mu);
  void* p = nullptr;
  for (size_t k = b.kept.size(); k-- > 0;) {  // the most recently kept block of this class
    if (b.kept[k].first == n) {
      p = b.kept[k].second;
      b.kept.erase(b.kept.begin() + std::ptrdiff_t(k));
      b.kept_bytes -= n;
      break;
    }
  }
  if (p == nullptr) p = std::aligned_alloc(kAlign, n);
  if (p == nullptr) return nullptr;
  b.live.emplace(p, n);
  return p;
}

void release_output(void* p) {
  if (p == nullptr) return;
  Blocks& b = blocks();
  std::unique_lock<std::mutex> lock(b.mu);
  auto it = b.live.find(p);
  if (it == b.live.end() || it->second > kKeepBytes) {
    if (it != b.live.end()) b.live.erase(it);
    lock.unlock();
    std::free(p);
    return;
  }
  const size_t n = it->second;
  b.live.erase(it);
  while (!b.kept.empty() && (b.kept.size() >= kKeepBlocks || b.kept_bytes + n > kKeepBytes)) {
    b.kept_bytes -= b.kept.front().first;  // the oldest: a growing loop has left its class behind
    std::free(b.kept.front().second);
    b.kept.erase(b.kept.begin());
  }
  b.kept.emplace_back(n, p);
  b.kept_bytes += n;
}

}  // namespace bpk
