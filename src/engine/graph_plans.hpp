// src/engine/graph_plans.hpp — the cuDNN operation-graph plans of a device
// plan (bfloat16 convolutions with a batch norm folded in, cuDNN fused
// attention): one slot per geometry, filled after lowering — from the
// persistent cache (cuDNN's own serialization: no kernel compilation), else
// by cuDNN's heuristics, whose engines compile their kernels at run time
// (NVRTC inside cuDNN, hundreds of milliseconds per geometry). Filled on
// several threads, before the first run or in the background
// (EngineOptions::background_graph_plans). Not installed; includes CUDA.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/conv.hpp"
#include "safeckpt/error.hpp"

namespace safeckpt::engine::detail {

struct EngineImpl;
struct Plan;

// One geometry's plan and the steps that run it. The steps hold the slot
// (shared_ptr) and read `plan` when they run: null runs their fallback (the
// plain convolution and the bias/relu kernel; the attention kernel). `plan`
// is written only between runs, on the thread that runs the program.
struct GraphSlot {
  ConvGeometry cg;
  bool with_z = false;
  std::optional<SdpaGeometry> sdpa;
  std::string key;                  // the choice key of the serialized plan (EngineImpl::find_choice)
  std::shared_ptr<GraphPlan> plan;  // null: the steps' fallback
  std::vector<std::size_t> steps;   // Plan::steps indices named after the engine once `plan` is set
};

// What one fill made, index-aligned with `slots`; nothing in it touches the
// slots until apply_graph_fill.
struct GraphFill {
  std::vector<std::shared_ptr<GraphSlot>> slots;
  std::vector<std::shared_ptr<GraphPlan>> made;  // null: none (the fallback)
  std::vector<Status> status;                    // a convolution graph cuDNN failed to plan
  std::vector<std::string> notes;                // attention without a cuDNN plan (a warning)
  std::size_t built = 0, restored = 0, threads = 0;
  double seconds = 0;  // wall time of the fill
};

// Fills `f.made` for `f.slots` on up to `max_threads` threads (this one
// included; runtime compilation is CPU work), one cuDNN handle each (cuDNN
// allows concurrent calls on distinct handles; a plan executes on the handle
// it was made with): a plan the engine's map or the persistent cache keeps
// (EngineImpl::find_choice), else cuDNN's heuristics (then kept). Two fills
// needing the same key (two programs on one engine) build it once: the
// second waits for the first (EngineImpl::claim_build) and restores its
// bytes. `handle`: this thread's handle (null: made here, on `device`).
// `cancel`, when set, stops taking new slots (their `made` stays null).
// Errors go into f.status / f.notes, per slot.
void fill_graph_plans(EngineImpl& eng, int device, std::shared_ptr<DnnHandle> handle, std::size_t max_threads,
                      const std::atomic<bool>* cancel, GraphFill& f);

// Puts a finished fill into its slots and `plan`: each slot's plan, the
// steps' names (" (engine name)"), Plan::workspace_bytes (at least every
// plan's workspace; the caller grows the allocation if it already exists)
// and the Plan::dnn_graph_* counters. A convolution graph cuDNN failed to
// plan is an error (kDevice, "cuDNN graph plan: ...") unless `fallback_ok`,
// when it is a warning and its steps keep the unfused path; attention notes
// are always warnings. Warnings are appended to `warnings`.
Status apply_graph_fill(Plan& plan, GraphFill& f, bool fallback_ok, std::vector<std::string>& warnings);

// A fill running on its own thread (EngineOptions::background_graph_plans),
// with up to kBackgroundGraphThreads threads. The destructor stops it taking
// new slots and waits for the ones under way (at most one cuDNN build per
// thread, about a second).
inline constexpr std::size_t kBackgroundGraphThreads = 15;  // one core of a 16-core host left to the caller
class PendingGraphs {
 public:
  PendingGraphs(EngineImpl& eng, int device, std::vector<std::shared_ptr<GraphSlot>> slots);
  PendingGraphs(const PendingGraphs&) = delete;
  PendingGraphs& operator=(const PendingGraphs&) = delete;
  ~PendingGraphs();
  bool ready() const { return done_.load(); }  // the fill finished (wait() does not block)
  GraphFill& wait();                           // blocks until the fill finished

 private:
  GraphFill fill_;
  std::atomic<bool> cancel_{false};
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace safeckpt::engine::detail
