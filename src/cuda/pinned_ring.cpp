// src/cuda/pinned_ring.cpp — the engine's pinned staging ring (prepared in
// the background by create(), slots pinned lazily when it falls short) and
// its pool of CUDA events.
#include "cuda/transfer_internal.hpp"

namespace safeckpt::cuda::detail {
namespace {

constexpr std::size_t kHugePage = 2u << 20;  // x86-64 transparent huge page

// First touch of every 4 KiB page of [p, p + len): the kernel faults (and
// zeroes) them here, outside any CUDA call.
void touch_pages(std::uint8_t* p, std::size_t len) {
  for (std::size_t i = 0; i < len; i += 4096) static_cast<volatile std::uint8_t*>(p)[i] = 0;
}

}  // namespace

EngineState::~EngineState() {
  prep_stop.store(true);
  if (prep.joinable()) prep.join();
  DeviceGuard guard;
  if (cudaSetDevice(opt.device) == cudaSuccess) {
    for (auto s : streams) (void)cudaStreamSynchronize(s);
    for (auto& s : slots) (void)(s->in_ring_map ? cudaHostUnregister(s->host) : cudaFreeHost(s->host));
    for (auto e : events) (void)cudaEventDestroy(e);
    for (auto s : streams) (void)cudaStreamDestroy(s);
  }
  if (ring_map != nullptr) ::munmap(ring_map, ring_map_len);
}

// Pins the ring in the background (started by create()). Measured on the
// H200 machine (bench/pin_bench.cpp, bench/RESULTS.md): cudaHostAlloc
// faults its pages in while holding the driver's lock, 2.4-3.1 ms per
// 4 MiB, and copies issued from other threads stall for all of it; the
// page faults themselves are most of that cost. So: one anonymous mapping
// advised for transparent huge pages (MADV_HUGEPAGE; 2.5x cheaper faults),
// first-touched by several threads at once (no CUDA call, nothing stalls),
// then cudaHostRegister per slot in slot order (0.15 ms per touched 4 MiB),
// each slot published to the readers as soon as it is registered. A new
// engine's first load starts copying after the first slot instead of after
// the whole ring. On any failure the rest is left to the lazy path.
void EngineState::prepare_ring() {
  const std::size_t n = max_slots;
  const std::size_t len = n * static_cast<std::size_t>(slot_bytes);
  std::size_t done = 0;
  void* raw = ::mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw != MAP_FAILED) {
    ring_map = raw;
    ring_map_len = len + kHugePage;
    auto* base = reinterpret_cast<std::uint8_t*>(align_up(reinterpret_cast<std::uintptr_t>(raw), kHugePage));
    (void)::madvise(base, len, MADV_HUGEPAGE);  // a hint; 4 KiB pages work too, only slower to fault
    done = register_slots(base, n);
    // Slots not registered go back to the system (the lazy path pins others).
    if (done < n) (void)::madvise(base + done * slot_bytes, (n - done) * slot_bytes, MADV_DONTNEED);
  }
  std::lock_guard<std::mutex> lock(ring_mu);
  preparing = false;
  ring_ready_seconds = std::chrono::duration<double>(Clock::now() - created).count();
  ring_cv.notify_all();
}

