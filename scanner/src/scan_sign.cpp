// `safeckpt scan --signature`: the model verified against its OpenSSF Model
// Signing bundle (safeckpt/sign.hpp, the code `safeckpt verify` runs), the
// outcome turned into findings (scan.hpp "signatures" states which, where
// and with what severity). The scanner does not hash anything itself: one
// verify_model call decides, and this file only maps its report onto the
// per-file reports by path.
#include <filesystem>
#include <map>
#include <string>

#include "safeckpt/scan.hpp"
#include "safeckpt/sign.hpp"

namespace safeckpt::scan {
namespace {

namespace fs = std::filesystem;

// One key per file however the path was spelled (the walk joins names onto
// the path as given; the bundle names are relative to the model root).
std::string path_key(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  return (ec ? p.lexically_normal() : c).string();
}

Finding make_finding(Rule rule, std::string member, std::string message, std::string why) {
  Finding f;
  f.rule = rule;
  f.severity = rule_info(rule).default_severity;
  f.member = std::move(member);
  f.message = std::move(message);
  f.why = std::move(why);
  return f;
}

constexpr const char* kTamperWhy =
    "the bytes are not the ones that were signed: the model was modified after signing, or the wrong model was "
    "fetched; do not load it";

}  // namespace

bool is_signature_failure(Rule r) noexcept {
  return r == Rule::kSignatureNotVerified || r == Rule::kSignedFileChanged || r == Rule::kSignedFileMissing ||
         r == Rule::kUnsignedFile;
}

bool add_signature_findings(std::vector<FileReport>& reports, const SignatureCheck& check) {
  const std::string bundle_key = path_key(check.bundle);
  // The walk's own report of the bundle (a model.sig inside the model, JSON:
  // not_model) is replaced by the bundle's report below.
  std::erase_if(reports, [&](const FileReport& r) { return path_key(r.path) == bundle_key; });

  std::error_code ec;
  const std::uintmax_t bundle_size = fs::file_size(check.bundle, ec);
  auto bundle = sign::read_bundle(check.bundle, check.verify.limits);
  if (!bundle && bundle.error().code() == ErrorCode::kIo) {
    reports.push_back(unscanned_report(check.bundle.string(), "signature bundle: " + bundle.error().message()));
    return false;
  }
  FileReport b;
  b.path = check.bundle.string();
  b.size = ec ? 0 : bundle_size;
  b.format = "oms_bundle";
  b.verdict = Verdict::kUnsafe;
  auto fail = [&](const std::string& what, const Error& e) {
    b.findings.push_back(make_finding(Rule::kSignatureNotVerified, "", what + ": " + e.to_string(),
                                      "nothing in the model can be trusted as the signed one (fail closed)"));
    reports.push_back(std::move(b));
    return false;
  };
  if (!bundle) return fail("the signature bundle is refused", bundle.error());
  sign::VerifyOptions vo = check.verify;
  vo.signature_path = check.bundle;
  auto r = sign::verify_model(check.model, *bundle, check.trust, vo);
  if (!r)
    return fail(
        r.error().code() == ErrorCode::kIntegrity ? "the signature does not verify" : "the model could not be verified",
        r.error());

  // Reports by file; a single-file model is the model path itself.
  std::map<std::string, FileReport*> by_path;
  for (FileReport& fr : reports)
    if (fr.verdict != Verdict::kError) by_path.emplace(path_key(fr.path), &fr);
  const bool is_dir = fs::is_directory(check.model, ec);
  const sign::Method method = bundle->statement.method;
  std::vector<Finding> on_bundle;
  std::size_t verified = 0, changed = 0, missing = 0, extra = 0;
  // A torch.distributed.checkpoint directory as the model is one report (the
  // directory's, scan_dcp_dir) for the files it covers: their findings go
  // there, naming the file as the member.
  FileReport* dir_report = nullptr;
  if (is_dir)
    if (auto it = by_path.find(path_key(check.model)); it != by_path.end()) dir_report = it->second;
  for (const sign::FileResult& f : r->files) {
    const std::string rel = sign::resource_path(f.name, method);
    auto it = by_path.find(path_key(is_dir ? check.model / rel : check.model));
    FileReport* target = it == by_path.end() ? dir_report : it->second;
    const bool in_dir_report = target != nullptr && target == dir_report;
    Finding fd;
    switch (f.status) {
      case sign::FileStatus::kVerified:
        ++verified;
        fd = make_finding(Rule::kSignatureVerified, "", "matches its signed digest (" + f.name + ")", "");
        break;
      case sign::FileStatus::kChanged:
        ++changed;
        fd = make_finding(Rule::kSignedFileChanged, "",
                          "differs from the digest the signature bundle records for " + f.name, kTamperWhy);
        break;
      case sign::FileStatus::kMissing:
        ++missing;
        target = nullptr;  // no such file: reported where the claim is
        fd = make_finding(Rule::kSignedFileMissing, "",
                          "signed file " + rel + " is missing from the model " + check.model.string(),
                          "the model is not complete as signed: a file was removed or renamed after signing");
        break;
      case sign::FileStatus::kExtra:
        ++extra;
        fd = make_finding(Rule::kUnsignedFile, "", "not signed by " + check.bundle.string(),
                          "a file added after signing is not vouched for by the signer "
                          "(--ignore-unsigned-files or --ignore-paths to accept it)");
        break;
    }
    if (target == nullptr) {
      fd.member = f.name;
      on_bundle.push_back(std::move(fd));
      continue;
    }
    if (in_dir_report) fd.member = rel;
    if (is_signature_failure(fd.rule) && (target->verdict == Verdict::kClean || target->verdict == Verdict::kNotModel))
      target->verdict = Verdict::kUnsafe;
    target->findings.push_back(std::move(fd));
  }
  const bool ok = r->ok();
  b.verdict = ok ? Verdict::kClean : Verdict::kUnsafe;
  std::string summary = ok ? "signature verified: " + r->summary() + "; signer: " + r->signer
                           : "signature valid (signer: " + r->signer +
                                 ") but the model differs: " + std::to_string(verified) + " verified, " +
                                 std::to_string(changed) + " changed, " + std::to_string(missing) + " missing, " +
                                 std::to_string(extra) + " unsigned";
  b.findings.push_back(make_finding(Rule::kSignatureVerified, "", std::move(summary), ""));
  for (Finding& f : on_bundle) {
    if (is_signature_failure(f.rule)) b.verdict = Verdict::kUnsafe;
    b.findings.push_back(std::move(f));
  }
  reports.push_back(std::move(b));
  return ok;
}

}  // namespace safeckpt::scan
