// The model config's parameters (config.h).
#include "config.h"

#include <cstdlib>

namespace bpk_triton {

// The string value of parameter `key` in Triton's JSON model config ("key":{"string_value":"..."}), or
// empty; values bladepack writes are hex digits and commas, so no escapes are read.
std::string string_parameter(const std::string& json, const std::string& key) {
  const std::string quoted = "\"" + key + "\"";
  for (size_t at = json.find(quoted); at != std::string::npos; at = json.find(quoted, at + 1)) {
    size_t p = json.find_first_not_of(" \t\n", at + quoted.size());
    if (p == std::string::npos || json[p] != ':') continue;  // a value such as an input's name
    const size_t sv = json.find("\"string_value\"", p);
    const size_t close = json.find('}', p);
    if (sv == std::string::npos || sv > close) return "";
    const size_t open = json.find('"', json.find(':', sv + 14) + 1);
    const size_t end = open == std::string::npos ? open : json.find('"', open + 1);
    return end == std::string::npos ? "" : json.substr(open + 1, end - open - 1);
  }
  return "";
}

// 64 hex digits per key, comma-separated, appended to `out` as bytes; false when malformed.
bool parse_keys(const std::string& text, std::vector<uint8_t>* out) {
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    const std::string hex = text.substr(start, end - start);
    if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) return false;
    for (size_t i = 0; i < 64; i += 2) out->push_back(uint8_t(std::stoul(hex.substr(i, 2), nullptr, 16)));
    start = end + 1;
  }
  return true;
}

int64_t max_batch_size(const std::string& json) {
  const std::string key = "\"max_batch_size\":";
  size_t at = json.find(key);
  if (at == std::string::npos) return 0;
  return std::strtoll(json.c_str() + at + key.size(), nullptr, 10);
}

}  // namespace bpk_triton
