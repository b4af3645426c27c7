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
//  - PT2 archives (torch.export.save; the 2.6/2.7 flat layout too) are
//    judged by the engine (safeckpt/graph.hpp): each AOTInductor code record
//    is a critical kExecutableCode finding; otherwise Pt2Archive::open and,
//    per model, graph::refusals() (the validator validate() runs) give the
//    findings (kPt2Op, kPt2Mutation, kPt2Refused, kMalformed, kLimit,
//    kUnsupported); FileReport::loader then holds the engine's verdict. A PT2
//    file is clean exactly when the engine accepts every program in it and
//    nothing else was found (scanner/src/scan_pt2.cpp);
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
#include "safeckpt/sign.hpp"

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
  // storage record shorter than numel x element size (CVE-2026-24747)
  kStorageOutOfBounds,
  // PT2 programs (torch.export archives), decided by the graph layer's
  // validator (safeckpt/graph.hpp refusals()):
  kPt2Op,        // op not allowlisted / custom namespace / higher-order (names op and node)
  kPt2Mutation,  // in-place update of an input or buffer, mutation output specs
  kPt2Refused,   // any other reason the engine refuses the program or archive
  // OpenSSF Model Signing (scan with a signature bundle; add_signature_findings):
  kSignatureNotVerified,  // bundle malformed, signature/key/chain/root digest fails, model not hashable
  kSignedFileChanged,     // a signed file's bytes differ from the bundle's digest
  kSignedFileMissing,     // a file the bundle signs is not in the model
  kUnsignedFile,          // a file of the model the bundle does not sign
  kSignatureVerified,     // info: the signature verifies / this file matches its signed digest
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
  // Set by apply_ignores(): an accepted finding (listed as suppressed in
  // JSON/SARIF, not counted in totals or the exit code). `suppression` names
  // the ignore-file line that matched ("FILE:LINE").
  bool suppressed = false;
  std::string suppression;
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
  // The file is a format safeckpt::load reads — or a PT2 archive, whose
  // verdict is the engine's (format "pt2_archive"; JSON "by": "engine").
  bool ran = false;
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
// Maps and scans one file. Unreadable -> unscanned_report(path, reason).
FileReport scan_file(const std::filesystem::path& path, const ScanOptions& options = {});

// The one shape of "this path was not scanned" (missing, permission denied, a
// directory that cannot be listed, a symlink loop, not a regular file, a read
// error): verdict kError, complete = false, format "unreadable", one kIo
// finding (severity high) whose message is `reason`. Every report format
// counts these (Totals::errors), names them, and makes the run exit 2; an
// ignore file can never suppress them (issue 11 item 4).
FileReport unscanned_report(std::string path, std::string reason);

// ---- torch.distributed.checkpoint directories (safeckpt/dcp.hpp) -----------
// A DCP directory (safeckpt::is_dcp_directory: a `.metadata` inside) is ONE
// report: path = the directory, format "dcp_directory", size = the bytes of
// `.metadata` and of the data files it names, members = `.metadata` plus the
// payloads examined. What is looked at:
//  - `.metadata` is scanned as a pickle (member ".metadata"); its imports are
//    listed against ScanOptions::allowlist plus the DCP reader's classes
//    (safeckpt::dcp_metadata_globals()). PyTorch unpickles it with
//    weights_only=False (FileSystemReader.read_metadata), so an import
//    outside that set runs on dcp.load: a finding like any other;
//  - DcpCheckpoint::open (ScanOptions::limits) checks the metadata, the
//    layout and the byte ranges;
//  - every tensor chunk and non-tensor item payload (a torch.save zip) is
//    scanned like a file, member "<data file>@<byte offset>" (nested members
//    after '!'), and read by DcpCheckpoint::load_chunk / load_bytes_item with
//    ScanOptions::allowlist (storage CRC only with verify_data).
//  - a data file holding several items is also scanned whole, as
//    torch.load(<data file>) would read it (the last zip end record with
//    absolute offsets, or the streams from byte 0), and every import, call
//    or code that view finds is a finding (member "<file> (read whole)!...").
// Every refusal of the DCP reader is an SCK180 finding (severity high for a
// policy refusal, which makes the report unsafe; else medium: incomplete);
// the first fills FileReport::loader (JSON "by": "dcp"). Clean exactly when
// the reader accepts the directory and every payload (what `safeckpt
// convert` and load_dcp need) and nothing else was found. `.metadata` that
// cannot be opened: unscanned_report (exit 2).
// A `.metadata` that was not read (a symlink: the reader opens it with
// O_NOFOLLOW) is SCK190, high: what PyTorch would unpickle was not examined.
// `covered` (optional) receives the paths the report speaks for: `.metadata`
// when its bytes were scanned, and every data file once the reader accepted
// the directory (it then checked that the items cover every byte of each).
// A refused directory covers no data file, and other entries (a stray
// pickle beside the checkpoint) are never covered: scan them as files, as
// scan_walk does.
FileReport scan_dcp_dir(const std::filesystem::path& dir, const ScanOptions& options = {},
                        std::vector<std::filesystem::path>* covered = nullptr);

