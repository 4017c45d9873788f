// The .bpk container (docs/format.md "Layout"): header, checksummed msgpack manifest, sections.
//
// In: a path (memory-mapped read-only, or read once into private memory) or bytes (copied into 64-byte
// aligned storage). Out: the manifest as a msgpack object and bounds-checked views of the sections, or
// bpk::Error (BPK_ERR_FORMAT / BPK_ERR_IO) with the same text the Python reader raises.
//
// Note [Mapped or private] (bladepack/artifact/format.py): the header and the manifest are copied once
// and only the copies are checked and parsed; code (kernel libraries, GPU images) is taken with
// `section_copy`, a private copy checked against the manifest's digest; weights of a mapped file are
// the file's bytes when used. `open(..., map_file=false)` reads the whole file privately instead.
#pragma once

#include <msgpack.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <array>
#include <unordered_map>
#include <vector>

namespace bpk {

struct Bytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// Which artifacts to trust (Note [Trust model] in bladepack/artifact/trust.py): the whole file's
// SHA-256 (hex; empty: any) and Ed25519 public keys one of which must have signed it (none: unsigned ok).
struct Trust {
  std::string sha256;
  std::vector<std::array<uint8_t, 32>> keys;
};

class Artifact {
 public:
  static std::unique_ptr<Artifact> open(const std::string& path, bool verify, const Trust& trust = {},
                                        bool map_file = true);
  static std::unique_ptr<Artifact> copy_from(const void* data, size_t size, bool verify, const Trust& trust = {});
  ~Artifact();
  Artifact(const Artifact&) = delete;
  Artifact& operator=(const Artifact&) = delete;

  const std::string& source() const { return source_; }
  const msgpack::object& manifest() const { return parent_ ? view_manifest_ : handle_.get(); }
  // Note [Packed sequences] (bladepack/passes/pack_sequences.py): the packed form as an artifact of its
  // own, a view of this one, which must outlive it: its manifest the record's plan (with this file's
  // format_version), its section names mapped through the record's `sections`. BPK_ERR_UNSUPPORTED
  // when the artifact has none, BPK_ERR_FORMAT for a malformed record.
  std::unique_ptr<Artifact> packed_view() const;
  Bytes section(const std::string& name) const;  // BPK_ERR_FORMAT "missing section 'NAME'"
  // the section copied once and checked against the manifest's digest: what native code is loaded from
  std::vector<uint8_t> section_copy(const std::string& name) const;
  [[noreturn]] void fail(const std::string& what) const;

 private:
  Artifact(std::string source, const uint8_t* base, size_t size);
  void parse(bool verify, const Trust& trust);
  void check_digest(const std::string& expected) const;
  void check_signature(const std::vector<std::array<uint8_t, 32>>& keys) const;
  struct Check {
    const uint8_t* data;
    size_t size;
    const char* digest;  // 64 hex digits, or null when the entry's digest is malformed
    std::string name;
  };
  void read_sections(bool verify, uint64_t data_start);
  void verify_sections(const std::vector<Check>& checks) const;

  std::string source_;
  const uint8_t* base_;
  size_t size_;
  uint64_t data_end_ = 0;    // where the last section ends (a signature block may follow)
  void* mapping_ = nullptr;  // munmap'ed in the destructor (path loads)
  void* owned_ = nullptr;    // freed in the destructor (memory loads)
  msgpack::object_handle handle_;
  std::unordered_map<std::string, Bytes> views_;
  std::unordered_map<std::string, std::string> digests_;  // the manifest's SHA-256 (hex) per section
  std::array<uint8_t, 64> header_{};                       // Note [Mapped or private]: as first read
  std::vector<char> manifest_bytes_;                       // the manifest as first read (handle_ may point in)
  // a packed view (packed_view): the artifact it reads, its section names there, its manifest
  const Artifact* parent_ = nullptr;
  std::unordered_map<std::string, std::string> renames_;
  msgpack::zone view_zone_;
  msgpack::object view_manifest_;
};

// Python's repr() of a str or bytes, so messages read exactly as the Python loader's.
std::string py_repr(const std::string& s);
std::string py_bytes_repr(const uint8_t* p, size_t n);

}  // namespace bpk
