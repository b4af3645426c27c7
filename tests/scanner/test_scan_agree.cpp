// The loader and the scanner agree on what a pickle may do with every
// allowlisted global (STYLE.md "the loader and the scanner agree on every
// file"; fuzz/fuzz_differential.cpp's invariants 1-4, here over the whole
// class instead of random inputs). Fuzz finding 2026-12-04: a REDUCE of
// torch.per_tensor_affine (a qscheme value, not a callable) scanned clean
// while the loader refused it on policy (fuzz/regressions/differential/
// scanner_clean_reduce_of_a_qscheme).
//
// For every entry of the default allowlist and of one with user entries
// (add_safe_globals: a generic class and `= known` aliases), each global is
// called with REDUCE and NEWOBJ, used as a BUILD target and as a value;
// plus BUILD on every kind of plain value.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/checkpoint.hpp"
#include "test_scan_helpers.hpp"

using namespace scantest;
using safeckpt::scan::Rule;
using safeckpt::scan::Verdict;

namespace {

const Buf kNewObj = "\x81";
const Buf kBuild = "b";
const Buf kEmptyList = "]";

bool is_policy_rule(Rule r) {
  switch (r) {
    case Rule::kImportDangerous:
    case Rule::kImportUnlisted:
    case Rule::kImportDynamic:
    case Rule::kImportDotted:
    case Rule::kImportExtension:
    case Rule::kCall:
    case Rule::kRefusedOpcode:
    case Rule::kRefusedOperation: return true;
    default: return false;
  }
}

// "" when the loader and both scans agree, else what went wrong.
std::string disagreement(const Buf& pickle, const safeckpt::Allowlist& allow) {
  safeckpt::LoadOptions lo;
  lo.allowlist = &allow;
  const auto loaded = safeckpt::load_bytes(span(pickle), lo);
  const std::string load_text = loaded ? std::string("accepted") : loaded.error().to_string();
  safeckpt::scan::ScanOptions so;
  so.allowlist = &allow;
  so.run_loader = true;
  const auto full = scan(pickle, so);
  if (loaded && full.verdict != Verdict::kClean) return "(1) loader accepts, scan says\n" + dump(full);
  if (!loaded && full.verdict == Verdict::kClean) return "(2) scan clean, loader: " + load_text;
  so.run_loader = false;
  const auto own = scan(pickle, so);
  if (!loaded && own.verdict == Verdict::kClean && safeckpt::is_policy_error(loaded.error().code()))
    return "(3) scanner machinery clean, loader refuses on policy: " + load_text;
  if (loaded)
    for (const auto& f : own.findings)
      if (is_policy_rule(f.rule)) return "(4) loader accepts, scanner machinery reports\n" + dump(own);
  return "";
}

Buf global_of(const std::string& qualname) {
  const auto dot = qualname.rfind('.');
  return global(qualname.substr(0, dot), qualname.substr(dot + 1));
}

// Every way a pickle uses global `g` that this test tries.
std::vector<std::pair<std::string, Buf>> uses_of(const std::string& g) {
  const Buf G = global_of(g);
  return {
      {"the global as the value", proto(2) + G + kStop},
      {"REDUCE with no arguments", proto(2) + G + kEmptyTuple + kReduce + kStop},
      {"NEWOBJ with no arguments", proto(2) + G + kEmptyTuple + kNewObj + kStop},
      {"BUILD on the global", proto(2) + G + kEmptyDict + kBuild + kStop},
      {"BUILD {} on REDUCE's result", proto(2) + G + kEmptyTuple + kReduce + kEmptyDict + kBuild + kStop},
      {"BUILD [] on REDUCE's result", proto(2) + G + kEmptyTuple + kReduce + kEmptyList + kBuild + kStop},
      {"BUILD {1: 1} on REDUCE's result",
       proto(2) + G + kEmptyTuple + kReduce + kEmptyDict + binint1(1) + binint1(1) + kSetItem + kBuild + kStop},
      {"BUILD {} on NEWOBJ's result", proto(2) + G + kEmptyTuple + kNewObj + kEmptyDict + kBuild + kStop},
  };
}

safeckpt::Allowlist with_user_entries() {
  safeckpt::Allowlist a = safeckpt::Allowlist::default_policy();
  for (auto [name, as] : std::vector<std::pair<const char*, const char*>>{
           {"agree.Obj", ""},
           {"agree.OD", "collections.OrderedDict"},
           {"agree.Rebuild", "torch._utils._rebuild_tensor_v2"},
           {"agree.Sub", "torch.Tensor"},
           {"agree.Param", "torch.nn.parameter.Parameter"},
           {"agree.Dtype", "torch.float32"},
           {"agree.QScheme", "torch.per_tensor_affine"},
           {"builtins.slice", ""},
           {"builtins.frozenset", ""},
           // allowlist/numpy.allow, argparse.allow, dtensor.allow (as fuzz/fuzz_allowlists.hpp).
           {"numpy._core.multiarray._reconstruct", ""},
           {"numpy._core.multiarray.scalar", ""},
           {"numpy.ndarray", ""},
           {"numpy.dtype", ""},
           {"argparse.Namespace", ""},
           {"torch.distributed.tensor.DTensor", ""},
           {"torch.distributed.tensor._dtensor_spec.DTensorSpec", ""},
           {"torch.distributed.tensor.placement_types.Shard", ""},
       }) {
    auto st = a.add(name, as, "test");
    REQUIRE_MESSAGE(st.has_value(), st.error().to_string());
  }
  return a;
}

void check_every_use(const safeckpt::Allowlist& allow) {
  int checked = 0;
  for (const safeckpt::AllowEntry& e : allow.entries()) {
    for (const auto& use : uses_of(e.name)) {
      const std::string& what = use.first;
      const std::string d = disagreement(use.second, allow);
      CHECK_MESSAGE(d.empty(), e.name << ", " << what << ": " << d);
      ++checked;
    }
  }
  CHECK(checked >= 8 * 40);  // the default set has more than 40 entries
}

}  // namespace

