// The shape-symbol program (docs/format.md "The shape program"): validation and evaluation.
//
// In: the manifest's code / num_registers / messages, and per call the input dims. Out: the register
// file, or bpk::Error(BPK_ERR_SHAPE_GUARD) carrying the failed ASSERT's message with {value} and
// {other} filled in, exactly as the Python evaluator raises it. Python's integers are the reference:
// FLOORDIV and MOD round toward negative infinity; a result outside int64 is an error here (Python
// would carry on with a big integer that no tensor could have).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bpk {

enum class ShapeOp : int64_t {
  kConst = 0, kDim, kAdd, kSub, kMul, kFloorDiv, kCeilDiv, kMod,
  kMin, kMax, kLt, kLe, kEq, kNe, kSelect, kAssert,
};

struct ShapeProgram {
  std::vector<int64_t> code;  // five words per instruction: op, d, a, b, c
  int64_t num_registers = 0;
  std::vector<std::string> messages;

  // Throws BPK_ERR_FORMAT (the text without the source prefix) for an unknown opcode, a register or
  // message index out of range, or a DIM reading an input or axis that the signature does not have.
  void validate(const std::vector<int32_t>& input_ranks) const;
  // dims[i] points at input i's dims (validated ranks); regs has num_registers entries.
  void evaluate(const int64_t* const* dims, int64_t* regs) const;
};

}  // namespace bpk
