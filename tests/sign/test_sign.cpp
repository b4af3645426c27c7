// OMS signing (issue 15): the reference implementation's own signed samples,
// golden statements and manifests, the spec's test vectors, sign/verify round
// trips, refusals, verify-then-load on the same bytes.
// Data: tests/data/oms/ (copies of ../shared/oms, Apache-2.0; see its README).
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/sign.hpp"
#include "support/save_util.hpp"

namespace fs = std::filesystem;
using namespace safeckpt;
using namespace safeckpt::sign;
using safeckpt::save_test::TempDir;

namespace {

const fs::path kOms = fs::path(SAFECKPT_TEST_DATA) / "oms";
const fs::path kSamples = kOms / "model-transparency" / "scripts" / "tests";
const fs::path kKeys = kSamples / "keys" / "certificate";
const fs::path kMinted = kOms / "minted";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void spit(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary);
  out << s;
}
Bytes as_bytes(const std::string& s) {
  return Bytes(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
}

Trust key_trust(const fs::path& pem = kKeys / "signing-key-pub.pem") {
  auto t = trust_from_public_key_file(pem);
  REQUIRE(t.has_value());
  return *t;
}
Trust chain_trust(const fs::path& pem = kKeys / "ca-cert.pem") {
  auto t = trust_from_chain_files({pem});
  REQUIRE(t.has_value());
  return *t;
}

Bundle read(const fs::path& p) {
  auto b = read_bundle(p);
  REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().to_string()));
  return std::move(*b);
}

// One sample of SAMPLES.md §2: folder, model to pass, key method?, ignore paths.
struct Sample {
  std::string folder;
  bool single_file;
  bool key;
  bool ignore_me;
};
const std::vector<Sample> kSampleTable = {
    {"v0.3.1-certificate", false, false, false}, {"v0.3.1-elliptic-key", true, true, false},
    {"v1.0.0-certificate", false, false, false}, {"v1.0.0-elliptic-key", true, true, false},
    {"v1.0.1-certificate", false, false, true},  {"v1.0.1-elliptic-key", false, true, true},
    {"v1.1.0-certificate", false, false, true},  {"v1.1.0-elliptic-key", false, true, true},
};

Result<VerifyReport> verify_sample(const fs::path& dir, const Sample& s, const Trust& trust, bool pass_ignore = true) {
  SAFECKPT_TRY(Bundle b, read_bundle(dir / "model.sig"));
  VerifyOptions vo;
  vo.signature_path = dir / "model.sig";
  if (s.ignore_me && pass_ignore) vo.ignore_paths = {"ignore-me"};
  return verify_model(s.single_file ? dir / "signme-1" : dir, b, trust, vo);
}

// Copies a sample folder to a writable place.
fs::path copy_sample(const TempDir& t, const std::string& folder) {
  fs::path dst = t.path / folder;
  fs::copy(kSamples / folder, dst, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(dst))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  return dst;
}

}  // namespace

TEST_CASE("sign: error codes are pinned (numbers are ABI)") {
  CHECK(static_cast<int>(ErrorCode::kOk) == 0);
  CHECK(static_cast<int>(ErrorCode::kMalformed) == 1);
  CHECK(static_cast<int>(ErrorCode::kLimitExceeded) == 2);
  CHECK(static_cast<int>(ErrorCode::kUnsupported) == 3);
  CHECK(static_cast<int>(ErrorCode::kDisallowedGlobal) == 4);
  CHECK(static_cast<int>(ErrorCode::kDisallowedOperation) == 5);
  CHECK(static_cast<int>(ErrorCode::kIo) == 6);
  CHECK(static_cast<int>(ErrorCode::kDevice) == 7);
  CHECK(static_cast<int>(ErrorCode::kInvalidArgument) == 8);
  CHECK(static_cast<int>(ErrorCode::kInternal) == 9);
  CHECK(static_cast<int>(ErrorCode::kExists) == 10);
  CHECK(static_cast<int>(ErrorCode::kIntegrity) == 11);
  CHECK(error_code_name(ErrorCode::kIntegrity) == "integrity");
}

