// `safeckpt inspect` as a user runs it: exit codes 0 loaded / 1 refused by
// policy / 2 malformed or unreadable, --json equal to the library's tree,
// --allow files, safetensors files.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/json.hpp"
#include "support/run_cli.hpp"

namespace fs = std::filesystem;

namespace {

using Run = test_support::CliRun;
Run run(const std::string& args) {
  return test_support::run_cli(args);
}

const fs::path kData = fs::path(SAFECKPT_TEST_DATA);

}  // namespace

TEST_CASE("inspect: exit codes follow the refusal kind") {
  auto c211 = kData / "corpus" / "torch-2.11";
  CHECK(run("inspect " + (c211 / "mlp_state_dict.pt").string()).code == 0);
  CHECK(run("inspect " + (c211 / "mal_os_system.pt").string()).code == 1);
  CHECK(run("inspect " + (c211 / "bad_storage_too_small.pt").string()).code == 2);
  CHECK(run("inspect /nonexistent/file.pt").code == 2);
  CHECK(run("inspect").code == 2);  // usage error
  // --allow turns a policy refusal into a load
  auto allow = fs::path(SAFECKPT_SOURCE_DIR) / "allowlist" / "python_values.allow";
  CHECK(run("inspect --allow " + allow.string() + " " + (c211 / "python_values.pt").string()).code == 0);
}

TEST_CASE("inspect --json prints the library's tree; the table names every tensor") {
  auto f = kData / "corpus" / "torch-2.11" / "training_checkpoint.pt";
  Run r = run("inspect --json " + f.string());
  REQUIRE(r.code == 0);
  auto c = safeckpt::load(f);
  REQUIRE(c.has_value());
  CHECK(r.out == *safeckpt::to_json(*c));
  Run t = run("inspect " + f.string());
  REQUIRE(t.code == 0);
  for (const auto& n : c->state_dict()) CHECK_MESSAGE(t.out.find(n.name) != std::string::npos, n.name);
}

TEST_CASE("inspect reads safetensors files written by the reference implementation") {
  int seen = 0;
  for (const auto& e : fs::directory_iterator(kData / "safetensors-ref")) {
    if (e.path().extension() != ".safetensors") continue;
    Run r = run("inspect " + e.path().string());
    CHECK_MESSAGE(r.code == 0, e.path());
    ++seen;
  }
  CHECK(seen >= 1);
}
