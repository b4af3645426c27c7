// `safeckpt inspect FILE`: load with the weights-only rules and describe.
// Exit codes: 0 loaded, 1 refused by policy, 2 malformed/unreadable/usage.
#include <fmt/format.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "allow_arg.hpp"
#include "commands.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/json.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/safetensors.hpp"

namespace safeckpt::cli {
namespace {

struct InspectArgs {
  std::string file;
  std::vector<std::string> allow_files;
  bool json = false;
  bool no_hashes = false;
  bool no_verify_data = false;
};

std::string shape_text(const std::vector<std::int64_t>& s) {
  std::string out = "[";
  for (std::size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string human_bytes(std::uint64_t b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} B", b) : fmt::format("{:.1f} {}", v, units[u]);
}

int run_inspect(const InspectArgs& a) {
  Allowlist allow = Allowlist::default_policy();
  if (auto st = add_allow_args(allow, a.allow_files); !st) {
    std::fprintf(stderr, "safeckpt: %s\n", st.error().to_string().c_str());
    return 2;
  }
  LoadOptions opt;
  opt.allowlist = &allow;
  opt.verify_storage_crc = !a.no_verify_data;
  // Every format by content, one open (safeckpt/open.hpp).
  auto r = safeckpt::open(a.file, opt);
  if (!r) {
    const Error& e = r.error();
    std::fprintf(stderr, "safeckpt: %s: %s\n  %s\n", a.file.c_str(), failure_word(e.code()), e.to_string().c_str());
    return is_policy_error(e.code()) ? 1 : 2;
  }
  const Checkpoint& c = *r;
  if (a.json) {
    JsonOptions jo;
    jo.hashes = !a.no_hashes;
    auto j = to_json(c, jo);
    if (!j) {
      std::fprintf(stderr, "safeckpt: %s\n", j.error().to_string().c_str());
      return 2;
    }
    std::fwrite(j->data(), 1, j->size(), stdout);
    return 0;
  }
  // Table: one row per named tensor, then totals.
  auto named = c.state_dict();
  std::map<std::uint32_t, int> storage_users;
  for (const auto& t : c.tensors())
    if (t.storage != kNoStorage) storage_users[t.storage]++;
  std::size_t w = 4;
  for (const auto& n : named) w = std::max(w, n.name.size());
  w = std::min<std::size_t>(w, 60);
  fmt::print("{}: {} ({} tensors, {} storages)\n", a.file, file_format_name(c.format()), c.tensors().size(),
             c.storages().size());
  fmt::print("{:<{}}  {:<14} {:<22} {:>10}  {}\n", "name", w, "dtype", "shape", "bytes", "storage");
  std::uint64_t tensor_bytes = 0;
  for (const auto& n : named) {
    const TensorInfo& t = c.tensors()[n.tensor];
    std::uint64_t bytes = t.numel() * dtype_size(t.dtype);
    tensor_bytes += bytes;
    std::string st = "-";
    if (t.storage != kNoStorage) {
      st = c.storages()[t.storage].key;
      if (storage_users[t.storage] > 1) st += " (shared)";
    } else if (t.layout != Layout::kStrided) {
      st = std::string(layout_name(t.layout));
    }
    fmt::print("{:<{}}  {:<14} {:<22} {:>10}  {}\n", n.name.empty() ? "<root>" : n.name, w,
               std::string(dtype_name(t.dtype)) + (t.is_parameter ? "*" : ""), shape_text(t.shape), bytes, st);
  }
  std::uint64_t storage_bytes = 0;
  for (const auto& s : c.storages()) storage_bytes += s.nbytes;
  fmt::print("total: {} named tensors, {} of tensor data, {} in {} storages ({} = nn.Parameter)\n", named.size(),
             human_bytes(tensor_bytes), human_bytes(storage_bytes), c.storages().size(), "*");
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<InspectArgs>();
  CLI::App* cmd = app.add_subcommand("inspect", "Load a checkpoint with the weights-only rules and describe it");
  cmd->add_option("file", args->file,
                  "checkpoint file (.pt, .pth, .bin, legacy, bare pickle, .safetensors, .safetensors.index.json)")
      ->required();
  cmd->add_option("--allow", args->allow_files, kAllowHelp)->expected(1)->allow_extra_args(false);
  cmd->add_flag("--json", args->json, "print the value tree as JSON (tests/data/corpus/README.md schema)");
  cmd->add_flag("--no-hashes", args->no_hashes, "JSON without sha256 fields (does not read tensor bytes)");
  cmd->add_flag("--no-verify-data", args->no_verify_data, "skip CRC-32 checks of storage records");
  cmd->callback([args, &exit_code] { exit_code = run_inspect(*args); });
}

}  // namespace safeckpt::cli
