// src/engine/engine.cpp — Engine, CompiledProgram: weights, the per-shape
// plan cache (LRU), stances, NVRTC modules, CUDA-graph capture and replay,
// DLPack in and out.
#include <nvrtc.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <list>
#include <mutex>
#include <set>
#include <string>

#include "engine/conv.hpp"
#include "engine/runtime.hpp"
#include "graph/internal.hpp"
#include "safeckpt/cuda.hpp"

namespace safeckpt::engine {
namespace detail {
namespace {

Unexpected cuda_error(const std::string& what, cudaError_t e) {
  return make_error(ErrorCode::kDevice, what + ": " + cudaGetErrorString(e));
}
#define ENG_CUDA(expr, what)                                                        \
  do {                                                                              \
    cudaError_t e_ = (expr);                                                        \
    if (e_ != cudaSuccess) return ::safeckpt::engine::detail::cuda_error(what, e_); \
  } while (0)

// Restores the caller's current device on scope exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) prev_ = -1;
    ok_ = cudaSetDevice(device) == cudaSuccess;
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  ~DeviceGuard() {
    if (prev_ >= 0) cudaSetDevice(prev_);
  }
  bool ok() const { return ok_; }

 private:
  int prev_ = -1;
  bool ok_ = false;
};

Result<DType> dtype_of(DLDataType t) {
  if (t.lanes != 1) return make_error(ErrorCode::kInvalidArgument, "vector dtypes (lanes != 1) are not tensors here");
  if (t.code == kDLFloat && t.bits == 32) return DType::kFloat32;
  if (t.code == kDLBfloat && t.bits == 16) return DType::kBFloat16;
  if (t.code == kDLInt && t.bits == 64) return DType::kInt64;
  if (t.code == kDLInt && t.bits == 32) return DType::kInt32;
  if (t.code == kDLBool && t.bits == 8) return DType::kBool;
  if (t.code == kDLUInt && t.bits == 8) return DType::kUInt8;
  return make_error(ErrorCode::kInvalidArgument, "DLPack dtype (code " + std::to_string(t.code) + ", bits " +
                                                     std::to_string(t.bits) + ") is not one the engine takes");
}

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

}  // namespace

DeviceBlock::~DeviceBlock() {
  if (p != nullptr) {
    int prev = -1;
    cudaGetDevice(&prev);
    cudaSetDevice(device);
    cudaFree(p);
    if (prev >= 0) cudaSetDevice(prev);
  }
}
Result<std::shared_ptr<DeviceBlock>> device_alloc(int device, std::uint64_t bytes) {
  void* p = nullptr;
  ENG_CUDA(cudaMalloc(&p, std::max<std::uint64_t>(bytes, 256)), "cudaMalloc of " + std::to_string(bytes) + " bytes");
  return std::make_shared<DeviceBlock>(device, p);
}
Module::~Module() {
  if (lib != nullptr) cudaLibraryUnload(lib);
}
GemmDesc::~GemmDesc() {
  if (lc) cublasLtMatrixLayoutDestroy(lc);
  if (lb) cublasLtMatrixLayoutDestroy(lb);
  if (la) cublasLtMatrixLayoutDestroy(la);
  if (op) cublasLtMatmulDescDestroy(op);
}
Plan::~Plan() {
  if (exec != nullptr) cudaGraphExecDestroy(exec);
}
EngineImpl::~EngineImpl() {
  modules.clear();
  if (lt != nullptr) cublasLtDestroy(lt);
}

Result<std::vector<std::uint8_t>> nvrtc_compile(const std::string& source, int sm) {
  auto nv_fail = [](const char* what, nvrtcResult r) {
    return make_error(ErrorCode::kDevice, std::string("NVRTC ") + what + ": " + nvrtcGetErrorString(r));
  };
  nvrtcProgram prog = nullptr;
  nvrtcResult r = nvrtcCreateProgram(&prog, source.c_str(), "safeckpt_fused.cu", 0, nullptr, nullptr);
  if (r != NVRTC_SUCCESS) return nv_fail("create", r);
  const std::vector<std::string> opts = nvrtc_options(sm);
  std::vector<const char*> argv;
  argv.reserve(opts.size());
  for (const auto& o : opts) argv.push_back(o.c_str());
  r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  if (r != NVRTC_SUCCESS) {
    std::size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    std::string log(n, '\0');
    nvrtcGetProgramLog(prog, log.data());
    nvrtcDestroyProgram(&prog);
    if (r != NVRTC_ERROR_COMPILATION) return nv_fail("compile", r);
    return make_error(ErrorCode::kInternal,
                      "NVRTC rejected a generated kernel (a bug in src/engine/fused.cpp): " + log.substr(0, 3000));
  }
  std::size_t n = 0;
  r = nvrtcGetCUBINSize(prog, &n);
  std::vector<std::uint8_t> cubin(n);
  if (r == NVRTC_SUCCESS) r = nvrtcGetCUBIN(prog, reinterpret_cast<char*>(cubin.data()));
  nvrtcDestroyProgram(&prog);
  if (r != NVRTC_SUCCESS) return nv_fail("get cubin", r);
  return cubin;
}

void EngineImpl::warn(std::string w, ModuleLookup* out) {
  if (stats.warnings.size() < kMaxCacheWarnings)
    stats.warnings.push_back(w);
  else
    ++stats.warnings_dropped;
  if (out != nullptr) out->warnings.push_back(std::move(w));
}

Result<std::shared_ptr<Module>> EngineImpl::module_for(const std::string& source, ModuleLookup* out) {
  std::lock_guard<std::mutex> lock(mu);
  *out = {};
  auto it = modules.find(source);
  if (it != modules.end()) return it->second;
  auto m = std::make_shared<Module>();
  enginecache::CacheKey key;
  if (cache) {
    key = module_cache_key(source, facts);
    auto found = cache->load(key);
    const std::vector<std::uint8_t>* cubin = nullptr;
    if (!found) {
      warn("compile cache: " + found.error().to_string() + "; compiling", out);
    } else if (found->status == enginecache::CacheLookup::Status::kIgnored) {
      warn("compile cache: " + found->warning + "; compiling again", out);
    } else if (found->status == enginecache::CacheLookup::Status::kHit) {
      cubin = module_cubin(*found->entry);
      if (cubin == nullptr)
        warn("compile cache: " + cache->entry_path(key).string() + " has no cubin; compiling again", out);
    }
    if (cubin != nullptr) {
      cudaError_t e = cudaLibraryLoadData(&m->lib, cubin->data(), nullptr, nullptr, 0, nullptr, nullptr, 0);
      if (e == cudaSuccess) {
        out->hit = true;
        ++stats.cache_hits;
        modules.emplace(source, m);
        return m;
      }
      (void)cudaGetLastError();  // not sticky; clear it for the launches that follow
      m->lib = nullptr;
      warn("compile cache: " + cache->entry_path(key).string() + ": the driver refused the cached cubin (" +
               cudaGetErrorString(e) + "); compiling again",
           out);
    }
    out->miss = true;
    ++stats.cache_misses;
  }
  SAFECKPT_TRY(auto cubin, nvrtc_compile(source, sm));
  out->compiled = true;
  ++stats.modules_compiled;
  ENG_CUDA(cudaLibraryLoadData(&m->lib, cubin.data(), nullptr, nullptr, 0, nullptr, nullptr, 0),
           "loading a generated module");
  modules.emplace(source, m);
  if (cache) {
    auto st = cache->store(module_cache_entry(key, std::move(cubin)));
    if (!st) {
      warn("compile cache: not stored: " + st.error().to_string(), out);
    } else {
      out->stored = true;
      ++stats.cache_stores;
      for (auto& w : st->warnings) warn("compile cache: " + w, out);
    }
  }
  return m;
}

std::optional<std::vector<std::uint8_t>> EngineImpl::find_choice(const std::string& choice, bool* from_cache) {
  std::lock_guard<std::mutex> lock(mu);
  *from_cache = false;
  if (auto it = choices.find(choice); it != choices.end()) return it->second;
  if (!cache) return std::nullopt;
  const enginecache::CacheKey key = choice_cache_key(choice, facts);
  auto found = cache->load(key);
  if (!found) {  // a read error: a miss with a warning, as in module_for
    warn("compile cache: " + found.error().to_string() + "; choosing again", nullptr);
    return std::nullopt;
  }
  if (found->status != enginecache::CacheLookup::Status::kHit) {
    if (found->status == enginecache::CacheLookup::Status::kIgnored)
      warn("compile cache: " + found->warning + "; choosing again", nullptr);
    return std::nullopt;
  }
  auto b = found->entry->blobs.find(kChoiceBlob);
  if (b == found->entry->blobs.end() || b->second.empty()) {
    warn("compile cache: " + cache->entry_path(key).string() + " has no choice; choosing again", nullptr);
    return std::nullopt;
  }
  *from_cache = true;
  ++stats.choices_from_cache;
  choices.emplace(choice, b->second);
  return b->second;
}

void EngineImpl::store_choice(const std::string& choice, std::vector<std::uint8_t> bytes) {
  std::lock_guard<std::mutex> lock(mu);
  choices[choice] = bytes;
  if (!cache) return;
  enginecache::CacheEntry e;
  e.key = choice_cache_key(choice, facts);
  e.blobs.emplace(kChoiceBlob, std::move(bytes));
  auto st = cache->store(e);
  if (!st) {
    warn("compile cache: choice not stored: " + st.error().to_string(), nullptr);
  } else {
    ++stats.choices_stored;
  }
}

bool EngineImpl::claim_build(const std::string& choice) {
  std::unique_lock<std::mutex> lock(mu);
  if (building.insert(choice).second) return true;
  building_done.wait(lock, [&] { return building.count(choice) == 0; });
  return false;
}

void EngineImpl::end_build(const std::string& choice) {
  {
    std::lock_guard<std::mutex> lock(mu);
    building.erase(choice);
  }
  building_done.notify_all();
}

Result<DryPlan> dry_plan(const graph::Program& program, const std::vector<std::vector<std::int64_t>>& shapes, bool fuse,
                         int sm, const EngineOptions& opt) {
  EngineImpl eng;
  eng.sm = sm;
  eng.opt = opt;
  std::vector<std::optional<DevTensor>> weights(program.values.size());
  std::vector<std::pair<std::int32_t, DevTensor>> inputs;
  std::unordered_map<std::string, std::int64_t> symbols;
  Plan plan;
  std::size_t k = 0;
  for (const auto& in : program.inputs) {
    const auto& m = program.values[static_cast<std::size_t>(in.value)];
    DevTensor t;
    t.dtype = m.dtype;
    if (in.kind != graph::InputKind::kUserInput) {
      for (const auto& s : m.sizes) t.shape.push_back(s.value);
      t.strides = contiguous_strides(t.shape);
      weights[static_cast<std::size_t>(in.value)] = t;
      continue;
    }
    if (k >= shapes.size()) return make_error(ErrorCode::kInvalidArgument, "dry_plan: too few input shapes");
    t.shape = shapes[k++];
    t.strides = contiguous_strides(t.shape);
    for (std::size_t d = 0; d < m.sizes.size() && d < t.shape.size(); ++d)
      if (m.sizes[d].is_symbolic()) {
        std::string sym =
            graph::detail::single_symbol(program.sym_values[static_cast<std::size_t>(m.sizes[d].sym)].expr);
        if (!sym.empty()) symbols[sym] = t.shape[d];
      }
    Buf b;
    b.kind = BufKind::kInput;
    b.bytes = t.numel() * dtype_size(t.dtype);
    plan.bufs.push_back(b);
    t.buf = static_cast<std::int32_t>(plan.bufs.size() - 1);
    inputs.emplace_back(in.value, t);
  }
  SAFECKPT_CHECK(build_plan(program, eng, weights, inputs, symbols, fuse, plan));
  DryPlan out;
  for (const auto& s : plan.steps) {
    out.steps.push_back(s.name);
    out.step_kinds.push_back(s.kind);
    out.step_shapes.push_back(s.shapes);
  }
  for (const auto& s : plan.prep_steps) out.prep_steps.push_back(s.name);
  out.prepared_bytes = plan.prepared_bytes;
  out.arena_bytes = plan.arena_bytes;
  out.arena_live_bytes = plan.arena_live_bytes;
  out.fused_kernels = plan.fused.size();
  out.fused_launches = plan.fused_launches;
  out.convs = plan.convs;
  out.source = fused_source(plan.fused);
  // Sources NVRTC already accepted in this process, per architecture: the text
  // carries op codes, dtypes and ranks only (sizes are kernel parameters), so
  // shapes whose collapsed iteration spaces have the same ranks share one
  // compile.
  static std::mutex accepted_mu;
  static std::set<std::string> accepted;
  const std::string key = std::to_string(sm) + "\n" + out.source;
  {
    std::lock_guard<std::mutex> lock(accepted_mu);
    if (accepted.count(key) != 0) return out;
  }
  if (!plan.fused.empty()) {
    SAFECKPT_CHECK(nvrtc_compile(out.source, sm));
    std::lock_guard<std::mutex> lock(accepted_mu);
    accepted.insert(key);
  }
  return out;
}

int launch_fused(void* function, const FusedParams& p, void* stream) {
  void* args[] = {const_cast<FusedParams*>(&p)};
  return cudaLaunchKernel(function, dim3(fused_grid_blocks(p.n)), dim3(kFusedBlockThreads), args, 0,
                          static_cast<cudaStream_t>(stream));
}

// ------------------------------------------------------------------ program

struct ProgramImpl {
  ProgramImpl() = default;
  ProgramImpl(const ProgramImpl&) = delete;
  ProgramImpl& operator=(const ProgramImpl&) = delete;
  ~ProgramImpl() {
    DeviceGuard g(eng->opt.device);
    lru.clear();
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  std::shared_ptr<EngineImpl> eng;
  graph::Program prog;
  std::vector<std::optional<DevTensor>> weights;  // by value id
  std::shared_ptr<DeviceBlock> weight_block;
  std::optional<cuda::DeviceCheckpoint> ckpt;
  // Streaming start: weights still landing; `weights_landed` once the
  // transfer succeeded (under mu, like everything a run touches).
  std::shared_ptr<const cuda::PendingDeviceCheckpoint> pending;
  bool weights_landed = true;
  cudaStream_t stream = nullptr;
  std::mutex mu;
  // Most recently used first: key = mode + shapes.
  std::list<std::pair<std::string, std::shared_ptr<Plan>>> lru;
  std::optional<std::vector<std::vector<std::int64_t>>> first_shapes;
  std::map<std::string, int> seen;  // eager_then_compile: calls per shape
  ProgramStats stats;
  std::vector<std::size_t> user_inputs;  // indices into prog.inputs

  Result<std::shared_ptr<Plan>> get_plan(const std::string& key, bool compiled,
                                         const std::vector<std::vector<std::int64_t>>& shapes,
                                         const std::unordered_map<std::string, std::int64_t>& symbols);
  Status execute(Plan& plan);
  // EngineOptions::background_graph_plans: puts the plan's finished
  // background graph plans in (`wait`: waits for them first); nothing while
  // they are still being built, or when there are none. mu held.
  Status install_graphs(Plan& plan, bool wait);
  Result<Profile> profile(Plan& plan, const ProfileOptions& o);
};

Result<std::shared_ptr<Plan>> ProgramImpl::get_plan(const std::string& key, bool compiled,
                                                    const std::vector<std::vector<std::int64_t>>& shapes,
                                                    const std::unordered_map<std::string, std::int64_t>& symbols) {
  for (auto it = lru.begin(); it != lru.end(); ++it)
    if (it->first == key) {
      lru.splice(lru.begin(), lru, it);
      return lru.front().second;
    }
  auto t0 = std::chrono::steady_clock::now();
  auto plan = std::make_shared<Plan>();
  plan->started = t0;
  plan->compiled = compiled;
  plan->input_shapes = shapes;
  // Fixed input buffers.
  std::uint64_t io_bytes = 0;
  std::vector<std::uint64_t> in_off;
  for (std::size_t i = 0; i < user_inputs.size(); ++i) {
    const auto& in = prog.inputs[user_inputs[i]];
    DevTensor t;
    t.dtype = prog.values[static_cast<std::size_t>(in.value)].dtype;
    t.shape = shapes[i];
    t.strides = contiguous_strides(t.shape);
    Buf b;
    b.kind = BufKind::kInput;
    b.bytes = std::max<std::uint64_t>(t.numel() * dtype_size(t.dtype), 1);
    plan->bufs.push_back(b);
    t.buf = static_cast<std::int32_t>(plan->bufs.size() - 1);
    plan->inputs.emplace_back(in.value, t);
  }
  const auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  auto t_phase = std::chrono::steady_clock::now();
  SAFECKPT_CHECK(build_plan(prog, *eng, weights, plan->inputs, symbols, compiled, *plan));
  plan->lowering_seconds = since(t_phase);
  t_phase = std::chrono::steady_clock::now();
  // Allocate: arena; inputs + outputs in one block; workspace + flag.
  for (auto& b : plan->bufs)
    if (b.kind == BufKind::kInput || b.kind == BufKind::kOutput) {
      in_off.push_back(io_bytes);
      io_bytes += (b.bytes + 255) / 256 * 256;
    }
  SAFECKPT_TRY(plan->arena, device_alloc(eng->opt.device, plan->arena_bytes));
  SAFECKPT_TRY(plan->io, device_alloc(eng->opt.device, io_bytes));
  SAFECKPT_TRY(plan->scratch, device_alloc(eng->opt.device, plan->workspace_bytes + 256));
  if (plan->prepared_bytes > 0) {
    SAFECKPT_TRY(plan->prep, device_alloc(eng->opt.device, plan->prepared_bytes));
  }
  plan->device_bytes = plan->arena_bytes + io_bytes + plan->prepared_bytes + plan->workspace_bytes + 256;
  plan->workspace = plan->scratch->p;
  plan->error_flag = reinterpret_cast<int*>(static_cast<char*>(plan->scratch->p) + plan->workspace_bytes);
  std::size_t k = 0;
  for (auto& b : plan->bufs) {
    if (b.kind == BufKind::kArena) b.ptr = static_cast<char*>(plan->arena->p) + b.offset;
    if (b.kind == BufKind::kPrepared) b.ptr = static_cast<char*>(plan->prep->p) + b.offset;
    if (b.kind == BufKind::kInput || b.kind == BufKind::kOutput) b.ptr = static_cast<char*>(plan->io->p) + in_off[k++];
  }
  plan->alloc_seconds = since(t_phase);
  t_phase = std::chrono::steady_clock::now();
  // Generated kernels: one module per distinct source.
  if (!plan->fused.empty()) {
    std::string src = fused_source(plan->fused);
    ModuleLookup how;
    SAFECKPT_TRY(plan->module, eng->module_for(src, &how));
    if (how.compiled) stats.kernels_compiled += plan->fused.size();
    stats.cache_hits += how.hit ? 1 : 0;
    stats.cache_misses += how.miss ? 1 : 0;
    stats.cache_stores += how.stored ? 1 : 0;
    for (auto& w : how.warnings)
      if (stats.cache_warnings.size() < kMaxCacheWarnings) stats.cache_warnings.push_back(std::move(w));
    for (const auto& f : plan->fused) {
      cudaKernel_t fn = nullptr;
      ENG_CUDA(cudaLibraryGetKernel(&fn, plan->module->lib, f.name.c_str()), "cudaLibraryGetKernel " + f.name);
      plan->fns.push_back(fn);
    }
  }
  plan->module_seconds = since(t_phase);
  plan->compile_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats.gemm_heuristics += plan->gemm_heuristics;
  stats.gemm_heuristics_reused += plan->gemm_heuristics_reused;
  ++stats.plans_built;
  lru.emplace_front(key, plan);
  while (lru.size() > eng->opt.max_plans) {
    lru.pop_back();
    ++stats.evictions;
  }
  return plan;
}

// A step's return code as a Status.
Status step_status(const Step& s, int rc) {
  if (rc >= kDnnStatusBase)
    return make_error(ErrorCode::kDevice, "step '" + s.name + "': cuDNN " + dnn_status_string(rc - kDnnStatusBase));
  if (rc >= 1000)
    return make_error(ErrorCode::kDevice, "step '" + s.name + "': cuBLASLt " +
                                              cublasLtGetStatusString(static_cast<cublasStatus_t>(rc - 1000)));
  if (rc != 0) return cuda_error("step '" + s.name + "'", static_cast<cudaError_t>(rc));
  return {};
}

Status ProgramImpl::install_graphs(Plan& plan, bool wait) {
  if (!plan.pending_graphs || (!wait && !plan.pending_graphs->ready())) return {};
  GraphFill& f = plan.pending_graphs->wait();
  // A plan that needs more workspace than the plan has: a larger block (no
  // run is in flight between runs; the CUDA graph is captured after this),
  // else those plans are dropped and their steps keep the fallback.
  std::uint64_t need = plan.workspace_bytes;
  for (const auto& m : f.made)
    if (m) need = std::max(need, graph_conv_workspace_bytes(*m));
  Status grown;
  if (need > plan.workspace_bytes) {
    auto block = device_alloc(eng->opt.device, need + 256);
    if (block) {
      plan.device_bytes += need - plan.workspace_bytes;
      plan.scratch = *block;
      plan.workspace = plan.scratch->p;
      plan.error_flag = reinterpret_cast<int*>(static_cast<char*>(plan.scratch->p) + need);
    } else {
      grown = make_error(block.error().code(), "cuDNN graph plans not installed: " + block.error().message());
      for (auto& m : f.made)
        if (m && graph_conv_workspace_bytes(*m) > plan.workspace_bytes) m.reset();
    }
  }
  std::vector<std::string> warnings;
  SAFECKPT_CHECK(apply_graph_fill(plan, f, true, warnings));
  plan.pending_graphs.reset();
  plan.dnn_graphs_ready_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - plan.started).count();
  {
    std::lock_guard<std::mutex> lock(eng->mu);
    for (auto& w : warnings) eng->warn(std::move(w), nullptr);
  }
  return grown;
}

Status ProgramImpl::execute(Plan& plan) {
  SAFECKPT_CHECK(install_graphs(plan, false));
  // Streaming start: every weight landed (once true, never asked again).
  auto all_weights = [&]() -> Status {
    if (weights_landed) return {};
    SAFECKPT_CHECK(pending->wait_all());
    weights_landed = true;
    return {};
  };
  // The plan's weight copies, before anything reads them (same stream).
  if (!plan.prepared) {
    for (const auto& s : plan.prep_steps) {
      if (!weights_landed)
        for (const void* w : s.weights)
          if (auto storage = pending->storage_at(w)) SAFECKPT_CHECK(pending->wait(*storage));
      SAFECKPT_CHECK(step_status(s, s.fn(stream)));
    }
    plan.prepared = true;
  }
  auto launch_steps = [&](bool wait_weights) -> Status {
    ENG_CUDA(cudaMemsetAsync(plan.error_flag, 0, sizeof(int), stream), "cudaMemsetAsync");
    for (const auto& s : plan.steps) {
      // Eager with weights still landing: this step's own weights first.
      if (wait_weights && !weights_landed)
        for (const void* w : s.weights)
          if (auto storage = pending->storage_at(w)) SAFECKPT_CHECK(pending->wait(*storage));
      SAFECKPT_CHECK(step_status(s, s.fn(stream)));
    }
    return {};
  };
  // cuDNN graph steps whose first call cuDNN refused (Plan::dnn_refusals).
  auto warn_dnn_refusals = [&] {
    if (const int n = plan.dnn_refusals.exchange(0); n > 0)
      eng->warn(std::to_string(n) + " cuDNN graph step(s) refused by cuDNN on their first call; they run " +
                    "their fallback (the attention kernel, or the unfused convolution)",
                nullptr);
  };
  // A compiled plan times its GEMMs once, before its first run, on every
  // weight (landed).
  if (plan.compiled && !plan.tunes.empty()) {
    SAFECKPT_CHECK(all_weights());
    SAFECKPT_CHECK(tune_gemms(plan, *eng, stream));
  }
  if (!plan.compiled || plan.pending_graphs) {
    // Step by step: eager plans, and compiled ones whose cuDNN graphs are
    // still being built (those steps on their fallback; the graph is
    // captured once they are in).
    SAFECKPT_CHECK(launch_steps(true));
    warn_dnn_refusals();
    SAFECKPT_CHECK(all_weights());  // no output unless every weight landed
    ++(plan.compiled ? stats.background_runs : stats.eager_runs);
  } else {
    if (plan.exec == nullptr) {
      auto t0 = std::chrono::steady_clock::now();
      // cuDNN may load or build kernels on a convolution's first run, which
      // is not allowed inside a stream capture: run the steps once first (as
      // torch.compile's CUDA graphs warm up before recording).
      if (plan.warmup_before_capture) {
        SAFECKPT_CHECK(launch_steps(true));
        ENG_CUDA(cudaStreamSynchronize(stream), "warm-up run before capture");
        warn_dnn_refusals();
      }
      ENG_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
      Status st = launch_steps(false);  // captured, not run: addresses only
      cudaGraph_t graph = nullptr;
      cudaError_t e = cudaStreamEndCapture(stream, &graph);
      if (!st) {
        if (graph) cudaGraphDestroy(graph);
        return st;
      }
      if (e != cudaSuccess) return cuda_error("cudaStreamEndCapture", e);
      e = cudaGraphInstantiate(&plan.exec, graph, 0);
      cudaGraphDestroy(graph);
      if (e != cudaSuccess) return cuda_error("cudaGraphInstantiate", e);
      plan.capture_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      plan.compile_seconds += plan.capture_seconds;
    }
    SAFECKPT_CHECK(all_weights());
    ENG_CUDA(cudaGraphLaunch(plan.exec, stream), "cudaGraphLaunch");
    ++stats.graph_replays;
  }
  int flag = 0;
  ENG_CUDA(cudaMemcpyAsync(&flag, plan.error_flag, sizeof flag, cudaMemcpyDeviceToHost, stream), "error flag");
  ENG_CUDA(cudaStreamSynchronize(stream), "running the program");
  if (flag != 0) {
    std::string names;
    for (const auto& n : plan.checked_nodes) names += (names.empty() ? "" : ", ") + n;
    return make_error(ErrorCode::kMalformed,
                      "an index is out of range in an indexing op (" + names + "); the outputs are not returned");
  }
  return {};
}

// Events owned for one profile.
struct Events {
  Events() = default;
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  ~Events() {
    for (auto e : ev) cudaEventDestroy(e);
  }
  std::vector<cudaEvent_t> ev;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result<Profile> ProgramImpl::profile(Plan& plan, const ProfileOptions& o) {
  if (o.warmup < 1 || o.warmup > 1000 || o.iters < 1 || o.iters > 100000)
    return make_error(ErrorCode::kInvalidArgument, "profile: warmup must be 1..1000 and iters 1..100000");
  SAFECKPT_CHECK(install_graphs(plan, true));  // the plan as it will stay
  // Streaming start: profiles time compute, not the transfer.
  if (!weights_landed) {
    SAFECKPT_CHECK(pending->wait_all());
    weights_landed = true;
  }
  if (!plan.prepared) {
    for (const auto& s : plan.prep_steps) SAFECKPT_CHECK(step_status(s, s.fn(stream)));
    plan.prepared = true;
  }
  SAFECKPT_CHECK(tune_gemms(plan, *eng, stream));  // the algorithms its graph replays would use
  const std::size_t n = plan.steps.size();
  Events events;
  for (std::size_t i = 0; i <= n; ++i) {
    cudaEvent_t e = nullptr;
    ENG_CUDA(cudaEventCreate(&e), "cudaEventCreate");
    events.ev.push_back(e);
  }
  auto flag_check = [&]() -> Status {
    int flag = 0;
    ENG_CUDA(cudaMemcpyAsync(&flag, plan.error_flag, sizeof flag, cudaMemcpyDeviceToHost, stream), "error flag");
    ENG_CUDA(cudaStreamSynchronize(stream), "profiling the program");
    if (flag != 0)
      return make_error(ErrorCode::kMalformed, "an index is out of range in an indexing op while profiling");
    return {};
  };
  auto one_run = [&](bool timed) -> Status {
    ENG_CUDA(cudaMemsetAsync(plan.error_flag, 0, sizeof(int), stream), "cudaMemsetAsync");
    if (timed) ENG_CUDA(cudaEventRecord(events.ev[0], stream), "cudaEventRecord");
    for (std::size_t i = 0; i < n; ++i) {
      SAFECKPT_CHECK(step_status(plan.steps[i], plan.steps[i].fn(stream)));
      if (timed) ENG_CUDA(cudaEventRecord(events.ev[i + 1], stream), "cudaEventRecord");
    }
    return flag_check();
  };
  for (int i = 0; i < o.warmup; ++i) SAFECKPT_CHECK(one_run(false));
  std::vector<std::vector<double>> t(n);
  std::vector<double> whole;
  for (int it = 0; it < o.iters; ++it) {
    SAFECKPT_CHECK(one_run(true));
    for (std::size_t i = 0; i < n; ++i) {
      float ms = 0;
      ENG_CUDA(cudaEventElapsedTime(&ms, events.ev[i], events.ev[i + 1]), "cudaEventElapsedTime");
      t[i].push_back(ms);
    }
    float ms = 0;
    ENG_CUDA(cudaEventElapsedTime(&ms, events.ev[0], events.ev[n]), "cudaEventElapsedTime");
    whole.push_back(ms);
  }
  Profile p;
  p.iters = o.iters;
  p.whole_ms = median(whole);
  for (std::size_t i = 0; i < n; ++i) {
    StepProfile sp;
    sp.name = plan.steps[i].name;
    sp.kind = plan.steps[i].kind.empty() ? "other" : plan.steps[i].kind;
    sp.shapes = plan.steps[i].shapes;
    sp.ms = median(t[i]);
    p.steps_ms += sp.ms;
    p.ms_by_kind[sp.kind] += sp.ms;
    p.steps.push_back(std::move(sp));
  }
  for (auto& sp : p.steps) sp.percent = p.steps_ms > 0 ? 100.0 * sp.ms / p.steps_ms : 0;
  std::stable_sort(p.steps.begin(), p.steps.end(),
                   [](const StepProfile& a, const StepProfile& b) { return a.ms > b.ms; });
  p.launches = n;
  if (plan.compiled) {
    // The plan as run() runs it: one captured graph, timed per replay.
    SAFECKPT_CHECK(execute(plan));
    std::vector<double> g;
    for (int it = 0; it < o.iters; ++it) {
      ENG_CUDA(cudaMemsetAsync(plan.error_flag, 0, sizeof(int), stream), "cudaMemsetAsync");
      ENG_CUDA(cudaEventRecord(events.ev[0], stream), "cudaEventRecord");
      ENG_CUDA(cudaGraphLaunch(plan.exec, stream), "cudaGraphLaunch");
      ENG_CUDA(cudaEventRecord(events.ev[1], stream), "cudaEventRecord");
      SAFECKPT_CHECK(flag_check());
      float ms = 0;
      ENG_CUDA(cudaEventElapsedTime(&ms, events.ev[0], events.ev[1]), "cudaEventElapsedTime");
      g.push_back(ms);
    }
    p.graph_ms = median(g);
  }
  return p;
}

}  // namespace detail

using detail::DevTensor;
using detail::ProgramImpl;

Result<ConvLayout> parse_conv_layout(std::string_view text) {
  if (text == "auto") return ConvLayout::kAuto;
  if (text == "nchw") return ConvLayout::kNchw;
  if (text == "channels-last") return ConvLayout::kChannelsLast;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown convolution layout '" + std::string(text) + "': expected auto, nchw or channels-last");
}

// ------------------------------------------------------------------- Engine

Engine::Engine(std::shared_ptr<detail::EngineImpl> impl) : impl_(std::move(impl)) {}
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;
Engine::~Engine() = default;
const EngineOptions& Engine::options() const noexcept {
  return impl_->opt;
}
EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stats;
}

