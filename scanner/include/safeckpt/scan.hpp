// safeckpt/scan.hpp — the checkpoint auditor behind `safeckpt scan`.
//
// Reports every global a file imports and every call it makes, without
// executing anything, and decides "clean" with the very code the loader runs:
//  - the verdict of a file the loader reads (torch.save zip, legacy
//    sequential pickles, bare pickle) is safeckpt::load()'s: a file is clean
//    only if load() accepts it AND nothing else was found;
//  - the findings come from run_pickle() in scanner mode
//    (PickleOptions::continue_after_policy_error) over EVERY pickle: every
//    zip member that holds one, every legacy stream (also after the storage
//    data), every concatenated stream of a bare pickle, numpy object arrays,
//    and byte strings embedded in a pickle that are themselves pickles or
//    checkpoints (nested loaders), up to ScanOptions::max_nesting;
//  - imports are classified against the same Allowlist the loader uses
//    (allowed / not allowlisted); a catalogue of known-dangerous callables
//    (scanner/src/catalogue.cpp) only adds a category, a severity and an
//    explanation — the decision is always the allowlist.
//
// Fail closed: a parse error, limit hit, unreadable member, or a format the
// scanner cannot see into (gzip, 7z, ...) is a finding and marks the file
// "incomplete"/"unscannable", never clean. Files whose first bytes match no
// format that any loader path (torch.load, pickle.load, numpy.load) can start
// on — JSON, text, images — are "not_model": listed, not a finding.
//
// Deliberate difference from `safeckpt inspect`: storage records' CRC-32 is
// only checked with ScanOptions::verify_data (`--verify-data`), so the time a
// scan takes does not grow with tensor bytes (bench/scan_bench.cpp). Tensor
// bytes are inert data; PyTorch itself never checks their CRC. Pickle members
// are always CRC-checked.
//
// Public header of the safeckpt_scanner library (scanner/CMakeLists.txt).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/mapped_file.hpp"

