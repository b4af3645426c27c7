// torch.distributed.checkpoint directories (safeckpt/dcp.hpp) as one report
// (scan.hpp "torch.distributed.checkpoint directories"). What decides is the
// DCP reader itself: DcpCheckpoint::open for the metadata and the layout,
// load_chunk / load_bytes_item for every payload, so that "clean" means
// exactly "`safeckpt convert` and load_dcp accept it". The findings come
// from the ordinary scan of every pickle involved: `.metadata` (PyTorch
// unpickles it with weights_only=False: an import there runs on dcp.load)
// and each payload, a torch.save zip.
#include <optional>
#include <string>
#include <vector>

#include "safeckpt/dcp.hpp"
#include "scanner.hpp"

namespace safeckpt::scan {
namespace {

// The policy the metadata's imports are listed against: the scan's own
// allowlist plus the classes the DCP reader builds. The reader, not this
// list, decides: a default-policy global it does not accept is still its
// refusal (an SCK180 finding).
Allowlist metadata_allowlist(const Allowlist& base) {
  Allowlist a = base;
  for (std::string_view g : dcp_metadata_globals()) (void)a.add(g, {}, "DCP metadata reader (safeckpt/dcp.hpp)");
  return a;
}

std::string payload_member(const DcpCheckpoint& c, std::uint32_t file, std::uint64_t offset) {
  return c.files()[file].name + "@" + std::to_string(offset);
}

// Findings that mean "something here imports, calls or carries code": what
// the whole-file view of a data file adds (its archive anomalies are what a
// concatenation of payloads looks like to a zip reader, not findings).
bool is_code_finding(const Finding& f) {
  switch (f.rule) {
    case Rule::kImportDangerous:
    case Rule::kImportUnlisted:
    case Rule::kImportDynamic:
    case Rule::kImportDotted:
    case Rule::kImportExtension:
    case Rule::kCall:
    case Rule::kRefusedOpcode:
    case Rule::kRefusedOperation:
    case Rule::kEmbeddedPayload:
    case Rule::kExecutableCode:
    case Rule::kNumpyObject: return f.severity != Severity::kInfo;
    default: return false;
  }
}

// torch.load(<data file>) does not read the file as its items: a zip reader
// takes the LAST end-of-central-directory record and its offsets as absolute
// (miniz, as ZipArchive), a legacy reader the streams from byte 0. A file of
// several items can so read as an archive no item is (review 2026-12-06: an
// EOCD in the last chunk's raw tensor bytes pointed at an os.system
// data.pkl inside them). Each data file not made of one item is scanned
// whole as well, and what that view imports or calls is reported.
void scan_whole_files(const DcpCheckpoint& c, const ScanOptions& options, FileReport& rep) {
  std::vector<std::uint32_t> items(c.files().size(), 0);
  for (const DcpTensor& t : c.tensors())
    for (const DcpChunk& ch : t.chunks) items[ch.file] += ch.length > 0 ? 1 : 0;
  for (const DcpBytesItem& b : c.bytes_items()) items[b.file] += b.length > 0 ? 1 : 0;
  ScanOptions whole = options;
  whole.run_loader = false;
  whole.keep_events = false;
  for (std::uint32_t f = 0; f < c.files().size(); ++f) {
    if (items[f] <= 1) continue;  // one item is the whole file (the items cover every byte)
    const std::string name = c.files()[f].name + " (read whole)";
    FileReport sub = scan_bytes(c.data_file(f)->bytes(), name, whole);
    for (Finding& x : sub.findings) {
      if (!is_code_finding(x)) continue;
      x.member = name + (x.member.empty() ? std::string() : "!" + x.member);
      x.why = "torch.load of this data file reads it whole, not as its items: " + x.why;
      rep.findings.push_back(std::move(x));
    }
    rep.pickle_streams += sub.pickle_streams;
  }
}

}  // namespace

FileReport scan_dcp_dir(const std::filesystem::path& dir, const ScanOptions& options,
                        std::vector<std::filesystem::path>* covered) {
  FileReport rep;
  rep.path = dir.string();
  rep.format = "dcp_directory";
  const Allowlist& allow = options.allowlist != nullptr ? *options.allowlist : Allowlist::default_policy();
  DcpOptions dopt;
  dopt.limits = options.limits;
  dopt.verify_storage_crc = options.verify_data;
  dopt.allowlist = &allow;
  std::optional<MappedFile> metadata;
  auto ckpt = DcpCheckpoint::open(dir, dopt, metadata);
  if (!metadata && !ckpt && ckpt.error().code() == ErrorCode::kIo)
    return unscanned_report(rep.path, ckpt.error().message());

  // The report speaks for `.metadata` when it scanned its bytes, and for the
  // data files once the reader accepted the metadata (their every byte is
  // then an item it examines: DcpCheckpoint::open). A refused directory
  // covers no data file: each is scanned as a file (review 2026-12-06: a
  // malicious .distcp beside a refused .metadata went unexamined).
  if (covered != nullptr) {
    if (metadata) covered->push_back(dir / ".metadata");
    if (ckpt)
      for (const DcpFile& f : ckpt->files()) covered->push_back(dir / f.name);
  }
  try {
    if (metadata) {
      const Allowlist meta_allow = metadata_allowlist(allow);
      Scanner m(options, meta_allow, rep);
      m.scan_member(metadata->bytes(), ".metadata");
      m.flush();
      rep.size += metadata->size();
      ++rep.members;
    }
    Scanner s(options, allow, rep);
    if (!ckpt && !metadata) {
      // `.metadata` itself was not read (a symlink, ...): what PyTorch would
      // unpickle was not examined. Never an accepted, ignorable damage.
      s.add_refusal(Error(ErrorCode::kIo, ".metadata was not examined: " + ckpt.error().message()), ".metadata",
                    "this DCP directory");
    } else if (!ckpt) {
      s.add_refusal(ckpt.error(), ".metadata", "this DCP directory");
    } else {
      const DcpCheckpoint& c = *ckpt;
      for (const DcpFile& f : c.files()) rep.size += f.size;
      auto payload = [&](std::uint32_t file, std::uint64_t offset, std::uint64_t length) {
        return c.data_file(file)->bytes().subspan(offset, length);
      };
      for (const DcpTensor& t : c.tensors())
        for (const DcpChunk& ch : t.chunks) {
          const std::string member = payload_member(c, ch.file, ch.offset);
          s.scan_member(payload(ch.file, ch.offset, ch.length), member);
          ++rep.members;
          if (auto r = c.load_chunk(t, ch); !r) s.add_refusal(r.error(), member, "this chunk");
        }
      for (const DcpBytesItem& b : c.bytes_items()) {
        const std::string member = payload_member(c, b.file, b.offset);
        s.scan_member(payload(b.file, b.offset, b.length), member);
        ++rep.members;
        if (auto r = c.load_bytes_item(b); !r) s.add_refusal(r.error(), member, "this item");
      }
      scan_whole_files(c, options, rep);
      if (!rep.loader.ran) {  // no refusal: the reader accepted every payload
        rep.loader.ran = true;
        rep.loader.ok = true;
      }
    }
    s.finish();
  } catch (const std::exception& e) {
    add_exception_finding(rep, e);
  }
  return rep;
}

}  // namespace safeckpt::scan