Result<Engine> Engine::create(const EngineOptions& options) {
  if (options.max_plans < 1 || options.max_plans > 4096)
    return make_error(ErrorCode::kInvalidArgument, "max_plans must be in [1, 4096]");
  auto impl = std::make_shared<detail::EngineImpl>();
  impl->opt = options;
  // An explicit directory is opened before the device is looked at (its
  // problems are the caller's, reported everywhere); the default one after
  // (a process without the device creates nothing under ~/.cache).
  auto open_cache = [&]() -> Status {
    enginecache::CacheOptions co;
    co.dir = options.cache_dir;
    auto c = enginecache::CompileCache::open(co);
    if (c) {
      impl->cache.emplace(std::move(c).value());
      impl->stats.cache_dir = impl->cache->dir();
    } else if (!options.cache_dir.empty()) {
      return make_error(c.error().code(), "compile cache " + options.cache_dir.string() + ": " + c.error().message());
    } else {
      impl->warn("compile cache off: " + c.error().to_string(), nullptr);
    }
    return {};
  };
  const bool use_cache = options.cache == CacheMode::kReadWrite;
  if (use_cache && !options.cache_dir.empty()) SAFECKPT_CHECK(open_cache());
  int n = cuda::device_count();
  if (options.device < 0 || options.device >= n)
    return make_error(ErrorCode::kDevice,
                      "no CUDA device " + std::to_string(options.device) + " (" + std::to_string(n) + " found)");
  detail::DeviceGuard g(options.device);
  if (!g.ok()) return make_error(ErrorCode::kDevice, "cudaSetDevice failed");
  int major = 0, minor = 0;
  ENG_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, options.device), "device attribute");
  ENG_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, options.device), "device attribute");
  impl->sm = major * 10 + minor;
  if (use_cache && options.cache_dir.empty()) SAFECKPT_CHECK(open_cache());
  if (impl->cache) {
    cudaDeviceProp prop{};
    ENG_CUDA(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
    impl->facts.name = prop.name;
    impl->facts.sm = static_cast<std::uint32_t>(impl->sm);
    ENG_CUDA(cudaDriverGetVersion(&impl->facts.driver_version), "cudaDriverGetVersion");
    ENG_CUDA(cudaRuntimeGetVersion(&impl->facts.runtime_version), "cudaRuntimeGetVersion");
    impl->facts.nvrtc_version = detail::nvrtc_key_version(CUDART_VERSION);
  }
  cublasStatus_t st = cublasLtCreate(&impl->lt);
  if (st != CUBLAS_STATUS_SUCCESS)
    return make_error(ErrorCode::kDevice, std::string("cublasLtCreate: ") + cublasLtGetStatusString(st));
  return Engine(std::move(impl));
}

