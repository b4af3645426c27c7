// `safeckpt sign` / `verify` as a user runs them, and the independent check:
// tests/sign/oms_check.py (Debian's python3-cryptography, written from
// ../shared/docs/oms-format.md, not from our code) verifies what we sign and
// signs what we must verify; the spec's JSON Schemas validate what we write.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_cli.hpp"
#include "support/save_util.hpp"

namespace fs = std::filesystem;
using safeckpt::save_test::TempDir;
using test_support::run_cli;
using test_support::run_shell;

namespace {

const fs::path kOms = fs::path(SAFECKPT_TEST_DATA) / "oms";
const fs::path kKeys = kOms / "model-transparency" / "scripts" / "tests" / "keys" / "certificate";
const std::string kPy =
    "/usr/bin/python3 " + (fs::path(SAFECKPT_SOURCE_DIR) / "tests" / "sign" / "oms_check.py").string();

void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}
std::string q(const fs::path& p) {
  return "'" + p.string() + "'";
}

// A small model: a real checkpoint, a config, a nested file.
fs::path make_model(const TempDir& t) {
  fs::path m = t.path / "model";
  fs::create_directories(m / "tokenizer");
  fs::copy_file(fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mlp_state_dict.pt", m / "model.pt");
  spit(m / "config.json", R"({"hidden": 4})");
  spit(m / "tokenizer" / "vocab.txt", "a\nb\n");
  spit(m / "tokenizer.json", "{}");
  return m;
}

}  // namespace

TEST_CASE("sign cli: what safeckpt signs, the independent checker verifies, and the schemas validate") {
  TempDir t;
  const fs::path m = make_model(t);
  for (const char* key : {"signing-key.pem", "p256", "p521"}) {
    CAPTURE(key);
    const fs::path priv =
        std::string(key) == "signing-key.pem" ? kKeys / key : kOms / "minted" / (std::string(key) + "-key.pem");
    const fs::path pub = std::string(key) == "signing-key.pem" ? kKeys / "signing-key-pub.pem"
                                                               : kOms / "minted" / (std::string(key) + "-pub.pem");
    auto s = run_cli("sign " + q(m) + " --signature " + q(m / "model.sig") + " --private-key " + q(priv), true);
    REQUIRE_MESSAGE(s.code == 0, s.out);
    auto v = run_shell(kPy + " verify " + q(m) + " " + q(m / "model.sig") + " " + q(pub) + " 2>&1");
    CHECK_MESSAGE(v.code == 0, v.out);
    CHECK(v.out == "verified 4 resources\n");
    auto sc = run_shell(kPy + " schema " + q(m / "model.sig") + " " +
                        q(kOms / "model-signing-spec" / "schemas" / "v1.0") + " 2>&1");
    CHECK_MESSAGE(sc.code == 0, sc.out);
    // Shards: the checker re-hashes the shards the same way.
    auto sh = run_cli("sign " + q(m) + " --signature " + q(m / "model.sig") + " --private-key " + q(priv) +
                          " --serialization shards --shard-size 1000",
                      true);
    REQUIRE_MESSAGE(sh.code == 0, sh.out);
    auto vs = run_shell(kPy + " verify " + q(m) + " " + q(m / "model.sig") + " " + q(pub) + " 2>&1");
    CHECK_MESSAGE(vs.code == 0, vs.out);
  }
  // A single-file model: resource ".".
  auto s = run_cli("sign " + q(m / "model.pt") + " --signature " + q(t.path / "single.sig") + " --private-key " +
                       q(kKeys / "signing-key.pem"),
                   true);
  REQUIRE_MESSAGE(s.code == 0, s.out);
  auto v = run_shell(kPy + " verify " + q(m / "model.pt") + " " + q(t.path / "single.sig") + " " +
                     q(kKeys / "signing-key-pub.pem") + " 2>&1");
  CHECK_MESSAGE(v.code == 0, v.out);
}

