// One meaning of `--allow ARG` for every subcommand (inspect, scan, convert).
//
// ARG is, in this order of precedence:
//   1. a file: ARG names an existing file, contains '/', or ends in ".allow"
//      and is found as given -> Allowlist::add_file(ARG);
//   2. a bundled allowlist: ARG or ARG + ".allow" is a file in one of
//      bundled_allowlist_dirs() ("numpy", "numpy.allow", "argparse",
//      "python_values") -> that file;
//   3. a global name: ARG contains a '.' and no '/' ("mypkg.MyClass",
//      module.qualname as in torch.serialization.add_safe_globals)
//      -> Allowlist::add(ARG).
// A path with '/' that does not exist is "cannot open" (kIo), never a name.
//
// Errors: kIo (a file that cannot be read: "cannot open ..."),
// kInvalidArgument (bad allowlist syntax, a name that is neither a bundled
// allowlist nor a valid global; the message lists the bundled names).
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/error.hpp"

namespace safeckpt::cli {

// Where bundled *.allow files are looked for, in order:
//   1. $SAFECKPT_ALLOWLIST_DIR when set;
//   2. <dir of the running executable>/../share/safeckpt/allowlist (installed
//      layout: <prefix>/bin/safeckpt, <prefix>/share/safeckpt/allowlist);
//   3. the source tree's allowlist/ (SAFECKPT_SOURCE_ALLOWLIST_DIR, compiled
//      in), only for the binary in its build tree (SAFECKPT_BUILD_CLI_DIR):
//      an installed copy never reads the tree it was built from.
// Directories that do not exist are left out.
std::vector<std::filesystem::path> bundled_allowlist_dirs();

// The directory of the running executable (/proc/self/exe), or empty.
std::filesystem::path executable_dir();
// Whether this is the binary in its build tree (SAFECKPT_BUILD_CLI_DIR): only
// then may the tool read files of the source tree it was built from.
bool running_from_build_tree();

// Adds what ARG names (see above) to `allow`.
Status add_allow_arg(Allowlist& allow, std::string_view arg);

// Adds every ARG in order; stops at the first error.
Status add_allow_args(Allowlist& allow, const std::vector<std::string>& args);

}  // namespace safeckpt::cli
