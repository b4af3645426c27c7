// Runs the `safeckpt` CLI as a user would, for the CLI tests. The binary is
// the one this build made (SAFECKPT_CLI_PATH) unless the SAFECKPT_CLI
// environment variable names another (running the tests on another machine).
#pragma once

#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace test_support {

struct CliRun {
  int code;         // exit status, -1 if killed
  std::string out;  // stdout (and stderr with merge_stderr)
};

// The CLI under test: $SAFECKPT_CLI (e.g. a binary on the GPU machine) or the build's.
inline std::string cli_path() {
  const char* cli = std::getenv("SAFECKPT_CLI");
  return cli ? cli : SAFECKPT_CLI_PATH;
}

// Runs a shell command line; its stdout (redirect stderr in `line` to see it).
inline CliRun run_shell(const std::string& line) {
  FILE* p = popen(line.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

inline CliRun run_cli(const std::string& args, bool merge_stderr = false) {
  return run_shell(cli_path() + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null"));
}

}  // namespace test_support