TEST_CASE("sign cli: what the independent checker signs, safeckpt verifies; exit codes 0/1/2") {
  TempDir t;
  const fs::path m = make_model(t);
  const fs::path sig = m / "model.sig";
  auto ps = run_shell(kPy + " sign " + q(m) + " " + q(kKeys / "signing-key.pem") + " " + q(sig) + " 2>&1");
  REQUIRE_MESSAGE(ps.code == 0, ps.out);
  const std::string trust = " --public-key " + q(kKeys / "signing-key-pub.pem");
  auto ok = run_cli("verify " + q(m) + " --signature " + q(sig) + trust, true);
  CHECK_MESSAGE(ok.code == 0, ok.out);
  CHECK(ok.out.find("verified: ") == 0);
  // JSON result.
  auto js = run_cli("verify " + q(m) + " --signature " + q(sig) + trust + " --format json");
  REQUIRE(js.code == 0);
  auto j = nlohmann::json::parse(js.out);
  CHECK(j["verified"] == true);
  CHECK(j["files"].size() == 4);
  // One changed, one extra file: exit 1 naming both.
  spit(m / "config.json", R"({"hidden": 5})");
  spit(m / "new.bin", "x");
  auto bad = run_cli("verify " + q(m) + " --signature " + q(sig) + trust, true);
  CHECK(bad.code == 1);
  CHECK_MESSAGE(bad.out.find("1 changed: config.json; 1 extra: new.bin") != std::string::npos, bad.out);
  auto bj = nlohmann::json::parse(run_cli("verify " + q(m) + " --signature " + q(sig) + trust + " --format json").out);
  CHECK(bj["verified"] == false);
  // --ignore-unsigned-files drops the extra file, the change remains; --ignore-paths skips it.
  auto iu = run_cli("verify " + q(m) + " --signature " + q(sig) + trust + " --ignore-unsigned-files --ignore-paths " +
                        q(m / "config.json"),
                    true);
  CHECK_MESSAGE(iu.code == 1, iu.out);
  CHECK_MESSAGE(iu.out.find("1 missing: config.json") != std::string::npos, iu.out);
  spit(m / "config.json", R"({"hidden": 4})");
  auto iu2 = run_cli("verify " + q(m) + " --signature " + q(sig) + trust + " --ignore-unsigned-files", true);
  CHECK_MESSAGE(iu2.code == 0, iu2.out);
  // Wrong key: 1 (key mismatch). Unreadable bundle, missing key, no trust: 2.
  auto wk = run_cli(
      "verify " + q(m) + " --signature " + q(sig) + " --public-key " + q(kOms / "minted" / "p256-pub.pem"), true);
  CHECK(wk.code == 1);
  CHECK(wk.out.find("key mismatch") != std::string::npos);
  CHECK(run_cli("verify " + q(m) + " --signature " + q(t.path / "nope.sig") + trust).code == 2);
  spit(t.path / "garbage.sig", "{\"mediaType\":");
  CHECK(run_cli("verify " + q(m) + " --signature " + q(t.path / "garbage.sig") + trust).code == 2);
  CHECK(run_cli("verify " + q(m) + " --signature " + q(sig)).code == 2);
  CHECK(run_cli("sign " + q(m) + " --signature " + q(sig)).code == 2);
  // --help lists the options.
  auto h = run_cli("verify --help");
  for (const char* o :
       {"--signature", "--public-key", "--certificate-chain", "--ignore-paths", "--ignore-unsigned-files", "--format"})
    CHECK_MESSAGE(h.out.find(o) != std::string::npos, o);
  auto hs = run_cli("sign --help");
  for (const char* o : {"--signature", "--private-key", "--certificate", "--certificate-chain", "--ignore-paths",
                        "--serialization", "--shard-size"})
    CHECK_MESSAGE(hs.out.find(o) != std::string::npos, o);
}

TEST_CASE("sign cli: certificate method round trip and the reference samples through the CLI") {
  TempDir t;
  const fs::path m = make_model(t);
  auto s = run_cli("sign " + q(m) + " --signature " + q(t.path / "m.sig") + " --private-key " +
                       q(kKeys / "signing-key.pem") + " --certificate " + q(kKeys / "signing-key-cert.pem") +
                       " --certificate-chain " + q(kKeys / "int-ca-cert.pem"),
                   true);
  REQUIRE_MESSAGE(s.code == 0, s.out);
  auto v = run_cli(
      "verify " + q(m) + " --signature " + q(t.path / "m.sig") + " --certificate-chain " + q(kKeys / "ca-cert.pem"),
      true);
  CHECK_MESSAGE(v.code == 0, v.out);
  auto w = run_cli("verify " + q(m) + " --signature " + q(t.path / "m.sig") + " --certificate-chain " +
                       q(kOms / "minted" / "other-ca-cert.pem"),
                   true);
  CHECK(w.code == 1);
  // The v1.1.0 samples as model_signing's own test scripts run them.
  const fs::path sm = kOms / "model-transparency" / "scripts" / "tests";
  auto k =
      run_cli("verify " + q(sm / "v1.1.0-elliptic-key") + " --signature " +
                  q(sm / "v1.1.0-elliptic-key" / "model.sig") + " --public-key " + q(kKeys / "signing-key-pub.pem") +
                  " --ignore-paths " + q(sm / "v1.1.0-elliptic-key" / "ignore-me"),
              true);
  CHECK_MESSAGE(k.code == 0, k.out);
  auto c = run_cli("verify " + q(sm / "v1.0.1-certificate") + " --signature " +
                       q(sm / "v1.0.1-certificate" / "model.sig") + " --certificate-chain " + q(kKeys / "ca-cert.pem") +
                       " --ignore-paths " + q(sm / "v1.0.1-certificate" / "ignore-me"),
                   true);
  CHECK_MESSAGE(c.code == 0, c.out);
}