// ---- signatures (OpenSSF Model Signing, safeckpt/sign.hpp) -----------------
// `safeckpt scan MODEL --signature BUNDLE (--public-key PEM | --certificate-chain PEM...)`:
// the model is verified against the bundle with sign::verify_model (the same
// code as `safeckpt verify`) and the outcome becomes findings beside the
// per-file parse findings:
//  - one report for the bundle itself (path = `bundle` as given, format
//    "oms_bundle", size in bytes): SCK204 (info) "signature verified" naming
//    the signer and the counts, or SCK200 (critical) when the bundle is
//    malformed, its signature, key, certificate chain, certificate validity
//    or root digest fails, or the model cannot be hashed (a symlink not
//    allowed, a file changing while hashed, ...: the message says which);
//    SCK202 (high) for each signed file missing from the model, `member` =
//    the resource name. Verdict kClean when every file verified, else kUnsafe.
//    A report the walk made for the same file (a model.sig inside the model)
//    is replaced by it. An unreadable bundle is unscanned_report (exit 2);
//  - on each file's own report (matched by path: `model` / resource path):
//    SCK201 (critical) changed bytes (one finding per changed shard, `member`
//    = the shard's resource name), SCK203 (medium) a file the bundle does not
//    sign (not reported with VerifyOptions::ignore_unsigned_files), SCK204
//    (info) verified. A clean or not_model file with SCK201/SCK203 becomes
//    kUnsafe. The files a torch.distributed.checkpoint directory's report
//    covers (`model` itself a DCP directory, scan_dcp_dir) get theirs on
//    that report, `member` = the file's path in the model. A resource with
//    no report of its own (excluded from the walk) is reported on the
//    bundle's report with `member` = its name.
// Fail closed: SCK200-SCK203 findings that are not suppressed make the exit
// code at least 1 whatever ReportOptions::fail_on is, and SCK200 cannot be
// ignored (parse_ignore refuses it, as SCK190).
struct SignatureCheck {
  std::filesystem::path model;   // the signed model: a directory or a single file
  std::filesystem::path bundle;  // the signature file (model.sig)
  sign::Trust trust;             // key or CA chain (sign::trust_from_*_file)
  // ignore_paths (relative to the model root), ignore_unsigned_files,
  // threads, limits; signature_path is set to `bundle`.
  sign::VerifyOptions verify;
};
// Verifies and adds the findings above to `reports` (appends the bundle's
// report, changes verdicts). Returns true when the model verified.
bool add_signature_findings(std::vector<FileReport>& reports, const SignatureCheck& check);
// True for the rules that fail a run whatever --fail-on says (SCK200-SCK203).
bool is_signature_failure(Rule r) noexcept;