namespace {

Status check_validated(const graph::Program& program) {
  for (const auto& n : program.nodes)
    if (n.schema == nullptr)
      return make_error(ErrorCode::kInvalidArgument,
                        "program not validated (node '" + n.name + "'): call graph::validate() first");
  return {};
}

Status check_weight(const graph::Program& p, const graph::GraphInput& in, DType d,
                    const std::vector<std::int64_t>& shape) {
  const auto& m = p.values[static_cast<std::size_t>(in.value)];
  bool ok = m.dtype == d && m.sizes.size() == shape.size();
  for (std::size_t i = 0; ok && i < shape.size(); ++i) ok = !m.sizes[i].is_symbolic() && m.sizes[i].value == shape[i];
  if (!ok)
    return make_error(ErrorCode::kInvalidArgument, "weight '" + in.fqn + "' is " + std::string(dtype_name(d)) +
                                                       detail::shape_str(shape) +
                                                       "; the program takes another dtype/shape");
  return {};
}

// Uploads host weights (identical tensors once: tied weights).
// Weights of at least this many bytes are uploaded through a TransferEngine.
constexpr std::uint64_t kPinnedUploadBytes = 64ull << 20;

Status upload(detail::ProgramImpl& pi, const graph::Program& p, const graph::WeightMap& weights,
              const std::vector<std::size_t>& which) {
  std::vector<std::size_t> slot_of(which.size());
  std::vector<const graph::HostTensor*> uniq;
  std::vector<std::uint64_t> offs;
  std::uint64_t total = 0;
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < which.size(); ++i) {
    const auto& in = p.inputs[which[i]];
    auto it = weights.find(in.fqn);
    if (it == weights.end()) {
      missing.push_back(in.fqn);
      continue;
    }
    const graph::HostTensor& t = it->second;
    SAFECKPT_CHECK(check_weight(p, in, t.dtype, t.shape));
    std::size_t found = uniq.size();
    for (std::size_t u = 0; u < uniq.size(); ++u) {
      const auto* o = uniq[u];
      if (o->data == t.data ||
          (o->dtype == t.dtype && o->shape == t.shape && o->data && t.data && o->data->size() == t.data->size() &&
           std::memcmp(o->data->data(), t.data->data(), t.data->size()) == 0)) {
        found = u;
        break;
      }
    }
    if (found == uniq.size()) {
      uniq.push_back(&t);
      offs.push_back(total);
      total += (t.bytes().size() + 255) / 256 * 256;
    }
    slot_of[i] = found;
  }
  if (!missing.empty()) {
    std::string m;
    for (const auto& s : missing) m += (m.empty() ? "" : ", ") + s;
    return make_error(ErrorCode::kInvalidArgument, "weights missing: " + m);
  }
  if (which.empty()) return {};
  const auto t0 = std::chrono::steady_clock::now();
  SAFECKPT_TRY(pi.weight_block, detail::device_alloc(pi.eng->opt.device, total));
  pi.stats.weight_bytes += total;
  // Real-size weights through the transfer engine (host_bytes sources: 16
  // threads staging into its pinned ring, copies on 4 streams); one pageable
  // cudaMemcpy per tensor moved GPT-2 124M's 475 MiB at ~7 GB/s on the H200
  // (bench/RESULTS.md). Small programs keep the plain copies (no ring to pin).
  bool staged = false;
  if (total >= kPinnedUploadBytes) {
    cuda::TransferOptions to;
    to.device = pi.eng->opt.device;
    to.verify_crc = false;  // host memory the archive reader checked already
    auto te = cuda::TransferEngine::create(to);
    if (te) {
      std::vector<cuda::PlacedSource> ps;
      ps.reserve(uniq.size());
      for (std::size_t u = 0; u < uniq.size(); ++u) {
        cuda::PlacedSource src;
        src.source.nbytes = uniq[u]->bytes().size();
        src.source.host_bytes = uniq[u]->bytes().data();
        src.device_offset = offs[u];
        ps.push_back(src);
      }
      auto st = te->load_into({}, ps, pi.weight_block->p, total);
      staged = st.has_value();  // else: the plain copies below
    }
  }
  for (std::size_t u = 0; !staged && u < uniq.size(); ++u)
    ENG_CUDA(cudaMemcpy(static_cast<char*>(pi.weight_block->p) + offs[u], uniq[u]->bytes().data(),
                        uniq[u]->bytes().size(), cudaMemcpyHostToDevice),
             "uploading weights");
  pi.stats.weight_upload_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (std::size_t i = 0; i < which.size(); ++i) {
    const auto& in = p.inputs[which[i]];
    const auto* t = uniq[slot_of[i]];
    DevTensor d;
    d.dtype = t->dtype;
    d.shape = t->shape;
    d.strides = detail::contiguous_strides(t->shape);
    d.direct = static_cast<char*>(pi.weight_block->p) + offs[slot_of[i]];
    pi.weights[static_cast<std::size_t>(in.value)] = d;
  }
  return {};
}

