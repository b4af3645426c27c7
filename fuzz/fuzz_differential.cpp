// fuzz/fuzz_differential.cpp — the loader and the scanner must agree
// (STYLE.md "the loader and the scanner agree on every file"; scan.hpp: a file
// is clean only if load() accepts it and nothing else was found).
//
// Each input is loaded with safeckpt::load_bytes and scanned twice with the
// same Limits and Allowlist: once as `safeckpt scan` does (run_loader on) and
// once with the scanner's own machinery only (run_loader off). Aborts when:
//  1. the loader accepts but the scanner does not say clean (the only
//     documented exception: kEmbeddedPayload, byte strings the scanner
//     follows deliberately and the loader keeps as inert bytes);
//  2. the scanner says clean but the loader refuses (with the loader on this
//     is the scanner's own definition; for formats the loader does not read,
//     the loader must refuse with a non-policy code);
//  3. the scanner's machinery alone says clean but the loader refuses on
//     POLICY (disallowed global/operation): the scanner missed something;
//  4. the loader accepts but the scanner's machinery reports an import, call
//     or refused opcode/operation: the scanner flags what the policy allows;
//  5. the scanner's embedded loader result differs from load_bytes;
//  6. any kInternal.
// A PT2 archive (format pt2_archive) is judged by the engine, not the loader
// (scan.hpp: FileReport::loader then holds the engine's verdict): the loader
// must refuse it without a policy code, the scanner's verdict must equal
// graph::Pt2Archive::open + graph::refusals of every model (same code when
// the reader fails), and "clean" must mean the engine accepts; (1)-(4)
// compare with the loader and do not apply.
// Option byte: bit 0 extended allowlist; bit 1 verify storage CRCs (loader
// verify_storage_crc = scanner verify_data); bits 2-3 max_nesting.
#include <cstdint>
#include <string>

#include "fuzz_allowlists.hpp"
#include "fuzz_util.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/graph.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/scan.hpp"

namespace sc = safeckpt;
namespace fz = safeckpt::fuzz;
namespace scan = safeckpt::scan;

