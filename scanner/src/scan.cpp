// The scanner's dispatcher: detect by content, then look at every byte a
// loader path could execute. Grammar of what each format scan examines:
//  1. torch zip / TorchScript / PT2 / other zip (ZipArchive, the loader's
//     reader): every anomaly is a finding; every member whose name ends in
//     .pkl or _pkl is scanned as pickle streams (CRC always checked; on a
//     mismatch the bytes PyTorch would read are still scanned); storage
//     records named by a persistent id are tensor data (CRC with
//     verify_data only; shorter than numel x element size: SCK113,
//     CVE-2026-24747); in a torch.save zip every other <root>/data/<key>
//     record is tensor data too (torch never unpickles it; one info note,
//     also when data.pkl failed and the storages are unknown); every other
//     member is sniffed by content and
//     scanned when it is a pickle, a checkpoint or a container (CVE-2025-1889:
//     a pickle in `data.txt`). TorchScript code and PT2 native code are
//     findings.
//  2. legacy sequential pickles: streams 1-5, the raw storages they describe
//     (keys of stream 5, sizes from the persistent ids of stream 4), then
//     any further bytes as more streams (a finding: trailing data).
//  3. bare pickle: every concatenated stream to the end of the file.
//  4. tar checkpoint: every member; `pickle` and `sys_info` as streams,
//     `storages`/`tensors` by their interleaved layout (torch/serialization.py
//     legacy_load).
//  5. numpy .npy: header; object arrays' pickled payload scanned.
//  6. safetensors: validated by the library's own reader
//     (SafetensorsFile::parse, include/safeckpt/safetensors_reader.hpp).
//  7. gzip/bzip2/xz/zstd/7z/rar/PYTORCH1 preview: "unscannable container".
//  8. anything else is tried as a pickle without PROTO (the C unpickler
//     accepts any opcode first); a file whose first opcode already fails is
//     not_model.
#include "safeckpt/scan.hpp"

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
#include "safeckpt/graph.hpp"
#include "safeckpt/safetensors_reader.hpp"
#include "safeckpt/zip.hpp"
#include "scanner.hpp"

