// `safeckpt scan --signature`: the model verified against its OpenSSF Model
// Signing bundle, the outcome as findings SCK200-SCK204 beside the per-file
// parse findings (scanner/src/scan_sign.cpp), in text, JSON and SARIF. Real
// data: model_signing's own signed samples (tests/data/oms, copied from
// ../shared/oms) and models signed by `safeckpt sign` holding real PyTorch
// checkpoints, then modified after signing.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/dcp_cases.hpp"
#include "support/run_cli.hpp"
#include "support/save_util.hpp"

namespace fs = std::filesystem;
using nlohmann::json;
using safeckpt::save_test::TempDir;
using test_support::run_cli;
using test_support::run_shell;

namespace {

const fs::path kOms = fs::path(SAFECKPT_TEST_DATA) / "oms";
const fs::path kSamples = kOms / "model-transparency" / "scripts" / "tests";
const fs::path kKeys = kSamples / "keys" / "certificate";
const std::string kPub = " --public-key '" + (kKeys / "signing-key-pub.pem").string() + "'";
const std::string kCa = " --certificate-chain '" + (kKeys / "ca-cert.pem").string() + "'";

std::string q(const fs::path& p) {
  return "'" + p.string() + "'";
}
void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}

// The report of the file whose path ends with `suffix` (nullptr: none).
const json* report(const json& j, const std::string& suffix) {
  for (const json& f : j["files"]) {
    const std::string p = f["path"];
    if (p.size() >= suffix.size() && p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0) return &f;
  }
  return nullptr;
}
// Rule ids of a report's findings, in order.
std::vector<std::string> rule_ids(const json* r) {
  std::vector<std::string> out;
  if (r != nullptr)
    for (const json& f : (*r)["findings"]) out.push_back(f["rule"]);
  return out;
}
bool has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

json scan_json(const std::string& args, int expect_code) {
  auto r = run_cli("scan --format json " + args);
  CHECK_MESSAGE(r.code == expect_code, (args + "\n" + r.out));
  json j = json::parse(r.out, nullptr, false);
  REQUIRE_MESSAGE(!j.is_discarded(), r.out);
  CHECK(j["summary"]["exit_code"] == expect_code);
  return j;
}

// A copy of a reference sample that can be modified.
fs::path copy_sample(const TempDir& t, const std::string& name) {
  const fs::path dst = t.path / name;
  fs::copy(kSamples / name, dst, fs::copy_options::recursive);
  return dst;
}

// A model of real checkpoints signed by `safeckpt sign` with the minted P-256 key:
// mlp_state_dict.pt (PyTorch 2.11; clean), argparse_namespace.pt (PyTorch 1.13;
// imports argparse.Namespace: a parse finding), config.json.
fs::path signed_model(const TempDir& t) {
  const fs::path m = t.path / "model";
  fs::create_directories(m);
  const fs::path data(SAFECKPT_TEST_DATA);
  fs::copy_file(data / "corpus" / "torch-2.11" / "mlp_state_dict.pt", m / "mlp.pt");
  fs::copy_file(data / "corpus" / "torch-1.13" / "argparse_namespace.pt", m / "ns.pt");
  spit(m / "config.json", R"({"hidden": 4})");
  auto s = run_cli(
      "sign " + q(m) + " --signature " + q(m / "model.sig") + " --private-key " + q(kOms / "minted" / "p256-key.pem"),
      true);
  REQUIRE_MESSAGE(s.code == 0, s.out);
  return m;
}
const std::string kP256 = " --public-key '" + (kOms / "minted" / "p256-pub.pem").string() + "'";

}  // namespace

