// PT2 archives (torch.export.save / AOTInductor packages). What decides is the
// engine itself (safeckpt/graph.hpp), so that "clean" means exactly "the
// engine would accept this program":
//  1. every code record (graph::is_code_record: data/aotinductor/, .so, .cubin,
//     .ptx, .cpp, .o, ...) is an SCK130 finding, severity critical (AOTInductor
//     dlopens / compiles them); the engine refuses such archives, so nothing
//     else is decided;
//  2. otherwise graph::Pt2Archive::open (zip anomalies, archive_format, JSON
//     grammar and caps, configs, views inside their records, use_pickle
//     payloads through the restricted loader): an error is SCK160 malformed /
//     SCK161 limit / SCK162 unsupported, or SCK133 for a policy refusal (a
//     pickled weight importing outside the allowlist; the pickle itself is
//     scanned like any other member and its imports are their own findings);
//  3. every model's program through graph::refusals() (the validator
//     validate() runs, shape pass included): op refusals SCK131, mutations
//     SCK132, other engine restrictions SCK133, broken structure or a
//     tensor_meta the shape pass cannot reproduce SCK160;
//  4. the records the archive's configs declare as raw tensor bytes
//     (use_pickle: false) are returned in `raw`: the zip scan does not sniff
//     them as pickles. Every other record (sample inputs, use_pickle weights,
//     unknown records) is scanned by content like any zip member.
// FileReport::loader holds the engine's verdict for a PT2 file (ran = true).
#include <nlohmann/json.hpp>

#include "safeckpt/graph.hpp"
#include "scanner.hpp"