namespace safeckpt::scan {

// ---- names ------------------------------------------------------------------

std::string_view severity_name(Severity s) noexcept {
  switch (s) {
    case Severity::kInfo: return "info";
    case Severity::kLow: return "low";
    case Severity::kMedium: return "medium";
    case Severity::kHigh: return "high";
    case Severity::kCritical: return "critical";
  }
  return "info";
}

std::string_view verdict_name(Verdict v) noexcept {
  switch (v) {
    case Verdict::kClean: return "clean";
    case Verdict::kUnsafe: return "unsafe";
    case Verdict::kIncomplete: return "incomplete";
    case Verdict::kUnscannable: return "unscannable";
    case Verdict::kNotModel: return "not_model";
    case Verdict::kError: return "error";
  }
  return "error";
}

std::string_view event_type_name(Event::Type t) noexcept {
  switch (t) {
    case Event::Type::kImport: return "import";
    case Event::Type::kCall: return "call";
    case Event::Type::kBuild: return "build";
  }
  return "import";
}

const std::vector<RuleInfo>& rules() {
  static const std::vector<RuleInfo> kRules = {
      {Rule::kImportDangerous, "SCK101", "import-dangerous",
       "Imports a known-dangerous callable that is not in the allowlist", Severity::kCritical},
      {Rule::kImportUnlisted, "SCK102", "import-not-allowlisted", "Imports a global that is not in the allowlist",
       Severity::kMedium},
      {Rule::kImportDynamic, "SCK103", "import-dynamic", "STACK_GLOBAL with a module or name built at run time",
       Severity::kCritical},
      {Rule::kImportDotted, "SCK104", "import-dotted", "Global whose name walks attributes (a.b)", Severity::kCritical},
      {Rule::kImportExtension, "SCK105", "import-extension", "EXT1/EXT2/EXT4 extension-registry import",
       Severity::kHigh},
      {Rule::kCall, "SCK110", "call-not-allowlisted",
       "REDUCE/NEWOBJ/NEWOBJ_EX/OBJ/INST/BUILD on something outside the allowlist", Severity::kHigh},
      {Rule::kRefusedOpcode, "SCK111", "opcode-refused",
       "Opcode the loader never accepts (INST, OBJ, NEWOBJ_EX, EXTn, PERSID)", Severity::kHigh},
      {Rule::kRefusedOperation, "SCK112", "operation-refused",
       "Operation the weights-only rules refuse (SETITEM on a tensor, APPEND to a non-list, ...)", Severity::kHigh},
      {Rule::kStorageOutOfBounds, "SCK113", "storage-out-of-bounds",
       "Storage record shorter than its tensor's numel x element size: an out-of-bounds read in torch < 2.10 "
       "(CVE-2026-24747)",
       Severity::kHigh},
      {Rule::kEmbeddedPayload, "SCK120", "embedded-payload",
       "Byte string inside a pickle that is itself a pickle or checkpoint with findings", Severity::kHigh},
      {Rule::kExecutableCode, "SCK130", "executable-code",
       "TorchScript code, or AOTInductor code in a PT2 archive (.so, .cubin, .ptx, .cpp, .o, ...)", Severity::kHigh},
      {Rule::kPt2Op, "SCK131", "pt2-op-not-allowed",
       "PT2 program node whose op is not in the engine's allowlist (other ATen op, custom namespace, higher-order op)",
       Severity::kHigh},
      {Rule::kPt2Mutation, "SCK132", "pt2-mutation",
       "PT2 program that updates an input or buffer in place (buffer/input mutation)", Severity::kHigh},
      {Rule::kPt2Refused, "SCK133", "pt2-program-refused",
       "The engine refuses this PT2 program or archive for another reason (named in the message)", Severity::kHigh},
      {Rule::kUnscannable, "SCK140", "unscannable-container",
       "Compressed or foreign container the scanner cannot look into", Severity::kHigh},
      {Rule::kArchiveAnomaly, "SCK150", "archive-anomaly", "Zip ambiguity that different readers resolve differently",
       Severity::kHigh},
      {Rule::kMalformed, "SCK160", "malformed", "Parse error: the rest of the stream was not examined",
       Severity::kHigh},
      {Rule::kLimit, "SCK161", "limit-exceeded", "A resource cap was hit: the rest was not examined", Severity::kHigh},
      {Rule::kUnsupported, "SCK162", "unsupported", "Valid input this scanner or the loader does not handle",
       Severity::kMedium},
      {Rule::kTrailingData, "SCK163", "trailing-data", "Bytes after the last stream or storage data",
       Severity::kMedium},
      {Rule::kNumpyObject, "SCK170", "numpy-object-array", "numpy object array: a pickled payload", Severity::kMedium},
      {Rule::kSafetensors, "SCK171", "safetensors-invalid", "safetensors header or offsets are invalid",
       Severity::kMedium},
      {Rule::kLoaderRefused, "SCK180", "loader-refused", "safeckpt's loader refuses this file", Severity::kHigh},
      {Rule::kIo, "SCK190", "io-error", "A file or member could not be read", Severity::kHigh},
      {Rule::kSignatureNotVerified, "SCK200", "signature-not-verified",
       "The model does not verify against its OpenSSF Model Signing bundle (malformed bundle, signature, key, "
       "certificate chain, root digest, or a model that cannot be hashed)",
       Severity::kCritical},
      {Rule::kSignedFileChanged, "SCK201", "signed-file-changed",
       "The file's bytes differ from the digest its signature bundle records", Severity::kCritical},
      {Rule::kSignedFileMissing, "SCK202", "signed-file-missing",
       "A file the signature bundle signs is not in the model", Severity::kHigh},
      {Rule::kUnsignedFile, "SCK203", "unsigned-file", "A file of the model that the signature bundle does not sign",
       Severity::kMedium},
      {Rule::kSignatureVerified, "SCK204", "signature-verified",
       "The signature verifies, or this file matches the digest its signature bundle records", Severity::kInfo},
  };
  return kRules;
}

const RuleInfo& rule_info(Rule r) {
  const auto& all = rules();
  for (const auto& ri : all)
    if (ri.rule == r) return ri;
  return all.front();
}

// Which verdict class a rule's finding puts a file in.
Klass klass_of(const Finding& f) {
  if (f.severity == Severity::kInfo) return Klass::kNone;
  switch (f.rule) {
    case Rule::kMalformed:
    case Rule::kLimit:
    case Rule::kUnsupported:
    case Rule::kIo:
    case Rule::kTrailingData:
    case Rule::kSafetensors: return Klass::kIncomplete;
    case Rule::kUnscannable: return Klass::kUnscannable;
    case Rule::kLoaderRefused: return Klass::kIncomplete;  // policy refusals are set to kUnsafe below
    default: return Klass::kUnsafe;
  }
}

Rule rule_for_error(ErrorCode c) {
  switch (c) {
    case ErrorCode::kLimitExceeded: return Rule::kLimit;
    case ErrorCode::kUnsupported: return Rule::kUnsupported;
    case ErrorCode::kIo: return Rule::kIo;
    case ErrorCode::kDisallowedGlobal: return Rule::kImportUnlisted;
    case ErrorCode::kDisallowedOperation: return Rule::kRefusedOperation;
    default: return Rule::kMalformed;
  }
}

// Protocol-2+ opcodes that push a value: a pickle without PROTO can start
// with them (sniff_format only knows protocol 0/1 starts and PROTO).
bool can_start_pickle(Bytes b) {
  static constexpr std::string_view kPushFirst =
      "\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x95\x96"
      "BC";
  return !b.empty() && kPushFirst.find(static_cast<char>(b[0])) != std::string_view::npos;
}

// ---- top level ----------------------------------------------------------------

void Scanner::scan_top(Bytes data) {
  FileReport& rep = sink_.report();
  rep.size = data.size();
  FileFormat f = sniff_format(data);
  if (f == FileFormat::kTorchZip) f = detect_format(data, opt_.limits);
  if (f == FileFormat::kTorchZip || f == FileFormat::kOtherZip || f == FileFormat::kUnknown) {
    graph::GraphLimits gl;
    gl.container = opt_.limits;
    if (sniff_format(data) == FileFormat::kTorchZip && graph::is_pt2_archive(data, gl))
      f = FileFormat::kPt2Archive;  // the torch 2.6/2.7 flat layout: judged like a PT2 archive
  }
  rep.format = std::string(file_format_name(f));
  if (sniff_format(data) == FileFormat::kTorchZip && f == FileFormat::kUnknown) rep.format = "zip";
  dispatch(data, "", 0, true);
  switch (f == FileFormat::kPt2Archive ? FileFormat::kPt2Archive : sniff_format(data)) {
    case FileFormat::kPt2Archive: break;  // the engine's reader and validator decided (scan_pt2)
    case FileFormat::kTorchZip:
    case FileFormat::kLegacyPickle:
    case FileFormat::kBarePickle: run_loader(data); break;
    case FileFormat::kUnknown:
      if (!not_model_) run_loader(data);  // a pickle without PROTO: what does the loader say?
      break;
    default: break;
  }
}

void Scanner::run_loader(Bytes data) {
  if (!opt_.run_loader) return;
  FileReport& rep = sink_.report();
  LoadOptions lo;
  lo.limits = opt_.limits;
  lo.allowlist = &allow_;
  lo.verify_storage_crc = opt_.verify_data;
  rep.loader.ran = true;
  auto r = load_bytes(data, lo);
  if (r) {
    rep.loader.ok = true;
    return;
  }
  add_refusal(r.error(), r.error().where().record);
}

void Scanner::add_refusal(const Error& e, const std::string& member, std::string_view what) {
  FileReport& rep = sink_.report();
  if (rep.loader.code == ErrorCode::kOk) {  // the first refusal is the report's loader verdict
    rep.loader.ran = true;
    rep.loader.ok = false;
    rep.loader.code = e.code();
    rep.loader.message = e.message();
    rep.loader.record = e.where().record;
    rep.loader.offset = e.where().offset;
    rep.loader.opcode = e.where().opcode;
  }
  Finding f;
  // A part that could not be read is SCK190 (high; never ignorable), as a
  // path that could not be: a missing shard or data file is not a damaged
  // checkpoint to accept.
  f.rule = e.code() == ErrorCode::kIo ? Rule::kIo : Rule::kLoaderRefused;
  f.severity = is_policy_error(e.code()) || e.code() == ErrorCode::kIo ? Severity::kHigh : Severity::kMedium;
  f.member = member;
  f.offset = e.where().offset;
  f.opcode = e.where().opcode;
  f.message =
      "the loader refuses " + std::string(what) + ": " + std::string(error_code_name(e.code())) + ": " + e.message();
  f.why = is_policy_error(e.code()) ? "safeckpt load / torch.load(weights_only=True) would stop here"
                                    : "the file is not a checkpoint the loader can read as is";
  sink_.add(std::move(f));
}

// Issue 12: one headline finding, first in the list, that tells a file that
// needs globals outside the weights-only set (a full-module torch.save(model),
// custom classes) apart from one that imports known-dangerous callables.
namespace {

void add_summary(FileReport& rep) {
  std::vector<std::string> dangerous, needs;
  bool hidden = false;  // dynamic / dotted / extension imports, embedded payloads, code
  auto add_unique = [](std::vector<std::string>& v, const std::string& g) {
    if (std::find(v.begin(), v.end(), g) == v.end()) v.push_back(g);
  };
  for (const Finding& f : rep.findings) {
    const bool named = !f.global.empty() && f.global.front() != '<' && f.global.rfind("result of ", 0) != 0;
    switch (f.rule) {
      case Rule::kImportDangerous:
      case Rule::kImportUnlisted:
        if (named) add_unique(is_known_dangerous(f.global) ? dangerous : needs, f.global);
        break;
      case Rule::kCall:
        if (named && is_known_dangerous(f.global)) add_unique(dangerous, f.global);
        break;
      case Rule::kImportDynamic:
      case Rule::kImportDotted:
      case Rule::kImportExtension:
      case Rule::kEmbeddedPayload:
      case Rule::kExecutableCode: hidden = true; break;
      default: break;
    }
  }
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (std::size_t i = 0; i < v.size() && i < 20; ++i) out += (i ? ", " : "") + v[i];
    if (v.size() > 20) out += ", ... (" + std::to_string(v.size() - 20) + " more)";
    return out;
  };
  Finding f;
  if (!dangerous.empty() || hidden) {
    bool all_blocked = !dangerous.empty();
    for (const auto& g : dangerous) all_blocked = all_blocked && Allowlist::is_blocked(g);
    f.rule = Rule::kImportDangerous;
    f.severity = Severity::kCritical;
    f.message =
        "this file tries to run code when unpickled: " +
        (dangerous.empty() ? std::string("it hides what it imports or carries code (see the findings below)")
                           : "it imports known-dangerous callables: " + list(dangerous)) +
        (needs.empty() ? std::string() : "; it also needs globals outside the weights-only set: " + list(needs));
    f.why = std::string("do not load it with torch.load(weights_only=False)") +
            (all_blocked ? "; no allowlist can make it load: these globals are hard-blocked"
                         : "; do not allowlist these globals");
  } else if (!needs.empty()) {
    f.rule = Rule::kImportUnlisted;
    f.severity = Severity::kMedium;
    f.message = "needs " + std::to_string(needs.size()) + " global" + (needs.size() == 1 ? "" : "s") +
                " outside PyTorch's weights-only set: " + list(needs) + "; nothing known-dangerous was found";
    f.why =
        "typical of a whole nn.Module saved with torch.save(model), or of custom classes: "
        "torch.load(weights_only=True) and the loader refuse it. Prefer a file saved from model.state_dict(); "
        "if you trust this one, --allow those classes to read it as data (nothing is executed)";
  } else {
    return;
  }
  rep.findings.insert(rep.findings.begin(), std::move(f));
}

}  // namespace

