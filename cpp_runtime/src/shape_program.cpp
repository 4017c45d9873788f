#include "shape_program.h"

#include "errors.h"
#include "util.h"

namespace bpk {
namespace {

constexpr int64_t kWords = 5;

[[noreturn]] void guard(const std::string& what) { fail(BPK_ERR_SHAPE_GUARD, what); }

[[noreturn]] void overflow(size_t pc) {
  guard("shape program overflowed int64 at instruction " + std::to_string(pc) +
        ": an input dimension is too large for the sizes derived from it");
}

int64_t nonzero(int64_t x) {
  if (x == 0) guard("shape program divided by zero: an input dimension makes a derived size undefined");
  return x;
}


std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = s.find(from); p != std::string::npos; p = s.find(from, p + to.size())) s.replace(p, from.size(), to);
  return s;
}

}  // namespace

void ShapeProgram::validate(const std::vector<int32_t>& input_ranks) const {
  if (num_registers < 0) fail(BPK_ERR_FORMAT, "shape program: negative register count");
  if (code.size() % kWords) fail(BPK_ERR_FORMAT, "shape program code must be a multiple of 40 bytes");
  const int64_t n = num_registers;
  if (uint64_t(n) > code.size() / kWords)  // the register file is allocated per shape: no lying counts
    fail(BPK_ERR_FORMAT, "shape program: " + std::to_string(n) + " registers for " + std::to_string(code.size() / kWords) +
                             " instructions (each defines at most one)");
  auto reg_ok = [n](int64_t r) { return r >= 0 && r < n; };
  for (size_t pc = 0; pc * kWords < code.size(); ++pc) {
    const int64_t* w = &code[pc * kWords];
    const int64_t op = w[0], d = w[1], a = w[2], b = w[3], c = w[4];
    const std::string at = " at " + std::to_string(pc);
    if (op < 0 || op > int64_t(ShapeOp::kAssert))
      fail(BPK_ERR_FORMAT, "shape program: unknown opcode " + std::to_string(op) + at);
    bool ok = reg_ok(d);
    switch (ShapeOp(op)) {
      case ShapeOp::kConst:
        break;
      case ShapeOp::kDim:
        if (ok && (a < 0 || a >= int64_t(input_ranks.size()) || b < 0 || b >= input_ranks[size_t(a)]))
          fail(BPK_ERR_FORMAT, "shape program: DIM reads input " + std::to_string(a) + " axis " + std::to_string(b) +
                                   ", which the signature does not have" + at);
        break;
      case ShapeOp::kSelect:
        ok = ok && reg_ok(a) && reg_ok(b) && reg_ok(c);
        break;
      case ShapeOp::kAssert:
        if (c < 0 || c >= int64_t(messages.size()))
          fail(BPK_ERR_FORMAT, "shape program: message " + std::to_string(c) + " out of range" + at);
        ok = ok && reg_ok(a) && reg_ok(b);
        break;
      default:
        ok = ok && reg_ok(a) && reg_ok(b);
    }
    if (!ok) fail(BPK_ERR_FORMAT, "shape program: register out of range" + at);
  }
}

void ShapeProgram::evaluate(const int64_t* const* dims, int64_t* r) const {
  for (int64_t i = 0; i < num_registers; ++i) r[i] = 0;
  const size_t count = code.size() / kWords;
  for (size_t pc = 0; pc < count; ++pc) {
    const int64_t* w = &code[pc * kWords];
    const int64_t d = w[1], a = w[2], b = w[3], c = w[4];
    int64_t v = 0;
    switch (ShapeOp(w[0])) {
      case ShapeOp::kConst:
        r[d] = a;
        continue;
      case ShapeOp::kDim:
        r[d] = dims[a][b];
        continue;
      case ShapeOp::kAdd:
        if (__builtin_add_overflow(r[a], r[b], &v)) overflow(pc);
        break;
      case ShapeOp::kSub:
        if (__builtin_sub_overflow(r[a], r[b], &v)) overflow(pc);
        break;
      case ShapeOp::kMul:
        if (__builtin_mul_overflow(r[a], r[b], &v)) overflow(pc);
        break;
      case ShapeOp::kFloorDiv:
        if (nonzero(r[b]) == -1 && r[a] == INT64_MIN) overflow(pc);
        v = floordiv(r[a], r[b]);
        break;
      case ShapeOp::kCeilDiv:  // -floor(-a / b)
        if (nonzero(r[b]) == -1 && r[a] == INT64_MIN) overflow(pc);
        v = ceildiv(r[a], r[b]);
        break;
      case ShapeOp::kMod:
        if (nonzero(r[b]) == -1) {
          v = 0;
        } else {
          v = r[a] % r[b];
          if (v != 0 && ((v < 0) != (r[b] < 0))) v += r[b];
        }
        break;
      case ShapeOp::kMin:
        v = r[a] < r[b] ? r[a] : r[b];
        break;
      case ShapeOp::kMax:
        v = r[a] > r[b] ? r[a] : r[b];
        break;
      case ShapeOp::kLt:
        v = r[a] < r[b];
        break;
      case ShapeOp::kLe:
        v = r[a] <= r[b];
        break;
      case ShapeOp::kEq:
        v = r[a] == r[b];
        break;
      case ShapeOp::kNe:
        v = r[a] != r[b];
        break;
      case ShapeOp::kSelect:
        v = r[a] ? r[b] : r[c];
        break;
      case ShapeOp::kAssert:
        if (!r[a]) {
          std::string msg = replace_all(messages[size_t(c)], "{value}", std::to_string(r[b]));
          guard(replace_all(msg, "{other}", std::to_string(r[d])));
        }
        continue;
    }
    r[d] = v;
  }
}

}  // namespace bpk
