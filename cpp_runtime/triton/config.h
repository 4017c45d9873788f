// The model config's parameters as Triton hands them to the backend (its JSON form): the helpers of
// backend.cpp's ModelInitialize.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace bpk_triton {

// The string value of parameter `key` in Triton's JSON model config ("key":{"string_value":"..."}), or
// empty; values bladepack writes are hex digits and commas, so no escapes are read.
std::string string_parameter(const std::string& json, const std::string& key);

// 64 hex digits per key, comma-separated, appended to `out` as bytes; false when malformed.
bool parse_keys(const std::string& text, std::vector<uint8_t>* out);

// The config's max_batch_size (0 when absent).
int64_t max_batch_size(const std::string& json);

}  // namespace bpk_triton
