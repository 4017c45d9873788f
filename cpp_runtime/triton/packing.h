// Packed merging (Note [Packed merging] in bladepack/serving/batching.py): the byte-level helpers of
// backend.cpp. Every row of every request is one sequence of a packed call (bpk_model_run_packed); the
// ragged inputs hold their rows on axis 0 and the sequence on axis 1, the layout packed here (others
// merge padded), so a request's rows, one after the other, are already its sequences' tokens.
#pragma once

#include <bladepack/runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace bpk_triton {

// The bytes of a C-contiguous tensor.
size_t bytes_of(const bpk_tensor& t);

struct PackedInputs {
  std::vector<bpk_tensor> inputs;           // the packed call's inputs: [1, tokens, ...] each
  std::vector<std::vector<uint8_t>> bytes;  // their storage
  std::vector<int64_t> lengths;             // one per sequence (per row of each request, in order)
};

// The requests' inputs (each in signature order, all ragged along axis 1, lengths[k] the length of
// request k) packed into one call.
PackedInputs pack(const std::vector<const std::vector<bpk_tensor>*>& requests, const std::vector<int64_t>& lengths);

// Whether a CPU instance merges along padded dim `d` packed: the artifact's packed form runs along it,
// every input holds it on axis 1 and every output on axis 1 or not at all (one row per sequence); and
// `tokens`, the packed plan's most tokens (the rows' maximum times the dim's; -1: no limit).
bool packs(const bpk_model* model, const bpk_signature& sig, const bpk_padded_dim& d, int64_t* tokens);

// Request k's part of output `o` of a packed call, a view into it: its tokens' rows ([rows, length,
// ...] from token `token_at`) when the output holds the sequence on axis 1, else its sequences' rows
// ([rows, ...] from row `seq_at`: an output with one row per sequence).
bpk_tensor part(const bpk_tensor& o, bool tokens, int64_t rows, int64_t length, int64_t token_at, int64_t seq_at);

}  // namespace bpk_triton
