// Errors inside the runtime: one exception type carrying the C ABI status, caught at the C boundary.
#pragma once

#include <stdexcept>
#include <string>

#include "bladepack/runtime.h"

namespace bpk {

class Error : public std::runtime_error {
 public:
  Error(bpk_status status, const std::string& what) : std::runtime_error(what), status_(status) {}
  bpk_status status() const { return status_; }

 private:
  bpk_status status_;
};

[[noreturn]] inline void fail(bpk_status status, const std::string& what) { throw Error(status, what); }

}  // namespace bpk