TEST_CASE("sign: every reference sample verifies with the key or chain its README names, and only with it") {
  for (const Sample& s : kSampleTable) {
    CAPTURE(s.folder);
    const Trust good = s.key ? key_trust() : chain_trust();
    auto r = verify_sample(kSamples / s.folder, s, good);
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
    CHECK_MESSAGE(r->ok(), r->summary());
    // Another key / another CA / the other method: refused.
    const Trust wrong = s.key ? key_trust(kMinted / "p256-pub.pem") : chain_trust(kMinted / "other-ca-cert.pem");
    auto w = verify_sample(kSamples / s.folder, s, wrong);
    REQUIRE(!w.has_value());
    CHECK(w.error().code() == ErrorCode::kIntegrity);
    auto m = verify_sample(kSamples / s.folder, s, s.key ? chain_trust() : key_trust());
    REQUIRE(!m.has_value());
    CHECK(m.error().code() == ErrorCode::kIntegrity);
    // v1.0.1 records no ignore paths: without the flag, ignore-me is extra.
    if (s.ignore_me) {
      auto x = verify_sample(kSamples / s.folder, s, good, false);
      REQUIRE(x.has_value());
      CHECK(x->ok() == (s.folder.rfind("v1.1.0", 0) == 0));
    }
  }
  // The v0.2 format (faulty PAE) is refused as unsupported.
  auto legacy = read_bundle(kSamples / "v0.2.0-certificate" / "model.sig");
  REQUIRE(!legacy.has_value());
  CHECK(legacy.error().code() == ErrorCode::kUnsupported);
}

TEST_CASE("sign: a sample stops verifying after one byte of a file changes, a file goes or one is added") {
  TempDir t;
  for (const Sample& s : kSampleTable) {
    CAPTURE(s.folder);
    const Trust good = s.key ? key_trust() : chain_trust();
    fs::path dir = copy_sample(t, s.folder);
    std::string one = slurp(dir / "signme-1");
    one[0] = static_cast<char>(one[0] ^ 1);
    spit(dir / "signme-1", one);
    auto r = verify_sample(dir, s, good);
    REQUIRE(r.has_value());
    CHECK(!r->ok());
    REQUIRE(!r->files.empty());
    CHECK(r->summary().find("changed") != std::string::npos);
    if (s.single_file) continue;
    one[0] = static_cast<char>(one[0] ^ 1);
    spit(dir / "signme-1", one);
    REQUIRE(verify_sample(dir, s, good)->ok());
    spit(dir / "extra", "x");
    auto e = verify_sample(dir, s, good);
    CHECK(!e->ok());
    CHECK(e->summary() == "1 extra: extra");
    VerifyOptions vo;
    vo.signature_path = dir / "model.sig";
    vo.ignore_paths = {"ignore-me"};
    vo.ignore_unsigned_files = true;
    auto iu = verify_model(dir, read(dir / "model.sig"), good, vo);
    REQUIRE(iu.has_value());
    CHECK(iu->ok());
    fs::remove(dir / "extra");
    fs::remove(dir / "signme-2");
    auto m = verify_sample(dir, s, good);
    CHECK(m->summary() == "1 missing: signme-2");
  }
}

TEST_CASE("sign: every one-byte change of a bundle is refused") {
  // v1.1.0-elliptic-key (hint form) and v1.0.0-certificate (rawBytes chain):
  // flipping the lowest bit of any byte must make parsing or verification fail.
  for (const auto& [folder, key] :
       std::vector<std::pair<std::string, bool>>{{"v1.1.0-elliptic-key", true}, {"v1.0.0-certificate", false}}) {
    CAPTURE(folder);
    const std::string orig = slurp(kSamples / folder / "model.sig");
    const Trust trust = key ? key_trust() : chain_trust();
    std::size_t survived = 0;
    for (std::size_t i = 0; i < orig.size(); ++i) {
      std::string m = orig;
      m[i] = static_cast<char>(m[i] ^ 1);
      auto b = parse_bundle(as_bytes(m));
      if (!b) continue;
      auto v = verify_signature(*b, trust);
      if (v) {
        ++survived;
        MESSAGE("byte " << i << " ('" << orig[i] << "') survived");
      }
    }
    CHECK(survived == 0);
  }
}