Result<std::unique_ptr<ProgramImpl>> make_program(const std::shared_ptr<detail::EngineImpl>& eng,
                                                  const graph::Program& program) {
  SAFECKPT_CHECK(check_validated(program));
  auto pi = std::make_unique<ProgramImpl>();
  pi->eng = eng;
  pi->prog = program;
  pi->weights.resize(program.values.size());
  for (std::size_t i = 0; i < program.inputs.size(); ++i)
    if (program.inputs[i].kind == graph::InputKind::kUserInput) pi->user_inputs.push_back(i);
  ENG_CUDA(cudaStreamCreateWithFlags(&pi->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  return pi;
}

// Binds the program's parameters and buffers by state_dict name to
// `weights` (in place); constants and non-persistent buffers it lacks come
// from `fallback` (uploaded).
Status bind_device_weights(ProgramImpl& pi_ref, const graph::Program& program, const cuda::DeviceCheckpoint& weights,
                           const graph::WeightMap* fallback) {
  ProgramImpl* pi = &pi_ref;
  std::map<std::string, cuda::DeviceTensor, std::less<>> by_name;
  for (auto& t : weights.tensors()) by_name.emplace(t.name, t);
  std::vector<std::size_t> rest;
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < program.inputs.size(); ++i) {
    const auto& in = program.inputs[i];
    if (in.kind == graph::InputKind::kUserInput) continue;
    auto it = by_name.find(in.fqn);
    if (it == by_name.end()) {
      bool fb = fallback != nullptr && fallback->count(in.fqn) != 0 &&
                (in.kind == graph::InputKind::kConstant || (in.kind == graph::InputKind::kBuffer && !in.persistent));
      if (fb)
        rest.push_back(i);
      else
        missing.push_back(in.fqn);
      continue;
    }
    const auto& t = it->second;
    SAFECKPT_CHECK(check_weight(program, in, t.dtype, t.shape));
    DevTensor d;
    d.dtype = t.dtype;
    d.shape = t.shape;
    d.strides = t.stride;
    d.direct = t.data;
    pi->weights[static_cast<std::size_t>(in.value)] = d;
  }
  if (!missing.empty()) {
    std::string m;
    for (const auto& s : missing) m += (m.empty() ? "" : ", ") + s;
    return make_error(ErrorCode::kInvalidArgument, "the checkpoint lacks: " + m);
  }
  if (!rest.empty()) SAFECKPT_CHECK(upload(*pi, pi->prog, *fallback, rest));
  return {};
}

}  // namespace