namespace safeckpt::scan {

// Version of the JSON report schema (scanner/README.md). Bump on any
// incompatible change of field names or meanings.
inline constexpr int kJsonSchemaVersion = 1;

enum class Severity : std::uint8_t { kInfo, kLow, kMedium, kHigh, kCritical };
std::string_view severity_name(Severity s) noexcept;  // "info" ... "critical"

// Rule identifiers (stable: SARIF ruleId, JSON `rule`). See rules() for text.
enum class Rule : std::uint8_t {
  kImportDangerous,   // import of a known-dangerous callable, not allowlisted
  kImportUnlisted,    // import not in the allowlist
  kImportDynamic,     // STACK_GLOBAL with operands built at run time
  kImportDotted,      // dotted name that walks attributes
  kImportExtension,   // EXT1/2/4 extension-registry import
  kCall,              // REDUCE/NEWOBJ/NEWOBJ_EX/OBJ/INST/BUILD on a non-allowlisted callable
  kRefusedOpcode,     // opcode the loader never accepts (INST, OBJ, NEWOBJ_EX, EXTn, PERSID)
  kRefusedOperation,  // operation the weights-only rules refuse (SETITEM on a tensor, ...)
  kEmbeddedPayload,   // byte string inside a pickle that is itself a pickle/checkpoint with findings
  kExecutableCode,    // TorchScript code, PT2 native libraries / cubin
  kUnscannable,       // gzip/bzip2/xz/zstd/7z/rar/preview wrapper: cannot see inside
  kArchiveAnomaly,    // zip ambiguity (duplicate names, local/central mismatch, CRC, flags, ...)
  kMalformed,         // parse error: the rest of the stream was not examined
  kLimit,             // a Limits cap was hit: the rest was not examined
  kUnsupported,       // valid input the scanner/loader does not handle
  kTrailingData,      // bytes after the last stream / storage data
  kNumpyObject,       // numpy .npy object array (pickled payload)
  kSafetensors,       // safetensors header/offset anomaly
  kLoaderRefused,     // safeckpt::load() refused the file (the verdict)
  kIo,                // file or member could not be read
  kCount_
};
struct RuleInfo {
  Rule rule;
  std::string_view id;           // "SCK101"
  std::string_view name;         // "import-dangerous"
  std::string_view description;  // one line
  Severity default_severity;
};
const std::vector<RuleInfo>& rules();
const RuleInfo& rule_info(Rule r);

// One thing found. Location fields are empty / kNoOffset when unknown.
struct Finding {
  Rule rule = Rule::kMalformed;
  Severity severity = Severity::kHigh;
  std::string member;  // zip member, tar member or nested path ("data.pkl!embedded@120"); "" = file
  int stream = -1;     // 0-based pickle stream index within the member (-1 = n/a)
  std::uint64_t offset = ~std::uint64_t{0};  // byte offset within the stream/member (opcode position)
  std::string opcode;                        // pickle opcode name
  std::string global;                        // canonical "module.qualname" concerned, if any
  std::string category;                      // catalogue category ("exec", "process", ...), if any
  std::string message;                       // what
  std::string why;                           // why it matters / which copy PyTorch reads / how to allow
};

// Every import and call seen, allowed or not (the audit trail).
struct Event {
  enum class Type : std::uint8_t { kImport, kCall, kBuild };
  Type type;
  std::string member;
  int stream = 0;
  std::uint64_t offset = 0;
  std::string opcode;
  std::string name;      // canonical name ("<dynamic>", "<ext:N>", "result of X" for calls on values)
  bool allowed = false;  // in the allowlist (and not a blocked module)
};
std::string_view event_type_name(Event::Type t) noexcept;  // "import" / "call" / "build"

enum class Verdict : std::uint8_t {
  kClean,        // fully parsed, loader accepts (if a loader format), nothing found
  kUnsafe,       // imports/calls/code outside the allowlist, or the loader refused it on policy
  kIncomplete,   // parse error, limit, unreadable part: could not be fully examined
  kUnscannable,  // a wrapper the scanner cannot look into
  kNotModel,     // no loader path can start reading it (text, JSON, images, empty)
  kError,        // the path itself could not be read (exit code 2)
};
std::string_view verdict_name(Verdict v) noexcept;  // "clean", "unsafe", ...

struct LoaderResult {
  bool ran = false;  // the file is a format safeckpt::load reads
  bool ok = false;
  ErrorCode code = ErrorCode::kOk;
  std::string message;  // Error::message()
  std::string record;
  std::uint64_t offset = ~std::uint64_t{0};
  std::string opcode;
};

struct FileReport {
  std::string path;  // as given / found
  std::uint64_t size = 0;
  std::string format;  // file_format_name() of what was detected
  Verdict verdict = Verdict::kClean;
  bool complete = true;  // every byte that can be executed was examined
  LoaderResult loader;
  std::vector<Finding> findings;
  std::vector<Event> events;
  std::uint64_t pickle_streams = 0;  // streams parsed (all members, nested included)
  std::uint64_t members = 0;         // zip/tar members examined
};

struct ScanOptions {
  Limits limits;
  // Safe globals; nullptr = Allowlist::default_policy().
  const Allowlist* allowlist = nullptr;
  // Also run safeckpt::load() for the verdict of loader formats. Tests of the
  // scanner machinery alone may turn it off; the CLI never does.
  bool run_loader = true;
  // CRC-32 of storage records (tensor bytes) too; pickle members are always checked.
  bool verify_data = false;
  // Depth of embedded payloads followed (byte strings in a pickle that are
  // pickles/checkpoints, zip members that are zips): 0 = none.
  int max_nesting = 3;
  // Record every import/call in FileReport::events (false keeps only findings).
  bool keep_events = true;
};

// Scans bytes in memory; `name` is used as the report path.
FileReport scan_bytes(Bytes data, std::string_view name, const ScanOptions& options = {});
// Maps and scans one file. Unreadable -> verdict kError with a kIo finding.
FileReport scan_file(const std::filesystem::path& path, const ScanOptions& options = {});

// ---- many paths ------------------------------------------------------------
struct WalkOptions {
  bool follow_symlinks = false;      // inside directories (named paths are always followed)
  std::vector<std::string> include;  // fnmatch globs; a found file must match one (if any given)
  std::vector<std::string> exclude;  // fnmatch globs; a found file matching one is skipped
};
// Expands paths: files as given, directories recursively (sorted, stable).
// Globs are matched against the path relative to the named directory and
// against the base name; they filter files found in directories only (a file
// named on the command line is always scanned). Paths that do not exist or
// cannot be listed come back in `errors`.
struct WalkResult {
  std::vector<std::filesystem::path> files;
  std::vector<std::string> errors;   // "path: reason"
  std::vector<std::string> skipped;  // symlinks not followed, special files
};
WalkResult expand_paths(const std::vector<std::filesystem::path>& paths, const WalkOptions& options);

// ---- reports ---------------------------------------------------------------
struct Totals {
  std::uint64_t files = 0, clean = 0, unsafe = 0, incomplete = 0, unscannable = 0, not_model = 0, errors = 0;
  std::uint64_t findings = 0;
  std::uint64_t by_severity[5] = {0, 0, 0, 0, 0};
};
Totals totals(const std::vector<FileReport>& reports);

// 0: every file clean or not_model; 1: any finding; 2: any kError (or usage).
int exit_code(const std::vector<FileReport>& reports);

// Human summary: per file verdict, findings with where/what/why; totals.
void write_text(std::ostream& out, const std::vector<FileReport>& reports, bool verbose);
// JSON report (schema in scanner/README.md, version kJsonSchemaVersion).
std::string to_json(const std::vector<FileReport>& reports, const std::vector<std::string>& walk_errors = {});
// SARIF 2.1.0 for GitHub code scanning.
std::string to_sarif(const std::vector<FileReport>& reports);

}  // namespace safeckpt::scan