namespace {

// The golden fixtures (SAMPLES.md §4), built under `root`. The symlink
// fixture's link points at an absolute path outside the model upstream; we
// never follow links out of the model, so here it points to a file inside
// the model under an ignored folder (same bytes, same resource).
struct Fixture {
  std::string golden;
  fs::path model;
  std::vector<std::string> ignore;
};
std::vector<Fixture> build_fixtures(const fs::path& root) {
  const std::string k = "This is a simple model";
  std::vector<Fixture> f;
  spit(root / "file_model", k);
  f.push_back({"sample_model_file", root / "file_model", {}});
  spit(root / "empty_file_model", "");
  f.push_back({"empty_model_file", root / "empty_file_model", {}});
  fs::create_directories(root / "sample_model");
  for (int i = 0; i < 2; ++i) {
    fs::create_directories(root / "sample_model" / ("d" + std::to_string(i)));
    for (int j = 0; j < 3; ++j) {
      std::string n = "f" + std::to_string(i) + std::to_string(j);
      spit(root / "sample_model" / ("d" + std::to_string(i)) / n,
           "This is file " + n + " in d" + std::to_string(i) + ".");
    }
  }
  for (int i = 0; i < 4; ++i)
    spit(root / "sample_model" / ("f" + std::to_string(i)), "This is file f" + std::to_string(i) + " in root.");
  f.push_back({"sample_model_folder", root / "sample_model", {}});
  fs::create_directories(root / "empty_folder_model");
  f.push_back({"empty_model_folder", root / "empty_folder_model", {}});
  fs::create_directories(root / "empty_file_inside_model");
  spit(root / "empty_file_inside_model" / "empty_file", "");
  f.push_back({"model_folder_with_empty_file", root / "empty_file_inside_model", {}});
  fs::path deep = root / "deep_model" / "d0" / "d1" / "d2" / "d3" / "d4";
  fs::create_directories(deep);
  for (int i = 0; i < 4; ++i) spit(deep / ("f" + std::to_string(i)), "This is file f" + std::to_string(i) + ".");
  f.push_back({"deep_model_folder", root / "deep_model", {}});
  fs::create_directories(root / "symlink_model" / "hidden");
  spit(root / "symlink_model" / "hidden" / "target", k);
  fs::create_symlink(fs::absolute(root / "symlink_model" / "hidden" / "target"),
                     root / "symlink_model" / "symlink_file");
  f.push_back({"symlink_model_folder", root / "symlink_model", {"hidden"}});
  return f;
}

}  // namespace

TEST_CASE("sign: the 21 golden statements and 21 golden manifests of model_signing are reproduced byte for byte") {
  TempDir t;
  const fs::path stmts = kOms / "model-transparency" / "tests" / "_signing" / "testdata" / "signing" / "TestPayload";
  const fs::path mans = kOms / "model-transparency" / "tests" / "_serialization" / "testdata";
  int statements = 0, manifests = 0;
  for (const Fixture& fx : build_fixtures(t.path)) {
    for (const auto& [suffix, method, shard] :
         std::vector<std::tuple<std::string, Method, std::uint64_t>>{{"", Method::kFiles, kDefaultShardSize},
                                                                     {"_shard", Method::kShards, kDefaultShardSize},
                                                                     {"_small_shards", Method::kShards, 8}}) {
      CAPTURE(fx.golden + suffix);
      HashOptions ho;
      ho.method = method;
      ho.shard_size = shard;
      ho.allow_symlinks = true;
      ho.ignore_paths = fx.ignore;
      auto rs = hash_model(fx.model, ho);
      REQUIRE_MESSAGE(rs.has_value(), (rs ? "" : rs.error().to_string()));
      auto st = build_statement(fx.model, ho, *rs, false);
      REQUIRE(st.has_value());
      CHECK(statement_json(*st) + "\n" == slurp(stmts / (fx.golden + suffix)));
      ++statements;
      // Manifests: file/<fixture>, file_shard/<fixture> and <fixture>_small_shards.
      fs::path man = method == Method::kFiles ? mans / "file" / "TestSerializer" / fx.golden
                     : shard == 8             ? mans / "file_shard" / "TestSerializer" / (fx.golden + "_small_shards")
                                              : mans / "file_shard" / "TestSerializer" / fx.golden;
      std::string lines;
      for (const Resource& r : st->resources) lines += r.name + ":" + r.digest + "\n";
      CHECK(lines == slurp(man));
      ++manifests;
      // The parser reads back what we write (refusing the empty lists).
      auto back = parse_statement(as_bytes(statement_json(*st)));
      CHECK(back.has_value() == !st->resources.empty());
    }
  }
  CHECK(statements == 21);
  CHECK(manifests == 21);
}

