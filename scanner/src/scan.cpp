// The scanner's dispatcher: detect by content, then look at every byte a
// loader path could execute. Grammar of what each format scan examines:
//  1. torch zip / TorchScript / PT2 / other zip (ZipArchive, the loader's
//     reader): every anomaly is a finding; every member whose name ends in
//     .pkl or _pkl is scanned as pickle streams (CRC always checked; on a
//     mismatch the bytes PyTorch would read are still scanned); storage
//     records named by a persistent id are tensor data (CRC with
//     verify_data only); every other member is sniffed by content and
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
//     (SafetensorsFile::parse, include/safeckpt/safetensors.hpp).
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
#include "safeckpt/safetensors.hpp"
#include "safeckpt/zip.hpp"

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
      {Rule::kEmbeddedPayload, "SCK120", "embedded-payload",
       "Byte string inside a pickle that is itself a pickle or checkpoint with findings", Severity::kHigh},
      {Rule::kExecutableCode, "SCK130", "executable-code",
       "TorchScript code or PT2 native code (.so, cubin) inside the archive", Severity::kHigh},
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
  };
  return kRules;
}

const RuleInfo& rule_info(Rule r) {
  const auto& all = rules();
  for (const auto& ri : all)
    if (ri.rule == r) return ri;
  return all.front();
}

namespace {

// Which verdict class a rule's finding puts a file in.
enum class Klass { kUnsafe, kIncomplete, kUnscannable, kNone };
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

// ---- the scanner ----------------------------------------------------------

struct StreamOutcome {
  enum Status { kDone, kPolicyDone, kFailed } status = kFailed;
  std::uint64_t end = 0;         // offset just past STOP, relative to the stream start
  NodeId root = kNoNode;         // kDone only
  Error error;                   // kFailed: the error; kPolicyDone: first policy error
  bool failed_at_start = false;  // kFailed at the first opcode with no event
};

// What a caller reads from a stream's value (kDone streams only), taken
// from the one run of the stream.
struct RootInfo {
  std::vector<std::string> strs;          // a list root: its str/bytes items
  std::optional<std::int64_t> int_value;  // an int root
  std::string third_global;               // a 3-tuple root whose third item is a global: its name
};

class Scanner {
 public:
  Scanner(const ScanOptions& opt, const Allowlist& allow, FileReport& rep)
      : opt_(opt), allow_(allow), sink_(rep, opt.keep_events), obs_(allow, sink_) {}

  void scan_top(Bytes data);
  void finish();

 private:
  // Dispatch by content. `member` names where `data` lives ("" = the file).
  void dispatch(Bytes data, const std::string& member, int depth, bool top);
  void scan_zip(Bytes data, const std::string& member, int depth);
  void scan_legacy(Bytes data, const std::string& member, int depth);
  // Streams from `start` to the end; returns false when a stream failed.
  bool scan_streams(Bytes data, const std::string& member, int depth, std::uint64_t start, int first_index,
                    bool trailing_is_finding, std::vector<PidInfo>* pids = nullptr);
  StreamOutcome run_stream(Bytes data, std::uint64_t base, const std::string& member, int index, int depth,
                           std::vector<PidInfo>* pids, RootInfo* root_info = nullptr);
  void scan_tar(Bytes data, const std::string& member, int depth);
  void scan_npy(Bytes data, const std::string& member, int depth);
  void scan_safetensors(Bytes data, const std::string& member);
  void run_loader(Bytes data);
  void add(Rule r, Severity s, std::string member, std::string message, std::string why = {},
           std::uint64_t offset = ~std::uint64_t{0}, int stream = -1) {
    Finding f;
    f.rule = r;
    f.severity = s;
    f.member = std::move(member);
    f.message = std::move(message);
    f.why = std::move(why);
    f.offset = offset;
    f.stream = stream;
    sink_.add(std::move(f));
  }
  void add_error(const Error& e, const std::string& member, int stream, std::uint64_t base, std::string why) {
    Finding f;
    f.rule = rule_for_error(e.code());
    f.severity = f.rule == Rule::kLimit || f.rule == Rule::kMalformed ? Severity::kHigh : Severity::kMedium;
    f.member = member;
    f.stream = stream;
    f.offset = e.where().offset == Location::kNoOffset ? Location::kNoOffset : base + e.where().offset;
    f.opcode = e.where().opcode;
    f.message = std::string(error_code_name(e.code())) + ": " + e.message();
    f.why = std::move(why);
    sink_.add(std::move(f));
  }

