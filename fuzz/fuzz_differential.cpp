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
// Option byte: bit 0 extended allowlist; bit 1 verify storage CRCs (loader
// verify_storage_crc = scanner verify_data); bits 2-3 max_nesting.
#include <cstdint>
#include <string>

#include "fuzz_allowlists.hpp"
#include "fuzz_util.hpp"
#include "safeckpt/checkpoint.hpp"
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
    bool only_deeper = true;
    for (const auto& f : full.findings) only_deeper = only_deeper && f.rule == scan::Rule::kEmbeddedPayload;
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
