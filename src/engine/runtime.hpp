// Runtime state of the engine (src/engine/*; not installed; includes CUDA).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/conv.hpp"
#include "engine/graph_plans.hpp"
#include "engine/internal.hpp"
#include "engine/module_cache.hpp"
#include "safeckpt/compile_cache.hpp"
#include "safeckpt/engine.hpp"

namespace safeckpt::engine::detail {

inline constexpr std::uint64_t kWorkspaceBytes = 32ull << 20;

// One device allocation, freed with the last owner.
struct DeviceBlock {
  DeviceBlock(int device_, void* p_) : device(device_), p(p_) {}
  DeviceBlock(const DeviceBlock&) = delete;
  DeviceBlock& operator=(const DeviceBlock&) = delete;
  ~DeviceBlock();
  int device;
  void* p;
};
Result<std::shared_ptr<DeviceBlock>> device_alloc(int device, std::uint64_t bytes);

// A loaded NVRTC module.
struct Module {
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  ~Module();
  cudaLibrary_t lib = nullptr;
};

// NVRTC: `source` compiled for sm_`sm` with nvrtc_options(sm); the cubin.
// Errors: kInternal (NVRTC rejected the source: a bug in fused.cpp; the log),
// kDevice (NVRTC could not be loaded or failed otherwise).
Result<std::vector<std::uint8_t>> nvrtc_compile(const std::string& source, int sm);

// How module_for() found a module (ProgramStats counts these).
struct ModuleLookup {
  bool compiled = false;  // NVRTC ran
  bool hit = false;       // loaded from the persistent cache
  bool miss = false;      // the persistent cache was asked and had no usable entry
  bool stored = false;    // an entry was written
  std::vector<std::string> warnings;
};

struct EngineImpl {
  EngineImpl() = default;
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;
  ~EngineImpl();
  EngineOptions opt;
  cublasLtHandle_t lt = nullptr;
  int sm = 90;
  DeviceFacts facts;                               // the cache key's device part
  std::optional<enginecache::CompileCache> cache;  // none: kOff or unusable
  mutable std::mutex mu;                           // guards modules and stats
  std::map<std::string, std::shared_ptr<Module>> modules;
  // Algorithm choices by what decided them (module_cache.hpp choice_cache_key:
  // "gemm ..." for cuBLASLt, "conv ..." for cuDNN): this engine's map, then the
  // persistent cache. Callers re-check a found choice with the library.
  std::map<std::string, std::vector<std::uint8_t>> choices;
  // The bytes of `choice`, if this engine or the cache has them (mu taken
  // inside); `from_cache` says which. Cache trouble: a warning, a miss.
  std::optional<std::vector<std::uint8_t>> find_choice(const std::string& choice, bool* from_cache);
  // Remembers (and stores) `bytes` for `choice`.
  void store_choice(const std::string& choice, std::vector<std::uint8_t> bytes);
  // Choices being built (cuDNN graph plans, graph_plans.cpp), so that two
  // fills needing one build it once: true when the caller now owns `choice`
  // (end_build after, built or not); false after waiting until another
  // thread's claim on it ended (the caller then looks the choice up again).
  bool claim_build(const std::string& choice);
  void end_build(const std::string& choice);
  std::set<std::string> building;         // under mu
  std::condition_variable building_done;  // end_build
  EngineStats stats;
  // The module for `source`: the in-process map, else the persistent cache
  // (a cubin the driver loads), else NVRTC (then stored). Cache trouble is a
  // warning in `out` and stats, never an error.
  Result<std::shared_ptr<Module>> module_for(const std::string& source, ModuleLookup* out);
  void warn(std::string w, ModuleLookup* out);  // mu held
};

struct GemmDesc {
  GemmDesc() = default;
  GemmDesc(const GemmDesc&) = delete;
  GemmDesc& operator=(const GemmDesc&) = delete;
  ~GemmDesc();
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

// EngineOptions::autotune_gemm: at most this many of cuBLASLt's heuristic
// candidates are timed per distinct GEMM; each candidate's repetitions are
// captured into one CUDA graph (no host launch cost in the timing), as many
// as make about kGemmTuneGraphMs of GPU time, 1..kGemmTuneMaxReps.
inline constexpr int kGemmTuneCandidates = 8;
inline constexpr int kGemmTuneMaxReps = 20;
inline constexpr double kGemmTuneGraphMs = 0.5;
// ... and no further candidate once this much GPU time went into timing one
// GEMM: GPT-2 fp32 32x1024's lm_head (32768 x 50257 x 768, ~50 ms a run on
// an H100) took 860 ms of a 1413 ms first call to time 8 candidates twice
// each, for no gain (bench/RESULTS.md 2026-12-05: 193.5 ms a forward with
// autotuning off, 195.2 with it). A GEMM that long is compute bound and
// cuBLASLt's first answer is its best guess; the bfloat16 lm_head of the
// same model (3.5 ms a run) is still timed whole.
inline constexpr double kGemmTuneBudgetMs = 100.0;
// The GEMM steps of a compiled plan that share one choice key (a
// transformer's layers), whose algorithm tune_gemms picks by timing the
// first of them.
struct GemmTune {
  std::vector<std::size_t> steps;                // Plan::steps indices
  std::vector<std::shared_ptr<GemmDesc>> descs;  // their descriptors; algo set from candidates
  std::string key;                               // the choice's key (engine map, persistent cache)
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's order, >= 2
  cublasLtMatmulAlgo_t fallback{};               // the heuristic's first answer (every candidate refused)
};

// One operand of a batched cuBLASLt GEMM, column-major as stored.
struct LtMat {
  cudaDataType_t type = CUDA_R_32F;
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;  // elements (strided batches)
  std::uint32_t align = 256;      // bytes every matrix address of it is aligned to
  // CUBLASLT_BATCH_MODE_POINTER_ARRAY: the operand passed to cublasLtMatmul
  // is a device array of `batch` matrix addresses (batch_stride unused).
  bool pointer_array = false;
};
// D = alpha * op(A) op(B) over `batch` matrices; the algorithm from
// cuBLASLt's heuristic (none chosen when eng.lt is null: dry plans). Errors:
// kDevice (cuBLASLt refused the layouts, e.g. a version without pointer-array
// batches, or found no algorithm).
Result<std::shared_ptr<GemmDesc>> make_batched_gemm(const EngineImpl& eng, cublasComputeType_t ct,
                                                    cublasOperation_t opa, cublasOperation_t opb, const LtMat& a,
                                                    const LtMat& b, const LtMat& d, std::int32_t batch);

struct Step {
  std::string name;
  // Returns a cudaError_t, 1000 + cublasStatus_t or kDnnStatusBase + cudnnStatus_t (conv.hpp).
  std::function<int(cudaStream_t)> fn;
  std::string kind;                  // what StepProfile::kind reports (gemm, attention, fused, layer_norm, ...)
  std::string shapes;                // operand shapes, for the profile
  std::vector<const void*> weights;  // device addresses of the weights it reads (streaming start waits on them)
};

// One concrete shape, lowered.
struct Plan {
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan();
  bool compiled = false;  // fused + CUDA graph (else: eager, one kernel per node)
  std::vector<Buf> bufs;
  std::vector<Step> steps;
  // Run once, before the plan's first run (eager or capture) and never
  // captured: they write the kPrepared buffers from the weights.
  std::vector<Step> prep_steps;
  bool prepared = false;
  std::uint64_t prepared_bytes = 0;  // the kPrepared buffers (256-byte aligned each)
  std::vector<FusedKernel> fused;    // distinct kernels (launches of the same code share one)
  std::size_t fused_launches = 0;    // steps that launch one of them
  std::vector<cudaKernel_t> fns;
  std::shared_ptr<Module> module;
  std::shared_ptr<DeviceBlock> arena, io, scratch;  // scratch: GEMM workspace + error flag
  std::shared_ptr<DeviceBlock> prep;                // the kPrepared buffers
  std::uint64_t arena_bytes = 0;
  std::uint64_t arena_live_bytes = 0;  // the most arena bytes live at one step (no arena can be smaller)
  std::uint64_t device_bytes = 0;      // arena + I/O buffers + prepared weights + workspace + error flag
  void* workspace = nullptr;
  std::uint64_t workspace_bytes = kWorkspaceBytes;  // GEMMs' kWorkspaceBytes, more when a convolution needs it
  bool warmup_before_capture = false;               // cuDNN steps: run once eagerly before the first capture
  // cuDNN graph steps (folded convolutions, fused attention) whose first
  // call cuDNN refused, so that they run their fallback; the engine turns
  // the count into a warning after the run that saw it.
  std::atomic<int> dnn_refusals{0};
  std::vector<ConvGeometry> convs;  // each convolution step's geometry, in order
  int* error_flag = nullptr;
  std::vector<std::string> checked_nodes;  // embedding / gather / index nodes whose indices the flag reports
  std::vector<std::pair<std::int32_t, DevTensor>> inputs;  // user input value id -> fixed buffer
  std::vector<DevTensor> outputs;
  std::vector<std::vector<std::int64_t>> input_shapes;  // per user input (signature order)
  cudaGraphExec_t exec = nullptr;
  double compile_seconds = 0;
  double lowering_seconds = 0, heuristic_seconds = 0, module_seconds = 0, alloc_seconds = 0, capture_seconds = 0;
  // GEMMs still to tune (EngineOptions::autotune_gemm; tune_gemms empties
  // it), GEMMs tuned, and the time that took.
  std::vector<GemmTune> tunes;
  std::size_t gemms_tuned = 0;
  double tune_seconds = 0;
  std::size_t gemm_heuristics = 0, gemm_heuristics_reused = 0;
  // cuDNN graph plans (prepare_graph_plans, part of lowering_seconds): wall
  // time, plans built by cuDNN's heuristics (runtime compilation) and plans
  // restored from the persistent cache, and the threads that did it.
  double dnn_graph_seconds = 0;
  std::size_t dnn_graphs_built = 0, dnn_graphs_restored = 0, dnn_graph_threads = 0;
  // The graph plans cuDNN is still building (EngineOptions::
  // background_graph_plans): until the engine installs them (between runs,
  // ProgramImpl::install_graphs), a compiled plan runs its steps one by one
  // without capturing a CUDA graph; null once installed (or none).
  std::shared_ptr<PendingGraphs> pending_graphs;
  std::size_t dnn_graphs_background = 0;          // slots handed to pending_graphs
  double dnn_graphs_ready_seconds = 0;            // from the plan's start to their install
  std::chrono::steady_clock::time_point started;  // when get_plan began the plan