namespace {

bool is_policy_rule(scan::Rule r) {
  switch (r) {
    case scan::Rule::kImportDangerous:
    case scan::Rule::kImportUnlisted:
    case scan::Rule::kImportDynamic:
    case scan::Rule::kImportDotted:
    case scan::Rule::kImportExtension:
    case scan::Rule::kCall:
    case scan::Rule::kRefusedOpcode:
    case scan::Rule::kRefusedOperation: return true;
    default: return false;
  }
}

std::string describe(const scan::FileReport& r) {
  std::string s = "verdict " + std::string(scan::verdict_name(r.verdict)) + ", format " + r.format + ", " +
                  std::to_string(r.findings.size()) + " findings";
  for (std::size_t i = 0; i < r.findings.size() && i < 3; ++i) {
    const auto& f = r.findings[i];
    s += "\n      [" + std::string(scan::rule_info(f.rule).id) + " " + std::string(scan::rule_info(f.rule).name) +
         "] " + f.message + (f.member.empty() ? "" : " (member " + f.member + ")");
  }
  if (r.loader.ran) s += "\n      scanner's loader: " + (r.loader.ok ? std::string("ok") : r.loader.message);
  return s;
}

// What the engine says of a PT2 archive: nullopt = accepted, else the
// reader's error code (kDisallowedOperation / kMalformed for a program the
// validator refuses: only accepted-or-not is compared then).
struct EngineVerdict {
  bool ok = false;
  bool reader_failed = false;
  sc::ErrorCode code = sc::ErrorCode::kInternal;
};

EngineVerdict engine_verdict(sc::Bytes data, const sc::Limits& limits) {
  safeckpt::graph::GraphLimits gl;
  gl.container = limits;
  EngineVerdict v;
  auto a = safeckpt::graph::Pt2Archive::open(data, gl);
  if (!a) {
    v.reader_failed = true;
    v.code = a.error().code();
    return v;
  }
  v.ok = true;
  for (const std::string& name : a->models()) {
    auto prog = a->program(name);
    FUZZ_REQUIRE(prog.has_value(), "Pt2Archive lists model '" + name + "' but has no program for it");
    safeckpt::graph::Program p = **prog;
    if (!safeckpt::graph::refusals(p, gl).empty()) v.ok = false;
  }
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const fz::Input in = fz::split_input(data, size);
  const sc::Limits limits = sc::fuzz_limits();
  const sc::Allowlist& allow = fz::pick_allowlist(in.bit(0));
  const bool verify = in.bit(1);

  sc::LoadOptions lo;
  lo.limits = limits;
  lo.allowlist = &allow;
  lo.verify_storage_crc = verify;
  const auto loaded = sc::load_bytes(in.data, lo);
  if (!loaded) {
    fz::check_error(loaded.error(),
                    {sc::ErrorCode::kMalformed, sc::ErrorCode::kLimitExceeded, sc::ErrorCode::kUnsupported,
                     sc::ErrorCode::kDisallowedGlobal, sc::ErrorCode::kDisallowedOperation},
                    "load_bytes");
  }
  const std::string load_text = loaded ? std::string("accepted") : loaded.error().to_string();

  scan::ScanOptions so;
  so.limits = limits;
  so.allowlist = &allow;
  so.verify_data = verify;
  so.max_nesting = (in.flags >> 2) & 3;
  so.keep_events = false;

  // As `safeckpt scan` runs.
  so.run_loader = true;
  const scan::FileReport full = scan::scan_bytes(in.data, "fuzz-input", so);
  if (full.format == "pt2_archive") {
    FUZZ_REQUIRE(!loaded, "the loader accepts what the scanner reads as a PT2 archive: scan " + describe(full));
    FUZZ_REQUIRE(!sc::is_policy_error(loaded.error().code()),
                 "the loader refuses a PT2 archive on policy: " + load_text);
    FUZZ_REQUIRE(full.loader.ran, "PT2 archive without the engine's verdict: scan " + describe(full));
    FUZZ_REQUIRE(full.loader.code != sc::ErrorCode::kInternal, "engine verdict kInternal " + full.loader.message);
    const EngineVerdict ev = engine_verdict(in.data, limits);
    FUZZ_REQUIRE(full.loader.ok == ev.ok,
                 "the scanner's PT2 verdict differs from the engine's: scan " + describe(full));
    if (ev.reader_failed)
      FUZZ_REQUIRE(full.loader.code == ev.code,
                   "the scanner's PT2 verdict has another code than the engine's reader: scan " + describe(full));
    FUZZ_REQUIRE(full.verdict != scan::Verdict::kClean || ev.ok,
                 "the scanner says a PT2 archive the engine refuses is clean: " + describe(full));
    return 0;
  }
  if (full.loader.ran) {
    FUZZ_REQUIRE(full.loader.code != sc::ErrorCode::kInternal, "scanner's loader: kInternal " + full.loader.message);
    FUZZ_REQUIRE(full.loader.ok == loaded.has_value(),
                 "(5) scanner's loader and load_bytes disagree: load_bytes " + load_text + "; scan " + describe(full));
    if (!loaded) {
      FUZZ_REQUIRE(
          full.loader.code == loaded.error().code(),
          "(5) scanner's loader failed with another code: load_bytes " + load_text + "; scan " + describe(full));
    }
  }
  if (loaded) {
    // Findings about byte strings inside the pickle (which the loader keeps
    // as bytes and never parses) do not contradict the loader: a payload with
    // findings of its own, or one not examined because it lies deeper than
    // max_nesting (an "incomplete" SCK161, fuzz finding 13).
    bool only_deeper = true;
    for (const auto& f : full.findings)
      only_deeper =
          only_deeper &&
          (f.rule == scan::Rule::kEmbeddedPayload ||
           (f.rule == scan::Rule::kLimit && f.message.find("nested deeper than max_nesting") != std::string::npos));
    FUZZ_REQUIRE(full.verdict == scan::Verdict::kClean || (only_deeper && !full.findings.empty()),
                 "(1) loader accepts, scanner says " + describe(full));
  }
  if (full.verdict == scan::Verdict::kClean && !loaded) {
    FUZZ_REQUIRE(!sc::is_policy_error(loaded.error().code()) && !full.loader.ran,
                 "(2) scanner says clean, loader refuses: " + load_text + "; scan " + describe(full));
  }

  // The scanner's machinery alone.
  so.run_loader = false;
  const scan::FileReport own = scan::scan_bytes(in.data, "fuzz-input", so);
  if (own.verdict == scan::Verdict::kClean && !loaded) {
    FUZZ_REQUIRE(
        !sc::is_policy_error(loaded.error().code()),
        "(3) scanner machinery says clean, loader refuses on policy: " + load_text + "; scan " + describe(own));
  }
  if (loaded) {
    for (const auto& f : own.findings) {
      FUZZ_REQUIRE(!is_policy_rule(f.rule), "(4) loader accepts, scanner machinery reports " + describe(own));
    }
  }
  return 0;
}
