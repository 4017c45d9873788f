// Model's plan checks, run once per prepared input-shape signature before any launch of it: pointer
// offsets, conditions and GEMM records against the bytes each slot holds (Note [Plan checks]), and the
// CUDA kernels' operand checks (Note [Kernel operand checks]).
#include "model.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "dtype.h"
#include "errors.h"
#include "util.h"

namespace bpk {

// Note [Plan checks] (bladepack/loader/plan_check.py), per input-shape signature: every pointer offset
// inside its slot's tensor, and every GEMM record (Note [GEMM records]) against what it addresses. The
// messages are the Python loader's.
void Model::check_launches(const Prepared& p, const bpk_tensor* in) const {
  auto corrupt = [this](const std::string& what) { artifact_->fail("corrupt plan: " + what); };
  const NativePlan& nat = plan();
  std::vector<uint64_t> slots{uint64_t(p.arena_bytes)};
  for (size_t i = 0; i < m_.inputs.size(); ++i) {
    size_t n = 0;
    byte_count(in[i].shape, in[i].ndim, dtype_size(in[i].dtype), &n);  // checked by check_inputs
    slots.push_back(n);
  }
  for (size_t k = 0; k < p.outs.size(); ++k) slots.push_back(nat.outputs[k] >= 0 ? p.outs[k].nbytes : 0);
  for (const auto& w : m_.weights) {
    size_t n = 0;
    byte_count(w.shape.data(), int32_t(w.shape.size()), dtype_size(w.dtype), &n);
    slots.push_back(n);
  }
  const int64_t* r = p.regs.data();
  for (size_t i = 0; i < nat.launches.size(); ++i) {
    const LaunchDecl& l = nat.launches[i];
    for (const CondDecl& c : l.when) {
      if (c.reg >= 0) continue;
      const int64_t at = c.offset.resolve(r);
      if (at < 0 || uint64_t(at) >= slots[size_t(c.slot)])
        corrupt("launch " + std::to_string(i) + "'s condition reads byte " + std::to_string(at) + " of slot " +
                std::to_string(c.slot) + ", which holds " + std::to_string(slots[size_t(c.slot)]));
    }
    std::vector<uint64_t> room;
    for (const auto& [slot, off] : l.ptrs) {
      const int64_t at = off.resolve(r);
      if (slot < 0 || size_t(slot) >= slots.size() || at < 0 || uint64_t(at) > slots[size_t(slot)])
        corrupt("launch " + std::to_string(i) + " points " + std::to_string(at) + " bytes into slot " +
                std::to_string(slot) + ", which holds " +
                std::to_string(slot >= 0 && size_t(slot) < slots.size() ? slots[size_t(slot)] : 0));
      const int64_t out = slot - 1 - int64_t(m_.inputs.size());
      if (out >= 0 && out < int64_t(nat.outputs.size()) && nat.outputs[size_t(out)] < 0)
        corrupt("launch " + std::to_string(i) + " points at output " + std::to_string(out) +
                "'s slot, which the plan does not write");
      room.push_back(slots[size_t(slot)] - uint64_t(at));
    }
    if (l.op != LaunchDecl::kGemm && l.op != LaunchDecl::kCutlass && l.op != LaunchDecl::kCublasLt) continue;
    std::vector<int64_t> v;
    for (const auto& s : l.ints) v.push_back(s.resolve(r));
    check_gemm(i, v, room, l.gemm_item);
  }
  if (cuda_) {
    // the CUDA kernels' check programs, on the same slot sizes (a slot of 2^63 bytes or more is refused
    // when the call allocates it, as on the CPU)
    if (*std::max_element(slots.begin(), slots.end()) <= uint64_t(INT64_MAX)) check_cuda_operands(p, slots);
    return;
  }
  // Note [Kernel operand checks]: the kernel library checks its kernels' integers and extents
  // a slot of 2^63 bytes or more cannot be allocated: the call fails there, before any launch
  if (*std::max_element(slots.begin(), slots.end()) > uint64_t(INT64_MAX)) return;
  std::vector<int64_t> bytes(slots.begin(), slots.end());
  std::vector<uint8_t> writable(slots.size(), 0);  // the arena and the outputs the plan writes
  writable[0] = 1;
  for (size_t k = 0; k < nat.outputs.size(); ++k) writable[1 + m_.inputs.size() + k] = nat.outputs[k] >= 0;
  int64_t status[4] = {0, 0, 0, 0};
  if (lib_->check(p.words.data(), int64_t(p.words.size()), bytes.data(), writable.data(), int64_t(bytes.size()),
                  status)) {
    if (status[0] >= 0 && size_t(status[0]) < p.launch_index.size()) status[0] = p.launch_index[size_t(status[0])];
    operand_error(status, r, slots);
  }
}

// The messages of bladepack/loader/plan_check.py's operand_error (docs/format.md, "Kernel operand checks").
void Model::operand_error(const int64_t* status, const int64_t* r, const std::vector<uint64_t>& slots) const {
  const NativePlan& nat = plan();
  const int64_t i = status[0], code = status[1], value = status[2], extra = status[3];
  const LaunchDecl* l = i >= 0 && size_t(i) < nat.launches.size() ? &nat.launches[size_t(i)] : nullptr;
  std::string where = "launch " + std::to_string(i);
  if (l && l->op == LaunchDecl::kKernel) where += " (kernel " + kernels()[size_t(l->kernel)].name + ")";
  const size_t np = l ? l->ptrs.size() : 0, ni = l ? l->ints.size() : 0;
  std::string what;
  if (code == 1 && value >= 0) {
    what = "passes " + std::to_string(np) + " pointers and " + std::to_string(ni) + " integers; its function takes " +
           std::to_string(value) + " and " + std::to_string(extra);
  } else if (code == 2 && value >= 0 && size_t(value) < ni) {
    what = "passes " + std::to_string(l->ints[size_t(value)].resolve(r)) + " as integer " + std::to_string(value) +
           "; its shape symbols make it " + std::to_string(extra);
  } else if (code == 3) {
    what = "integer " + std::to_string(value) + " is a negative size or overflows int64";
  } else if (code == 4 && value >= 0 && size_t(value) < np) {
    const auto& [slot, off] = l->ptrs[size_t(value)];
    const int64_t room = int64_t(slots[size_t(slot)]) - off.resolve(r);
    what = "pointer " + std::to_string(value) + " reaches " + std::to_string(extra) + " bytes; its tensor holds " +
           std::to_string(room) + " from there";
  } else if (code == 6) {
    what = "pointer " + std::to_string(value) + "'s buffer has a negative dim or overflows int64";
  } else if (code == 7) {
    what = "writes through pointer " + std::to_string(value) + " into slot " + std::to_string(extra) +
           ", an input or a weight";
  } else {
    what = "its record is malformed (check code " + std::to_string(code) + ")";
  }
  artifact_->fail("corrupt plan: " + where + ": " + what);
}

void Model::check_gemm(size_t i, const std::vector<int64_t>& v, const std::vector<uint64_t>& room, int64_t item) const {
  auto corrupt = [this](const std::string& what) { artifact_->fail("corrupt plan: " + what); };
  const bool has_c = v.size() == 24 && room.size() == 4;  // a CUTLASS epilogue source (Note [GEMM epilogue])
  if (!has_c && (v.size() != 20 || room.size() != 3))
    corrupt("launch " + std::to_string(i) + ": a GEMM takes 3 pointers and 20 integers, not " +
            std::to_string(room.size()) + " / " + std::to_string(v.size()));
  const int64_t *b = &v[0], *sa = &v[3], *sb = &v[6], *sc = &v[9];
  const int64_t M = v[12], N = v[13], K = v[14], ta = v[15], tb = v[16], lda = v[17], ldb = v[18], ldc = v[19];
  const std::string where = "launch " + std::to_string(i) + " (GEMM M=" + std::to_string(M) + " N=" + std::to_string(N) +
                            " K=" + std::to_string(K) + " lda=" + std::to_string(lda) + " ldb=" + std::to_string(ldb) +
                            " ldc=" + std::to_string(ldc) + " batch=[" + std::to_string(b[0]) + ", " +
                            std::to_string(b[1]) + ", " + std::to_string(b[2]) + "])";
  for (size_t k = 0; k < 12; ++k)
    if (v[k] < 0) corrupt(where + ": negative count or stride, or a transpose flag other than 0 / 1");
  if (M < 0 || N < 0 || K < 0 || (ta != 0 && ta != 1) || (tb != 0 && tb != 1))
    corrupt(where + ": negative count or stride, or a transpose flag other than 0 / 1");
  constexpr int64_t kInt32Max = 2147483647;
  if (std::max({M, N, K, lda, ldb, ldc}) > kInt32Max)
    corrupt(where + ": a dim or leading dim above " + std::to_string(kInt32Max));
  const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
  if (lda < std::max<int64_t>(1, a_cols) || ldb < std::max<int64_t>(1, b_cols) || ldc < std::max<int64_t>(1, N))
    corrupt(where + ": a leading dim is shorter than its row");
  if (M && N)
    for (size_t k = 0; k < 3; ++k)
      if (b[k] > 1 && sc[k] < 1)
        corrupt(where + ": the batches of D overlap (D's batch strides are [" + std::to_string(sc[0]) + ", " +
                std::to_string(sc[1]) + ", " + std::to_string(sc[2]) + "])");
  if (b[0] == 0 || b[1] == 0 || b[2] == 0 || M == 0 || N == 0) return;
  // every value is below 2^31 or a non-negative stride; products are done in 128 bits
  auto extent = [&](const int64_t* s, int64_t rows, int64_t cols, int64_t ld) -> __int128 {
    if (!rows || !cols) return 0;
    __int128 last = __int128(rows - 1) * ld + cols;
    for (size_t k = 0; k < 3; ++k) last += __int128(b[k] - 1) * s[k];
    return last * item;
  };
  __int128 need[4] = {K ? extent(sa, a_rows, a_cols, lda) : 0, K ? extent(sb, b_rows, b_cols, ldb) : 0,
                      extent(sc, M, N, ldc), 0};
  const char* names[4] = {"A", "B", "D", "C"};
  if (has_c) {
    const int64_t* ss = &v[20];
    const int64_t ld_c = v[23];
    if (std::min({ss[0], ss[1], ss[2], ld_c}) < 0) corrupt(where + ": negative epilogue source stride");
    need[3] = extent(ss, ld_c ? M : 1, N, std::max<int64_t>(ld_c, 1));
  }
  for (size_t k = 0; k < (has_c ? 4u : 3u); ++k)
    if (need[k] > __int128(room[k])) {
      const __int128 n = need[k];
      const std::string bytes = n > __int128(INT64_MAX) ? std::string("more than 2^63") : std::to_string(int64_t(n));
      corrupt(where + ": operand " + names[k] + " reaches " + bytes + " bytes; its tensor holds " +
              std::to_string(room[k]) + " from there");
    }
}

void Model::check_cuda_operands(const Prepared& p, const std::vector<uint64_t>& slots) const {
  const NativePlan& nat = *m_.native_cuda;
  const int64_t* r = p.regs.data();
  std::vector<int64_t> regs;
  for (size_t i = 0; i < nat.launches.size(); ++i) {
    const LaunchDecl& l = nat.launches[i];
    if (l.op != LaunchDecl::kKernel || !m_.cuda_kernels[size_t(l.kernel)].check) continue;
    const KernelDecl& k = m_.cuda_kernels[size_t(l.kernel)];
    std::vector<int64_t> ints, room;
    for (const SymInt& v : l.ints) ints.push_back(v.resolve(r));
    for (const auto& [slot, off] : l.ptrs) room.push_back(int64_t(slots[size_t(slot)]) - off.resolve(r));
    const int64_t* dims[2] = {ints.data(), room.data()};
    regs.assign(size_t(k.check->num_registers), 0);
    try {
      k.check->evaluate(dims, regs.data());
    } catch (const Error& e) {
      const std::string text = e.what();
      artifact_->fail("corrupt plan: launch " + std::to_string(i) + " (kernel " + k.name + "): " +
                      (text.find("overflowed") == std::string::npos ? text : "its integers overflow int64"));
    }
  }
}

}  // namespace bpk
