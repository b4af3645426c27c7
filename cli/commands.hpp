// Subcommands of the `safeckpt` tool. Each registers itself on the CLI11 app
// and stores its process exit code in `exit_code` when it runs.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "safeckpt/error.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/sign.hpp"

namespace safeckpt::engine {
struct Profile;  // safeckpt/engine.hpp (only in builds with the CUDA engine)
}

namespace safeckpt::cli {

// The table of engine::CompiledProgram::profile (bench-engine --profile, run
// --profile; cli/bench_engine.cpp): every launch largest first, the sums per
// kind, the whole run and the CUDA-graph replay.
void print_engine_profile(std::FILE* f, const engine::Profile& p, std::uint64_t attention_workspace_bytes);

// Help text of every subcommand's --allow (resolution: cli/allow_arg.hpp).
inline constexpr const char* kAllowHelp =
    "add safe globals (repeatable): an allowlist file, a bundled allowlist name (numpy, argparse, "
    "python_values) or one global name (mypkg.MyClass)";

// How a failed open/load is worded: a file that cannot be read (kIo) is
// "cannot open"; anything else the loader refused is "refused".
inline const char* failure_word(ErrorCode c) {
  return c == ErrorCode::kIo ? "cannot open" : "refused";
}

// --max-memory MIB (inspect, scan, convert): Limits::max_memory_bytes, the
// budget one file's parse may allocate. The default refuses hostile bombs
// early; a real file that needs more (the refusal names max_memory_bytes,
// e.g. an optimizer state_dict of several hundred thousand tensors) can be
// read with a larger one. 0 keeps the default.
inline void add_max_memory_option(CLI::App* cmd, std::uint64_t& mib) {
  cmd->add_option("--max-memory", mib,
                  "MiB one file's parse may allocate (default " + std::to_string(Limits{}.max_memory_bytes >> 20) +
                      "); raise it for a real checkpoint refused by max_memory_bytes")
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 20));
}
// Printed under a kLimitExceeded refusal (inspect, convert).
inline constexpr const char* kLimitHint =
    "  (a cap that protects against hostile files was hit; for a file you trust, --max-memory MIB raises "
    "max_memory_bytes, the one most real files reach)\n";
inline void apply_max_memory(std::uint64_t mib, Limits& limits) {
  if (mib != 0) limits.max_memory_bytes = mib << 20;
}

void register_inspect(CLI::App& app, int& exit_code);
void register_scan(CLI::App& app, int& exit_code);
void register_convert(CLI::App& app, int& exit_code);
void register_bench(CLI::App& app, int& exit_code);
// `sign` and `verify` (cli/sign.cpp): OpenSSF Model Signing bundles.
void register_sign(CLI::App& app, int& exit_code);
void register_verify(CLI::App& app, int& exit_code);
// What `safeckpt verify` takes besides the model, shared with `scan
// --signature` (cli/sign.cpp; one parser for both).
struct VerifyInputs {
  std::string signature, public_key;
  std::vector<std::string> chain, ignore;
  bool ignore_unsigned = false;
  unsigned threads = 0;
};
// Adds --signature (required when `signature_required`), --public-key,
// --certificate-chain, --ignore-paths, --ignore-unsigned-files, --threads.
void add_verify_options(CLI::App* cmd, VerifyInputs& v, bool signature_required);
// The trust material: exactly one of --public-key and --certificate-chain
// (kInvalidArgument naming both options otherwise; kIo: a file unreadable).
Result<sign::Trust> verify_trust(const VerifyInputs& v);
// ignore paths made relative to `model` as model_signing's CLI does, the
// other flags as given.
sign::VerifyOptions verify_options(const std::string& model, const VerifyInputs& v);
// `run` and `inspect-program` (cli/run.cpp): torch.export programs.
void register_run(CLI::App& app, int& exit_code);
// `bench-engine` (cli/bench_engine.cpp): the compiled engine's table.
void register_bench_engine(CLI::App& app, int& exit_code);
// `safeckpt inspect` on a PT2 archive: what `inspect-program` prints for the
// mapped bytes `file` (borrowed), text or JSON; its exit code.
int inspect_pt2(const std::string& path, Bytes file, bool json);
// torch.distributed.checkpoint directories (cli/dcp.cpp; a directory with a
// `.metadata` file: safeckpt::is_dcp_directory; `scan` reports them through
// the scanner, scan::scan_walk). inspect: 0 / 1 policy / 2 other refusal,
// after reading every chunk and item payload; convert: .safetensors (flat
// FQNs) or .pt (nested, like dcp_to_torch_save).
int inspect_dcp(const std::string& dir, bool json);
int convert_dcp(const std::string& in, const std::string& out, bool force, bool fsync);

}  // namespace safeckpt::cli
