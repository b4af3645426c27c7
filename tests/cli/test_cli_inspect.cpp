// `safeckpt inspect` as a user runs it: exit codes 0 loaded / 1 refused by
// policy / 2 malformed or unreadable, --format json (alias --json) equal to
// the library's tree with its schema version, the text view's values and
// counts, --allow files, safetensors files. Hostile trees: test_deep_trees.cpp.
#include <doctest/doctest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

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

// User test finding: --format json on a file that cannot be described printed
// nothing on stdout. Now one error document (docs/inspect-json.md, "Errors");
// the exit status is the text view's.
TEST_CASE("inspect --format json: refused, malformed and missing files give one JSON error object") {
  auto c211 = kData / "corpus" / "torch-2.11";
  struct Case {
    fs::path file;
    int code;
    const char* name;
    int number;
  };
  for (const Case& c :
       {Case{c211 / "mal_os_system.pt", 1, "disallowed_global", 4},
        Case{c211 / "bad_storage_too_small.pt", 2, "malformed", 1}, Case{"/nonexistent/file.pt", 2, "io", 6}}) {
    CAPTURE(c.file);
    Run r = run("inspect --format json " + c.file.string());
    CHECK(r.code == c.code);
    REQUIRE(nlohmann::json::accept(r.out));
    auto j = nlohmann::json::parse(r.out);
    CHECK(j["$schema_version"] == safeckpt::kInspectJsonSchemaVersion);
    REQUIRE(j.contains("error"));
    CHECK(j["error"]["code"] == c.name);
    CHECK(j["error"]["code_number"] == c.number);
    CHECK(j["error"]["file"] == c.file.string());
    CHECK_FALSE(j["error"]["message"].get<std::string>().empty());
    // Text keeps stdout empty for these: the message is on stderr.
    CHECK(run("inspect " + c.file.string()).out.empty());
  }
  // The refusal says where (record, offset, opcode), as the library's Error does.
  auto lib = safeckpt::load(c211 / "mal_os_system.pt");
  REQUIRE_FALSE(lib.has_value());
  auto j = nlohmann::json::parse(run("inspect --json " + (c211 / "mal_os_system.pt").string()).out);
  CHECK(j["error"]["opcode"] == lib.error().where().opcode);
  CHECK(j["error"]["offset"] == lib.error().where().offset);
}

// User test finding: every member the JSON writes is documented in
// docs/inspect-json.md (the `subclass` member of $tensor was not).
TEST_CASE("inspect --format json: every $tensor member it writes is documented") {
  std::ifstream in(fs::path(SAFECKPT_SOURCE_DIR) / "docs" / "inspect-json.md");
  const std::string doc((std::istreambuf_iterator<char>(in)), {});
  REQUIRE_FALSE(doc.empty());
  std::set<std::string> members;
  std::vector<nlohmann::json> todo;
  auto c211 = kData / "corpus" / "torch-2.11";
  const fs::path subclass = kData / "tensor_subclass" / "my_tensor.pt";
  for (const std::string& args :
       {"inspect --json " + (c211 / "quantized.pt").string(), "inspect --json " + (c211 / "sparse.pt").string(),
        "inspect --json " + (c211 / "training_checkpoint.pt").string(),
        "inspect --json --allow mytensors.MyTensor " + subclass.string()}) {
    Run r = run(args);
    REQUIRE_MESSAGE(r.code == 0, args);
    todo.push_back(nlohmann::json::parse(r.out));
  }
  while (!todo.empty()) {
    nlohmann::json v = std::move(todo.back());
    todo.pop_back();
    if (v.is_object()) {
      if (v.contains("$tensor"))
        for (const auto& [k, x] : v["$tensor"].items()) members.insert(k);
      for (const auto& [k, x] : v.items()) todo.push_back(x);
    } else if (v.is_array()) {
      for (const auto& x : v) todo.push_back(x);
    }
  }
  CHECK(members.count("subclass") == 1);
  for (const auto& m : members) CHECK_MESSAGE(doc.find("`" + m + "`") != std::string::npos, m);
}

// User test finding: the text view dropped values under dict keys that are not
// str/int, and the tensors of a whole module saved with torch.save(model)
// (they have no state_dict path). Both are shown now.
TEST_CASE("inspect text view: values under any dict key, and the tensors inside objects") {
  // tests/data/inspect_keys: gen_inspect_keys.py (PyTorch 1.13), observed.txt.
  Run k = run("inspect " + (kData / "inspect_keys" / "odd_keys.pt").string());
  REQUIRE(k.code == 0);
  for (const char* text : {"\nby_pair.[(1, 2)] ", "  by_pair.[(3, 4)] = 'second'\n", "  by_bool.[True] = 7\n",
                           "  by_none.[None] = 'nothing'\n", "(2 tensors,"})
    CHECK_MESSAGE(k.out.find(text) != std::string::npos, text << "\n" << k.out);
  // A whole nn.Linear(2, 2) (torch.save(model), trusted: its class allowed).
  Run m = run("inspect --allow torch.nn.modules.linear.Linear " +
              (kData / "corpus" / "torch-2.11" / "whole_module.pt").string());
  REQUIRE(m.code == 0);
  for (const char* text : {"(2 tensors,", "\n__dict__._parameters.weight ", "\n__dict__._parameters.bias ",
                           "  <root> = <torch.nn.modules.linear.Linear object>\n", "  __dict__.in_features = 2\n"})
    CHECK_MESSAGE(m.out.find(text) != std::string::npos, text << "\n" << m.out);
}
