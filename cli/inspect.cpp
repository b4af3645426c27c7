// `safeckpt inspect FILE`: load with the weights-only rules and describe.
// Exit codes: 0 loaded, 1 refused by policy, 2 malformed/unreadable/usage
// (or an output cap refused a hostile shared graph: --format json).
// The views are the library's renderers (safeckpt/json.hpp: to_text,
// to_json), so the fuzzers run exactly what users see; --format json is
// documented in docs/inspect-json.md.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "allow_arg.hpp"
#include "commands.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/dcp.hpp"
#include "safeckpt/detect.hpp"
#include "safeckpt/json.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/safetensors_reader.hpp"

namespace safeckpt::cli {
namespace {

// --format json when nothing can be described: one JSON object on stdout
// instead of the tree (docs/inspect-json.md, "Errors"), so a consumer that
// parses stdout always gets a document; stderr and the exit code are as for
// text.
void print_json_error(const std::string& file, const Error& e) {
  nlohmann::ordered_json err;
  err["code"] = std::string(error_code_name(e.code()));
  err["code_number"] = static_cast<int>(e.code());
  err["message"] = e.message();
  err["file"] = file;
  if (!e.where().record.empty()) err["record"] = e.where().record;
  if (e.where().offset != Location::kNoOffset) err["offset"] = e.where().offset;
  if (!e.where().opcode.empty()) err["opcode"] = e.where().opcode;
  nlohmann::ordered_json doc;
  doc["$schema_version"] = kInspectJsonSchemaVersion;
  doc["error"] = std::move(err);
  // Names and messages may quote bytes from the file that are not UTF-8.
  const std::string text = doc.dump(1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
}

struct InspectArgs {
  std::string file;
  std::vector<std::string> allow_files;
  std::string format = "text";  // text | json (--json is an alias of --format json)
  bool no_hashes = false;
  bool no_verify_data = false;
  std::uint64_t max_memory_mib = 0;
};

int run_inspect(const InspectArgs& a) {
  Allowlist allow = Allowlist::default_policy();
  if (auto st = add_allow_args(allow, a.allow_files); !st) {
    std::fprintf(stderr, "safeckpt: %s\n", st.error().to_string().c_str());
    return 2;
  }
  LoadOptions opt;
  opt.allowlist = &allow;
  opt.verify_storage_crc = !a.no_verify_data;
  apply_max_memory(a.max_memory_mib, opt.limits);
  if (is_dcp_directory(a.file)) return inspect_dcp(a.file, a.format == "json");
  // Every format by content, one open (safeckpt/open.hpp); a PT2 program is
  // described by the engine's reader over the same mapping.
  auto mf = MappedFile::open(a.file);
  if (!mf) {
    std::fprintf(stderr, "safeckpt: %s: %s\n  %s\n", a.file.c_str(), failure_word(mf.error().code()),
                 mf.error().to_string().c_str());
    if (a.format == "json") print_json_error(a.file, mf.error());
    return 2;
  }
  if (detect_format(mf->bytes(), opt.limits) == FileFormat::kPt2Archive)
    return inspect_pt2(a.file, mf->bytes(), a.format == "json");
  auto r = safeckpt::open_file(std::move(*mf), opt);
  if (!r) {
    const Error& e = r.error();
    std::fprintf(stderr, "safeckpt: %s: %s\n  %s\n", a.file.c_str(), failure_word(e.code()), e.to_string().c_str());
    if (e.code() == ErrorCode::kLimitExceeded) std::fputs(kLimitHint, stderr);
    if (a.format == "json") print_json_error(a.file, e);
    return is_policy_error(e.code()) ? 1 : 2;
  }
  const Checkpoint& c = *r;
  if (a.format == "json") {
    JsonOptions jo;
    jo.hashes = !a.no_hashes;
    jo.schema_version = true;
    jo.max_output_nodes = opt.limits.max_output_nodes;
    auto j = to_json(c, jo);
    if (!j) {
      std::fprintf(stderr, "safeckpt: %s: %s\n", a.file.c_str(), j.error().to_string().c_str());
      print_json_error(a.file, j.error());
      return 2;
    }
    std::fwrite(j->data(), 1, j->size(), stdout);
    return 0;
  }
  TextOptions to;
  to.title = a.file;
  auto t = to_text(c, to);
  if (!t) {
    std::fprintf(stderr, "safeckpt: %s: %s\n", a.file.c_str(), t.error().to_string().c_str());
    return 2;
  }
  std::fwrite(t->data(), 1, t->size(), stdout);
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Load a checkpoint with the weights-only rules and describe it");
  cmd->add_option("file", args->file,
                  "checkpoint file (.pt, .pth, .bin, legacy, bare pickle, .safetensors, .safetensors.index.json)")
      ->required();
  cmd->add_option("--allow", args->allow_files, kAllowHelp)->allow_extra_args(false);
  cmd->add_option("--format", args->format, "output: text (tables and values) or json (docs/inspect-json.md)")
      ->check(CLI::IsMember({"text", "json"}));
  cmd->add_flag_callback(
      "--json", [args] { args->format = "json"; }, "same as --format json");
  cmd->add_flag("--no-hashes", args->no_hashes, "JSON without sha256 fields (does not read tensor bytes)");
  add_max_memory_option(cmd, args->max_memory_mib);
  cmd->add_flag("--no-verify-data", args->no_verify_data, "skip CRC-32 checks of storage records");
  cmd->callback([args, &exit_code] { exit_code = run_inspect(*args); });
}

}  // namespace safeckpt::cli
