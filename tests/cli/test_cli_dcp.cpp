// `safeckpt inspect|scan|convert DIR` on torch.distributed.checkpoint
// directories written by PyTorch 2.11 (tests/data/dcp-2.11).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "safeckpt/safetensors.hpp"
#include "support/run_cli.hpp"

namespace fs = std::filesystem;
using safeckpt::SafetensorsFile;

namespace {

const fs::path kDcp = fs::path(SAFECKPT_TEST_DATA) / "dcp-2.11";

fs::path copy_dir(const fs::path& src, const std::string& tag) {
  const fs::path dir = fs::temp_directory_path() / ("safeckpt_cli_dcp_" + tag);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), dir / e.path().filename());
  return dir;
}

// Every tensor of the safetensors file `ref` is in `got` with the same bytes,
// and `got` has no others.
void check_same_tensors(const fs::path& got_path, const fs::path& ref_path) {
  auto got = SafetensorsFile::open(got_path);
  REQUIRE_MESSAGE(got.has_value(), (got ? "" : got.error().to_string()));
  auto ref = SafetensorsFile::open(ref_path);
  REQUIRE_MESSAGE(ref.has_value(), (ref ? "" : ref.error().to_string()));
  REQUIRE(got->tensors().size() == ref->tensors().size());
  for (const auto& t : ref->tensors()) {
    CAPTURE(t.name);
    const auto* g = got->find(t.name);
    REQUIRE(g != nullptr);
    const bool same = std::vector<std::uint8_t>(g->data.begin(), g->data.end()) ==
                      std::vector<std::uint8_t>(t.data.begin(), t.data.end());
    CHECK(same);
  }
}

// `safeckpt convert DCP_DIR base/a.safetensors` gives the same tensors, byte
// for byte, as `safeckpt convert SRC base/b.safetensors` (the checkpoint the
// directory was written from).
void check_consolidates_like_direct(const fs::path& dcp_dir, const fs::path& src, const fs::path& base) {
  REQUIRE(test_support::run_cli("convert " + dcp_dir.string() + " " + (base / "a.safetensors").string()).code == 0);
  REQUIRE(test_support::run_cli("convert " + src.string() + " " + (base / "b.safetensors").string()).code == 0);
  check_same_tensors(base / "a.safetensors", base / "b.safetensors");
}

}  // namespace

TEST_CASE("cli dcp: inspect lists tensors, chunks and non-tensor values") {
  auto r = test_support::run_cli("inspect " + (kDcp / "placements-ws3" / "dcp").string());
  REQUIRE(r.code == 0);
  CHECK(r.out.find("6 tensors, 6 other items, 3 data files") != std::string::npos);
  CHECK(r.out.find("model.b  bfloat16 [4, 12]  3 chunks") != std::string::npos);
  CHECK(r.out.find("at [0, 8] size [4, 4]  __2_0.distcp") != std::string::npos);
  CHECK(r.out.find("step = 7") != std::string::npos);
}