// Touches slots [0, n) of `base` on helper threads and registers each, in
// order, on this thread. Returns how many were registered (n unless the
// engine is being destroyed or a CUDA call failed).
std::size_t EngineState::register_slots(std::uint8_t* base, std::size_t n) {
  std::vector<char> touched(n, 0);  // under t_mu
  std::atomic<std::size_t> next{0};
  std::mutex t_mu;
  std::condition_variable t_cv;
  std::atomic<bool> quit{false};
  auto toucher = [&] {
    for (;;) {
      if (quit.load() || prep_stop.load()) return;
      const std::size_t i = next.fetch_add(1);
      if (i >= n) return;
      touch_pages(base + i * slot_bytes, slot_bytes);
      {
        std::lock_guard<std::mutex> lock(t_mu);
        touched[i] = 1;
      }
      t_cv.notify_all();
    }
  };
  std::vector<std::thread> helpers;
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const unsigned want = std::min<unsigned>(8, std::max(1u, hw / 2));
  for (unsigned k = 0; k < want && k < n; ++k) {
    try {
      helpers.emplace_back(toucher);
    } catch (const std::system_error&) {
      break;  // fewer helpers, or none: this thread touches what is left
    }
  }
  std::size_t done = 0;
  if (cudaSetDevice(opt.device) == cudaSuccess) {
    for (; done < n && !prep_stop.load(); ++done) {
      if (helpers.empty()) {
        touch_pages(base + done * slot_bytes, slot_bytes);
      } else {
        std::unique_lock<std::mutex> lock(t_mu);
        t_cv.wait(lock, [&] { return touched[done] != 0 || prep_stop.load(); });
        if (prep_stop.load()) break;
      }
      std::uint8_t* p = base + done * slot_bytes;
      const auto t0 = Clock::now();
      const cudaError_t err = cudaHostRegister(p, slot_bytes, cudaHostRegisterDefault);
      const double took = std::chrono::duration<double>(Clock::now() - t0).count();
      if (err != cudaSuccess) {
        (void)cudaGetLastError();
        break;
      }
      auto slot = std::make_unique<Slot>();
      slot->host = p;
      slot->in_ring_map = true;
      std::lock_guard<std::mutex> lock(ring_mu);
      free_slots.push_back(slot.get());
      slots.push_back(std::move(slot));
      pinned.fetch_add(slot_bytes, std::memory_order_relaxed);
      ++slots_pinned_now;
      pin_seconds_now += took;
      ring_cv.notify_one();
      // Let other threads' CUDA calls in: back to back, the registrations
      // kept the driver's lock so the load's arena cudaMalloc waited for
      // the whole ring (5-6 ms instead of 0.5; bench/RESULTS.md, 50 us gap).
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  quit.store(true);
  for (auto& h : helpers) h.join();
  return done;
}

Result<cudaEvent_t> EngineState::acquire_event() {
  {
    std::lock_guard<std::mutex> lock(event_mu);
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  if (cudaError_t err = cudaEventCreateWithFlags(&e, cudaEventDisableTiming); err != cudaSuccess)
    return device_error("cudaEventCreateWithFlags", err);
  std::lock_guard<std::mutex> lock(event_mu);
  events.push_back(e);
  return e;
}

void EngineState::release_event(cudaEvent_t e) {
  std::lock_guard<std::mutex> lock(event_mu);
  free_events.push_back(e);
}

// Returns a slot, pinning a new one when none is free and the ring has room,
// or nullptr when `stop` became true while waiting. One reader pins at a
// time: the driver serializes pinning anyway (32 x 8 MiB took 0.155 s one
// after another and 0.115 s from 8 threads), and staggered slots start
// moving bytes as each one is ready instead of all at the end.
Result<Slot*> EngineState::acquire_slot(const std::atomic<bool>& stop) {
  std::unique_lock<std::mutex> lock(ring_mu);
  for (;;) {
    if (stop.load(std::memory_order_relaxed)) return static_cast<Slot*>(nullptr);
    if (!free_slots.empty()) {
      Slot* s = free_slots.back();
      free_slots.pop_back();
      peak_in_use = std::max(peak_in_use, ++in_use);
      return s;
    }
    if (preparing) {  // prepare_ring() publishes slots, then clears `preparing`
      ring_cv.wait_for(lock, std::chrono::milliseconds(50));
      continue;
    }
    if (slots.size() + allocating < max_slots && allocating == 0) {
      ++allocating;
      lock.unlock();
      void* p = nullptr;
      const auto t0 = std::chrono::steady_clock::now();
      const cudaError_t err = cudaHostAlloc(&p, slot_bytes, cudaHostAllocDefault);
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      lock.lock();
      --allocating;
      pin_seconds_now += took;
      if (err == cudaSuccess) ++slots_pinned_now;
      if (err != cudaSuccess) {
        ring_cv.notify_all();
        return device_error("cudaHostAlloc of a " + std::to_string(slot_bytes) + "-byte staging slot", err);
      }
      auto slot = std::make_unique<Slot>();
      slot->host = static_cast<std::uint8_t*>(p);
      Slot* s = slot.get();
      slots.push_back(std::move(slot));
      pinned.fetch_add(slot_bytes, std::memory_order_relaxed);
      peak_in_use = std::max(peak_in_use, ++in_use);
      ring_cv.notify_all();  // waiters may now start pinning the next slot
      return s;
    }
    ring_cv.wait_for(lock, std::chrono::milliseconds(50));
  }
}

void EngineState::release_slot(Slot* s) {
  {
    std::lock_guard<std::mutex> lock(ring_mu);
    free_slots.push_back(s);
    --in_use;
  }
  ring_cv.notify_one();
}

}  // namespace safeckpt::cuda::detail
