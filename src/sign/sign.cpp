// sign / verify / verify-then-load (include/safeckpt/sign.hpp).
#include "safeckpt/sign.hpp"

#include <algorithm>
#include <map>
#include <set>

#include "safeckpt/save.hpp"
#include "sign/internal.hpp"

namespace safeckpt::sign {
namespace {

// model_signing's default ignores at the model root (MT hashing.py).
const std::vector<std::string> kGitIgnores = {".git", ".gitattributes", ".github", ".gitignore"};

// The signature file's name relative to a directory model, when inside it.
std::optional<std::string> relative_inside(const std::filesystem::path& model, const std::filesystem::path& file) {
  if (file.empty()) return std::nullopt;
  std::error_code ec;
  if (!std::filesystem::is_directory(model, ec)) return std::nullopt;
  std::filesystem::path root = std::filesystem::weakly_canonical(model, ec);
  if (ec) return std::nullopt;
  std::filesystem::path f = std::filesystem::weakly_canonical(file, ec);
  if (ec) return std::nullopt;
  std::filesystem::path rel = f.lexically_relative(root);
  if (rel.empty() || rel.begin()->string() == ".." || rel == ".") return std::nullopt;
  return rel.generic_string();
}

void sort_resources(std::vector<Resource>& rs, Method m) {
  // Files by byte order of the path; the shards of a file by start offset
  // (model_signing 1.1's order, its golden statements).
  if (m == Method::kFiles) {
    std::sort(rs.begin(), rs.end(), [](const Resource& a, const Resource& b) { return a.name < b.name; });
    return;
  }
  auto key = [](const Resource& r) {
    auto s = split_shard_name(r.name);
    return s ? std::make_pair(s->path, s->start) : std::make_pair(r.name, std::uint64_t{0});
  };
  std::stable_sort(rs.begin(), rs.end(), [&](const Resource& a, const Resource& b) { return key(a) < key(b); });
}

}  // namespace

std::string resource_path(const std::string& name, Method method) {
  if (method == Method::kFiles) return name;
  const std::size_t c2 = name.rfind(':');
  if (c2 == std::string::npos || c2 == 0) return name;
  const std::size_t c1 = name.rfind(':', c2 - 1);
  return c1 == std::string::npos ? name : name.substr(0, c1);
}

std::string_view file_status_name(FileStatus s) noexcept {
  switch (s) {
    case FileStatus::kVerified: return "verified";
    case FileStatus::kChanged: return "changed";
    case FileStatus::kMissing: return "missing";
    case FileStatus::kExtra: return "extra";
  }
  return "unknown";
}

bool VerifyReport::ok() const noexcept {
  return std::all_of(files.begin(), files.end(), [](const FileResult& f) { return f.status == FileStatus::kVerified; });
}

std::string VerifyReport::summary() const {
  std::map<FileStatus, std::vector<std::string>> by;
  for (const FileResult& f : files) by[f.status].push_back(f.name);
  if (ok()) return "verified " + std::to_string(files.size()) + " resource(s)";
  std::string s;
  for (FileStatus st : {FileStatus::kChanged, FileStatus::kMissing, FileStatus::kExtra}) {
    auto it = by.find(st);
    if (it == by.end()) continue;
    if (!s.empty()) s += "; ";
    s += std::to_string(it->second.size()) + " " + std::string(file_status_name(st)) + ":";
    for (std::size_t i = 0; i < it->second.size() && i < 20; ++i) s += " " + it->second[i];
    if (it->second.size() > 20) s += " ...";
  }
  return s;
}

Result<Statement> build_statement(const std::filesystem::path& model, const HashOptions& options,
                                  std::vector<Resource> resources, bool record_ignore_paths) {
  Statement st;
  std::filesystem::path m = model.lexically_normal();
  if (!m.has_filename()) m = m.parent_path();
  st.subject_name = m.filename().string();
  if (st.subject_name.empty() || st.subject_name == ".")
    st.subject_name = std::filesystem::absolute(model).lexically_normal().parent_path().filename().string();
  st.method = options.method;
  st.hash_type = options.hash_type;
  st.allow_symlinks = options.allow_symlinks;
  st.shard_size = options.method == Method::kShards ? options.shard_size : 0;
  if (record_ignore_paths) {
    std::vector<std::string> ip = options.ignore_paths;
    std::sort(ip.begin(), ip.end());
    ip.erase(std::unique(ip.begin(), ip.end()), ip.end());
    st.ignore_paths = std::move(ip);
  }
  sort_resources(resources, options.method);
  st.resources = std::move(resources);
  SAFECKPT_TRY(st.root_digest, root_digest(st.resources));
  return st;
}

Result<std::string> sign_payload(const std::string& payload, const Signer& signer) {
  SAFECKPT_TRY(SignedPayload sp, sign_pae(payload, signer));
  std::optional<std::string> hint;
  if (signer.certificate_pem.empty()) hint = sp.hint;
  return bundle_json(payload, sp.signature, hint, sp.certificates);
}

Result<Bundle> sign_model(const std::filesystem::path& model, const std::filesystem::path& signature,
                          const Signer& signer, const SignOptions& options) {
  HashOptions ho = options.hash;
  for (const std::string& p : ho.ignore_paths) SAFECKPT_CHECK(check_path_name(p, "ignore path", ho.limits));
  std::error_code ec;
  if (std::filesystem::is_directory(model, ec)) {
    ho.ignore_paths.insert(ho.ignore_paths.end(), kGitIgnores.begin(), kGitIgnores.end());
    if (auto rel = relative_inside(model, signature)) ho.ignore_paths.push_back(*rel);
  }
  SAFECKPT_TRY(std::vector<Resource> rs, hash_model(model, ho));
  if (rs.empty())
    return make_error(ErrorCode::kInvalidArgument,
                      "model " + model.string() + ": no file to sign (verifiers refuse an empty resource list)");
  SAFECKPT_TRY(Statement st, build_statement(model, ho, std::move(rs), true));
  const std::string payload = statement_json(st);
  SAFECKPT_TRY(std::string json, sign_payload(payload, signer));
  SaveOptions so;
  so.overwrite = options.overwrite;
  SAFECKPT_CHECK(write_file_atomically(signature, so, [&](const std::function<Status(Bytes)>& write) {
    return write(Bytes(reinterpret_cast<const std::uint8_t*>(json.data()), json.size()));
  }));
  return parse_bundle(Bytes(reinterpret_cast<const std::uint8_t*>(json.data()), json.size()), ho.limits);
}

Result<VerifyReport> verify_model(const std::filesystem::path& model, const Bundle& bundle, const Trust& trust,
                                  const VerifyOptions& options) {
  VerifyReport report;
  SAFECKPT_TRY(report.signer, verify_signature(bundle, trust));
  const Statement& st = bundle.statement;
  HashOptions ho;
  ho.method = st.method;
  ho.hash_type = st.hash_type;
  ho.shard_size = st.method == Method::kShards ? st.shard_size : kDefaultShardSize;
  ho.allow_symlinks = st.allow_symlinks;
  ho.threads = options.threads;
  ho.limits = options.limits;
  for (const std::string& p : options.ignore_paths) SAFECKPT_CHECK(check_path_name(p, "ignore path", options.limits));
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(model, ec);
  if (is_dir) {
    ho.ignore_paths = kGitIgnores;
    if (st.ignore_paths)
      ho.ignore_paths.insert(ho.ignore_paths.end(), st.ignore_paths->begin(), st.ignore_paths->end());
    ho.ignore_paths.insert(ho.ignore_paths.end(), options.ignore_paths.begin(), options.ignore_paths.end());
    if (auto rel = relative_inside(model, options.signature_path)) ho.ignore_paths.push_back(*rel);
  }
  // A single-file model is "." locally; a bundle naming it by its base name
  // (the SPEC/Go form) is accepted as the same file.
  std::string single_alias;
  if (!is_dir && !st.resources.empty()) {
    std::string p = resource_path(st.resources[0].name, st.method);
    if (p != ".") single_alias = p;
  }
  if (options.ignore_unsigned_files) {
    std::set<std::string> paths;
    for (const Resource& r : st.resources) paths.insert(resource_path(r.name, st.method));
    std::vector<std::string> only(paths.begin(), paths.end());
    if (!single_alias.empty()) only.emplace_back(".");
    ho.only = std::move(only);
  }
  SAFECKPT_TRY(std::vector<Resource> local, hash_model(model, ho));
  if (!single_alias.empty())
    for (Resource& r : local) r.name = single_alias + r.name.substr(1);
  std::map<std::string, const Resource*> want;
  for (const Resource& r : st.resources) want[r.name] = &r;
  std::map<std::string, const Resource*> have;
  for (const Resource& r : local) have[r.name] = &r;
  for (const auto& [name, r] : want) {
    auto it = have.find(name);
    FileStatus s = it == have.end()                                                             ? FileStatus::kMissing
                   : (it->second->digest == r->digest && it->second->algorithm == r->algorithm) ? FileStatus::kVerified
                                                                                                : FileStatus::kChanged;
    report.files.push_back({name, s});
  }
  for (const auto& [name, r] : have) {
    (void)r;
    if (want.count(name) == 0) report.files.push_back({name, FileStatus::kExtra});
  }
  std::sort(report.files.begin(), report.files.end(),
            [](const FileResult& a, const FileResult& b) { return a.name < b.name; });
  return report;
}

Result<std::function<Status(Bytes, const std::filesystem::path&)>> make_load_verifier(const Bundle& bundle,
                                                                                      const Trust& trust,
                                                                                      std::string resource_name,
                                                                                      unsigned threads) {
  SAFECKPT_CHECK(verify_signature(bundle, trust));
  auto st = std::make_shared<Statement>(bundle.statement);
  return std::function<Status(Bytes, const std::filesystem::path&)>(
      [st, resource_name, threads](Bytes data, const std::filesystem::path& path) -> Status {
        std::string name = resource_name;
        const std::string first = resource_path(st->resources[0].name, st->method);
        if (name.empty()) name = first == "." ? "." : path.filename().string();
        std::vector<Resource> want;
        for (const Resource& r : st->resources)
          if (resource_path(r.name, st->method) == name) want.push_back(r);
        if (want.empty())
          return make_error(ErrorCode::kIntegrity, "verify-then-load: \"" + name + "\" is not signed by the bundle");
        HashOptions ho;
        ho.method = st->method;
        ho.hash_type = st->hash_type;
        ho.shard_size = st->shard_size;
        ho.threads = threads;
        if (ho.hash_type != "sha256" && ho.hash_type != "blake2b")
          return make_error(ErrorCode::kUnsupported, "verify-then-load: hash_type " + ho.hash_type);
        std::vector<Resource> got = hash_bytes(data, name, ho);
        sort_resources(want, st->method);
        bool same = got.size() == want.size();
        for (std::size_t i = 0; same && i < got.size(); ++i)
          same = got[i].name == want[i].name && got[i].digest == want[i].digest;
        if (!same)
          return make_error(ErrorCode::kIntegrity, "verify-then-load: the bytes of " + path.string() +
                                                       " do not match the signed digest of \"" + name + "\"");
        return {};
      });
}

}  // namespace safeckpt::sign
