// Reports (text, JSON schema v1, SARIF 2.1.0), exit codes, path expansion
// and the `safeckpt scan` command line.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_scan_helpers.hpp"

namespace fs = std::filesystem;
using namespace scantest;
using safeckpt::scan::Verdict;

namespace {

struct TempDir {
  fs::path p;
  explicit TempDir(const char* name) : p(fs::temp_directory_path() / (std::string(name) + std::to_string(::getpid()))) {
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TempDir() { fs::remove_all(p); }
};

}  // namespace

TEST_CASE("scan/report: JSON has the versioned schema and every field") {
  std::vector<safeckpt::scan::FileReport> reps = {scan(os_system_pickle()), scan(empty_dict_pickle())};
  auto j = nlohmann::json::parse(safeckpt::scan::to_json(reps, {"missing: No such file"}));
  CHECK(j["schema"] == "safeckpt-scan");
  CHECK(j["schema_version"] == safeckpt::scan::kJsonSchemaVersion);
  REQUIRE(j["files"].size() == 2);
  const auto& f0 = j["files"][0];
  CHECK(f0["verdict"] == "unsafe");
  CHECK(f0["format"] == "bare_pickle");
  CHECK(f0["loader"]["ok"] == false);
  CHECK(f0["loader"]["error"]["code"] == "disallowed_global");
  bool os_system = false;
  for (const auto& f : f0["findings"]) {
    CHECK(f.contains("rule"));
    CHECK(f.contains("severity"));
    CHECK(f.contains("offset"));
    if (f["global"] == "os.system" && f["rule"] == "SCK101") {
      os_system = true;
      CHECK(f["opcode"] == "GLOBAL");
      CHECK(f["offset"] == 2);
      CHECK(f["stream"] == 0);
      CHECK(f["category"] == "process");
    }
  }
  CHECK(os_system);
  CHECK(j["files"][1]["verdict"] == "clean");
  CHECK(j["summary"]["exit_code"] == 1);
  CHECK(j["summary"]["unsafe"] == 1);
  CHECK(j["path_errors"].size() == 1);
}

TEST_CASE("scan/report: SARIF 2.1.0 as GitHub code scanning reads it") {
  std::vector<safeckpt::scan::FileReport> reps = {scan(os_system_pickle())};
  reps[0].path = "models/evil model.bin";
  auto s = nlohmann::json::parse(safeckpt::scan::to_sarif(reps));
  CHECK(s["version"] == "2.1.0");
  CHECK(s["$schema"].get<std::string>().find("sarif-2.1.0") != std::string::npos);
  const auto& run = s["runs"][0];
  const auto& rules = run["tool"]["driver"]["rules"];
  CHECK(rules.size() == safeckpt::scan::rules().size());
  for (const auto& r : rules) {
    CHECK(r["id"].is_string());
    CHECK(r["shortDescription"]["text"].is_string());
    CHECK(r["properties"]["security-severity"].is_string());
  }
  REQUIRE(run["results"].size() >= 2);
  for (const auto& r : run["results"]) {
    CHECK(r["ruleId"].is_string());
    CHECK(rules[r["ruleIndex"].get<std::size_t>()]["id"] == r["ruleId"]);
    CHECK((r["level"] == "error" || r["level"] == "warning" || r["level"] == "note"));
    CHECK(r["message"]["text"].is_string());
    const auto& pl = r["locations"][0]["physicalLocation"];
    CHECK(pl["artifactLocation"]["uri"] == "models/evil%20model.bin");
    CHECK(pl["region"]["startLine"] == 1);
    CHECK(r["partialFingerprints"].size() == 1);
  }
}

TEST_CASE("scan/report: exit codes and the text summary") {
  auto clean = scan(empty_dict_pickle());
  auto bad = scan(os_system_pickle());
  auto text = scan("hello: not a model\n");
  CHECK(safeckpt::scan::exit_code({clean}) == 0);
  CHECK(safeckpt::scan::exit_code({clean, text}) == 0);
  CHECK(safeckpt::scan::exit_code({clean, bad}) == 1);
  safeckpt::scan::FileReport err;
  err.verdict = Verdict::kError;
  CHECK(safeckpt::scan::exit_code({bad, err}) == 2);
  std::ostringstream os;
  safeckpt::scan::write_text(os, {clean, bad}, false);
  CHECK(os.str().find("UNSAFE") != std::string::npos);
  CHECK(os.str().find("os.system") != std::string::npos);
  CHECK(os.str().find("why:") != std::string::npos);
  CHECK(os.str().find("2 files scanned: 1 clean, 1 unsafe") != std::string::npos);
}

TEST_CASE("scan/walk: directories recurse, symlinks are not followed, globs filter") {
  TempDir t("safeckpt_scan_walk");
  fs::create_directories(t.p / "a" / "b");
  write_file(t.p / "a" / "model.bin", os_system_pickle());
  write_file(t.p / "a" / "b" / "weights.pt", empty_dict_pickle());
  write_file(t.p / "a" / "config.json", "{}");
  fs::create_symlink(t.p / "a", t.p / "a" / "b" / "loop");
  fs::create_symlink(t.p / "a" / "model.bin", t.p / "link.bin");
  safeckpt::scan::WalkOptions wo;
  auto w = safeckpt::scan::expand_paths({t.p}, wo);
  CHECK(w.files.size() == 3);  // symlinks skipped
  CHECK(w.skipped.size() == 2);
  wo.follow_symlinks = true;
  auto wf = safeckpt::scan::expand_paths({t.p}, wo);
  CHECK(wf.files.size() == 4);  // link.bin followed; the loop directory visited once
  safeckpt::scan::WalkOptions inc;
  inc.include = {"*.bin", "*.pt"};
  CHECK(safeckpt::scan::expand_paths({t.p}, inc).files.size() == 2);
  safeckpt::scan::WalkOptions exc;
  exc.exclude = {"*.json"};
  CHECK(safeckpt::scan::expand_paths({t.p}, exc).files.size() == 2);
  auto missing = safeckpt::scan::expand_paths({t.p / "nope"}, {});
  CHECK(missing.errors.size() == 1);
}

#ifdef SAFECKPT_CLI_PATH
namespace {
int run_cli(const std::string& args, const fs::path& out = {}) {
  std::string cmd = std::string(SAFECKPT_CLI_PATH) + " scan " + args +
                    (out.empty() ? " >/dev/null" : " >" + out.string()) + " 2>/dev/null";
  int st = std::system(cmd.c_str());
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
}  // namespace

TEST_CASE("scan/cli: exit codes 0 clean, 1 finding, 2 usage or unreadable path; json and sarif output") {
  TempDir t("safeckpt_scan_cli");
  write_file(t.p / "clean.pt", make_zip(torch_members(state_dict_pickle())));
  write_file(t.p / "evil.bin", os_system_pickle());
  write_file(t.p / "config.json", "{}");
  CHECK(run_cli((t.p / "clean.pt").string()) == 0);
  CHECK(run_cli((t.p / "config.json").string()) == 0);
  CHECK(run_cli((t.p / "evil.bin").string()) == 1);
  CHECK(run_cli(t.p.string()) == 1);
  CHECK(run_cli((t.p / "missing.pt").string()) == 2);
  CHECK(run_cli("--format nonsense " + (t.p / "clean.pt").string()) == 2);
  CHECK(run_cli("") == 2);
  CHECK(run_cli("--format json " + t.p.string(), t.p / "out.json") == 1);
  std::ifstream jf(t.p / "out.json");
  auto j = nlohmann::json::parse(jf);
  CHECK(j["summary"]["files"] == 4);  // out.json itself was created before the scan listed the directory
  CHECK(run_cli("--format sarif -o " + (t.p / "out.sarif").string() + " " + (t.p / "evil.bin").string()) == 1);
  std::ifstream sf(t.p / "out.sarif");
  auto s = nlohmann::json::parse(sf);
  CHECK(s["version"] == "2.1.0");
  // corpus: the CLI's exit code is 0 exactly when `safeckpt inspect` exits 0
  fs::path d = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11";
  for (const char* f : {"mlp_state_dict.pt", "legacy_format.pt", "mal_os_system.pt", "bad_storage_too_small.pt",
                        "mal_raw_pickle.pkl"}) {
    CAPTURE(f);
    std::string ins = std::string(SAFECKPT_CLI_PATH) + " inspect " + (d / f).string() + " >/dev/null 2>&1";
    int st = std::system(ins.c_str());
    int inspect_rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    CHECK((run_cli((d / f).string()) == 0) == (inspect_rc == 0));
  }
}
#endif

TEST_CASE("scan/report: names from the file that are not UTF-8 still give valid JSON and SARIF") {
  // Zip member names are raw bytes; the fuzz regression
  // scan/json_report_name_not_utf8 (a mutated nonascii root) made
  // nlohmann::json throw out of to_json and terminate the process. Here:
  // the real nonascii_root.pt with one byte of its root name, in every
  // header, turned into 0xC1 (never valid in UTF-8).
  std::ifstream in(fs::path(SAFECKPT_TEST_DATA) / "corpus/torch-1.13/nonascii_root.pt", std::ios::binary);
  std::string file((std::istreambuf_iterator<char>(in)), {});
  REQUIRE(file.size() > 100);
  const std::string utf8_e_grave = "\xC3\xA8";  // the root name starts "mod\u00e8le"
  std::size_t n = 0;
  for (std::size_t at = file.find(utf8_e_grave); at != std::string::npos; at = file.find(utf8_e_grave, at + 2)) {
    file[at] = '\xC1';
    ++n;
  }
  REQUIRE(n >= 3);
  auto rep = safeckpt::scan::scan_bytes(
      safeckpt::Bytes(reinterpret_cast<const std::uint8_t*>(file.data()), file.size()), "bad-name.pt");
  const std::vector<safeckpt::scan::FileReport> reps{rep};
  std::string text, sarif;
  REQUIRE_NOTHROW(text = safeckpt::scan::to_json(reps));
  REQUIRE_NOTHROW(sarif = safeckpt::scan::to_sarif(reps));
  CHECK(nlohmann::json::accept(text));
  CHECK(nlohmann::json::accept(sarif));
  CHECK(text.find("\xEF\xBF\xBD") != std::string::npos);  // U+FFFD stands for the bad byte
}
