// safeckpt/zip.hpp — the PyTorch zip container, read as PyTorch's reader sees it.
//
// Accepted grammar (anything else is refused or, in the scanner, reported):
//  1. The file starts with a local header `PK\3\4` (torch's _is_zipfile rule).
//  2. End of central directory found by scanning back from the end (at most
//     64 KiB comment; the last `PK\5\6`, as miniz and CPython take);
//     zip64 EOCD record + locator honoured when present or when classic
//     fields are 0xFFFF/0xFFFFFFFF. The zip64 record must sit right before
//     its locator with no extensible data (CPython reads it there, miniz at
//     the locator's offset), and each classic field must be its sentinel or
//     equal the zip64 value. Multi-disk archives refused (kUnsupported). The
//     central directory lies wholly before the (zip64) EOCD and its entries
//     fill it exactly.
//  3. Central directory entries: method 0 (stored) or 8 (deflate, via zlib);
//     general-purpose flag bits (central or local) other than 3 (data
//     descriptor), 11 (UTF-8) and 1-2 (compression level hint; Info-ZIP
//     `zip -9` sets 0x0002 on every entry) are anomalies (0x01 encryption,
//     0x20 patched, 0x40 strong encryption — CVE-2025-1945); zip64 extra
//     (0x0001) consulted for 64-bit sizes/offset, only for 0xFFFFFFFF fields,
//     in the order usize, csize, offset; a second zip64 block or a badly
//     framed extra field is malformed (miniz and CPython read them apart).
//  4. Local header at the central offset: signature checked, its name must
//     equal the central name (CVE-2025-1944), its name/extra lengths give the
//     data offset; local sizes/CRC may be zero (PyTorch writes data descriptors).
//  5. Every record's [data_offset, data_offset + compressed_size) lies inside
//     the file, before the central directory, and does not overlap another
//     record's local header or data (anomaly kOverlap). Bytes before the
//     central directory owned by no local header, record or matching data
//     descriptor are anomaly kGapData; bytes after the EOCD comment are
//     kTrailingData.
//  6. Root folder = text before the first '/' of the FIRST central entry
//     (caffe2/serialize/inline_container.cc); every entry must be under it
//     (else anomaly kOutsideRoot). No '/' in the first entry is anomaly
//     kNoRootFolder (PyTorch refuses "file in archive is not in a
//     subdirectory"; numpy's .npz and other readers do not, so the scanner
//     still reads the members); root() is then "" and kOutsideRoot is not
//     reported. An empty root ("/data.pkl") is malformed (PyTorch's writer
//     never produces one).
//  7. Duplicate names: PyTorch's miniz (mz_zip_reader_locate_file, flags 0)
//     compares names ignoring ASCII case and binary-searches the central
//     directory heap-sorted by lower-cased name
//     (mz_zip_reader_sort_central_dir_offsets_by_filename,
//     mz_zip_locate_file_binary_search). The heap sort is not stable, so of
//     several entries whose names are equal ignoring case, the one PyTorch
//     reads depends on the archive's layout, not always the first; checked
//     against torch 1.13 (tests/data/zip_duplicates/observed.txt). Each
//     such group is one ZipDuplicate (duplicates(), with the copy miniz
//     returns) and an anomaly kDuplicateName for every copy but the first
//     central one.
//  8. CRC-32 (zlib) is checked on read whenever the stored CRC is non-zero
//     (PyTorch itself never checks: miniz built with
//     MINIZ_DISABLE_ZIP_READER_CRC32_CHECKS; set_crc32_options(False) writes 0).
//
// Structural damage (no EOCD, truncated central directory, ...) is an error
// from open(). Ambiguities PyTorch tolerates are collected as anomalies so the
// scanner can report them; the loader refuses a file that has any.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/error.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/mapped_file.hpp"

namespace safeckpt {

struct ZipEntry {
  std::string name;                   // full name from the central directory
  std::uint64_t local_header_offset;  // absolute file offset of `PK\3\4`
  std::uint64_t data_offset;          // absolute offset of the record bytes
  std::uint64_t compressed_size;      // bytes in the file
  std::uint64_t uncompressed_size;    // bytes after inflate
  std::uint32_t crc32;                // from the central directory; 0 = none
  std::uint16_t method;               // 0 stored, 8 deflate
  std::uint16_t flags;                // general purpose bit flags
  std::uint32_t index;                // position in the central directory
};

enum class ZipAnomalyKind : std::uint8_t {
  kDuplicateName,      // second+ entry of a name (ASCII case ignored); see ZipDuplicate
  kLocalNameMismatch,  // local header name != central name
  kOutsideRoot,        // entry not under the root folder
  kFlagBits,           // encryption / patched / unknown flag bits
  kOverlap,            // records overlap each other
  kTrailingData,       // bytes after the end of central directory / comment
  kUnsupportedMethod,  // compression other than stored/deflate
  kCrcMismatch,        // found by read() with verify on (scanner --verify-data)
  kGapData,            // bytes between records not belonging to any record
  kNoRootFolder,       // first entry has no '/': PyTorch refuses, other readers do not
};
std::string_view zip_anomaly_name(ZipAnomalyKind k) noexcept;

struct ZipAnomaly {
  ZipAnomalyKind kind;
  std::string entry;     // entry name concerned
  std::uint64_t offset;  // file offset concerned
  std::string detail;    // human text: what, and which copy PyTorch reads
};

// Entries whose names are equal ignoring ASCII case (grammar item 7).
struct ZipDuplicate {
  std::vector<std::uint32_t> copies;  // central indices, in central order (>= 2)
  // The central index PyTorch's miniz returns for this name (emulated
  // mz_zip_reader_locate_file), or -1 if the emulation finds none.
  std::int64_t read = -1;
  bool case_only = false;  // some copies' names differ, but only in ASCII case
};

// Bytes of one record: a borrowed span of the file for stored records, an
// owned buffer for inflated ones. `bytes` is valid while the RecordBytes and
// the file it was read from are alive.
struct RecordBytes {
  Bytes bytes;
  std::shared_ptr<std::vector<std::uint8_t>> owned;  // null when borrowed
};

class ZipArchive {
 public:
  // Parses the central directory of `file` (which must outlive the archive).
  // Errors: kMalformed (no/bad EOCD, truncated CD, bad local header, record
  // past the end of the file, an empty root folder,
  // inconsistent zip64 records or extra fields), kLimitExceeded (more than
  // limits.max_zip_entries, name longer than max_zip_name_bytes, out of
  // memory), kUnsupported (multi-disk, zip64 extensible data). Anomalies do
  // not fail open().
  static Result<ZipArchive> open(Bytes file, const Limits& limits);

