// `safeckpt run PROGRAM.pt2 --inputs IN.safetensors --outputs OUT.safetensors`
// and `safeckpt inspect-program PROGRAM.pt2 [--json]`: the engine's commands
// (issue 13; src/graph/, include/safeckpt/graph.hpp).
//
// run: reads the PT2 archive as data, validates it against
// allowlist/ops.schema, binds weights (the archive's own, or --weights
// CHECKPOINT by state_dict key: .pt/.pth/.bin via the weights-only loader,
// .safetensors, *.safetensors.index.json; constants and non-persistent buffers
// that a state_dict does not hold come from the archive), binds the inputs
// (tensors of IN named as the program's user inputs, or "input.<name>" as the
// corpus io files have them), runs on the CPU reference interpreter and writes
// the user outputs as output.0, output.1, ... (safetensors, atomic; --force to
// replace). --device cuda[:N] runs the compiled engine instead (issue 14,
// safeckpt/engine.hpp; --stance default|force_eager|eager_then_compile|
// fail_on_recompile), when the tool was built with it; its generated kernels
// go through the persistent compile cache (--cache-dir DIR, default
// $SAFECKPT_CACHE_DIR or ~/.cache/safeckpt; --no-cache: compile every time),
// whose warnings (ignored entries, failed stores) are printed on stderr.
// With cuda, --profile prints the plan's per-launch GPU times on stderr after
// the run (CompiledProgram::profile: a debug path, median of 20 runs) and
// --attention-workspace-mib N sets EngineOptions::attention_workspace_bytes;
// --conv-layout auto|nchw|channels-last sets EngineOptions::conv_layout.
//
// inspect-program (and `safeckpt inspect` on a PT2 archive): models, user inputs/outputs with shapes (symbolic dims by
// symbol, with ranges), the op histogram, weights (name, dtype, shape,
// bytes, tied records) and every reason the engine would refuse the program.
// --format json (alias --json, as for inspect) prints one object: {"file", "models": [{"name", "schema_version",
// "torch_version", "inputs": [{"name", "dtype", "shape": [int|str]}],
// "outputs": [...same...], "ranges": {sym: [min|null, max|null]},
// "ops": {target: count}, "weights": [{"name", "kind", "dtype", "shape",
// "bytes", "record", "tied_with": [names]}], "refusals": [str],
// "accepted": bool}]}.
//
// Exit codes: 0 ran / inspected and accepted, 1 refused by policy (op or
// global not allowed), 2 malformed input, usage or I/O error.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "safeckpt/graph.hpp"
#include "safeckpt/open.hpp"
#include "safeckpt/safetensors.hpp"
#ifdef SAFECKPT_HAVE_ENGINE
#include "safeckpt/engine.hpp"
#endif

