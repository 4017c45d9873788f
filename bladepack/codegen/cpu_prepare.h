//! bpk::prep::prepare, defined once per kernel library in its runtime unit: a new input-shape signature
//! prepared in native code (Note [Native preparation] in bladepack/loader/native_prepare.py, which
//! builds the program this reads and documents its layout). Spliced into cpu_library.py's runtime text.
namespace bpk {
namespace prep {

// The program's header: word k is the count or the position (in the program) named here; the order is
// native_prepare.HEADER's.
enum Head : int64_t {
  kMagic, kInputs, kInputsAt, kRegs, kConsts, kConstsAt, kCode, kCodeAt, kOutputs, kOutputsAt, kArena,
  kWeights, kWeightsAt, kBuffers, kBuffersAt, kPtrs, kPtrsAt, kGemms, kGemmsAt, kWords, kWordsAt, kFills,
  kFillsAt, kLaunches, kLaunchesAt, kWritableAt, kMemory, kConds, kCondsAt, kHeadWords
};
constexpr int64_t kMagicWord = 0x3150455250'4b5042;  // "BPKPREP1", little-endian

// Why a signature was left to the Python path (info[2]); 0: prepared.
enum Stage : int64_t {
  kPrepared = 0, kProgram = 1, kSlotBytes = 2, kBuffer = 3, kPointer = 4, kGemm = 5, kVariant = 6,
  kOperands = 7, kMemoryLimit = 8, kMalformed = 9,
};

inline bool floordiv(int64_t a, int64_t b, int64_t* v) {
  if (b == 0 || (b == -1 && a == INT64_MIN)) return false;
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  *v = q;
  return true;
}

// The shape program (docs/format.md) over the flattened input dims; a DIM instruction's `a` is the
// dim's position in `dims` (the builder rewrote it). False exactly where the Python evaluator raises
// (a failed ASSERT, a zero divisor, a result outside int64): the Python path then raises its error.
inline bool run_program(const int64_t* code, int64_t n, const int64_t* dims, int64_t* r) {
  for (int64_t pc = 0; pc < n; ++pc) {
    const int64_t* w = code + 5 * pc;
    const int64_t d = w[1], a = w[2], b = w[3], c = w[4];
    int64_t v = 0;
    switch (w[0]) {
      case 0: v = a; break;
      case 1: v = dims[a]; break;
      case 2: if (__builtin_add_overflow(r[a], r[b], &v)) return false; break;
      case 3: if (__builtin_sub_overflow(r[a], r[b], &v)) return false; break;
      case 4: if (__builtin_mul_overflow(r[a], r[b], &v)) return false; break;
      case 5: if (!floordiv(r[a], r[b], &v)) return false; break;
      case 6:  // CEILDIV: -((-a) // b), rounded up from C's truncation
        if (r[b] == 0 || (r[b] == -1 && r[a] == INT64_MIN)) return false;
        v = r[a] / r[b];
        if (r[a] % r[b] != 0 && ((r[a] < 0) == (r[b] < 0))) ++v;
        break;
      case 7:
        if (r[b] == 0) return false;
        if (r[b] == -1) break;
        v = r[a] % r[b];
        if (v != 0 && ((v < 0) != (r[b] < 0))) v += r[b];
        break;
      case 8: v = r[a] < r[b] ? r[a] : r[b]; break;
      case 9: v = r[a] > r[b] ? r[a] : r[b]; break;
      case 10: v = r[a] < r[b]; break;
      case 11: v = r[a] <= r[b]; break;
      case 12: v = r[a] == r[b]; break;
      case 13: v = r[a] != r[b]; break;
      case 14: v = r[a] ? r[b] : r[c]; break;
      case 15:
        if (!r[a]) return false;
        continue;
      default: return false;
    }
    r[d] = v;
  }
  return true;
}

// item * the product of n register values (refs); false for a negative dim or an int64 overflow
inline bool bytes_of(int64_t item, const int64_t* refs, int64_t n, const int64_t* r, int64_t* out) {
  int64_t b = item;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t d = r[refs[k]];
    if (d < 0 || __builtin_mul_overflow(b, d, &b)) return false;
  }
  *out = b;
  return true;
}

// Note [GEMM records] (bladepack/loader/plan_check.py): a record's integers against the room behind
// its pointers (A, B, D, then the epilogue source C); false wherever check_gemm raises, and where int64
// arithmetic would not hold an extent.
inline bool gemm_ok(const int64_t* v, int64_t nv, const int64_t* room, bool has_c, int64_t item) {
  const int64_t* b = v;
  const int64_t mm = v[12], nn = v[13], kk = v[14], ta = v[15], tb = v[16], lda = v[17], ldb = v[18], ldc = v[19];
  for (int k = 0; k < 15; ++k)
    if (v[k] < 0) return false;
  if ((ta != 0 && ta != 1) || (tb != 0 && tb != 1)) return false;
  const int64_t i32 = 2147483647;
  if (mm > i32 || nn > i32 || kk > i32 || lda > i32 || ldb > i32 || ldc > i32) return false;
  const int64_t a_rows = ta ? kk : mm, a_cols = ta ? mm : kk, b_rows = tb ? nn : kk, b_cols = tb ? kk : nn;
  if (lda < std::max<int64_t>(1, a_cols) || ldb < std::max<int64_t>(1, b_cols) || ldc < std::max<int64_t>(1, nn))
    return false;
  if (mm && nn)
    for (int k = 0; k < 3; ++k)
      if (b[k] > 1 && v[9 + k] < 1) return false;
  if (b[0] == 0 || b[1] == 0 || b[2] == 0 || mm == 0 || nn == 0) return true;
  auto extent = [&](const int64_t* strides, int64_t rows, int64_t cols, int64_t ld, int64_t* out) {
    if (!rows || !cols) {
      *out = 0;
      return true;
    }
    int64_t last = cols, t = 0;
    for (int k = 0; k < 3; ++k)
      if (__builtin_mul_overflow(b[k] - 1, strides[k], &t) || __builtin_add_overflow(last, t, &last)) return false;
    if (__builtin_mul_overflow(rows - 1, ld, &t) || __builtin_add_overflow(last, t, &last)) return false;
    return !__builtin_mul_overflow(last, item, out);
  };
  int64_t need = 0;
  if (kk) {
    if (!extent(v + 3, a_rows, a_cols, lda, &need) || need > room[0]) return false;
    if (!extent(v + 6, b_rows, b_cols, ldb, &need) || need > room[1]) return false;
  }
  if (!extent(v + 9, mm, nn, ldc, &need) || need > room[2]) return false;
  if (has_c && nv >= 24) {
    const int64_t* cs = v + 20;
    const int64_t ld_c = v[23];
    if (cs[0] < 0 || cs[1] < 0 || cs[2] < 0 || ld_c < 0) return false;
    if (!extent(cs, ld_c ? mm : 1, nn, ld_c > 1 ? ld_c : 1, &need) || need > room[3]) return false;
  }
  return true;
}

// Resolve one signature: registers, slot bytes, the checks of Note [Plan checks], the launch words
// (launches a shape condition rules out left out) and the output dims. `check_words` is the library's
// bpk_check. Returns a Stage.
template <typename CheckWords>
int64_t prepare(const int64_t* p, const int64_t* dims, int64_t* r, int64_t* words, int64_t* out_dims,
                int64_t* slot_bytes, int64_t* info, CheckWords check_words) {
  if (p[kMagic] != kMagicWord) return kMalformed;
  const int64_t nregs = p[kRegs];
  for (int64_t k = 0; k < nregs; ++k) r[k] = 0;
  std::memcpy(r + nregs, p + p[kConstsAt], size_t(p[kConsts]) * sizeof(int64_t));
  // inputs: [position of its first dim, rank, item bytes, static dim or -1 per axis]
  const int64_t* in = p + p[kInputsAt];
  int64_t slot = 1;
  for (int64_t i = 0; i < p[kInputs]; ++i, ++slot) {
    const int64_t at = in[0], rank = in[1];
    int64_t bytes = in[2];
    for (int64_t k = 0; k < rank; ++k) {
      const int64_t d = dims[at + k];
      if ((in[3 + k] >= 0 && d != in[3 + k]) || d < 0) return kProgram;
      if (__builtin_mul_overflow(bytes, d, &bytes)) return kSlotBytes;
    }
    slot_bytes[slot] = bytes;
    in += 3 + rank;
  }
  if (!run_program(p + p[kCodeAt], p[kCode], dims, r)) return kProgram;
  const int64_t arena = r[p[kArena]];
  if (arena < 0) return kSlotBytes;
  slot_bytes[0] = arena;
  // outputs: [item bytes (0: not written by the plan), rank, dim refs]
  const int64_t* out = p + p[kOutputsAt];
  int64_t fixed = arena, q = 0;
  for (int64_t k = 0; k < p[kOutputs]; ++k, ++slot) {
    const int64_t rank = out[1];
    for (int64_t a = 0; a < rank; ++a) out_dims[q++] = r[out[2 + a]];
    int64_t bytes = 0;
    if (!bytes_of(out[0], out + 2, rank, r, &bytes)) return kSlotBytes;
    slot_bytes[slot] = bytes;
    if (__builtin_add_overflow(fixed, bytes, &fixed)) return kMemoryLimit;
    out += 2 + rank;
  }
  if (fixed > p[kMemory]) return kMemoryLimit;
  std::memcpy(slot_bytes + slot, p + p[kWeightsAt], size_t(p[kWeights]) * sizeof(int64_t));
  const int64_t nslots = slot + p[kWeights];
  // arena buffers: [offset ref, item bytes, rank, dim refs]
  const int64_t* buf = p + p[kBuffersAt];
  for (int64_t k = 0; k < p[kBuffers]; ++k) {
    const int64_t off = r[buf[0]], rank = buf[2];
    int64_t bytes = 0;
    if (off < 0 || !bytes_of(buf[1], buf + 3, rank, r, &bytes) || bytes > arena - off) return kBuffer;
    buf += 3 + rank;
  }
  // every pointer of every launch: [slot, offset ref]
  const int64_t* ptr = p + p[kPtrsAt];
  for (int64_t k = 0; k < p[kPtrs]; ++k) {
    const int64_t s = ptr[2 * k], at = r[ptr[2 * k + 1]];
    if (s < 0 || s >= nslots || at < 0 || at > slot_bytes[s]) return kPointer;
  }
  // GEMM records: [first pointer (in the list above), pointer count, item bytes, integer count, refs]
  const int64_t* g = p + p[kGemmsAt];
  for (int64_t k = 0; k < p[kGemms]; ++k) {
    const int64_t first = g[0], np = g[1], item = g[2], ni = g[3];
    int64_t v[24] = {0}, room[4] = {0};
    if (ni < 20 || ni > 24 || np < 3 || np > 4) return kMalformed;
    for (int64_t j = 0; j < ni; ++j) v[j] = r[g[4 + j]];
    for (int64_t j = 0; j < np; ++j) room[j] = slot_bytes[ptr[2 * (first + j)]] - r[ptr[2 * (first + j) + 1]];
    if (!gemm_ok(v, ni, room, np == 4, item)) return kGemm;
    g += 4 + ni;
  }
  // every data condition of every launch: [slot, offset ref] (a byte inside its slot)
  const int64_t* cond = p + p[kCondsAt];
  for (int64_t k = 0; k < p[kConds]; ++k) {
    const int64_t s = cond[2 * k], at = r[cond[2 * k + 1]];
    if (s < 0 || s >= nslots || at < 0 || at >= slot_bytes[s]) return kPointer;
  }
  // the words: the template, its register words filled (after the room for the list), each kernel's
  // variant chosen, the launches a shape condition rules out dropped, and before each run of
  // launches under the same data conditions one WHEN record per condition, outermost first, skipping
  // the rest of the run when its byte says otherwise (the Python path's segments: a run ends at a
  // dropped launch and wherever the conditions change)
  const int64_t nw = p[kWords];
  int64_t* tw = words + nw + 7 * p[kConds];
  std::memcpy(tw, p + p[kWordsAt], size_t(nw) * sizeof(int64_t));
  const int64_t* fill = p + p[kFillsAt];
  for (int64_t k = 0; k < p[kFills]; ++k) tw[fill[2 * k]] = r[fill[2 * k + 1]];
  // launches: [start, end, condition count, (predicate ref, expected) pairs, data condition count,
  // (slot, offset ref, expected) triples, function word position or -1, variant count, (predicate ref,
  // function) pairs]
  const int64_t* ln = p + p[kLaunchesAt];
  // the current run's WHEN records: first position (-1: no run), count, conditions
  int64_t kept = 0, run_at = -1, run_n = 0;
  const int64_t* run_conds = nullptr;
  auto close_run = [&]() {
    for (int64_t j = 0; j < run_n; ++j) words[run_at + 7 * j + 6] = kept - (run_at + 7 * (j + 1));
    run_at = -1;
    run_n = 0;
    run_conds = nullptr;
  };
  for (int64_t k = 0; k < p[kLaunches]; ++k) {
    const int64_t start = ln[0], end = ln[1], nwhen = ln[2];
    bool hold = true;
    for (int64_t j = 0; j < nwhen; ++j) hold = hold && ((r[ln[3 + 2 * j]] != 0) == (ln[4 + 2 * j] != 0));
    const int64_t* data = ln + 3 + 2 * nwhen;
    const int64_t ndata = data[0];
    const int64_t* fn = data + 1 + 3 * ndata;
    const int64_t nvar = fn[1];
    ln = fn + 2 + 2 * nvar;
    if (!hold) {  // a dropped launch ends the run: the conditions are read again after it
      close_run();
      continue;
    }
    bool same = run_at >= 0 && ndata == run_n;
    for (int64_t j = 0; same && j < ndata; ++j)
      same = data[1 + 3 * j] == run_conds[3 * j] && r[data[2 + 3 * j]] == r[run_conds[3 * j + 1]] &&
             (data[3 + 3 * j] != 0) == (run_conds[3 * j + 2] != 0);
    if (!same) {
      close_run();
      run_at = kept;
      run_n = ndata;
      run_conds = data + 1;
      for (int64_t j = 0; j < ndata; ++j) {
        int64_t* w = words + kept;
        w[0] = BPK_OP_WHEN, w[1] = data[3 + 3 * j] != 0, w[2] = 1, w[3] = 1;
        w[4] = data[1 + 3 * j], w[5] = r[data[2 + 3 * j]], w[6] = 0;
        kept += 7;
      }
    }
    if (fn[0] >= 0) {
      int64_t chosen = -1;
      for (int64_t j = 0; j < nvar && chosen < 0; ++j)
        if (r[fn[2 + 2 * j]]) chosen = fn[3 + 2 * j];
      if (chosen < 0 || chosen >= bpk_nfn) return kVariant;
      tw[fn[0]] = chosen;
    }
    std::memcpy(words + kept, tw + start, size_t(end - start) * sizeof(int64_t));
    kept += end - start;
  }
  close_run();
  int64_t status[4] = {0, 0, 0, 0};
  const uint8_t* writable = reinterpret_cast<const uint8_t*>(p + p[kWritableAt]);
  if (check_words(words, kept, slot_bytes, writable, nslots, status)) return kOperands;
  info[0] = kept;
  info[1] = arena;
  return kPrepared;
}

}  // namespace prep
}  // namespace bpk
