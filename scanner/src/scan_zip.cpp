// Zip archives through the zip layer (ZipArchive), as PyTorch reads them (see scan.cpp).
#include <algorithm>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <unordered_map>

#include "catalogue.hpp"
#include "pickle_scan.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/detect.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/safetensors_reader.hpp"
#include "safeckpt/zip.hpp"
#include "scanner.hpp"

namespace safeckpt::scan {

// ---- zip -------------------------------------------------------------------

namespace {

bool is_pickle_name(std::string_view name) {
  return name.ends_with(".pkl") || name.ends_with("_pkl") || name.ends_with(".pickle");
}

}  // namespace

void Scanner::scan_zip(Bytes data, const std::string& member, int depth) {
  const std::string prefix = member.empty() ? std::string() : member + "!";
  auto opened = ZipArchive::open(data, opt_.limits);
  if (!opened) {
    add_error(opened.error(), member, -1, 0,
              "the zip could not be opened the way PyTorch's reader would: nothing inside was examined");
    return;
  }
  const ZipArchive& zip = *opened;
  FileReport& rep = sink_.report();
  // Names held by several entries (miniz compares names ignoring ASCII case;
  // the zip layer emulates which copy it reads): findings name the copy
  // (central entry and offset) and the copy PyTorch reads.
  std::vector<std::string> label(zip.entries().size());
  for (const ZipDuplicate& dup : zip.duplicates()) {
    const std::vector<std::uint32_t>& idx = dup.copies;
    const ZipEntry& first = zip.entries()[idx.front()];
    std::string copies;
    for (std::uint32_t i : idx) {
      const ZipEntry& e = zip.entries()[i];
      const std::string where = "entry #" + std::to_string(i) + " at offset " + std::to_string(e.local_header_offset);
      label[i] = e.name + " [" + where + (static_cast<std::int64_t>(i) == dup.read ? ", the copy PyTorch reads]" : "]");
      copies += (copies.empty() ? "" : ", ") + where + (e.name != first.name ? " ('" + e.name + "')" : "");
    }
    const ZipEntry* r = dup.read >= 0 ? &zip.entries()[static_cast<std::size_t>(dup.read)] : nullptr;
    add(Rule::kArchiveAnomaly, Severity::kHigh, prefix + first.name,
        "duplicate_name: " + std::to_string(idx.size()) + " entries hold this name" +
            (dup.case_only ? " (ignoring case)" : "") + ": " + copies +
            (r != nullptr ? "; PyTorch reads entry #" + std::to_string(dup.read) + " at offset " +
                                std::to_string(r->local_header_offset)
                          : std::string()),
        "PyTorch (miniz: binary search over an unstable, case-insensitive sort) reads one copy, chosen by the "
        "archive's layout; Python's zipfile reads the last. Every copy was scanned; "
        "findings name their copy. The loader refuses the archive",
        first.local_header_offset);
  }
  // torch 2.6/2.7 flat torch.export layout: no root folder (graph.hpp).
  const bool pt2_flat = zip.root().empty() && zip.find_full("serialized_exported_program.json") != nullptr;
  auto member_label = [&](const ZipEntry& e) { return prefix + (label[e.index].empty() ? e.name : label[e.index]); };
  for (const ZipAnomaly& a : zip.anomalies()) {
    if (a.kind == ZipAnomalyKind::kDuplicateName) continue;             // reported above, with the copy PyTorch reads
    if (a.kind == ZipAnomalyKind::kNoRootFolder && pt2_flat) continue;  // the 2.6/2.7 layout has none (scan_pt2)
    if (a.kind == ZipAnomalyKind::kNoRootFolder) {
      add(Rule::kMalformed, Severity::kHigh, member, "malformed: " + a.detail,
          "PyTorch's reader refuses a zip without a root folder; numpy.load (npz) and other readers "
          "do not, so its members were examined as the zip layer reads them",
          a.offset);
      continue;
    }
    Severity s = Severity::kHigh;
    if (a.kind == ZipAnomalyKind::kTrailingData || a.kind == ZipAnomalyKind::kGapData) s = Severity::kMedium;
    add(Rule::kArchiveAnomaly, s, prefix + a.entry, std::string(zip_anomaly_name(a.kind)) + ": " + a.detail,
        "readers disagree on such archives (PyTorch's miniz vs Python's zipfile vs scanners); the loader refuses "
        "it, and the scanner examined the bytes PyTorch would read",
        a.offset);
  }
  const FileFormat kind = classify_zip(zip);
  if (kind == FileFormat::kTorchScriptZip) {
    add(Rule::kExecutableCode, Severity::kHigh, prefix + zip.root() + "/constants.pkl",
        "TorchScript archive (has constants.pkl): its code/ is compiled and run by torch.jit.load",
        "torch <= 2.5 sent such files to torch.jit.load even with weights_only=True (CVE-2025-32434); load it only "
        "with torch.jit.load from a trusted source");
  }
  std::set<std::string> pt2_raw;  // PT2: records of raw tensor bytes (use_pickle: false)
  if (kind == FileFormat::kPt2Archive || pt2_flat) scan_pt2(data, zip, member, pt2_raw);
  // Pass 1: pickle members (by name), collecting persistent ids.
  std::vector<PidInfo> pids;
  bool pickles_complete = true;  // every pickle member parsed to its end: the persistent ids are all known
  std::vector<bool> done(zip.entries().size(), false);
  for (const ZipEntry& e : zip.entries()) {
    if (!is_pickle_name(e.name)) continue;
    done[e.index] = true;
    ++rep.members;
    // Pickle members are inflated under max_pickle_record_bytes (a deflate
    // bomb is refused from its declared size, before inflating).
    auto rb = zip.read(e, false, opt_.limits.max_pickle_record_bytes, "max_pickle_record_bytes");
    if (!rb) {
      add_error(rb.error(), member_label(e), -1, 0, "the member could not be read: it was not examined");
      pickles_complete = false;
      continue;
    }
    if (auto crc = zip.verify_crc(e, rb->bytes); !crc) {
      add(Rule::kArchiveAnomaly, Severity::kHigh, member_label(e), "crc_mismatch: " + crc.error().message(),
          "PyTorch does not check CRCs and reads these bytes; Python's zipfile (and scanners built on it) "
          "refuses them (CVE-2025-10156). Scanned as PyTorch reads them",
          e.local_header_offset);
    }
    std::vector<PidInfo> p;
    if (!scan_streams(rb->bytes, member_label(e), depth, 0, 0, true, &p)) pickles_complete = false;
    pids.insert(pids.end(), p.begin(), p.end());
  }
  // Storage records named by persistent ids are tensor bytes. For each, the
  // bytes the largest persistent id declares (numel x element size; 0 when
  // its storage class is unknown).
  const std::string data_dir = zip.root() + "/data/";
  std::map<std::string, std::uint64_t> storage_need;
  for (const PidInfo& p : pids) {
    if (p.key.empty()) continue;
    std::uint64_t& need = storage_need[data_dir + p.key];
    const auto elem = p.well_formed && p.numel >= 0 ? storage_element_size(p.storage_type) : std::nullopt;
    if (!elem) continue;
    const auto numel = static_cast<std::uint64_t>(p.numel);
    const std::uint64_t bytes = numel > UINT64_MAX / *elem ? UINT64_MAX : numel * *elem;
    need = std::max(need, bytes);
  }
  // The torch layout (torch/serialization.py _save/_load): `<root>/data/<key>`
  // records are raw storages that torch.load reads through persistent_load and
  // never unpickles. In a torch zip they are never sniffed as pickles: named
  // by a persistent id they are tensor bytes; otherwise (data.pkl not fully
  // parsed, or a record no id names) they are listed in one info note.
  auto is_tensor_record = [&](const ZipEntry& e) {
    if (kind != FileFormat::kTorchZip || !e.name.starts_with(data_dir)) return false;
    const std::string_view key = std::string_view(e.name).substr(data_dir.size());
    return !key.empty() && key.find('/') == std::string_view::npos;
  };
  std::uint64_t unnamed_records = 0;
  // Pass 2: every other member, by content.
  for (const ZipEntry& e : zip.entries()) {
    if (done[e.index]) continue;
    ++rep.members;
    const auto need = storage_need.find(e.name);
    const bool is_storage = need != storage_need.end();
    if (is_storage && e.uncompressed_size < need->second) {
      // CVE-2026-24747: torch < 2.10 built the tensor over the record without
      // checking its size and read past its end.
      add(Rule::kStorageOutOfBounds, Severity::kHigh, member_label(e),
          "storage record has " + std::to_string(e.uncompressed_size) + " bytes but a persistent id declares " +
              std::to_string(need->second) + " (numel x element size)",
          "torch < 2.10 reads past the end of the record (out-of-bounds read, CVE-2026-24747); the loader refuses "
          "it",
          e.local_header_offset);
    }
    if (pt2_raw.count(e.name) != 0) {
      // Raw little-endian tensor bytes the engine re-views from tensor_meta;
      // nothing reads them as a pickle. CRC only with verify_data.
      if (opt_.verify_data) {
        if (auto rb = zip.read(e, true); !rb)
          add(Rule::kArchiveAnomaly, Severity::kMedium, member_label(e), rb.error().message(),
              "tensor bytes do not match the archive's CRC", e.local_header_offset);
      }
      continue;
    }
    if (!is_storage && is_tensor_record(e)) {
      ++unnamed_records;
      continue;
    }
    if (is_storage && !opt_.verify_data) continue;
    if (is_storage) {
      auto rb = zip.read(e, true);
      if (!rb) {
        add(Rule::kArchiveAnomaly, Severity::kMedium, member_label(e), rb.error().message(),
            "tensor bytes do not match the archive's CRC (PyTorch does not check it)", e.local_header_offset);
      }
      continue;
    }
    // Sniff the first bytes without inflating the whole member (an unknown
    // method is reported as a kUnsupportedMethod anomaly).
    auto head = zip.read_prefix(e, 512);
    if (!head) continue;
    const Bytes head_bytes = head->bytes;
    if (head_bytes.empty()) continue;
    FileFormat f = sniff_format(head_bytes);
    // A zip member prefix cannot prove much about safetensors sizes; sniff
    // those by the full bytes below.
    bool maybe_pickle_without_proto = f == FileFormat::kUnknown && !opcode_name(head_bytes[0]).empty();
    if (f == FileFormat::kUnknown && !maybe_pickle_without_proto) continue;
    if (depth >= opt_.max_nesting && f == FileFormat::kTorchZip) {
      add(Rule::kLimit, Severity::kHigh, member_label(e), "nested zip deeper than max_nesting: not examined",
          kIncompleteWhy);
      continue;
    }
    auto rb = zip.read(e, true, opt_.limits.max_pickle_record_bytes, "max_pickle_record_bytes");
    if (!rb) {
      add_error(rb.error(), member_label(e), -1, 0, "the member could not be read: it was not examined");
      continue;
    }
    Bytes b = rb->bytes;
    FileFormat full = sniff_format(b);
    if (full == FileFormat::kUnknown || full == FileFormat::kBarePickle || full == FileFormat::kLegacyPickle) {
      // Members nobody is meant to unpickle: report a pickle only if it
      // imports or calls something (or parses); a byte string that fails
      // at its first opcode is data.
      FileReport nested;
      ScanOptions o2 = opt_;
      o2.run_loader = false;
      Scanner inner(o2, allow_, nested);
      inner.dispatch(b, member_label(e), depth + (full == FileFormat::kTorchZip ? 1 : 0), false);
      bool any = false;
      for (const Finding& fi : nested.findings)
        if (klass_of(fi) == Klass::kUnsafe) any = true;
      if (!any && nested.events.empty()) continue;
      for (Finding& fi : nested.findings) sink_.add(std::move(fi));
      for (Event& ev : nested.events) sink_.event(std::move(ev));
      rep.pickle_streams += nested.pickle_streams;
      continue;
    }
    dispatch(b, member_label(e), full == FileFormat::kTorchZip ? depth + 1 : depth, false);
  }
  if (unnamed_records > 0) {
    add(Rule::kUnsupported, Severity::kInfo, prefix + data_dir,
        "not examined: tensor data: " + std::to_string(unnamed_records) + " record" +
            (unnamed_records == 1 ? "" : "s") + " under " + data_dir +
            (pickles_complete ? " named by no persistent id"
                              : " (data.pkl could not be fully parsed, so which records are storages is unknown)"),
        "torch.load reads <root>/data/<key> records only as raw storage bytes (persistent_load) and never "
        "unpickles them");
  }
}

}  // namespace safeckpt::scan
