#include "native_cuda.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include "dtype.h"
#include "errors.h"
#include "util.h"

namespace bpk::cuda {
namespace {

constexpr size_t kWeightAlign = 256;  // weights and arena buffers start on 256-byte boundaries
constexpr int64_t kStatusSlot = -1;   // a pointer word that holds the call's status words

size_t round_up(size_t n) { return (n + kWeightAlign - 1) / kWeightAlign * kWeightAlign; }

}  // namespace

// Note [Output pool]: bpk_model_run_dlpack's runtime-allocated device results come from here. A result's
// memory goes back to its size's idle list (at most kKeep per size) when its last owner releases it, and
// the next call of that size takes it: a repeated signature allocates no device memory, and no result's
// release frees device memory (cuMemFree waits for the whole device). As with a framework's caching
// allocator, a consumer must have ordered its last use of a result before releasing it. A result
// released after the model is freed frees its memory itself (the pool is held weakly).
struct OutputPool {
  static constexpr size_t kKeep = 8;
  std::shared_ptr<Driver> drv;
  std::shared_ptr<Device> device;
  std::mutex mu;
  std::unordered_map<size_t, std::vector<std::unique_ptr<DeviceBuffer>>> idle;
  ~OutputPool() { idle.clear(); }  // before the driver and the context can go
};

NativeCuda::NativeCuda(const Artifact& artifact, const Manifest& m, int ordinal, int max_graphs)
    : m_(m), max_graphs_(max_graphs) {
  const NativePlan& plan = *m.native_cuda;
  drv_ = std::make_shared<Driver>();
  device_ = std::make_shared<Device>(*drv_, ordinal);
  outputs_ = std::make_shared<OutputPool>();
  outputs_->drv = drv_;
  outputs_->device = device_;
  const DeviceInfo& info = device_->info();
  std::vector<std::string> arches;
  for (const ImageDecl& im : plan.images) arches.push_back(im.arch);
  const auto [arch, at] = choose_image(arches, info.major, info.minor);
  image_ = arch;
  const std::vector<uint8_t> image = artifact.section_copy(plan.images[at].section);  // Note [Hash what runs]
  module_ = std::make_unique<Module>(*drv_, image.data(), image.size());
  std::map<int64_t, std::string> names;
  for (const KernelDecl& k : m.cuda_kernels)
    for (const auto& v : k.variants) names[v.fn] = v.name;
  int64_t expect = 0;
  for (const auto& [fn, name] : names)
    if (fn != expect++)
      artifact.fail("the CUDA kernel table is not numbered 0.." + std::to_string(int64_t(names.size()) - 1));
  for (const auto& [fn, name] : names) functions_.push_back(std::make_unique<Kernel>(*drv_, *module_, name));

  // the weights, in manifest order, in one device buffer
  std::vector<size_t> offsets;
  size_t total = 0;
  std::vector<Bytes> sections;
  for (const WeightDecl& w : m.weights) {
    sections.push_back(artifact.section("weight/" + w.name));
    offsets.push_back(total);
    total += round_up(sections.back().size);
  }
  weights_ = std::make_unique<DeviceBuffer>(*drv_, std::max<size_t>(total, 1));
  std::vector<uint8_t> staging(std::max<size_t>(total, 1), 0);
  for (size_t i = 0; i < sections.size(); ++i)
    if (sections[i].size) std::copy(sections[i].data, sections[i].data + sections[i].size, staging.data() + offsets[i]);
  CUstream upload = nullptr;
  drv_->check(drv_->StreamCreate(&upload, kStreamNonBlocking), "cuStreamCreate");
  drv_->check(drv_->MemcpyHtoDAsync(weights_->ptr(), staging.data(), staging.size(), upload), "cuMemcpyHtoDAsync");
  const CUresult synced = drv_->StreamSynchronize(upload);
  drv_->StreamDestroy(upload);
  drv_->check(synced, "cuStreamSynchronize");
  for (size_t off : offsets) weight_ptrs_.push_back(weights_->ptr() + off);

  for (const KernelDecl& k : m.cuda_kernels) checks_errors_ = checks_errors_ || !k.errors.empty();
  const char* strict = std::getenv("BLADEPACK_CUDA_STRICT_ERRORS");
  strict_ = strict != nullptr && std::strcmp(strict, "1") == 0;
  bool gemm = false;
  for (const LaunchDecl& l : plan.launches) gemm = gemm || l.op == LaunchDecl::kGemm;
  if (gemm) cublas_ = std::make_unique<Cublas>();
  if (!plan.gemm_kernels.empty()) cutlass_ = std::make_unique<CutlassGemms>(artifact, plan, *device_);
  bool lt = false;
  for (const LaunchDecl& l : plan.launches) lt = lt || l.op == LaunchDecl::kCublasLt;
  if (lt) cublaslt_ = std::make_unique<CublasLt>();
}

NativeCuda::~NativeCuda() {
  for (CallContext* c : idle_) destroy(c);
  for (auto& [stream, c] : by_stream_) {
    // Note [Device errors]: an error no later call or bpk_model_synchronize raised is printed, never lost
    if (c->host_status != nullptr && drv_->StreamSynchronize(c->stream) == 0 && c->host_status[0] != 0) {
      const std::string text = bpk::status_error_text(m_.cuda_kernels, c->host_status);
      std::fprintf(stderr,
                   "bladepack: a CUDA call reported an error that nothing raised (no later call or "
                   "bpk_model_synchronize on its stream): %s\n",
                   text.c_str());
    }
    destroy(c);
  }
}

namespace {

// Device memory that holds the driver and the primary context it belongs to (Note [Owned outputs]),
// given back to its pool when released.
struct OwnedBuffer {
  std::shared_ptr<Driver> drv;
  std::shared_ptr<Device> device;
  std::unique_ptr<DeviceBuffer> buffer;
  std::weak_ptr<OutputPool> pool;
  ~OwnedBuffer() {
    if (const std::shared_ptr<OutputPool> p = pool.lock()) {
      std::lock_guard<std::mutex> lock(p->mu);
      std::vector<std::unique_ptr<DeviceBuffer>>& idle = p->idle[buffer->bytes()];
      if (idle.size() < OutputPool::kKeep) idle.push_back(std::move(buffer));
    }
    buffer.reset();  // before the context can go
  }
};

}  // namespace

std::shared_ptr<DeviceBuffer> NativeCuda::alloc_owned(size_t bytes) const {
  // Note [Owned outputs]: the aliasing shared_ptr points at the buffer and owns the driver, the
  // device (its retained primary context) and the buffer, released in that order's reverse
  auto owner = std::make_shared<OwnedBuffer>();
  owner->drv = drv_;
  owner->device = device_;
  owner->pool = outputs_;
  {
    std::lock_guard<std::mutex> lock(outputs_->mu);
    auto it = outputs_->idle.find(bytes);
    if (it != outputs_->idle.end() && !it->second.empty()) {
      owner->buffer = std::move(it->second.back());
      it->second.pop_back();
    }
  }
  if (!owner->buffer) owner->buffer = std::make_unique<DeviceBuffer>(*drv_, bytes);
  DeviceBuffer* raw = owner->buffer.get();
  return std::shared_ptr<DeviceBuffer>(std::move(owner), raw);
}

std::string NativeCuda::description() const {
  const DeviceInfo& info = device_->info();
  return "cuda (" + image_ + " image on " + info.name + ", " + info.arch() + ")";
}

std::shared_ptr<const CudaPrepared> NativeCuda::prepare(const int64_t* r) const {
  auto p = std::make_shared<CudaPrepared>();
  const NativePlan& plan = *m_.native_cuda;
  for (size_t li = 0; li < plan.launches.size(); ++li) {
    const LaunchDecl& l = plan.launches[li];
    std::vector<ByteCond> when;
    bool skip = false;
    for (const CondDecl& c : l.when) {
      if (c.reg >= 0)
        skip = skip || (r[c.reg] != 0) != c.is;
      else
        when.push_back({c.slot, c.offset.resolve(r), c.is});
    }
    if (skip) continue;  // Note [Guarded launches]: not at this signature
    if (!when.empty() && p->no_graph.empty())
      p->no_graph = "launch " + std::to_string(li) + " reads a run-time branch's predicate on the host";
    CudaPrepared::Launch out;
    out.plan_index = int64_t(li);
    out.when = std::move(when);
    std::vector<int64_t> ints;
    for (const SymInt& v : l.ints) ints.push_back(v.resolve(r));
    for (const auto& [slot, off] : l.ptrs) out.ptrs.emplace_back(slot, off.resolve(r));
    if (l.op == LaunchDecl::kGemm || l.op == LaunchDecl::kCutlass || l.op == LaunchDecl::kCublasLt) {
      out.kind = l.op == LaunchDecl::kGemm      ? CudaPrepared::Launch::kGemm
                 : l.op == LaunchDecl::kCutlass ? CudaPrepared::Launch::kCutlass
                                                : CudaPrepared::Launch::kCublasLt;
      out.dtype = l.gemm_dtype;
      if (l.op == LaunchDecl::kGemm)
        out.gemm = gemm_args(ints, l.gemm_item);
      else if (l.op == LaunchDecl::kCutlass)
        out.cutlass = cutlass_->prepare(l, r, ints, l.gemm_item);
      else
        out.lt = cublaslt_->prepare(l, l.gemm_dtype, gemm_args(ints, l.gemm_item));
      p->launches.push_back(std::move(out));
      continue;
    }
    const KernelDecl& row = m_.cuda_kernels[size_t(l.kernel)];
    const KernelDecl::Variant* var = nullptr;
    for (const auto& v : row.variants)
      if (r[v.pred]) {
        var = &v;
        break;
      }
    if (var == nullptr) fail(BPK_ERR_FORMAT, "kernel " + row.name + ": no variant applies (corrupt plan)");
    out.fn = size_t(var->fn);
    const int64_t grid = var->grid.resolve(r), smem = var->smem.resolve(r);
    if (grid < 1 || grid > 0x7fffffff || smem < 0 || smem > 0x7fffffff)
      fail(BPK_ERR_FORMAT, "corrupt plan: launch " + std::to_string(li) + " (kernel " + row.name + ") has grid " +
                               std::to_string(grid) + " and " + std::to_string(smem) + " bytes of shared memory");
    out.grid = unsigned(grid), out.block = unsigned(var->block), out.smem = unsigned(smem);
    out.start = p->words.size();
    p->ptr_words.push_back({p->words.size(), kStatusSlot, 0});
    p->words.push_back(0);
    for (const auto& [slot, off] : out.ptrs) {
      p->ptr_words.push_back({p->words.size(), slot, off});
      p->words.push_back(0);
    }
    for (int64_t v : ints) p->words.push_back(uint64_t(v));
    out.count = p->words.size() - out.start;
    p->launches.push_back(std::move(out));
  }
  return p;
}

NativeCuda::CallContext* NativeCuda::take(size_t bytes, CUstream stream) const {
  device_->activate();
  CallContext* c = nullptr;
  if (stream != nullptr) {
    {
      std::lock_guard<std::mutex> lock(pool_mu_);
      CallContext*& slot = by_stream_[stream];
      if (slot == nullptr) {
        slot = new CallContext;
        slot->stream = stream;
        slot->callers = true;
      }
      c = slot;
    }
    c->busy.lock();  // one call at a time enqueues on a stream (given back in give)
    try {
      mirror(*c);
      reserve(*c, bytes);
    } catch (...) {
      c->busy.unlock();
      throw;
    }
    return c;
  }
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (!idle_.empty()) {
      c = idle_.back();
      idle_.pop_back();
    }
  }
  if (c == nullptr) {
    c = new CallContext;
    if (const CUresult rc = drv_->StreamCreate(&c->stream, kStreamNonBlocking)) {
      delete c;
      drv_->check(rc, "cuStreamCreate");
    }
  }
  try {
    mirror(*c);
  } catch (...) {
    destroy(c);
    throw;
  }
  try {
    reserve(*c, bytes);
  } catch (...) {
    destroy(c);
    throw;
  }
  return c;
}

