// --allow ARG resolution: rules in cli/allow_arg.hpp.
#include "allow_arg.hpp"

#include <unistd.h>

#include <cstdlib>
#include <set>
#include <string>
#include <system_error>

namespace safeckpt::cli {
namespace {

bool is_file(const std::filesystem::path& p) {
  std::error_code ec;
  return std::filesystem::is_regular_file(p, ec);
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string bundled_names() {
  // Sorted: directory order is the file system's.
  std::set<std::string> names;
  for (const auto& d : bundled_allowlist_dirs()) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(d, ec))
      if (e.path().extension() == ".allow" && e.path().stem() != "default") names.insert(e.path().stem().string());
  }
  std::string out;
  for (const auto& n : names) out += (out.empty() ? " " : ", ") + n;
  return out.empty() ? " (none found)" : out;
}

}  // namespace

std::filesystem::path executable_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::filesystem::path() : exe.parent_path();
}

bool running_from_build_tree() {
#if defined(SAFECKPT_BUILD_CLI_DIR)
  const std::filesystem::path exe_dir = executable_dir();
  std::error_code ec;
  return !exe_dir.empty() && std::filesystem::equivalent(exe_dir, SAFECKPT_BUILD_CLI_DIR, ec);
#else
  return false;
#endif
}

std::vector<std::filesystem::path> bundled_allowlist_dirs() {
  std::vector<std::filesystem::path> candidates;
  if (const char* env = std::getenv("SAFECKPT_ALLOWLIST_DIR"); env && *env) candidates.emplace_back(env);
  const std::filesystem::path exe_dir = executable_dir();
  if (!exe_dir.empty()) candidates.push_back(exe_dir / ".." / "share" / "safeckpt" / "allowlist");
#if defined(SAFECKPT_SOURCE_ALLOWLIST_DIR)
  // Only the binary in its build tree uses the sources (an installed copy
  // must not depend on where it was built).
  if (running_from_build_tree()) candidates.emplace_back(SAFECKPT_SOURCE_ALLOWLIST_DIR);
#endif
  std::vector<std::filesystem::path> out;
  for (auto& c : candidates) {
    std::error_code ec;
    if (std::filesystem::is_directory(c, ec)) out.push_back(c.lexically_normal());
  }
  return out;
}

Status add_allow_arg(Allowlist& allow, std::string_view arg) {
  const std::string a(arg);
  if (a.empty()) return make_error(ErrorCode::kInvalidArgument, "--allow: empty argument");
  // 1. A file: exists as given, or is spelled as a path.
  if (is_file(a) || a.find('/') != std::string::npos) return allow.add_file(a);
  // 2. A bundled allowlist by name.
  const std::string file = ends_with(a, ".allow") ? a : a + ".allow";
  for (const auto& d : bundled_allowlist_dirs())
    if (is_file(d / file)) return allow.add_file(d / file);
  if (ends_with(a, ".allow"))
    return make_error(ErrorCode::kIo, "cannot open " + a + ": no such file here nor a bundled allowlist (bundled:" +
                                          bundled_names() + ")");
  // 3. A global name.
  if (a.find('.') != std::string::npos) return allow.add(a, {}, "--allow");
  return make_error(ErrorCode::kInvalidArgument, "--allow " + a + ": not a file, a bundled allowlist (bundled:" +
                                                     bundled_names() + ") or a global name (module.qualname)");
}

Status add_allow_args(Allowlist& allow, const std::vector<std::string>& args) {
  for (const auto& a : args) {
    SAFECKPT_CHECK(add_allow_arg(allow, a));
  }
  return {};
}

}  // namespace safeckpt::cli
