// `safeckpt bench-engine PROGRAM.pt2 [--weights CKPT] [--batch N] [--iters N]
// [--device cuda:N] [--baselines "python3 bench/engine_baselines.py ..."]`:
// one table for the compiled engine (issue 14): our eager (force_eager: one
// kernel per node, no graph), our compiled plan (CUDA-graph replay), the
// first call of a new engine (plan + NVRTC + capture), the first call of a
// second program on the same engine (in-process module map), the first call
// of a NEW engine whose persistent compile cache the cold call filled
// (create + compile + plan + cache load + capture + run; no NVRTC), and
// checkpoint file -> first output. The cache directory is --cache-dir, else
// a temporary one made and removed by the bench (so the cold row is cold and
// ~/.cache is not touched); --no-cache runs without it (the warm-cache row is
// n/a). Hits/misses of both first calls are printed beside them. The cold
// row includes writing the entries (fsync), as a cold PyTorch run writes its
// inductor cache; the warm row finds NVRTC and cuBLASLt already loaded in
// this process, so it does not show what a new process saves by not loading
// NVRTC. --baselines runs a companion script in the same run and prints
// its rows (PyTorch eager, torch.compile reduce-overhead, ...) below ours.
// The run's CUDA_CACHE_PATH (the driver's compute cache, which NVRTC uses
// too) is a fresh temporary directory, so the cold row compiles every
// kernel.
//
// Inputs: the program's example shapes (symbolic dims at their recorded
// example value), dim 0 set to --batch when given; int64 inputs hold
// deterministic values in [0, 64) (valid token ids for every model with a
// vocabulary of at least 64), floats in [-1, 1). Latencies are medians of
// --iters runs after 3 warm-up runs, each run() synchronizing the stream.
// The warm and eager rows take inputs already on the device (kDLCUDA, copied
// there once), as the PyTorch rows of bench/engine_baselines.py do; the
// first-call rows and one more warm row take host inputs (pageable memory,
// copied in by run(): ResNet-50 batch 32's 19 MiB input is ~2 ms of that).
//
// --profile adds a table of the compiled plan's launches
// (CompiledProgram::profile: each step alone between cudaEvents, median of
// --iters runs after 3 warm-up runs; a debug path): step, kind, shapes, ms,
// % of the steps' sum, largest first, then the sum per kind and the CUDA
// graph replay of the same plan. --attention-workspace-mib N sets
// EngineOptions::attention_workspace_bytes (0: the flash-style attention
// kernel only) for every engine of the run; --conv-layout auto|nchw|
// channels-last sets EngineOptions::conv_layout; --no-fold-batch-norm and
// --no-cudnn-graph clear EngineOptions::fold_batch_norm and
// cudnn_graph_fusion, --no-attention-tensor-cores attention_tensor_cores,
// --no-attention-pointer-arrays attention_pointer_arrays, --no-gemm-split
// split_misaligned_gemm, --no-gemm-row-classes gemm_row_classes,
// --no-gemm-siblings fuse_sibling_gemms,
// --no-cudnn-attention cudnn_attention,
// --no-cudnn-attention-masks cudnn_attention_masks,
// --no-attention-3xtf32 attention_3xtf32, --no-background-graphs
// background_graph_plans and --no-background-restore
// background_graph_restore. With background graph plans, the cold first
// call is the first output (cuDNN's graphs still building), and so is the
// warm-cache one while the cached graphs are restored; one more row each
// says when the final plan (graphs in, CUDA graph captured) had run once.
#include <stdlib.h>  // mkdtemp, setenv

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "safeckpt/graph.hpp"
#ifdef SAFECKPT_HAVE_ENGINE
#include <cuda_runtime_api.h>

#include "safeckpt/device_checkpoint.hpp"
#include "safeckpt/engine.hpp"
#endif

