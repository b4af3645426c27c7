// `safeckpt sign` and `safeckpt verify`: OpenSSF Model Signing bundles
// (safeckpt/sign.hpp), the files model_signing 1.1 writes and accepts.
//
//   safeckpt sign MODEL --signature OUT [--private-key PEM]
//        [--certificate PEM --certificate-chain PEM...] [--ignore-paths P...]
//        [--serialization files|shards] [--shard-size N]
//   safeckpt verify MODEL --signature BUNDLE (--public-key PEM | --certificate-chain PEM...)
//        [--ignore-paths P...] [--ignore-unsigned-files] [--format text|json]
//
// Exit codes: 0 signed / verified; 1 verification failed (signature, key,
// chain, or which files changed, are missing or extra); 2 usage error or
// unreadable/malformed input. --ignore-paths takes paths as model_signing's
// CLI does: a path that, taken from the current directory, lies inside the
// model is made relative to the model root; any other is taken as already
// relative to the model root.
#include "safeckpt/sign.hpp"

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "commands.hpp"

namespace safeckpt::cli {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> model_relative(const fs::path& model, const std::vector<std::string>& paths) {
  std::vector<std::string> out;
  std::error_code ec;
  const fs::path root = fs::weakly_canonical(model, ec);
  for (const std::string& p : paths) {
    fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
    fs::path rel = abs.lexically_relative(root);
    if (!ec && !rel.empty() && rel.begin()->string() != ".." && rel != ".")
      out.push_back(rel.generic_string());
    else
      out.push_back(p);
  }
  return out;
}

struct SignArgs {
  std::string model, signature, private_key, certificate, serialization = "files";
  std::vector<std::string> chain, ignore;
  std::uint64_t shard_size = sign::kDefaultShardSize;
  unsigned threads = 0;
};

int run_sign(const SignArgs& a) {
  if (a.private_key.empty()) {
    std::fprintf(stderr, "safeckpt sign: --private-key is required (keyless Sigstore signing is not supported)\n");
    return 2;
  }
  if (a.certificate.empty() && !a.chain.empty()) {
    std::fprintf(stderr, "safeckpt sign: --certificate-chain needs --certificate\n");
    return 2;
  }
  std::vector<fs::path> chain(a.chain.begin(), a.chain.end());
  auto signer = sign::signer_from_files(a.private_key, a.certificate, chain);
  if (!signer) {
    std::fprintf(stderr, "safeckpt sign: %s\n", signer.error().to_string().c_str());
    return 2;
  }
  sign::SignOptions so;
  so.hash.method = a.serialization == "shards" ? sign::Method::kShards : sign::Method::kFiles;
  so.hash.shard_size = a.shard_size;
  so.hash.threads = a.threads;
  so.hash.ignore_paths = model_relative(a.model, a.ignore);
  auto b = sign::sign_model(a.model, a.signature, *signer, so);
  if (!b) {
    std::fprintf(stderr, "safeckpt sign: %s\n", b.error().to_string().c_str());
    return 2;
  }
  std::printf("signed %zu resource(s) of %s (root digest %s) -> %s\n", b->statement.resources.size(), a.model.c_str(),
              b->statement.root_digest.c_str(), a.signature.c_str());
  return 0;
}

struct VerifyArgs {
  std::string model, format = "text";
  VerifyInputs in;
};

int run_verify(const VerifyArgs& args) {
  const VerifyInputs& a = args.in;
  if (a.public_key.empty() == a.chain.empty()) {
    std::fprintf(stderr, "safeckpt verify: give exactly one of --public-key and --certificate-chain\n");
    return 2;
  }
  const bool json = args.format == "json";
  auto fail = [&](int code, const std::string& stage, const Error& e) {
    if (json) {
      nlohmann::ordered_json j;
      j["model"] = args.model;
      j["signature"] = a.signature;
      j["verified"] = false;
      j["stage"] = stage;
      j["error"] = {{"code", std::string(error_code_name(e.code()))}, {"message", e.message()}};
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::fprintf(stderr, "safeckpt verify: %s: %s\n", stage.c_str(), e.to_string().c_str());
    }
    return code;
  };
  auto bundle = sign::read_bundle(a.signature);
  if (!bundle) return fail(2, "bundle", bundle.error());
  auto trust = verify_trust(a);
  if (!trust) return fail(2, "trust", trust.error());
  auto r = sign::verify_model(args.model, *bundle, *trust, verify_options(args.model, a));
  if (!r) {
    const ErrorCode c = r.error().code();
    return fail(c == ErrorCode::kIntegrity ? 1 : 2, c == ErrorCode::kIntegrity ? "signature" : "input", r.error());
  }
  if (json) {
    nlohmann::ordered_json j;
    j["model"] = args.model;
    j["signature"] = a.signature;
    j["verified"] = r->ok();
    j["signer"] = r->signer;
    j["method"] = bundle->statement.method == sign::Method::kFiles ? "files" : "shards";
    j["hash_type"] = bundle->statement.hash_type;
    j["root_digest"] = bundle->statement.root_digest;
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (const auto& f : r->files)
      files.push_back({{"name", f.name}, {"status", std::string(sign::file_status_name(f.status))}});
    j["files"] = files;
    std::printf("%s\n", j.dump(2).c_str());
  } else if (r->ok()) {
    std::printf("verified: %s (%s; signer: %s)\n", args.model.c_str(), r->summary().c_str(), r->signer.c_str());
  } else {
    std::printf("verification FAILED: %s: %s (signature by %s is valid; the model differs)\n", args.model.c_str(),
                r->summary().c_str(), r->signer.c_str());
  }
  return r->ok() ? 0 : 1;
}

}  // namespace

