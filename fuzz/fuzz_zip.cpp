// fuzz/fuzz_zip.cpp — the zip container layer: ZipArchive::open, then read
// every entry; plus format detection on the same bytes.
//
// Option byte: bit 0 verify_crc on read; bit 1 tiny inflate cap (4 KiB) to
// exercise the deflate-bomb guard; bit 2 tiny entry cap (8 entries) and name
// cap (64 bytes).
//
// Invariants beyond "no crash": documented error codes only; every entry's
// record lies inside the file and after its local header; find()/find_full()
// return the first central entry of a name; a successful read has exactly
// the declared uncompressed size, borrows the file for stored records, and
// matches the stored CRC-32 when asked to verify; require_no_anomalies()
// fails exactly when there are anomalies; detect_format agrees with open().
#include <algorithm>
#include <cstdint>
#include <string>

#include "fuzz_util.hpp"
#include "safeckpt/detect.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/zip.hpp"

namespace sc = safeckpt;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const sc::fuzz::Input in = sc::fuzz::split_input(data, size);
  const sc::Bytes file = in.data;
  sc::Limits lim = sc::fuzz_limits();
  const bool verify = in.bit(0);
  lim.max_inflated_bytes = in.bit(1) ? 4096 : (1u << 20);
  if (in.bit(2)) {
    lim.max_zip_entries = 8;
    lim.max_zip_name_bytes = 64;
  }

  const sc::FileFormat sniffed = sc::sniff_format(file);
  auto zr = sc::ZipArchive::open(file, lim);
  const sc::FileFormat detected = sc::detect_format(file, lim);
  if (!zr) {
    sc::fuzz::check_error(zr.error(),
                          {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported},
                          "ZipArchive::open");
    if (sniffed == sc::FileFormat::kTorchZip) {
      FUZZ_REQUIRE(
          detected == sc::FileFormat::kUnknown,
          "detect_format says " + std::string(sc::file_format_name(detected)) + " for a zip that does not open");
    }
    return 0;
  }
  const sc::ZipArchive& zip = *zr;
  if (sniffed == sc::FileFormat::kTorchZip) {
    // A zip without a root folder opens (kNoRootFolder is an anomaly) but
    // PyTorch cannot read it: detect_format says unknown for it.
    const sc::FileFormat want = zip.root().empty() ? sc::FileFormat::kUnknown : sc::classify_zip(zip);
    FUZZ_REQUIRE(detected == want, "detect_format disagrees with classify_zip");
  }

  const auto& entries = zip.entries();
  FUZZ_REQUIRE(entries.size() <= lim.max_zip_entries, "more entries than max_zip_entries");
  bool any_outside_root = false, no_root = false;
  for (const auto& a : zip.anomalies()) {
    FUZZ_REQUIRE(static_cast<unsigned>(a.kind) <= static_cast<unsigned>(sc::ZipAnomalyKind::kNoRootFolder),
                 "anomaly with an invalid kind");
    FUZZ_REQUIRE(!sc::zip_anomaly_name(a.kind).empty(), "anomaly kind without a name");
    any_outside_root = any_outside_root || a.kind == sc::ZipAnomalyKind::kOutsideRoot;
    no_root = no_root || a.kind == sc::ZipAnomalyKind::kNoRootFolder;
  }
  if (!entries.empty())
    FUZZ_REQUIRE(zip.root().empty() == no_root, "root folder empty exactly when kNoRootFolder is reported");
  for (const auto& d : zip.duplicates()) {
    FUZZ_REQUIRE(d.copies.size() >= 2, "duplicate group of fewer than 2 entries");
    FUZZ_REQUIRE(d.read == -1 || std::find(d.copies.begin(), d.copies.end(), d.read) != d.copies.end(),
                 "the copy PyTorch reads is not one of the group");
  }
  auto clean = zip.require_no_anomalies();
  FUZZ_REQUIRE(clean.has_value() == zip.anomalies().empty(), "require_no_anomalies disagrees with anomalies()");
  if (!clean) sc::fuzz::check_error(clean.error(), {sc::ErrorCode::kMalformed}, "require_no_anomalies");

  for (std::size_t i = 0; i < entries.size(); ++i) {
    const sc::ZipEntry& e = entries[i];
    const std::string tag = "entry " + std::to_string(i);
    FUZZ_REQUIRE(e.index == i, tag + ": index field " + std::to_string(e.index));
    FUZZ_REQUIRE(e.name.size() <= lim.max_zip_name_bytes, tag + ": name longer than max_zip_name_bytes");
    FUZZ_REQUIRE(e.data_offset <= file.size() && e.compressed_size <= file.size() - e.data_offset,
                 tag + ": record [" + std::to_string(e.data_offset) + ", +" + std::to_string(e.compressed_size) +
                     ") outside the file of " + std::to_string(file.size()));
    FUZZ_REQUIRE(e.local_header_offset < e.data_offset && e.data_offset - e.local_header_offset >= 30,
                 tag + ": data does not follow its local header");

    const sc::ZipEntry* first = zip.find_full(e.name);
    FUZZ_REQUIRE(first != nullptr, tag + ": find_full cannot find the entry's own name");
    FUZZ_REQUIRE(first->name == e.name && first->index <= e.index, tag + ": find_full did not return the first entry");
    const std::string prefix = zip.root() + "/";
    if (no_root) {
      // no root folder: every entry is outside it, and no kOutsideRoot is reported
    } else if (e.name.compare(0, prefix.size(), prefix) == 0) {
      FUZZ_REQUIRE(zip.find(std::string_view(e.name).substr(prefix.size())) == first,
                   tag + ": find(name under root) != find_full(full name)");
    } else {
      FUZZ_REQUIRE(any_outside_root, tag + ": entry outside the root folder without a kOutsideRoot anomaly");
    }

    auto rr = zip.read(e, verify);
    if (!rr) {
      sc::fuzz::check_error(rr.error(),
                            {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported},
                            "ZipArchive::read " + tag);
      continue;
    }
    const sc::RecordBytes& r = *rr;
    // The sniffing prefix is the record's first bytes.
    if (auto pr = zip.read_prefix(e, 64)) {
      FUZZ_REQUIRE(pr->bytes.size() <= 64, tag + ": read_prefix returned more than asked");
      FUZZ_REQUIRE(
          pr->bytes.size() <= r.bytes.size() && std::equal(pr->bytes.begin(), pr->bytes.end(), r.bytes.begin()),
          tag + ": read_prefix is not a prefix of read");
    }
    FUZZ_REQUIRE(e.method == 0 || e.method == 8, tag + ": read succeeded for method " + std::to_string(e.method));
    FUZZ_REQUIRE(r.bytes.size() == e.uncompressed_size, tag + ": read gave " + std::to_string(r.bytes.size()) +
                                                            " bytes, entry declares " +
                                                            std::to_string(e.uncompressed_size));
    FUZZ_REQUIRE(r.bytes.size() <= lim.max_inflated_bytes || e.method == 0, tag + ": inflated past max_inflated_bytes");
    if (e.method == 0) {
      FUZZ_REQUIRE(r.bytes.data() == file.data() + e.data_offset && r.bytes.size() == e.compressed_size,
                   tag + ": stored record is not the file's bytes at data_offset");
    } else {
      FUZZ_REQUIRE(r.owned != nullptr && r.bytes.data() == r.owned->data() && r.bytes.size() <= r.owned->size(),
                   tag + ": inflated record does not point into its owned buffer");
    }
    // Touch every byte (ASan) and check the CRC contract.
    const std::uint32_t crc = sc::crc32_update(0, r.bytes);
    if (verify && e.crc32 != 0) FUZZ_REQUIRE(crc == e.crc32, tag + ": verify_crc read returned bytes with a wrong CRC");
  }
  return 0;
}
