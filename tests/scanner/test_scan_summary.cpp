// Issue 12: a whole-module torch.save(model) says that it needs globals
// outside the weights-only set, and which, apart from files that import
// known-dangerous callables (real files of both corpora).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "safeckpt/scan.hpp"

namespace fs = std::filesystem;
using safeckpt::scan::Rule;
using safeckpt::scan::Severity;
using safeckpt::scan::Verdict;

namespace {
const fs::path kCorpus = fs::path(SAFECKPT_TEST_DATA) / "corpus";

std::string dump(const safeckpt::scan::FileReport& r) {
  std::string s;
  for (const auto& f : r.findings) s += f.message + " | " + f.why + "\n";
  return s;
}
}  // namespace

TEST_CASE("scan summary: a whole nn.Module needs globals outside the weights-only set (and says which)") {
  for (const char* dir : {"torch-2.11", "torch-1.13"}) {
    INFO(dir);
    auto r = safeckpt::scan::scan_file(kCorpus / dir / "whole_module.pt");
    INFO(dump(r));
    CHECK(r.verdict == Verdict::kUnsafe);
    REQUIRE_FALSE(r.findings.empty());
    const auto& head = r.findings.front();
    CHECK(head.rule == Rule::kImportUnlisted);
    CHECK(head.severity == Severity::kMedium);
    CHECK(head.message.find("outside PyTorch's weights-only set: ") != std::string::npos);
    // the corpus README: refused on torch.nn.modules.linear.Linear
    CHECK(head.message.find("torch.nn.modules.linear.Linear") != std::string::npos);
    CHECK(head.message.find("nothing known-dangerous was found") != std::string::npos);
    CHECK(head.why.find("torch.save(model)") != std::string::npos);
  }
}

TEST_CASE("scan summary: known-dangerous imports are headlined as code execution, not as missing globals") {
  struct Case {
    const char* file;
    const char* global;
  };
  for (const Case& c : {Case{"mal_os_system.pt", "os.system"}, Case{"mal_builtins_eval.pt", "builtins.eval"},
                        Case{"mal_functools_partial.pt", "functools.partial"}}) {
    INFO(c.file);
    auto r = safeckpt::scan::scan_file(kCorpus / "torch-2.11" / c.file);
    INFO(dump(r));
    CHECK(r.verdict == Verdict::kUnsafe);
    REQUIRE_FALSE(r.findings.empty());
    const auto& head = r.findings.front();
    CHECK(head.rule == Rule::kImportDangerous);
    CHECK(head.severity == Severity::kCritical);
    CHECK(head.message.find("tries to run code") != std::string::npos);
    CHECK(head.message.find(c.global) != std::string::npos);
    CHECK(head.message.find("weights-only set") == std::string::npos);
  }
  // A clean file gets no headline.
  auto clean = safeckpt::scan::scan_file(kCorpus / "torch-2.11" / "mlp_state_dict.pt");
  CHECK(clean.verdict == Verdict::kClean);
  CHECK(clean.findings.empty());
}
