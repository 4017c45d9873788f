// Dims requests may differ in and still merge, each padded to the longest (Note [Padding proofs] in
// bladepack/ir/padding.py; docs/format.md "Padding proofs").
//
// In: the manifest's `padding_dims` records. Out: `PaddedDims`, the proven ones as the C ABI's
// bpk_padded_dim array (bpk_model_padded_dims): per input its axis and pad value, per output the axes
// a request's result is trimmed along. Serving reads them (cpp_runtime/triton/backend.cpp); a call
// never does.
#pragma once

#include <msgpack.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "bladepack/runtime.h"
#include "manifest.h"

namespace bpk {

class PaddedDims {
 public:
  PaddedDims() = default;
  // Throws bpk::Error(BPK_ERR_FORMAT) for a malformed record (an unknown tensor, an axis whose dim is
  // not the record's symbol, a pad value that is not a number).
  PaddedDims(const msgpack::object& root, const Manifest& m, const std::string& source);
  PaddedDims(const PaddedDims&) = delete;
  PaddedDims& operator=(const PaddedDims&) = delete;
  PaddedDims(PaddedDims&&) = default;
  PaddedDims& operator=(PaddedDims&&) = default;

  const bpk_padded_dim* data() const { return specs_.data(); }
  int64_t size() const { return int64_t(specs_.size()); }

 private:
  struct Dim {
    std::string name, rows;
    std::vector<int32_t> input_axes;
    std::vector<double> input_pads;
    std::vector<uint64_t> output_axes;
  };
  std::vector<Dim> dims_;
  std::vector<bpk_padded_dim> specs_;
};

}  // namespace bpk
