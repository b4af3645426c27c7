// src/engine/graph_plans.cpp — filling a plan's cuDNN graph slots, before the
// first run or in the background (graph_plans.hpp).
#include "engine/graph_plans.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "engine/runtime.hpp"

namespace safeckpt::engine::detail {

void fill_graph_plans(EngineImpl& eng, int device, std::shared_ptr<DnnHandle> handle, std::size_t max_threads,
                      const std::atomic<bool>* cancel, GraphFill& f) {
  const std::size_t n = f.slots.size();
  f.made.assign(n, nullptr);
  f.status.assign(n, Status{});
  f.notes.assign(n, std::string{});
  f.built = f.restored = f.threads = 0;
  f.seconds = 0;
  if (n == 0) return;
  const auto t0 = std::chrono::steady_clock::now();
  const std::size_t threads = std::max<std::size_t>(1, std::min(n, max_threads));
  std::atomic<std::size_t> next{0}, built{0}, restored{0};
  auto stopped = [cancel] { return cancel != nullptr && cancel->load(); };
  auto work = [&](std::shared_ptr<DnnHandle> h) {
    if (!h) {
      Status st;
      if (cudaSetDevice(device) != cudaSuccess) {
        st = make_error(ErrorCode::kDevice, "cudaSetDevice failed");
      } else if (auto made = dnn_create(); !made) {
        st = made.error();
      } else {
        h = *made;
      }
      if (!st) {
        for (std::size_t i; (i = next++) < n;) f.status[i] = st;
        return;
      }
    }
    for (std::size_t i; !stopped() && (i = next++) < n;) {
      const GraphSlot& s = *f.slots[i];
      std::shared_ptr<GraphPlan> made;
      bool restore = true;
      for (;;) {
        bool cached = false;
        if (restore)
          if (auto bytes = eng.find_choice(s.key, &cached)) {
            made = s.sdpa ? graph_sdpa_from_bytes(h, *s.sdpa, kMaxConvWorkspaceBytes, *bytes)
                          : graph_conv_from_bytes(h, s.with_z, kMaxConvWorkspaceBytes, *bytes);
            if (made) {
              ++restored;
              break;
            }
            restore = false;  // cuDNN refused the bytes: build it
          }
        if (!eng.claim_build(s.key)) continue;  // another fill built it (or failed): look again
        auto r = s.sdpa ? graph_sdpa_prepare(h, *s.sdpa, kMaxConvWorkspaceBytes)
                        : graph_conv_prepare(h, s.cg, s.with_z, kMaxConvWorkspaceBytes);
        if (r && *r) {
          made = *r;
          ++built;
          if (auto bytes = graph_conv_plan_bytes(*made); !bytes.empty()) eng.store_choice(s.key, std::move(bytes));
        }
        eng.end_build(s.key);
        if (!r && s.sdpa) {  // attention has its kernel: a warning, not an error
          f.notes[i] = "cuDNN fused attention not planned (" + r.error().message() + "); the kernel runs it";
        } else if (!r) {
          f.status[i] = r.error();
        }
        break;
      }
      f.made[i] = std::move(made);
    }
  };
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work, nullptr);
  work(std::move(handle));
  for (auto& t : pool) t.join();
  f.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  f.built = built;
  f.restored = restored;
  f.threads = threads;
}

Status apply_graph_fill(Plan& plan, GraphFill& f, bool fallback_ok, std::vector<std::string>& warnings) {
  plan.dnn_graph_seconds += f.seconds;
  plan.dnn_graphs_built += f.built;
  plan.dnn_graphs_restored += f.restored;
  plan.dnn_graph_threads = std::max(plan.dnn_graph_threads, f.threads);
  for (std::size_t i = 0; i < f.slots.size(); ++i) {
    if (!f.status[i]) {
      const std::string what = "cuDNN graph plan: " + f.status[i].error().message();
      if (!fallback_ok) return make_error(f.status[i].error().code(), what);
      warnings.push_back(what + "; its steps keep their fallback");
    }
    if (!f.notes[i].empty()) warnings.push_back(f.notes[i]);
    GraphSlot& s = *f.slots[i];
    if (!f.made[i]) continue;
    s.plan = f.made[i];
    plan.workspace_bytes = std::max(plan.workspace_bytes, graph_conv_workspace_bytes(*s.plan));
    for (auto k : s.steps) plan.steps[k].name += " (" + graph_conv_name(*s.plan) + ")";
  }
  return {};
}

PendingGraphs::PendingGraphs(EngineImpl& eng, int device, std::vector<std::shared_ptr<GraphSlot>> slots) {
  fill_.slots = std::move(slots);
  thread_ = std::thread([this, &eng, device] {
    const std::size_t hw = std::max(2u, std::thread::hardware_concurrency());
    fill_graph_plans(eng, device, nullptr, std::min(hw - 1, kBackgroundGraphThreads), &cancel_, fill_);
    done_.store(true);
  });
}

PendingGraphs::~PendingGraphs() {
  cancel_.store(true);
  if (thread_.joinable()) thread_.join();
}

GraphFill& PendingGraphs::wait() {
  if (thread_.joinable()) thread_.join();
  return fill_;
}

}  // namespace safeckpt::engine::detail
