// The 'convert' subcommand is registered here once its issue lands.
#include "commands.hpp"

namespace safeckpt::cli {
void register_convert(CLI::App&, int&) {}
}  // namespace safeckpt::cli
