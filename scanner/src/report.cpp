// Reports: human text, JSON (schema: scanner/README.md), SARIF 2.1.0.
#include <fnmatch.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>

#include "safeckpt/scan.hpp"

namespace safeckpt::scan {
namespace {

using json = nlohmann::json;

constexpr std::uint64_t kNoOffset = ~std::uint64_t{0};

// One line per message in the text report.
std::string one_line(std::string s) {
  for (std::size_t i = 0; (i = s.find('\n', i)) != std::string::npos;) s.replace(i, 1, " / ");
  return s;
}

std::string where(const Finding& f) {
  std::string w = f.member.empty() ? std::string() : f.member;
  if (f.stream >= 0) w += (w.empty() ? "" : " ") + std::string("stream ") + std::to_string(f.stream);
  if (f.offset != kNoOffset) w += (w.empty() ? "" : " ") + std::string("@") + std::to_string(f.offset);
  if (!f.opcode.empty()) w += (w.empty() ? "" : " ") + f.opcode;
  return w;
}

// Invalid UTF-8 from hostile names must not make nlohmann throw.
std::string clean(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  const auto* u = reinterpret_cast<const unsigned char*>(s.data());
  for (std::size_t i = 0; i < s.size();) {
    unsigned c = u[i];
    std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    bool ok = len != 0 && i + len <= s.size();
    for (std::size_t k = 1; ok && k < len; ++k) ok = (u[i + k] & 0xC0) == 0x80;
    if (ok && len == 1 && c < 0x20 && c != '\t' && c != '\n') ok = false;
    if (ok) {
      out.append(s.substr(i, len));
      i += len;
    } else {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
      ++i;
    }
  }
  return out;
}

// The bundle report's own SCK204 (add_signature_findings): "signature verified".
bool is_signature_summary(const FileReport& r, const Finding& f) {
  return f.rule == Rule::kSignatureVerified && r.format == "oms_bundle" && f.member.empty();
}

json finding_json(const Finding& f) {
  const RuleInfo& ri = rule_info(f.rule);
  json j;
  j["rule"] = std::string(ri.id);
  j["rule_name"] = std::string(ri.name);
  j["severity"] = std::string(severity_name(f.severity));
  j["member"] = clean(f.member);
  j["stream"] = f.stream >= 0 ? json(f.stream) : json(nullptr);
  j["offset"] = f.offset != kNoOffset ? json(f.offset) : json(nullptr);
  j["opcode"] = f.opcode.empty() ? json(nullptr) : json(f.opcode);
  j["global"] = f.global.empty() ? json(nullptr) : json(clean(f.global));
  j["category"] = f.category.empty() ? json(nullptr) : json(f.category);
  j["message"] = clean(f.message);
  j["why"] = clean(f.why);
  j["suppressed"] = f.suppressed;
  j["suppression"] = f.suppressed ? json(clean(f.suppression)) : json(nullptr);
  return j;
}

std::string sarif_level(Severity s) {
  switch (s) {
    case Severity::kCritical:
    case Severity::kHigh: return "error";
    case Severity::kMedium: return "warning";
    default: return "note";
  }
}

// GitHub's `security-severity` (CVSS-like 0.0-10.0).
std::string security_severity(Severity s) {
  switch (s) {
    case Severity::kCritical: return "9.8";
    case Severity::kHigh: return "8.0";
    case Severity::kMedium: return "5.5";
    case Severity::kLow: return "3.0";
    default: return "0.0";
  }
}

// Percent-encodes a path for a URI (RFC 3986 unreserved characters and '/'
// kept).
std::string uri_escape(const std::string& p) {
  std::string out;
  for (unsigned char c : p) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
        c == '_' || c == '~' || c == '/') {
      out.push_back(static_cast<char>(c));
    } else {
      char b[4];
      std::snprintf(b, sizeof b, "%%%02X", c);
      out += b;
    }
  }
  return out;
}

// The path as given with leading "./" dropped.
std::string plain_path(const std::string& path) {
  std::string p = path;
  while (p.rfind("./", 0) == 0) p.erase(0, 2);
  return p;
}

