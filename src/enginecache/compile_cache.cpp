// The persistent compile cache (safeckpt/compile_cache.hpp).
//
// Read order for an entry file, each step refusing (kIgnored + warning)
// before the next runs:
//  1. open with O_NOFOLLOW | O_NONBLOCK (a FIFO there does not block), a
//     regular file of at most max_entry_bytes;
//  2. its first 56 bytes alone: the header; magic "SCKCACHE"; format
//     version == kCacheFormatVersion; reserved word 0; payload length ==
//     size - 56. Only then is a buffer of the file's size allocated (no
//     memory: ignored, not thrown) and the whole file read;
//  3. HMAC-SHA256 over header bytes 0..15 and 48..end compared in constant
//     time (CRYPTO_memcmp) with bytes 16..47;
//  4. only now: the Boost binary archive of the payload (bytes we wrote);
//  5. the key fields in the payload equal the requested key.
#include "safeckpt/compile_cache.hpp"

#include <fcntl.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/archive/binary_iarchive.hpp>
#include <boost/archive/binary_oarchive.hpp>
#include <boost/serialization/map.hpp>
#include <boost/serialization/string.hpp>
#include <boost/serialization/vector.hpp>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <streambuf>

#include "safeckpt/hash.hpp"
#include "safeckpt/save.hpp"