void NativeCuda::reserve(CallContext& c, size_t bytes) const {
  if (c.memory && c.memory->bytes() >= bytes) return;
  drop_graphs(c);  // they address the old buffer
  if (c.memory) drv_->check(drv_->StreamSynchronize(c.stream), "cuStreamSynchronize");  // its status copied out
  c.memory.reset();
  // sized by class from 64 KiB (util.h alloc_size; the Python loader's Note [Device size classes]): a
  // decode loop's memory grows a little every call, and each growth waits for the stream, drops the
  // context's graphs and frees device memory (cuMemFree waits for the whole device)
  c.memory = std::make_unique<DeviceBuffer>(*drv_, alloc_size(std::max<size_t>(bytes, size_t(1) << 16)));
  if (checks_errors_) drv_->check(drv_->MemsetD8Async(c.memory->ptr(), 0, 32, c.stream), "cuMemsetD8Async");
}

void NativeCuda::mirror(CallContext& c) const {
  if (c.host_status != nullptr || !checks_errors_ || strict_) return;
  void* p = nullptr;
  drv_->check(drv_->MemHostAlloc(&p, 64, 0), "cuMemHostAlloc");
  std::memset(p, 0, 64);
  c.host_status = static_cast<int64_t*>(p);
}

std::array<int64_t, 3> NativeCuda::take_error(CallContext& c, CUdeviceptr status) const {
  std::array<int64_t, 3> words = {0, 0, 0};
  if (!checks_errors_ || status == 0) return words;
  drv_->check(drv_->StreamSynchronize(c.stream), "cuStreamSynchronize");
  if (c.host_status != nullptr) {
    std::copy(c.host_status, c.host_status + 3, words.begin());
  } else {
    drv_->check(drv_->MemcpyDtoHAsync(words.data(), status, sizeof words, c.stream), "cuMemcpyDtoHAsync");
    drv_->check(drv_->StreamSynchronize(c.stream), "cuStreamSynchronize");
  }
  if (words[0] != 0 && !strict_) {
    drv_->check(drv_->MemsetD8Async(status, 0, 32, c.stream), "cuMemsetD8Async");
    drv_->check(drv_->StreamSynchronize(c.stream), "cuStreamSynchronize");
    if (c.host_status != nullptr) std::memset(c.host_status, 0, 24);
  }
  return words;
}

