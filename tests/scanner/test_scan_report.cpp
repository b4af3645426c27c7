// Reports (text, JSON schema v1, SARIF 2.1.0), exit codes, path expansion
// and the `safeckpt scan` command line.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <utility>

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

// The text summary's count of paths not scanned.
std::string fmt_unreadable(std::uint64_t n) {
  return std::to_string(n) + " unreadable";
}

}  // namespace

TEST_CASE("scan/report: JSON has the versioned schema and every field") {
  std::vector<safeckpt::scan::FileReport> reps = {scan(os_system_pickle()), scan(empty_dict_pickle()),
                                                  safeckpt::scan::unscanned_report("missing", "No such file")};
  auto j = nlohmann::json::parse(safeckpt::scan::to_json(reps));
  CHECK(j["schema"] == "safeckpt-scan");
  CHECK(j["schema_version"] == safeckpt::scan::kJsonSchemaVersion);
  REQUIRE(j["files"].size() == 3);
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
  CHECK(j["files"][2]["verdict"] == "error");
  CHECK(j["summary"]["exit_code"] == 2);
  CHECK(j["summary"]["errors"] == 1);
  CHECK(j["summary"]["unsafe"] == 1);
  REQUIRE(j["path_errors"].size() == 1);
  CHECK(j["path_errors"][0] == "missing: No such file");
  reps.pop_back();
  CHECK(nlohmann::json::parse(safeckpt::scan::to_json(reps))["summary"]["exit_code"] == 1);
}

