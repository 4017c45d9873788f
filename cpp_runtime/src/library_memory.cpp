#include "library_memory.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <vector>

namespace bpk {
namespace {

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

}  // namespace

MemoryLibrary::MemoryLibrary(const std::vector<uint8_t>& so, const std::string& tag, int flags) {
  memfd_ = memfd_create(("bladepack-" + tag).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (memfd_ >= 0 && write_all(memfd_, so.data(), so.size()) &&
      fcntl(memfd_, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL) == 0) {
    const std::string path = "/proc/self/fd/" + std::to_string(memfd_);
    handle_ = dlopen(path.c_str(), flags);
    if (!handle_) error_ = dlerror();
  }
  if (!handle_) {  // no memfd, or executing it is forbidden here: an unlinked temporary file
    const char* tmp = std::getenv("TMPDIR");
    std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/bladepack-XXXXXX";
    std::vector<char> name(path.begin(), path.end());
    name.push_back('\0');
    const int fd = mkstemp(name.data());
    if (fd >= 0) {
      const bool ok = write_all(fd, so.data(), so.size());
      ::close(fd);
      if (ok) {
        handle_ = dlopen(name.data(), flags);
        if (!handle_) error_ = dlerror();
      }
      ::unlink(name.data());
    }
  }
  if (!handle_) {
    if (memfd_ >= 0) ::close(memfd_);
    memfd_ = -1;
    if (error_.empty()) error_ = "cannot write it out";
  }
}

void MemoryLibrary::close() {
  if (handle_) dlclose(handle_);
  handle_ = nullptr;
}

MemoryLibrary::~MemoryLibrary() {
  close();
  if (memfd_ >= 0) ::close(memfd_);
}

}  // namespace bpk