std::array<int64_t, 3> NativeCuda::synchronize(CUstream stream) const {
  std::vector<CallContext*> contexts;
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    for (auto& [s, c] : by_stream_)
      if (stream == nullptr || s == stream) contexts.push_back(c);
  }
  std::array<int64_t, 3> first = {0, 0, 0};
  for (CallContext* c : contexts) {
    std::lock_guard<std::mutex> busy(c->busy);
    device_->activate();
    if (!c->memory) {
      drv_->check(drv_->StreamSynchronize(c->stream), "cuStreamSynchronize");
      continue;
    }
    const std::array<int64_t, 3> e = strict_ ? std::array<int64_t, 3>{0, 0, 0} : take_error(*c, c->memory->ptr());
    if (strict_) drv_->check(drv_->StreamSynchronize(c->stream), "cuStreamSynchronize");
    if (first[0] == 0) first = e;
  }
  return first;
}

void NativeCuda::give(CallContext* c) const {
  if (c->callers) {
    c->busy.unlock();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(pool_mu_);
    if (idle_.size() < kIdleContexts) {
      idle_.push_back(c);
      return;
    }
  }
  destroy(c);
}

void NativeCuda::drop_graphs(CallContext& c) const {
  if (c.graphs.empty()) return;
  drv_->StreamSynchronize(c.stream);
  for (auto& [key, g] : c.graphs)
    if (g.exec) drv_->GraphExecDestroy(g.exec);
  c.graphs.clear();
}

