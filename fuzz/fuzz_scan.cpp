// fuzz/fuzz_scan.cpp — the auditor (scanner/include/safeckpt/scan.hpp):
// scan_bytes over any bytes, then every report writer (text, JSON, SARIF),
// which print attacker-chosen names.
//
// Option byte: bit 0 verify_data; bits 1-2 max_nesting (0..3); bit 3
// keep_events off; bit 4 run_loader off; bit 5 extended allowlist; bit 6
// write the reports.
//
// Invariants: never a crash or an exception out of scan_bytes or a writer;
// findings/events within the sink caps; a "clean" verdict has no findings,
// is complete, and (with the loader on) the loader accepted the file; a
// loader that ran never returned kInternal; rule/verdict/severity values are
// in range; exit_code() agrees with the verdict.
#include <cstdint>
#include <sstream>
#include <string>

#include "fuzz_allowlists.hpp"
#include "fuzz_util.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/scan.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;
namespace scan = safeckpt::scan;

namespace fuzz_scan {

// Sink caps in scanner/src/pickle_scan.hpp (10000 findings, 100000 events)
// plus the "N more" note and findings added outside the sink.
constexpr std::size_t kMaxFindings = 10000 + 64;
constexpr std::size_t kMaxEvents = 100000 + 64;

void check_report(const scan::FileReport& r, const scan::ScanOptions& opt, std::size_t input_size) {
  FUZZ_REQUIRE(static_cast<unsigned>(r.verdict) <= static_cast<unsigned>(scan::Verdict::kError), "invalid verdict");
  FUZZ_REQUIRE(r.verdict != scan::Verdict::kError, "scan_bytes gave verdict error (only paths can fail to read)");
  FUZZ_REQUIRE(r.size == input_size,
               "report size " + std::to_string(r.size) + " != input " + std::to_string(input_size));
  FUZZ_REQUIRE(r.findings.size() <= kMaxFindings, std::to_string(r.findings.size()) + " findings (sink cap broken)");
  FUZZ_REQUIRE(r.events.size() <= kMaxEvents, std::to_string(r.events.size()) + " events (sink cap broken)");
  if (!opt.keep_events) FUZZ_REQUIRE(r.events.empty(), "events kept with keep_events off");
  for (const auto& f : r.findings) {
    FUZZ_REQUIRE(f.rule < scan::Rule::kCount_, "finding with an invalid rule");
    FUZZ_REQUIRE(static_cast<unsigned>(f.severity) <= static_cast<unsigned>(scan::Severity::kCritical),
                 "finding with an invalid severity");
    FUZZ_REQUIRE(!f.message.empty(),
                 "finding without a message (rule " + std::string(scan::rule_info(f.rule).id) + ")");
  }
  if (r.verdict == scan::Verdict::kClean) {
    FUZZ_REQUIRE(r.findings.empty(), "clean verdict with findings, first: " +
                                         (r.findings.empty() ? std::string() : r.findings.front().message));
    FUZZ_REQUIRE(r.complete, "clean verdict for an incompletely examined file");
    if (opt.run_loader && r.loader.ran) FUZZ_REQUIRE(r.loader.ok, "clean verdict although the loader refused the file");
  }
  if (r.loader.ran) {
    FUZZ_REQUIRE(r.loader.code != sc::ErrorCode::kInternal, "the loader returned kInternal: " + r.loader.message);
    FUZZ_REQUIRE(r.loader.ok == (r.loader.code == sc::ErrorCode::kOk), "loader.ok disagrees with loader.code");
  }
  const int ec = scan::exit_code({r});
  const bool quiet = r.verdict == scan::Verdict::kClean || r.verdict == scan::Verdict::kNotModel;
  FUZZ_REQUIRE(ec == (quiet ? 0 : 1) || (!quiet && ec == 2),
               "exit_code " + std::to_string(ec) + " for verdict " + std::string(scan::verdict_name(r.verdict)));
}

}  // namespace fuzz_scan

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fz::Input in = fz::split_input(data, size);
  scan::ScanOptions opt;
  opt.limits = sc::fuzz_limits();
  opt.verify_data = in.bit(0);
  opt.max_nesting = (in.flags >> 1) & 3;
  opt.keep_events = !in.bit(3);
  opt.run_loader = !in.bit(4);
  opt.allowlist = &fz::pick_allowlist(in.bit(5));
  const fz::HeapProbe heap;
  const scan::FileReport r = scan::scan_bytes(in.data, "fuzz-input", opt);
  heap.check(in.data.size(), "scan_bytes");
  fuzz_scan::check_report(r, opt, in.data.size());
  if (in.bit(6)) {
    std::ostringstream text;
    scan::write_text(text, {r}, true);
    const std::string json = scan::to_json({r});
    const std::string sarif = scan::to_sarif({r});
    FUZZ_REQUIRE(!json.empty() && !sarif.empty(), "empty JSON/SARIF report");
  }
  return 0;
}
