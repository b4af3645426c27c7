// Archive anomalies say which copy PyTorch reads, and every copy is scanned;
// legacy tar checkpoints are examined member by member.
#include <doctest/doctest.h>

#include <filesystem>

#include "test_scan_helpers.hpp"

using namespace scantest;
using safeckpt::scan::Rule;
using safeckpt::scan::Verdict;

TEST_CASE("scan/archive: duplicate names: both copies are scanned, the anomaly names the copy PyTorch reads") {
  auto m = torch_members(state_dict_pickle());
  m.push_back({"archive/data.pkl", os_system_pickle()});  // Python's zipfile would read this one
  auto r = scan(make_zip(m));
  INFO(dump(r));
  CHECK(has_text(r, Rule::kArchiveAnomaly, "duplicate_name"));
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK_FALSE(r.loader.ok);
}

TEST_CASE("scan/archive: duplicate names: findings name each copy and the copy PyTorch 1.13 reads") {
  // tests/data/zip_duplicates/observed.txt (gen_zip_duplicates.py, torch 1.13):
  // PyTorch's miniz lookup is not "the first copy".
  struct Obs {
    const char* file;
    int copies;
    int read_entry;
  };
  const auto dir = std::filesystem::path(SAFECKPT_TEST_DATA) / "zip_duplicates";
  for (const Obs& o : {Obs{"dup2.pt", 2, 0}, Obs{"dup3_extra7.pt", 3, 0}, Obs{"dup5.pt", 5, 3}}) {
    INFO(o.file);
    auto r = safeckpt::scan::scan_file(dir / o.file);
    INFO(dump(r));
    CHECK(has_text(r, Rule::kArchiveAnomaly,
                   std::to_string(o.copies) + " entries hold this name: entry #0 at offset 0, entry #1 at offset "));
    CHECK(has_text(r, Rule::kArchiveAnomaly, "; PyTorch reads entry #" + std::to_string(o.read_entry) + " at offset "));
    // Copy 1 (central entry #0) calls builtins.len: its findings say which copy.
    bool named = false;
    for (const auto& f : r.findings)
      if (f.global == "builtins.len") named = named || f.member.find("archive/data.pkl [entry #0 at offset 0") == 0;
    // ... and say so when it is the one PyTorch reads.
    if (o.read_entry == 0) CHECK(has_text(r, Rule::kImportDangerous, "the copy PyTorch reads]"));
    CHECK(named);
    CHECK(r.verdict == Verdict::kUnsafe);
  }
}

TEST_CASE("scan/archive: names equal but for case are one name to PyTorch (miniz compares ignoring case)") {
  auto m = torch_members(state_dict_pickle());
  m.push_back({"archive/DATA.PKL", os_system_pickle()});
  auto r = scan(make_zip(m));
  INFO(dump(r));
  CHECK(has_text(r, Rule::kArchiveAnomaly, "2 entries hold this name (ignoring case)"));
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  CHECK(r.verdict == Verdict::kUnsafe);
}

TEST_CASE("scan/archive: entries outside the root folder and trailing data") {
  auto m = torch_members(state_dict_pickle());
  m.push_back({"other/payload.pkl", os_system_pickle()});
  auto r = scan(make_zip(m));
  INFO(dump(r));
  CHECK(has_text(r, Rule::kArchiveAnomaly, "outside_root"));
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  auto t = scan(make_zip(torch_members(state_dict_pickle()), os_system_pickle()));
  INFO(dump(t));
  CHECK(has_text(t, Rule::kArchiveAnomaly, "trailing_data"));
  CHECK(t.verdict != Verdict::kClean);
}

TEST_CASE("scan/archive: a zip that does not open is a finding, never clean") {
  Buf z = make_zip(torch_members(state_dict_pickle()));
  z.resize(z.size() - 10);  // cut the end of central directory
  auto r = scan(z);
  INFO(dump(r));
  CHECK(has(r, Rule::kMalformed));
  CHECK(r.verdict == Verdict::kIncomplete);
  CHECK_FALSE(r.complete);
}