namespace safeckpt::enginecache {
namespace {

constexpr char kMagic[8] = {'S', 'C', 'K', 'C', 'A', 'C', 'H', 'E'};
constexpr std::size_t kHeaderBytes = 56;
constexpr std::size_t kMacOffset = 16, kMacBytes = 32, kLengthOffset = 48;
constexpr std::size_t kKeyBytes = 32;
// A store() temporary this old belongs to no live writer (a store writes
// one entry, at most max_entry_bytes, in well under a minute).
constexpr std::chrono::hours kStaleTempAge{1};

Unexpected io_error(const std::string& what, const std::filesystem::path& p, int err) {
  return make_error(ErrorCode::kIo, what + " " + p.string() + ": " + std::strerror(err));
}

void put_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
void put_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
std::uint32_t get_u32(const std::uint8_t* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get_u64(const std::uint8_t* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// HMAC-SHA256 (OpenSSL EVP_MAC) over the file minus its MAC field.
Result<std::array<std::uint8_t, kMacBytes>> entry_mac(const std::vector<std::uint8_t>& key, const std::uint8_t* file,
                                                      std::size_t size) {
  std::array<std::uint8_t, kMacBytes> out{};
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) return make_error(ErrorCode::kInternal, "OpenSSL: HMAC not available");
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                         OSSL_PARAM_construct_end()};
  std::size_t len = 0;
  const bool ok = ctx != nullptr && EVP_MAC_init(ctx, key.data(), key.size(), params) == 1 &&
                  EVP_MAC_update(ctx, file, kMacOffset) == 1 &&
                  EVP_MAC_update(ctx, file + kLengthOffset, size - kLengthOffset) == 1 &&
                  EVP_MAC_final(ctx, out.data(), &len, out.size()) == 1 && len == kMacBytes;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  if (!ok) return make_error(ErrorCode::kInternal, "OpenSSL: HMAC-SHA256 failed");
  return out;
}

// The payload archive: key fields, then the blobs.
// E is CacheEntry (load) or const CacheEntry (save: Boost's output
// archives take const references, so nothing is copied).
template <class Archive, class E>
void serialize_entry(Archive& ar, E& e) {
  auto& k = e.key;
  ar& k.program_hash;
  ar& k.device_name;
  ar& k.sm;
  ar& k.driver_version;
  ar& k.runtime_version;
  ar& k.nvrtc_version;
  ar& k.engine_version;
  ar& k.shapes;
  ar& k.options;
  ar& e.blobs;
}

// A read-only streambuf over bytes (no copy of the payload).
class SpanBuf : public std::streambuf {
 public:
  SpanBuf(const std::uint8_t* data, std::size_t size) {
    char* p = const_cast<char*>(reinterpret_cast<const char*>(data));  // read-only: no put area
    setg(p, p, p + size);
  }
};

std::string field_line(const char* name, const std::string& v) {
  return std::string(name) + "=" + std::to_string(v.size()) + ":" + v + "\n";
}

Status check_key_fields(const CacheKey& k, const CacheLimits& lim) {
  for (const std::string* f : {&k.program_hash, &k.device_name, &k.engine_version, &k.shapes, &k.options})
    if (f->size() > lim.max_key_field_bytes)
      return make_error(ErrorCode::kLimitExceeded, "cache key field of " + std::to_string(f->size()) +
                                                       " bytes above CacheLimits::max_key_field_bytes (" +
                                                       std::to_string(lim.max_key_field_bytes) + ")");
  return {};
}

// The first differing key field's name, or "" when equal.
std::string key_difference(const CacheKey& a, const CacheKey& b) {
  if (a.program_hash != b.program_hash) return "program_hash";
  if (a.device_name != b.device_name) return "device_name";
  if (a.sm != b.sm) return "sm";
  if (a.driver_version != b.driver_version) return "driver_version";
  if (a.runtime_version != b.runtime_version) return "runtime_version";
  if (a.nvrtc_version != b.nvrtc_version) return "nvrtc_version";
  if (a.engine_version != b.engine_version) return "engine_version";
  if (a.shapes != b.shapes) return "shapes";
  if (a.options != b.options) return "options";
  return "";
}

// lstat-based checks of the cache directory.
Status check_dir(const std::filesystem::path& dir) {
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) return io_error("cannot stat cache directory", dir, errno);
  if (S_ISLNK(st.st_mode))
    return make_error(
        ErrorCode::kInvalidArgument,
        "cache directory " + dir.string() + " is a symlink: refused (point SAFECKPT_CACHE_DIR at a real directory)");
  if (!S_ISDIR(st.st_mode))
    return make_error(ErrorCode::kInvalidArgument, "cache directory " + dir.string() + " is not a directory");
  if (st.st_uid != ::geteuid())
    return make_error(ErrorCode::kInvalidArgument, "cache directory " + dir.string() + " is owned by uid " +
                                                       std::to_string(st.st_uid) + ", not by this user");
  if ((st.st_mode & 022) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "cache directory " + dir.string() + " is writable by group or others: refused (chmod 700 it)");
  return {};
}

// mkdir -p with mode 0700 for every directory it creates.
Status make_dirs(const std::filesystem::path& dir) {
  std::filesystem::path cur;
  for (const auto& part : dir) {
    cur /= part;
    if (cur == cur.root_path()) continue;
    if (::mkdir(cur.c_str(), 0700) != 0 && errno != EEXIST) return io_error("cannot create", cur, errno);
  }
  return {};
}

struct FdCloser {
  explicit FdCloser(int f) : fd(f) {}
  int fd;
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() { ::close(fd); }
};

// pread of up to `n` bytes at offset 0 (EINTR retried; fewer at the end of
// the file).
Result<std::uint64_t> read_at(int fd, std::uint8_t* buf, std::uint64_t n, const std::filesystem::path& path) {
  std::uint64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf + got, n - got, static_cast<off_t>(got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return io_error("cannot read", path, errno);
    if (r == 0) break;
    got += static_cast<std::uint64_t>(r);
  }
  return got;
}

void fsync_dir(const std::filesystem::path& dir) {
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

// Reads the key file, checking owner, mode and size. ENOENT is returned as
// kIo with errno ENOENT in `missing`.
Result<std::vector<std::uint8_t>> read_key(const std::filesystem::path& path, bool& missing) {
  missing = false;
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);  // a FIFO: refused, not waited on
  if (fd < 0) {
    if (errno == ENOENT) {
      missing = true;
      return make_error(ErrorCode::kIo, "no key file " + path.string());
    }
    if (errno == ELOOP)
      return make_error(ErrorCode::kInvalidArgument, "cache key file " + path.string() + " is a symlink: refused");
    return io_error("cannot open cache key file", path, errno);
  }
  struct stat st {};
  std::vector<std::uint8_t> key(kKeyBytes);
  Status bad;
  if (::fstat(fd, &st) != 0) {
    bad = io_error("cannot stat", path, errno);
  } else if (!S_ISREG(st.st_mode)) {
    bad = make_error(ErrorCode::kInvalidArgument, "cache key file " + path.string() + " is not a regular file");
  } else if (st.st_uid != ::geteuid()) {
    bad = make_error(ErrorCode::kInvalidArgument, "cache key file " + path.string() + " is owned by uid " +
                                                      std::to_string(st.st_uid) + ", not by this user: refused");
  } else if ((st.st_mode & 07777) != 0600) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    bad = make_error(ErrorCode::kInvalidArgument, "cache key file " + path.string() + " has mode " + mode +
                                                      ", not 0600: refused (someone else may know the key)");
  } else if (st.st_size != static_cast<off_t>(kKeyBytes)) {
    bad = make_error(ErrorCode::kInvalidArgument,
                     "cache key file " + path.string() + " holds " + std::to_string(st.st_size) + " bytes, not 32");
  } else {
    std::size_t got = 0;
    while (got < kKeyBytes) {
      ssize_t n = ::read(fd, key.data() + got, kKeyBytes - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        bad = n < 0 ? io_error("cannot read", path, errno)
                    : make_error(ErrorCode::kInvalidArgument, "cache key file " + path.string() + " is short");
        break;
      }
      got += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  if (!bad) return unexpected(std::move(bad).error());
  return key;
}

// Creates the key: 32 bytes from RAND_bytes into a fresh 0600 temporary
// (O_CREAT|O_EXCL), fsync, then link() to the final name — EEXIST means
// another process published one first, and that one is used.
Status create_key(const std::filesystem::path& path) {
  std::array<std::uint8_t, kKeyBytes> key{};
  if (RAND_bytes(key.data(), static_cast<int>(key.size())) != 1)
    return make_error(ErrorCode::kInternal, "OpenSSL RAND_bytes failed");
  std::random_device rd;
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, ".%08x.tmp", rd());
  const std::filesystem::path tmp = path.string() + suffix;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return io_error("cannot create", tmp, errno);
  Status st;
  if (::fchmod(fd, 0600) != 0) st = io_error("cannot chmod", tmp, errno);
  if (st && ::write(fd, key.data(), key.size()) != static_cast<ssize_t>(key.size()))
    st = io_error("cannot write", tmp, errno);
  if (st && ::fsync(fd) != 0) st = io_error("cannot fsync", tmp, errno);
  ::close(fd);
  if (st && ::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) st = io_error("cannot link key to", path, errno);
  ::unlink(tmp.c_str());
  OPENSSL_cleanse(key.data(), key.size());
  if (st) fsync_dir(path.parent_path());
  return st;
}

bool is_entry_name(const std::filesystem::path& p) {
  if (p.extension() != ".entry") return false;
  const std::string stem = p.stem().string();
  return stem.size() == 64 &&
         std::all_of(stem.begin(), stem.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// store()'s temporary for an entry (write_file_atomically, src/save/
// atomic_file.cpp): "." + <64 hex>.entry + "." + hex + ".tmp".
bool is_entry_temp_name(const std::filesystem::path& p) {
  const std::string n = p.string();
  constexpr std::size_t kStem = 1 + 64 + 6;  // ".", digest, ".entry"
  if (n.size() < kStem + 5 || n[0] != '.' || n.compare(n.size() - 4, 4, ".tmp") != 0) return false;
  if (!is_entry_name(n.substr(1, kStem - 1)) || n[kStem] != '.') return false;
  const std::string mid = n.substr(kStem + 1, n.size() - kStem - 5);
  return !mid.empty() &&
         std::all_of(mid.begin(), mid.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Removes store() temporaries older than kStaleTempAge from `dir` (best
// effort: a file that cannot be removed stays).
void remove_stale_temps(const std::filesystem::path& dir) {
  std::error_code ec;
  const auto stale_before = std::filesystem::file_time_type::clock::now() - kStaleTempAge;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (!is_entry_temp_name(it->path().filename()) || !it->is_regular_file(e2)) continue;
    const auto t = it->last_write_time(e2);
    if (!e2 && t < stale_before) ::unlink(it->path().c_str());
  }
}

}  // namespace

std::string CacheKey::canonical() const {
  return field_line("program_hash", program_hash) + field_line("device_name", device_name) +
         field_line("sm", std::to_string(sm)) + field_line("driver_version", std::to_string(driver_version)) +
         field_line("runtime_version", std::to_string(runtime_version)) +
         field_line("nvrtc_version", std::to_string(nvrtc_version)) + field_line("engine_version", engine_version) +
         field_line("shapes", shapes) + field_line("options", options);
}

std::string CacheKey::digest() const {
  const std::string c = canonical();
  return sha256_hex({reinterpret_cast<const std::uint8_t*>(c.data()), c.size()});
}

Result<std::filesystem::path> CompileCache::default_dir() {
  if (const char* d = std::getenv("SAFECKPT_CACHE_DIR"); d != nullptr && *d != '\0') return std::filesystem::path(d);
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x == '/')
    return std::filesystem::path(x) / "safeckpt";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return std::filesystem::path(h) / ".cache" / "safeckpt";
  return make_error(ErrorCode::kInvalidArgument,
                    "no compile cache location: set SAFECKPT_CACHE_DIR, XDG_CACHE_HOME or HOME");
}

Result<CompileCache> CompileCache::open(const CacheOptions& options) {
  CompileCache c;
  c.limits_ = options.limits;
  std::filesystem::path dir = options.dir;
  if (dir.empty()) {
    SAFECKPT_TRY(dir, default_dir());
  }
  std::error_code ec;
  dir = std::filesystem::absolute(dir, ec).lexically_normal();
  if (ec) return make_error(ErrorCode::kIo, "cannot resolve " + options.dir.string() + ": " + ec.message());
  if (dir.has_filename() == false && dir.has_parent_path()) dir = dir.parent_path();
  struct stat st {};
  if (::lstat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return io_error("cannot stat cache directory", dir, errno);
    SAFECKPT_CHECK(make_dirs(dir));
  }
  SAFECKPT_CHECK(check_dir(dir));
  c.dir_ = dir;
  const std::filesystem::path key_path = options.key_file.empty() ? dir / "hmac.key" : options.key_file;
  bool missing = false;
  auto key = read_key(key_path, missing);
  if (!key && missing) {
    SAFECKPT_CHECK(create_key(key_path));
    key = read_key(key_path, missing);
  }
  if (!key) return unexpected(std::move(key).error());
  c.key_ = std::move(key).value();
  remove_stale_temps(dir);
  return c;
}

std::filesystem::path CompileCache::entry_path(const CacheKey& key) const {
  return dir_ / (key.digest() + ".entry");
}

Result<CacheLookup> CompileCache::load(const CacheKey& key) const {
  CacheLookup out;
  const std::filesystem::path path = entry_path(key);
  auto ignore = [&](const std::string& why) {
    out.status = CacheLookup::Status::kIgnored;
    out.warning = path.string() + ": " + why + "; ignored (the next store replaces it)";
    return out;
  };
  // O_NONBLOCK: a FIFO planted at the entry's name must not block the open
  // (the engine holds its lock here); it is refused as not regular below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return out;  // kMiss
    if (errno == ELOOP) return ignore("a symlink, not an entry");
    return io_error("cannot open cache entry", path, errno);
  }
  const FdCloser closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) return io_error("cannot stat", path, errno);
  if (!S_ISREG(st.st_mode)) return ignore("not a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > limits_.max_entry_bytes)
    return ignore(std::to_string(size) + " bytes, above CacheLimits::max_entry_bytes");
  // The header first: a file that is not an entry of this format and of
  // exactly its declared length is refused before a buffer of its size is
  // allocated or read.
  std::uint8_t head[kHeaderBytes];
  SAFECKPT_TRY(std::uint64_t got, read_at(fd, head, std::min<std::uint64_t>(size, kHeaderBytes), path));
  if (size < kHeaderBytes || got != kHeaderBytes)
    return ignore("truncated (" + std::to_string(size) + " bytes; the header alone is 56)");
  if (std::memcmp(head, kMagic, sizeof kMagic) != 0) return ignore("not a safeckpt cache entry (bad magic)");
  if (get_u32(head + 8) != kCacheFormatVersion || get_u32(head + 12) != 0)
    return ignore("format version " + std::to_string(get_u32(head + 8)) + " (reserved " +
                  std::to_string(get_u32(head + 12)) + "), this build reads version " +
                  std::to_string(kCacheFormatVersion));
  if (get_u64(head + kLengthOffset) != size - kHeaderBytes)
    return ignore("truncated or extended: the header says " + std::to_string(get_u64(head + kLengthOffset)) +
                  " payload bytes, the file holds " + std::to_string(size - kHeaderBytes));
  std::vector<std::uint8_t> file;
  try {
    file.resize(size);
  } catch (const std::bad_alloc&) {
    return ignore("no memory for its " + std::to_string(size) + " bytes");
  }
  SAFECKPT_TRY(got, read_at(fd, file.data(), size, path));
  if (got != size || std::memcmp(file.data(), head, kHeaderBytes) != 0) return ignore("changed while read");
  const std::uint8_t* f = file.data();
  auto mac = entry_mac(key_, f, file.size());
  if (!mac) return unexpected(std::move(mac).error());
  if (CRYPTO_memcmp(mac->data(), f + kMacOffset, kMacBytes) != 0)
    return ignore("MAC mismatch (modified, or written under another key)");
  // Authenticated: only now is the payload parsed.
  CacheEntry e;
  try {
    SpanBuf buf(f + kHeaderBytes, size - kHeaderBytes);
    std::istream is(&buf);
    boost::archive::binary_iarchive ar(is);
    serialize_entry(ar, e);
  } catch (const std::exception& ex) {
    return ignore(std::string("authenticated payload does not deserialize (another Boost version?): ") + ex.what());
  }
  const std::string diff = key_difference(e.key, key);
  if (!diff.empty()) return ignore("key field '" + diff + "' differs from the requested key");
  ::futimens(fd, nullptr);  // LRU: a hit is a use (best effort)
  out.status = CacheLookup::Status::kHit;
  out.entry = std::move(e);
  return out;
}

Result<StoreResult> CompileCache::store(const CacheEntry& entry) const {
  SAFECKPT_CHECK(check_key_fields(entry.key, limits_));
  if (entry.blobs.size() > limits_.max_blobs)
    return make_error(ErrorCode::kLimitExceeded, std::to_string(entry.blobs.size()) +
                                                     " blobs, above CacheLimits::max_blobs (" +
                                                     std::to_string(limits_.max_blobs) + ")");
  std::uint64_t total = kHeaderBytes;
  for (const auto& [name, blob] : entry.blobs) {
    if (name.size() > limits_.max_name_bytes)
      return make_error(ErrorCode::kLimitExceeded,
                        "blob name of " + std::to_string(name.size()) + " bytes above CacheLimits::max_name_bytes");
    total += name.size() + blob.size();
    if (total > limits_.max_entry_bytes)
      return make_error(ErrorCode::kLimitExceeded, "cache entry above CacheLimits::max_entry_bytes (" +
                                                       std::to_string(limits_.max_entry_bytes) + ")");
  }
  std::string payload;
  try {
    std::ostringstream os(std::ios::binary);
    {
      boost::archive::binary_oarchive ar(os);
      serialize_entry(ar, entry);
    }
    payload = std::move(os).str();
  } catch (const std::exception& ex) {
    return make_error(ErrorCode::kInternal, std::string("serializing a cache entry failed: ") + ex.what());
  }
  if (kHeaderBytes + payload.size() > limits_.max_entry_bytes)
    return make_error(ErrorCode::kLimitExceeded, "cache entry above CacheLimits::max_entry_bytes (" +
                                                     std::to_string(limits_.max_entry_bytes) + ")");
  std::vector<std::uint8_t> file(kHeaderBytes + payload.size());
  std::memcpy(file.data(), kMagic, sizeof kMagic);
  put_u32(file.data() + 8, kCacheFormatVersion);
  put_u32(file.data() + 12, 0);
  put_u64(file.data() + kLengthOffset, payload.size());
  std::memcpy(file.data() + kHeaderBytes, payload.data(), payload.size());
  SAFECKPT_TRY(auto mac, entry_mac(key_, file.data(), file.size()));
  std::memcpy(file.data() + kMacOffset, mac.data(), kMacBytes);

  StoreResult r;
  r.path = entry_path(entry.key);
  r.bytes = file.size();
  SaveOptions so;
  so.overwrite = true;
  so.fsync = true;
  SAFECKPT_CHECK(write_file_atomically(
      r.path, so, [&](const std::function<Status(Bytes)>& write) { return write(Bytes(file.data(), file.size())); }));

  if (limits_.max_total_bytes > 0) {
    struct Item {
      std::filesystem::file_time_type mtime;
      std::uint64_t bytes;
      std::filesystem::path path;
    };
    std::vector<Item> items;
    std::uint64_t sum = 0;
    std::error_code ec;
    const auto stale_before = std::filesystem::file_time_type::clock::now() - kStaleTempAge;
    for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
      const auto& p = it->path();
      const bool temp = is_entry_temp_name(p.filename());
      if ((!temp && !is_entry_name(p.filename())) || !it->is_regular_file(ec)) continue;
      const std::uint64_t b = it->file_size(ec);
      if (ec) {
        ec.clear();
        continue;
      }
      const auto t = it->last_write_time(ec);
      if (ec) {
        ec.clear();
        continue;
      }
      if (temp) {
        // A writer that died mid-store left it: removed once old enough
        // that no live writer can own it; a younger one still counts.
        if (t < stale_before && ::unlink(p.c_str()) == 0) {
          ++r.stale_temps_removed;
          continue;
        }
        sum += b;
        continue;
      }
      items.push_back(Item{t, b, p});
      sum += b;
    }
    std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.mtime < b.mtime; });
    for (const auto& it : items) {
      if (sum <= limits_.max_total_bytes) break;
      if (it.path == r.path) continue;
      if (::unlink(it.path.c_str()) == 0 || errno == ENOENT) {
        sum -= it.bytes;
        ++r.evicted;
      } else {
        r.warnings.push_back("cannot evict " + it.path.string() + ": " + std::strerror(errno));
      }
    }
  }
  return r;
}

}  // namespace safeckpt::enginecache
