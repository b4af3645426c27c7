// `safeckpt convert IN OUT`: between PyTorch checkpoints and safetensors.
//
// The input format is detected by content (a *.safetensors.index.json name
// selects a sharded safetensors checkpoint); the output extension chooses
// the output format: .pt/.pth/.bin/.ckpt a torch.save zip that
// torch.load(weights_only=True) reads, .safetensors the reference layout.
//  - PyTorch -> safetensors: every tensor, named as in the state_dict;
//    shared storages become separate tensors (with a note); plain non-tensor
//    values go to __metadata__ as JSON, others are refused unless
//    --drop-non-tensors.
//  - safetensors -> PyTorch: a state_dict (OrderedDict name -> tensor).
//  - PyTorch -> PyTorch: re-saved from what the weights-only loader built,
//    i.e. scrubbed to weights.
//  --legacy writes PyTorch outputs in the pre-1.6 sequential-pickle format.
//  --to-dcp OUTDIR (instead of OUT): a torch.distributed.checkpoint directory
//    (safeckpt::save_dcp: __<rank>_0.distcp + .metadata) that
//    torch.distributed.checkpoint.load reads; never replaces OUTDIR (--force
//    does not apply: a directory cannot be replaced atomically).
//    --world-size N (default 1): laid out as N writers save it, every tensor
//    Shard(0) over N ranks (safeckpt/dcp.hpp "Writing a DCP directory").
//  --rank FILE (once per rank file; then the one positional is OUT): the
//    per-rank torch.save files of a DTensor state_dict (FSDP2's
//    model.state_dict() on each rank), loaded with the bundled
//    allowlist/dtensor.allow and gathered into full tensors
//    (gather_dtensor_ranks): OUT holds what DTensor.full_tensor() gives.
// The output is written atomically and never replaces a file unless --force.
// Exit codes: 0 converted, 1 input refused by policy, 2 anything else.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "allow_arg.hpp"
#include "commands.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/dcp.hpp"
#include "safeckpt/detect.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/safetensors_writer.hpp"
#include "safeckpt/save.hpp"