void Scanner::finish() {
  sink_.finish();
  FileReport& rep = sink_.report();
  add_summary(rep);
  bool unsafe = false, incomplete = false, unscannable = false;
  for (const Finding& f : rep.findings) {
    Klass k = klass_of(f);
    // add_refusal: severity kHigh exactly for a policy refusal.
    if (f.rule == Rule::kLoaderRefused && f.severity == Severity::kHigh) k = Klass::kUnsafe;
    if (k == Klass::kUnsafe) unsafe = true;
    if (k == Klass::kIncomplete) incomplete = true;
    if (k == Klass::kUnscannable) unscannable = true;
  }
  rep.complete = !incomplete && !unscannable;
  if (unsafe) {
    rep.verdict = Verdict::kUnsafe;
  } else if (unscannable) {
    rep.verdict = Verdict::kUnscannable;
  } else if (incomplete) {
    rep.verdict = Verdict::kIncomplete;
  } else if (not_model_) {
    rep.verdict = Verdict::kNotModel;
  } else {
    rep.verdict = Verdict::kClean;
  }
}

void Scanner::dispatch(Bytes data, const std::string& member, int depth, bool top) {
  FileFormat f = sniff_format(data);
  // Containers inside containers (tar in tar, zip in zip ...): bounded, so a
  // hostile file cannot drive the recursion deep.
  if (depth > opt_.max_nesting && f != FileFormat::kUnknown && f != FileFormat::kEmpty) {
    add(Rule::kLimit, Severity::kHigh, member,
        "nested " + std::string(file_format_name(f)) + " deeper than max_nesting (" + std::to_string(opt_.max_nesting) +
            "): not examined",
        kIncompleteWhy);
    return;
  }
  switch (f) {
    case FileFormat::kEmpty:
      if (top) not_model_ = true;
      return;
    case FileFormat::kTorchZip: scan_zip(data, member, depth); return;
    case FileFormat::kLegacyPickle: scan_legacy(data, member, depth); return;
    case FileFormat::kBarePickle: scan_streams(data, member, depth, 0, 0, true); return;
    case FileFormat::kLegacyTar: scan_tar(data, member, depth); return;
    case FileFormat::kNumpyNpy: scan_npy(data, member, depth); return;
    case FileFormat::kSafetensors: scan_safetensors(data, member); return;
    case FileFormat::kGzip:
    case FileFormat::kBzip2:
    case FileFormat::kXz:
    case FileFormat::kZstd:
    case FileFormat::k7z:
    case FileFormat::kRar:
    case FileFormat::kPreviewPytorch1:
      add(Rule::kUnscannable, Severity::kHigh, member,
          "unscannable container: " + std::string(file_format_name(f)) +
              (f == FileFormat::kPreviewPytorch1 ? " (pre-1.0 PyTorch preview format)" : ""),
          "the scanner cannot see inside; a pickle hidden in it would not be examined (nullifAI hid payloads in "
          "7z). Decompress it and scan the contents");
      return;
    default: break;
  }
  // kUnknown: the C unpickler accepts any opcode first (no PROTO needed).
  // A first byte that is no opcode, or an opcode that needs a stack item, a
  // MARK or a memo entry, fails in every unpickler before anything runs:
  // such a file (text, JSON, images) is not a model. A protocol-2+ opcode
  // that pushes a value can start a real pickle: scan it, fail closed.
  const bool can_start = can_start_pickle(data);
  std::vector<PidInfo> pids;
  StreamOutcome o = run_stream(data, 0, member, 0, depth, &pids);
  if (o.status == StreamOutcome::kFailed && o.failed_at_start && !can_start) {
    if (top) not_model_ = true;
    return;
  }
  if (o.status == StreamOutcome::kFailed) {
    add_error(o.error, member, 0, 0, kIncompleteWhy);
    return;
  }
  scan_streams(data, member, depth, o.end, 1, true);
}

