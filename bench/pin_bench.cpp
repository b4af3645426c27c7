// bench/pin_bench.cpp — how fast can a transfer engine get pinned staging
// memory, and does pinning on one thread stall copies on another? (issue 5:
// time to first tensor with a new TransferEngine is dominated by pinning its
// ring.) Prints one table; nothing here asserts on time.
//
//   safeckpt_pin_bench [--slots N] [--slot-mib M] [--device D]
//
// Rows (each on fresh memory unless it says "again"):
//   cudaHostAlloc per slot            what the engine did up to now
//   mmap 4K pages: touch / register   fault+zero time and cudaHostRegister time apart
//   mmap THP: touch / register        the same with MADV_HUGEPAGE (2 MiB pages)
//   register again (touched)          the driver's own cost on memory already faulted in
//   THP, one cudaHostRegister         the whole ring in one call
//   THP, touch by T threads           parallel first touch
// and, for interference, a copier thread doing back-to-back 4 MiB pinned
// cudaMemcpyAsync + synchronize, alone and while the main thread pins.
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "pin_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

std::string read_line(const char* path) {
  std::ifstream f(path);
  std::string s;
  std::getline(f, s);
  return s.empty() ? "(unreadable)" : s;
}

struct Row {
  std::string what;
  double total_ms = 0, first_ms = 0, per_slot_ms = 0;
  double copy_gbs = -1, copy_max_ms = -1;
  std::string notes;
};