namespace safeckpt::cli {
namespace {

struct BenchEngineArgs {
  std::string program, weights, device = "cuda:0", baselines, cache_dir;
  std::int64_t batch = 0;
  int iters = 50;
  bool no_cache = false;
  bool profile = false;
  std::int64_t attention_workspace_mib = -1;  // -1: the engine's default
  std::string conv_layout = "auto";
  bool no_fold_batch_norm = false;
  bool no_cudnn_graph = false;
  bool no_attention_tensor_cores = false;
  bool no_attention_pointer_arrays = false;
  bool no_gemm_epilogue = false;
  bool no_gemm_autotune = false;
  bool no_gemm_split = false;
  bool no_gemm_siblings = false;
  bool no_gemm_row_classes = false;
  bool no_cudnn_attention = false;
  bool no_cudnn_attention_masks = false;
  bool no_attention_3xtf32 = false;
  bool no_background_graphs = false;
  bool no_background_restore = false;
};

#ifdef SAFECKPT_HAVE_ENGINE
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

int bench_fail(const std::string& what, const Error& e) {
  std::fprintf(stderr, "safeckpt bench-engine: %s\n  %s\n", what.c_str(), e.to_string().c_str());
  return 2;
}

using Inputs = std::map<std::string, graph::HostTensor, std::less<>>;

Result<Inputs> make_inputs(const graph::Program& p, std::int64_t batch) {
  Inputs in;
  std::uint64_t state = 0x9e3779b97f4a7c15ull;
  for (const auto& gi : p.inputs) {
    if (gi.kind != graph::InputKind::kUserInput) continue;
    const auto& m = p.values[static_cast<std::size_t>(gi.value)];
    std::vector<std::int64_t> shape;
    for (const auto& s : m.sizes) {
      std::int64_t v = s.value;
      if (s.is_symbolic()) {
        const auto& sv = p.sym_values[static_cast<std::size_t>(s.sym)];
        if (!sv.hint)
          return make_error(ErrorCode::kUnsupported, "input '" + gi.fqn + "' has a size without example value");
        v = *sv.hint;
      }
      shape.push_back(v);
    }
    if (batch > 0 && !shape.empty()) shape[0] = batch;
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    std::vector<std::uint8_t> bytes(n * dtype_size(m.dtype));
    for (std::uint64_t i = 0; i < n; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      auto r = static_cast<std::uint32_t>(state >> 33);
      if (m.dtype == DType::kInt64) {
        std::int64_t v = r % 64;
        std::memcpy(bytes.data() + i * 8, &v, 8);
      } else if (m.dtype == DType::kFloat32) {
        float v = static_cast<float>(r % 20000) / 10000.0f - 1.0f;
        std::memcpy(bytes.data() + i * 4, &v, 4);
      } else if (m.dtype == DType::kBFloat16) {
        float v = static_cast<float>(r % 20000) / 10000.0f - 1.0f;
        std::uint32_t u;
        std::memcpy(&u, &v, 4);
        auto h = static_cast<std::uint16_t>(u >> 16);
        std::memcpy(bytes.data() + i * 2, &h, 2);
      } else {
        return make_error(ErrorCode::kUnsupported, "input '" + gi.fqn + "': dtype not generated by the bench");
      }
    }
    SAFECKPT_TRY(auto t, graph::make_host_tensor(m.dtype, shape, bytes));
    in[gi.fqn] = std::move(t);
  }
  return in;
}

std::vector<DLTensor> as_dlpack(Inputs& in, std::vector<engine::NamedInput>& named) {
  std::vector<DLTensor> dl(in.size());
  std::size_t i = 0;
  for (auto& [name, t] : in) {
    DLTensor& d = dl[i++];
    d.data = t.data->data();
    d.device = {kDLCPU, 0};
    d.ndim = static_cast<std::int32_t>(t.shape.size());
    d.dtype = *cuda::dlpack_dtype(t.dtype);
    d.shape = t.shape.data();
  }
  i = 0;
  for (auto& [name, t] : in) named.push_back({name, &dl[i++]});
  return dl;
}

// The inputs copied once into device memory of `device` (one DeviceArena),
// as kDLCUDA tensors named like `host`; `arena` and `dl` must outlive `named`.
Status device_inputs(const std::vector<DLTensor>& host, const std::vector<engine::NamedInput>& host_named, int device,
                     cuda::DeviceArena& arena, std::vector<DLTensor>& dl, std::vector<engine::NamedInput>& named) {
  std::vector<std::uint64_t> sizes;
  for (const auto& t : host) {
    std::uint64_t n = (static_cast<std::uint64_t>(t.dtype.bits) * t.dtype.lanes + 7) / 8;
    for (std::int32_t d = 0; d < t.ndim; ++d) n *= static_cast<std::uint64_t>(t.shape[d]);
    sizes.push_back(n);
  }
  SAFECKPT_TRY(arena, cuda::DeviceArena::allocate(device, sizes));
  dl = host;
  for (std::size_t i = 0; i < dl.size(); ++i) {
    dl[i].device = {kDLCUDA, device};
    dl[i].data = arena.storage_data(i);
    if (sizes[i] == 0) continue;
    if (cudaError_t e = cudaMemcpy(dl[i].data, host[i].data, sizes[i], cudaMemcpyHostToDevice); e != cudaSuccess)
      return make_error(ErrorCode::kDevice, std::string("cudaMemcpy of an input: ") + cudaGetErrorString(e));
  }
  named.clear();
  for (std::size_t i = 0; i < dl.size(); ++i) named.push_back({host_named[i].name, &dl[i]});
  return {};
}

// One timed call; the capsules are released.
Status call(engine::CompiledProgram& cp, const std::vector<engine::NamedInput>& named, const engine::RunOptions& ro) {
  SAFECKPT_TRY(auto outs, cp.run(named, ro));
  for (auto* o : outs) o->deleter(o);
  return {};
}

Result<double> median_ms(engine::CompiledProgram& cp, const std::vector<engine::NamedInput>& named,
                         const engine::RunOptions& ro, int iters) {
  for (int i = 0; i < 3; ++i) SAFECKPT_CHECK(call(cp, named, ro));
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    SAFECKPT_CHECK(call(cp, named, ro));
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// A mkdtemp directory under the temporary directory, removed with its
// entries at scope exit; path empty when it could not be made.
struct TempCacheDir {
  TempCacheDir() {
    std::error_code ec;
    std::string t = (std::filesystem::temp_directory_path(ec) / "safeckpt-bench-cache-XXXXXX").string();
    if (!ec && ::mkdtemp(t.data()) != nullptr) path = t;
  }
  TempCacheDir(const TempCacheDir&) = delete;
  TempCacheDir& operator=(const TempCacheDir&) = delete;
  ~TempCacheDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
  std::filesystem::path path;
};

struct Loaded {
  graph::Program program;
  graph::WeightMap weights;
  std::optional<cuda::DeviceCheckpoint> device_weights;
  double open_ms = 0, validate_ms = 0, weights_ms = 0, device_ms = 0;  // load_all's parts
};

// File(s) -> validated program + weights (archive's, or --weights to the device).
Result<Loaded> load_all(const BenchEngineArgs& a, int device) {
  auto t = Clock::now();
  SAFECKPT_TRY(auto archive, graph::Pt2Archive::open_file(a.program));
  SAFECKPT_TRY(const graph::Program* prog, archive.program("model"));
  Loaded l;
  l.open_ms = ms_since(t);
  t = Clock::now();
  l.program = *prog;
  SAFECKPT_CHECK(graph::validate(l.program));
  l.validate_ms = ms_since(t);
  t = Clock::now();
  SAFECKPT_TRY(l.weights, graph::archive_weights(archive));
  l.weights_ms = ms_since(t);
  if (!a.weights.empty()) {
    t = Clock::now();
    cuda::DeviceLoadOptions o;
    o.map_location = "cuda:" + std::to_string(device);
    SAFECKPT_TRY(auto dc, cuda::load_to_device(a.weights, o));
    l.device_weights = std::move(dc);
    l.device_ms = ms_since(t);
  }
  return l;
}

Result<engine::CompiledProgram> compile_with(engine::Engine& eng, Loaded& l) {
  if (l.device_weights) return eng.compile(l.program, *l.device_weights, &l.weights);
  return eng.compile(l.program, l.weights);
}

int bench_engine(const BenchEngineArgs& a) {
  // NVRTC keeps what it compiled in the driver's compute cache
  // (~/.nv/ComputeCache, or CUDA_CACHE_PATH): on the H100 host a module an
  // earlier process had compiled came back in about 25 ms instead of 850
  // (bench/RESULTS.md 2026-12-05 "NVRTC"), so a cold row after another run
  // was not cold. This run (and its --baselines child) gets a fresh one,
  // set before the first CUDA call and removed with it.
  TempCacheDir compute_cache;
  if (compute_cache.path.empty() || ::setenv("CUDA_CACHE_PATH", compute_cache.path.c_str(), 1) != 0) {
    std::fprintf(stderr, "safeckpt bench-engine: cannot make a fresh CUDA_CACHE_PATH\n");
    return 2;
  }
  int device = 0;
  if (a.device.rfind("cuda:", 0) == 0) device = std::atoi(a.device.c_str() + 5);
  auto desc = cuda::device_description(device);
  if (!desc) return bench_fail(a.device, desc.error());
  auto mem = cuda::device_memory(device);  // creates the CUDA context outside every timing
  if (!mem) return bench_fail(a.device, mem.error());
  std::printf("safeckpt bench-engine %s%s%s batch %lld, %d iterations\n  device: %s\n", a.program.c_str(),
              a.weights.empty() ? "" : " --weights ", a.weights.c_str(), static_cast<long long>(a.batch), a.iters,
              desc->c_str());
  // File -> first output, cold engine (no module cache): everything but the CUDA context.
  auto t_file = Clock::now();
  auto l = load_all(a, device);
  if (!l) return bench_fail(a.program, l.error());
  double load_ms = ms_since(t_file);
  auto inputs = make_inputs(l->program, a.batch);
  if (!inputs) return bench_fail("inputs", inputs.error());
  std::vector<engine::NamedInput> named;
  auto dl = as_dlpack(*inputs, named);
  engine::EngineOptions eo;
  eo.device = device;
  if (a.attention_workspace_mib >= 0)
    eo.attention_workspace_bytes = static_cast<std::uint64_t>(a.attention_workspace_mib) << 20;
  eo.attention_tensor_cores = !a.no_attention_tensor_cores;
  eo.attention_pointer_arrays = !a.no_attention_pointer_arrays;
  auto layout = engine::parse_conv_layout(a.conv_layout);
  if (!layout) return bench_fail("--conv-layout", layout.error());
  eo.conv_layout = *layout;
  eo.fold_batch_norm = !a.no_fold_batch_norm;
  eo.cudnn_graph_fusion = !a.no_cudnn_graph;
  eo.fuse_gemm_epilogue = !a.no_gemm_epilogue;
  eo.autotune_gemm = !a.no_gemm_autotune;
  eo.split_misaligned_gemm = !a.no_gemm_split;
  eo.fuse_sibling_gemms = !a.no_gemm_siblings;
  eo.gemm_row_classes = !a.no_gemm_row_classes;
  eo.cudnn_attention = !a.no_cudnn_attention;
  eo.cudnn_attention_masks = !a.no_cudnn_attention_masks;
  eo.attention_3xtf32 = !a.no_attention_3xtf32;
  eo.background_graph_plans = !a.no_background_graphs;
  eo.background_graph_restore = !a.no_background_restore;
  std::optional<TempCacheDir> temp_cache;
  if (a.no_cache) {
    eo.cache = engine::CacheMode::kOff;
  } else if (!a.cache_dir.empty()) {
    eo.cache_dir = a.cache_dir;
  } else {
    temp_cache.emplace();
    if (temp_cache->path.empty()) {
      std::fprintf(stderr, "safeckpt bench-engine: cannot make a temporary cache directory\n");
      return 2;
    }
    eo.cache_dir = temp_cache->path;
  }
  auto t_first = Clock::now();
  auto eng = engine::Engine::create(eo);
  if (!eng) return bench_fail("engine", eng.error());
  auto cp = compile_with(*eng, *l);
  if (!cp) return bench_fail("compile", cp.error());
  engine::RunOptions compiled;
  if (auto st = call(*cp, named, compiled); !st) return bench_fail("first call", st.error());
  double first_ms = ms_since(t_first);
  double file_ms = ms_since(t_file);
  // cuDNN graph plans still building in the background (EngineOptions::
  // background_graph_plans): the time until the plan is final, then its
  // CUDA graph captured by one more call (the warm rows time that plan).
  std::optional<double> final_ms;
  if (cp->stats().dnn_graphs_pending) {
    if (auto st = cp->wait_compiled(); !st) return bench_fail("background graph plans", st.error());
    if (auto st = call(*cp, named, compiled); !st) return bench_fail("second call", st.error());
    final_ms = ms_since(t_first);
  }
  auto s1 = cp->stats();
  // Second program on the same engine: generated modules are reused.
  auto t_second = Clock::now();
  auto cp2 = compile_with(*eng, *l);
  if (!cp2) return bench_fail("compile", cp2.error());
  if (auto st = call(*cp2, named, compiled); !st) return bench_fail("first call", st.error());
  double second_ms = ms_since(t_second);
  cuda::DeviceArena dev_arena;
  std::vector<DLTensor> dev_dl;
  std::vector<engine::NamedInput> dev_named;
  if (auto st = device_inputs(dl, named, device, dev_arena, dev_dl, dev_named); !st)
    return bench_fail("inputs to the device", st.error());
  auto warm = median_ms(*cp, dev_named, compiled, a.iters);
  if (!warm) return bench_fail("compiled runs", warm.error());
  auto warm_host = median_ms(*cp, named, compiled, a.iters);
  if (!warm_host) return bench_fail("compiled runs", warm_host.error());
  engine::RunOptions eager;
  eager.stance = engine::Stance::kForceEager;
  auto eager_ms = median_ms(*cp2, dev_named, eager, a.iters);
  if (!eager_ms) return bench_fail("eager runs", eager_ms.error());
  auto s2 = cp2->stats();
  // A new engine (empty module map) on the cache the cold call filled.
  std::optional<double> warm_cache_ms, warm_final_ms;
  engine::ProgramStats s3;
  if (!a.no_cache) {
    auto t_warm = Clock::now();
    auto eng3 = engine::Engine::create(eo);
    if (!eng3) return bench_fail("engine", eng3.error());
    auto cp3 = compile_with(*eng3, *l);
    if (!cp3) return bench_fail("compile", cp3.error());
    if (auto st = call(*cp3, named, compiled); !st) return bench_fail("first call", st.error());
    warm_cache_ms = ms_since(t_warm);
    if (cp3->stats().dnn_graphs_pending) {  // restored in the background: until the final plan ran
      if (auto st = cp3->wait_compiled(); !st) return bench_fail("background graph plans", st.error());
      if (auto st = call(*cp3, named, compiled); !st) return bench_fail("second call", st.error());
      warm_final_ms = ms_since(t_warm);
    }
    s3 = cp3->stats();
    for (const auto& w : eng3->stats().warnings)
      std::fprintf(stderr, "safeckpt bench-engine: warning: %s\n", w.c_str());
  }
  for (const auto& w : eng->stats().warnings) std::fprintf(stderr, "safeckpt bench-engine: warning: %s\n", w.c_str());
  std::printf(
      "  plan: %zu launches compiled (%zu generated kernels NVRTC-compiled), %zu eager; activation arena %.2f MiB "
      "(most live at one step %.2f MiB); all plan memory (arena + I/O + weight copies + workspace) %.2f MiB, of which "
      "prepared weight copies (channels-last, folded batch norms, concatenated linears) %.2f MiB; weights uploaded "
      "%.1f MiB%s\n",
      s1.steps, s1.kernels_compiled, s2.steps, static_cast<double>(s1.arena_bytes) / (1 << 20),
      static_cast<double>(s1.arena_live_bytes) / (1 << 20), static_cast<double>(s1.plan_device_bytes) / (1 << 20),
      static_cast<double>(s1.prepared_bytes) / (1 << 20), static_cast<double>(s1.weight_bytes) / (1 << 20),
      l->device_weights ? " (rest read in place)" : "");
  std::printf("  %-58s %12s\n", "row", "ms");
  std::printf("  %-58s %12.3f\n", "safeckpt eager (force_eager, median)", *eager_ms);
  std::printf("  %-58s %12.3f\n", "safeckpt compiled, warm (CUDA graph replay, median)", *warm);
  std::printf("  %-58s %12.3f\n", "safeckpt compiled, warm, host inputs copied in (median)", *warm_host);
  auto hits = [](const engine::ProgramStats& s) {
    return "   cache: " + std::to_string(s.cache_hits) + " hits, " + std::to_string(s.cache_misses) + " misses, " +
           std::to_string(s.cache_stores) + " stores, " + std::to_string(s.kernels_compiled) + " kernels compiled";
  };
  std::printf("  %-58s %12.3f%s\n", "safeckpt first call, cold engine (plan+NVRTC+capture+run)", first_ms,
              hits(s1).c_str());
  if (final_ms)
    std::printf("  %-58s %12.3f   (%zu cuDNN graph plans built in the background; %zu runs before)\n",
                "safeckpt cold engine until the final plan ran (graphs in)", *final_ms, s1.dnn_graphs_background,
                s1.background_runs);
  std::printf("  %-58s %12.3f\n", "safeckpt first call, same engine (module cache in process)", second_ms);
  if (warm_cache_ms)
    std::printf("  %-58s %12.3f%s\n", "safeckpt first call, warm persistent cache (new engine)", *warm_cache_ms,
                hits(s3).c_str());
  else
    std::printf("  %-58s %12s\n", "safeckpt first call, warm persistent cache (new engine)", "n/a (--no-cache)");
  if (warm_final_ms)
    std::printf("  %-58s %12.3f   (%zu cuDNN graph plans restored in the background; %zu runs before)\n",
                "safeckpt warm cache until the final plan ran (graphs in)", *warm_final_ms, s3.dnn_graphs_background,
                s3.background_runs);
  // Where each first call went (ms): weights upload, then the plan's phases.
  auto phases = [](const char* what, const engine::ProgramStats& s) {
    std::printf(
        "  %-22s upload %.1f, lowering %.1f (cuBLASLt heuristics %.1f: %zu asked, %zu reused), alloc %.1f, "
        "kernels %.1f, GEMM autotuning %.1f (%zu GEMMs), capture %.1f; plan total %.1f\n",
        what, 1e3 * s.weight_upload_seconds, 1e3 * s.last_lowering_seconds, 1e3 * s.last_heuristic_seconds,
        s.gemm_heuristics, s.gemm_heuristics_reused, 1e3 * s.last_alloc_seconds, 1e3 * s.last_module_seconds,
        1e3 * s.last_tune_seconds, s.gemms_tuned, 1e3 * s.last_capture_seconds, 1e3 * s.last_compile_seconds);
    if (s.dnn_graphs_built + s.dnn_graphs_restored > 0)
      std::printf(
          "  %-22s cuDNN graph plans %.1f ms: %zu built, %zu restored, %zu threads; %zu in the background, "
          "installed %.1f ms after the plan began\n",
          "", 1e3 * s.last_dnn_graph_seconds, s.dnn_graphs_built, s.dnn_graphs_restored, s.dnn_graph_threads,
          s.dnn_graphs_background, 1e3 * s.last_dnn_graphs_ready_seconds);
  };
  phases("phases, cold (ms):", s1);
  if (warm_cache_ms) phases("phases, warm cache:", s3);
  std::printf("  %-58s %12.3f\n", "safeckpt file -> first output (load+validate+compile+run)", file_ms);
  std::printf(
      "  %-58s %12.3f   (open+read program %.1f, validate %.1f, archive weights %.1f, --weights to device "
      "%.1f)\n",
      "  of which: read, validate, weights (host)", load_ms, l->open_ms, l->validate_ms, l->weights_ms, l->device_ms);
  if (!a.weights.empty()) {
    // Streaming start (Engine::compile over a PendingDeviceCheckpoint): the
    // weights file -> first output three ways, each with a new Engine on the
    // cache the cold call filled, the program already read, the file in the
    // page cache: load_to_device, then compile + first call; the same with
    // the transfer overlapping binding, planning and capture (compiled first
    // call); and with an eager first call whose steps wait for their own
    // weights (eager_then_compile).
    auto one = [&](int how) -> Result<double> {
      auto t0 = Clock::now();
      auto e2 = engine::Engine::create(eo);
      if (!e2) return unexpected(std::move(e2).error());
      cuda::DeviceLoadOptions o;
      o.map_location = "cuda:" + std::to_string(device);
      engine::RunOptions ro;
      if (how == 0) {
        SAFECKPT_TRY(auto dc, cuda::load_to_device(a.weights, o));
        SAFECKPT_TRY(auto p, e2->compile(l->program, dc, &l->weights));
        SAFECKPT_CHECK(call(p, named, ro));
      } else {
        SAFECKPT_TRY(auto pending, cuda::PendingDeviceCheckpoint::start(a.weights, o));
        SAFECKPT_TRY(auto p, e2->compile(l->program, pending, &l->weights));
        if (how == 2) ro.stance = engine::Stance::kEagerThenCompile;
        SAFECKPT_CHECK(call(p, named, ro));
      }
      return ms_since(t0);
    };
    const char* names[3] = {"weights file -> first output: load_to_device, then compile",
                            "weights file -> first output: streaming, compiled call",
                            "weights file -> first output: streaming, eager first call"};
    for (int how = 0; how < 3; ++how) {
      std::vector<double> t;
      for (int r = 0; r < 3; ++r) {
        auto ms = one(how);
        if (!ms) return bench_fail(names[how], ms.error());
        t.push_back(*ms);
      }
      std::sort(t.begin(), t.end());
      std::printf("  %-58s %12.3f   (median of 3; min %.3f)\n", names[how], t[1], t[0]);
    }
  }
  if (!a.no_cache)
    std::printf("  compile cache: %s%s\n", eo.cache_dir.c_str(),
                temp_cache ? " (temporary, removed after the run)" : "");
  std::fflush(stdout);
  if (a.profile) {
    engine::ProfileOptions po;
    po.iters = a.iters;
    auto prof = cp->profile(named, po);
    if (!prof) return bench_fail("profile", prof.error());
    print_engine_profile(stdout, *prof, eo.attention_workspace_bytes);
  }
  if (!a.baselines.empty()) {
    std::string cmd = a.baselines;  // its stderr (warnings) stays on stderr
    std::FILE* f = ::popen(cmd.c_str(), "r");
    if (f == nullptr) {
      std::fprintf(stderr, "safeckpt bench-engine: cannot run --baselines\n");
      return 2;
    }
    char line[4096];
    while (std::fgets(line, sizeof line, f) != nullptr) std::printf("  %s", line);
    int rc = ::pclose(f);
    if (rc != 0) std::printf("  (baselines exited with status %d)\n", rc);
  }
  return 0;
}
#endif

}  // namespace

#ifdef SAFECKPT_HAVE_ENGINE
void print_engine_profile(std::FILE* f, const engine::Profile& p, std::uint64_t attention_workspace_bytes) {
  std::fprintf(f,
               "\n  profile of the compiled plan: %zu launches, each alone between cudaEvents, median of %d runs; "
               "attention workspace bound %llu MiB\n",
               p.launches, p.iters, static_cast<unsigned long long>(attention_workspace_bytes >> 20));
  std::fprintf(f, "  %10s %6s  %-18s %-40s %s\n", "ms", "%", "kind", "step", "shapes");
  for (const auto& s : p.steps)
    std::fprintf(f, "  %10.4f %6.2f  %-18s %-40s %s\n", s.ms, s.percent, s.kind.c_str(), s.name.c_str(),
                 s.shapes.c_str());
  std::vector<std::pair<double, std::string>> kinds;
  for (const auto& [k, ms] : p.ms_by_kind) kinds.emplace_back(ms, k);
  std::sort(kinds.rbegin(), kinds.rend());
  std::fprintf(f, "  per kind:\n");
  for (const auto& [ms, k] : kinds)
    std::fprintf(f, "  %10.4f %6.2f  %s\n", ms, p.steps_ms > 0 ? 100.0 * ms / p.steps_ms : 0.0, k.c_str());
  std::fprintf(f, "  %10.4f         sum of the steps\n", p.steps_ms);
  std::fprintf(f, "  %10.4f         whole run step by step (first to last event)\n", p.whole_ms);
  std::fprintf(f, "  %10.4f         CUDA graph replay of the same plan\n", p.graph_ms);
}
#endif

void register_bench_engine(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchEngineArgs>();
  CLI::App* sub = app.add_subcommand("bench-engine", "Time the compiled CUDA engine on a PT2 program (one table)");
  sub->add_option("program", args->program, "PT2 archive written by torch.export.save")->required();
  sub->add_option("--weights", args->weights, "checkpoint loaded to the device and read in place");
  sub->add_option("--batch", args->batch, "dim 0 of every user input (default: the example)");
  sub->add_option("--iters", args->iters, "timed runs per row (median)")->check(CLI::Range(1, 100000));
  sub->add_option("--device", args->device, "cuda:N");
  CLI::Option* cache_dir = sub->add_option("--cache-dir", args->cache_dir,
                                           "compile cache directory (default: a temporary one, removed after the run)");
  sub->add_flag("--no-cache", args->no_cache, "no persistent compile cache")->excludes(cache_dir);
  sub->add_option("--baselines", args->baselines, "command printing the PyTorch rows (bench/engine_baselines.py)");
  sub->add_flag("--profile", args->profile, "print the compiled plan's per-launch GPU times (debug path)");
  sub->add_option("--attention-workspace-mib", args->attention_workspace_mib,
                  "attention score workspace bound in MiB (0: flash-style kernel only; default 256)")
      ->check(CLI::Range(std::int64_t{0}, std::int64_t{1} << 40));
  sub->add_option("--conv-layout", args->conv_layout,
                  "convolutions' memory format: auto (channels-last on tensor cores), nchw, channels-last")
      ->check(CLI::IsMember({"auto", "nchw", "channels-last"}));
  sub->add_flag("--no-fold-batch-norm", args->no_fold_batch_norm,
                "keep inference batch norms as their own kernels (EngineOptions::fold_batch_norm off)");
  sub->add_flag("--no-attention-tensor-cores", args->no_attention_tensor_cores,
                "bfloat16 attention without the tensor-core flash kernel (EngineOptions::attention_tensor_cores off)");
  sub->add_flag("--no-attention-pointer-arrays", args->no_attention_pointer_arrays,
                "materialized attention over split heads with copies / per-batch GEMMs instead of cuBLASLt "
                "pointer-array batches (EngineOptions::attention_pointer_arrays off)");
  sub->add_flag("--no-cudnn-graph", args->no_cudnn_graph,
                "no cuDNN operation graphs for bfloat16 batch norms (EngineOptions::cudnn_graph_fusion off)");
  sub->add_flag("--no-gemm-epilogue", args->no_gemm_epilogue,
                "no gelu/relu or residual add in cuBLASLt epilogues (EngineOptions::fuse_gemm_epilogue off)");
  sub->add_flag("--no-gemm-autotune", args->no_gemm_autotune,
                "cuBLASLt's first heuristic answer, no timing of candidates (EngineOptions::autotune_gemm off)");
  sub->add_flag("--no-gemm-split", args->no_gemm_split,
                "GEMMs with a misaligned N in one piece, no aligned part + tail + copy "
                "(EngineOptions::split_misaligned_gemm off)");
  sub->add_flag("--no-gemm-row-classes", args->no_gemm_row_classes,
                "a misaligned-N GEMM split into an aligned GEMM + tail into padded rows + one copy, not one "
                "GEMM per class of output rows (EngineOptions::gemm_row_classes off)");
  sub->add_flag("--no-gemm-siblings", args->no_gemm_siblings,
                "linears that read one input (query / key / value) as GEMMs of their own, not one GEMM on "
                "their concatenated weights (EngineOptions::fuse_sibling_gemms off)");
  sub->add_flag("--no-cudnn-attention", args->no_cudnn_attention,
                "bfloat16 attention on the tensor-core kernel, not cuDNN's fused flash-attention engines "
                "(EngineOptions::cudnn_attention off)");
  sub->add_flag("--no-cudnn-attention-masks", args->no_cudnn_attention_masks,
                "masked bfloat16 attention on the tensor-core kernel, not through cuDNN's fused attention "
                "with the mask as its bias (EngineOptions::cudnn_attention_masks off)");
  sub->add_flag("--no-attention-3xtf32", args->no_attention_3xtf32,
                "float32 attention not on the tensor cores in 3xTF32 (EngineOptions::attention_3xtf32 off)");
  sub->add_flag("--no-background-graphs", args->no_background_graphs,
                "the first call builds every cuDNN graph plan before it runs "
                "(EngineOptions::background_graph_plans off)");
  sub->add_flag("--no-background-restore", args->no_background_restore,
                "a warm-cache first call restores the cached cuDNN graph plans before it runs "
                "(EngineOptions::background_graph_restore off)");
  sub->callback([args, &exit_code] {
#ifdef SAFECKPT_HAVE_ENGINE
    exit_code = bench_engine(*args);
#else
    std::fprintf(stderr, "safeckpt bench-engine: this build has no CUDA engine\n");
    exit_code = 2;
#endif
  });
}

}  // namespace safeckpt::cli