// ---- many paths ------------------------------------------------------------
struct WalkOptions {
  bool follow_symlinks = false;      // inside directories (named paths are always followed)
  std::vector<std::string> include;  // fnmatch globs; a found file must match one (if any given)
  std::vector<std::string> exclude;  // fnmatch globs; a found file matching one is skipped
};
// Expands paths: files as given, directories recursively (sorted, stable).
// Globs are matched against the path relative to the named directory and
// against the base name; they filter files found in directories only (a file
// named on the command line is always scanned). Paths that do not exist, are
// not a regular file or directory when named, cannot be stat'ed (symlink loop)
// or cannot be listed come back in `errors`: turn each into
// unscanned_report() so that it is counted. `skipped` are entries found in a
// directory and deliberately not scanned (symlinks without follow_symlinks, a
// directory already visited, special files): listed in every report, they do
// not change the exit code.
struct PathProblem {
  std::string path;
  std::string reason;  // strerror text or why it was skipped
};
struct WalkResult {
  std::vector<std::filesystem::path> files;
  // DCP directories (safeckpt::is_dcp_directory): a named directory, or one
  // found whose path passes the globs as a file's would. Their entries are
  // in `files` too (scan_walk leaves out those a DCP report covers).
  std::vector<std::filesystem::path> dcp_dirs;
  // The regular files named as paths (also in `files`): never left out.
  std::vector<std::filesystem::path> named_files;
  std::vector<PathProblem> errors;
  std::vector<PathProblem> skipped;
};
WalkResult expand_paths(const std::vector<std::filesystem::path>& paths, const WalkOptions& options);

// Called before each scan of scan_walk: (1-based index, total, path). The
// total counts the files a DCP report may still cover while DCP directories
// are scanned, then the exact number.
using ScanProgress = std::function<void(std::size_t index, std::size_t total, const std::string& path)>;
// Scans what expand_paths found: every DCP directory once (scan_dcp_dir;
// the same directory named twice, `d` and `d/`, once), then every file no
// DCP report covers and every named file (scan_file), then one
// unscanned_report per walk error, in that order. `safeckpt scan` is this.
std::vector<FileReport> scan_walk(const WalkResult& walk, const ScanOptions& options = {},
                                  const ScanProgress& progress = {});

// ---- accepted findings (ignore file) ---------------------------------------
// One line of an ignore file: `PATH_GLOB RULE`. RULE is a rule id ("SCK102")
// or name ("import-not-allowlisted"), the last whitespace-separated word;
// PATH_GLOB is the rest of the line (trimmed; may contain spaces), an
// fnmatch(3) glob without FNM_PATHNAME (so `*` also matches `/`), matched
// against the report path as given/found (a leading "./" dropped) and against
// the path relative to ReportOptions::base_dir. `#` starts a comment; blank
// lines are ignored. SCK190 (io-error) is refused: a path or member that could
// not be read is never accepted into a clean run; so is SCK200
// (signature-not-verified): a signature that does not verify never is.
struct IgnoreRule {
  std::string path_glob;
  Rule rule = Rule::kMalformed;
  std::string source;  // "FILE:LINE", copied into Finding::suppression
};
// Errors: kInvalidArgument (a line without a rule, an unknown rule, SCK190),
// naming `source` and the line number.
Result<std::vector<IgnoreRule>> parse_ignore(std::string_view text, std::string_view source);
// Reads (at most 1 MiB) and parses a file. Errors: kIo, kInvalidArgument.
Result<std::vector<IgnoreRule>> read_ignore_file(const std::filesystem::path& path);

// ---- reports ---------------------------------------------------------------
// "file://" + the absolute path `path`, percent-encoded as SARIF locations
// are (RFC 3986: unreserved characters and '/' as they are, every other byte
// as %XX). `path` must be absolute.
std::string file_uri(const std::string& path);

