// `safeckpt scan` on PT2 archives (scanner/src/scan_pt2.cpp): real programs
// written by PyTorch 2.11 (tests/data/pt2-2.11, pt2-2.11-extra) are clean
// exactly when the engine's validator accepts them; archives re-zipped from
// the real mlp.core.pt2 with one hostile change each map to one rule and the
// exit code.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "safeckpt/graph.hpp"
#include "safeckpt/scan.hpp"
#include "safeckpt/zip.hpp"
#include "support/pt2_corpus.hpp"
#include "support/run_cli.hpp"
#include "test_scan_helpers.hpp"

using namespace safeckpt;
using namespace safeckpt::scan;
using nlohmann::json;
using scantest::has_text;
using scantest::os_system_pickle;

namespace {

std::string data_dir(const char* which) {
  return test_support::test_data_dir(which);
}
using test_support::archive_records;
std::vector<std::pair<std::string, std::string>> records(const std::string& path) {
  return archive_records(path);
}

// mlp.core.pt2 re-zipped with `edits` (record -> new bytes, nullopt drops it) and `extra` records.
std::string crafted(const std::map<std::string, std::optional<std::string>>& edits,
                    const std::vector<std::pair<std::string, std::string>>& extra = {}) {
  auto v = test_support::crafted_mlp(edits, extra);
  return std::string(v.begin(), v.end());
}

// mlp.core.pt2's data/weights/model_weights_config.json.
json mlp_weights_config() {
  return json::parse(
      test_support::archive_record(data_dir("pt2-2.11") + "mlp.core.pt2", "data/weights/model_weights_config.json"));
}

json mlp_json() {
  return json::parse(test_support::archive_record(data_dir("pt2-2.11") + "mlp.core.pt2", "models/model.json"));
}

FileReport scan_str(const std::string& b) {
  return scan_bytes(Bytes(reinterpret_cast<const std::uint8_t*>(b.data()), b.size()), "x.pt2");
}

int code_of(const FileReport& r) {
  return exit_code({r});
}

const Finding* find_rule(const FileReport& r, Rule rule) {
  for (const auto& f : r.findings)
    if (f.rule == rule) return &f;
  return nullptr;
}

std::string dump_findings(const FileReport& r) {
  std::string s = std::string(verdict_name(r.verdict)) + "\n";
  for (const auto& f : r.findings)
    s += std::string(rule_info(f.rule).id) + " " + std::string(severity_name(f.severity)) + " [" + f.member + "] " +
         f.message + "\n";
  return s;
}

bool engine_accepts(const std::string& path) {
  auto a = graph::Pt2Archive::open_file(path);
  if (!a) return false;
  for (const auto& m : a->models()) {
    auto p = a->program(m);
    if (!p) return false;
    graph::Program copy = **p;
    if (!graph::validate(copy)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("scan/pt2: the 2.11 corpus programs are clean, with the engine's verdict") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(data_dir("pt2-2.11"))) {
    if (e.path().extension() != ".pt2") continue;
    ++n;
    auto r = scan_file(e.path());
    INFO(e.path().filename().string() << "\n" << dump_findings(r));
    CHECK(r.format == "pt2_archive");
    CHECK(r.verdict == Verdict::kClean);
    CHECK(r.loader.ran);
    CHECK(r.loader.ok);
    CHECK(r.findings.empty());
    CHECK(code_of(r) == 0);
  }
  CHECK(n == 10);
}

TEST_CASE("scan/pt2: clean exactly when the engine accepts the program (extra corpus)") {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(data_dir("pt2-2.11-extra"))) {
    const std::string name = e.path().filename().string();
    if (e.path().extension() != ".pt2" || name.find(".flat.") != std::string::npos ||
        name.find("skeleton") != std::string::npos)
      continue;
    ++n;
    auto r = scan_file(e.path());
    INFO(name << "\n" << dump_findings(r));
    const bool accepted = engine_accepts(e.path().string());
    CHECK(r.loader.ok == accepted);
    CHECK((r.verdict == Verdict::kClean) == accepted);
    CHECK((code_of(r) == 0) == accepted);
    if (!accepted) CHECK(r.findings.size() > 0);
  }
  // bert, llama, llama_cuda, llama_cuda_bf16, mlp_small, resnet_tiny: train + core each; misaligned_linear: train
  CHECK(n == 13);
}

TEST_CASE("scan/pt2: the bf16 CUDA export (cudnn attention, SymInt outputs) is clean") {
  // _scaled_dot_product_cudnn_attention lists as_sym_int and as_none among
  // its outputs; the reader and validator accept it, so the scan does.
  const std::string path = data_dir("pt2-2.11-extra") + "llama_cuda_bf16.core.pt2";
  auto r = scan_file(path);
  INFO(dump_findings(r));
  CHECK(engine_accepts(path));
  CHECK(r.format == "pt2_archive");
  CHECK(r.verdict == Verdict::kClean);
  CHECK(r.loader.ok);
  CHECK(r.findings.empty());
  CHECK(code_of(r) == 0);
}

TEST_CASE("scan/pt2: AOTInductor code records are critical SCK130 findings, one per record") {
  auto r = scan_str(crafted({}, {{"data/aotinductor/model/model.so",
                                  "\x7f"
                                  "ELF\x02\x01\x01"},
                                 {"data/aotinductor/model/kernel.ptx", ".version 8.0"},
                                 {"extra/helper.cpp", "int main() {}"}}));
  INFO(dump_findings(r));
  int code = 0;
  for (const auto& f : r.findings)
    if (f.rule == Rule::kExecutableCode) {
      ++code;
      CHECK(f.severity == Severity::kCritical);
    }
  CHECK(code == 3);
  CHECK(has_text(r, Rule::kExecutableCode, "model.so"));
  CHECK(has_text(r, Rule::kExecutableCode, "kernel.ptx"));
  CHECK(has_text(r, Rule::kExecutableCode, "helper.cpp"));
  CHECK(rule_info(Rule::kExecutableCode).id == "SCK130");
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK_FALSE(r.loader.ok);
  CHECK(code_of(r) == 1);
}

TEST_CASE("scan/pt2: ops the engine does not run are SCK131 naming the op and the node") {
  struct Case {
    const char* target;
    const char* says;
  };
  for (Case c : {Case{"torch.ops.aten.frobnicate.default", "allowlist"},
                 Case{"torch.ops.mylib.evil.default", "custom namespace"},
                 Case{"torch.ops.higher_order.cond", "higher-order"}}) {
    json j = mlp_json();
    auto& nodes = j["graph_module"]["graph"]["nodes"];
    std::string node = nodes[nodes.size() - 1]["name"];
    nodes[nodes.size() - 1]["target"] = c.target;
    auto r = scan_str(crafted({{"models/model.json", j.dump()}}));
    INFO(c.target << "\n" << dump_findings(r));
    const Finding* f = find_rule(r, Rule::kPt2Op);
    REQUIRE(f != nullptr);
    CHECK(rule_info(Rule::kPt2Op).id == "SCK131");
    CHECK(f->message.find(c.target) != std::string::npos);
    CHECK(f->message.find("'" + node + "'") != std::string::npos);
    CHECK(f->message.find(c.says) != std::string::npos);
    CHECK(f->global == c.target);
    CHECK(f->member == "mlp.core/models/model.json");
    CHECK(r.verdict == Verdict::kUnsafe);
    CHECK(code_of(r) == 1);
  }
}

TEST_CASE("scan/pt2: a buffer mutation in the signature is SCK132") {
  json j = mlp_json();
  auto& outs = j["graph_module"]["signature"]["output_specs"];
  outs.push_back(json{{"buffer_mutation", {{"arg", {{"name", "x"}}}, {"buffer_name", "fc1.weight"}}}});
  // torch.export returns the new buffer value as a graph output too.
  j["graph_module"]["graph"]["outputs"].push_back(json{{"as_tensor", {{"name", "x"}}}});
  auto r = scan_str(crafted({{"models/model.json", j.dump()}}));
  INFO(dump_findings(r));
  const Finding* f = find_rule(r, Rule::kPt2Mutation);
  REQUIRE(f != nullptr);
  CHECK(rule_info(Rule::kPt2Mutation).id == "SCK132");
  CHECK(f->message.find("buffer_mutation") != std::string::npos);
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK(code_of(r) == 1);
}

TEST_CASE("scan/pt2: a pickled weight naming os.system: SCK101 on its record, SCK133 for the archive") {
  json cfg = mlp_weights_config();
  auto& entry = cfg["config"].begin().value();
  entry["use_pickle"] = true;
  const std::string rec = "data/weights/" + entry["path_name"].get<std::string>();
  auto r = scan_str(crafted({{"data/weights/model_weights_config.json", cfg.dump()}, {rec, os_system_pickle()}}));
  INFO(dump_findings(r));
  bool dangerous = false;
  for (const auto& f : r.findings)
    if (f.rule == Rule::kImportDangerous && f.global == "os.system" && f.member == "mlp.core/" + rec) dangerous = true;
  CHECK(dangerous);
  const Finding* f = find_rule(r, Rule::kPt2Refused);
  REQUIRE(f != nullptr);
  CHECK(rule_info(Rule::kPt2Refused).id == "SCK133");
  CHECK(f->message.find("disallowed_global") != std::string::npos);
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK(code_of(r) == 1);
}

TEST_CASE("scan/pt2: raw weight records are not sniffed as pickles; pickled sample inputs are scanned") {
  // A raw record whose bytes happen to spell a pickle importing os.system is
  // tensor data to the engine (use_pickle: false): no import finding. The
  // same bytes as a sample-inputs record are scanned like any pickle.
  json cfg = mlp_weights_config();
  std::string bias_rec;
  std::size_t bias_bytes = 0;
  for (auto& [name, data] : records(data_dir("pt2-2.11") + "mlp.core.pt2"))
    if (name.rfind("data/weights/weight_", 0) == 0 && data.size() >= 64 &&
        (bias_rec.empty() || data.size() < bias_bytes)) {
      bias_rec = name;
      bias_bytes = data.size();
    }
  std::string payload = os_system_pickle();
  REQUIRE(payload.size() <= bias_bytes);
  payload.resize(bias_bytes, '\0');
  auto raw = scan_str(crafted({{bias_rec, payload}}));
  INFO(dump_findings(raw));
  CHECK(find_rule(raw, Rule::kImportDangerous) == nullptr);
  auto sample = scan_str(crafted({{"data/sample_inputs/model.pt", os_system_pickle()}}));
  INFO(dump_findings(sample));
  const Finding* f = find_rule(sample, Rule::kImportDangerous);
  REQUIRE(f != nullptr);
  CHECK(sample.verdict == Verdict::kUnsafe);
}

TEST_CASE("scan/pt2: malformed program JSON is SCK160 naming the record; exit 1") {
  std::string text = mlp_json().dump();
  auto r = scan_str(crafted({{"models/model.json", text.substr(0, text.size() / 2)}}));
  INFO(dump_findings(r));
  const Finding* f = find_rule(r, Rule::kMalformed);
  REQUIRE(f != nullptr);
  CHECK(f->message.find("the engine refuses this PT2 archive") != std::string::npos);
  CHECK(r.verdict == Verdict::kIncomplete);
  CHECK(code_of(r) == 1);
}

TEST_CASE("scan/pt2: the CLI reports the rules in JSON and SARIF and exits 1 / 0") {
  const std::string dir = data_dir("pt2-2.11");
  auto clean = test_support::run_cli("scan --format json " + dir + "mlp.core.pt2");
  CHECK(clean.code == 0);
  json jc = json::parse(clean.out);
  CHECK(jc["files"][0]["verdict"] == "clean");
  CHECK(jc["files"][0]["format"] == "pt2_archive");
  json j = mlp_json();
  j["graph_module"]["graph"]["nodes"][0]["target"] = "torch.ops.mylib.evil.default";
  auto bytes = crafted({{"models/model.json", j.dump()}});
  const auto path = std::filesystem::temp_directory_path() / ("scan_pt2_" + std::to_string(::getpid()) + ".pt2");
  {
    std::ofstream o(path, std::ios::binary);
    o << bytes;
  }
  auto bad = test_support::run_cli("scan --format json " + path.string());
  CHECK(bad.code == 1);
  json jb = json::parse(bad.out);
  bool seen = false;
  for (const auto& f : jb["files"][0]["findings"])
    if (f["rule"] == "SCK131" && f["rule_name"] == "pt2-op-not-allowed") seen = true;
  CHECK(seen);
  auto sarif = test_support::run_cli("scan --format sarif " + path.string());
  CHECK(sarif.code == 1);
  json js = json::parse(sarif.out);
  bool rule_listed = false;
  for (const auto& rr : js["runs"][0]["tool"]["driver"]["rules"])
    if (rr["id"] == "SCK131") rule_listed = true;
  CHECK(rule_listed);
  CHECK(js["runs"][0]["results"][0]["ruleId"].is_string());
  std::filesystem::remove(path);
}

TEST_CASE("scan/pt2: a decoy raw entry on a pickled record does not hide its pickle (review 2026-12-06)") {
  // One record named by two config entries: use_pickle: true (PyTorch
  // torch.load()s it, weights_only=False) and use_pickle: false. The raw
  // entry must not exempt the record from the pickle scan.
  json cfg = mlp_weights_config();
  auto& entry = cfg["config"].begin().value();
  entry["use_pickle"] = true;
  const std::string path = entry["path_name"].get<std::string>();
  json decoy = entry;
  decoy["use_pickle"] = false;
  cfg["config"]["decoy.weight"] = decoy;
  const std::string rec = "data/weights/" + path;
  auto r = scan_str(crafted({{"data/weights/model_weights_config.json", cfg.dump()}, {rec, os_system_pickle()}}));
  INFO(dump_findings(r));
  bool dangerous = false;
  for (const auto& f : r.findings)
    if (f.rule == Rule::kImportDangerous && f.global == "os.system" && f.member == "mlp.core/" + rec) dangerous = true;
  CHECK(dangerous);
  CHECK(r.verdict == Verdict::kUnsafe);
  CHECK(code_of(r) == 1);
}

TEST_CASE("scan/pt2: weights whose config meta disagrees with the program are not clean (review 2026-12-06)") {
  // fc3.bias's config tensor_meta made [1, 10] (record and program: [10]):
  // `run` refuses to bind it, so `scan` must not call the archive clean.
  json cfg = mlp_weights_config();
  json& meta = cfg["config"]["fc3.bias"]["tensor_meta"];
  REQUIRE(meta["sizes"].size() == 1);
  meta["sizes"] = json::array({{{"as_int", 1}}, meta["sizes"][0]});
  meta["strides"] = json::array({meta["sizes"][1], {{"as_int", 1}}});
  auto r = scan_str(crafted({{"data/weights/model_weights_config.json", cfg.dump()}}));
  INFO(dump_findings(r));
  CHECK(r.verdict != Verdict::kClean);
  const Finding* f = find_rule(r, Rule::kMalformed);
  REQUIRE(f != nullptr);
  CHECK(f->message.find("fc3.bias") != std::string::npos);
  CHECK(code_of(r) == 1);
}