TEST_CASE("scan agrees with the loader on REDUCE/NEWOBJ/BUILD of every default allowlist entry") {
  check_every_use(safeckpt::Allowlist::default_policy());
}

TEST_CASE("scan agrees with the loader on REDUCE/NEWOBJ/BUILD of user allowlist entries and aliases") {
  check_every_use(with_user_entries());
}

TEST_CASE("scan agrees with the loader on BUILD of plain values and on OrderedDict state") {
  const safeckpt::Allowlist& allow = safeckpt::Allowlist::default_policy();
  const Buf od = global("collections", "OrderedDict") + kEmptyTuple + kReduce;
  const std::vector<std::pair<std::string, Buf>> cases = {
      {"BUILD on a dict", proto(2) + kEmptyDict + kEmptyDict + kBuild + kStop},
      {"BUILD on a list", proto(2) + kEmptyList + kEmptyDict + kBuild + kStop},
      {"BUILD on a tuple", proto(2) + kEmptyTuple + kEmptyDict + kBuild + kStop},
      {"BUILD on an int", proto(2) + binint1(1) + kEmptyDict + kBuild + kStop},
      {"BUILD on a str", proto(2) + binunicode("s") + kEmptyDict + kBuild + kStop},
      {"OrderedDict BUILD with a list state", proto(2) + od + kEmptyList + kBuild + kStop},
      {"OrderedDict BUILD with an int key",
       proto(2) + od + kEmptyDict + binint1(1) + binint1(1) + kSetItem + kBuild + kStop},
      {"OrderedDict BUILD with a str key",
       proto(2) + od + kEmptyDict + binunicode("_metadata") + kEmptyDict + kSetItem + kBuild + kStop},
  };
  for (const auto& c : cases) {
    const std::string& what = c.first;
    const std::string d = disagreement(c.second, allow);
    CHECK_MESSAGE(d.empty(), what << ": " << d);
  }
}

TEST_CASE("scan: REDUCE of a qscheme inside a legacy file (the fuzz finding) is not clean") {
  // torch.per_tensor_affine() is a value, not a callable: the loader refuses
  // the call, so the scanner's own walk must report it.
  safeckpt::scan::ScanOptions so;
  so.run_loader = false;
  const auto r = scan(proto(2) + global("torch", "per_tensor_affine") + kEmptyTuple + kReduce + kStop, so);
  INFO(dump(r));
  CHECK(r.verdict != Verdict::kClean);
  CHECK(has(r, Rule::kCall, "torch.per_tensor_affine"));
}

TEST_CASE("scan: refused calls and BUILDs of allowlisted names are listed as not allowed (scan --verbose)") {
  safeckpt::scan::ScanOptions so;
  so.run_loader = false;
  auto event_allowed = [](const safeckpt::scan::FileReport& r, const std::string& opcode) {
    for (const auto& e : r.events)
      if (e.opcode == opcode) return e.allowed ? 1 : 0;
    return -1;  // not listed
  };
  const auto call = scan(proto(2) + global("torch", "float32") + kEmptyTuple + kReduce + kStop, so);
  INFO(dump(call));
  CHECK(event_allowed(call, "REDUCE") == 0);
  const auto build = scan(proto(2) + kEmptyDict + kEmptyDict + kBuild + kStop, so);
  INFO(dump(build));
  CHECK(has(build, Rule::kRefusedOperation));
  CHECK(event_allowed(build, "BUILD") == 0);
  const auto od =
      scan(proto(2) + global("collections", "OrderedDict") + kEmptyTuple + kReduce + kEmptyDict + kBuild + kStop, so);
  INFO(dump(od));
  CHECK(od.verdict == Verdict::kClean);
  CHECK(event_allowed(od, "REDUCE") == 1);
  CHECK(event_allowed(od, "BUILD") == 1);
}