TEST_CASE("sign: the spec's test vectors give the expected verdicts") {
  const fs::path v = kOms / "model-signing-spec" / "test-vectors" / "v1.0";
  TempDir t;
  fs::create_directories(t.path / "m");
  fs::copy_file(kSamples / "v1.1.0-elliptic-key" / "signme-1", t.path / "m" / "signme-1");
  fs::copy_file(kSamples / "v1.1.0-elliptic-key" / "signme-2", t.path / "m" / "signme-2");
  auto key = verify_model(t.path / "m", read(v / "valid" / "key.bundle.json"), key_trust());
  REQUIRE_MESSAGE(key.has_value(), (key ? "" : key.error().to_string()));
  CHECK(key->ok());
  auto cert = verify_model(t.path / "m", read(v / "valid" / "certificate.bundle.json"), chain_trust());
  REQUIRE_MESSAGE(cert.has_value(), (cert ? "" : cert.error().to_string()));
  CHECK(cert->ok());
  // Keyless: parsed, not verifiable here.
  auto sg = read_bundle(v / "valid" / "sigstore.bundle.json");
  REQUIRE_MESSAGE(sg.has_value(), (sg ? "" : sg.error().to_string()));
  CHECK(verify_signature(*sg, key_trust()).error().code() == ErrorCode::kUnsupported);
  for (const char* bad : {"empty", "missing-envelope", "missing-verification-material"}) {
    CAPTURE(bad);
    auto b = read_bundle(v / "invalid" / (std::string(bad) + ".bundle.json"));
    REQUIRE(!b.has_value());
    CHECK(b.error().code() == ErrorCode::kMalformed);
  }
  // missing-tlog-entries is a keyless bundle without its log entry: refused
  // when verifying (we verify no keyless bundle).
  auto mt = read_bundle(v / "invalid" / "missing-tlog-entries.bundle.json");
  CHECK((!mt.has_value() || !verify_signature(*mt, key_trust()).has_value()));
  auto wp = read_bundle(v / "invalid-payload" / "wrong-predicate.bundle.json");
  if (wp.has_value()) {
    auto r = verify_signature(*wp, key_trust());
    REQUIRE(!r.has_value());
    CHECK(r.error().code() == ErrorCode::kIntegrity);
  } else {
    CHECK(wp.error().code() == ErrorCode::kMalformed);
  }
}

TEST_CASE("sign: sign then verify, key and certificate methods, files and shards, three curves") {
  TempDir t;
  fs::create_directories(t.path / "m" / "sub");
  spit(t.path / "m" / "weights.bin", std::string(100000, 'w'));
  spit(t.path / "m" / "sub" / "config.json", "{}");
  spit(t.path / "m" / "empty", "");
  fs::create_directories(t.path / "m" / ".git");
  spit(t.path / "m" / ".git" / "HEAD", "ref");
  struct Case {
    fs::path key, cert, pub;
    Method method;
  };
  const std::vector<Case> cases = {
      {kKeys / "signing-key.pem", {}, kKeys / "signing-key-pub.pem", Method::kFiles},
      {kMinted / "p256-key.pem", {}, kMinted / "p256-pub.pem", Method::kShards},
      {kMinted / "p521-key.pem", {}, kMinted / "p521-pub.pem", Method::kFiles},
      {kKeys / "signing-key.pem", kKeys / "signing-key-cert.pem", {}, Method::kShards},
  };
  for (const Case& c : cases) {
    CAPTURE(c.key.filename().string());
    auto signer = signer_from_files(
        c.key, c.cert, c.cert.empty() ? std::vector<fs::path>{} : std::vector<fs::path>{kKeys / "int-ca-cert.pem"});
    REQUIRE(signer.has_value());
    SignOptions so;
    so.hash.method = c.method;
    so.hash.shard_size = 4096;
    const fs::path sig = t.path / "m" / "model.sig";
    auto b = sign_model(t.path / "m", sig, *signer, so);
    REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().to_string()));
    const Trust trust = c.cert.empty() ? key_trust(c.pub) : chain_trust();
    VerifyOptions vo;
    vo.signature_path = sig;
    auto r = verify_model(t.path / "m", read(sig), trust, vo);
    REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
    CHECK_MESSAGE(r->ok(), r->summary());
    // Shards: 100000 bytes in 4096-byte pieces (25) + config.json; the empty file has none.
    CHECK(r->files.size() == (c.method == Method::kShards ? 26u : 3u));
    REQUIRE(b->statement.ignore_paths.has_value());
    CHECK(*b->statement.ignore_paths ==
          std::vector<std::string>{".git", ".gitattributes", ".github", ".gitignore", "model.sig"});
    // One byte of the largest file changes: exactly one resource changes.
    std::string w = slurp(t.path / "m" / "weights.bin");
    w[5000] = 'x';
    spit(t.path / "m" / "weights.bin", w);
    auto r2 = verify_model(t.path / "m", read(sig), trust, vo);
    REQUIRE(r2.has_value());
    CHECK(r2->summary() ==
          (c.method == Method::kShards ? "1 changed: weights.bin:4096:8192" : "1 changed: weights.bin"));
    w[5000] = 'w';
    spit(t.path / "m" / "weights.bin", w);
  }
}

