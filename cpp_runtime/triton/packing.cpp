// Packed merging's byte-level helpers (packing.h).
#include "packing.h"

#include <cstring>

namespace bpk_triton {

size_t bytes_of(const bpk_tensor& t) {
  size_t n = bpk_dtype_size(t.dtype);
  for (int i = 0; i < t.ndim; ++i) n *= static_cast<size_t>(t.shape[i]);
  return n;
}

PackedInputs pack(const std::vector<const std::vector<bpk_tensor>*>& requests, const std::vector<int64_t>& lengths) {
  PackedInputs out;
  int64_t tokens = 0;
  for (size_t k = 0; k < requests.size(); ++k) {
    const int64_t rows = (*requests[k])[0].shape[0];
    for (int64_t j = 0; j < rows; ++j) out.lengths.push_back(lengths[k]);
    tokens += rows * lengths[k];
  }
  const size_t n = requests[0]->size();
  out.inputs = *requests[0];
  out.bytes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    bpk_tensor& t = out.inputs[i];
    t.shape[0] = 1;
    t.shape[1] = tokens;
    out.bytes[i].reserve(bytes_of(t));
    for (const auto* r : requests) {  // a request's rows, one after the other, are its sequences
      const bpk_tensor& x = (*r)[i];
      const auto* p = static_cast<const uint8_t*>(x.data);
      out.bytes[i].insert(out.bytes[i].end(), p, p + bytes_of(x));
    }
    t.data = out.bytes[i].data();
  }
  return out;
}

bool packs(const bpk_model* model, const bpk_signature& sig, const bpk_padded_dim& d, int64_t* tokens) {
  const char* symbol = bpk_model_packed_symbol(model);
  if (symbol == nullptr || std::strcmp(symbol, d.name) != 0) return false;
  for (int64_t i = 0; i < sig.num_inputs; ++i)
    if (d.input_axes[i] != 1) return false;
  for (int64_t k = 0; k < sig.num_outputs; ++k)
    if (d.output_axes[k] != 0 && d.output_axes[k] != 2u) return false;
  int64_t rows = -1, length = -1;
  for (int64_t k = 0; k < sig.num_symbols; ++k) {
    if (std::strcmp(sig.symbols[k].name, d.rows) == 0) rows = sig.symbols[k].max;
    if (std::strcmp(sig.symbols[k].name, d.name) == 0) length = sig.symbols[k].max;
  }
  *tokens = rows < 0 || length < 0 ? -1 : rows * length;
  return true;
}

bpk_tensor part(const bpk_tensor& o, bool tokens, int64_t rows, int64_t length, int64_t token_at, int64_t seq_at) {
  bpk_tensor v = o;
  size_t inner = bpk_dtype_size(o.dtype);
  for (int d = tokens ? 2 : 1; d < o.ndim; ++d) inner *= static_cast<size_t>(o.shape[d]);
  v.shape[0] = rows;
  if (tokens) v.shape[1] = length;
  v.data = static_cast<uint8_t*>(o.data) + static_cast<size_t>(tokens ? token_at : seq_at) * inner;
  return v;
}

}  // namespace bpk_triton