TEST_CASE("scan --signature: model_signing's samples verify as findings (key, certificate, single file)") {
  // v1.1.0 key sample: directory, hint form, ignore_paths recorded in the bundle.
  const fs::path k = kSamples / "v1.1.0-elliptic-key";
  json j = scan_json(q(k) + " --signature " + q(k / "model.sig") + kPub, 0);
  const json* b = report(j, "model.sig");
  REQUIRE(b != nullptr);
  CHECK((*b)["format"] == "oms_bundle");
  CHECK((*b)["verdict"] == "clean");
  REQUIRE(rule_ids(b) == std::vector<std::string>{"SCK204"});
  CHECK((*b)["findings"][0]["severity"] == "info");
  const std::string msg = (*b)["findings"][0]["message"];
  CHECK_MESSAGE(msg.find("signature verified: verified 2 resource(s)") == 0, msg);
  for (const char* f : {"signme-1", "signme-2"}) {
    CAPTURE(f);
    CHECK(rule_ids(report(j, f)) == std::vector<std::string>{"SCK204"});
  }
  // The bundle is reported once (the walk's own report of model.sig is replaced).
  int sigs = 0;
  for (const json& f : j["files"]) sigs += std::string(f["path"]).find("model.sig") != std::string::npos;
  CHECK(sigs == 1);
  CHECK(j["summary"]["findings"] == 0);
  // Text: the bundle's verified line is shown without -v.
  auto txt = run_cli("scan " + q(k) + " --signature " + q(k / "model.sig") + kPub);
  CHECK(txt.code == 0);
  CHECK_MESSAGE(
      txt.out.find("SCK204 signature-verified: signature verified: verified 2 resource(s)") != std::string::npos,
      txt.out);

  // v1.0.1 certificate sample: the chain; ignore-me passed as model_signing's test script does.
  const fs::path c = kSamples / "v1.0.1-certificate";
  json jc = scan_json(q(c) + " --signature " + q(c / "model.sig") + kCa + " --ignore-paths " + q(c / "ignore-me"), 0);
  CHECK(report(jc, "model.sig") != nullptr);
  // Without --ignore-paths the unsigned file fails the run, on its own report.
  json ju = scan_json(q(c) + " --signature " + q(c / "model.sig") + kCa, 1);
  CHECK(rule_ids(report(ju, "ignore-me")) == std::vector<std::string>{"SCK203"});
  CHECK((*report(ju, "ignore-me"))["verdict"] == "unsafe");
  CHECK((*report(ju, "model.sig"))["verdict"] == "unsafe");
  // ... and --ignore-unsigned-files accepts it.
  scan_json(q(c) + " --signature " + q(c / "model.sig") + kCa + " --ignore-unsigned-files", 0);

  // v1.0.0 key sample: a single-file model (resource "."), bundle beside it.
  const fs::path s = kSamples / "v1.0.0-elliptic-key";
  json js = scan_json(q(s / "signme-1") + " --signature " + q(s / "model.sig") + kPub, 0);
  CHECK(rule_ids(report(js, "signme-1")) == std::vector<std::string>{"SCK204"});
  CHECK((*report(js, "model.sig"))["verdict"] == "clean");

  // The wrong key or CA: SCK200 (critical), exit 1; the files are still scanned.
  json jw = scan_json(q(k) + " --signature " + q(k / "model.sig") + kP256, 1);
  const json* bw = report(jw, "model.sig");
  REQUIRE(bw != nullptr);
  CHECK(rule_ids(bw) == std::vector<std::string>{"SCK200"});
  CHECK((*bw)["findings"][0]["severity"] == "critical");
  CHECK((*bw)["verdict"] == "unsafe");
  CHECK(report(jw, "signme-1") != nullptr);
  json jo = scan_json(q(c) + " --signature " + q(c / "model.sig") + " --certificate-chain " +
                          q(kOms / "minted" / "other-ca-cert.pem") + " --ignore-paths " + q(c / "ignore-me"),
                      1);
  CHECK(rule_ids(report(jo, "model.sig")) == std::vector<std::string>{"SCK200"});
}

