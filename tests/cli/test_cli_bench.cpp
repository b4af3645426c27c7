// `safeckpt bench` as a user runs it. Without a GPU (CI) it must say so and
// exit 2; with one (the GPU machine) it must print the one table with every
// row for the file, the targets, and exit 0. Nothing here asserts on time.
// SAFECKPT_CLI / SAFECKPT_TEST_DATA_DIR override the built-in paths so the
// binary can run on another machine.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/run_cli.hpp"

namespace fs = std::filesystem;

namespace {

using Run = test_support::CliRun;
Run run(const std::string& args) {
  return test_support::run_cli(args, /*merge_stderr=*/true);
}

fs::path data_dir() {
  const char* env = std::getenv("SAFECKPT_TEST_DATA_DIR");
  return env ? fs::path(env) : fs::path(SAFECKPT_TEST_DATA);
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("bench: usage errors exit 2 with a message") {
  Run r = run("bench --device cpu");
  CHECK(r.code == 2);
  CHECK(contains(r.out, "--device must be cuda, cuda:N or N"));
  r = run("bench --runs 0");
  CHECK(r.code != 0);
}

TEST_CASE("bench: one table on a GPU, a clear refusal without one") {
  const fs::path file = data_dir() / "corpus/torch-2.11/mlp_state_dict.pt";
  Run r = run("bench --runs 1 --no-cold " + file.string());
  if (r.code == 2 && (contains(r.out, "no CUDA device") || contains(r.out, "built without CUDA"))) {
    MESSAGE("SKIP (no GPU here): safeckpt bench said: " << r.out.substr(0, r.out.find('\n')));
    return;
  }
  INFO(r.out);
  REQUIRE(r.code == 0);
  for (const char* row : {"| pinned H2D ceiling |", "| safeckpt warm, new engine | mlp_state_dict.pt |",
                          "| safeckpt warm | mlp_state_dict.pt |", "targets (issue 5):", "first tensor"})
    CHECK_MESSAGE(contains(r.out, row), row);
  CHECK_FALSE(contains(r.out, "plain O_DIRECT read"));  // --no-cold
}