Result<CompiledProgram> Engine::compile(const graph::Program& program, const graph::WeightMap& weights) {
  detail::DeviceGuard g(impl_->opt.device);
  SAFECKPT_TRY(auto pi, make_program(impl_, program));
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < program.inputs.size(); ++i)
    if (program.inputs[i].kind != graph::InputKind::kUserInput) which.push_back(i);
  SAFECKPT_CHECK(upload(*pi, pi->prog, weights, which));
  return CompiledProgram(std::move(pi));
}

Result<CompiledProgram> Engine::compile(const graph::Program& program, const cuda::DeviceCheckpoint& weights,
                                        const graph::WeightMap* fallback) {
  detail::DeviceGuard g(impl_->opt.device);
  if (weights.device() != impl_->opt.device)
    return make_error(ErrorCode::kInvalidArgument, "the DeviceCheckpoint is on device " +
                                                       std::to_string(weights.device()) + ", the engine on " +
                                                       std::to_string(impl_->opt.device));
  SAFECKPT_TRY(auto pi, make_program(impl_, program));
  pi->ckpt = weights;
  SAFECKPT_CHECK(bind_device_weights(*pi, program, weights, fallback));
  return CompiledProgram(std::move(pi));
}

Result<CompiledProgram> Engine::compile(const graph::Program& program,
                                        std::shared_ptr<const cuda::PendingDeviceCheckpoint> weights,
                                        const graph::WeightMap* fallback) {
  detail::DeviceGuard g(impl_->opt.device);
  if (weights == nullptr) return make_error(ErrorCode::kInvalidArgument, "no pending checkpoint");
  const cuda::DeviceCheckpoint& dc = weights->checkpoint();
  if (dc.device() != impl_->opt.device)
    return make_error(ErrorCode::kInvalidArgument, "the PendingDeviceCheckpoint is on device " +
                                                       std::to_string(dc.device()) + ", the engine on " +
                                                       std::to_string(impl_->opt.device));
  SAFECKPT_TRY(auto pi, make_program(impl_, program));
  pi->ckpt = dc;
  pi->pending = std::move(weights);
  pi->weights_landed = false;
  SAFECKPT_CHECK(bind_device_weights(*pi, program, dc, fallback));
  return CompiledProgram(std::move(pi));
}

