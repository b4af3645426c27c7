// Reports: human text, JSON (schema: scanner/README.md), SARIF 2.1.0.
#include <fmt/format.h>

#include <cstdio>
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

// RFC 3986 relative reference for a path (GitHub resolves it against the
// repository root); absolute paths become file:// URIs.
std::string path_uri(const std::string& path) {
  std::string out;
  bool abs = !path.empty() && path[0] == '/';
  std::string p = path;
  while (p.rfind("./", 0) == 0) p.erase(0, 2);
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
  return abs ? "file://" + out : out;
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
  return fmt::format("{:016x}", h);
}

}  // namespace

Totals totals(const std::vector<FileReport>& reports) {
  Totals t;
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
      if (f.severity == Severity::kInfo) continue;
      ++t.findings;
      ++t.by_severity[static_cast<int>(f.severity)];
    }
  }
  return t;
}

int exit_code(const std::vector<FileReport>& reports) {
  int rc = 0;
  for (const FileReport& r : reports) {
    if (r.verdict == Verdict::kError) return 2;
    if (r.verdict != Verdict::kClean && r.verdict != Verdict::kNotModel) rc = 1;
  }
  return rc;
}

void write_text(std::ostream& out, const std::vector<FileReport>& reports, bool verbose) {
  for (const FileReport& r : reports) {
    std::string v(verdict_name(r.verdict));
    for (auto& c : v) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    out << fmt::format("{}: {} [{}, {} bytes", clean(r.path), v, r.format, r.size);
    if (r.pickle_streams)
      out << fmt::format(", {} pickle stream{}", r.pickle_streams, r.pickle_streams == 1 ? "" : "s");
    if (r.members) out << fmt::format(", {} member{}", r.members, r.members == 1 ? "" : "s");
    out << "]";
    if (!r.complete) out << " (scan incomplete)";
    out << "\n";
    if (r.loader.ran) {
      if (r.loader.ok) {
        out << "  loader: accepts\n";
      } else {
        out << fmt::format("  loader: refuses ({}: {})\n", error_code_name(r.loader.code),
                           one_line(clean(r.loader.message)));
      }
    }
    for (const Finding& f : r.findings) {
      if (f.severity == Severity::kInfo && !verbose) continue;
      const RuleInfo& ri = rule_info(f.rule);
      std::string w = where(f);
      out << fmt::format("  [{}] {} {}{}: {}\n", severity_name(f.severity), ri.id, ri.name,
                         w.empty() ? std::string() : " at " + one_line(clean(w)), one_line(clean(f.message)));
      if (!f.why.empty()) out << "      why: " << one_line(clean(f.why)) << "\n";
    }
    if (verbose) {
      for (const Event& e : r.events) {
        out << fmt::format("  {} {} {}{} @{} {} ({})\n", event_type_name(e.type), clean(e.name),
                           e.member.empty() ? std::string() : clean(e.member) + " ",
                           "stream " + std::to_string(e.stream), e.offset, e.opcode,
                           e.allowed ? "allowed" : "NOT allowed");
      }
    }
  }
  Totals t = totals(reports);
  out << fmt::format(
      "\n{} file{} scanned: {} clean, {} unsafe, {} incomplete, {} unscannable, {} not a model, {} unreadable; "
      "{} finding{} ({} critical, {} high, {} medium, {} low)\n",
      t.files, t.files == 1 ? "" : "s", t.clean, t.unsafe, t.incomplete, t.unscannable, t.not_model, t.errors,
      t.findings, t.findings == 1 ? "" : "s", t.by_severity[4], t.by_severity[3], t.by_severity[2], t.by_severity[1]);
}

std::string to_json(const std::vector<FileReport>& reports, const std::vector<std::string>& walk_errors) {
  json root;
  root["schema"] = "safeckpt-scan";
  root["schema_version"] = kJsonSchemaVersion;
  root["tool"] = {{"name", "safeckpt"}, {"component", "scan"}, {"version", SAFECKPT_SCANNER_VERSION}};
  json files = json::array();
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
    for (const Finding& x : r.findings) fs.push_back(finding_json(x));
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
  Totals t = totals(reports);
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
                     {"exit_code", exit_code(reports)}};
  json we = json::array();
  for (const auto& e : walk_errors) we.push_back(clean(e));
  root["path_errors"] = we;
  return root.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);  // names from the file may not be UTF-8
}

std::string to_sarif(const std::vector<FileReport>& reports) {
  json rules_j = json::array();
  for (const RuleInfo& ri : rules()) {
    rules_j.push_back({{"id", std::string(ri.id)},
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
                         {"security-severity", security_severity(ri.default_severity)}}}});
  }
  json results = json::array();
  json artifacts = json::array();
  for (std::size_t fi = 0; fi < reports.size(); ++fi) {
    const FileReport& r = reports[fi];
    std::string uri = path_uri(r.path);
    artifacts.push_back({{"location", {{"uri", uri}}}, {"length", r.size}});
    for (const Finding& f : r.findings) {
      if (f.severity == Severity::kInfo) continue;
      const RuleInfo& ri = rule_info(f.rule);
      std::size_t rule_index = 0;
      for (std::size_t k = 0; k < rules().size(); ++k)
        if (rules()[k].rule == f.rule) rule_index = k;
      std::string w = where(f);
      std::string text = clean(f.message) + (w.empty() ? std::string() : " (at " + clean(w) + ")") +
                         (f.why.empty() ? std::string() : ". " + clean(f.why));
      json loc = {{"physicalLocation",
                   {{"artifactLocation", {{"uri", uri}, {"index", fi}}},
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
      results.push_back({{"ruleId", std::string(ri.id)},
                         {"ruleIndex", rule_index},
                         {"level", sarif_level(f.severity)},
                         {"message", {{"text", text}}},
                         {"locations", json::array({loc})},
                         {"partialFingerprints", {{"safeckptFinding/v1", fingerprint(r.path, f)}}},
                         {"properties", props}});
    }
  }
  json run = {{"tool",
               {{"driver",
                 {{"name", "safeckpt-scan"},
                  {"semanticVersion", SAFECKPT_SCANNER_VERSION},
                  {"version", SAFECKPT_SCANNER_VERSION},
                  {"informationUri", "https://github.com/safeckpt/safeckpt"},
                  {"rules", rules_j}}}}},
              {"artifacts", artifacts},
              {"results", results},
              {"columnKind", "utf16CodeUnits"}};
  json root = {
      {"$schema", "https://json.schemastore.org/sarif-2.1.0.json"}, {"version", "2.1.0"}, {"runs", json::array({run})}};
  return root.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);  // names from the file may not be UTF-8
}

}  // namespace safeckpt::scan