TEST_CASE("scan/report: SARIF 2.1.0 as GitHub code scanning reads it") {
  std::vector<safeckpt::scan::FileReport> reps = {scan(os_system_pickle())};
  reps[0].path = "models/evil model.bin";
  auto s = nlohmann::json::parse(safeckpt::scan::to_sarif(reps));
  CHECK(s["version"] == "2.1.0");
  CHECK(s["$schema"] == "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json");
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
  safeckpt::scan::write_text(os, {clean, bad});
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
  // A repeatable option takes one value: the directory after it is a path to scan.
  CHECK(run_cli("--include '*.pt' " + t.p.string()) == 0);
  CHECK(run_cli("--exclude '*.bin' " + t.p.string()) == 0);
  CHECK(run_cli("--include '*.bin' " + t.p.string()) == 1);
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

namespace {
// Runs `safeckpt scan ARGS` with stdout to a file; returns the exit code and stdout.
std::pair<int, std::string> scan_out(const std::string& args, const fs::path& dir) {
  const fs::path out = dir / "stdout.txt";
  const int rc = run_cli(args, out);
  std::ifstream in(out, std::ios::binary);
  return {rc, std::string((std::istreambuf_iterator<char>(in)), {})};
}
}  // namespace

// Issue 11 item 4: `scan /nonexistent good.pt` exited 2 but every report
// said the run was clean. Each kind of path that is not scanned must show in
// the text summary, the JSON summary (errors, exit_code == the process's) and
// SARIF (executionSuccessful false, an error notification naming the path).
TEST_CASE("scan/cli: every path that is not scanned is counted and reported in text, JSON and SARIF") {
  TempDir t("safeckpt_scan_unscanned");
  fs::create_directories(t.p / "out");
  const fs::path good = t.p / "good.pt";
  write_file(good, make_zip(torch_members(state_dict_pickle())));
  fs::create_directories(t.p / "tree");
  write_file(t.p / "tree" / "w.pt", make_zip(torch_members(state_dict_pickle())));
  fs::create_symlink("self", t.p / "tree" / "self");  // a symlink loop found while walking
  fs::create_symlink("loop", t.p / "loop");           // a symlink loop named on the command line
  struct Case {
    const char* what;
    std::string args;
    std::string unscanned;  // the path that must be named
    std::uint64_t count;
  };
  const std::vector<Case> cases = {
      {"missing path", (t.p / "nonexistent").string() + " " + good.string(), (t.p / "nonexistent").string(), 1},
      {"named symlink loop", (t.p / "loop").string() + " " + good.string(), (t.p / "loop").string(), 1},
      {"symlink loop inside a directory", "--follow-symlinks " + (t.p / "tree").string(),
       (t.p / "tree" / "self").string(), 1},
      {"special file", "/dev/null " + good.string(), "/dev/null", 1},
  };
  for (const Case& c : cases) {
    CAPTURE(c.what);
    auto [rc_text, text] = scan_out(c.args, t.p / "out");
    CHECK(rc_text == 2);
    CHECK(text.find(fmt_unreadable(c.count)) != std::string::npos);
    CHECK(text.find(c.unscanned) != std::string::npos);

    auto [rc_json, js] = scan_out("--format json " + c.args, t.p / "out");
    CHECK(rc_json == 2);
    REQUIRE(nlohmann::json::accept(js));
    auto j = nlohmann::json::parse(js);
    CHECK(j["summary"]["errors"] == c.count);
    CHECK(j["summary"]["exit_code"] == rc_json);
    bool named = false;
    for (const auto& f : j["files"])
      if (f["path"] == c.unscanned) named = f["verdict"] == "error";
    CHECK(named);

    auto [rc_sarif, ss] = scan_out("--format sarif " + c.args, t.p / "out");
    CHECK(rc_sarif == 2);
    REQUIRE(nlohmann::json::accept(ss));
    auto s = nlohmann::json::parse(ss);
    const auto& run = s["runs"][0];
    REQUIRE(run.contains("invocations"));
    const auto& inv = run["invocations"][0];
    CHECK(inv["executionSuccessful"] == false);
    CHECK(inv["exitCode"] == rc_sarif);
    std::uint64_t errors = 0;
    bool path_named = false;
    for (const auto& n : inv["toolExecutionNotifications"]) {
      if (n["level"] != "error") continue;
      ++errors;
      if (n["message"]["text"].get<std::string>().find(c.unscanned) != std::string::npos) path_named = true;
    }
    CHECK(errors == c.count);
    CHECK(path_named);
  }
  // And a run with nothing unscanned says so in every format.
  auto [rc, js] = scan_out("--format json " + good.string(), t.p / "out");
  CHECK(rc == 0);
  auto j = nlohmann::json::parse(js);
  CHECK(j["summary"]["errors"] == 0);
  CHECK(j["summary"]["exit_code"] == 0);
  auto [rc_s, ss] = scan_out("--format sarif " + good.string(), t.p / "out");
  CHECK(rc_s == 0);
  auto s = nlohmann::json::parse(ss);
  CHECK(s["runs"][0]["invocations"][0]["executionSuccessful"] == true);
  CHECK(s["runs"][0]["invocations"][0]["toolExecutionNotifications"].empty());
}

// Issue 12: `--fail-on SEVERITY` — exit 1 only for a finding at or above it.
TEST_CASE("scan/cli: --fail-on sets the lowest severity that fails the run") {
  TempDir t("safeckpt_scan_failon");
  fs::create_directories(t.p / "out");
  // os.system: critical findings. An unknown class without a call: the
  // highest finding is the loader's policy refusal (high), not critical.
  write_file(t.p / "evil.bin", os_system_pickle());
  write_file(t.p / "unlisted.bin", proto(2) + global("mymodule", "Thing") + kStop);
  const std::string evil = (t.p / "evil.bin").string(), unlisted = (t.p / "unlisted.bin").string();
  CHECK(run_cli(evil) == 1);
  CHECK(run_cli("--fail-on critical " + evil) == 1);
  CHECK(run_cli(unlisted) == 1);
  CHECK(run_cli("--fail-on low " + unlisted) == 1);
  CHECK(run_cli("--fail-on high " + unlisted) == 1);
  CHECK(run_cli("--fail-on critical " + unlisted) == 0);
  CHECK(run_cli("--fail-on bogus " + unlisted) == 2);
  // The reports agree with the process, and list the findings all the same.
  auto [rc, js] = scan_out("--format json --fail-on critical " + unlisted, t.p / "out");
  CHECK(rc == 0);
  auto j = nlohmann::json::parse(js);
  CHECK(j["summary"]["exit_code"] == 0);
  CHECK(j["summary"]["fail_on"] == "critical");
  CHECK(j["summary"]["findings"] > 0);
  CHECK(j["summary"]["critical"] == 0);
  // A path not scanned is exit 2 whatever the threshold.
  CHECK(run_cli("--fail-on critical " + unlisted + " " + (t.p / "missing").string()) == 2);
}

// Issue 12: an ignore file of accepted findings (path glob + rule).
TEST_CASE("scan/cli: --ignore-file suppresses accepted findings, never a path not scanned") {
  TempDir t("safeckpt_scan_ignore");
  fs::create_directories(t.p / "out");
  write_file(t.p / "evil.bin", os_system_pickle());
  const std::string evil = (t.p / "evil.bin").string();
  const fs::path all = t.p / "all.ignore", some = t.p / "some.ignore", io = t.p / "io.ignore";
  write_file(all,
             "# accepted: a test fixture\n"
             "*evil.bin SCK101\n"
             "  */evil.bin   call-not-allowlisted   # by rule name\n"
             "\n"
             "*.bin SCK180\n");
  write_file(some, "*evil.bin SCK101\n");
  write_file(io, "* SCK190\n");
  CHECK(run_cli("--ignore-file " + all.string() + " " + evil) == 0);
  CHECK(run_cli("--ignore-file " + some.string() + " " + evil) == 1);
  CHECK(run_cli("--ignore-file " + io.string() + " " + evil) == 2);  // refused: io-error is never accepted
  CHECK(run_cli("--ignore-file " + (t.p / "none.ignore").string() + " " + evil) == 2);
  CHECK(run_cli("--ignore-file " + all.string() + " " + evil + " " + (t.p / "missing").string()) == 2);

  auto [rc, js] = scan_out("--format json --ignore-file " + all.string() + " " + evil, t.p / "out");
  CHECK(rc == 0);
  auto j = nlohmann::json::parse(js);
  CHECK(j["summary"]["exit_code"] == 0);
  CHECK(j["summary"]["findings"] == 0);
  CHECK(j["summary"]["suppressed"] == j["files"][0]["findings"].size());
  for (const auto& f : j["files"][0]["findings"]) {
    CHECK(f["suppressed"] == true);
    CHECK(f["suppression"].get<std::string>().find("all.ignore:") != std::string::npos);
  }
  auto [rc_s, ss] = scan_out("--format sarif --ignore-file " + all.string() + " " + evil, t.p / "out");
  CHECK(rc_s == 0);
  auto s = nlohmann::json::parse(ss);
  REQUIRE(!s["runs"][0]["results"].empty());
  for (const auto& r : s["runs"][0]["results"]) {
    REQUIRE(r.contains("suppressions"));
    CHECK(r["suppressions"][0]["kind"] == "external");
    CHECK(r["suppressions"][0]["status"] == "accepted");
  }
  CHECK(s["runs"][0]["invocations"][0]["executionSuccessful"] == true);
}

// Issue 12: a refusal's loader message once, not once per line that mentions it.
TEST_CASE("scan/cli: each finding's text appears once in the text report") {
  const fs::path f = fs::path(SAFECKPT_TEST_DATA) / "corpus/torch-2.11/mal_builtins_eval.pt";
  TempDir t("safeckpt_scan_once");
  auto [rc, text] = scan_out(f.string(), t.p);
  CHECK(rc == 1);
  const std::string loader_text = "Unsupported global: GLOBAL builtins.eval";  // the loader's refusal
  std::size_t n = 0;
  for (std::size_t at = text.find(loader_text); at != std::string::npos; at = text.find(loader_text, at + 1)) ++n;
  CAPTURE(text);
  CHECK(n == 1);
  CHECK(text.find("SCK180") != std::string::npos);
  // A path not scanned: named once in the text report, not again on stderr.
  const std::string missing = (t.p / "missing-model.pt").string();
  const std::string cmd =
      std::string(SAFECKPT_CLI_PATH) + " scan " + missing + " >" + (t.p / "both.txt").string() + " 2>&1";
  std::system(cmd.c_str());
  std::ifstream in(t.p / "both.txt", std::ios::binary);
  const std::string both((std::istreambuf_iterator<char>(in)), {});
  CAPTURE(both);
  CHECK(both.find(missing) != std::string::npos);
  CHECK(both.find(missing) == both.rfind(missing));
}

// Issue 12: files that are not models are one summary line unless --verbose.
TEST_CASE("scan/cli: files that are not models are summarized in one line unless --verbose") {
  TempDir t("safeckpt_scan_notmodel");
  fs::create_directories(t.p / "repo");
  fs::create_directories(t.p / "out");
  write_file(t.p / "repo" / "clean.pt", make_zip(torch_members(state_dict_pickle())));
  write_file(t.p / "repo" / "config.json", "{}");
  write_file(t.p / "repo" / "README.md", "hello\n");
  auto [rc, text] = scan_out((t.p / "repo").string(), t.p / "out");
  CHECK(rc == 0);
  CAPTURE(text);
  CHECK(text.find("2 files are not a model") != std::string::npos);
  CHECK(text.find("config.json") == std::string::npos);
  CHECK(text.find("clean.pt: CLEAN") != std::string::npos);
  auto [rc_v, verbose] = scan_out("-v " + (t.p / "repo").string(), t.p / "out");
  CHECK(rc_v == 0);
  CHECK(verbose.find("config.json: NOT_MODEL") != std::string::npos);
  CHECK(verbose.find("README.md: NOT_MODEL") != std::string::npos);
}

// Issue 12: colours only on a terminal, never with NO_COLOR or --no-color;
// never in JSON. `script` (util-linux) gives the command a terminal.
TEST_CASE("scan/cli: colours only on a terminal, off with NO_COLOR and --no-color") {
  if (std::system("command -v script >/dev/null 2>&1") != 0) {
    MESSAGE("SKIP: util-linux `script` not found; cannot give the CLI a terminal");
    return;
  }
  TempDir t("safeckpt_scan_colour");
  write_file(t.p / "evil.bin", os_system_pickle());
  auto tty_run = [&](const std::string& env, const std::string& args) {
    const fs::path out = t.p / "tty.txt";
    std::string cmd = "env -u NO_COLOR " + env + " script -qec '" + std::string(SAFECKPT_CLI_PATH) + " scan " + args +
                      " " + (t.p / "evil.bin").string() + "' /dev/null >" + out.string() + " 2>/dev/null";
    std::system(cmd.c_str());
    std::ifstream in(out, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), {});
  };
  const std::string esc = "\033[";
  std::string on = tty_run("", "");
  REQUIRE(on.find("UNSAFE") != std::string::npos);
  CHECK(on.find(esc + "1;31mUNSAFE") != std::string::npos);
  CHECK(tty_run("NO_COLOR=1", "").find(esc) == std::string::npos);
  CHECK(tty_run("", "--no-color").find(esc) == std::string::npos);
  std::string j = tty_run("", "--format json");
  CHECK(j.find(esc) == std::string::npos);
  // Not a terminal: no colours.
  auto [rc, piped] = scan_out((t.p / "evil.bin").string(), t.p);
  CHECK(rc == 1);
  CHECK(piped.find(esc) == std::string::npos);
}