// ---------------------------------------------------------- CompiledProgram

CompiledProgram::CompiledProgram(std::unique_ptr<detail::ProgramImpl> impl) : impl_(std::move(impl)) {}
CompiledProgram::CompiledProgram(CompiledProgram&&) noexcept = default;
CompiledProgram& CompiledProgram::operator=(CompiledProgram&&) noexcept = default;
CompiledProgram::~CompiledProgram() = default;

ProgramStats CompiledProgram::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  ProgramStats s = impl_->stats;
  s.plans = impl_->lru.size();
  if (!impl_->lru.empty()) {
    s.arena_bytes = impl_->lru.front().second->arena_bytes;
    s.arena_live_bytes = impl_->lru.front().second->arena_live_bytes;
    s.steps = impl_->lru.front().second->steps.size();
    const detail::Plan& p = *impl_->lru.front().second;
    s.last_compile_seconds = p.compile_seconds;
    s.plan_device_bytes = p.device_bytes;
    s.prepared_bytes = p.prepared_bytes;
    s.last_lowering_seconds = p.lowering_seconds;
    s.last_heuristic_seconds = p.heuristic_seconds;
    s.last_module_seconds = p.module_seconds;
    s.last_alloc_seconds = p.alloc_seconds;
    s.last_capture_seconds = p.capture_seconds;
    s.last_tune_seconds = p.tune_seconds;
    s.gemms_tuned = p.gemms_tuned;
    s.last_dnn_graph_seconds = p.dnn_graph_seconds;
    s.dnn_graphs_built = p.dnn_graphs_built;
    s.dnn_graphs_restored = p.dnn_graphs_restored;
    s.dnn_graph_threads = p.dnn_graph_threads;
    s.dnn_graphs_background = p.dnn_graphs_background;
    s.dnn_graphs_pending = p.pending_graphs != nullptr;
    s.last_dnn_graphs_ready_seconds = p.dnn_graphs_ready_seconds;
  }
  return s;
}

