// safeckpt/compile_cache.hpp — the engine's persistent, authenticated
// compile cache (issue 14): compiled artefacts (NVRTC cubins, serialized
// plans, chosen cuBLASLt algorithms) kept on disk so that a second process
// starts without compiling. Host only; the engine fills and reads it.
//
// The idea is PyTorch's persistent caches (torch/_inductor/codecache.py:
// FxGraphCache / the 2.7 "mega-cache"), done so that a cache directory is
// never a way to make us run or trust bytes someone else wrote:
//  - entries are written by us only, with Boost.Serialization binary
//    archives, and authenticated with HMAC-SHA256 under a per-user secret
//    key; a payload is deserialized only after its MAC verified (never
//    before), so a foreign or tampered file reaches no parser but ours of
//    the fixed header;
//  - a bad entry (MAC mismatch, truncation, other format version, other key
//    fields, written under another key) is ignored — a miss with a warning
//    the caller may print — and the next store overwrites it;
//  - writes are atomic (temporary file in the same directory, fsync,
//    rename, fsync of the directory): concurrent readers and writers of the
//    same key see a whole old entry, a whole new one, or none.
//
// Entry file (`<dir>/<hex SHA-256 of CacheKey::canonical()>.entry`):
//   offset 0   8 bytes  magic "SCKCACHE"
//   offset 8   u32 LE   format version (kCacheFormatVersion)
//   offset 12  u32 LE   0 (reserved)
//   offset 16  32 bytes HMAC-SHA256(key, bytes 0..15 || bytes 48..end)
//   offset 48  u64 LE   payload length (= file size - 56)
//   offset 56  payload  Boost binary_oarchive of the key fields and the blobs
// The key fields are inside the MAC'd payload and compared with the
// requested key on read (a renamed entry is not a hit).
//
// Location (CompileCache::default_dir): $SAFECKPT_CACHE_DIR if set and
// non-empty, else $XDG_CACHE_HOME/safeckpt (XDG Base Directory spec: an
// absolute XDG_CACHE_HOME only), else $HOME/.cache/safeckpt. The directory
// is created with mode 0700; an existing one must be a real directory (not a
// symlink) owned by the user and not writable by group or others. The key is
// `<dir>/hmac.key` (or CacheOptions::key_file): 32 random bytes, created on
// first use with O_CREAT|O_EXCL and mode 0600 and published with link() (so
// a concurrent creator never reads a half-written key); an existing key file
// must be a regular file (not a symlink) owned by the user, mode exactly
// 0600, exactly 32 bytes.
//
// Thread safety: a CompileCache is immutable after open(); load/store may be
// called from several threads and processes at once.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "safeckpt/error.hpp"

