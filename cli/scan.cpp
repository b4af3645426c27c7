// `safeckpt scan PATH...`: audit checkpoints without running them.
// The work is in the safeckpt_scanner library (scanner/include/safeckpt/scan.hpp);
// this file parses options, expands paths and prints the report.
// Exit codes: 0 every file clean (or not a model file), 1 any finding,
// 2 usage error or a path that could not be read.
#include "safeckpt/scan.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "allow_arg.hpp"
#include "commands.hpp"

namespace safeckpt::cli {
namespace {

struct ScanArgs {
  std::vector<std::string> paths;
  std::vector<std::string> allow_files;
  std::vector<std::string> include, exclude;
  std::string format = "text";
  std::string output;
  bool follow_symlinks = false;
  bool verify_data = false;
  bool verbose = false;
  bool quiet = false;
  bool no_events = false;
  int max_nesting = 3;
};

int run_scan(const ScanArgs& a) {
  Allowlist allow = Allowlist::default_policy();
  if (auto st = add_allow_args(allow, a.allow_files); !st) {
    std::fprintf(stderr, "safeckpt scan: %s\n", st.error().to_string().c_str());
    return 2;
  }
  scan::WalkOptions wo;
  wo.follow_symlinks = a.follow_symlinks;
  wo.include = a.include;
  wo.exclude = a.exclude;
  std::vector<std::filesystem::path> paths(a.paths.begin(), a.paths.end());
  scan::WalkResult walk = scan::expand_paths(paths, wo);
  for (const auto& e : walk.errors) std::fprintf(stderr, "safeckpt scan: %s\n", e.c_str());
  if (a.verbose)
    for (const auto& s : walk.skipped) std::fprintf(stderr, "safeckpt scan: skipped %s\n", s.c_str());

  scan::ScanOptions so;
  so.allowlist = &allow;
  so.verify_data = a.verify_data;
  so.max_nesting = a.max_nesting;
  so.keep_events = !a.no_events;
  const bool progress = !a.quiet && ::isatty(STDERR_FILENO) == 1;
  std::vector<scan::FileReport> reports;
  reports.reserve(walk.files.size());
  for (std::size_t i = 0; i < walk.files.size(); ++i) {
    if (progress) {
      std::string p = walk.files[i].string();
      if (p.size() > 60) p = "..." + p.substr(p.size() - 57);
      std::fprintf(stderr, "\r\033[K[%zu/%zu] %s", i + 1, walk.files.size(), p.c_str());
      std::fflush(stderr);
    }
    reports.push_back(scan::scan_file(walk.files[i], so));
  }
  if (progress) std::fprintf(stderr, "\r\033[K");

  std::string text;
  if (a.format == "json") {
    text = scan::to_json(reports, walk.errors) + "\n";
  } else if (a.format == "sarif") {
    text = scan::to_sarif(reports) + "\n";
  }
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
  if (a.format == "text") {
    if (!a.quiet) scan::write_text(*out, reports, a.verbose);
  } else {
    *out << text;
  }
  out->flush();
  int rc = scan::exit_code(reports);
  if (!walk.errors.empty() || walk.files.empty()) rc = 2;
  if (walk.files.empty() && walk.errors.empty()) std::fprintf(stderr, "safeckpt scan: no files to scan\n");
  return rc;
}

}  // namespace

void register_scan(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ScanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "scan",
      "Audit checkpoints without running them: every import and call, archive anomalies, formats that hide code.\n"
      "Exit codes: 0 all clean, 1 any finding, 2 usage error or unreadable path.");
  cmd->add_option("paths", args->paths, "files and directories (recursive); every file is examined by content")
      ->required();
  cmd->add_option("--allow", args->allow_files, kAllowHelp);
  cmd->add_option("--format", args->format, "output: text (default), json (scanner/README.md schema), sarif (2.1.0)")
      ->check(CLI::IsMember({"text", "json", "sarif"}));
  cmd->add_option("-o,--output", args->output, "write the report to this file instead of stdout");
  cmd->add_option("--include", args->include, "glob: only scan files found in directories that match (repeatable)");
  cmd->add_option("--exclude", args->exclude, "glob: skip files found in directories that match (repeatable)");
  cmd->add_flag("--follow-symlinks", args->follow_symlinks, "follow symlinks found inside directories");
  cmd->add_flag("--verify-data", args->verify_data, "also check the CRC-32 of tensor data records (reads every byte)");
  cmd->add_option("--max-nesting", args->max_nesting, "depth of embedded payloads followed (default 3)")
      ->check(CLI::Range(0, 16));
  cmd->add_flag("--no-events", args->no_events, "omit the list of every import/call (keep only findings)");
  cmd->add_flag("-v,--verbose", args->verbose, "also list every import and call, allowed or not");
  cmd->add_flag("-q,--quiet", args->quiet, "no text output and no progress line; only the exit code");
  cmd->callback([args, &exit_code] { exit_code = run_scan(*args); });
}

}  // namespace safeckpt::cli