// Path relative to `base` when it lies under it (lexically: symlinks are not
// resolved), else "".
std::string relative_to(const std::string& path, const std::string& base) {
  namespace fs = std::filesystem;
  if (base.empty() || path.empty()) return {};
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(path), ec).lexically_normal();
  if (ec) return {};
  fs::path rel = abs.lexically_relative(fs::path(base).lexically_normal());
  if (rel.empty()) return {};
  std::string r = rel.generic_string();
  if (r == "." || r == ".." || r.rfind("../", 0) == 0) return {};
  return r;
}

// SARIF artifactLocation: relative to %SRCROOT% when possible (GitHub
// resolves %SRCROOT% to the repository root), else an absolute file:// URI.
json artifact_location(const std::string& path, const ReportOptions& o) {
  std::string rel = relative_to(path, o.base_dir);
  if (!rel.empty()) return {{"uri", uri_escape(rel)}, {"uriBaseId", "%SRCROOT%"}};
  std::string p = plain_path(path);
  if (!p.empty() && p[0] == '/') return {{"uri", "file://" + uri_escape(p)}};
  return {{"uri", uri_escape(p)}, {"uriBaseId", "%SRCROOT%"}};
}

std::string fingerprint(const std::string& path, const Finding& f) {
  std::string key = path + "|" + std::string(rule_info(f.rule).id) + "|" + f.member + "|" + std::to_string(f.stream) +
                    "|" + (f.offset == kNoOffset ? std::string("-") : std::to_string(f.offset)) + "|" + f.global + "|" +
                    f.opcode;
  // FNV-1a 64, hex: stable across runs and platforms.
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return hex;
}

// ANSI colours for the text report (only with ReportOptions::color).
struct Paint {
  bool on;
  std::string operator()(std::string_view s, const char* code) const {
    return on ? "\033[" + std::string(code) + "m" + std::string(s) + "\033[0m" : std::string(s);
  }
};
const char* severity_colour(Severity s) {
  switch (s) {
    case Severity::kCritical: return "1;31";
    case Severity::kHigh: return "31";
    case Severity::kMedium: return "33";
    case Severity::kLow: return "36";
    default: return "2";
  }
}
const char* verdict_colour(Verdict v) {
  switch (v) {
    case Verdict::kClean: return "32";
    case Verdict::kNotModel: return "2";
    case Verdict::kUnsafe: return "1;31";
    default: return "1;33";
  }
}

std::string trim(std::string_view s) {
  std::size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\r')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

}  // namespace

std::string file_uri(const std::string& path) {
  return "file://" + uri_escape(path);
}

FileReport unscanned_report(std::string path, std::string reason) {
  FileReport rep;
  rep.path = std::move(path);
  rep.verdict = Verdict::kError;
  rep.complete = false;
  rep.format = "unreadable";
  Finding f;
  f.rule = Rule::kIo;
  f.severity = Severity::kHigh;
  f.message = std::move(reason);
  f.why = "the path could not be read, so it was not examined";
  rep.findings.push_back(std::move(f));
  return rep;
}

Result<std::vector<IgnoreRule>> parse_ignore(std::string_view text, std::string_view source) {
  std::vector<IgnoreRule> out;
  std::size_t line_no = 0;
  for (std::size_t pos = 0; pos <= text.size();) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (std::size_t hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    std::string l = trim(line);
    if (l.empty()) continue;
    const std::string where = std::string(source) + ":" + std::to_string(line_no);
    std::size_t sp = l.find_last_of(" \t");
    if (sp == std::string::npos)
      return make_error(ErrorCode::kInvalidArgument, where + ": expected `PATH_GLOB RULE`, got `" + l + "`");
    std::string glob = trim(std::string_view(l).substr(0, sp));
    std::string rule = l.substr(sp + 1);
    const RuleInfo* found = nullptr;
    for (const RuleInfo& ri : rules())
      if (ri.id == rule || ri.name == rule) found = &ri;
    if (found == nullptr)
      return make_error(ErrorCode::kInvalidArgument,
                        where + ": unknown rule `" + rule + "` (a rule id such as SCK102, or its name)");
    if (found->rule == Rule::kIo)
      return make_error(ErrorCode::kInvalidArgument,
                        where + ": " + std::string(found->id) +
                            " (io-error) cannot be ignored: a path that was not read is never accepted");
    if (found->rule == Rule::kSignatureNotVerified)
      return make_error(ErrorCode::kInvalidArgument,
                        where + ": " + std::string(found->id) +
                            " (signature-not-verified) cannot be ignored: a signature that does not verify is never "
                            "accepted (drop --signature to scan without it)");
    out.push_back({std::move(glob), found->rule, where});
  }
  return out;
}