TEST_CASE("cli dcp: scan is clean on real directories and finds damaged ones") {
  for (const char* c : {"placements-ws2", "uneven-ws4", "mesh2d-ws4", "fsdp2-adamw-ws2"}) {
    CAPTURE(c);
    auto r = test_support::run_cli("scan " + (kDcp / c / "dcp").string());
    CHECK(r.code == 0);
    CHECK(r.out.find("clean") != std::string::npos);
  }
  const fs::path d = copy_dir(kDcp / "placements-ws2" / "dcp", "scan");
  fs::resize_file(d / "__0_0.distcp", fs::file_size(d / "__0_0.distcp") - 100);
  auto r = test_support::run_cli("scan " + d.string());
  CHECK(r.code == 1);
  CHECK(r.out.find("INCOMPLETE [dcp_directory") != std::string::npos);
  CHECK(r.out.find("__0_0.distcp") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("cli dcp: scan reports a DCP directory in every format, with -o, --fail-on and --quiet") {
  // Review 2026-12-06: a DCP directory got one text line whatever --format,
  // -o or --fail-on said, so a CI step reading the JSON report saw nothing.
  const fs::path base = fs::temp_directory_path() / "safeckpt_cli_dcp_formats";
  fs::remove_all(base);
  fs::create_directories(base);
  const fs::path real = kDcp / "placements-ws2" / "dcp";
  auto j = test_support::run_cli("scan --format json -o " + (base / "r.json").string() + " " + real.string());
  CHECK(j.code == 0);
  {
    std::ifstream in(base / "r.json");
    const auto doc = nlohmann::json::parse(in);
    REQUIRE(doc["files"].size() == 1);
    CHECK(doc["files"][0]["format"] == "dcp_directory");
    CHECK(doc["files"][0]["verdict"] == "clean");
    CHECK(doc["files"][0]["loader"]["by"] == "dcp");
    CHECK(doc["summary"]["exit_code"] == 0);
  }
  const fs::path bad = copy_dir(real, "formats_bad");
  fs::resize_file(bad / "__1_0.distcp", fs::file_size(bad / "__1_0.distcp") - 1);
  auto sarif = test_support::run_cli("scan --format sarif " + bad.string());
  CHECK(sarif.code == 1);
  {
    const auto doc = nlohmann::json::parse(sarif.out);
    CHECK(doc["version"] == "2.1.0");
    CHECK(doc["runs"][0]["results"].size() >= 1);
    CHECK(doc["runs"][0]["results"][0]["ruleId"] == "SCK180");
  }
  // Damage, not code: --fail-on critical passes it, as for any file.
  CHECK(test_support::run_cli("scan --fail-on critical " + bad.string()).code == 0);
  auto quiet = test_support::run_cli("scan -q " + bad.string());
  CHECK(quiet.code == 1);
  CHECK(quiet.out.empty());
  fs::remove_all(bad);
  fs::remove_all(base);
}

TEST_CASE("cli dcp: inspect reads every payload: a chunk that is not its tensor is refused") {
  // Review 2026-12-06: inspect parsed .metadata only and exited 0 on a
  // directory that scan and convert refuse. Two equal-length payloads of
  // __0_0.distcp swapped (a float16 [6, 2] chunk and an int64 [5] one:
  // placements-ws2/metadata_repr.txt): every range still lies in the file.
  const fs::path d = copy_dir(kDcp / "placements-ws2" / "dcp", "inspect_swap");
  std::string bytes;
  {
    std::ifstream in(d / "__0_0.distcp", std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  REQUIRE(bytes.size() > 3154);
  bytes = bytes.substr(1577, 1577) + bytes.substr(0, 1577) + bytes.substr(3154);
  std::ofstream(d / "__0_0.distcp", std::ios::binary | std::ios::trunc) << bytes;
  auto r = test_support::run_cli("inspect " + d.string(), true);
  CHECK(r.code == 2);
  CHECK(r.out.find("dtype") != std::string::npos);
  auto ok = test_support::run_cli("inspect " + (kDcp / "placements-ws2" / "dcp").string());
  CHECK(ok.code == 0);
  CHECK(ok.out.find("payloads: ") != std::string::npos);
  fs::remove_all(d);
}

TEST_CASE("cli dcp: scan audits the files beside a DCP checkpoint too (a pickle there is not passed over)") {
  // Review 2026-12-06: a real directory plus an os.system pickle scanned
  // clean, since only what .metadata names was read.
  const fs::path d = copy_dir(kDcp / "uneven-ws4" / "dcp", "extra");
  fs::copy_file(fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mal_os_system.pt", d / "evil.pt");
  auto r = test_support::run_cli("scan " + d.string());
  INFO(r.out);
  CHECK(r.code == 1);
  CHECK(r.out.find("CLEAN [dcp_directory") != std::string::npos);  // the checkpoint itself
  CHECK(r.out.find("evil.pt") != std::string::npos);
  CHECK(r.out.find("os.system") != std::string::npos);
  fs::remove(d / "evil.pt");
  r = test_support::run_cli("scan " + d.string());
  CHECK(r.code == 0);
  fs::remove_all(d);
}

TEST_CASE("cli dcp: convert DIR OUT.safetensors equals PyTorch's full tensors") {
  const fs::path out = fs::temp_directory_path() / "safeckpt_cli_dcp_fsdp2.safetensors";
  fs::remove(out);
  auto r = test_support::run_cli("convert " + (kDcp / "fsdp2-adamw-ws2" / "dcp").string() + " " + out.string());
  REQUIRE(r.code == 0);
  check_same_tensors(out, kDcp / "fsdp2-adamw-ws2" / "full.safetensors");
  // Exists: refused without --force.
  CHECK(test_support::run_cli("convert " + (kDcp / "fsdp2-adamw-ws2" / "dcp").string() + " " + out.string()).code == 2);
  fs::remove(out);
}

TEST_CASE("cli dcp: convert DIR OUT.pt writes the nested state dict") {
  const fs::path out = fs::temp_directory_path() / "safeckpt_cli_dcp_placements.pt";
  fs::remove(out);
  auto r = test_support::run_cli("convert " + (kDcp / "placements-ws4" / "dcp").string() + " " + out.string());
  REQUIRE(r.code == 0);
  auto shown = test_support::run_cli("inspect " + out.string());
  REQUIRE(shown.code == 0);
  CHECK(shown.out.find("model.layers.1") != std::string::npos);
  CHECK(shown.out.find("config.betas") != std::string::npos);
  fs::remove(out);
}

TEST_CASE("cli dcp: convert FILE --to-dcp OUTDIR, then inspect, scan and consolidate it") {
  const fs::path base = fs::temp_directory_path() / "safeckpt_cli_to_dcp";
  fs::remove_all(base);
  fs::create_directories(base);
  const fs::path src = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mlp_state_dict.pt";
  const fs::path out = base / "dcp";
  auto r = test_support::run_cli("convert " + src.string() + " --to-dcp " + out.string(), true);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("wrote " + out.string()) != std::string::npos);
  auto shown = test_support::run_cli("inspect " + out.string());
  REQUIRE(shown.code == 0);
  CHECK(shown.out.find("1 data files") != std::string::npos);
  auto scanned = test_support::run_cli("scan " + out.string());
  CHECK(scanned.code == 0);
  CHECK(scanned.out.find("clean") != std::string::npos);
  // Consolidated back to safetensors: the same tensors as the file converted directly.
  check_consolidates_like_direct(out, src, base);
  // An existing OUTDIR is never replaced, not even with --force.
  auto again = test_support::run_cli("convert " + src.string() + " --to-dcp " + out.string(), true);
  CHECK(again.code == 2);
  CHECK(again.out.find("exists") != std::string::npos);
  CHECK(test_support::run_cli("convert " + src.string() + " --to-dcp " + (base / "other").string() + " --force").code ==
        2);
  CHECK(!fs::exists(base / "other"));
  fs::remove_all(base);
}

TEST_CASE("cli dcp: convert FILE --to-dcp OUTDIR --world-size 3 writes one file per rank; 0 and misuse refused") {
  const fs::path base = fs::temp_directory_path() / "safeckpt_cli_to_dcp_ws";
  fs::remove_all(base);
  fs::create_directories(base);
  const fs::path src = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mlp_state_dict.pt";
  const fs::path out = base / "dcp3";
  auto r = test_support::run_cli("convert " + src.string() + " --to-dcp " + out.string() + " --world-size 3", true);
  REQUIRE(r.code == 0);
  CHECK(r.out.find("world size 3") != std::string::npos);
  for (const char* f : {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", ".metadata"}) CHECK(fs::exists(out / f));
  auto shown = test_support::run_cli("inspect " + out.string());
  REQUIRE(shown.code == 0);
  CHECK(shown.out.find("3 data files") != std::string::npos);
  auto scanned = test_support::run_cli("scan " + out.string());
  CHECK(scanned.code == 0);
  // Consolidated: the same tensors as the file converted directly.
  check_consolidates_like_direct(out, src, base);
  auto zero =
      test_support::run_cli("convert " + src.string() + " --to-dcp " + (base / "z").string() + " --world-size 0", true);
  CHECK(zero.code == 2);
  CHECK(zero.out.find("world size 0") != std::string::npos);
  auto huge = test_support::run_cli(
      "convert " + src.string() + " --to-dcp " + (base / "h").string() + " --world-size 100000", true);
  CHECK(huge.code == 2);
  CHECK(huge.out.find("max_files") != std::string::npos);
  auto misuse = test_support::run_cli(
      "convert " + src.string() + " " + (base / "c.safetensors").string() + " --world-size 2", true);
  CHECK(misuse.code == 2);
  CHECK(misuse.out.find("--to-dcp") != std::string::npos);
  CHECK(!fs::exists(base / "z"));
  CHECK(!fs::exists(base / "h"));
  CHECK(!fs::exists(base / "c.safetensors"));
  fs::remove_all(base);
}