// A fresh anonymous mapping, 2 MiB aligned, optionally THP-advised.
std::uint8_t* fresh_map(std::size_t bytes, bool thp) {
  const std::size_t align = 2u << 20;
  void* raw = ::mmap(nullptr, bytes + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  auto p = reinterpret_cast<std::uintptr_t>(raw);
  const std::uintptr_t a = (p + align - 1) / align * align;
  (void)::madvise(reinterpret_cast<void*>(a), bytes, thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  return reinterpret_cast<std::uint8_t*>(a);  // leaked on purpose: a probe
}

void touch(std::uint8_t* p, std::size_t bytes, unsigned threads) {
  if (threads <= 1) {
    for (std::size_t i = 0; i < bytes; i += 4096) p[i] = 1;
    return;
  }
  std::vector<std::thread> ts;
  const std::size_t per = (bytes / threads + 4095) / 4096 * 4096;
  for (unsigned t = 0; t < threads; ++t)
    ts.emplace_back([=] {
      const std::size_t b = std::min(bytes, t * per), e = std::min(bytes, b + per);
      for (std::size_t i = b; i < e; i += 4096) p[i] = 1;
    });
  for (auto& t : ts) t.join();
}

// Copier: back-to-back pinned 4 MiB copies on its own stream until stop.
struct Copier {
  void* src = nullptr;
  void* dst = nullptr;
  cudaStream_t stream = nullptr;
  std::size_t bytes = 4u << 20;
  std::atomic<bool> stop{false};
  std::atomic<bool> running{false};
  double gbs = 0, max_ms = 0;
  std::thread th;
  void start(int device) {
    stop = false;
    running = false;
    th = std::thread([this, device] {
      check(cudaSetDevice(device), "cudaSetDevice");
      std::uint64_t moved = 0;
      double worst = 0;
      running = true;
      const auto t0 = Clock::now();
      while (!stop.load()) {
        const auto c0 = Clock::now();
        check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync");
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        worst = std::max(worst, ms_since(c0));
        moved += bytes;
      }
      gbs = static_cast<double>(moved) / (ms_since(t0) * 1e6);
      max_ms = worst;
    });
    while (!running.load()) std::this_thread::yield();
  }
  void finish() {
    stop = true;
    th.join();
  }
};

}  // namespace

int main(int argc, char** argv) {
  int device = 0;
  std::size_t slots = 31, slot_mib = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "pin_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--slots") {
      slots = std::strtoull(next(), nullptr, 10);
    } else if (a == "--slot-mib") {
      slot_mib = std::strtoull(next(), nullptr, 10);
    } else if (a == "--device") {
      device = std::atoi(next());
    } else {
      std::fprintf(stderr, "usage: safeckpt_pin_bench [--slots N] [--slot-mib M] [--device D]\n");
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= device) {
    std::printf("pin_bench: no CUDA device %d; nothing measured\n", device);
    return 0;
  }
  const auto ctx0 = Clock::now();
  check(cudaSetDevice(device), "cudaSetDevice");
  check(cudaFree(nullptr), "context creation");
  const double ctx_ms = ms_since(ctx0);
  const std::size_t slot = slot_mib << 20, ring = slot * slots;
  std::vector<Row> rows;

  Copier cp;
  check(cudaHostAlloc(&cp.src, cp.bytes, cudaHostAllocDefault), "cudaHostAlloc (copier)");
  std::memset(cp.src, 1, cp.bytes);
  check(cudaMalloc(&cp.dst, cp.bytes), "cudaMalloc (copier)");
  check(cudaStreamCreateWithFlags(&cp.stream, cudaStreamNonBlocking), "cudaStreamCreate");

  // Runs `pin_slot(i)` for every slot, optionally with the copier running.
  auto per_slot = [&](const std::string& what, bool with_copier, const std::function<void(std::size_t)>& pin_slot,
                      std::string notes = {}) {
    Row r;
    r.what = what + (with_copier ? ", copier running" : "");
    if (with_copier) cp.start(device);
    const auto t0 = Clock::now();
    std::vector<double> each;
    for (std::size_t i = 0; i < slots; ++i) {
      const auto s0 = Clock::now();
      pin_slot(i);
      each.push_back(ms_since(s0));
    }
    r.total_ms = ms_since(t0);
    if (with_copier) {
      cp.finish();
      r.copy_gbs = cp.gbs;
      r.copy_max_ms = cp.max_ms;
    }
    r.first_ms = each.front();
    std::sort(each.begin(), each.end());
    r.per_slot_ms = each[each.size() / 2];
    r.notes = std::move(notes);
    rows.push_back(r);
  };

  // Copier alone (the reference for the interference rows).
  {
    Row r;
    r.what = "copier alone (4 MiB pinned copies, 200 ms)";
    cp.start(device);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cp.finish();
    r.copy_gbs = cp.gbs;
    r.copy_max_ms = cp.max_ms;
    rows.push_back(r);
  }

  for (bool with_copier : {false, true}) {
    std::vector<void*> hs(slots);
    per_slot("cudaHostAlloc per slot", with_copier,
             [&](std::size_t i) { check(cudaHostAlloc(&hs[i], slot, cudaHostAllocDefault), "cudaHostAlloc"); });
    for (void* h : hs) check(cudaFreeHost(h), "cudaFreeHost");
  }

  for (bool thp : {false, true}) {
    const char* kind = thp ? "mmap THP" : "mmap 4K";
    std::uint8_t* m = fresh_map(ring, thp);
    per_slot(std::string(kind) + ": touch per slot", false, [&](std::size_t i) { touch(m + i * slot, slot, 1); });
    per_slot(std::string(kind) + ": cudaHostRegister per slot (touched)", false, [&](std::size_t i) {
      check(cudaHostRegister(m + i * slot, slot, cudaHostRegisterDefault), "cudaHostRegister");
    });
    for (std::size_t i = 0; i < slots; ++i) check(cudaHostUnregister(m + i * slot), "cudaHostUnregister");
    per_slot(std::string(kind) + ": cudaHostRegister again", true, [&](std::size_t i) {
      check(cudaHostRegister(m + i * slot, slot, cudaHostRegisterDefault), "cudaHostRegister");
    });
    for (std::size_t i = 0; i < slots; ++i) check(cudaHostUnregister(m + i * slot), "cudaHostUnregister");
    // Untouched memory, registered directly (the driver faults it in).
    std::uint8_t* f = fresh_map(ring, thp);
    per_slot(std::string(kind) + ": cudaHostRegister per slot (untouched)", false, [&](std::size_t i) {
      check(cudaHostRegister(f + i * slot, slot, cudaHostRegisterDefault), "cudaHostRegister");
    });
    for (std::size_t i = 0; i < slots; ++i) check(cudaHostUnregister(f + i * slot), "cudaHostUnregister");
    // Whole ring, one call, fresh memory touched by 8 threads first.
    std::uint8_t* w = fresh_map(ring, thp);
    Row r;
    r.what = std::string(kind) + ": touch by 8 threads + one cudaHostRegister";
    const auto t0 = Clock::now();
    touch(w, ring, 8);
    const double touch_ms = ms_since(t0);
    check(cudaHostRegister(w, ring, cudaHostRegisterDefault), "cudaHostRegister (whole)");
    r.total_ms = ms_since(t0);
    r.first_ms = r.total_ms;
    r.notes = "touch " + std::to_string(touch_ms) + " ms";
    rows.push_back(r);
    check(cudaHostUnregister(w), "cudaHostUnregister");
    // Register from 4 threads, on fresh touched memory.
    std::uint8_t* q = fresh_map(ring, thp);
    touch(q, ring, 8);
    Row r4;
    r4.what = std::string(kind) + ": cudaHostRegister per slot from 4 threads (touched)";
    const auto q0 = Clock::now();
    std::vector<std::thread> ts;
    for (unsigned t = 0; t < 4; ++t)
      ts.emplace_back([&, t] {
        check(cudaSetDevice(device), "cudaSetDevice");
        for (std::size_t i = t; i < slots; i += 4)
          check(cudaHostRegister(q + i * slot, slot, cudaHostRegisterDefault), "cudaHostRegister");
      });
    for (auto& t : ts) t.join();
    r4.total_ms = ms_since(q0);
    rows.push_back(r4);
    for (std::size_t i = 0; i < slots; ++i) check(cudaHostUnregister(q + i * slot), "cudaHostUnregister");
  }

  std::printf("THP: %s (defrag: %s)\n", read_line("/sys/kernel/mm/transparent_hugepage/enabled").c_str(),
              read_line("/sys/kernel/mm/transparent_hugepage/defrag").c_str());
  std::printf("CUDA context creation %.1f ms; %zu slots of %zu MiB (%zu MiB)\n\n", ctx_ms, slots, slot_mib, ring >> 20);
  std::printf(
      "| what | total ms | first slot ms | median slot ms | MB/s pinned | copier GB/s | copier worst ms | notes |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  for (const Row& r : rows) {
    auto num = [](double v) { return v < 0 ? std::string("—") : std::to_string(v).substr(0, 6); };
    const double mbs = r.total_ms > 0 ? static_cast<double>(ring) / 1e6 / (r.total_ms / 1e3) : -1;
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s |\n", r.what.c_str(),
                r.total_ms > 0 ? num(r.total_ms).c_str() : "—", r.first_ms > 0 ? num(r.first_ms).c_str() : "—",
                r.per_slot_ms > 0 ? num(r.per_slot_ms).c_str() : "—", num(mbs).c_str(), num(r.copy_gbs).c_str(),
                num(r.copy_max_ms).c_str(), r.notes.c_str());
  }
  return 0;
}
