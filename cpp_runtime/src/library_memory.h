// A shared object held in memory (an artifact section), loaded with dlopen.
//
// In: the bytes (a private copy already checked against the manifest: Artifact::section_copy, Note
// [Hash what runs] in bladepack/loader/library_file.py) and a tag for the file name. Out:
// `MemoryLibrary` (the dlopen handle, closed on destruction). Note [Library from memory]: the dynamic
// loader identifies an object by its path, so the bytes go to a memfd, sealed against writing,
// growing and shrinking before it is loaded, that stays open while the library is loaded (its
// /proc/self/fd path cannot name another file meanwhile); where memfd is missing or executing it is
// forbidden, an unlinked 0600 temporary file under $TMPDIR. Used for the CPU kernel libraries and the
// CUTLASS Params packer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "artifact.h"

namespace bpk {

class MemoryLibrary {
 public:
  // Empty handle() and `error` set when neither way loads it.
  MemoryLibrary(const std::vector<uint8_t>& so, const std::string& tag, int flags);
  ~MemoryLibrary();
  MemoryLibrary(const MemoryLibrary&) = delete;
  MemoryLibrary& operator=(const MemoryLibrary&) = delete;

  void* handle() const { return handle_; }
  const std::string& error() const { return error_; }
  // dlclose now (the destructor then does nothing but close the memfd)
  void close();

 private:
  void* handle_ = nullptr;
  int memfd_ = -1;
  std::string error_;
};

}  // namespace bpk
