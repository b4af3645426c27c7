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

inline CliRun run_cli(const std::string& args, bool merge_stderr = false) {
  const char* cli = std::getenv("SAFECKPT_CLI");
  const std::string cmd =
      std::string(cli ? cli : SAFECKPT_CLI_PATH) + " " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  std::size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int st = pclose(p);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

}  // namespace test_support
