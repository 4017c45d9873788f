#include "artifact.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <system_error>
#include <thread>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "errors.h"
#include "util.h"

namespace bpk {
namespace {

constexpr uint8_t kMagic[8] = {0x89, 'B', 'P', 'K', '\r', '\n', 0x1a, '\n'};
constexpr uint64_t kHeaderSize = 64;

uint64_t align64(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

template <class T>
T load_le(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // the format is little-endian, as is every supported host
  return v;
}

std::string hex(const uint8_t* p, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = digits[p[i] >> 4];
    s[2 * i + 1] = digits[p[i] & 15];
  }
  return s;
}

void sha256(const uint8_t* p, size_t n, uint8_t out[32]) {
  unsigned int len = 0;
  if (!EVP_Digest(p, n, out, &len, EVP_sha256(), nullptr) || len != 32)
    fail(BPK_ERR_MEMORY, "SHA-256 failed (OpenSSL)");
}

bool read_int(const msgpack::object& o, int64_t* v) {
  if (o.type == msgpack::type::POSITIVE_INTEGER) {
    if (o.via.u64 > uint64_t(INT64_MAX)) return false;
    *v = int64_t(o.via.u64);
    return true;
  }
  if (o.type == msgpack::type::NEGATIVE_INTEGER) {
    *v = o.via.i64;
    return true;
  }
  return false;
}


}  // namespace

namespace {

// The body of Python's repr() of a str (bytes >= 0x80 are UTF-8 and pass through) or of bytes (they
// are escaped), quotes included.
std::string repr(const uint8_t* p, size_t n, bool bytes) {
  bool has_sq = false, has_dq = false;
  for (size_t i = 0; i < n; ++i) {
    has_sq |= p[i] == '\'';
    has_dq |= p[i] == '"';
  }
  const char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = p[i];
    if (c == '\\' || c == uint8_t(q)) {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || (bytes && c > 0x7f)) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
  }
  return out + q;
}

}  // namespace

std::string py_repr(const std::string& s) { return repr(reinterpret_cast<const uint8_t*>(s.data()), s.size(), false); }
std::string py_bytes_repr(const uint8_t* p, size_t n) { return "b" + repr(p, n, true); }

Artifact::Artifact(std::string source, const uint8_t* base, size_t size)
    : source_(std::move(source)), base_(base), size_(size) {}

Artifact::~Artifact() {
  if (mapping_) munmap(mapping_, size_);
  std::free(owned_);
}

void Artifact::fail(const std::string& what) const { bpk::fail(BPK_ERR_FORMAT, source_ + ": " + what); }

std::unique_ptr<Artifact> Artifact::open(const std::string& path, bool verify, const Trust& trust, bool map_file) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) bpk::fail(BPK_ERR_IO, "no artifact at " + path);
    bpk::fail(BPK_ERR_IO, "cannot open " + path + ": " + std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    bpk::fail(BPK_ERR_IO, path + ": not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    bpk::fail(BPK_ERR_FORMAT, path + ": empty file, not a .bpk artifact");
  }
  const size_t size = size_t(st.st_size);
  if (!map_file) {  // Note [Mapped or private]: one read into private memory; the file is not used again
    void* buf = std::aligned_alloc(kAlign, align64(size));
    if (buf == nullptr) {
      ::close(fd);
      bpk::fail(BPK_ERR_MEMORY, "cannot allocate " + std::to_string(size) + " bytes for the artifact");
    }
    size_t done = 0;
    while (done < size) {
      const ssize_t r = ::read(fd, static_cast<uint8_t*>(buf) + done, size - done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      done += size_t(r);
    }
    const int err = errno;
    ::close(fd);
    if (done < size) {
      std::free(buf);
      if (err != 0 && done == 0) bpk::fail(BPK_ERR_IO, "cannot read " + path + ": " + std::strerror(err));
      bpk::fail(BPK_ERR_FORMAT, path + ": the file shrank while being read (" + std::to_string(done) + " of " +
                                    std::to_string(size) + " bytes); it changed under the loader");
    }
    std::unique_ptr<Artifact> a(new Artifact(path, static_cast<const uint8_t*>(buf), size));
    a->owned_ = buf;
    a->parse(verify, trust);
    return a;
  }
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) bpk::fail(BPK_ERR_IO, "cannot map " + path + ": " + std::strerror(err));
  std::unique_ptr<Artifact> a(new Artifact(path, static_cast<const uint8_t*>(p), size));
  a->mapping_ = p;
  a->parse(verify, trust);
  return a;
}