  void* ptr(const DevTensor& t) const {
    char* base = static_cast<char*>(t.buf >= 0 ? bufs[static_cast<std::size_t>(t.buf)].ptr : t.direct);
    return base + t.offset * static_cast<std::int64_t>(dtype_size(t.dtype));
  }
};

// Lowers `program` at the shapes of `inputs` (Buf kInput entries already in
// plan.bufs) into plan.steps / bufs / fused / outputs and the arena layout.
Status build_plan(const graph::Program& program, EngineImpl& eng, const std::vector<std::optional<DevTensor>>& weights,
                  const std::vector<std::pair<std::int32_t, DevTensor>>& inputs,
                  const std::unordered_map<std::string, std::int64_t>& symbols, bool fuse, Plan& plan);

// Times each pending GemmTune's candidates on `stream` (the plan's buffers
// allocated, its prep steps run; what the buffers hold does not matter: every
// step is run again before an output is read) and keeps the fastest in the
// step's descriptor, eng's choices and the persistent cache; the time it
// took goes into Plan::tune_seconds and compile_seconds. A candidate cuBLASLt
// refuses at run time is skipped. Nothing to tune: returns at once. Errors:
// kDevice (CUDA events, or a CUDA error a candidate left behind).
Status tune_gemms(Plan& plan, EngineImpl& eng, cudaStream_t stream);

// The row classes of a GEMM D[M, N] with `esz`-byte elements written
// straight into dense rows N apart (EngineOptions::gemm_row_classes; plan_gemm.cpp
// gemm_by_row_classes): P = 16 / gcd(N * esz, 16) classes, class j the rows
// j, j + P, ... (`rows` of them), written from column c0 on for n columns
// (a multiple of 16 / esz), so that element (j, c0) and the class's row
// stride P * N are 16-byte aligned; the columns left out lie in the first
// and the last 16 / esz of each row. Empty for M <= 0, N <= 0 or an esz
// other than 2 or 4.
struct GemmRowClass {
  std::int64_t j, rows, c0, n;
};
std::vector<GemmRowClass> gemm_row_classes(std::int64_t M, std::int64_t N, std::int64_t esz);

// Plans `program` at `shapes` (user inputs, signature order) without a
// device (weights placed at null, no cuBLASLt algorithm chosen) and compiles
// the generated kernels with NVRTC for sm_`sm`: what tests check on a host
// without a GPU (fusion decisions, launches, arena, generated source).
struct DryPlan {
  std::vector<std::string> steps;        // launch names in order
  std::vector<std::string> step_kinds;   // Step::kind of each
  std::vector<std::string> step_shapes;  // Step::shapes of each
  std::vector<std::string> prep_steps;   // Plan::prep_steps' names (run once, not per call)
  std::uint64_t prepared_bytes = 0;
  std::uint64_t arena_bytes = 0;
  std::uint64_t arena_live_bytes = 0;  // Plan::arena_live_bytes
  std::size_t fused_kernels = 0;       // distinct generated kernels NVRTC compiles
  std::size_t fused_launches = 0;      // steps launching one of them (>= fused_kernels)
  std::string source;
  std::vector<ConvGeometry> convs;  // the convolutions (conv_describe checks them without a device)
};
// `opt`: the EngineOptions that shape a plan (attention_*, conv_layout,
// cudnn_allow_tf32, fold_batch_norm, cudnn_graph_fusion, fuse_gemm_epilogue,
// split_misaligned_gemm, gemm_row_classes, fuse_sibling_gemms, allow_tf32);
// the device, stance and cache ones are ignored.
Result<DryPlan> dry_plan(const graph::Program& program, const std::vector<std::vector<std::int64_t>>& shapes, bool fuse,
                         int sm, const EngineOptions& opt = {});

}  // namespace safeckpt::engine::detail