namespace safeckpt::scan {

void Scanner::scan_pt2(Bytes data, const ZipArchive& zip, const std::string& member, std::set<std::string>& raw) {
  const std::string prefix = member.empty() ? std::string() : member + "!";
  FileReport& rep = sink_.report();
  const bool top = member.empty();
  auto verdict = [&](const Error* e) {
    if (!top) return;
    rep.loader.ran = true;
    rep.loader.ok = e == nullptr;
    if (e == nullptr) return;
    rep.loader.code = e->code();
    rep.loader.message = e->message();
    rep.loader.record = e->where().record;
  };
  const std::string root = zip.root().empty() ? std::string() : zip.root() + "/";
  std::uint64_t code = 0;
  std::string first_code;
  for (const ZipEntry& e : zip.entries()) {
    std::string_view rel = e.name;
    if (!root.empty() && rel.starts_with(root)) rel.remove_prefix(root.size());
    if (!graph::is_code_record(rel)) continue;
    if (code++ == 0) first_code = e.name;
    if (code > 100) continue;
    const auto dot = rel.rfind('.');
    add(Rule::kExecutableCode, Severity::kCritical, prefix + e.name,
        "PT2 archive record is executable code" + (dot == std::string_view::npos
                                                       ? std::string(" (under data/aotinductor/)")
                                                       : " (" + std::string(rel.substr(dot)) + ")"),
        "AOTInductor packages hold compiled shared libraries, GPU kernels and their sources: "
        "torch._inductor.aoti_load_package / torch.export.load load and run them. The engine refuses the archive; "
        "load it only from a trusted source",
        e.local_header_offset);
  }
  if (code > 100)
    add(Rule::kExecutableCode, Severity::kCritical, prefix + root,
        std::to_string(code - 100) + " more code records not listed", "see the findings above");
  if (code > 0) {
    // The verdict is the engine's own (FileReport::loader): its reader refuses
    // every archive with a code record, but it may stop earlier (a zip
    // anomaly, a malformed layout) with another error; that one is reported.
    graph::GraphLimits gl;
    gl.container = opt_.limits;
    auto engine = graph::Pt2Archive::open(data, gl);
    if (!engine) {
      verdict(&engine.error());
    } else {  // not reached while the reader refuses code records; fail closed if it ever stops doing so
      Error e(ErrorCode::kUnsupported, "record '" + first_code + "' is compiled or source code", Location{first_code});
      verdict(&e);
    }
    return;
  }
  // Raw tensor records named by the configs (use_pickle: false), read here
  // too so that they are never sniffed as pickles even when the engine
  // refuses the archive below; a config that does not parse names none
  // (then every record is sniffed: fail closed). A record that any entry
  // names with use_pickle: true is never raw, whatever other entries say:
  // PyTorch torch.load()s it (weights_only=False) for that entry, so a decoy
  // raw entry on the same record must not hide its pickle (review,
  // 2026-12-06).
  std::set<std::string> pickled;
  for (const ZipEntry& e : zip.entries()) {
    std::string_view rel = e.name;
    if (!root.empty() && rel.starts_with(root)) rel.remove_prefix(root.size());
    const bool weights = rel.starts_with("data/weights/"), constants = rel.starts_with("data/constants/");
    if ((!weights && !constants) || !rel.ends_with("_config.json") ||
        e.uncompressed_size > opt_.limits.max_pickle_record_bytes)
      continue;
    auto rb = zip.read(e, true);
    if (!rb) continue;
    auto cfg = nlohmann::json::parse(rb->bytes.begin(), rb->bytes.end(), nullptr, false);
    if (!cfg.is_object() || !cfg.contains("config") || !cfg["config"].is_object()) continue;
    for (const auto& [fqn, entry] : cfg["config"].items()) {
      (void)fqn;
      if (!entry.is_object() || !entry.contains("path_name") || !entry["path_name"].is_string()) continue;
      const std::string rec =
          root + (weights ? "data/weights/" : "data/constants/") + entry["path_name"].get<std::string>();
      // Anything but an explicit false may be read as a pickle: never raw.
      if (!entry.contains("use_pickle") || !entry["use_pickle"].is_boolean() || entry["use_pickle"].get<bool>()) {
        pickled.insert(rec);
        continue;
      }
      raw.insert(rec);
    }
  }
  for (const auto& rec : pickled) raw.erase(rec);
  graph::GraphLimits gl;
  gl.container = opt_.limits;
  auto opened = graph::Pt2Archive::open(data, gl);
  if (!opened) {
    const Error& e = opened.error();
    verdict(&e);
    Finding f;
    f.rule = is_policy_error(e.code()) ? Rule::kPt2Refused : rule_for_error(e.code());
    f.severity = f.rule == Rule::kUnsupported ? Severity::kMedium : Severity::kHigh;
    const std::string& rec = e.where().record;
    f.member = rec.empty() ? member : prefix + (rec.starts_with(root) ? rec : root + rec);
    f.message = "the engine refuses this PT2 archive: " + std::string(error_code_name(e.code())) + ": " + e.message();
    f.why = is_policy_error(e.code())
                ? "a pickled weight or constant (use_pickle: true) needs globals outside the allowlist; its imports "
                  "are listed as their own findings"
                : "safeckpt run / inspect-program would stop here; the programs were not validated";
    sink_.add(std::move(f));
    return;
  }
  const graph::Pt2Archive& a = *opened;
  raw.clear();  // the engine's own reading of the configs replaces the one above
  bool accepted = true;
  bool first_malformed = false;
  std::string first_reason;
  for (const std::string& name : a.models()) {
    const std::string json_member = prefix + root + "models/" + name + ".json";
    if (auto w = a.weights(name); w) {
      for (const graph::ArchiveTensor& t : **w)
        if (!t.pickled && pickled.count(t.record) == 0) raw.insert(t.record);
    }
    auto prog = a.program(name);
    if (!prog) continue;
    graph::Program p = **prog;  // validation binds arguments in place: work on a copy
    for (graph::Refusal& r : graph::refusals(p, gl)) {
      accepted = false;
      if (first_reason.empty()) {
        first_reason = "model '" + name + "': " + r.message;
        first_malformed = r.kind == graph::Refusal::Kind::kMalformed;
      }
      Rule rule = Rule::kPt2Refused;
      std::string why =
          "the engine refuses the program before running anything (safeckpt run / inspect-program give the "
          "same reason)";
      switch (r.kind) {
        case graph::Refusal::Kind::kOpNotAllowed:
        case graph::Refusal::Kind::kHigherOrder:
        case graph::Refusal::Kind::kCustomOp:
          rule = Rule::kPt2Op;
          why =
              "the engine runs only the ATen ops of allowlist/ops.schema; custom and higher-order ops run code "
              "registered outside the archive (or, for triton kernels, kernel source carried in it)";
          break;
        case graph::Refusal::Kind::kMutation: rule = Rule::kPt2Mutation; break;
        case graph::Refusal::Kind::kPolicy: rule = Rule::kPt2Refused; break;
        case graph::Refusal::Kind::kMalformed: rule = Rule::kMalformed; break;
      }
      Finding f;
      f.rule = rule;
      f.severity = Severity::kHigh;
      f.member = json_member;
      f.global = r.target;
      f.message = "model '" + name + "': " + r.message;
      f.why = std::move(why);
      sink_.add(std::move(f));
    }
    if (!accepted) continue;
    // The archive's weights against the program's parameters, as `run`
    // binds them before anything runs.
    auto wm = graph::archive_weights(a, name);
    Status bound = wm ? graph::check_weights(p, *wm, gl) : Status(unexpected(wm.error()));
    if (!bound) {
      accepted = false;
      first_reason = "model '" + name + "': " + bound.error().message();
      first_malformed = true;
      Finding f;
      f.rule = Rule::kMalformed;
      f.severity = Severity::kHigh;
      f.member = json_member;
      f.message = "model '" + name + "': the archive's weights do not bind: " + bound.error().message();
      f.why = "safeckpt run binds these weights before anything runs and refuses them";
      sink_.add(std::move(f));
    }
  }
  if (accepted) {
    verdict(nullptr);
  } else {
    Error e(first_malformed ? ErrorCode::kMalformed : ErrorCode::kDisallowedOperation, first_reason);
    verdict(&e);
  }
}

}  // namespace safeckpt::scan