void NativeCuda::destroy(CallContext* c) const {
  drop_graphs(*c);
  drv_->StreamSynchronize(c->stream);
  c->memory.reset();
  c->semaphores.reset();
  c->retired.clear();
  c->lt_workspace.reset();
  if (c->host_status != nullptr) drv_->MemFreeHost(c->host_status);
  if (!c->callers) drv_->StreamDestroy(c->stream);
  delete c;
}

bool NativeCuda::will_graph(const std::shared_ptr<const CudaPrepared>& p, const CallContext& c) const {
  if (max_graphs_ <= 0 || !p->no_graph.empty()) return false;
  const auto it = c.graphs.find(p.get());
  return it != c.graphs.end() && !it->second.refused && (it->second.exec != nullptr || it->second.runs > 0);
}

CUdeviceptr NativeCuda::semaphores(CallContext& c, size_t bytes) const {
  const size_t want = std::max<size_t>(bytes, 256);
  if (!c.semaphores || c.semaphores->bytes() < want) {
    // the outgrown buffer stays until the context goes: a graph captured before may address it
    if (c.semaphores) c.retired.push_back(std::move(c.semaphores));
    c.semaphores = std::make_unique<DeviceBuffer>(*drv_, want);
    drv_->check(drv_->MemsetD8Async(c.semaphores->ptr(), 0, want, c.stream), "cuMemsetD8Async");
  }
  return c.semaphores->ptr();
}