// Issue 12: progress on stderr only (and never in the report on stdout).
TEST_CASE("scan/cli: --progress writes to stderr, never into the report") {
  TempDir t("safeckpt_scan_progress");
  fs::create_directories(t.p / "in");
  write_file(t.p / "in" / "a.pt", make_zip(torch_members(state_dict_pickle())));
  write_file(t.p / "in" / "b.pt", make_zip(torch_members(state_dict_pickle())));
  const std::string cmd = std::string(SAFECKPT_CLI_PATH) + " scan --progress --format json " + (t.p / "in").string() +
                          " >" + (t.p / "out.json").string() + " 2>" + (t.p / "err.txt").string();
  int st = std::system(cmd.c_str());
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  std::ifstream o(t.p / "out.json"), e(t.p / "err.txt");
  std::string out((std::istreambuf_iterator<char>(o)), {}), err((std::istreambuf_iterator<char>(e)), {});
  CHECK(nlohmann::json::accept(out));
  CHECK(err.find("[1/2]") != std::string::npos);
  CHECK(err.find("[2/2]") != std::string::npos);
}

// Issue 12: SARIF paths relative to %SRCROOT% (--base or the current
// directory), absolute file:// URIs outside it, and the whole document valid
// against the OASIS SARIF 2.1.0 schema (tests/data/sarif/PROVENANCE.md).
TEST_CASE("scan/cli: SARIF uses %SRCROOT% URIs and validates against the SARIF 2.1.0 schema") {
  TempDir t("safeckpt_scan_sarif");
  fs::create_directories(t.p / "repo" / "models");
  fs::create_directories(t.p / "out");
  write_file(t.p / "repo" / "models" / "evil model.bin", os_system_pickle());
  write_file(t.p / "repo" / "models" / "ok.pt", make_zip(torch_members(state_dict_pickle())));
  write_file(t.p / "repo" / "config.json", "{}");
  fs::create_symlink("ok.pt", t.p / "repo" / "models" / "link.pt");  // skipped: a note
  write_file(t.p / "outside.bin", os_system_pickle());
  write_file(t.p / "accept.ignore", "models/ok* SCK101\n*/evil?model.bin SCK110\n");
  const std::string args = "--format sarif --base " + (t.p / "repo").string() + " --ignore-file " +
                           (t.p / "accept.ignore").string() + " " + (t.p / "repo").string() + " " +
                           (t.p / "outside.bin").string() + " " + (t.p / "repo" / "missing.pt").string();
  auto [rc, ss] = scan_out(args, t.p / "out");
  CHECK(rc == 2);
  auto s = nlohmann::json::parse(ss);
  const auto& run = s["runs"][0];
  const std::string root_uri = "file://" + (t.p / "repo").string() + "/";
  CHECK(run["originalUriBaseIds"]["%SRCROOT%"]["uri"] == root_uri);
  std::set<std::string> uris;
  for (const auto& a : run["artifacts"]) {
    const auto& l = a["location"];
    uris.insert(l["uri"].get<std::string>());
    if (l["uri"].get<std::string>().rfind("file://", 0) == 0) {
      CHECK(!l.contains("uriBaseId"));
    } else {
      CHECK(l["uriBaseId"] == "%SRCROOT%");
    }
  }
  CHECK(uris.count("models/evil%20model.bin") == 1);
  CHECK(uris.count("models/ok.pt") == 1);
  CHECK(uris.count("missing.pt") == 1);
  CHECK(uris.count("file://" + (t.p / "outside.bin").string()) == 1);
  bool suppressed = false;
  for (const auto& r : run["results"]) suppressed = suppressed || r.contains("suppressions");
  CHECK(suppressed);
  const auto& driver = run["tool"]["driver"];
  CHECK(driver["version"].is_string());
  // Where the tool and its rules are documented: SAFECKPT_PROJECT_URL when the
  // build set one, else (this binary runs in its build tree) file: URIs of
  // the source tree's README.md and scanner/README.md, which exist.
  REQUIRE(driver.contains("informationUri"));
  const std::string info = driver["informationUri"];
  const std::string help = driver["rules"][0]["helpUri"];
  if (info.rfind("https://", 0) != 0) {
    const fs::path src = fs::weakly_canonical(fs::path(SAFECKPT_TEST_DATA) / ".." / "..");
    CHECK(info == "file://" + (src / "README.md").string());
    CHECK(help == "file://" + (src / "scanner" / "README.md").string());
    CHECK(fs::is_regular_file(src / "scanner" / "README.md"));
  }
  for (const auto& rule : driver["rules"]) CHECK(rule["helpUri"] == help);
  std::set<std::string> levels;
  for (const auto& n : run["invocations"][0]["toolExecutionNotifications"]) levels.insert(n["level"]);
  CHECK(levels == std::set<std::string>{"error", "note"});

  // The official schema, with Debian's python3-jsonschema.
  const fs::path doc = t.p / "out" / "report.sarif";
  {
    std::ofstream o(doc, std::ios::binary);
    o << ss;
  }
  if (std::system("/usr/bin/python3 -c 'import jsonschema' >/dev/null 2>&1") != 0) {
    MESSAGE("SKIP schema validation: Debian package python3-jsonschema is not installed");
    return;
  }
  const fs::path schema = fs::path(SAFECKPT_TEST_DATA) / "sarif" / "sarif-schema-2.1.0.json";
  const std::string py =
      "/usr/bin/python3 -c 'import json, sys, jsonschema; "
      "jsonschema.Draft4Validator(json.load(open(sys.argv[1]))).validate(json.load(open(sys.argv[2])))' " +
      schema.string() + " " + doc.string() + " 2>&1";
  FILE* p = popen(py.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string msg;
  char buf[4096];
  for (std::size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) msg.append(buf, n);
  const int st = pclose(p);
  CHECK_MESSAGE((WIFEXITED(st) && WEXITSTATUS(st) == 0), msg);
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