namespace {
Buf tar_member(const std::string& name, const Buf& body) {
  Buf h(512, '\0');
  h.replace(0, name.size(), name);
  h.replace(100, 7, "0000644");
  char size[16];
  std::snprintf(size, sizeof size, "%011o", static_cast<unsigned>(body.size()));
  h.replace(124, 11, size);
  h[156] = '0';
  h.replace(257, 6, std::string("ustar\0", 6));
  h.replace(263, 2, "00");
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i)
    sum += (i >= 148 && i < 156) ? 32u : static_cast<unsigned char>(h[static_cast<std::size_t>(i)]);
  char ck[16];
  std::snprintf(ck, sizeof ck, "%06o", sum);
  h.replace(148, 7, std::string(ck, 6) + '\0');
  Buf pad((512 - body.size() % 512) % 512, '\0');
  return h + body + pad;
}
}  // namespace

TEST_CASE("scan/archive: legacy tar checkpoint: every member's pickles are scanned") {
  // storages: count 1; ("0", "cpu", FloatStorage); i64 2; 8 bytes; views []
  Buf storages = proto(2) + binint1(1) + kStop + proto(2) + binunicode("0") + binunicode("cpu") +
                 global("torch", "FloatStorage") + "\x87" + kStop + u64(2) + Buf(8, '\0') + proto(2) + "]" + kStop +
                 os_system_pickle();  // hidden after the views list
  Buf tar = tar_member("sys_info", proto(2) + kEmptyDict + kStop) +
            tar_member("pickle", proto(2) + call1("builtins", "exec", "true") + kStop) +
            tar_member("storages", storages) + Buf(1024, '\0');
  auto r = scan(tar);
  INFO(dump(r));
  CHECK(r.format == "legacy_tar");
  CHECK(has(r, Rule::kUnsupported));
  CHECK(has(r, Rule::kImportDangerous, "builtins.exec"));
  bool hidden = false;
  for (const auto& f : r.findings)
    if (f.global == "os.system" && f.member == "storages") hidden = true;
  CHECK(hidden);
  CHECK(r.verdict == Verdict::kUnsafe);
}

// Issue 12: a zip without a root folder (npz-like) is read through the zip
// layer (anomaly no_root_folder), not a second zip walker in the scanner.
TEST_CASE("scan/archive: a zip without a root folder: the finding comes from the zip layer, members still scanned") {
  auto r = scan(make_zip({{"payload.pkl", os_system_pickle()}, {"b.bin", Buf(8, '\0')}}));
  INFO(dump(r));
  CHECK(has_text(r, Rule::kMalformed, "malformed: file in archive is not in a subdirectory: 'payload.pkl'"));
  CHECK(has(r, Rule::kImportDangerous, "os.system"));
  CHECK(r.members == 2);
  CHECK(r.verdict == Verdict::kUnsafe);
}

// Issue 12: a stream cut at max_pickle_bytes is a limit finding decided by
// the machine (PickleOptions::input_cut_at_limit), not by searching the
// error text for "truncated"; a stream that is truly truncated stays malformed.
TEST_CASE("scan: a pickle longer than max_pickle_bytes is a limit finding; a truncated one is malformed") {
  Buf long_pickle = proto(2) + "]";  // EMPTY_LIST, then 50 x (BININT1 1, APPEND)
  for (int i = 0; i < 50; ++i) long_pickle += binint1(1) + "a";
  long_pickle += kStop;
  safeckpt::scan::ScanOptions o;
  o.run_loader = false;
  o.limits.max_pickle_bytes = 64;
  auto r = scan(long_pickle, o);
  INFO(dump(r));
  CHECK(has_text(r, Rule::kLimit, "pickle stream longer than max_pickle_bytes (64)"));
  CHECK_FALSE(has(r, Rule::kMalformed));
  auto t = scan(long_pickle.substr(0, 64), o);
  INFO(dump(t));
  CHECK(has_text(t, Rule::kMalformed, "pickle data truncated"));
  CHECK_FALSE(has(t, Rule::kLimit));
}
