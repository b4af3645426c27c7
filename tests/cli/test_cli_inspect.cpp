// `safeckpt inspect` as a user runs it: exit codes 0 loaded / 1 refused by
// policy / 2 malformed or unreadable, --format json (alias --json) equal to
// the library's tree with its schema version, the text view's values and
// counts, --allow files, safetensors files. Hostile trees: test_deep_trees.cpp.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
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
  Run pv = run("inspect --allow " + allow.string() + " " + (c211 / "python_values.pt").string());
  CHECK(pv.code == 0);
  // Values as python_values.json records them, printed the way Python does.
  for (const char* line : {"  complex = (1+2j)\n", "  int_big = 1180591620717411303424\n", "  none = None\n"})
    CHECK_MESSAGE(pv.out.find(line) != std::string::npos, line);
}

TEST_CASE("inspect --json prints the library's tree; the table names every tensor") {
  auto f = kData / "corpus" / "torch-2.11" / "training_checkpoint.pt";
  Run r = run("inspect --json " + f.string());
  REQUIRE(r.code == 0);
  auto c = safeckpt::load(f);
  REQUIRE(c.has_value());
  safeckpt::JsonOptions versioned;
  versioned.schema_version = true;
  auto lib = safeckpt::to_json(*c, versioned);
  REQUIRE_MESSAGE(lib.has_value(), (lib ? "" : lib.error().to_string()));
  CHECK(r.out == *lib);
  Run t = run("inspect " + f.string());
  REQUIRE(t.code == 0);
  for (const auto& n : c->state_dict()) CHECK_MESSAGE(t.out.find(n.name) != std::string::npos, n.name);
}

TEST_CASE("inspect --format json|text; --json is its alias; the JSON carries its schema version") {
  auto f = kData / "corpus" / "torch-2.11" / "training_checkpoint.pt";
  Run alias = run("inspect --json " + f.string());
  Run json = run("inspect --format json " + f.string());
  REQUIRE(json.code == 0);
  CHECK(json.out == alias.out);
  auto doc = nlohmann::json::parse(json.out);
  CHECK(doc["$schema_version"] == safeckpt::kInspectJsonSchemaVersion);
  CHECK(doc.contains("$dict"));  // the root's own member, where consumers read it
  Run text = run("inspect --format text " + f.string());
  CHECK(text.code == 0);
  CHECK(text.out == run("inspect " + f.string()).out);
  CHECK(run("inspect --format xml " + f.string()).code == 2);
  // The schema document the help and README point to is in the repository.
  CHECK(fs::exists(fs::path(SAFECKPT_SOURCE_DIR) / "docs" / "inspect-json.md"));
}

TEST_CASE("inspect text view: non-tensor values by path; the header counts the rows shown") {
  auto f = kData / "corpus" / "torch-2.11" / "training_checkpoint.pt";
  Run t = run("inspect " + f.string());
  REQUIRE(t.code == 0);
  auto c = safeckpt::load(f);
  REQUIRE_MESSAGE(c.has_value(), (c ? "" : c.error().to_string()));
  // Values as tests/data/corpus/torch-2.11/training_checkpoint.json records them.
  for (const char* line : {"  epoch = 3\n", "  global_step = 1200\n", "  optimizer.param_groups.0.lr = 0.001\n",
                           "  config.name = 'run1'\n", "  optimizer.param_groups.0.betas = (0.9, 0.95)\n",
                           "  config.layers = [8, 8, 2]\n"})
    CHECK_MESSAGE(t.out.find(line) != std::string::npos, line);
  const std::size_t rows = c->state_dict().size();
  CHECK_MESSAGE(t.out.find("(" + std::to_string(rows) + " tensors,") != std::string::npos, t.out.substr(0, 200));
  // Rows: lines between the column header and the totals line.
  const std::size_t head = t.out.find('\n', t.out.find("\nname") + 1) + 1;
  const std::size_t total = t.out.find("\ntotal: ");
  REQUIRE(head != std::string::npos);
  REQUIRE(total != std::string::npos);
  std::size_t lines = 0;
  for (std::size_t i = head; i <= total; ++i) lines += t.out[i] == '\n';
  CHECK(lines == rows);
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
