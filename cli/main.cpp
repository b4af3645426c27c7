// safeckpt — inspect, audit, convert and benchmark PyTorch checkpoints
// without running them.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "safeckpt/version.hpp"

namespace {

// Levenshtein distance (two rows; command names are short).
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// When the first argument is not an option and not a subcommand, says so
// with the nearest command (at most 2 edits away, or a prefix of one) and
// returns true.
bool unknown_command(CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return false;
  const std::string_view given = argv[1];
  std::string best, names;
  std::size_t best_d = 3;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    const std::string& n = sub->get_name();
    if (n == given) return false;
    names += (names.empty() ? "" : ", ") + n;
    std::size_t d = n.rfind(given, 0) == 0 ? 1 : edit_distance(given, n);
    if (d < best_d) {
      best_d = d;
      best = n;
    }
  }
  if (best.empty())
    std::fprintf(stderr, "safeckpt: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
  else
    std::fprintf(stderr, "safeckpt: unknown command '%s' (did you mean %s?)\n", argv[1], best.c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"safeckpt: open PyTorch checkpoints without running them"};
  app.set_version_flag("--version", std::string("safeckpt ") + SAFECKPT_VERSION_STRING);
  app.require_subcommand(1);
  int exit_code = 0;
  safeckpt::cli::register_inspect(app, exit_code);
  safeckpt::cli::register_scan(app, exit_code);
  safeckpt::cli::register_convert(app, exit_code);
  safeckpt::cli::register_bench(app, exit_code);
  safeckpt::cli::register_run(app, exit_code);  // cli/run.cpp (engine)
  safeckpt::cli::register_bench_engine(app, exit_code);
  safeckpt::cli::register_sign(app, exit_code);  // cli/sign.cpp (OMS sign / verify)
  safeckpt::cli::register_verify(app, exit_code);
  if (unknown_command(app, argc, argv)) return 2;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // usage errors exit 2
  }
  return exit_code;
}