TEST_CASE("sign: certificate refusals: expired leaf, no signing key usage, key not matching the certificate") {
  TempDir t;
  spit(t.path / "model.bin", "weights");
  auto sign_with = [&](const fs::path& cert) {
    auto signer = signer_from_files(kKeys / "signing-key.pem", cert, {kKeys / "int-ca-cert.pem"});
    REQUIRE(signer.has_value());
    auto b = sign_model(t.path / "model.bin", t.path / "model.sig", *signer);
    REQUIRE_MESSAGE(b.has_value(), (b ? "" : b.error().to_string()));
    return *b;
  };
  auto expired = verify_signature(sign_with(kMinted / "expired-cert.pem"), chain_trust());
  REQUIRE(!expired.has_value());
  CHECK(expired.error().code() == ErrorCode::kIntegrity);
  CHECK_MESSAGE(expired.error().message().find("expired on Jan  1 00:00:00 2021 GMT") != std::string::npos,
                expired.error().message());
  auto nousage = verify_signature(sign_with(kMinted / "nousage-cert.pem"), chain_trust());
  REQUIRE(!nousage.has_value());
  CHECK_MESSAGE(nousage.error().message().find("digitalSignature") != std::string::npos, nousage.error().message());
  auto wrong = signer_from_files(kMinted / "p256-key.pem", kKeys / "signing-key-cert.pem", {});
  REQUIRE(wrong.has_value());
  auto w = sign_model(t.path / "model.bin", t.path / "model.sig", *wrong);
  REQUIRE(!w.has_value());
  CHECK(w.error().code() == ErrorCode::kInvalidArgument);
  // Without the intermediate in the bundle the chain does not build.
  auto noint = signer_from_files(kKeys / "signing-key.pem", kKeys / "signing-key-cert.pem", {});
  auto b = sign_model(t.path / "model.bin", t.path / "model.sig", *noint);
  REQUIRE(b.has_value());
  CHECK(verify_signature(*b, chain_trust()).error().code() == ErrorCode::kIntegrity);
  CHECK(verify_signature(*b, chain_trust(kKeys / "int-ca-cert.pem")).has_value() == false);
}

namespace {

// A valid key-method bundle around `payload` (signed with the test key), so
// refusal cases reach the field they break.
std::string signed_bundle(const std::string& payload) {
  auto signer = signer_from_files(kKeys / "signing-key.pem", {}, {});
  REQUIRE(signer.has_value());
  auto j = sign_payload(payload, *signer);
  REQUIRE(j.has_value());
  return *j;
}

std::string statement_with(const std::string& resources, const std::string& serialization = "") {
  return R"({"_type": "https://in-toto.io/Statement/v1", "subject": [{"name": "m", "digest": {"sha256": ")" +
         std::string(64, '0') + R"("}}], "predicateType": "https://model_signing/signature/v1.0", "predicate": {)" +
         R"("serialization": )" +
         (serialization.empty() ? R"({"method": "files", "hash_type": "sha256", "allow_symlinks": false})"
                                : serialization) +
         R"(, "resources": )" + resources + "}}";
}