namespace safeckpt::enginecache {

// Bumped when the entry layout or the payload's archive layout changes:
// entries of another version are ignored (and overwritten).
inline constexpr std::uint32_t kCacheFormatVersion = 1;

// What a compiled artefact depends on. Every field is part of the key; two
// keys are equal when canonical() is equal.
struct CacheKey {
  std::string program_hash;         // SHA-256 hex of the program (graph::Program::json_sha256, or the plan fingerprint)
  std::string device_name;          // cudaDeviceProp::name, e.g. "NVIDIA H200"
  std::uint32_t sm = 0;             // compute capability, major * 10 + minor (90 for sm_90)
  std::int32_t driver_version = 0;  // cudaDriverGetVersion (e.g. 13000)
  std::int32_t runtime_version = 0;  // cudaRuntimeGetVersion
  std::int32_t nvrtc_version = 0;    // nvrtcVersion: major * 1000 + minor * 10
  std::string engine_version;        // the engine's version and code-generator revision
  std::string shapes;                // concrete shapes: graph::SymbolBinding::to_string()
  std::string options;               // plan/stance-relevant options: graph::PlanOptions::to_string() + engine options
  // One line per field, "name=<byte length>:<value>\n", in declaration order:
  // unambiguous whatever the values contain.
  std::string canonical() const;
  // Hex SHA-256 of canonical(): the entry's file stem.
  std::string digest() const;
  friend bool operator==(const CacheKey&, const CacheKey&) = default;
};

// One cache entry: its key and named blobs ("plan", "cubin/<kernel>",
// "cublaslt/<gemm>", ... — names are the engine's; the cache only stores).
struct CacheEntry {
  CacheKey key;
  std::map<std::string, std::vector<std::uint8_t>> blobs;
};

// Caps on what the cache writes and reads. Inclusive maxima.
struct CacheLimits {
  std::uint64_t max_entry_bytes = 1ull << 30;    // one entry file (a cubin set of a large model is tens of MB)
  std::uint64_t max_blobs = 1u << 16;            // blobs in one entry
  std::uint64_t max_name_bytes = 1024;           // one blob name
  std::uint64_t max_key_field_bytes = 1u << 16;  // one string field of a CacheKey
  // Total bytes of *.entry files in the directory after a store (and of
  // store temporaries under an hour old, which are not deleted); 0 = no cap.
  // Over it, the least recently used entries (oldest mtime; a hit refreshes
  // the mtime) are deleted until the total fits (never the entry just stored).
  std::uint64_t max_total_bytes = 0;
};

struct CacheOptions {
  std::filesystem::path dir;       // empty: default_dir()
  std::filesystem::path key_file;  // empty: dir / "hmac.key"
  CacheLimits limits;
};

// The result of a lookup.
struct CacheLookup {
  enum class Status : std::uint8_t {
    kHit,      // `entry` holds the verified entry
    kMiss,     // no entry for the key
    kIgnored,  // a file exists but was not accepted; `warning` says why (store() replaces it)
  };
  Status status = Status::kMiss;
  std::optional<CacheEntry> entry;
  std::string warning;  // kIgnored: "<path>: MAC mismatch (...)", "truncated", "format version 2, expected 1", ...
};

// What store() did besides writing.
struct StoreResult {
  std::filesystem::path path;  // the entry file written
  std::uint64_t bytes = 0;     // its size
  std::uint32_t evicted = 0;   // entries deleted by the max_total_bytes cap
  // Temporaries of stores that died mid-write (a killed process), removed
  // by the same walk once an hour old; younger ones count against the cap.
  // open() removes the old ones too (with or without a cap).
  std::uint32_t stale_temps_removed = 0;
  std::vector<std::string> warnings;  // eviction problems (a file that could not be removed), never fatal
};

class CompileCache {
 public:
  // Resolves and checks the directory (created 0700 with its missing
  // parents if absent) and the key (created on first use), and removes the
  // temporaries of stores that died mid-write (over an hour old). A FIFO
  // or device at the key's path is refused without being waited on.
  // Errors: kInvalidArgument (no location: none of the variables is set;
  // the directory is a symlink, not a directory, not owned by the user, or
  // writable by group/others; the key file is a symlink, not a regular
  // file, not owned by the user, not mode 0600, or not 32 bytes), kIo
  // (mkdir/open/read/write/fsync/link failures, with errno text).
  static Result<CompileCache> open(const CacheOptions& options = {});

  // $SAFECKPT_CACHE_DIR, else $XDG_CACHE_HOME/safeckpt, else
  // $HOME/.cache/safeckpt (nothing is created). Errors: kInvalidArgument when
  // none applies (no HOME).
  static Result<std::filesystem::path> default_dir();

  // Looks `key` up. A file that is missing is kMiss; a file that cannot be
  // accepted (see CacheLookup) is kIgnored with a warning — never an error.
  // Errors (the cache itself is unusable): kIo for a read failure other than
  // "no such file".
  Result<CacheLookup> load(const CacheKey& key) const;

  // Writes `entry` atomically under its key, replacing any file there.
  // Errors: kLimitExceeded (a CacheLimits cap: entry bytes, blob count, name
  // or key field length; nothing is written), kIo (write/fsync/rename).
  Result<StoreResult> store(const CacheEntry& entry) const;

  // The entry file of `key` (whether or not it exists).
  std::filesystem::path entry_path(const CacheKey& key) const;
  const std::filesystem::path& dir() const noexcept { return dir_; }
  const CacheLimits& limits() const noexcept { return limits_; }

 private:
  std::filesystem::path dir_;
  std::vector<std::uint8_t> key_;  // the 32-byte HMAC key
  CacheLimits limits_;
};

}  // namespace safeckpt::enginecache
