// `safeckpt scan PATH...`: audit checkpoints without running them.
// The work is in the safeckpt_scanner library (scanner/include/safeckpt/scan.hpp);
// this file parses options, expands paths and prints the report.
// Exit codes: 0 every file clean (or not a model file), 1 any finding not
// suppressed at or above --fail-on (or any signature failure), 2 usage error
// or a path that was not scanned (scan::exit_code, the same value the
// JSON/SARIF reports carry).
// `--signature BUNDLE` with the trust options of `safeckpt verify` (parsed by
// the same code, cli/sign.cpp add_verify_options): the one PATH is the
// signed model, verified by sign::verify_model; scan::add_signature_findings
// turns the outcome into SCK200-SCK204 findings (scan.hpp).
#include "safeckpt/scan.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "allow_arg.hpp"
#include "commands.hpp"
#include "safeckpt/version.hpp"

namespace safeckpt::cli {
namespace {

// The tool version written in JSON/SARIF (safeckpt/version.hpp, = --version).
constexpr const char* kToolVersion = SAFECKPT_VERSION_STRING;
// SARIF informationUri/helpUri: the CMake cache variable SAFECKPT_PROJECT_URL
// when set; else the installed documentation (SAFECKPT_BIN_TO_DOCDIR: from
// <prefix>/bin to <prefix>/share/doc/safeckpt, cmake/Install.cmake), or the
// source tree's for the binary in its build tree; else omitted, never guessed.
#ifndef SAFECKPT_PROJECT_URL
#define SAFECKPT_PROJECT_URL ""
#endif

struct DocUris {
  std::string info, rules;
};

DocUris doc_uris() {
  const char* const url = SAFECKPT_PROJECT_URL;
  if (url[0] != '\0') return {url, std::string(url) + "/blob/main/scanner/README.md#rules"};
  namespace fs = std::filesystem;
  auto uris = [](const fs::path& readme, const fs::path& rules) -> DocUris {
    std::error_code e1, e2;
    if (!fs::is_regular_file(readme, e1) || !fs::is_regular_file(rules, e2)) return {};
    return {scan::file_uri(readme.lexically_normal().string()), scan::file_uri(rules.lexically_normal().string())};
  };
#if defined(SAFECKPT_BIN_TO_DOCDIR)
  if (const fs::path exe_dir = executable_dir(); !exe_dir.empty()) {
    const fs::path doc = exe_dir / SAFECKPT_BIN_TO_DOCDIR;
    if (DocUris d = uris(doc / "README.md", doc / "scan.md"); !d.info.empty()) return d;
  }
#endif
#if defined(SAFECKPT_SOURCE_DIR)
  if (running_from_build_tree())
    return uris(fs::path(SAFECKPT_SOURCE_DIR) / "README.md", fs::path(SAFECKPT_SOURCE_DIR) / "scanner" / "README.md");
#endif
  return {};
}

// Progress only pays off for many files.
constexpr std::size_t kProgressMinFiles = 2;

struct ScanArgs {
  std::vector<std::string> paths;
  std::vector<std::string> allow_files;
  std::vector<std::string> include, exclude;
  std::vector<std::string> ignore_files;
  std::string format = "text";
  std::string output;
  std::string fail_on = "low";
  std::string base;
  bool follow_symlinks = false;
  bool verify_data = false;
  bool verbose = false;
  bool quiet = false;
  bool no_events = false;
  bool no_color = false;
  bool progress = false;
  int max_nesting = 3;
  std::uint64_t max_memory_mib = 0;
  VerifyInputs verify;  // --signature and its trust options
};

scan::Severity parse_severity(const std::string& s) {
  for (auto v : {scan::Severity::kInfo, scan::Severity::kLow, scan::Severity::kMedium, scan::Severity::kHigh,
                 scan::Severity::kCritical})
    if (scan::severity_name(v) == s) return v;
  return scan::Severity::kLow;  // unreachable: CLI11 checked the name
}

int run_scan(const ScanArgs& a) {
  const bool signed_scan = !a.verify.signature.empty();
  if (!signed_scan && (!a.verify.public_key.empty() || !a.verify.chain.empty() || !a.verify.ignore.empty() ||
                       a.verify.ignore_unsigned)) {
    std::fprintf(stderr,
                 "safeckpt scan: --public-key, --certificate-chain, --ignore-paths and --ignore-unsigned-files "
                 "need --signature\n");
    return 2;
  }
  scan::SignatureCheck check;
  if (signed_scan) {
    if (a.paths.size() != 1) {
      std::fprintf(stderr, "safeckpt scan: --signature verifies one model: give exactly one PATH (got %zu)\n",
                   a.paths.size());
      return 2;
    }
    auto trust = verify_trust(a.verify);
    if (!trust) {
      std::fprintf(stderr, "safeckpt scan: %s\n", trust.error().to_string().c_str());
      return 2;
    }
    check.model = a.paths[0];
    check.bundle = a.verify.signature;
    check.trust = std::move(*trust);
    check.verify = verify_options(a.paths[0], a.verify);
  }
  Allowlist allow = Allowlist::default_policy();
  if (auto st = add_allow_args(allow, a.allow_files); !st) {
    std::fprintf(stderr, "safeckpt scan: %s\n", st.error().to_string().c_str());
    return 2;
  }
  std::vector<scan::IgnoreRule> ignores;
  for (const auto& f : a.ignore_files) {
    auto r = scan::read_ignore_file(f);
    if (!r) {
      std::fprintf(stderr, "safeckpt scan: %s\n", r.error().to_string().c_str());
      return 2;
    }
    ignores.insert(ignores.end(), r->begin(), r->end());
  }
  scan::ReportOptions ro;
  ro.fail_on = parse_severity(a.fail_on);
  ro.tool_version = kToolVersion;
  {
    DocUris d = doc_uris();
    ro.information_uri = std::move(d.info);
    ro.rules_uri = std::move(d.rules);
  }
  ro.verbose = a.verbose;
  {
    std::error_code ec;
    std::filesystem::path base =
        a.base.empty() ? std::filesystem::current_path(ec) : std::filesystem::absolute(a.base, ec);
    if (!ec) ro.base_dir = base.lexically_normal().string();
  }
  scan::WalkOptions wo;
  wo.follow_symlinks = a.follow_symlinks;
  wo.include = a.include;
  wo.exclude = a.exclude;
  std::vector<std::filesystem::path> paths(a.paths.begin(), a.paths.end());
  scan::WalkResult walk = scan::expand_paths(paths, wo);
  // The text report on stdout names them itself (once); other formats and -o/-q get a stderr line.
  const bool text_on_stdout = a.format == "text" && a.output.empty() && !a.quiet;
  if (!text_on_stdout)
    for (const auto& e : walk.errors) std::fprintf(stderr, "safeckpt scan: %s: %s\n", e.path.c_str(), e.reason.c_str());
  if (a.verbose)
    for (const auto& s : walk.skipped)
      std::fprintf(stderr, "safeckpt scan: skipped %s: %s\n", s.path.c_str(), s.reason.c_str());
  ro.skipped = walk.skipped;

  scan::ScanOptions so;
  so.allowlist = &allow;
  apply_max_memory(a.max_memory_mib, so.limits);
  so.verify_data = a.verify_data;
  so.max_nesting = a.max_nesting;
  so.keep_events = !a.no_events;
  // Progress goes to stderr only: on a terminal for scans of several files,
  // or when asked (--progress: plain lines when stderr is not a terminal).
  const bool err_tty = ::isatty(STDERR_FILENO) == 1;
  const bool progress =
      !a.quiet && (a.progress || (err_tty && walk.files.size() + walk.dcp_dirs.size() >= kProgressMinFiles));
  scan::ScanProgress on_progress;
  if (progress)
    on_progress = [err_tty](std::size_t i, std::size_t n, const std::string& path) {
      std::string p = path;
      if (err_tty) {
        if (p.size() > 60) p = "..." + p.substr(p.size() - 57);
        std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", i, n, p.c_str());
      } else {
        std::fprintf(stderr, "[%zu/%zu] %s\n", i, n, p.c_str());
      }
      std::fflush(stderr);
    };
  // DCP directories as one report each, the other files one by one, and
  // every path that was not scanned as a report: counted once, in every format.
  std::vector<scan::FileReport> reports = scan::scan_walk(walk, so, on_progress);
  if (progress && err_tty) std::fprintf(stderr, "\r\033[K");
  if (signed_scan) (void)scan::add_signature_findings(reports, check);
  scan::apply_ignores(reports, ignores, ro.base_dir);
  if (reports.empty()) std::fprintf(stderr, "safeckpt scan: no files to scan\n");

  std::ofstream file;
  std::ostream* out = &std::cout;
  if (!a.output.empty()) {
    file.open(a.output, std::ios::binary | std::ios::trunc);
    if (!file) {
      std::fprintf(stderr, "safeckpt scan: cannot write %s\n", a.output.c_str());
      return 2;
    }
    out = &file;
  }
  if (a.format == "json") {
    *out << scan::to_json(reports, ro) << "\n";
  } else if (a.format == "sarif") {
    *out << scan::to_sarif(reports, ro) << "\n";
  } else if (!a.quiet) {
    // Colours only on a terminal, never with NO_COLOR (https://no-color.org) or --no-color.
    const char* no_color = std::getenv("NO_COLOR");
    ro.color =
        a.output.empty() && !a.no_color && (no_color == nullptr || *no_color == '\0') && ::isatty(STDOUT_FILENO) == 1;
    scan::write_text(*out, reports, ro);
  }
  out->flush();
  return scan::exit_code(reports, ro);
}

}  // namespace

void register_scan(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ScanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "scan",
      "Audit checkpoints without running them: every import and call, archive anomalies, formats that hide code.\n"
      "Exit codes: 0 all clean, 1 any finding (at or above --fail-on), 2 usage error or a path not scanned.");
  cmd->add_option("paths", args->paths, "files and directories (recursive); every file is examined by content")
      ->required();
  cmd->add_option("--allow", args->allow_files, kAllowHelp)->allow_extra_args(false);
  cmd->add_option("--format", args->format, "output: text (default), json (scanner/README.md schema), sarif (2.1.0)")
      ->check(CLI::IsMember({"text", "json", "sarif"}));
  cmd->add_option("-o,--output", args->output, "write the report to this file instead of stdout");
  cmd->add_option("--include", args->include, "glob: only scan files found in directories that match (repeatable)")
      ->allow_extra_args(false);
  cmd->add_option("--exclude", args->exclude, "glob: skip files found in directories that match (repeatable)")
      ->allow_extra_args(false);
  cmd->add_flag("--follow-symlinks", args->follow_symlinks, "follow symlinks found inside directories");
  add_max_memory_option(cmd, args->max_memory_mib);
  cmd->add_flag("--verify-data", args->verify_data, "also check the CRC-32 of tensor data records (reads every byte)");
  cmd->add_option("--max-nesting", args->max_nesting, "depth of embedded payloads followed (default 3)")
      ->check(CLI::Range(0, 16));
  cmd->add_flag("--no-events", args->no_events, "omit the list of every import/call (keep only findings)");
  cmd->add_flag("-v,--verbose", args->verbose, "also list every import and call, allowed or not");
  cmd->add_flag("-q,--quiet", args->quiet, "no text output and no progress line; only the exit code");
  cmd->add_option("--fail-on", args->fail_on,
                  "exit 1 only for a finding at or above this severity: info, low (default: every finding), "
                  "medium, high, critical. Paths not scanned always exit 2")
      ->check(CLI::IsMember({"info", "low", "medium", "high", "critical"}));
  cmd->add_option("--ignore-file", args->ignore_files,
                  "accepted findings, lines `PATH_GLOB RULE` (# comments): listed as suppressed, not counted "
                  "(repeatable; io-error can never be ignored)")
      ->allow_extra_args(false);
  cmd->add_option("--base", args->base, "directory SARIF's %SRCROOT% stands for (default: the current directory)");
  cmd->add_flag("--no-color", args->no_color, "no colours in the text report (also NO_COLOR=1)");
  cmd->add_flag("--progress", args->progress, "progress on stderr even when it is not a terminal");
  // The options of `safeckpt verify` (one parser): the PATH is then the signed model.
  add_verify_options(cmd, args->verify, false);
  cmd->callback([args, &exit_code] { exit_code = run_scan(*args); });
}

}  // namespace safeckpt::cli