void add_verify_options(CLI::App* cmd, VerifyInputs& v, bool signature_required) {
  CLI::Option* sig = cmd->add_option("--signature", v.signature, "the OpenSSF Model Signing bundle (model.sig)");
  if (signature_required) sig->required();
  cmd->add_option("--public-key", v.public_key, "key method: the signer's public key PEM");
  cmd->add_option("--certificate-chain", v.chain, "certificate method: trusted CA certificate PEM file(s)");
  cmd->add_option("--ignore-paths", v.ignore, "paths to skip (besides those the bundle records)");
  cmd->add_flag("--ignore-unsigned-files", v.ignore_unsigned, "do not fail on files the bundle does not list");
  cmd->add_option("--threads", v.threads, "hashing threads (default: all cores)");
}

Result<sign::Trust> verify_trust(const VerifyInputs& v) {
  if (v.public_key.empty() == v.chain.empty())
    return make_error(ErrorCode::kInvalidArgument, "give exactly one of --public-key and --certificate-chain");
  return v.public_key.empty() ? sign::trust_from_chain_files(std::vector<fs::path>(v.chain.begin(), v.chain.end()))
                              : sign::trust_from_public_key_file(v.public_key);
}

sign::VerifyOptions verify_options(const std::string& model, const VerifyInputs& v) {
  sign::VerifyOptions vo;
  vo.ignore_paths = model_relative(model, v.ignore);
  vo.ignore_unsigned_files = v.ignore_unsigned;
  vo.signature_path = v.signature;
  vo.threads = v.threads;
  return vo;
}

void register_sign(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<SignArgs>();
  CLI::App* cmd = app.add_subcommand("sign", "sign a model (directory or file) as an OpenSSF Model Signing bundle");
  cmd->add_option("MODEL", a->model, "model directory or single file")->required();
  cmd->add_option("--signature", a->signature, "output bundle (written atomically; model.sig by convention)")
      ->required();
  cmd->add_option("--private-key", a->private_key, "EC P-256/P-384/P-521 private key PEM");
  cmd->add_option("--certificate", a->certificate, "signing certificate PEM (certificate method)");
  cmd->add_option("--certificate-chain", a->chain, "intermediate certificate PEM file(s), put in the bundle");
  cmd->add_option("--ignore-paths", a->ignore, "paths to leave unsigned (recorded in the bundle)");
  cmd->add_option("--serialization", a->serialization, "files (default; what model_signing verifies) or shards")
      ->check(CLI::IsMember({"files", "shards"}));
  cmd->add_option("--shard-size", a->shard_size, "bytes per shard for --serialization shards (default 1000000000)")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 50));
  cmd->add_option("--threads", a->threads, "hashing threads (default: all cores)");
  cmd->callback([a, &exit_code] { exit_code = run_sign(*a); });
}

void register_verify(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<VerifyArgs>();
  CLI::App* cmd = app.add_subcommand(
      "verify", "verify a model against an OpenSSF Model Signing bundle (exit 0 verified, 1 failed, 2 bad input)");
  cmd->add_option("MODEL", a->model, "model directory or single file")->required();
  add_verify_options(cmd, a->in, true);
  cmd->add_option("--format", a->format, "text (default) or json")->check(CLI::IsMember({"text", "json"}));
  cmd->callback([a, &exit_code] { exit_code = run_verify(*a); });
}

}  // namespace safeckpt::cli