TEST_CASE("scan --signature: a sample modified after signing: changed, missing, unsigned files") {
  TempDir t;
  const fs::path m = copy_sample(t, "v1.1.0-elliptic-key");
  spit(m / "signme-1", "signme-X\n");  // one byte changed
  fs::remove(m / "signme-2");
  spit(m / "added.bin", "x");
  json j = scan_json(q(m) + " --signature " + q(m / "model.sig") + kPub, 1);
  const json* s1 = report(j, "signme-1");
  REQUIRE(s1 != nullptr);
  CHECK(rule_ids(s1) == std::vector<std::string>{"SCK201"});
  CHECK((*s1)["verdict"] == "unsafe");
  CHECK((*s1)["findings"][0]["severity"] == "critical");
  CHECK(rule_ids(report(j, "added.bin")) == std::vector<std::string>{"SCK203"});
  const json* b = report(j, "model.sig");
  REQUIRE(b != nullptr);
  CHECK(rule_ids(b) == std::vector<std::string>{"SCK204", "SCK202"});
  CHECK((*b)["findings"][1]["member"] == "signme-2");
  CHECK((*b)["verdict"] == "unsafe");
  const std::string summary = (*b)["findings"][0]["message"];
  CHECK_MESSAGE(summary.find("0 verified, 1 changed, 1 missing, 1 unsigned") != std::string::npos, summary);
  CHECK(j["summary"]["critical"] == 1);
  CHECK(j["summary"]["high"] == 1);
  CHECK(j["summary"]["medium"] == 1);

  // Fail closed: --fail-on critical still fails on the missing and unsigned files.
  spit(m / "signme-1", "signme-1\n");
  json jf = scan_json(q(m) + " --signature " + q(m / "model.sig") + kPub + " --fail-on critical", 1);
  CHECK(jf["summary"]["critical"] == 0);

  // Text names each file; SARIF has one result per failure.
  auto txt = run_cli("scan " + q(m) + " --signature " + q(m / "model.sig") + kPub);
  CHECK(txt.code == 1);
  CHECK_MESSAGE(
      txt.out.find("SCK202 signed-file-missing at signme-2: signed file signme-2 is missing") != std::string::npos,
      txt.out);
  CHECK_MESSAGE(txt.out.find("SCK203 unsigned-file") != std::string::npos, txt.out);
  auto sarif = run_cli("scan --format sarif " + q(m) + " --signature " + q(m / "model.sig") + kPub);
  CHECK(sarif.code == 1);
  json sj = json::parse(sarif.out);
  std::vector<std::string> ids;
  for (const json& r : sj["runs"][0]["results"]) ids.push_back(r["ruleId"]);
  std::sort(ids.begin(), ids.end());
  CHECK(ids == std::vector<std::string>{"SCK202", "SCK203"});
  std::vector<std::string> rule_table;
  for (const json& r : sj["runs"][0]["tool"]["driver"]["rules"]) rule_table.push_back(r["id"]);
  for (const char* id : {"SCK200", "SCK201", "SCK202", "SCK203", "SCK204"}) CHECK(has(rule_table, id));
  CHECK(sj["runs"][0]["invocations"][0]["exitCode"] == 1);
}

