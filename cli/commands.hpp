// Subcommands of the `safeckpt` tool. Each registers itself on the CLI11 app
// and stores its process exit code in `exit_code` when it runs.
#pragma once

#include <CLI/CLI.hpp>

#include "safeckpt/error.hpp"

namespace safeckpt::cli {

// Help text of every subcommand's --allow (resolution: cli/allow_arg.hpp).
inline constexpr const char* kAllowHelp =
    "add safe globals (repeatable): an allowlist file, a bundled allowlist name (numpy, argparse, "
    "python_values) or one global name (mypkg.MyClass)";

// How a failed open/load is worded: a file that cannot be read (kIo) is
// "cannot open"; anything else the loader refused is "refused".
inline const char* failure_word(ErrorCode c) {
  return c == ErrorCode::kIo ? "cannot open" : "refused";
}

void register_inspect(CLI::App& app, int& exit_code);
void register_scan(CLI::App& app, int& exit_code);
void register_convert(CLI::App& app, int& exit_code);
void register_bench(CLI::App& app, int& exit_code);

}  // namespace safeckpt::cli