std::unique_ptr<Artifact> Artifact::copy_from(const void* data, size_t size, bool verify, const Trust& trust) {
  if (data == nullptr && size != 0) bpk::fail(BPK_ERR_ARGUMENT, "artifact bytes are NULL");
  void* buf = std::aligned_alloc(kAlign, align64(size == 0 ? 1 : size));
  if (buf == nullptr) bpk::fail(BPK_ERR_MEMORY, "cannot allocate " + std::to_string(size) + " bytes for the artifact");
  if (size) std::memcpy(buf, data, size);
  std::unique_ptr<Artifact> a(new Artifact("<memory>", static_cast<const uint8_t*>(buf), size));
  a->owned_ = buf;
  a->parse(verify, trust);
  return a;
}

void Artifact::parse(bool verify, const Trust& trust) {
  if (!trust.sha256.empty()) check_digest(trust.sha256);  // before anything in the file is read
  verify = verify || !trust.keys.empty();
  if (size_ < kHeaderSize) {
    if (std::memcmp(base_, kMagic, size_ < 8 ? size_ : 8) != 0) fail("not a .bpk artifact (bad magic)");
    fail("truncated: the file has " + std::to_string(size_) + " bytes, the header alone needs 64");
  }
  std::memcpy(header_.data(), base_, kHeaderSize);  // Note [Mapped or private]
  const uint8_t* b = header_.data();
  if (std::memcmp(b, kMagic, 8) != 0)
    fail("not a .bpk artifact (bad magic " + py_bytes_repr(b, 8) + ", expected " + py_bytes_repr(kMagic, 8) + ")");
  const uint16_t major = load_le<uint16_t>(b + 8), minor = load_le<uint16_t>(b + 10);
  const uint32_t hsize = load_le<uint32_t>(b + 12);
  const uint64_t moff = load_le<uint64_t>(b + 16), mlen = load_le<uint64_t>(b + 24);
  const std::string version = std::to_string(major) + "." + std::to_string(minor);
  if (major > BPK_FORMAT_MAJOR)
    fail("format version " + version + " is newer than this loader supports (" + std::to_string(BPK_FORMAT_MAJOR) +
         "." + std::to_string(BPK_FORMAT_MINOR) + "); upgrade bladepack to load it");
  if (major < 1 || hsize != kHeaderSize || moff != kHeaderSize)
    fail("corrupt header (version " + version + ", header size " + std::to_string(hsize) + ", manifest offset " +
         std::to_string(moff) + ")");
  if (mlen > size_ - moff)
    fail("truncated: the manifest needs bytes up to " + std::to_string(moff + mlen) + ", the file has " +
         std::to_string(size_));
  manifest_bytes_.assign(reinterpret_cast<const char*>(base_ + moff), reinterpret_cast<const char*>(base_ + moff + mlen));
  const char* body = manifest_bytes_.data();
  uint8_t digest[32];
  sha256(reinterpret_cast<const uint8_t*>(body), mlen, digest);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // fuzzing: reach the parser behind the checksum
  if (std::memcmp(digest, b + 32, 32) != 0) fail("manifest checksum mismatch: the file is corrupt");
#endif
  // Note [Unpack limits]: every msgpack element takes at least one byte, so no container may claim
  // more elements than the manifest has bytes; this bounds what the unpacker allocates up front.
  const size_t cap = mlen > 0xffffffffu ? 0xffffffffu : size_t(mlen);
  const msgpack::unpack_limit limit(cap, cap, cap, cap, cap, 64);
  try {
    size_t off = 0;
    handle_ = msgpack::unpack(body, size_t(mlen), off, nullptr, nullptr, limit);
    if (off != mlen) fail("manifest is not valid msgpack (extra data after the map)");
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail(std::string("manifest is not valid msgpack (") + e.what() + ")");
  }
  const msgpack::object* secs = map_find(manifest(), "sections");
  if (manifest().type != msgpack::type::MAP || secs == nullptr || secs->type != msgpack::type::ARRAY)
    fail("manifest is not a map with a 'sections' list");
  read_sections(verify, align64(kHeaderSize + mlen));
  if (!trust.keys.empty()) check_signature(trust.keys);
}

namespace {

constexpr uint8_t kSigMagic[8] = {'B', 'P', 'K', 'S', 'I', 'G', 0, 1};
constexpr size_t kSigSize = 128;
constexpr char kSigDomain[] = "bladepack signature v1";  // signed: these bytes, a NUL, the 64-byte header

std::string key_id(const uint8_t* key) {
  uint8_t d[32];
  sha256(key, 32, d);
  return hex(d, 8);
}

bool ed25519_verify(const uint8_t* key, const uint8_t* sig, const uint8_t* msg, size_t n) {
  EVP_PKEY* pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, key, 32);
  if (pkey == nullptr) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx != nullptr && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, pkey) == 1 &&
                  EVP_DigestVerify(ctx, sig, 64, msg, n) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(pkey);
  return ok;
}

}  // namespace

