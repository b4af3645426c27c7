// The 'scan' subcommand is registered here once its issue lands.
#include "commands.hpp"

namespace safeckpt::cli {
void register_scan(CLI::App&, int&) {}
}  // namespace safeckpt::cli
