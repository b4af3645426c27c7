// Internal: the scanner's state and the helpers its per-format scans share.
// scan.cpp: entry points, dispatch by content, the loader's verdict, the
// summary; scan_streams.cpp: pickle streams (one machine run each);
// scan_zip.cpp: zip archives; scan_legacy.cpp: legacy sequential pickles and
// tar checkpoints; scan_npy.cpp: numpy .npy and safetensors.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "pickle_scan.hpp"
#include "safeckpt/allowlist.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/scan.hpp"
#include "safeckpt/value.hpp"
#include "safeckpt/zip.hpp"

namespace safeckpt::scan {

// Which verdict class a rule's finding puts a file in.
enum class Klass { kUnsafe, kIncomplete, kUnscannable, kNone };
Klass klass_of(const Finding& f);
// The finding rule for an error the scan could not get past.
Rule rule_for_error(ErrorCode c);
// Protocol-2+ opcodes that push a value: a pickle without PROTO can start
// with them (sniff_format only knows protocol 0/1 starts and PROTO).
bool can_start_pickle(Bytes b);
// Bytes per element of a storage class named in a persistent id
// (torch.FloatStorage, torch.storage.UntypedStorage = 1, ...); nullopt when
// the name is no storage class the loader knows. scan_legacy.cpp.
std::optional<std::uint32_t> storage_element_size(std::string_view storage_class);

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

  // For reports made of several payloads (a DCP directory, scan_dcp.cpp):
  // scans `data` as one member (by content, as a nested payload), records a
  // refusal of the reader that decides the verdict as a kLoaderRefused
  // finding (the first one also fills FileReport::loader), and flushes the
  // report caps of a scanner whose report another scanner finishes.
  void scan_member(Bytes data, const std::string& member) { dispatch(data, member, 0, false); }
  void add_refusal(const Error& e, const std::string& member, std::string_view what = "this file");
  void flush() { sink_.finish(); }

 private:
  // Dispatch by content. `member` names where `data` lives ("" = the file).
  void dispatch(Bytes data, const std::string& member, int depth, bool top);
  void scan_zip(Bytes data, const std::string& member, int depth);
  // PT2 archive (scan_pt2.cpp): code records, then the engine's reader and
  // validator; fills `raw` with the records that hold raw tensor bytes.
  void scan_pt2(Bytes data, const ZipArchive& zip, const std::string& member, std::set<std::string>& raw);
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

// An exception out of a scan (std::bad_alloc on a huge part, or an internal
// error) as the report's last finding: the report stays, fails closed, and
// an unsafe verdict already earned stays unsafe. scan.cpp.
void add_exception_finding(FileReport& rep, const std::exception& e);

inline constexpr const char* kIncompleteWhy =
    "scan incomplete: bytes after this point were not examined, so the file "
    "cannot be called clean";

}  // namespace safeckpt::scan