bool NativeCuda::holds(const std::vector<ByteCond>& when, const CUdeviceptr* slots, CUstream stream) const {
  // Note [Branch predicates] (bladepack/ir/guards.py): each byte read once the launches before it
  // have run, outermost first, stopping at the first that fails
  for (const ByteCond& c : when) {
    uint8_t byte = 0;
    drv_->check(drv_->MemcpyDtoHAsync(&byte, slots[c.slot] + uint64_t(c.offset), 1, stream), "cuMemcpyDtoHAsync");
    drv_->check(drv_->StreamSynchronize(stream), "cuStreamSynchronize");
    if ((byte != 0) != c.is) return false;
  }
  return true;
}

void NativeCuda::run(const std::shared_ptr<const CudaPrepared>& p, const CUdeviceptr* slots, CUdeviceptr status,
                     CallContext& c, bool graphs) const {
  if (max_graphs_ <= 0 || !p->no_graph.empty() || !graphs) return launch_all(*p, slots, status, c);
  Graph& g = c.graphs[p.get()];
  g.used = ++c.clock;
  if (!g.prepared) g.prepared = p;
  if (c.graphs.size() > size_t(max_graphs_)) {  // drop the least recently used other signature
    auto victim = c.graphs.end();
    for (auto it = c.graphs.begin(); it != c.graphs.end(); ++it)
      if (it->first != p.get() && (victim == c.graphs.end() || it->second.used < victim->second.used)) victim = it;
    if (victim != c.graphs.end()) {
      if (victim->second.exec) {
        drv_->check(drv_->StreamSynchronize(c.stream), "cuStreamSynchronize");
        drv_->GraphExecDestroy(victim->second.exec);
      }
      c.graphs.erase(victim);
    }
  }
  if (g.exec) {
    drv_->check(drv_->GraphLaunch(g.exec, c.stream), "cuGraphLaunch");
    return;
  }
  if (g.refused || g.runs++ == 0) return launch_all(*p, slots, status, c);  // the first call warms up
  g.exec = capture(*p, slots, status, c);
  if (g.exec == nullptr) {
    g.refused = true;
    return launch_all(*p, slots, status, c);
  }
  drv_->check(drv_->GraphLaunch(g.exec, c.stream), "cuGraphLaunch");
}