  const ScanOptions& opt_;
  const Allowlist& allow_;
  Sink sink_;
  ScanObserver obs_;
  bool not_model_ = false;
};

constexpr const char* kIncompleteWhy =
    "scan incomplete: bytes after this point were not examined, so the file "
    "cannot be called clean";

// ---- pickle streams ---------------------------------------------------------

StreamOutcome Scanner::run_stream(Bytes data, std::uint64_t base, const std::string& member, int index, int depth,
                                  std::vector<PidInfo>* pids, RootInfo* root_info) {
  StreamOutcome out;
  const std::uint64_t cap = opt_.limits.max_pickle_bytes;
  const bool capped = data.size() > cap;
  Bytes d = capped ? data.first(static_cast<std::size_t>(cap)) : data;
  ValueArena arena;
  ScanHooks hooks(arena, allow_, &sink_);
  hooks.set_place(member, index, base);
  obs_.set_place(member, index, base);
  PickleOptions po;
  po.limits = opt_.limits;
  po.record = member.empty() ? std::string("<file>") : member;
  po.continue_after_policy_error = true;
  po.cpython_text_operands = true;  // see what pickle.load would run (issue 11, item 7)
  po.input_cut_at_limit = capped;   // running out of bytes is the cap, not damage
  const std::uint64_t events_before = obs_.events_seen;
  const bool loader_before = obs_.nested_loader_called;
  obs_.nested_loader_called = false;
  ++sink_.report().pickle_streams;
  // The one run of this stream: its end (where the next stream starts) and
  // its first policy error come back together.
  auto r = run_pickle(d, arena, hooks, &obs_, po);
  if (r && !r->policy_error) {
    out.status = StreamOutcome::kDone;
    out.end = r->end_offset;
    out.root = r->root;
  } else if (r) {
    out.status = StreamOutcome::kPolicyDone;
    out.end = r->end_offset;
    out.error = *r->policy_error;
    // Imports, calls and refused opcodes are reported as events; the
    // container rules (CVE-2026-24747: SETITEM on a tensor, APPEND onto a
    // non-list) surface only as this error.
    static const std::set<std::string, std::less<>> kContainerOps = {"APPEND",   "APPENDS", "SETITEM",   "SETITEMS",
                                                                     "ADDITEMS", "DICT",    "FROZENSET", "BINPERSID"};
    const Error& pe = out.error;
    if (pe.code() == ErrorCode::kDisallowedOperation && kContainerOps.count(pe.where().opcode) != 0) {
      Finding f;
      f.rule = Rule::kRefusedOperation;
      f.severity = Severity::kHigh;
      f.member = member;
      f.stream = index;
      f.offset = pe.where().offset == Location::kNoOffset ? Location::kNoOffset : base + pe.where().offset;
      f.opcode = pe.where().opcode;
      f.message = pe.message();
      f.why = pe.where().opcode == "BINPERSID"
                  ? "the weights-only rules load only (\"storage\", ...) persistent ids; the loader refuses others"
                  : "the weights-only rules allow SETITEM(S) only on dict/OrderedDict/Counter and APPEND(S) only on "
                    "lists; torch < 2.10 did not check (CVE-2026-24747: out-of-bounds tensor write)";
      sink_.add(std::move(f));
    }
  } else {
    out.status = StreamOutcome::kFailed;
    out.error = r.error();
    const Error& e = r.error();
    out.failed_at_start =
        obs_.events_seen == events_before && (e.where().offset == 0 || e.where().offset == Location::kNoOffset);
  }
  if (pids != nullptr) *pids = hooks.pids;
  if (root_info != nullptr && out.status == StreamOutcome::kDone) {
    const Node& root = arena[out.root];
    if (root.kind == Kind::kList)
      for (NodeId id : root.items)
        if (arena[id].kind == Kind::kStr || arena[id].kind == Kind::kBytes) root_info->strs.push_back(arena[id].text);
    if (root.kind == Kind::kInt) root_info->int_value = root.i;
    if (root.kind == Kind::kTuple && root.items.size() == 3 && arena[root.items[2]].kind == Kind::kGlobal)
      root_info->third_global = arena[root.items[2]].text;
  }
  // Embedded payloads: byte strings that are pickles/checkpoints themselves
  // (second stages for pickle.loads, torch.load(BytesIO), ...).
  const bool loader_called = obs_.nested_loader_called;
  obs_.nested_loader_called = loader_before || loader_called;
  {
    std::vector<std::string> payloads;
    for (std::size_t i = 0; i < arena.size(); ++i) {
      const Node& n = arena[static_cast<NodeId>(i)];
      if ((n.kind == Kind::kBytes || n.kind == Kind::kByteArray) && n.text.size() >= 2) {
        Bytes b(reinterpret_cast<const std::uint8_t*>(n.text.data()), n.text.size());
        FileFormat f = sniff_format(b);
        if ((f == FileFormat::kUnknown && !can_start_pickle(b)) || f == FileFormat::kEmpty ||
            f == FileFormat::kSafetensors)
          continue;
        payloads.push_back(n.text);
        if (payloads.size() >= 64) break;
      }
    }
    if (!payloads.empty() && depth >= opt_.max_nesting) {
      add(Rule::kLimit, Severity::kHigh, member,
          std::to_string(payloads.size()) +
              " embedded byte string(s) that look like pickles or checkpoints are "
              "nested deeper than max_nesting (" +
              std::to_string(opt_.max_nesting) + ") and were not examined",
          kIncompleteWhy, Location::kNoOffset, index);
      payloads.clear();
    }
    int k = 0;
    for (const std::string& p : payloads) {
      Bytes b(reinterpret_cast<const std::uint8_t*>(p.data()), p.size());
      std::string sub = (member.empty() ? std::string() : member) + "!bytes#" + std::to_string(k++);
      FileReport nested;
      nested.path = sub;
      ScanOptions o2 = opt_;
      o2.run_loader = false;
      Scanner inner(o2, allow_, nested);
      inner.dispatch(b, sub, depth + 1, false);
      bool unsafe = false;
      for (const Finding& f : nested.findings)
        if (klass_of(f) == Klass::kUnsafe || klass_of(f) == Klass::kUnscannable) unsafe = true;
      if (!unsafe && !loader_called) continue;  // inert data that merely looks like a pickle
      if (unsafe) {
        std::string globals;
        for (const Finding& f : nested.findings)
          if (!f.global.empty() && globals.find(f.global) == std::string::npos && globals.size() < 200)
            globals += (globals.empty() ? "" : ", ") + f.global;
        add(Rule::kEmbeddedPayload, Severity::kCritical, sub,
            "embedded byte string of " + std::to_string(p.size()) + " bytes is a " +
                std::string(file_format_name(sniff_format(b))) + " with findings" +
                (globals.empty() ? std::string() : " (" + globals + ")"),
            "a nested loader (pickle.loads, torch.load, ...) reached from this pickle runs it as a second stage",
            Location::kNoOffset, index);
      }
      for (Finding& f : nested.findings) sink_.add(std::move(f));
      for (Event& e : nested.events) sink_.event(std::move(e));
      sink_.report().pickle_streams += nested.pickle_streams;
    }
  }
  return out;
}

bool Scanner::scan_streams(Bytes data, const std::string& member, int depth, std::uint64_t start, int first_index,
                           bool trailing_is_finding, std::vector<PidInfo>* pids) {
  std::uint64_t pos = start;
  int index = first_index;
  while (pos < data.size()) {
    std::vector<PidInfo> p;
    StreamOutcome o = run_stream(data.subspan(static_cast<std::size_t>(pos)), pos, member, index, depth, &p);
    if (pids != nullptr) pids->insert(pids->end(), p.begin(), p.end());
    if (o.status == StreamOutcome::kFailed) {
      if (index > first_index && o.failed_at_start) {
        if (trailing_is_finding)
          add(Rule::kTrailingData, Severity::kMedium, member,
              std::to_string(data.size() - pos) + " bytes after pickle stream " + std::to_string(index - 1) +
                  " are not a pickle",
              "unexplained bytes can hide data for other readers; the scan cannot call them clean", pos);
        return true;
      }
      add_error(o.error, member, index, pos, kIncompleteWhy);
      return false;
    }
    pos += o.end;
    ++index;
  }
  return true;
}

// ---- top level ----------------------------------------------------------------

void Scanner::scan_top(Bytes data) {
  FileReport& rep = sink_.report();
  rep.size = data.size();
  FileFormat f = sniff_format(data);
  if (f == FileFormat::kTorchZip) f = detect_format(data, opt_.limits);
  rep.format = std::string(file_format_name(f));
  if (sniff_format(data) == FileFormat::kTorchZip && f == FileFormat::kUnknown) rep.format = "zip";
  dispatch(data, "", 0, true);
  switch (sniff_format(data)) {
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
  const Error& e = r.error();
  rep.loader.ok = false;
  rep.loader.code = e.code();
  rep.loader.message = e.message();
  rep.loader.record = e.where().record;
  rep.loader.offset = e.where().offset;
  rep.loader.opcode = e.where().opcode;
  Finding f;
  f.rule = Rule::kLoaderRefused;
  f.severity = is_policy_error(e.code()) ? Severity::kHigh : Severity::kMedium;
  f.member = e.where().record;
  f.offset = e.where().offset;
  f.opcode = e.where().opcode;
  f.message = "the loader refuses this file: " + std::string(error_code_name(e.code())) + ": " + e.message();
  f.why = is_policy_error(e.code()) ? "safeckpt load / torch.load(weights_only=True) would stop here"
                                    : "the file is not a checkpoint the loader can read as is";
  sink_.add(std::move(f));
}

// Issue 12: one headline finding, first in the list, that tells a file that
// needs globals outside the weights-only set (a full-module torch.save(model),
// custom classes) apart from one that imports known-dangerous callables.
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

void Scanner::finish() {
  sink_.finish();
  FileReport& rep = sink_.report();
  add_summary(rep);
  bool unsafe = false, incomplete = false, unscannable = false;
  for (const Finding& f : rep.findings) {
    Klass k = klass_of(f);
    if (f.rule == Rule::kLoaderRefused && is_policy_error(rep.loader.code)) k = Klass::kUnsafe;
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

// ---- zip -------------------------------------------------------------------

bool is_pickle_name(std::string_view name) {
  return name.ends_with(".pkl") || name.ends_with("_pkl") || name.ends_with(".pickle");
}

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
  auto member_label = [&](const ZipEntry& e) { return prefix + (label[e.index].empty() ? e.name : label[e.index]); };
  for (const ZipAnomaly& a : zip.anomalies()) {
    if (a.kind == ZipAnomalyKind::kDuplicateName) continue;  // reported above, with the copy PyTorch reads
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
  if (kind == FileFormat::kPt2Archive) {
    int listed = 0;
    for (const ZipEntry& e : zip.entries()) {
      std::string_view n = e.name;
      if (n.ends_with(".so") || n.ends_with(".cubin") || n.ends_with(".dll") || n.ends_with(".dylib") ||
          n.ends_with(".o")) {
        if (listed++ < 100)
          add(Rule::kExecutableCode, Severity::kHigh, prefix + e.name,
              "PT2 archive member is native code (" + std::string(n.substr(n.rfind('.'))) + ")",
              "AOTInductor loads and runs compiled shared libraries / GPU kernels from the archive",
              e.local_header_offset);
      }
    }
    add(Rule::kExecutableCode, Severity::kHigh, member,
        "PT2 archive (torch.export / AOTInductor package): contains compiled programs",
        "loading it runs code from the archive; the loader refuses PT2 archives");
  }
  // Pass 1: pickle members (by name), collecting persistent ids.
  std::vector<PidInfo> pids;
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
      continue;
    }
    if (auto crc = zip.verify_crc(e, rb->bytes); !crc) {
      add(Rule::kArchiveAnomaly, Severity::kHigh, member_label(e), "crc_mismatch: " + crc.error().message(),
          "PyTorch does not check CRCs and reads these bytes; Python's zipfile (and scanners built on it) "
          "refuses them (CVE-2025-10156). Scanned as PyTorch reads them",
          e.local_header_offset);
    }
    std::vector<PidInfo> p;
    scan_streams(rb->bytes, member_label(e), depth, 0, 0, true, &p);
    pids.insert(pids.end(), p.begin(), p.end());
  }
  // Storage records named by persistent ids are tensor bytes.
  std::set<std::string> storage_names;
  for (const PidInfo& p : pids)
    if (!p.key.empty()) storage_names.insert(zip.root() + "/data/" + p.key);
  // Pass 2: every other member, by content.
  for (const ZipEntry& e : zip.entries()) {
    if (done[e.index]) continue;
    ++rep.members;
    const bool is_storage = storage_names.count(e.name) != 0;
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
}

// ---- legacy sequential pickles ------------------------------------------------

void Scanner::scan_legacy(Bytes data, const std::string& member, int depth) {
  // torch/serialization.py _legacy_save: magic, protocol, sys_info, object, storage keys, storages.
  std::uint64_t pos = 0;
  std::vector<PidInfo> pids;
  RootInfo key_list;
  std::vector<std::string>& keys = key_list.strs;
  bool keys_ok = false;
  for (int i = 0; i < 5; ++i) {
    if (pos >= data.size()) {
      add(Rule::kMalformed, Severity::kHigh, member,
          "legacy checkpoint ends after " + std::to_string(i) + " of its 5 pickle streams", kIncompleteWhy, pos, i);
      return;
    }
    std::vector<PidInfo> p;
    StreamOutcome o = run_stream(data.subspan(static_cast<std::size_t>(pos)), pos, member, i, depth, &p,
                                 i == 4 ? &key_list : nullptr);
    if (o.status == StreamOutcome::kFailed) {
      add_error(o.error, member, i, pos, kIncompleteWhy);
      return;
    }
    if (i == 4) keys_ok = o.status == StreamOutcome::kDone;
    pids.insert(pids.end(), p.begin(), p.end());
    pos += o.end;
  }
  if (!keys_ok) {
    add(Rule::kMalformed, Severity::kHigh, member,
        "legacy storage-key list (stream 4) is not a list of strings: the storage data cannot be located",
        kIncompleteWhy, pos, 4);
    return;
  }
  std::unordered_map<std::string, std::uint32_t> elem;
  for (const PidInfo& p : pids) {
    if (!p.well_formed) continue;
    std::uint32_t size = 1;
    Builtin b;
    DType dt;
    std::string_view cls = p.storage_type;
    if (cls == "torch.storage.UntypedStorage") {
      size = 1;
    } else if (lookup_known_global(cls, b, dt) && b == Builtin::kStorageClass) {
      size = dtype_size(dt);
    } else if (auto d2 = dtype_from_storage_class(cls.substr(cls.rfind('.') + 1))) {
      size = dtype_size(*d2);
    } else {
      continue;
    }
    elem.emplace(p.key, size);
  }
  if (keys.size() > opt_.limits.max_legacy_storages) {
    add(Rule::kLimit, Severity::kHigh, member, "more than max_legacy_storages storages", kIncompleteWhy, pos);
    return;
  }
  for (const std::string& k : keys) {
    auto it = elem.find(k);
    if (it == elem.end()) {
      add(Rule::kMalformed, Severity::kHigh, member,
          "legacy storage key '" + k.substr(0, 64) + "' has no persistent id with a known storage type", kIncompleteWhy,
          pos);
      return;
    }
    if (data.size() - pos < 8) {
      add(Rule::kMalformed, Severity::kHigh, member, "legacy storage '" + k.substr(0, 64) + "' is truncated",
          kIncompleteWhy, pos);
      return;
    }
    std::uint64_t count = 0;
    for (int b = 7; b >= 0; --b)
      count = (count << 8) | data[static_cast<std::size_t>(pos) + static_cast<std::size_t>(b)];
    pos += 8;
    if (count > (data.size() - pos) / it->second) {
      add(Rule::kMalformed, Severity::kHigh, member,
          "legacy storage '" + k.substr(0, 64) + "' declares " + std::to_string(count) + " elements of " +
              std::to_string(it->second) + " bytes but only " + std::to_string(data.size() - pos) + " bytes remain",
          kIncompleteWhy, pos - 8);
      return;
    }
    pos += count * it->second;
  }
  if (pos < data.size()) {
    add(Rule::kTrailingData, Severity::kMedium, member,
        std::to_string(data.size() - pos) + " bytes follow the storage data of the legacy checkpoint",
        "torch.load ignores them, other readers may not; they are scanned as further pickle streams", pos);
    scan_streams(data, member, depth, pos, 5, true);
  }
}

// ---- tar ---------------------------------------------------------------------

std::uint64_t tar_octal(Bytes h, std::size_t off, std::size_t len, bool& ok) {
  std::uint64_t v = 0;
  std::size_t i = off;
  while (i < off + len && (h[i] == ' ' || h[i] == 0)) ++i;
  bool any = false;
  for (; i < off + len && h[i] >= '0' && h[i] <= '7'; ++i) {
    if (v > (~std::uint64_t{0} >> 3)) {
      ok = false;
      return 0;
    }
    v = v * 8 + (h[i] - '0');
    any = true;
  }
  for (; i < off + len; ++i)
    if (h[i] != ' ' && h[i] != 0) ok = false;
  if (!any) v = 0;
  return v;
}

void Scanner::scan_tar(Bytes data, const std::string& member, int depth) {
  const std::string prefix = member.empty() ? std::string() : member + "!";
  add(Rule::kUnsupported, Severity::kMedium, member,
      "legacy tar checkpoint (PyTorch < 0.1.10): the loader does not read this format",
      "its pickles are scanned below; convert it with a trusted PyTorch before use");
  std::uint64_t pos = 0;
  std::uint64_t count = 0;
  while (pos + 512 <= data.size()) {
    Bytes h = data.subspan(static_cast<std::size_t>(pos), 512);
    bool zero = std::all_of(h.begin(), h.end(), [](std::uint8_t b) { return b == 0; });
    if (zero) return;  // end-of-archive marker
    if (++count > opt_.limits.max_zip_entries) {
      add(Rule::kLimit, Severity::kHigh, member, "tar with more than max_zip_entries members", kIncompleteWhy, pos);
      return;
    }
    bool ok = true;
    std::uint64_t size = tar_octal(h, 124, 12, ok);
    std::size_t nlen = 0;
    while (nlen < 100 && h[nlen] != 0) ++nlen;
    std::string name(reinterpret_cast<const char*>(h.data()), nlen);
    char type = static_cast<char>(h[156]);
    if (!ok || size > data.size() - pos - 512) {
      add(Rule::kMalformed, Severity::kHigh, prefix + name, "tar header with a bad size field", kIncompleteWhy, pos);
      return;
    }
    Bytes body = data.subspan(static_cast<std::size_t>(pos + 512), static_cast<std::size_t>(size));
    pos += 512 + (size + 511) / 512 * 512;
    if (type != '0' && type != 0) continue;  // pax headers, directories, links: no payload to run
    ++sink_.report().members;
    const std::string m = prefix + name;
    if (name == "pickle" || name == "sys_info") {
      scan_streams(body, m, depth, 0, 0, true);
    } else if (name == "storages" || name == "tensors") {
      // storages: pickle(count); per storage pickle((key, location, type)),
      // i64 count, raw bytes; then pickle(views). tensors: pickle(count);
      // per tensor pickle((key, storage_id, type)), i32 ndim, 4 bytes,
      // ndim*i64 sizes, ndim*i64 strides, i64 offset.
      std::uint64_t p = 0;
      int idx = 0;
      auto one = [&](RootInfo* info) -> StreamOutcome {
        StreamOutcome o = run_stream(body.subspan(static_cast<std::size_t>(p)), p, m, idx, depth, nullptr, info);
        if (o.status == StreamOutcome::kFailed) add_error(o.error, m, idx, p, kIncompleteWhy);
        ++idx;
        p += o.end;
        return o;
      };
      RootInfo head;
      StreamOutcome first = one(&head);
      if (first.status == StreamOutcome::kFailed) continue;
      if (!head.int_value || *head.int_value < 0 ||
          static_cast<std::uint64_t>(*head.int_value) > opt_.limits.max_legacy_storages) {
        add(Rule::kMalformed, Severity::kHigh, m, "tar '" + name + "' does not start with a storage/tensor count",
            kIncompleteWhy, 0, 0);
        continue;
      }
      std::int64_t n = *head.int_value;
      bool bad = false;
      for (std::int64_t k = 0; k < n && !bad; ++k) {
        if (p >= body.size()) {
          bad = true;
          break;
        }
        std::uint64_t rec_start = p;
        RootInfo rec;
        StreamOutcome o = one(&rec);
        if (o.status == StreamOutcome::kFailed) {
          bad = true;
          break;
        }
        if (name == "storages") {
          // Element size from the storage type in the tuple (third item).
          std::uint32_t esz = 0;
          if (!rec.third_global.empty()) {
            std::string_view cls = rec.third_global;
            if (auto d = dtype_from_storage_class(cls.substr(cls.rfind('.') + 1))) esz = dtype_size(*d);
          }
          if (esz == 0 || body.size() - p < 8) {
            add(Rule::kMalformed, Severity::kHigh, m, "tar storage record without a known storage type or size",
                kIncompleteWhy, rec_start);
            bad = true;
            break;
          }
          std::uint64_t cnt = 0;
          for (int b = 7; b >= 0; --b)
            cnt = (cnt << 8) | body[static_cast<std::size_t>(p) + static_cast<std::size_t>(b)];
          p += 8;
          if (cnt > (body.size() - p) / esz) {
            add(Rule::kMalformed, Severity::kHigh, m, "tar storage declares more bytes than remain", kIncompleteWhy,
                p - 8);
            bad = true;
            break;
          }
          p += cnt * esz;
        } else {
          if (body.size() - p < 8) {
            bad = true;
            break;
          }
          std::uint32_t ndim = 0;
          for (int b = 3; b >= 0; --b)
            ndim = (ndim << 8) | body[static_cast<std::size_t>(p) + static_cast<std::size_t>(b)];
          p += 8;
          if (ndim > opt_.limits.max_tensor_rank || (2ull * ndim + 1) * 8 > body.size() - p) {
            add(Rule::kMalformed, Severity::kHigh, m, "tar tensor record with a bad rank", kIncompleteWhy, p - 8);
            bad = true;
            break;
          }
          p += (2ull * ndim + 1) * 8;
        }
      }
      if (bad) continue;
      if (name == "storages" && p < body.size()) {
        StreamOutcome o = one(nullptr);  // the views list
        if (o.status == StreamOutcome::kFailed) continue;
      }
      if (p < body.size()) scan_streams(body, m, depth, p, idx, true);
    } else {
      Bytes b = body;
      if (sniff_format(b) != FileFormat::kUnknown) dispatch(b, m, depth + 1, false);
    }
  }
  add(Rule::kMalformed, Severity::kHigh, member, "tar archive is truncated (no end-of-archive marker)", kIncompleteWhy,
      pos);
}

// ---- numpy -------------------------------------------------------------------

void Scanner::scan_npy(Bytes data, const std::string& member, int depth) {
  // numpy/lib/format.py: magic, major, minor, header_len (u16 v1, u32 v2/3), header text.
  if (data.size() < 10) {
    add(Rule::kMalformed, Severity::kHigh, member, "numpy .npy header truncated", kIncompleteWhy, 0);
    return;
  }
  const int major = data[6];
  std::uint64_t hlen = 0, start = 0;
  if (major == 1) {
    hlen = data[8] | (static_cast<std::uint64_t>(data[9]) << 8);
    start = 10;
  } else if (major == 2 || major == 3) {
    if (data.size() < 12) {
      add(Rule::kMalformed, Severity::kHigh, member, "numpy .npy header truncated", kIncompleteWhy, 0);
      return;
    }
    for (int b = 3; b >= 0; --b) hlen = (hlen << 8) | data[8 + static_cast<std::size_t>(b)];
    start = 12;
  } else {
    add(Rule::kUnsupported, Severity::kMedium, member, "numpy .npy format version " + std::to_string(major),
        kIncompleteWhy, 6);
    return;
  }
  if (hlen > data.size() - start) {
    add(Rule::kMalformed, Severity::kHigh, member, "numpy .npy header longer than the file", kIncompleteWhy, 8);
    return;
  }
  std::string header(reinterpret_cast<const char*>(data.data() + start), static_cast<std::size_t>(hlen));
  const std::uint64_t body = start + hlen;
  // The descr value: a quoted type string or a list of fields. Any field
  // type with kind 'O' makes numpy pickle the array.
  auto dpos = header.find("'descr'");
  if (dpos == std::string::npos) dpos = header.find("\"descr\"");
  if (dpos == std::string::npos) {
    add(Rule::kMalformed, Severity::kHigh, member, "numpy .npy header has no 'descr'", kIncompleteWhy, start);
    return;
  }
  auto fpos = header.find("'fortran_order'", dpos);
  auto spos = header.find("'shape'", dpos);
  std::size_t dend =
      std::min(fpos == std::string::npos ? header.size() : fpos, spos == std::string::npos ? header.size() : spos);
  std::string descr = header.substr(dpos + 7, dend - (dpos + 7));
  bool object = false;
  for (std::size_t i = 0; i < descr.size(); ++i) {
    char q = descr[i];
    if (q != '\'' && q != '"') continue;
    std::size_t j = descr.find(q, i + 1);
    if (j == std::string::npos) break;
    std::string tok = descr.substr(i + 1, j - i - 1);
    std::string_view t = tok;
    if (!t.empty() && (t[0] == '<' || t[0] == '>' || t[0] == '|' || t[0] == '=')) t.remove_prefix(1);
    if (!t.empty() && t[0] == 'O' && std::all_of(t.begin() + 1, t.end(), [](char c) { return c >= '0' && c <= '9'; }))
      object = true;
    i = j;
  }
  if (!object) return;  // plain numeric data: nothing to run
  add(Rule::kNumpyObject, Severity::kMedium, member,
      "numpy object array: its data is a pickle (numpy.load(allow_pickle=True) runs it)",
      "numpy refuses it by default (allow_pickle=False); its pickle is scanned below", body);
  if (body >= data.size()) {
    add(Rule::kMalformed, Severity::kHigh, member, "numpy object array without data", kIncompleteWhy, body);
    return;
  }
  scan_streams(data, member, depth, body, 0, true);
}

// ---- safetensors ---------------------------------------------------------------

// The library's own safetensors reader (include/safeckpt/safetensors.hpp:
// header cap, UTF-8, duplicate keys, known dtypes, overflow-checked sizes,
// tensors tiling the data section exactly) — the parser the loader uses.
void Scanner::scan_safetensors(Bytes data, const std::string& member) {
  SafetensorsOptions so;
  so.limits = opt_.limits;
  auto r = SafetensorsFile::parse(data, so);
  if (r) return;
  const Error& e = r.error();
  Finding f;
  f.rule = e.code() == ErrorCode::kLimitExceeded ? Rule::kLimit : Rule::kSafetensors;
  f.severity = Severity::kMedium;
  f.member = member;
  f.offset = e.where().offset;
  f.message = "safetensors: " + std::string(error_code_name(e.code())) + ": " + e.message();
  f.why =
      "safetensors readers disagree on invalid files (duplicate keys, overlaps and gaps can hide data); the "
      "file is not clean";
  sink_.add(std::move(f));
}

}  // namespace

// ---- entry points ---------------------------------------------------------------

FileReport scan_bytes(Bytes data, std::string_view name, const ScanOptions& options) {
  FileReport rep;
  rep.path = std::string(name);
  const Allowlist& allow = options.allowlist != nullptr ? *options.allowlist : Allowlist::default_policy();
  Scanner s(options, allow, rep);
  try {
    s.scan_top(data);
  } catch (const std::bad_alloc&) {
    Finding f;
    f.rule = Rule::kLimit;
    f.message = "out of memory while scanning";
    f.why = kIncompleteWhy;
    rep.findings.push_back(std::move(f));
  } catch (const std::exception& e) {
    Finding f;
    f.rule = Rule::kMalformed;
    f.message = std::string("internal error while scanning: ") + e.what();
    f.why = kIncompleteWhy;
    rep.findings.push_back(std::move(f));
  }
  s.finish();
  return rep;
}

FileReport scan_file(const std::filesystem::path& path, const ScanOptions& options) {
  auto mf = MappedFile::open(path);
  if (!mf) return unscanned_report(path.string(), mf.error().message());
  return scan_bytes(mf->bytes(), path.string(), options);
}

}  // namespace safeckpt::scan