namespace safeckpt::cli {
namespace {

using graph::HostTensor;
using graph::Program;

struct RunArgs {
  std::string program, inputs, outputs, weights, model = "model", device = "cpu", stance = "default", cache_dir;
  bool force = false, no_cache = false, profile = false;
  std::int64_t attention_workspace_mib = -1;  // -1: the engine's default
  std::string conv_layout = "auto";
};
struct InspectProgramArgs {
  std::string program, model;
  bool json = false;
};

int fail(const char* cmd, const std::string& what, const Error& e) {
  std::fprintf(stderr, "safeckpt %s: %s\n  %s\n", cmd, what.c_str(), e.to_string().c_str());
  return is_policy_error(e.code()) ? 1 : 2;
}

// --weights: any checkpoint format, by content, the file opened once
// (safeckpt/open.hpp: .pt, legacy, .safetensors, sharded index, DCP directory).
Result<Checkpoint> load_weights_file(const std::string& path) {
  return safeckpt::open(path);
}

std::string dim_text(const Program& p, const graph::SymInt& s) {
  if (!s.is_symbolic()) return std::to_string(s.value);
  const std::string& e = p.sym_values[static_cast<std::size_t>(s.sym)].expr;
  // Symbol('s95', positive=True, integer=True) -> s95
  if (e.rfind("Symbol('", 0) == 0) {
    auto q = e.find('\'', 8);
    if (q != std::string::npos && e.find('(', 8) == std::string::npos) return e.substr(8, q - 8);
  }
  return e;
}

int run_program(const RunArgs& a) {
  int cuda_device = -1;
  if (a.device.rfind("cuda", 0) == 0) {
#ifdef SAFECKPT_HAVE_ENGINE
    cuda_device = 0;
    if (a.device.size() > 5 && a.device[4] == ':') cuda_device = std::atoi(a.device.c_str() + 5);
    if (a.device != "cuda" && (a.device.size() <= 5 || a.device[4] != ':')) cuda_device = -2;
#else
    std::fprintf(stderr, "safeckpt run: --device %s: this build has no CUDA engine; use --device cpu\n",
                 a.device.c_str());
    return 2;
#endif
  }
  if (a.device != "cpu" && cuda_device < 0) {
    std::fprintf(stderr, "safeckpt run: unknown --device %s (cpu or cuda[:N])\n", a.device.c_str());
    return 2;
  }
  auto archive = graph::Pt2Archive::open_file(a.program);
  if (!archive) return fail("run", a.program + ": not read", archive.error());
  auto prog = archive->program(a.model);
  if (!prog) return fail("run", a.program, prog.error());
  Program p = **prog;
  if (auto st = graph::validate(p); !st) return fail("run", a.program + ": refused", st.error());
  auto own = graph::archive_weights(*archive, a.model);
  if (!own) return fail("run", a.program, own.error());
  graph::WeightMap weights;
  Checkpoint ckpt;
  if (!a.weights.empty()) {
    auto ck = load_weights_file(a.weights);
    if (!ck) return fail("run", a.weights + ": not loaded", ck.error());
    auto w = graph::checkpoint_weights(p, *ck, &*own);
    if (!w) return fail("run", a.weights, w.error());
    weights = std::move(w).value();
  } else {
    weights = std::move(own).value();
  }
  auto in_file = SafetensorsFile::open(a.inputs);
  if (!in_file) return fail("run", a.inputs + ": not read", in_file.error());
  std::map<std::string, HostTensor, std::less<>> inputs;
  for (const auto& gi : p.inputs) {
    if (gi.kind != graph::InputKind::kUserInput) continue;
    const SafetensorsTensor* t = in_file->find(gi.fqn);
    if (t == nullptr) t = in_file->find("input." + gi.fqn);
    if (t == nullptr) {
      std::fprintf(stderr, "safeckpt run: %s has no tensor '%s' (or 'input.%s') for the program's input\n",
                   a.inputs.c_str(), gi.fqn.c_str(), gi.fqn.c_str());
      return 2;
    }
    auto dt = dtype_from_safetensors(t->dtype);
    if (!dt) {
      std::fprintf(stderr, "safeckpt run: input '%s' has dtype %s, which PyTorch lacks\n", gi.fqn.c_str(),
                   t->dtype.c_str());
      return 2;
    }
    auto h = graph::make_host_tensor(*dt, std::vector<std::int64_t>(t->shape.begin(), t->shape.end()), t->data);
    if (!h) return fail("run", "input '" + gi.fqn + "'", h.error());
    inputs[gi.fqn] = std::move(h).value();
  }
  Result<std::vector<HostTensor>> out = make_error(ErrorCode::kInternal, "not run");
  if (cuda_device >= 0) {
#ifdef SAFECKPT_HAVE_ENGINE
    auto stance = engine::parse_stance(a.stance);
    if (!stance) return fail("run", "--stance", stance.error());
    engine::EngineOptions eo;
    eo.device = cuda_device;
    eo.stance = *stance;
    eo.cache = a.no_cache ? engine::CacheMode::kOff : engine::CacheMode::kReadWrite;
    eo.cache_dir = a.cache_dir;
    if (a.attention_workspace_mib >= 0)
      eo.attention_workspace_bytes = static_cast<std::uint64_t>(a.attention_workspace_mib) << 20;
    auto layout = engine::parse_conv_layout(a.conv_layout);
    if (!layout) return fail("run", "--conv-layout", layout.error());
    eo.conv_layout = *layout;
    auto eng = engine::Engine::create(eo);
    if (!eng) return fail("run", a.device, eng.error());
    auto cp = eng->compile(p, weights);
    if (!cp) return fail("run", a.program + ": not compiled", cp.error());
    out = cp->run_host(inputs);
    if (out && a.profile) {
      engine::ProfileOptions po;
      po.stance = *stance == engine::Stance::kForceEager ? engine::Stance::kForceEager : engine::Stance::kDefault;
      auto prof = cp->profile_host(inputs, po);
      if (!prof) return fail("run", a.program + ": profile failed", prof.error());
      print_engine_profile(stderr, *prof, eo.attention_workspace_bytes);
    }
    auto es = eng->stats();
    for (const auto& w : es.warnings) std::fprintf(stderr, "safeckpt run: warning: %s\n", w.c_str());
    if (es.warnings_dropped != 0)
      std::fprintf(stderr, "safeckpt run: warning: %zu more compile cache warnings\n", es.warnings_dropped);
#endif
  } else {
    out = graph::run_cpu(p, weights, inputs);
  }
  if (!out) return fail("run", a.program + ": run failed", out.error());
  std::vector<SafetensorsEntry> entries;
  for (std::size_t i = 0; i < out->size(); ++i) {
    const HostTensor& t = (*out)[i];
    std::string dt(safetensors_dtype_name(t.dtype));
    entries.push_back(SafetensorsEntry{"output." + std::to_string(i), dt,
                                       std::vector<std::uint64_t>(t.shape.begin(), t.shape.end()), t.bytes()});
  }
  SaveOptions so;
  so.overwrite = a.force;
  auto st = save_safetensors(a.outputs, std::move(entries), {{"program", a.program}, {"model", a.model}}, true, so);
  if (!st) return fail("run", a.outputs + ": not written", st.error());
  std::printf("ran %s (%zu nodes) -> %s (%zu outputs)\n", a.program.c_str(), p.nodes.size(), a.outputs.c_str(),
              out->size());
  return 0;
}

int describe_program(const InspectProgramArgs& a, const Result<graph::Pt2Archive>& archive) {
  if (!archive) return fail("inspect-program", a.program + ": not read", archive.error());
  nlohmann::json doc = {{"file", a.program}, {"models", nlohmann::json::array()}};
  bool all_ok = true;
  std::string text;
  for (const auto& name : archive->models()) {
    if (!a.model.empty() && name != a.model) continue;
    auto prog = archive->program(name);
    auto w = archive->weights(name);
    if (!prog || !w) continue;
    Program p = **prog;
    auto reasons = graph::refusal_reasons(p);
    all_ok = all_ok && reasons.empty();
    nlohmann::json m = {{"name", name},
                        {"schema_version", std::to_string(p.schema_major) + "." + std::to_string(p.schema_minor)},
                        {"torch_version", p.torch_version}};
    text += "model " + name + " (schema " + m["schema_version"].get<std::string>() + ", torch " + p.torch_version +
            ", " + std::to_string(p.nodes.size()) + " nodes)\n";
    auto tensor_json = [&](const std::string& n, std::int32_t id) {
      const auto& meta = p.values[static_cast<std::size_t>(id)];
      nlohmann::json shape = nlohmann::json::array();
      std::string s;
      for (std::size_t d = 0; d < meta.sizes.size(); ++d) {
        std::string dt = dim_text(p, meta.sizes[d]);
        if (meta.sizes[d].is_symbolic())
          shape.push_back(dt);
        else
          shape.push_back(meta.sizes[d].value);
        s += (d ? ", " : "") + dt;
      }
      return std::make_pair(nlohmann::json{{"name", n}, {"dtype", dtype_name(meta.dtype)}, {"shape", shape}},
                            n + ": " + std::string(dtype_name(meta.dtype)) + "[" + s + "]");
    };
    m["inputs"] = nlohmann::json::array();
    for (const auto& gi : p.inputs) {
      if (gi.kind != graph::InputKind::kUserInput) continue;
      auto [j, t] = tensor_json(gi.fqn, gi.value);
      m["inputs"].push_back(j);
      text += "  input  " + t + "\n";
    }
    m["outputs"] = nlohmann::json::array();
    for (std::size_t i = 0; i < p.outputs.size(); ++i) {
      auto [j, t] = tensor_json("output." + std::to_string(i), p.outputs[i]);
      m["outputs"].push_back(j);
      text += "  output " + t + "\n";
    }
    m["ranges"] = nlohmann::json::object();
    for (const auto& [sym, r] : p.range_constraints) {
      m["ranges"][sym] = {r.first ? nlohmann::json(*r.first) : nlohmann::json(nullptr),
                          r.second ? nlohmann::json(*r.second) : nlohmann::json(nullptr)};
      text += "  range  " + sym + " in [" + (r.first ? std::to_string(*r.first) : "-inf") + ", " +
              (r.second ? std::to_string(*r.second) : "inf") + "]\n";
    }
    m["ops"] = nlohmann::json::object();
    text += "  ops:\n";
    for (const auto& [op, n] : p.op_histogram()) {
      m["ops"][op] = n;
      text += "    " + std::to_string(n) + " x " + op + "\n";
    }
    m["weights"] = nlohmann::json::array();
    text += "  weights:\n";
    for (const auto& t : **w) {
      nlohmann::json tied = nlohmann::json::array();
      for (const auto& o : **w)
        if (o.fqn != t.fqn && o.record == t.record) tied.push_back(o.fqn);
      std::string shape;
      for (std::size_t d = 0; d < t.tensor.shape.size(); ++d)
        shape += (d ? ", " : "") + std::to_string(t.tensor.shape[d]);
      m["weights"].push_back({{"name", t.fqn},
                              {"kind", t.is_constant ? "constant"
                                       : t.is_param  ? "parameter"
                                                     : "buffer"},
                              {"dtype", dtype_name(t.tensor.dtype)},
                              {"shape", t.tensor.shape},
                              {"bytes", t.tensor.data ? t.tensor.data->size() : 0},
                              {"record", t.record},
                              {"tied_with", tied}});
      text += "    " + t.fqn + "  " + std::string(dtype_name(t.tensor.dtype)) + "[" + shape + "]  " +
              std::to_string(t.tensor.data ? t.tensor.data->size() : 0) + " B" +
              (tied.empty() ? "" : "  tied with " + tied.dump()) + "\n";
    }
    m["refusals"] = reasons;
    m["accepted"] = reasons.empty();
    text += reasons.empty() ? "  accepted by the engine\n" : "  refused by the engine:\n";
    for (const auto& r : reasons) text += "    " + r + "\n";
    doc["models"].push_back(m);
  }
  if (a.json)
    std::printf("%s\n", doc.dump(2).c_str());
  else
    std::printf("%s", text.c_str());
  return all_ok ? 0 : 1;
}

int inspect_program(const InspectProgramArgs& a) {
  return describe_program(a, graph::Pt2Archive::open_file(a.program));
}

}  // namespace

int inspect_pt2(const std::string& path, Bytes file, bool json) {
  InspectProgramArgs a;
  a.program = path;
  a.json = json;
  return describe_program(a, graph::Pt2Archive::open(file));
}

void register_run(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<RunArgs>();
  CLI::App* sub = app.add_subcommand(
      "run", "Run a torch.export program (PT2 archive): CPU reference interpreter or the CUDA engine");
  sub->add_option("program", args->program, "PT2 archive written by torch.export.save")->required();
  sub->add_option("--inputs", args->inputs, "safetensors file with the program's user inputs")->required();
  sub->add_option("--outputs", args->outputs, "safetensors file to write (output.0, output.1, ...)")->required();
  sub->add_option("--weights", args->weights,
                  "checkpoint whose state_dict supplies the weights (.pt, .safetensors, index)");
  sub->add_option("--model", args->model, "model in the archive (default: model)");
  sub->add_option("--device", args->device, "cpu (reference interpreter) or cuda[:N] (compiled engine)");
  sub->add_option("--stance", args->stance, "with cuda: default, force_eager, eager_then_compile, fail_on_recompile");
  CLI::Option* cache_dir =
      sub->add_option("--cache-dir", args->cache_dir,
                      "with cuda: compile cache directory (default: $SAFECKPT_CACHE_DIR, else ~/.cache/safeckpt)");
  sub->add_flag("--no-cache", args->no_cache, "with cuda: no persistent compile cache (compile every time)")
      ->excludes(cache_dir);
  sub->add_flag("--force", args->force, "replace an existing output file");
  sub->add_flag("--profile", args->profile, "with cuda: print the plan's per-launch GPU times on stderr (debug path)");
  sub->add_option("--attention-workspace-mib", args->attention_workspace_mib,
                  "with cuda: attention score workspace bound in MiB (0: flash-style kernel only; default 256)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  sub->add_option("--conv-layout", args->conv_layout,
                  "with cuda: convolutions' memory format: auto (channels-last on tensor cores), nchw, channels-last")
      ->check(CLI::IsMember({"auto", "nchw", "channels-last"}));
  sub->callback([args, &exit_code] { exit_code = run_program(*args); });

  auto iargs = std::make_shared<InspectProgramArgs>();
  CLI::App* isub =
      app.add_subcommand("inspect-program", "Describe a PT2 archive and say whether the engine accepts it");
  isub->add_option("program", iargs->program, "PT2 archive")->required();
  isub->add_option("--model", iargs->model, "only this model");
  isub->add_option_function<std::string>(
          "--format", [iargs](const std::string& f) { iargs->json = f == "json"; },
          "output: text (default) or json (one object; schema at the top of cli/run.cpp)")
      ->check(CLI::IsMember({"text", "json"}));
  isub->add_flag("--json", iargs->json, "same as --format json");
  isub->callback([iargs, &exit_code] { exit_code = inspect_program(*iargs); });
}

}  // namespace safeckpt::cli
