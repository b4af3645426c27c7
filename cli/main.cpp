// safeckpt — inspect, audit, convert and benchmark PyTorch checkpoints
// without running them.
#include <cstdio>

#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"safeckpt: open PyTorch checkpoints without running them"};
  app.require_subcommand(1);
  int exit_code = 0;
  safeckpt::cli::register_inspect(app, exit_code);
  safeckpt::cli::register_scan(app, exit_code);
  safeckpt::cli::register_convert(app, exit_code);
  safeckpt::cli::register_bench(app, exit_code);
  safeckpt::cli::register_run(app, exit_code);  // cli/run.cpp (engine)
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;  // usage errors exit 2
  }
  return exit_code;
}