Result<std::vector<IgnoreRule>> read_ignore_file(const std::filesystem::path& path) {
  constexpr std::uintmax_t kMaxIgnoreFile = 1u << 20;
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return make_error(ErrorCode::kIo, path.string() + ": " + ec.message());
  if (size > kMaxIgnoreFile)
    return make_error(ErrorCode::kInvalidArgument, path.string() + ": ignore file larger than 1 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, path.string() + ": cannot open");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  return parse_ignore(text, path.string());
}

std::uint64_t apply_ignores(std::vector<FileReport>& reports, const std::vector<IgnoreRule>& rules_,
                            const std::string& base_dir) {
  std::uint64_t n = 0;
  for (FileReport& r : reports) {
    if (r.verdict == Verdict::kError) continue;  // not scanned: never accepted
    const std::string given = plain_path(r.path);
    const std::string rel = relative_to(r.path, base_dir);
    for (Finding& f : r.findings) {
      if (f.suppressed || f.rule == Rule::kIo || f.rule == Rule::kSignatureNotVerified) continue;
      for (const IgnoreRule& ir : rules_) {
        if (ir.rule != f.rule) continue;
        if (fnmatch(ir.path_glob.c_str(), given.c_str(), 0) == 0 ||
            (!rel.empty() && fnmatch(ir.path_glob.c_str(), rel.c_str(), 0) == 0)) {
          f.suppressed = true;
          f.suppression = ir.source;
          ++n;
          break;
        }
      }
    }
  }
  return n;
}

Totals totals(const std::vector<FileReport>& reports, const ReportOptions& options) {
  Totals t;
  t.skipped = options.skipped.size();
  for (const FileReport& r : reports) {
    ++t.files;
    switch (r.verdict) {
      case Verdict::kClean: ++t.clean; break;
      case Verdict::kUnsafe: ++t.unsafe; break;
      case Verdict::kIncomplete: ++t.incomplete; break;
      case Verdict::kUnscannable: ++t.unscannable; break;
      case Verdict::kNotModel: ++t.not_model; break;
      case Verdict::kError: ++t.errors; break;
    }
    for (const Finding& f : r.findings) {
      if (!f.suppressed && (f.severity >= options.fail_on || is_signature_failure(f.rule))) ++t.failing;
      if (f.severity == Severity::kInfo) continue;
      if (f.suppressed) {
        ++t.suppressed;
        continue;
      }
      ++t.findings;
      ++t.by_severity[static_cast<int>(f.severity)];
    }
  }
  return t;
}

int exit_code(const std::vector<FileReport>& reports, const ReportOptions& options) {
  if (reports.empty()) return 2;
  int rc = 0;
  for (const FileReport& r : reports) {
    if (r.verdict == Verdict::kError) return 2;
    for (const Finding& f : r.findings)
      if (!f.suppressed && (f.severity >= options.fail_on || is_signature_failure(f.rule))) rc = 1;
  }
  return rc;
}

void write_text(std::ostream& out, const std::vector<FileReport>& reports, const ReportOptions& o) {
  const Paint paint{o.color};
  std::uint64_t quiet_not_models = 0;
  for (const FileReport& r : reports) {
    if (r.verdict == Verdict::kError) {
      // A path not scanned: one line, whatever the verbosity.
      std::string reason;
      for (const Finding& f : r.findings)
        if (f.rule == Rule::kIo) reason = f.message;
      out << clean(r.path) << ": " << paint("NOT SCANNED", "1;31") << " (" << one_line(clean(reason)) << ")\n";
      continue;
    }
    const bool only_info = std::all_of(r.findings.begin(), r.findings.end(),
                                       [](const Finding& f) { return f.severity == Severity::kInfo; });
    if (r.verdict == Verdict::kNotModel && only_info && !o.verbose) {
      ++quiet_not_models;
      continue;
    }
    std::string v(verdict_name(r.verdict));
    for (auto& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    out << clean(r.path) << ": " << paint(v, verdict_colour(r.verdict)) << " [" << r.format << ", " << r.size
        << " bytes";
    if (r.pickle_streams) out << ", " << r.pickle_streams << " pickle stream" << (r.pickle_streams == 1 ? "" : "s");
    if (r.members) out << ", " << r.members << " member" << (r.members == 1 ? "" : "s");
    out << "]";
    if (!r.complete) out << " (scan incomplete)";
    out << "\n";
    // A refusal is the SCK180 finding below (with its message); only an
    // acceptance gets a line of its own, so the loader's text appears once.
    if (r.loader.ran && r.loader.ok) out << "  loader: accepts\n";
    for (const Finding& f : r.findings) {
      // The bundle's "signature verified" line is the answer to --signature: always shown.
      if (f.severity == Severity::kInfo && !o.verbose && !is_signature_summary(r, f)) continue;
      const RuleInfo& ri = rule_info(f.rule);
      std::string w = where(f);
      const std::string tag = "[" + std::string(severity_name(f.severity)) + "]";
      out << "  " << paint(tag, severity_colour(f.severity)) << " " << ri.id << " " << ri.name
          << (w.empty() ? std::string() : " at " + one_line(clean(w))) << ": " << one_line(clean(f.message))
          << (f.suppressed ? " (suppressed by " + clean(f.suppression) + ")" : std::string()) << "\n";
      if (!f.why.empty() && !f.suppressed) out << "      why: " << one_line(clean(f.why)) << "\n";
    }
    if (o.verbose) {
      for (const Event& e : r.events) {
        out << "  " << event_type_name(e.type) << " " << clean(e.name) << " "
            << (e.member.empty() ? std::string() : clean(e.member) + " ") << "stream " << e.stream << " @" << e.offset
            << " " << e.opcode << " (" << (e.allowed ? "allowed" : "NOT allowed") << ")\n";
      }
    }
  }
  if (quiet_not_models > 0)
    out << quiet_not_models << " file" << (quiet_not_models == 1 ? " is" : "s are")
        << " not a model (no loader can start on " << (quiet_not_models == 1 ? "it" : "them") << "; -v lists "
        << (quiet_not_models == 1 ? "it" : "them") << ")\n";
  for (const PathProblem& s : o.skipped)
    if (o.verbose) out << clean(s.path) << ": skipped (" << one_line(clean(s.reason)) << ")\n";
  Totals t = totals(reports, o);
  out << "\n"
      << t.files << " file" << (t.files == 1 ? "" : "s") << " scanned: " << t.clean << " clean, " << t.unsafe
      << " unsafe, " << t.incomplete << " incomplete, " << t.unscannable << " unscannable, " << t.not_model
      << " not a model, " << t.errors << " unreadable; " << t.findings << " finding" << (t.findings == 1 ? "" : "s")
      << " (" << t.by_severity[4] << " critical, " << t.by_severity[3] << " high, " << t.by_severity[2] << " medium, "
      << t.by_severity[1] << " low)";
  if (t.suppressed > 0) out << ", " << t.suppressed << " suppressed";
  if (t.skipped > 0) out << ", " << t.skipped << " skipped";
  out << "\n";
  if (t.errors > 0)
    out << paint(std::to_string(t.errors) + " path" + (t.errors == 1 ? " was" : "s were") +
                     " not scanned: the run is not clean (exit code 2)",
                 "1;31")
        << "\n";
}

std::string to_json(const std::vector<FileReport>& reports, const ReportOptions& o) {
  json root;
  root["schema"] = "safeckpt-scan";
  root["schema_version"] = kJsonSchemaVersion;
  root["tool"] = {{"name", "safeckpt"}, {"component", "scan"}};
  if (!o.tool_version.empty()) root["tool"]["version"] = o.tool_version;
  json files = json::array();
  json path_errors = json::array();
  for (const FileReport& r : reports) {
    json f;
    f["path"] = clean(r.path);
    f["size"] = r.size;
    f["format"] = r.format;
    f["verdict"] = std::string(verdict_name(r.verdict));
    f["complete"] = r.complete;
    f["pickle_streams"] = r.pickle_streams;
    f["members"] = r.members;
    if (r.loader.ran) {
      json l;
      // Who decided: safeckpt::load() for checkpoints, the graph engine's
      // reader and validator for PT2 archives, the DCP reader for a
      // torch.distributed.checkpoint directory (scanner/README.md).
      l["by"] = r.format == "pt2_archive" ? "engine" : r.format == "dcp_directory" ? "dcp" : "load";
      l["ok"] = r.loader.ok;
      if (!r.loader.ok) {
        l["error"] = {{"code", std::string(error_code_name(r.loader.code))},
                      {"code_number", static_cast<int>(r.loader.code)},
                      {"message", clean(r.loader.message)},
                      {"record", clean(r.loader.record)},
                      {"offset", r.loader.offset == kNoOffset ? json(nullptr) : json(r.loader.offset)},
                      {"opcode", r.loader.opcode.empty() ? json(nullptr) : json(r.loader.opcode)}};
      }
      f["loader"] = l;
    } else {
      f["loader"] = nullptr;
    }
    json fs = json::array();
    for (const Finding& x : r.findings) {
      fs.push_back(finding_json(x));
      if (r.verdict == Verdict::kError && x.rule == Rule::kIo) path_errors.push_back(clean(r.path + ": " + x.message));
    }
    f["findings"] = fs;
    json ev = json::array();
    for (const Event& e : r.events) {
      ev.push_back({{"type", std::string(event_type_name(e.type))},
                    {"name", clean(e.name)},
                    {"allowed", e.allowed},
                    {"member", clean(e.member)},
                    {"stream", e.stream},
                    {"offset", e.offset},
                    {"opcode", e.opcode}});
    }
    f["events"] = ev;
    files.push_back(std::move(f));
  }
  root["files"] = files;
  Totals t = totals(reports, o);
  root["summary"] = {{"files", t.files},
                     {"clean", t.clean},
                     {"unsafe", t.unsafe},
                     {"incomplete", t.incomplete},
                     {"unscannable", t.unscannable},
                     {"not_model", t.not_model},
                     {"errors", t.errors},
                     {"findings", t.findings},
                     {"critical", t.by_severity[4]},
                     {"high", t.by_severity[3]},
                     {"medium", t.by_severity[2]},
                     {"low", t.by_severity[1]},
                     {"suppressed", t.suppressed},
                     {"skipped", t.skipped},
                     {"fail_on", std::string(severity_name(o.fail_on))},
                     {"exit_code", exit_code(reports, o)}};
  root["path_errors"] = path_errors;
  json sk = json::array();
  for (const PathProblem& s : o.skipped) sk.push_back({{"path", clean(s.path)}, {"reason", clean(s.reason)}});
  root["skipped"] = sk;
  return root.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);  // names from the file may not be UTF-8
}

std::string to_sarif(const std::vector<FileReport>& reports, const ReportOptions& o) {
  std::string help_uri = o.rules_uri;
  if (help_uri.empty() && (o.information_uri.rfind("https://", 0) == 0 || o.information_uri.rfind("http://", 0) == 0))
    help_uri = o.information_uri + "/blob/main/scanner/README.md#rules";
  json rules_j = json::array();
  for (const RuleInfo& ri : rules()) {
    json rj = {{"id", std::string(ri.id)},
               {"name", std::string(ri.name)},
               {"shortDescription", {{"text", std::string(ri.description)}}},
               {"fullDescription", {{"text", std::string(ri.description)}}},
               {"help",
                {{"text", std::string(ri.description) +
                              ". safeckpt scan reports every import and call of a checkpoint without running "
                              "it; only an exact allowlist decides what is safe."}}},
               {"defaultConfiguration", {{"level", sarif_level(ri.default_severity)}}},
               {"properties",
                {{"tags", json::array({"security", "pickle", "model"})},
                 {"precision", "very-high"},
                 {"security-severity", security_severity(ri.default_severity)}}}};
    if (!help_uri.empty()) rj["helpUri"] = help_uri;
    rules_j.push_back(std::move(rj));
  }
  json results = json::array();
  json artifacts = json::array();
  json notifications = json::array();
  for (std::size_t fi = 0; fi < reports.size(); ++fi) {
    const FileReport& r = reports[fi];
    json art = artifact_location(clean(r.path), o);
    json art_indexed = art;
    art_indexed["index"] = fi;
    artifacts.push_back({{"location", art}, {"length", r.size}});
    for (const Finding& f : r.findings) {
      if (r.verdict == Verdict::kError && f.rule == Rule::kIo) {
        notifications.push_back(
            {{"level", "error"},
             {"message", {{"text", clean(r.path) + " was not scanned: " + clean(f.message)}}},
             {"descriptor", {{"id", std::string(rule_info(f.rule).id)}}},
             {"locations", json::array({{{"physicalLocation", {{"artifactLocation", art_indexed}}}}})}});
      }
      if (is_signature_summary(r, f))
        notifications.push_back(
            {{"level", "note"},
             {"message", {{"text", clean(r.path) + ": " + clean(f.message)}}},
             {"descriptor", {{"id", std::string(rule_info(f.rule).id)}}},
             {"locations", json::array({{{"physicalLocation", {{"artifactLocation", art_indexed}}}}})}});
      if (f.severity == Severity::kInfo) continue;
      const RuleInfo& ri = rule_info(f.rule);
      std::size_t rule_index = 0;
      for (std::size_t k = 0; k < rules().size(); ++k)
        if (rules()[k].rule == f.rule) rule_index = k;
      std::string w = where(f);
      std::string text = clean(f.message) + (w.empty() ? std::string() : " (at " + clean(w) + ")") +
                         (f.why.empty() ? std::string() : ". " + clean(f.why));
      json loc = {{"physicalLocation",
                   {{"artifactLocation", art_indexed},
                    // Checkpoints are binary: GitHub needs a startLine, the
                    // byte offset is in the message and properties.
                    {"region", {{"startLine", 1}}}}}};
      json props = {{"severity", std::string(severity_name(f.severity))},
                    {"security-severity", security_severity(f.severity)},
                    {"verdict", std::string(verdict_name(r.verdict))},
                    {"member", clean(f.member)}};
      if (f.offset != kNoOffset) props["offset"] = f.offset;
      if (f.stream >= 0) props["stream"] = f.stream;
      if (!f.opcode.empty()) props["opcode"] = f.opcode;
      if (!f.global.empty()) props["global"] = clean(f.global);
      if (!f.category.empty()) props["category"] = f.category;
      json res = {{"ruleId", std::string(ri.id)},
                  {"ruleIndex", rule_index},
                  {"level", sarif_level(f.severity)},
                  {"message", {{"text", text}}},
                  {"locations", json::array({loc})},
                  {"partialFingerprints", {{"safeckptFinding/v1", fingerprint(r.path, f)}}},
                  {"properties", props}};
      if (f.suppressed)
        res["suppressions"] = json::array(
            {{{"kind", "external"}, {"status", "accepted"}, {"justification", "ignore file " + clean(f.suppression)}}});
      results.push_back(std::move(res));
    }
  }
  for (const PathProblem& s : o.skipped) {
    json art = artifact_location(clean(s.path), o);
    notifications.push_back({{"level", "note"},
                             {"message", {{"text", clean(s.path) + " was skipped: " + clean(s.reason)}}},
                             {"locations", json::array({{{"physicalLocation", {{"artifactLocation", art}}}}})}});
  }
  const int rc = exit_code(reports, o);
  bool any_error = false;
  for (const FileReport& r : reports) any_error = any_error || r.verdict == Verdict::kError;
  json driver = {{"name", "safeckpt-scan"}, {"rules", rules_j}};
  if (!o.tool_version.empty()) {
    driver["version"] = o.tool_version;
    driver["semanticVersion"] = o.tool_version;
  }
  if (!o.information_uri.empty()) driver["informationUri"] = o.information_uri;
  json invocation = {{"executionSuccessful", !any_error && !reports.empty()},
                     {"exitCode", rc},
                     {"toolExecutionNotifications", notifications}};
  json run = {{"tool", {{"driver", driver}}},
              {"invocations", json::array({invocation})},
              {"artifacts", artifacts},
              {"results", results},
              {"columnKind", "utf16CodeUnits"}};
  if (!o.base_dir.empty()) {
    std::string b = std::filesystem::path(o.base_dir).lexically_normal().generic_string();
    if (b.empty() || b.back() != '/') b += '/';
    run["originalUriBaseIds"] = {{"%SRCROOT%", {{"uri", "file://" + uri_escape(b)}}}};
  }
  json root = {
      {"$schema", "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"},
      {"version", "2.1.0"},
      {"runs", json::array({run})}};
  return root.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);  // names from the file may not be UTF-8
}

}  // namespace safeckpt::scan
