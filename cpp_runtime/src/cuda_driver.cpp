#include "cuda_driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "errors.h"

namespace bpk::cuda {
namespace {

constexpr CUresult kSuccess = 0, kErrorNoDevice = 100;

// Note [No CUDA at build time]: the runtime resolves the driver's entry points by their exported
// names (the versioned ones where the API has versions: cuMemAlloc_v2, ...), as cuda.h's macros would
// name them for CUDA 12+. The legacy default stream is never used: every call runs on a stream the
// runtime created or the caller gave.
template <class F>
void resolve(void* handle, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(handle, name));
  if (fn == nullptr)
    fail(BPK_ERR_UNSUPPORTED, std::string("the CUDA driver (libcuda.so.1) has no ") + name +
                                  "; device='cuda' needs an NVIDIA driver for CUDA 12.0 or newer");
}

}  // namespace

Driver::Driver() {
  handle_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (handle_ == nullptr)
    fail(BPK_ERR_UNSUPPORTED,
         "no CUDA driver found (libcuda.so.1 could not be loaded); device='cuda' needs an NVIDIA driver");
  try {
    resolve(handle_, Init, "cuInit");
    resolve(handle_, DeviceGetCount, "cuDeviceGetCount");
    resolve(handle_, DeviceGet, "cuDeviceGet");
    resolve(handle_, DeviceGetName, "cuDeviceGetName");
    resolve(handle_, DeviceGetAttribute, "cuDeviceGetAttribute");
    resolve(handle_, DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    resolve(handle_, DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    resolve(handle_, CtxSetCurrent, "cuCtxSetCurrent");
    resolve(handle_, ModuleLoadData, "cuModuleLoadData");
    resolve(handle_, ModuleUnload, "cuModuleUnload");
    resolve(handle_, ModuleGetFunction, "cuModuleGetFunction");
    resolve(handle_, FuncSetAttribute, "cuFuncSetAttribute");
    resolve(handle_, LaunchKernel, "cuLaunchKernel");
    resolve(handle_, LaunchKernelEx, "cuLaunchKernelEx");
    resolve(handle_, MemAlloc, "cuMemAlloc_v2");
    resolve(handle_, MemFree, "cuMemFree_v2");
    resolve(handle_, MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    resolve(handle_, MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    resolve(handle_, MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2");
    resolve(handle_, MemsetD8Async, "cuMemsetD8Async");
    resolve(handle_, MemHostAlloc, "cuMemHostAlloc");
    resolve(handle_, MemFreeHost, "cuMemFreeHost");
    resolve(handle_, StreamCreate, "cuStreamCreate");
    resolve(handle_, StreamDestroy, "cuStreamDestroy_v2");
    resolve(handle_, StreamSynchronize, "cuStreamSynchronize");
    resolve(handle_, GetErrorName, "cuGetErrorName");
    resolve(handle_, GetErrorString, "cuGetErrorString");
    resolve(handle_, StreamBeginCapture, "cuStreamBeginCapture_v2");
    resolve(handle_, StreamEndCapture, "cuStreamEndCapture");
    resolve(handle_, GraphInstantiate, "cuGraphInstantiateWithFlags");
    resolve(handle_, GraphLaunch, "cuGraphLaunch");
    resolve(handle_, GraphDestroy, "cuGraphDestroy");
    resolve(handle_, GraphExecDestroy, "cuGraphExecDestroy");
  } catch (...) {
    dlclose(handle_);
    throw;
  }
}

Driver::~Driver() {
  if (handle_) dlclose(handle_);
}

void* Driver::symbol(const char* name) const { return dlsym(handle_, name); }

std::string Driver::error_name(CUresult r) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (GetErrorName(r, &name) == kSuccess && name != nullptr) {
    if (GetErrorString(r, &text) != kSuccess || text == nullptr) text = "";
    return std::string(name) + " (" + text + ")";
  }
  return "CUresult " + std::to_string(r);
}

void Driver::check(CUresult r, const std::string& call) const {
  if (r != kSuccess) fail(BPK_ERR_EXECUTION, call + " failed: " + error_name(r));
}

Device::Device(const Driver& drv, int ordinal) : drv_(drv) {
  const CUresult init = drv.Init(0);
  if (init == kErrorNoDevice) fail(BPK_ERR_UNSUPPORTED, "the CUDA driver found no device");
  drv.check(init, "cuInit");
  int count = 0;
  drv.check(drv.DeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count)
    fail(BPK_ERR_UNSUPPORTED, "cuda:" + std::to_string(ordinal) + " requested; this machine has " +
                                  std::to_string(count) + " CUDA device(s)");
  drv.check(drv.DeviceGet(&dev_, ordinal), "cuDeviceGet");
  info_.ordinal = ordinal;
  drv.check(drv.DeviceGetAttribute(&info_.major, kAttrComputeCapabilityMajor, dev_), "cuDeviceGetAttribute");
  drv.check(drv.DeviceGetAttribute(&info_.minor, kAttrComputeCapabilityMinor, dev_), "cuDeviceGetAttribute");
  drv.check(drv.DeviceGetAttribute(&info_.sm_count, kAttrMultiprocessorCount, dev_), "cuDeviceGetAttribute");
  char name[256] = {};
  drv.check(drv.DeviceGetName(name, int(sizeof name) - 1, dev_), "cuDeviceGetName");
  info_.name = name;
  drv.check(drv.DevicePrimaryCtxRetain(&ctx_, dev_), "cuDevicePrimaryCtxRetain");
  activate();
}

Device::~Device() {
  if (ctx_) drv_.DevicePrimaryCtxRelease(dev_);
}

void Device::activate() const { drv_.check(drv_.CtxSetCurrent(ctx_), "cuCtxSetCurrent"); }

DeviceBuffer::DeviceBuffer(const Driver& drv, size_t bytes) : drv_(drv), bytes_(bytes) {
  drv.check(drv.MemAlloc(&ptr_, std::max<size_t>(bytes, 1)), "cuMemAlloc(" + std::to_string(bytes) + ")");
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) drv_.MemFree(ptr_);
}

Module::Module(const Driver& drv, const uint8_t* image, size_t size) : drv_(drv) {
  // PTX text must be NUL-terminated (what the Python loader appends to any image not an ELF cubin)
  std::vector<uint8_t> copy;
  const bool elf = size >= 4 && std::memcmp(image, "\x7f" "ELF", 4) == 0;
  if (!elf && (size == 0 || image[size - 1] != 0)) {
    copy.assign(image, image + size);
    copy.push_back(0);
    image = copy.data();
  }
  drv.check(drv.ModuleLoadData(&mod_, image), "cuModuleLoadData");
}

Module::~Module() {
  if (mod_) drv_.ModuleUnload(mod_);
}

Kernel::Kernel(const Driver& drv, const Module& module, const std::string& name) : drv_(drv), name_(name) {
  drv.check(drv.ModuleGetFunction(&fn_, module.handle(), name.c_str()), "cuModuleGetFunction");
}

void Kernel::launch(const unsigned grid[3], const unsigned block[3], const void* params, size_t nbytes, unsigned smem,
                    CUstream stream, const unsigned cluster[3]) const {
  size_t size = nbytes;
  void* extra[5] = {reinterpret_cast<void*>(1), const_cast<void*>(params), reinterpret_cast<void*>(2), &size, nullptr};
  launch_with(grid, block, nullptr, extra, smem, stream, cluster);
}

void Kernel::launch_grid_constant(const unsigned grid[3], const unsigned block[3], const void* params, unsigned smem,
                                  CUstream stream, const unsigned cluster[3]) const {
  void* argv[1] = {const_cast<void*>(params)};
  launch_with(grid, block, argv, nullptr, smem, stream, cluster);
}

void Kernel::launch_with(const unsigned grid[3], const unsigned block[3], void** kernel_params, void** extra,
                         unsigned smem, CUstream stream, const unsigned cluster[3]) const {
  if (smem > 48 * 1024) {
    std::lock_guard<std::mutex> lock(mu_);
    if (smem > optin_) {
      drv_.check(drv_.FuncSetAttribute(fn_, kFuncAttributeMaxDynamicSharedBytes, int(smem)), "cuFuncSetAttribute");
      optin_ = smem;
    }
  }
  if (cluster != nullptr && (cluster[0] != 1 || cluster[1] != 1 || cluster[2] != 1)) {
    LaunchAttribute attr{};
    attr.id = kLaunchAttributeClusterDimension;
    attr.value[0] = cluster[0];
    attr.value[1] = cluster[1];
    attr.value[2] = cluster[2];
    LaunchConfig config{grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, &attr, 1};
    drv_.check(drv_.LaunchKernelEx(&config, fn_, kernel_params, extra),
               "cuLaunchKernelEx(" + name_ + ", cluster (" + std::to_string(cluster[0]) + ", " +
                   std::to_string(cluster[1]) + ", " + std::to_string(cluster[2]) + "))");
    return;
  }
  drv_.check(
      drv_.LaunchKernel(fn_, grid[0], grid[1], grid[2], block[0], block[1], block[2], smem, stream, kernel_params, extra),
      "cuLaunchKernel(" + name_ + ")");
}

std::pair<std::string, size_t> choose_image(const std::vector<std::string>& arches, int major, int minor) {
  // (major, minor, arch-specific) of the best cubin; (major, minor) of the best PTX
  std::tuple<int, int, int> best_cubin{-1, -1, -1};
  std::pair<int, int> best_ptx{-1, -1};
  size_t cubin = arches.size(), ptx = arches.size();
  for (size_t i = 0; i < arches.size(); ++i) {
    const std::string& a = arches[i];
    const bool is_sm = a.rfind("sm_", 0) == 0, is_ptx = a.rfind("compute_", 0) == 0;
    std::string digits = a.substr(is_sm ? 3 : is_ptx ? 8 : 0);
    const bool specific = !digits.empty() && digits.back() == 'a';
    if (specific) digits.pop_back();
    const bool valid = (is_sm || is_ptx) && digits.size() >= 2 &&
                       std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
                       !(is_ptx && specific);
    if (!valid) fail(BPK_ERR_FORMAT, "kernel image name '" + a + "' is not sm_XY[a] or compute_XY");
    const int maj = std::stoi(digits.substr(0, digits.size() - 1)), mi = digits.back() - '0';
    if (is_sm) {
      const bool runs = (maj == major && mi == minor) || (!specific && maj == major && mi <= minor);
      if (runs && std::make_tuple(maj, mi, int(specific)) > best_cubin) {
        best_cubin = {maj, mi, int(specific)};
        cubin = i;
      }
    } else if (std::make_pair(maj, mi) <= std::make_pair(major, minor) && std::make_pair(maj, mi) > best_ptx) {
      best_ptx = {maj, mi};
      ptx = i;
    }
  }
  if (cubin < arches.size()) return {arches[cubin], cubin};
  if (ptx < arches.size()) return {arches[ptx], ptx};
  std::vector<std::string> have(arches);
  std::sort(have.begin(), have.end());
  std::string list;
  for (const auto& a : have) list += (list.empty() ? "" : ", ") + a;
  fail(BPK_ERR_UNSUPPORTED, "no kernel image runs on sm_" + std::to_string(major) + std::to_string(minor) +
                                ": the artifact has " + (list.empty() ? std::string("none") : list));
}

}  // namespace bpk::cuda