CUgraphExec NativeCuda::capture(const CudaPrepared& p, const CUdeviceptr* slots, CUdeviceptr status,
                                CallContext& c) const {
  if (drv_->StreamBeginCapture(c.stream, kCaptureModeThreadLocal) != 0) return nullptr;
  bool recorded = true;
  try {
    launch_all(p, slots, status, c);
  } catch (const Error&) {
    recorded = false;  // a launch the driver refuses while capturing: the capture is discarded
  }
  CUgraph graph = nullptr;
  const CUresult ended = drv_->StreamEndCapture(c.stream, &graph);
  CUgraphExec exec = nullptr;
  if (recorded && ended == 0 && graph != nullptr && drv_->GraphInstantiate(&exec, graph, 0) != 0) exec = nullptr;
  if (graph != nullptr) drv_->GraphDestroy(graph);
  return exec;
}

void NativeCuda::launch_all(const CudaPrepared& p, const CUdeviceptr* slots, CUdeviceptr status, CallContext& c) const {
  std::vector<uint64_t> words(p.words);
  for (const auto& w : p.ptr_words) words[w.pos] = w.slot == kStatusSlot ? status : slots[w.slot] + uint64_t(w.offset);
  if (checks_errors_ && strict_) drv_->check(drv_->MemsetD8Async(status, 0, 32, c.stream), "cuMemsetD8Async");
  const std::vector<ByteCond>* last = nullptr;
  static const std::vector<ByteCond> kNone;
  last = &kNone;
  bool wanted = true;
  for (const CudaPrepared::Launch& l : p.launches) {
    if (!(l.when == *last)) {  // a run of launches under new data conditions
      last = &l.when;
      wanted = holds(l.when, slots, c.stream);
    }
    if (!wanted) continue;
    auto addr = [&](size_t k) { return slots[l.ptrs[k].first] + uint64_t(l.ptrs[k].second); };
    switch (l.kind) {
      case CudaPrepared::Launch::kKernel: {
        const unsigned grid[3] = {l.grid, 1, 1}, block[3] = {l.block, 1, 1};
        functions_[l.fn]->launch(grid, block, words.data() + l.start, l.count * 8, l.smem, c.stream);
        break;
      }
      case CudaPrepared::Launch::kGemm:
        cublas_->gemm(l.dtype, addr(0), addr(1), addr(2), l.gemm, c.stream);
        break;
      case CudaPrepared::Launch::kCublasLt: {
        const bool src = l.ptrs.size() > 3;
        if (!c.lt_workspace) c.lt_workspace = std::make_unique<DeviceBuffer>(*drv_, CublasLt::kWorkspace);
        cublaslt_->launch(l.lt, addr(0), addr(1), addr(2), src ? addr(3) : 0, src, c.stream, c.lt_workspace->ptr());
        break;
      }
      case CudaPrepared::Launch::kCutlass: {
        const bool src = l.ptrs.size() > 3;
        cutlass_->launch(l.cutlass, addr(0), addr(1), addr(2), src ? addr(3) : 0, src, c.stream,
                         [&](size_t n) { return semaphores(c, n); });
        break;
      }
    }
  }
  if (c.host_status != nullptr)  // Note [Device errors]: the words to the host, in stream order
    drv_->check(drv_->MemcpyDtoHAsync(c.host_status, status, 24, c.stream), "cuMemcpyDtoHAsync");
}

}  // namespace bpk::cuda