namespace safeckpt::cli {
namespace {

struct ConvertArgs {
  std::string in, out, to_dcp;
  std::vector<std::string> allow_files;
  std::vector<std::string> ranks;  // --rank FILE ...
  bool force = false;
  bool drop_non_tensors = false;
  bool cpu = false;
  bool legacy = false;
  bool no_fsync = false;
  std::uint64_t max_memory_mib = 0;
  std::int64_t world_size = -1;  // -1: not given (1)
};

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int fail(const std::string& what, const Error& e) {
  std::fprintf(stderr, "safeckpt convert: %s\n  %s\n", what.c_str(), e.to_string().c_str());
  if (e.code() == ErrorCode::kLimitExceeded) std::fputs(kLimitHint, stderr);
  return e.code() == ErrorCode::kOk ? 2 : (is_policy_error(e.code()) ? 1 : 2);
}

// Every input format by content, one open (safeckpt/open.hpp).
Result<Checkpoint> read_input(const ConvertArgs& a, const Allowlist& allow) {
  LoadOptions opt;
  opt.allowlist = &allow;
  apply_max_memory(a.max_memory_mib, opt.limits);
  return safeckpt::open(a.in, opt);
}

int run_to_dcp(const ConvertArgs& a) {
  if (!a.out.empty()) {
    std::fprintf(stderr, "safeckpt convert: give either OUT or --to-dcp OUTDIR, not both\n");
    return 2;
  }
  if (a.force || a.legacy || a.cpu || a.drop_non_tensors) {
    std::fprintf(stderr,
                 "safeckpt convert: --force, --legacy, --cpu and --drop-non-tensors do not apply to --to-dcp\n");
    return 2;
  }
  Allowlist allow = Allowlist::default_policy();
  if (auto st = add_allow_args(allow, a.allow_files); !st) return fail("bad --allow", st.error());
  auto in = read_input(a, allow);
  if (!in) return fail(a.in + ": " + failure_word(in.error().code()), in.error());
  DcpWriteOptions o;
  o.fsync = !a.no_fsync;
  if (a.world_size >= 0) {
    // Larger than any uint32 is over DcpLimits::max_files anyway: save_dcp says so.
    o.world_size = a.world_size > 0xFFFFFFFFll ? 0xFFFFFFFFu : static_cast<std::uint32_t>(a.world_size);
  }
  auto r = save_dcp(*in, a.to_dcp, o);
  if (!r) {
    if (r.error().code() == ErrorCode::kExists) {
      std::fprintf(stderr, "safeckpt convert: %s exists; --to-dcp never replaces a directory\n", a.to_dcp.c_str());
      return 2;
    }
    return fail("cannot write " + a.to_dcp, r.error());
  }
  std::fprintf(stderr,
               "wrote %s (world size %u: %llu tensors in %llu chunks, %llu non-tensor items, %llu data bytes)\n",
               a.to_dcp.c_str(), r->files, static_cast<unsigned long long>(r->tensors),
               static_cast<unsigned long long>(r->chunks), static_cast<unsigned long long>(r->bytes_items),
               static_cast<unsigned long long>(r->data_bytes));
  return 0;
}

// --rank FILE...: every file through the loader with allowlist/dtensor.allow
// (and any --allow), then gather_dtensor_ranks.
Result<Checkpoint> gather_ranks(const ConvertArgs& a, std::vector<std::string>& notes) {
  Allowlist allow = Allowlist::default_policy();
  std::vector<std::string> allow_args{"dtensor"};
  allow_args.insert(allow_args.end(), a.allow_files.begin(), a.allow_files.end());
  SAFECKPT_CHECK(add_allow_args(allow, allow_args));
  std::vector<Checkpoint> loaded;
  loaded.reserve(a.ranks.size());
  for (const auto& f : a.ranks) {
    LoadOptions opt;
    opt.allowlist = &allow;
    apply_max_memory(a.max_memory_mib, opt.limits);
    auto ck = safeckpt::open(f, opt);
    if (!ck) return make_error(ck.error().code(), f + ": " + ck.error().message());
    loaded.push_back(std::move(*ck));
  }
  std::vector<const Checkpoint*> ptrs;
  ptrs.reserve(loaded.size());
  for (const auto& c : loaded) ptrs.push_back(&c);
  DTensorGatherOptions go;
  go.drop_non_tensors = a.drop_non_tensors;
  return gather_dtensor_ranks(ptrs, go, &notes);
}

int run_convert(ConvertArgs a) {
  if (!a.ranks.empty()) {
    // `convert --rank R0 --rank R1 OUT`: the one positional is OUT.
    if (!a.out.empty() || !a.to_dcp.empty()) {
      std::fprintf(stderr, "safeckpt convert: with --rank FILE..., give only OUT (no IN, no --to-dcp)\n");
      return 2;
    }
    a.out = a.in;
  } else if (a.in.empty()) {
    std::fprintf(stderr, "safeckpt convert: IN is required (or --rank FILE... for per-rank DTensor files)\n");
    return 2;
  }
  if (!a.to_dcp.empty()) return run_to_dcp(a);
  if (a.world_size >= 0) {
    std::fprintf(stderr, "safeckpt convert: --world-size applies to --to-dcp OUTDIR only\n");
    return 2;
  }
  if (a.out.empty()) {
    std::fprintf(stderr, "safeckpt convert: OUT (or --to-dcp OUTDIR) is required\n");
    return 2;
  }
  enum class Out { kTorch, kSafetensors } out;
  if (ends_with(a.out, ".safetensors")) {
    out = Out::kSafetensors;
  } else if (ends_with(a.out, ".pt") || ends_with(a.out, ".pth") || ends_with(a.out, ".bin") ||
             ends_with(a.out, ".ckpt")) {
    out = Out::kTorch;
  } else {
    std::fprintf(stderr,
                 "safeckpt convert: cannot tell the output format from %s (use .safetensors, or .pt/.pth/.bin/.ckpt "
                 "for a PyTorch checkpoint)\n",
                 a.out.c_str());
    return 2;
  }
  if (a.legacy && out != Out::kTorch) {
    std::fprintf(stderr, "safeckpt convert: --legacy applies to PyTorch outputs only\n");
    return 2;
  }
  std::vector<std::string> notes;
  Result<Checkpoint> in = make_error(ErrorCode::kInternal, "no input");
  if (!a.ranks.empty()) {
    in = gather_ranks(a, notes);
    if (!in) return fail("cannot gather the rank files", in.error());
  } else {
    if (is_dcp_directory(a.in)) return convert_dcp(a.in, a.out, a.force, !a.no_fsync);
    Allowlist allow = Allowlist::default_policy();
    if (auto st = add_allow_args(allow, a.allow_files); !st) return fail("bad --allow", st.error());
    in = read_input(a, allow);
    if (!in) return fail(a.in + ": " + failure_word(in.error().code()), in.error());
  }
  SaveOptions so;
  so.overwrite = a.force;
  so.fsync = !a.no_fsync;
  if (a.cpu) so.force_location = "cpu";
  so.legacy_format = a.legacy;
  Status st;
  if (out == Out::kSafetensors) {
    ToSafetensorsOptions to;
    to.drop_non_tensors = a.drop_non_tensors;
    st = save_checkpoint_as_safetensors(a.out, *in, to, so, &notes);
  } else {
    st = save(a.out, *in, so);
  }
  for (const auto& n : notes) std::fprintf(stderr, "note: %s\n", n.c_str());
  if (!st) {
    if (st.error().code() == ErrorCode::kExists) {
      std::fprintf(stderr, "safeckpt convert: %s exists; pass --force to replace it\n", a.out.c_str());
      return 2;
    }
    return fail("cannot write " + a.out, st.error());
  }
  std::fprintf(stderr, "wrote %s (%zu tensors%s)\n", a.out.c_str(), in->state_dict().size(),
               a.ranks.empty() ? "" : (", gathered from " + std::to_string(a.ranks.size()) + " rank files").c_str());
  return 0;
}

}  // namespace

void register_convert(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Convert between PyTorch checkpoints (.pt/.pth/.bin/.ckpt), safetensors (.safetensors) and DCP directories");
  cmd->add_option("IN", args->in,
                  "input: a PyTorch checkpoint, a .safetensors file, a *.safetensors.index.json or a DCP directory "
                  "(with --rank: OUT)");
  cmd->add_option("OUT", args->out, "output; its extension picks the format");
  cmd->add_option("--to-dcp", args->to_dcp,
                  "write a torch.distributed.checkpoint directory OUTDIR instead of OUT; "
                  "OUTDIR must not exist");
  cmd->add_option("--world-size", args->world_size,
                  "with --to-dcp: lay OUTDIR out as N ranks save it (one __<rank>_0.distcp each, every tensor "
                  "Shard(0) over them); default 1")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--rank", args->ranks,
                  "a per-rank torch.save file of DTensors (FSDP2 model.state_dict() on one rank), once per rank: "
                  "gathers them into full tensors in OUT (loaded with the bundled allowlist/dtensor.allow)")
      ->allow_extra_args(false);
  cmd->add_flag("-f,--force", args->force, "replace OUT if it exists");
  cmd->add_flag("--drop-non-tensors", args->drop_non_tensors,
                "to safetensors: leave out non-tensor values instead of refusing ones JSON metadata cannot hold");
  // One value per --allow: OUT is optional (--to-dcp), so a multi-value
  // option would swallow IN and OUT (`convert --allow argparse IN OUT`).
  cmd->add_option("--allow", args->allow_files, std::string(kAllowHelp) + "; for a PyTorch input (trusted input only)")
      ->allow_extra_args(false);
  cmd->add_flag("--cpu", args->cpu, "to PyTorch: record every storage as saved on the CPU");
  cmd->add_flag("--legacy", args->legacy,
                "to PyTorch: write the pre-1.6 legacy format (torch.save(..., _use_new_zipfile_serialization=False))");
  add_max_memory_option(cmd, args->max_memory_mib);
  cmd->add_flag("--no-fsync", args->no_fsync, "skip fsync (faster, not crash-safe)");
  cmd->callback([args, &exit_code] { exit_code = run_convert(*args); });
}

}  // namespace safeckpt::cli
