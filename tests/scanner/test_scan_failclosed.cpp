// Fail closed on damaged files (issue "failclosed"): a checkpoint that is cut
// short or over a limit is `incomplete` with one finding for what stopped the
// scan, never `unsafe` because tensor bytes were read as pickles, and never
// `not_model` when its leading bytes already identify the format; a storage
// record shorter than its tensor (CVE-2026-24747) is a high finding of its own.
//
// Files: tests/data/corpus/torch-2.11 (PyTorch 2.11, see its README) and
// tests/data/safetensors-ref (the safetensors package's own files), cut or
// rebuilt here.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "safeckpt/detect.hpp"
#include "safeckpt/scan.hpp"
#include "safeckpt/zip.hpp"
#include "test_scan_helpers.hpp"

namespace fs = std::filesystem;
using namespace scantest;
using safeckpt::scan::FileReport;
using safeckpt::scan::Rule;
using safeckpt::scan::ScanOptions;
using safeckpt::scan::Severity;
using safeckpt::scan::Verdict;

namespace {

Buf read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return Buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

fs::path corpus(const char* name) {
  return fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / name;
}

// The members of a corpus zip, as stored bytes, with `cut_name` cut to
// `cut` bytes: rebuilt as a valid zip (CRCs of the new bytes), so only the
// pickle is damaged, as by a writer that stopped early.
Buf rebuild_with_cut_member(const Buf& file, const std::string& cut_name, std::size_t cut) {
  auto z = safeckpt::ZipArchive::open(span(file), safeckpt::Limits{});
  REQUIRE_MESSAGE(z.has_value(), (z ? "" : z.error().to_string()));
  std::vector<Member> m;
  for (const safeckpt::ZipEntry& e : z->entries()) {
    auto rb = z->read(e, true);
    REQUIRE_MESSAGE(rb.has_value(), (rb ? "" : rb.error().to_string()));
    Buf b(reinterpret_cast<const char*>(rb->bytes.data()), rb->bytes.size());
    if (e.name == cut_name) b.resize(cut);
    m.push_back({e.name, std::move(b)});
  }
  return make_zip(m);
}

int count_rule(const FileReport& r, Rule rule) {
  int n = 0;
  for (const auto& f : r.findings)
    if (f.rule == rule && f.severity != Severity::kInfo) ++n;
  return n;
}

// No finding says the file runs code, and no tensor record was read as a pickle.
void check_no_false_attack(const FileReport& r) {
  CHECK_FALSE(has(r, Rule::kImportDangerous));
  CHECK_FALSE(has(r, Rule::kImportExtension));
  CHECK_FALSE(has(r, Rule::kImportDynamic));
  CHECK_FALSE(has(r, Rule::kImportUnlisted));
  CHECK_FALSE(has(r, Rule::kCall));
  CHECK_FALSE(has(r, Rule::kRefusedOpcode));
  for (const auto& f : r.findings) {
    if (f.severity == Severity::kInfo) continue;  // the "not examined: tensor data" note
    CAPTURE(f.member);
    CHECK(f.member.find("/data/") == std::string::npos);
  }
}

}  // namespace

TEST_CASE("scan: a torch zip whose data.pkl is cut short is incomplete; its storage records are not read as pickles") {
  // many_tensors.pt: 3000 storages; data.pkl cut to 20000 of its 309142 bytes.
  const Buf z = rebuild_with_cut_member(read_all(corpus("many_tensors.pt")), "many_tensors/data.pkl", 20000);
  auto r = scan(z);
  INFO(dump(r).substr(0, 4000));
  CHECK(r.verdict == Verdict::kIncomplete);
  check_no_false_attack(r);
  CHECK(count_rule(r, Rule::kMalformed) == 1);
  safeckpt::scan::ReportOptions critical;
  critical.fail_on = Severity::kCritical;
  CHECK(safeckpt::scan::exit_code({r}, critical) == 0);  // `--fail-on critical` exited 1 (false attack)
  bool on_data_pkl = false;
  for (const auto& f : r.findings)
    if (f.rule == Rule::kMalformed && f.member == "many_tensors/data.pkl") on_data_pkl = true;
  CHECK(on_data_pkl);
  // The records under data/ are listed once, as not examined (info).
  CHECK(has_text(r, Rule::kUnsupported, "not examined: tensor data"));
}

