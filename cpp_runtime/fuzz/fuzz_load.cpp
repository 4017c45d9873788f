// libFuzzer target: the artifact reader, the manifest parser and the shape program.
//
// Built with FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, where checksum mismatches are ignored so that
// mutations reach the msgpack parser and the manifest checks. Any input must end in a parsed
// manifest or a bpk::Error; a crash, a sanitizer report or an uncaught exception is a bug. Kernel
// libraries are not loaded: their bytes are code, trusted through the section checksum.
#include <cstdint>
#include <vector>

#include "artifact.h"
#include "errors.h"
#include "manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto artifact = bpk::Artifact::copy_from(data, size, true);
    bpk::Manifest m = bpk::parse_manifest(artifact->manifest());
    std::vector<int32_t> ranks;
    for (const auto& t : m.inputs) ranks.push_back(int32_t(t.shape.size()));
    m.shape_program.validate(ranks);
    // evaluate at a few shapes: every dim 1, then each dim its static size or 7
    for (int64_t fill : {int64_t(1), int64_t(7)}) {
      std::vector<std::vector<int64_t>> dims;
      std::vector<const int64_t*> ptrs;
      for (const auto& t : m.inputs) {
        dims.emplace_back();
        for (const auto& d : t.shape) dims.back().push_back(d.is_static ? d.size : fill);
      }
      for (const auto& d : dims) ptrs.push_back(d.data());
      std::vector<int64_t> regs(size_t(m.shape_program.num_registers));
      try {
        m.shape_program.evaluate(ptrs.data(), regs.data());
      } catch (const bpk::Error&) {
      }
    }
  } catch (const bpk::Error&) {
  }
  return 0;
}
