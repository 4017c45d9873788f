// The out-of-range policy per dim: a batch above its maximum run as several calls whose results are
// concatenated (Note [Batch-like dims] in bladepack/ir/batch_dims.py; docs/format.md "Batch-like dims").
//
// In: the manifest's `batch_dims` records and the load option "DIM=POLICY[,DIM=POLICY...]". Out:
// `SplitPolicy`, which for a call whose split dim is above its maximum gives the [lo, hi) pieces of
// it, all inside the range and of near-equal size. The messages are bladepack/loader/out_of_range.py's.
// Model::run_split (out_of_range.cpp) runs the pieces.
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bladepack/runtime.h"
#include "manifest.h"

namespace bpk {

struct SplitDim {
  std::string dim;
  int64_t min = 0, max = 0;
  std::vector<int64_t> inputs, outputs;  // the dim's axis per input and output, -1: absent
};

struct Pieces {
  const SplitDim* split = nullptr;
  std::vector<std::pair<int64_t, int64_t>> bounds;  // [lo, hi) along the dim
};

class SplitPolicy {
 public:
  SplitPolicy() = default;
  // Throws bpk::Error(BPK_ERR_ARGUMENT) for an unknown dim or policy, or a split the compiler did not
  // prove; BPK_ERR_FORMAT for a malformed proof record.
  SplitPolicy(const msgpack::object& root, const Manifest& m, const char* requested, const std::string& source);
  explicit operator bool() const { return !splits_.empty(); }
  // The pieces of the split dim above its maximum, or nothing for a plain call (also when the inputs
  // are inconsistent: the plain call then says what is wrong). Inputs are checked for rank already.
  std::optional<Pieces> pieces(const bpk_tensor* in) const;

 private:
  std::vector<SplitDim> splits_;
};

}  // namespace bpk