TEST_CASE("scan: a torch zip over the memory limit is incomplete, not an attack") {
  // `safeckpt scan --max-memory 1` on many_tensors.pt.
  ScanOptions o;
  o.limits.max_memory_bytes = 1u << 20;
  auto r = safeckpt::scan::scan_file(corpus("many_tensors.pt"), o);
  INFO(dump(r).substr(0, 4000));
  CHECK(r.verdict == Verdict::kIncomplete);
  check_no_false_attack(r);
  CHECK(count_rule(r, Rule::kLimit) == 1);
  CHECK(has_text(r, Rule::kUnsupported, "not examined: tensor data"));
}

TEST_CASE("scan: in a torch zip, a pickle under data/ is tensor data (torch never unpickles it)") {
  // data.pkl names storage 0; data/1 is a record no persistent id names and
  // holds a pickle: torch.load never reads it, so it is an info note only.
  auto m = torch_members(state_dict_pickle());
  m.push_back({"archive/data/1", os_system_pickle()});
  auto r = scan(make_zip(m));
  INFO(dump(r));
  CHECK(r.verdict == Verdict::kClean);
  CHECK(has_text(r, Rule::kUnsupported, "named by no persistent id"));
  // Elsewhere in the archive the same bytes are still a finding (CVE-2025-1889).
  auto m2 = torch_members(state_dict_pickle());
  m2.push_back({"archive/extra/1", os_system_pickle()});
  auto r2 = scan(make_zip(m2));
  INFO(dump(r2));
  CHECK(r2.verdict == Verdict::kUnsafe);
  CHECK(has(r2, Rule::kImportDangerous, "os.system"));
}

TEST_CASE("scan: a storage record shorter than its tensor is SCK113 storage-out-of-bounds, high (CVE-2026-24747)") {
  auto r = safeckpt::scan::scan_file(corpus("bad_storage_too_small.pt"));
  INFO(dump(r));
  CHECK(has(r, Rule::kStorageOutOfBounds));
  for (const auto& f : r.findings)
    if (f.rule == Rule::kStorageOutOfBounds) CHECK(f.severity == Severity::kHigh);
  CHECK(r.verdict == Verdict::kUnsafe);
  safeckpt::scan::ReportOptions high;
  high.fail_on = Severity::kHigh;
  CHECK(safeckpt::scan::exit_code({r}, high) == 1);  // `safeckpt scan --fail-on high` exited 0
  CHECK(safeckpt::scan::rule_info(Rule::kStorageOutOfBounds).id == "SCK113");
  // Crafted: 2 floats need 8 bytes; 4 are short, 8 are not.
  for (std::size_t n : {4u, 8u}) {
    CAPTURE(n);
    std::vector<Member> m = {{"archive/data.pkl", state_dict_pickle()}, {"archive/data/0", Buf(n, '\0')}};
    auto rc = scan(make_zip(m));
    INFO(dump(rc));
    CHECK(has(rc, Rule::kStorageOutOfBounds) == (n == 4));
  }
}

TEST_CASE("scan: files cut short are findings when their leading bytes identify the format") {
  struct Case {
    const char* what;
    Buf bytes;
  };
  const Buf st = read_all(fs::path(SAFECKPT_TEST_DATA) / "safetensors-ref" / "basic.safetensors");
  const Buf zip = read_all(corpus("mlp_state_dict.pt"));
  const Buf legacy = read_all(corpus("legacy_format.pt"));
  const Buf bare = state_dict_pickle();
  const Buf npy_header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }";
  const Buf npy = Buf("\x93NUMPY\x01\x00", 8) + u16(npy_header.size() + 1) + npy_header + "\n" + Buf(8, '\0');
  REQUIRE(st.size() > 8 + 216);
  REQUIRE(zip.size() > 100);
  const Case cases[] = {
      {"safetensors cut inside its JSON header", st.substr(0, 8 + 216)},
      {"torch zip cut before its end record", zip.substr(0, zip.size() - 10)},
      {"torch zip cut inside its central directory", zip.substr(0, zip.size() - 22 - 60)},
      {"legacy file cut right after its magic number", legacy.substr(0, 15)},
      {"legacy file cut inside its second stream", legacy.substr(0, 20)},
      {"bare pickle cut mid-stream", bare.substr(0, bare.size() / 2)},
      {"npy cut in its header", npy.substr(0, 30)},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    auto r = scan(c.bytes);
    INFO(dump(r));
    CHECK(r.verdict == Verdict::kIncomplete);
    CHECK(r.verdict != Verdict::kNotModel);
    CHECK(safeckpt::scan::exit_code(std::vector<FileReport>{r}) == 1);
  }
}