// ---- entry points ---------------------------------------------------------------

FileReport scan_bytes(Bytes data, std::string_view name, const ScanOptions& options) {
  FileReport rep;
  rep.path = std::string(name);
  const Allowlist& allow = options.allowlist != nullptr ? *options.allowlist : Allowlist::default_policy();
  Scanner s(options, allow, rep);
  try {
    s.scan_top(data);
  } catch (const std::exception& e) {
    add_exception_finding(rep, e);
  }
  s.finish();
  return rep;
}

void add_exception_finding(FileReport& rep, const std::exception& e) {
  Finding f;
  const bool oom = dynamic_cast<const std::bad_alloc*>(&e) != nullptr;
  f.rule = oom ? Rule::kLimit : Rule::kMalformed;
  f.message =
      oom ? std::string("out of memory while scanning") : std::string("internal error while scanning: ") + e.what();
  f.why = kIncompleteWhy;
  rep.findings.push_back(std::move(f));
  const bool unsafe = std::any_of(rep.findings.begin(), rep.findings.end(),
                                  [](const Finding& x) { return klass_of(x) == Klass::kUnsafe; });
  rep.verdict = unsafe ? Verdict::kUnsafe : Verdict::kIncomplete;
  rep.complete = false;
}

namespace {

// A sharded index (scan.hpp): every shard it names is opened once by the
// index rules and scanned as a member named after it; the verdict is the
// index loader's over those same bytes when every shard is safetensors, else
// each shard's loader's (pytorch_model.bin.index.json: torch.load per shard).
void scan_index_into(MappedFile index, const ScanOptions& options, FileReport& rep);

FileReport scan_safetensors_index(MappedFile index, const ScanOptions& options) {
  FileReport rep;
  rep.path = index.path().string();
  try {
    scan_index_into(std::move(index), options, rep);
  } catch (const std::exception& e) {
    add_exception_finding(rep, e);
  }
  return rep;
}

void scan_index_into(MappedFile index, const ScanOptions& options, FileReport& rep) {
  rep.path = index.path().string();
  rep.size = index.size();
  rep.format = std::string(file_format_name(FileFormat::kSafetensorsIndex));
  const Allowlist& allow = options.allowlist != nullptr ? *options.allowlist : Allowlist::default_policy();
  Scanner s(options, allow, rep);
  SafetensorsOptions so;
  so.limits = options.limits;
  const Bytes b = index.bytes();
  auto parsed = parse_safetensors_index(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()), so);
  auto opened =
      parsed ? open_index_shards(index.path(), *parsed) : Result<std::vector<IndexShard>>(unexpected(parsed.error()));
  if (!opened) {
    // The shards it names were not examined (a name out of the directory,
    // a symlink out of it, a missing file): transformers joins the names onto
    // the directory and loads them. Never an accepted, ignorable damage.
    s.add_refusal(Error(ErrorCode::kIo, "the shards this index names were not examined: " + opened.error().message(),
                        opened.error().where()),
                  "", "this sharded index");
    s.finish();
    return;
  }
  rep.loader.ran = true;
  bool all_safetensors = true;
  for (const IndexShard& sh : *opened) {
    const Bytes data = sh.file.bytes();
    rep.size += data.size();
    ++rep.members;
    s.scan_member(data, sh.name);
    if (sniff_format(data) == FileFormat::kSafetensors) continue;
    all_safetensors = false;
    LoadOptions lo;
    lo.limits = options.limits;
    lo.allowlist = &allow;
    lo.verify_storage_crc = options.verify_data;
    if (auto r = load_bytes(data, lo); !r) s.add_refusal(r.error(), sh.name, "this shard");
  }
  if (all_safetensors) {
    auto r = load_safetensors_index_shards(std::move(index), *parsed, std::move(*opened), so);
    if (!r) s.add_refusal(r.error(), r.error().where().record, "this sharded index");
  }
  if (rep.loader.code == ErrorCode::kOk) rep.loader.ok = true;
  s.finish();
}

}  // namespace

FileReport scan_file(const std::filesystem::path& path, const ScanOptions& options) {
  auto mf = MappedFile::open(path);
  if (!mf) return unscanned_report(path.string(), mf.error().message());
  if (sniff_format(mf->bytes()) == FileFormat::kSafetensorsIndex)
    return scan_safetensors_index(std::move(*mf), options);
  return scan_bytes(mf->bytes(), path.string(), options);
}

}  // namespace safeckpt::scan