  const std::string& root() const noexcept { return root_; }
  const std::vector<ZipEntry>& entries() const noexcept { return entries_; }
  const std::vector<ZipAnomaly>& anomalies() const noexcept { return anomalies_; }
  // Groups of entries PyTorch cannot tell apart (grammar item 7), in order of
  // their lower-cased name.
  const std::vector<ZipDuplicate>& duplicates() const noexcept { return duplicates_; }

  // The first central entry named exactly `root/name`, or nullptr. (With
  // duplicates PyTorch may read another copy: see duplicates(); the loader
  // refuses such archives.)
  const ZipEntry* find(std::string_view name_under_root) const;
  // Same, full name.
  const ZipEntry* find_full(std::string_view full_name) const;

  // Record bytes (inflated if deflated, capped by limits.max_inflated_bytes).
  // verify_crc: compare CRC-32 when the stored CRC is non-zero. Flag bits
  // are not consulted (open() reports them): the bytes are those PyTorch
  // would read, so the scanner can scan them. A CRC mismatch is returned as
  // an error, not added to anomalies() (read() is const); the scanner reads
  // without verify_crc and reports verify_crc()'s error as crc_mismatch.
  // Errors: kMalformed (inflate error, size mismatch, CRC mismatch — message
  // names the record and both CRCs), kLimitExceeded, kUnsupported (method).
  Result<RecordBytes> read(const ZipEntry& e, bool verify_crc) const;
  // Same, with a tighter cap for a deflated record: min(max_bytes,
  // limits.max_inflated_bytes), named `cap_name` (a Limits field, e.g.
  // "max_pickle_record_bytes") in the kLimitExceeded message. The declared
  // uncompressed size is checked before anything is allocated or inflated,
  // and inflating stops as soon as the output would pass the declared size
  // (kMalformed), so the work is bounded by the cap, not by what the stream
  // could expand to. Stored records are borrowed and not capped here.
  Result<RecordBytes> read(const ZipEntry& e, bool verify_crc, std::uint64_t max_bytes,
                           std::string_view cap_name) const;

  // At most the first `n` bytes of a record, for sniffing what it holds (never
  // trusted beyond choosing whether to read it with read()): stored records
  // are borrowed; deflated ones are inflated from at most their first 1 MiB
  // of compressed bytes, stopping at `n` bytes or at the first deflate error
  // (the bytes inflated before it are returned; possibly none). CRC and
  // declared sizes are not checked.
  // Errors: kInvalidArgument (entry not of this archive), kUnsupported
  // (method other than stored/deflate), kLimitExceeded (out of memory).
  Result<RecordBytes> read_prefix(const ZipEntry& e, std::size_t n) const;

  // Whether `bytes` (the record of `e`, as read() returns it unverified)
  // match the CRC-32 in the central directory; a stored CRC of 0 matches
  // anything. Errors: kMalformed "CRC-32 mismatch in record ..." (the error
  // read() returns with verify_crc), located at the record's data.
  Status verify_crc(const ZipEntry& e, Bytes bytes) const;

  // Reports every anomaly as one kMalformed error (first anomaly in the
  // message, count of the others), or ok if there is none.
  Status require_no_anomalies() const;

 private:
  // open() without its std::bad_alloc guard (open() turns one into
  // kLimitExceeded, so no exception leaves the library).
  static Result<ZipArchive> open_unguarded(Bytes file, const Limits& limits);

  Bytes file_;
  Limits limits_;
  std::string root_;
  std::vector<ZipEntry> entries_;
  std::vector<ZipAnomaly> anomalies_;
  std::vector<ZipDuplicate> duplicates_;
  std::vector<std::uint32_t> sorted_;  // entry indices sorted by name (first occurrence)
};

// CRC-32 (zlib) of `data`, continuing from `crc`.
std::uint32_t crc32_update(std::uint32_t crc, Bytes data) noexcept;

}  // namespace safeckpt
