// The CUDA driver API without the CUDA toolkit: dlopen("libcuda.so.1") and the entry points by name.
//
// In: a device ordinal. Out: `Driver` (the entry points this runtime calls, resolved once per model:
// dlopen counts references), `Device` (name, compute capability, SM count, the retained primary
// context: the one every runtime-API user of the process shares, so device pointers pass between
// them), `DeviceBuffer`, and `choose_image` (Note [Kernel images] in bladepack/loader/cuda_driver.py).
// The types are declared here with cuda.h's layouts (Note [No CUDA at build time]): nothing links
// against libcuda, and a machine without a driver loads CPU models as before.
//
// Errors, in the Python loader's words: BPK_ERR_UNSUPPORTED "no CUDA driver found (libcuda.so.1 could
// not be loaded); ..." / "the CUDA driver found no device" / "cuda:N requested; this machine has M
// CUDA device(s)"; BPK_ERR_EXECUTION "<call> failed: CUDA_ERROR_X (text)" for any other failure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace bpk::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = uint64_t;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;
using CUstream = void*;
using CUgraph = void*;
using CUgraphExec = void*;

// cuda.h's CUlaunchAttribute (id, padding, a 64-byte value union) and CUlaunchConfig.
struct LaunchAttribute {
  int32_t id;
  char pad[4];
  uint32_t value[16];
};
struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  CUstream stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
constexpr int kLaunchAttributeClusterDimension = 4;
constexpr int kFuncAttributeMaxDynamicSharedBytes = 8;
constexpr int kAttrComputeCapabilityMajor = 75, kAttrComputeCapabilityMinor = 76, kAttrMultiprocessorCount = 16;
constexpr unsigned kStreamNonBlocking = 1;
constexpr int kCaptureModeThreadLocal = 1;

class Driver {
 public:
  Driver();  // BPK_ERR_UNSUPPORTED when libcuda.so.1 cannot be loaded or lacks an entry point
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  // BPK_ERR_EXECUTION "<call> failed: NAME (text)" unless r is CUDA_SUCCESS
  void check(CUresult r, const std::string& call) const;
  std::string error_name(CUresult r) const;
  // an entry point this runtime does not resolve itself (cuTensorMapEncodeTiled for the GEMM packer)
  void* symbol(const char* name) const;

  CUresult (*Init)(unsigned) = nullptr;
  CUresult (*DeviceGetCount)(int*) = nullptr;
  CUresult (*DeviceGet)(CUdevice*, int) = nullptr;
  CUresult (*DeviceGetName)(char*, int, CUdevice) = nullptr;
  CUresult (*DeviceGetAttribute)(int*, int, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*DevicePrimaryCtxRelease)(CUdevice) = nullptr;
  CUresult (*CtxSetCurrent)(CUcontext) = nullptr;
  CUresult (*ModuleLoadData)(CUmodule*, const void*) = nullptr;
  CUresult (*ModuleUnload)(CUmodule) = nullptr;
  CUresult (*ModuleGetFunction)(CUfunction*, CUmodule, const char*) = nullptr;
  CUresult (*FuncSetAttribute)(CUfunction, int, int) = nullptr;
  CUresult (*LaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                           void**, void**) = nullptr;
  CUresult (*LaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**) = nullptr;
  CUresult (*MemAlloc)(CUdeviceptr*, size_t) = nullptr;
  CUresult (*MemFree)(CUdeviceptr) = nullptr;
  CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void*, size_t, CUstream) = nullptr;
  CUresult (*MemcpyDtoHAsync)(void*, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*MemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream) = nullptr;
  CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream) = nullptr;
  CUresult (*MemHostAlloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*MemFreeHost)(void*) = nullptr;
  CUresult (*StreamCreate)(CUstream*, unsigned) = nullptr;
  CUresult (*StreamDestroy)(CUstream) = nullptr;
  CUresult (*StreamSynchronize)(CUstream) = nullptr;
  CUresult (*GetErrorName)(CUresult, const char**) = nullptr;
  CUresult (*GetErrorString)(CUresult, const char**) = nullptr;
  CUresult (*StreamBeginCapture)(CUstream, int) = nullptr;
  CUresult (*StreamEndCapture)(CUstream, CUgraph*) = nullptr;
  CUresult (*GraphInstantiate)(CUgraphExec*, CUgraph, unsigned long long) = nullptr;
  CUresult (*GraphLaunch)(CUgraphExec, CUstream) = nullptr;
  CUresult (*GraphDestroy)(CUgraph) = nullptr;
  CUresult (*GraphExecDestroy)(CUgraphExec) = nullptr;

 private:
  void* handle_ = nullptr;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int major = 0, minor = 0;
  int sm_count = 0;
  std::string arch() const { return "sm_" + std::to_string(major) + std::to_string(minor); }
};

// One device and its retained primary context (made current on the calling thread by activate()).
class Device {
 public:
  Device(const Driver& drv, int ordinal);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const DeviceInfo& info() const { return info_; }
  void activate() const;
  const Driver& driver() const { return drv_; }

 private:
  const Driver& drv_;
  DeviceInfo info_;
  CUdevice dev_ = 0;
  CUcontext ctx_ = nullptr;
};

// `bytes` of device memory, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(const Driver& drv, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  CUdeviceptr ptr() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  const Driver& drv_;
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// A loaded image (cubin, fatbin or PTX), unloaded on destruction.
class Module {
 public:
  Module(const Driver& drv, const uint8_t* image, size_t size);
  ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  CUmodule handle() const { return mod_; }

 private:
  const Driver& drv_;
  CUmodule mod_ = nullptr;
};

// A function of a module, launched with its parameters packed in one buffer
// (CU_LAUNCH_PARAM_BUFFER_POINTER: the driver copies them at launch), or, for a kernel whose one
// parameter is a __grid_constant__ struct (the Hopper GEMMs), through kernelParams (Note [Grid-constant
// parameters] in bladepack/loader/cuda_driver.py). Above 48 KiB of dynamic shared memory the function's
// limit is raised first (once per size); a thread-block cluster of more than one CTA launches through
// cuLaunchKernelEx. Thread-safe.
class Kernel {
 public:
  Kernel(const Driver& drv, const Module& module, const std::string& name);
  const std::string& name() const { return name_; }
  CUfunction handle() const { return fn_; }
  void launch(const unsigned grid[3], const unsigned block[3], const void* params, size_t nbytes, unsigned smem,
              CUstream stream, const unsigned cluster[3] = nullptr) const;
  void launch_grid_constant(const unsigned grid[3], const unsigned block[3], const void* params, unsigned smem,
                            CUstream stream, const unsigned cluster[3] = nullptr) const;

 private:
  const Driver& drv_;
  std::string name_;
  CUfunction fn_ = nullptr;
  void launch_with(const unsigned grid[3], const unsigned block[3], void** kernel_params, void** extra, unsigned smem,
                   CUstream stream, const unsigned cluster[3]) const;
  mutable std::mutex mu_;
  mutable unsigned optin_ = 0;
};

// Note [Kernel images]: (arch, index) of the image to load for compute capability major.minor, from
// the plan's image arches ("sm_80", "sm_90a", "compute_90"); BPK_ERR_UNSUPPORTED when none runs.
std::pair<std::string, size_t> choose_image(const std::vector<std::string>& arches, int major, int minor);

}  // namespace bpk::cuda