Status CompiledProgram::wait_compiled() {
  ProgramImpl& pi = *impl_;
  std::lock_guard<std::mutex> lock(pi.mu);
  detail::DeviceGuard g(pi.eng->opt.device);
  Status first;
  for (auto& [key, plan] : pi.lru) {
    Status st = pi.install_graphs(*plan, true);
    if (!st && first) first = st;
  }
  return first;
}

namespace detail {
// Binds `inputs` (names, dtypes, ranks, sizes, symbols, ranges), applies the
// stance (`profiling`: compiled or eager only, never a recompile refusal),
// gets the plan and copies the inputs into its fixed buffers. pi.mu held,
// device current.
Result<std::shared_ptr<Plan>> prepare(ProgramImpl& pi, const std::vector<NamedInput>& inputs, Stance stance,
                                      bool profiling) {
  const graph::Program& p = pi.prog;
  // Bind inputs: names, dtypes, ranks, static sizes, symbols and ranges.
  std::vector<const DLTensor*> given(pi.user_inputs.size(), nullptr);
  for (const auto& ni : inputs) {
    std::size_t k = 0;
    while (k < pi.user_inputs.size() && p.inputs[pi.user_inputs[k]].fqn != ni.name) ++k;
    if (k == pi.user_inputs.size())
      return make_error(ErrorCode::kInvalidArgument, "input '" + ni.name + "' is not an input of the program");
    if (given[k] != nullptr) return make_error(ErrorCode::kInvalidArgument, "input '" + ni.name + "' given twice");
    if (ni.tensor == nullptr) return make_error(ErrorCode::kInvalidArgument, "input '" + ni.name + "' is null");
    given[k] = ni.tensor;
  }
  std::vector<std::vector<std::int64_t>> shapes;
  std::unordered_map<std::string, std::int64_t> symbols;
  std::string key;
  for (std::size_t k = 0; k < given.size(); ++k) {
    const auto& in = p.inputs[pi.user_inputs[k]];
    const std::string w = "input '" + in.fqn + "'";
    const DLTensor* t = given[k];
    if (t == nullptr) return make_error(ErrorCode::kInvalidArgument, w + " missing");
    const auto& m = p.values[static_cast<std::size_t>(in.value)];
    SAFECKPT_TRY(DType d, detail::dtype_of(t->dtype));
    if (d != m.dtype)
      return make_error(ErrorCode::kInvalidArgument, w + " is " + std::string(dtype_name(d)) + "; the program takes " +
                                                         std::string(dtype_name(m.dtype)));
    if (t->ndim < 0 || static_cast<std::size_t>(t->ndim) != m.sizes.size())
      return make_error(ErrorCode::kInvalidArgument, w + " has rank " + std::to_string(t->ndim) +
                                                         "; the program takes rank " + std::to_string(m.sizes.size()));
    if (t->device.device_type == kDLCUDA && t->device.device_id != pi.eng->opt.device)
      return make_error(ErrorCode::kInvalidArgument,
                        w + " is on cuda:" + std::to_string(t->device.device_id) +
                            "; the engine runs on cuda:" + std::to_string(pi.eng->opt.device));
    if (t->device.device_type != kDLCUDA && t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
      return make_error(ErrorCode::kInvalidArgument, w + ": device type not CUDA or host");
    std::vector<std::int64_t> shape(t->shape, t->shape + t->ndim);
    if (t->strides != nullptr && shape != std::vector<std::int64_t>{} &&
        std::vector<std::int64_t>(t->strides, t->strides + t->ndim) != detail::contiguous_strides(shape)) {
      bool ok = true;
      auto cs = detail::contiguous_strides(shape);
      for (std::size_t i = 0; i < shape.size(); ++i) ok = ok && (shape[i] == 1 || t->strides[i] == cs[i]);
      if (!ok) return make_error(ErrorCode::kInvalidArgument, w + " is not compact row-major");
    }
    for (std::size_t dd = 0; dd < shape.size(); ++dd) {
      const auto& sz = m.sizes[dd];
      if (shape[dd] < 0) return make_error(ErrorCode::kInvalidArgument, w + " has a negative size");
      if (!sz.is_symbolic()) {
        if (sz.value != shape[dd])
          return make_error(ErrorCode::kInvalidArgument, w + " dim " + std::to_string(dd) + " is " +
                                                             std::to_string(shape[dd]) + "; the program takes " +
                                                             std::to_string(sz.value));
        continue;
      }
      std::string sym = graph::detail::single_symbol(p.sym_values[static_cast<std::size_t>(sz.sym)].expr);
      if (sym.empty())
        return make_error(ErrorCode::kUnsupported,
                          w + " dim " + std::to_string(dd) + ": a size expression the engine does not bind");
      auto [it, fresh] = symbols.try_emplace(sym, shape[dd]);
      if (!fresh && it->second != shape[dd])
        return make_error(ErrorCode::kInvalidArgument, w + " dim " + std::to_string(dd) + " is " +
                                                           std::to_string(shape[dd]) + " but symbol " + sym +
                                                           " is already " + std::to_string(it->second));
      auto rc = p.range_constraints.find(sym);
      if (rc != p.range_constraints.end()) {
        auto [lo, hi] = rc->second;
        if ((lo && shape[dd] < *lo) || (hi && shape[dd] > *hi))
          return make_error(ErrorCode::kInvalidArgument,
                            w + " dim " + std::to_string(dd) + " is " + std::to_string(shape[dd]) +
                                ", outside the range of " + sym + " [" + (lo ? std::to_string(*lo) : "-inf") + ", " +
                                (hi ? std::to_string(*hi) : "inf") + "]; refused before launch");
      }
    }
    key += detail::shape_str(shape);
    shapes.push_back(std::move(shape));
  }
  // Stance.
  bool compiled = true;
  if (stance == Stance::kForceEager) compiled = false;
  if (!profiling && stance == Stance::kFailOnRecompile && pi.first_shapes && *pi.first_shapes != shapes) {
    for (std::size_t k = 0; k < shapes.size(); ++k)
      for (std::size_t d = 0; d < shapes[k].size(); ++d)
        if ((*pi.first_shapes)[k][d] != shapes[k][d])
          return make_error(ErrorCode::kInvalidArgument,
                            "fail_on_recompile: input '" + p.inputs[pi.user_inputs[k]].fqn + "' dim " +
                                std::to_string(d) + " changed from " + std::to_string((*pi.first_shapes)[k][d]) +
                                " to " + std::to_string(shapes[k][d]) + " (a new shape would recompile)");
  }
  if (!profiling && stance == Stance::kEagerThenCompile) {
    bool have = false;
    for (const auto& e : pi.lru) have = have || e.first == "c" + key;
    if (!have && pi.seen[key]++ == 0) compiled = false;
  }
  SAFECKPT_TRY(auto plan, pi.get_plan((compiled ? "c" : "e") + key, compiled, shapes, symbols));
  if (compiled && !pi.first_shapes) pi.first_shapes = shapes;
  // Inputs into their fixed buffers.
  for (std::size_t k = 0; k < given.size(); ++k) {
    const DLTensor* t = given[k];
    const auto& dst = plan->inputs[k].second;
    std::uint64_t bytes = dst.numel() * dtype_size(dst.dtype);
    if (bytes == 0) continue;
    const char* src = static_cast<const char*>(t->data) + t->byte_offset;
    ENG_CUDA(cudaMemcpyAsync(plan->ptr(dst), src, bytes, cudaMemcpyDefault, pi.stream), "copying input");
  }
  return plan;
}
}  // namespace detail

Result<std::vector<DLManagedTensorVersioned*>> CompiledProgram::run(const std::vector<NamedInput>& inputs,
                                                                    const RunOptions& options) {
  ProgramImpl& pi = *impl_;
  std::lock_guard<std::mutex> lock(pi.mu);
  detail::DeviceGuard g(pi.eng->opt.device);
  SAFECKPT_TRY(auto plan, detail::prepare(pi, inputs, options.stance.value_or(pi.eng->opt.stance), false));
  SAFECKPT_CHECK(pi.execute(*plan));
  // Outputs: views of the fixed output buffers; each capsule keeps them.
  std::vector<DLManagedTensorVersioned*> outs;
  auto owner = std::shared_ptr<const void>(plan->io, plan->io->p);
  for (const auto& o : plan->outputs) {
    cuda::TensorView v;
    v.storage_data = plan->bufs[static_cast<std::size_t>(o.buf)].ptr;
    v.storage_nbytes = plan->bufs[static_cast<std::size_t>(o.buf)].bytes;
    v.device = pi.eng->opt.device;
    v.dtype = o.dtype;
    v.shape = o.shape;
    v.strides = o.strides;
    v.storage_offset = o.offset;
    auto r = cuda::to_dlpack_versioned(v, owner, false);
    if (!r) {
      for (auto* x : outs) x->deleter(x);
      return unexpected(std::move(r).error());
    }
    outs.push_back(*r);
  }
  return outs;
}

namespace {

// Host tensors as (non-owning) DLPack CPU tensors named for run()/profile();
// `dl` must outlive `named`.
Status host_inputs(const std::map<std::string, graph::HostTensor, std::less<>>& inputs, std::vector<DLTensor>& dl,
                   std::vector<NamedInput>& named) {
  dl.assign(inputs.size(), DLTensor{});
  named.clear();
  std::size_t i = 0;
  for (const auto& [name, t] : inputs) {
    DLTensor& d = dl[i++];
    d.data = t.data ? const_cast<std::uint8_t*>(t.data->data()) : nullptr;
    d.device = {kDLCPU, 0};
    d.ndim = static_cast<std::int32_t>(t.shape.size());
    SAFECKPT_TRY(d.dtype, cuda::dlpack_dtype(t.dtype));
    d.shape = const_cast<std::int64_t*>(t.shape.data());
    d.strides = nullptr;
    d.byte_offset = 0;
    named.push_back({name, &d});
  }
  return {};
}

}  // namespace

Result<std::vector<graph::HostTensor>> CompiledProgram::run_host(
    const std::map<std::string, graph::HostTensor, std::less<>>& inputs, const RunOptions& options) {
  std::vector<DLTensor> dl;
  std::vector<NamedInput> named;
  SAFECKPT_CHECK(host_inputs(inputs, dl, named));
  SAFECKPT_TRY(auto outs, run(named, options));
  std::vector<graph::HostTensor> host;
  Status st;
  for (auto* o : outs) {
    if (st) {
      graph::HostTensor h;
      auto dt = detail::dtype_of(o->dl_tensor.dtype);
      if (!dt) {
        st = unexpected(std::move(dt).error());
      } else {
        h.dtype = *dt;
        h.shape.assign(o->dl_tensor.shape, o->dl_tensor.shape + o->dl_tensor.ndim);
        h.data = std::make_shared<std::vector<std::uint8_t>>(h.numel() * dtype_size(h.dtype));
        if (!h.data->empty()) {
          cudaError_t e = cudaMemcpy(h.data->data(), static_cast<char*>(o->dl_tensor.data) + o->dl_tensor.byte_offset,
                                     h.data->size(), cudaMemcpyDeviceToHost);
          if (e != cudaSuccess) st = detail::cuda_error("copying an output", e);
        }
        host.push_back(std::move(h));
      }
    }
    o->deleter(o);
  }
  if (!st) return unexpected(std::move(st).error());
  return host;
}

Result<Profile> CompiledProgram::profile(const std::vector<NamedInput>& inputs, const ProfileOptions& options) {
  ProgramImpl& pi = *impl_;
  std::lock_guard<std::mutex> lock(pi.mu);
  detail::DeviceGuard g(pi.eng->opt.device);
  Stance stance = options.stance == Stance::kForceEager ? Stance::kForceEager : Stance::kDefault;
  SAFECKPT_TRY(auto plan, detail::prepare(pi, inputs, stance, true));
  return pi.profile(*plan, options);
}

Result<Profile> CompiledProgram::profile_host(const std::map<std::string, graph::HostTensor, std::less<>>& inputs,
                                              const ProfileOptions& options) {
  std::vector<DLTensor> dl;
  std::vector<NamedInput> named;
  SAFECKPT_CHECK(host_inputs(inputs, dl, named));
  return profile(named, options);
}

}  // namespace safeckpt::engine
