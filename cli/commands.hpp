// Subcommands of the `safeckpt` tool. Each registers itself on the CLI11 app
// and stores its process exit code in `exit_code` when it runs.
#pragma once

#include <CLI/CLI.hpp>

namespace safeckpt::cli {

void register_inspect(CLI::App& app, int& exit_code);
void register_scan(CLI::App& app, int& exit_code);
void register_convert(CLI::App& app, int& exit_code);
void register_bench(CLI::App& app, int& exit_code);
// `run` and `inspect-program` (cli/run.cpp): torch.export programs.
void register_run(CLI::App& app, int& exit_code);

}  // namespace safeckpt::cli