void Artifact::check_digest(const std::string& expected) const {
  std::string want = expected;
  for (auto& c : want) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (want.size() != 64 || want.find_first_not_of("0123456789abcdef") != std::string::npos)
    bpk::fail(BPK_ERR_ARGUMENT, "sha256 must be 64 hex digits, got '" + expected + "'");
  uint8_t got[32];
  sha256(base_, size_, got);
  const std::string got_hex = hex(got, 32);
  if (got_hex != want)
    bpk::fail(BPK_ERR_TRUST, source_ + ": the file's SHA-256 is " + got_hex + ", not the pinned " + want +
                                 "; refusing to load it");
}

void Artifact::check_signature(const std::vector<std::array<uint8_t, 32>>& keys) const {
  std::string ids;
  for (const auto& k : keys) ids += (ids.empty() ? "" : ", ") + key_id(k.data());
  const uint8_t* blk = base_ + data_end_;
  if (size_ != data_end_ + kSigSize || std::memcmp(blk, kSigMagic, 8) != 0 || load_le<uint32_t>(blk + 8) != 1)
    bpk::fail(BPK_ERR_TRUST, source_ + " is not signed; trusted keys: " + ids + " (sign it with `bladepack sign`)");
  const uint8_t* key = blk + 16;
  bool known = false;
  for (const auto& k : keys) known = known || std::memcmp(k.data(), key, 32) == 0;
  if (!known)
    bpk::fail(BPK_ERR_TRUST, source_ + " is signed by key " + key_id(key) + ", which is not among the trusted keys (" +
                                 ids + ")");
  std::vector<uint8_t> msg(kSigDomain, kSigDomain + sizeof kSigDomain);  // with the NUL
  msg.insert(msg.end(), header_.begin(), header_.end());
  if (!ed25519_verify(key, blk + 48, msg.data(), msg.size()))
    bpk::fail(BPK_ERR_TRUST, source_ + ": the signature by key " + key_id(key) + " does not match the artifact");
}

void Artifact::read_sections(bool verify, uint64_t data_start) {
  const msgpack::object& secs = *map_find(manifest(), "sections");
  data_end_ = data_start;
  std::vector<Check> checks;
  for (uint32_t i = 0; i < secs.via.array.size; ++i) {
    const msgpack::object& e = secs.via.array.ptr[i];
    const msgpack::object *name = map_find(e, "name"), *off = map_find(e, "offset"), *len = map_find(e, "length"),
                          *digest = map_find(e, "sha256");
    int64_t o = 0, n = 0;
    if (!name || !off || !len || !digest || name->type != msgpack::type::STR || !read_int(*off, &o) ||
        !read_int(*len, &n))
      fail("section " + std::to_string(i) + " has a malformed entry");
    const std::string sname(name->via.str.ptr, name->via.str.size);
    if (o < 0 || n < 0 || o % int64_t(kAlign))
      fail("section " + py_repr(sname) + " has an invalid offset " + std::to_string(o) + " / length " +
           std::to_string(n));
    const uint64_t start = data_start + uint64_t(o);
    if (start < data_start || start > size_ || uint64_t(n) > size_ - start)
      fail("truncated: section " + py_repr(sname) + " needs bytes up to " + std::to_string(start + uint64_t(n)) +
           ", the file has " + std::to_string(size_));
    const bool digest_ok = digest->type == msgpack::type::STR && digest->via.str.size == 64;
    views_[sname] = Bytes{base_ + start, size_t(n)};
    digests_[sname] = digest_ok ? std::string(digest->via.str.ptr, 64) : std::string();
    data_end_ = std::max(data_end_, start + uint64_t(n));
    if (verify) checks.push_back({base_ + start, size_t(n), digest_ok ? digest->via.str.ptr : nullptr, sname});
  }
  if (verify) verify_sections(checks);
}