ErrorCode code_of(const std::string& bundle) {
  auto b = parse_bundle(as_bytes(bundle));
  return b ? ErrorCode::kOk : b.error().code();
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto p = s.find(from);
  REQUIRE(p != std::string::npos);
  return s.replace(p, from.size(), to);
}

}  // namespace

TEST_CASE("sign: malformed bundles are refused with the field named") {
  const std::string good = slurp(kSamples / "v1.1.0-elliptic-key" / "model.sig");
  REQUIRE(code_of(good) == ErrorCode::kOk);
  const std::string res1 = R"([{"name": "a", "algorithm": "sha256", "digest": ")" + std::string(64, 'a') + R"("}])";
  REQUIRE(code_of(signed_bundle(statement_with(res1))) == ErrorCode::kOk);
  struct Bad {
    const char* what;
    std::string bundle;
    ErrorCode code;
    const char* field;
  };
  const std::vector<Bad> cases = {
      {"truncated", good.substr(0, good.size() / 2), ErrorCode::kMalformed, "not JSON"},
      {"empty", "", ErrorCode::kMalformed, "not JSON"},
      {"not an object", "[]", ErrorCode::kMalformed, "bundle"},
      {"duplicate top-level key", replace(good, R"({"mediaType")", R"({"mediaType":"x","mediaType")"),
       ErrorCode::kMalformed, "duplicate key \"mediaType\""},
      {"duplicate nested key", replace(good, R"("keyid":"")", R"("keyid":"","keyid":"")"), ErrorCode::kMalformed,
       "duplicate key \"keyid\""},
      {"wrong mediaType", replace(good, "bundle.v0.3+json", "bundle.v0.4+json"), ErrorCode::kMalformed, "mediaType"},
      {"wrong payloadType", replace(good, "application/vnd.in-toto+json", "application/json"), ErrorCode::kMalformed,
       "dsseEnvelope.payloadType"},
      {"two signatures", replace(good, R"("keyid":""}])", R"("keyid":""},{"sig":"AA==","keyid":""}])"),
       ErrorCode::kMalformed, "exactly one signature"},
      {"no signature",
       replace(good, good.substr(good.find("[{\"sig\""), good.size() - good.find("[{\"sig\"") - 2), "[]"),
       ErrorCode::kMalformed, "exactly one signature"},
      {"unknown field", replace(good, R"({"mediaType")", R"({"extra":1,"mediaType")"), ErrorCode::kMalformed,
       "unknown field \"extra\""},
      {"two key forms", replace(good, R"("tlogEntries")", R"("certificate":{"rawBytes":"AA=="},"tlogEntries")"),
       ErrorCode::kMalformed, "exactly one of"},
      {"non-canonical base64 (no padding)", replace(good, "AkNxstJDbNl0lQ==", "AkNxstJDbNl0lQ"), ErrorCode::kMalformed,
       "dsseEnvelope.signatures[0].sig"},
      {"non-canonical base64 (pad bits)", replace(good, "AkNxstJDbNl0lQ==", "AkNxstJDbNl0lR=="), ErrorCode::kMalformed,
       "pad bits"},
      {"base64 with whitespace", replace(good, "AkNxstJDbNl0lQ==", "AkNxstJD\\nbNl0lQ=="), ErrorCode::kMalformed,
       "base64"},
      {"deep JSON",
       replace(good, R"("tlogEntries":[])", R"("tlogEntries":)" + std::string(40, '[') + std::string(40, ']')),
       ErrorCode::kLimitExceeded, "nested deeper"},
      {"traversal name", signed_bundle(statement_with(replace(res1, "\"a\"", "\"../etc/passwd\""))),
       ErrorCode::kMalformed, "\"..\" component"},
      {"absolute name", signed_bundle(statement_with(replace(res1, "\"a\"", "\"/etc/passwd\""))), ErrorCode::kMalformed,
       "absolute name"},
      {"empty component", signed_bundle(statement_with(replace(res1, "\"a\"", "\"a//b\""))), ErrorCode::kMalformed,
       "empty"},
      {"empty resources", signed_bundle(statement_with("[]")), ErrorCode::kMalformed, "predicate.resources: empty"},
      {"duplicate resource",
       signed_bundle(
           statement_with("[" + res1.substr(1, res1.size() - 2) + "," + res1.substr(1, res1.size() - 2) + "]")),
       ErrorCode::kMalformed, "duplicate name"},
      {"uppercase digest", signed_bundle(statement_with(replace(res1, std::string(64, 'a'), std::string(64, 'A')))),
       ErrorCode::kMalformed, "lowercase hex"},
      {"algorithm differs", signed_bundle(statement_with(replace(res1, "\"sha256\"", "\"blake2b\""))),
       ErrorCode::kMalformed, "differs from hash_type"},
      {"predicate extra field",
       signed_bundle(replace(statement_with(res1), R"("predicate": {)", R"("predicate": {"x": 1, )")),
       ErrorCode::kMalformed, "unknown field \"x\""},
      {"two subjects",
       signed_bundle(replace(
           statement_with(res1), R"("subject": [{"name": "m", )",
           R"("subject": [{"name": "n", "digest": {"sha256": ")" + std::string(64, '0') + R"("}}, {"name": "m", )")),
       ErrorCode::kMalformed, "exactly one entry"},
      {"shard not a shard",
       signed_bundle(statement_with(
           R"([{"name": "a:3:9", "algorithm": "sha256-sharded-8", "digest": ")" + std::string(64, 'a') + R"("}])",
           R"({"method": "shards", "hash_type": "sha256", "allow_symlinks": false, "shard_size": 8})")),
       ErrorCode::kMalformed, "not a shard of size 8"},
      {"shard plain algorithm",
       signed_bundle(
           statement_with(R"([{"name": "a:0:8", "algorithm": "sha256", "digest": ")" + std::string(64, 'a') + R"("}])",
                          R"({"method": "shards", "hash_type": "sha256", "allow_symlinks": false, "shard_size": 8})")),
       ErrorCode::kMalformed, "sha256-sharded-8"},
  };
  for (const Bad& c : cases) {
    CAPTURE(c.what);
    auto b = parse_bundle(as_bytes(c.bundle));
    REQUIRE(!b.has_value());
    CHECK(b.error().code() == c.code);
    CHECK_MESSAGE(b.error().message().find(c.field) != std::string::npos, b.error().message());
  }
  sign::Limits small;
  small.max_bundle_bytes = 1000;
  auto huge = parse_bundle(as_bytes(good), small);
  REQUIRE(!huge.has_value());
  CHECK(huge.error().code() == ErrorCode::kLimitExceeded);
  // A signature that verifies over a statement whose root digest is wrong.
  auto rd = parse_bundle(as_bytes(signed_bundle(statement_with(res1))));
  REQUIRE(rd.has_value());
  auto v = verify_signature(*rd, key_trust());
  REQUIRE(!v.has_value());
  CHECK(v.error().message().find("root digest") != std::string::npos);
}

