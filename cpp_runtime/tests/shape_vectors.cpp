// Checks the C++ shape-program evaluator against vectors the Python evaluator wrote
// (tests/test_cpp_runtime.py): every register, or the exact guard message.
//
//   shape_vectors VECTORS.msgpack      -> "N programs, M cases agree" and exit 0, else the first
//                                         disagreements and exit 1
#include <msgpack.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "errors.h"
#include "shape_program.h"

namespace {

const msgpack::object& get(const msgpack::object& m, const char* key) {
  for (uint32_t i = 0; i < m.via.map.size; ++i) {
    const auto& kv = m.via.map.ptr[i];
    if (kv.key.type == msgpack::type::STR && kv.key.as<std::string>() == key) return kv.val;
  }
  throw std::runtime_error(std::string("vector without '") + key + "'");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: shape_vectors VECTORS.msgpack\n");
    return 2;
  }
  std::ifstream f(argv[1], std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  msgpack::object_handle h = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& programs = h.get();
  size_t cases = 0, bad = 0;
  for (uint32_t p = 0; p < programs.via.array.size; ++p) {
    const msgpack::object& v = programs.via.array.ptr[p];
    bpk::ShapeProgram prog;
    const msgpack::object& code = get(v, "code");
    prog.code.resize(code.via.bin.size / 8);
    std::memcpy(prog.code.data(), code.via.bin.ptr, code.via.bin.size);
    prog.num_registers = get(v, "num_registers").as<int64_t>();
    prog.messages = get(v, "messages").as<std::vector<std::string>>();
    const auto ranks = get(v, "ranks").as<std::vector<int32_t>>();
    prog.validate(ranks);
    const msgpack::object& cs = get(v, "cases");
    for (uint32_t c = 0; c < cs.via.array.size; ++c, ++cases) {
      const msgpack::object& k = cs.via.array.ptr[c];
      const auto dims = get(k, "dims").as<std::vector<std::vector<int64_t>>>();
      std::vector<const int64_t*> ptrs;
      for (const auto& d : dims) ptrs.push_back(d.data());
      std::vector<int64_t> regs(size_t(prog.num_registers));
      std::string got_error;
      try {
        prog.evaluate(ptrs.data(), regs.data());
      } catch (const bpk::Error& e) {
        got_error = e.what();
      }
      const msgpack::object& want_regs = get(k, "regs");
      const std::string want_error = get(k, "error").type == msgpack::type::STR ? get(k, "error").as<std::string>() : "";
      bool ok;
      if (!want_error.empty()) {
        ok = got_error == want_error;
      } else {
        ok = got_error.empty() && want_regs.as<std::vector<int64_t>>() == regs;
      }
      if (!ok && bad++ < 10)
        std::fprintf(stderr, "program %u case %u: expected %s, got %s\n", p, c,
                     want_error.empty() ? "registers" : ("error '" + want_error + "'").c_str(),
                     got_error.empty() ? "other registers" : ("error '" + got_error + "'").c_str());
    }
  }
  if (bad) {
    std::fprintf(stderr, "%zu of %zu cases disagree\n", bad, cases);
    return 1;
  }
  std::printf("%u programs, %zu cases agree\n", programs.via.array.size, cases);
  return 0;
}