// Note [Parallel checksums]: SHA-256 runs at 1-2 GB/s per core, so a 100 MB model spends most of its
// load hashing; sections are hashed on up to one thread per CPU (largest first), and the first
// mismatch in manifest order is reported, as a serial check would report it.
void Artifact::verify_sections(const std::vector<Check>& checks) const {
  std::vector<size_t> order(checks.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return checks[a].size > checks[b].size; });
  std::vector<char> bad(checks.size(), 0);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k; (k = next.fetch_add(1)) < order.size();) {
      const Check& c = checks[order[k]];
      uint8_t got[32];
      if (!EVP_Digest(c.data, c.size, got, nullptr, EVP_sha256(), nullptr)) {
        bad[order[k]] = 2;
        continue;
      }
      bad[order[k]] = c.digest == nullptr || std::memcmp(c.digest, hex(got, 32).data(), 64) != 0;
    }
  };
  size_t total = 0;
  for (const auto& c : checks) total += c.size;
  cpu_set_t set;
  const size_t cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? size_t(CPU_COUNT(&set)) : 1;
  // a thread per 8 MB at most: small artifacts are hashed on the caller's thread alone
  const size_t nthreads = std::min({cpus, checks.size(), total / (size_t(8) << 20) + 1});
  std::vector<std::thread> threads;
  try {
    for (size_t t = 1; t < nthreads; ++t) threads.emplace_back(work);
  } catch (const std::system_error&) {  // no threads to be had: the caller hashes the rest
  }
  work();
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < checks.size(); ++i) {
    if (bad[i] == 2) bpk::fail(BPK_ERR_MEMORY, "SHA-256 failed (OpenSSL)");
    // kept when fuzzing too: a section may be a kernel library, whose bytes are code
    if (bad[i]) fail("checksum mismatch in section " + py_repr(checks[i].name) + ": the file is corrupt");
  }
}

std::vector<uint8_t> Artifact::section_copy(const std::string& name) const {
  if (parent_) {
    auto it = renames_.find(name);
    return parent_->section_copy(it == renames_.end() ? name : it->second);
  }
  const Bytes view = section(name);
  std::vector<uint8_t> out(view.data, view.data + view.size);
  uint8_t got[32];
  sha256(out.data(), out.size(), got);
  const std::string& want = digests_.at(name);
  if (want.size() != 64 || hex(got, 32) != want)
    fail("checksum mismatch in section " + py_repr(name) + ": the file is corrupt (or changed while loading)");
  return out;
}

Bytes Artifact::section(const std::string& name) const {
  if (parent_) {
    auto r = renames_.find(name);
    return parent_->section(r == renames_.end() ? name : r->second);
  }
  auto it = views_.find(name);
  if (it == views_.end()) fail("missing section " + py_repr(name));
  return it->second;
}

std::unique_ptr<Artifact> Artifact::packed_view() const {
  const msgpack::object* rec = map_find(manifest(), "packed");
  if (rec == nullptr || rec->type == msgpack::type::NIL)
    bpk::fail(BPK_ERR_UNSUPPORTED, source_ +
                                       " has no packed form: optimize the model with packed=True (it needs a sequence "
                                       "dim proven paddable with rows of their own length: `bladepack inspect` shows them)");
  const msgpack::object* plan = rec->type == msgpack::type::MAP ? map_find(*rec, "plan") : nullptr;
  const msgpack::object* secs = rec->type == msgpack::type::MAP ? map_find(*rec, "sections") : nullptr;
  const msgpack::object* version = map_find(manifest(), "format_version");
  if (plan == nullptr || plan->type != msgpack::type::MAP || (secs && secs->type != msgpack::type::MAP) || !version)
    fail("malformed manifest: packed lacks its plan or has malformed sections");
  std::unique_ptr<Artifact> v(new Artifact(source_ + " (packed form)", base_, size_));
  v->parent_ = this;
  for (uint32_t i = 0; secs && i < secs->via.map.size; ++i) {
    const msgpack::object_kv& kv = secs->via.map.ptr[i];
    if (kv.key.type != msgpack::type::STR || kv.val.type != msgpack::type::STR)
      fail("malformed manifest: packed.sections must map section names to section names");
    v->renames_[kv.key.as<std::string>()] = kv.val.as<std::string>();
  }
  // the plan's keys, and this file's format_version (a manifest of its own: docs/format.md "Packed form")
  const uint32_t n = plan->via.map.size;
  auto* kv = static_cast<msgpack::object_kv*>(v->view_zone_.allocate_align(sizeof(msgpack::object_kv) * (n + 1)));
  std::copy(plan->via.map.ptr, plan->via.map.ptr + n, kv);
  static constexpr char kVersion[] = "format_version";
  kv[n].key.type = msgpack::type::STR;
  kv[n].key.via.str.ptr = kVersion;
  kv[n].key.via.str.size = sizeof kVersion - 1;
  kv[n].val = *version;
  v->view_manifest_.type = msgpack::type::MAP;
  v->view_manifest_.via.map.size = n + 1;
  v->view_manifest_.via.map.ptr = kv;
  return v;
}

}  // namespace bpk