struct ReportOptions {
  // Exit code 1 only for a finding (not suppressed) at or above this severity.
  // Default kLow: every finding except info notes, i.e. exactly the files
  // whose verdict is not clean/not_model (the behaviour before --fail-on).
  Severity fail_on = Severity::kLow;
  // Written as tool.version (JSON) and tool.driver.version (SARIF); omitted
  // when empty. The CLI fills it (cli/scan.cpp, kToolVersion).
  std::string tool_version;
  // SARIF tool.driver.informationUri (an absolute URI: where the tool is
  // documented); omitted when empty.
  std::string information_uri;
  // SARIF helpUri of every rule (an absolute URI: where the rules are
  // documented). Empty: `information_uri + "/blob/main/scanner/README.md#rules"`
  // when information_uri is an http(s) project URL (the layout of the
  // repository), else omitted. The CLI (cli/scan.cpp) passes either the CMake
  // cache variable SAFECKPT_PROJECT_URL, or file: URIs of the installed
  // documentation (<prefix>/share/doc/safeckpt/README.md and scan.md, which is
  // scanner/README.md), or of the source tree's for the binary in its build
  // tree; nothing when none of them exists (no made-up address).
  std::string rules_uri;
  // Directory that SARIF's %SRCROOT% stands for (absolute; the CLI uses the
  // current directory or --base). Paths under it are written relative to it
  // with uriBaseId %SRCROOT%; others as absolute file:// URIs. Empty: paths
  // are written as given, relative ones with uriBaseId %SRCROOT% left for the
  // consumer to resolve. Also a second match target for ignore globs.
  std::string base_dir;
  // Entries deliberately not scanned (WalkResult::skipped): listed in every
  // format (SARIF: notifications of level "note"), never counted as errors.
  std::vector<PathProblem> skipped;
  // Text: list not_model files one by one, info findings and every event.
  bool verbose = false;
  // Text: ANSI colours for verdicts and severities.
  bool color = false;
};

// Marks findings matched by `rules` as suppressed (never those of a kError
// report, whose path was not scanned). Returns how many were suppressed.
std::uint64_t apply_ignores(std::vector<FileReport>& reports, const std::vector<IgnoreRule>& rules,
                            const std::string& base_dir = {});

struct Totals {
  std::uint64_t files = 0, clean = 0, unsafe = 0, incomplete = 0, unscannable = 0, not_model = 0;
  std::uint64_t errors = 0;                        // reports with verdict kError: paths not scanned
  std::uint64_t findings = 0;                      // not suppressed, not info
  std::uint64_t suppressed = 0;                    // suppressed by an ignore rule (info excluded)
  std::uint64_t failing = 0;                       // >= ReportOptions::fail_on or a signature failure; not suppressed
  std::uint64_t skipped = 0;                       // ReportOptions::skipped
  std::uint64_t by_severity[5] = {0, 0, 0, 0, 0};  // not suppressed; index = Severity
};
Totals totals(const std::vector<FileReport>& reports, const ReportOptions& options = {});

// 2: any path not scanned (a kError report) or no report at all (nothing to
// scan); else 1: any finding not suppressed at or above options.fail_on, or
// any signature failure (is_signature_failure) not suppressed; else 0. The JSON summary's exit_code and SARIF's
// invocation exitCode are this value, and the CLI exits with it (usage errors are 2 too).
int exit_code(const std::vector<FileReport>& reports, const ReportOptions& options = {});

// Human summary: per file verdict, loader verdict and findings with
// where/what/why (each text once), paths not scanned; totals last.
void write_text(std::ostream& out, const std::vector<FileReport>& reports, const ReportOptions& options = {});
inline void write_text(std::ostream& out, const std::vector<FileReport>& reports, bool verbose) {
  ReportOptions o;
  o.verbose = verbose;
  write_text(out, reports, o);
}
// JSON report (schema in scanner/README.md, version kJsonSchemaVersion).
std::string to_json(const std::vector<FileReport>& reports, const ReportOptions& options = {});
// SARIF 2.1.0 (validated against the OASIS schema in tests/data/sarif/) for
// GitHub code scanning: one run, invocations[0] says whether every path was
// scanned (executionSuccessful, exitCode, one error notification per path
// not scanned, note notifications for skipped entries).
std::string to_sarif(const std::vector<FileReport>& reports, const ReportOptions& options = {});

}  // namespace safeckpt::scan