TEST_CASE("scan --signature: signed real checkpoints keep their parse findings; a changed tensor byte fails") {
  TempDir t;
  const fs::path m = signed_model(t);
  const std::string sig = " --signature " + q(m / "model.sig") + kP256;
  // Signature verified, but ns.pt imports argparse.Namespace: the scan still fails on it.
  json j = scan_json(q(m) + sig, 1);
  const json* ns = report(j, "ns.pt");
  REQUIRE(ns != nullptr);
  CHECK(has(rule_ids(ns), "SCK102"));
  CHECK(has(rule_ids(ns), "SCK204"));
  const json* mlp = report(j, "mlp.pt");
  REQUIRE(mlp != nullptr);
  CHECK((*mlp)["verdict"] == "clean");
  CHECK(has(rule_ids(mlp), "SCK204"));
  CHECK((*report(j, "model.sig"))["verdict"] == "clean");
  // --allow makes the parse clean: exit 0 with the signature verified.
  scan_json(q(m) + sig + " --allow argparse", 0);

  // One byte of mlp.pt's last tensor record changed after signing: still a valid
  // checkpoint for the parser (tensor bytes are data), but not the signed one.
  {
    std::fstream f(m / "mlp.pt", std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(fs::file_size(m / "mlp.pt"));
    // The last bytes of a torch zip are the central directory; a tensor byte
    // lies before it. Find the first record of data/ by scanning for "data/0".
    std::string bytes(static_cast<std::size_t>(size), '\0');
    f.read(bytes.data(), size);
    const std::size_t name = bytes.find("/data/0");
    REQUIRE(name != std::string::npos);
    // Local header: 30 bytes + name + extra; the data follows. Change a byte
    // well inside the data (the first record holds 4x8 floats).
    const std::size_t hdr = bytes.rfind("PK\x03\x04", name);
    REQUIRE(hdr != std::string::npos);
    const auto nlen = static_cast<unsigned char>(bytes[hdr + 26]) | (static_cast<unsigned char>(bytes[hdr + 27]) << 8);
    const auto xlen = static_cast<unsigned char>(bytes[hdr + 28]) | (static_cast<unsigned char>(bytes[hdr + 29]) << 8);
    const std::size_t data = hdr + 30 + static_cast<std::size_t>(nlen) + static_cast<std::size_t>(xlen);
    f.seekp(static_cast<std::streamoff>(data + 1));
    f.put(static_cast<char>(bytes[data + 1] ^ 0x01));
  }
  json jc = scan_json(q(m) + sig + " --allow argparse", 1);
  const json* mc = report(jc, "mlp.pt");
  REQUIRE(mc != nullptr);
  CHECK(rule_ids(mc) == std::vector<std::string>{"SCK201"});
  CHECK((*mc)["verdict"] == "unsafe");
  CHECK(has(rule_ids(report(jc, "ns.pt")), "SCK204"));
  // An ignore file may accept a change (SCK201), never a bad signature (SCK200).
  spit(t.path / "accept.ignore", "*mlp.pt SCK201\n");
  scan_json(q(m) + sig + " --allow argparse --ignore-file " + q(t.path / "accept.ignore"), 0);
  spit(t.path / "bad.ignore", "* SCK200\n");
  auto bad = run_cli("scan " + q(m) + sig + " --ignore-file " + q(t.path / "bad.ignore"), true);
  CHECK(bad.code == 2);
  CHECK_MESSAGE(bad.out.find("SCK200 (signature-not-verified) cannot be ignored") != std::string::npos, bad.out);

  // Sharded bundle: the changed shard is named on the file's report.
  auto sh = run_cli("sign " + q(m) + " --signature " + q(t.path / "shards.sig") + " --private-key " +
                        q(kOms / "minted" / "p256-key.pem") + " --serialization shards --shard-size 512",
                    true);
  REQUIRE_MESSAGE(sh.code == 0, sh.out);
  spit(m / "config.json", R"({"hidden": 5})");
  json js = scan_json(q(m) + " --signature " + q(t.path / "shards.sig") + kP256 + " --allow argparse", 1);
  const json* cfg = report(js, "config.json");
  REQUIRE(cfg != nullptr);
  CHECK(rule_ids(cfg) == std::vector<std::string>{"SCK201"});
  CHECK((*cfg)["verdict"] == "unsafe");
  const std::string cm = (*cfg)["findings"][0]["message"];
  CHECK_MESSAGE(cm.find("config.json:0:") != std::string::npos, cm);
}

TEST_CASE("scan --signature: a signed torch.distributed.checkpoint directory; a changed chunk byte fails") {
  // Was refused with exit 2 (stop 40's note). The directory is one report
  // (scan_dcp_dir); the signature's per-file findings land on it, each naming
  // its file as the member.
  TempDir t;
  const fs::path m = t.path / "ckpt";
  fs::create_directories(m);
  for (const auto& e : fs::directory_iterator(dcp_test::case_dir("placements-ws2") / "dcp"))
    fs::copy_file(e.path(), m / e.path().filename());
  const fs::path sigf = t.path / "ckpt.sig";
  auto s = run_cli("sign " + q(m) + " --signature " + q(sigf) + " --private-key " + q(kOms / "minted" / "p256-key.pem"),
                   true);
  REQUIRE_MESSAGE(s.code == 0, s.out);
  const std::string sig = " --signature " + q(sigf) + kP256;
  json j = scan_json(q(m) + sig, 0);
  const json* dir = report(j, "ckpt");
  REQUIRE(dir != nullptr);
  CHECK((*dir)["verdict"] == "clean");
  std::size_t verified = 0;
  for (const json& f : (*dir)["findings"])
    if (f["rule"] == "SCK204") {
      ++verified;
      CHECK(!f["member"].get<std::string>().empty());
    }
  std::size_t files = 0;
  for (const auto& e : fs::directory_iterator(m)) files += e.is_regular_file() ? 1 : 0;
  CHECK(verified == files);  // .metadata and every .distcp
  CHECK((*report(j, "ckpt.sig"))["verdict"] == "clean");

  // The last byte of a data file changed after signing: SCK201 on the
  // directory's report naming that file, exit 1 (the DCP reader may refuse
  // the item that byte belongs to too: the report is not clean either way).
  fs::path data;
  for (const auto& e : fs::directory_iterator(m))
    if (e.path().extension() == ".distcp") data = e.path();
  REQUIRE(!data.empty());
  {
    std::fstream f(data, std::ios::in | std::ios::out | std::ios::binary);
    const auto at = static_cast<std::streamoff>(fs::file_size(data)) - 1;
    f.seekg(at);
    const int c = f.get();
    f.seekp(at);
    f.put(static_cast<char>(c ^ 0x01));
  }
  json jc = scan_json(q(m) + sig, 1);
  const json* changed = report(jc, "ckpt");
  REQUIRE(changed != nullptr);
  CHECK((*changed)["verdict"] != "clean");
  bool named = false;
  for (const json& f : (*changed)["findings"])
    if (f["rule"] == "SCK201") named = f["member"] == data.filename().string();
  CHECK(named);
}

TEST_CASE("scan --signature: usage errors and unreadable or malformed bundles") {
  TempDir t;
  const fs::path k = kSamples / "v1.1.0-elliptic-key";
  const std::string sig = " --signature " + q(k / "model.sig");
  // Trust options without --signature; no trust; both trusts; two paths: usage (2).
  CHECK(run_cli("scan " + q(k) + kPub).code == 2);
  CHECK(run_cli("scan " + q(k) + sig).code == 2);
  CHECK(run_cli("scan " + q(k) + sig + kPub + kCa).code == 2);
  auto two = run_cli("scan " + q(k) + " " + q(k) + sig + kPub, true);
  CHECK(two.code == 2);
  CHECK(two.out.find("give exactly one PATH") != std::string::npos);
  CHECK(run_cli("scan " + q(k) + sig + " --public-key " + q(t.path / "nope.pem")).code == 2);
  // An unreadable bundle: not scanned (exit 2, SCK190 on the bundle path).
  json jn = scan_json(q(k) + " --signature " + q(t.path / "nope.sig") + kPub, 2);
  CHECK(rule_ids(report(jn, "nope.sig")) == std::vector<std::string>{"SCK190"});
  // A malformed bundle: SCK200 naming the refusal, exit 1; files still scanned.
  spit(t.path / "garbage.sig", "{\"mediaType\":");
  json jg = scan_json(q(k) + " --signature " + q(t.path / "garbage.sig") + kPub, 1);
  const json* g = report(jg, "garbage.sig");
  REQUIRE(g != nullptr);
  CHECK(rule_ids(g) == std::vector<std::string>{"SCK200"});
  CHECK(report(jg, "signme-1") != nullptr);
  // --help lists the verify options.
  auto h = run_cli("scan --help");
  for (const char* o :
       {"--signature", "--public-key", "--certificate-chain", "--ignore-paths", "--ignore-unsigned-files"})
    CHECK_MESSAGE(h.out.find(o) != std::string::npos, o);
}