TEST_CASE("sign: symlinks refused unless allowed, never followed out of the model; loops and special files refused") {
  TempDir t;
  fs::create_directories(t.path / "m");
  spit(t.path / "m" / "a", "a");
  spit(t.path / "outside", "secret");
  fs::create_symlink(t.path / "outside", t.path / "m" / "out");
  HashOptions ho;
  auto r = hash_model(t.path / "m", ho);
  REQUIRE(!r.has_value());
  CHECK(r.error().code() == ErrorCode::kUnsupported);
  CHECK(r.error().message().find("symlink out") != std::string::npos);
  ho.allow_symlinks = true;
  r = hash_model(t.path / "m", ho);
  REQUIRE(!r.has_value());
  CHECK(r.error().message().find("points out of the model") != std::string::npos);
  fs::remove(t.path / "m" / "out");
  fs::create_symlink("loop2", t.path / "m" / "loop1");
  fs::create_symlink("loop1", t.path / "m" / "loop2");
  r = hash_model(t.path / "m", ho);
  REQUIRE(!r.has_value());
  CHECK(r.error().message().find("cannot be resolved") != std::string::npos);
  fs::remove(t.path / "m" / "loop1");
  fs::remove(t.path / "m" / "loop2");
  fs::create_symlink("a", t.path / "m" / "in");
  r = hash_model(t.path / "m", ho);
  REQUIRE_MESSAGE(r.has_value(), (r ? "" : r.error().to_string()));
  REQUIRE(r->size() == 2);
  CHECK(r->at(1).name == "in");
  CHECK(r->at(1).digest == r->at(0).digest);
  REQUIRE(::mkfifo((t.path / "m" / "fifo").c_str(), 0600) == 0);
  r = hash_model(t.path / "m", ho);
  REQUIRE(!r.has_value());
  CHECK(r.error().message().find("not a regular file") != std::string::npos);
}

TEST_CASE("sign: names are sorted by code point (not by path components)") {
  TempDir t;
  fs::create_directories(t.path / "m" / "tokenizer");
  spit(t.path / "m" / "tokenizer" / "x", "1");
  spit(t.path / "m" / "tokenizer.json", "2");
  spit(t.path / "m" / "\xc3\xa9", "3");
  HashOptions ho;
  auto r = hash_model(t.path / "m", ho);
  REQUIRE(r.has_value());
  auto st = build_statement(t.path / "m", ho, *r, false);
  REQUIRE(st.has_value());
  REQUIRE(st->resources.size() == 3);
  // '.' (0x2e) < '/' (0x2f) < 0xc3: tokenizer.json before tokenizer/x (Python's component sort says otherwise).
  CHECK(st->resources[0].name == "tokenizer.json");
  CHECK(st->resources[1].name == "tokenizer/x");
  CHECK(st->resources[2].name == "\xc3\xa9");
}

TEST_CASE("sign: verify-then-load hashes the mapping it parses; a swapped file never loads unverified") {
  TempDir t;
  const fs::path src = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "mlp_state_dict.pt";
  const fs::path other = fs::path(SAFECKPT_TEST_DATA) / "corpus" / "torch-2.11" / "conv_bn_state_dict.pt";
  const fs::path model = t.path / "model.pt";
  fs::copy_file(src, model);
  auto signer = signer_from_files(kKeys / "signing-key.pem", {}, {});
  REQUIRE(signer.has_value());
  for (Method m : {Method::kFiles, Method::kShards}) {
    CAPTURE(static_cast<int>(m));
    SignOptions so;
    so.hash.method = m;
    so.hash.shard_size = 1000;
    auto bundle = sign_model(model, t.path / "model.sig", *signer, so);
    REQUIRE(bundle.has_value());
    auto verifier = make_load_verifier(*bundle, key_trust());
    REQUIRE_MESSAGE(verifier.has_value(), (verifier ? "" : verifier.error().to_string()));
    LoadOptions lo;
    lo.verify_bytes = *verifier;
    auto ok = load(model, lo);
    REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
    CHECK(!ok->tensors().empty());
    // The same file through safeckpt::open.
    CHECK(safeckpt::open(model, lo).has_value());
    // Map the signed file, then swap the path to another checkpoint: the
    // mapping is what is hashed and parsed, so the signed bytes load...
    auto mapped = MappedFile::open(model);
    REQUIRE(mapped.has_value());
    fs::copy_file(other, t.path / "swap.pt", fs::copy_options::overwrite_existing);
    fs::rename(t.path / "swap.pt", model);
    CHECK(load_file(std::move(*mapped), lo).has_value());
    // ...and a load of the path now gets the other file's bytes: refused
    // before anything is built.
    auto swapped = load(model, lo);
    REQUIRE(!swapped.has_value());
    CHECK(swapped.error().code() == ErrorCode::kIntegrity);
    auto swapped_open = safeckpt::open(model, lo);
    REQUIRE(!swapped_open.has_value());
    CHECK(swapped_open.error().code() == ErrorCode::kIntegrity);
    // A mapping of the wrong file stays refused after the right bytes are
    // put back at the path: the path is never re-read.
    auto wrong_map = MappedFile::open(model);
    REQUIRE(wrong_map.has_value());
    fs::copy_file(src, t.path / "back.pt", fs::copy_options::overwrite_existing);
    fs::rename(t.path / "back.pt", model);
    auto wm = load_file(std::move(*wrong_map), lo);
    REQUIRE(!wm.has_value());
    CHECK(wm.error().code() == ErrorCode::kIntegrity);
    // Without the verifier the swapped file would have loaded.
    CHECK(load(other).has_value());
  }
  // A verifier refuses to be made from a bundle that does not verify.
  auto b = read(kSamples / "v1.1.0-elliptic-key" / "model.sig");
  auto bad = make_load_verifier(b, key_trust(kMinted / "p256-pub.pem"));
  REQUIRE(!bad.has_value());
  CHECK(bad.error().code() == ErrorCode::kIntegrity);
}
