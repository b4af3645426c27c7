// src/cuda/transfer.cpp — the transfer engine: file ranges -> pinned ring ->
// cudaMemcpyAsync, overlapped (see safeckpt/cuda.hpp for the contract).
//
// Accepted input (everything else is an error before any device work):
//   1. sources.size() < 2^32; swap_unit in {1, 2, 4, 8}; nbytes % swap_unit == 0;
//   2. a file range has file_offset + nbytes <= file size (no overflow);
//   3. a source with host_bytes needs no file; a non-empty file range needs one;
//   4. options: chunk_bytes a multiple of 4096 in [64 KiB, 1 GiB];
//      chunk_bytes <= ring_bytes <= 16 GiB; 1..256 readers; 1..64 streams.
//
// Work is cut into items. A staged item is one chunk (<= chunk_bytes) of one
// storage, read into a ring slot. A registered item (kMmapRegister) is one
// page-aligned block of the mapped file, registered with cudaHostRegister and
// copied from directly; it carries the pieces of every storage inside it.
// Items are issued in storage order so the first storages complete first.
//
// Threads: per engine, one ring thread (prepare_ring, from create()) pins the
// staging ring slot by slot with helper threads touching its pages first.
// Per load, `readers` reader threads claim items with an atomic counter and
// wait for the arena (cudaMalloc'd by the calling thread meanwhile) before
// their first copy; one completion thread waits on each item's event in
// submission order, returns its slot (or unregisters its block), checks a
// storage's CRC when its last chunk completes and reports it ready. Any
// error sets `failed`; readers stop claiming, the completion thread drains
// what was issued, every stream is synchronized, then the arena is freed.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cuda/internal.hpp"
#include "safeckpt/cuda.hpp"

namespace safeckpt::cuda {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kDirectAlign = 4096;  // O_DIRECT offset/length/buffer alignment (safe for 512e/4Kn)
constexpr std::uint64_t kMinChunk = 64ull << 10;
constexpr std::uint64_t kMaxChunk = 1ull << 30;
constexpr std::uint64_t kMaxRing = 16ull << 30;
constexpr std::uint64_t kCrcPiece = 1ull << 20;  // pread+CRC granularity: CRC runs on L2-resident bytes

std::string cuda_message(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

Unexpected device_error(const std::string& what, cudaError_t e) {
  return make_error(ErrorCode::kDevice, what + " failed: " + cuda_message(e));
}

std::string errno_text(int err) {
  return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")";
}

constexpr std::uint64_t align_up(std::uint64_t v, std::uint64_t a) {
  return (v + a - 1) / a * a;
}
constexpr std::uint64_t align_down(std::uint64_t v, std::uint64_t a) {
  return v / a * a;
}

// Restores the calling thread's current device on scope exit.
class DeviceGuard {
 public:
  DeviceGuard() { had_ = cudaGetDevice(&prev_) == cudaSuccess; }
  ~DeviceGuard() {
    if (had_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool had_ = false;
};

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

class Mapping {
 public:
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (ptr_ != nullptr) ::munmap(ptr_, len_);
  }
  bool map(int fd, std::uint64_t len) {
    if (len == 0) return false;
    void* p = ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return false;
    ptr_ = p;
    len_ = len;
    return true;
  }
  const std::uint8_t* data() const { return static_cast<const std::uint8_t*>(ptr_); }
  std::uint64_t size() const { return len_; }

 private:
  void* ptr_ = nullptr;
  std::uint64_t len_ = 0;
};

// Fraction of sampled pages of the file ranges that are in the page cache:
// up to 64 windows of 16 pages spread evenly over the bytes to load. Cheap
// (64 mincore calls) next to reading anything.
double page_cache_residency(const Mapping& map, std::span<const StorageSource> sources) {
  const long page_l = ::sysconf(_SC_PAGESIZE);
  const std::uint64_t page = page_l > 0 ? static_cast<std::uint64_t>(page_l) : 4096;
  std::uint64_t total = 0;
  for (const auto& s : sources)
    if (s.host_bytes == nullptr) total += s.nbytes;
  if (total == 0) return 1.0;
  constexpr int kWindows = 64;
  constexpr std::uint64_t kWindowPages = 16;
  std::uint64_t resident = 0, sampled = 0;
  unsigned char vec[kWindowPages];
  std::size_t si = 0;
  std::uint64_t base = 0;  // bytes of file ranges before sources[si]
  for (int w = 0; w < kWindows; ++w) {
    const std::uint64_t target = total / kWindows * static_cast<std::uint64_t>(w);
    while (si < sources.size() && (sources[si].host_bytes != nullptr || base + sources[si].nbytes <= target)) {
      if (sources[si].host_bytes == nullptr) base += sources[si].nbytes;
      ++si;
    }
    if (si >= sources.size()) break;
    const std::uint64_t off = align_down(sources[si].file_offset + (target - base), page);
    if (off >= map.size()) continue;
    const std::uint64_t len = std::min<std::uint64_t>(kWindowPages * page, map.size() - off);
    if (::mincore(const_cast<std::uint8_t*>(map.data()) + off, len, vec) != 0) continue;
    const std::uint64_t n = (len + page - 1) / page;
    for (std::uint64_t i = 0; i < n; ++i) resident += vec[i] & 1u;
    sampled += n;
  }
  return sampled ? static_cast<double>(resident) / static_cast<double>(sampled) : 1.0;
}

// One contiguous piece of one storage.
struct Chunk {
  std::uint32_t storage;
  std::uint64_t offset;  // within the storage
  std::uint64_t len;
};

struct Item {
  std::uint32_t first;  // index into item_chunks
  std::uint32_t count;
  bool registered;            // kMmapRegister block item
  std::uint64_t block_begin;  // registered: page-aligned file offset
  std::uint64_t block_len;
};

struct Slot {
  std::uint8_t* host = nullptr;
  bool in_ring_map = false;  // part of EngineState's mapping (cudaHostRegister), else cudaHostAlloc
};

constexpr std::size_t kHugePage = 2u << 20;  // x86-64 transparent huge page

// First touch of every 4 KiB page of [p, p + len): the kernel faults (and
// zeroes) them here, outside any CUDA call.
void touch_pages(std::uint8_t* p, std::size_t len) {
  for (std::size_t i = 0; i < len; i += 4096) static_cast<volatile std::uint8_t*>(p)[i] = 0;
}

struct InFlight {
  cudaEvent_t event = nullptr;
  Slot* slot = nullptr;
  void* registered = nullptr;  // block to cudaHostUnregister once done
  std::uint32_t item = 0;
};

}  // namespace

// ---------------------------------------------------------------------------

struct detail::EngineState {
  TransferOptions opt;
  unsigned readers = 1;
  std::uint64_t slot_bytes = 0;
  std::size_t max_slots = 0;
  std::vector<cudaStream_t> streams;
  bool can_register_read_only = false;

  std::mutex load_mu;  // one load at a time

  // Pinned ring. create() starts prepare_ring() on a background thread,
  // which pins the whole ring one slot at a time and hands each slot to the
  // readers as soon as it is pinned. If that fails (or for slots it did not
  // get to), readers pin slots lazily with cudaHostAlloc, one at a time, when
  // every slot is busy. Slots stay pinned for the engine's next load.
  std::mutex ring_mu;
  std::condition_variable ring_cv;
  std::vector<std::unique_ptr<Slot>> slots;  // all pinned slots
  std::vector<Slot*> free_slots;
  std::size_t allocating = 0;  // cudaHostAlloc calls in progress
  std::size_t in_use = 0, peak_in_use = 0;
  std::atomic<std::uint64_t> pinned{0};
  // This load's pinning (reset with peak_in_use; under ring_mu).
  std::size_t slots_pinned_now = 0;
  double pin_seconds_now = 0;
  // Background preparation (prepare_ring); `preparing` and
  // `ring_ready_seconds` under ring_mu.
  bool preparing = false;
  double ring_ready_seconds = 0;  // create() until prepare_ring() finished; 0 before
  Clock::time_point created = Clock::now();
  std::thread prep;
  std::atomic<bool> prep_stop{false};
  void* ring_map = nullptr;  // the mapping prepare_ring() registers slots of
  std::size_t ring_map_len = 0;

  std::mutex event_mu;
  std::vector<cudaEvent_t> events;  // all created
  std::vector<cudaEvent_t> free_events;

  ~EngineState() {
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
  void prepare_ring() {
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
  std::size_t register_slots(std::uint8_t* base, std::size_t n) {
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

  Result<cudaEvent_t> acquire_event() {
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
  void release_event(cudaEvent_t e) {
    std::lock_guard<std::mutex> lock(event_mu);
    free_events.push_back(e);
  }

  // Returns a slot, pinning a new one when none is free and the ring has room,
  // or nullptr when `stop` became true while waiting. One reader pins at a
  // time: the driver serializes pinning anyway (32 x 8 MiB took 0.155 s one
  // after another and 0.115 s from 8 threads), and staggered slots start
  // moving bytes as each one is ready instead of all at the end.
  Result<Slot*> acquire_slot(const std::atomic<bool>& stop) {
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
  void release_slot(Slot* s) {
    {
      std::lock_guard<std::mutex> lock(ring_mu);
      free_slots.push_back(s);
      --in_use;
    }
    ring_cv.notify_one();
  }
};

namespace {

// State of one load() call.
struct LoadState {
  detail::EngineState* eng = nullptr;
  std::span<const StorageSource> sources;
  std::uint8_t* arena = nullptr;
  const std::uint64_t* layout = nullptr;  // offset, nbytes per storage
  IoMode mode = IoMode::kPread;
  int fd = -1;         // buffered
  int fd_direct = -1;  // O_DIRECT, when mode == kODirect
  std::uint64_t file_size = 0;
  const Mapping* map = nullptr;
  bool verify = false;

  std::vector<Chunk> chunks;
  std::vector<std::uint32_t> item_chunks;
  std::vector<Item> items;
  std::vector<std::uint32_t> chunk_crc;
  std::vector<std::uint32_t> storage_first_chunk;           // chunks of storage s: [first[s], first[s+1])
  std::unique_ptr<std::atomic<std::uint32_t>[]> remaining;  // chunks not yet complete, per storage
  std::atomic<std::size_t> next_item{0};

  // Completion queue.
  std::mutex q_mu;
  std::condition_variable q_cv;
  std::deque<InFlight> queue;
  unsigned readers_running = 0;

  // Registered blocks in flight (kMmapRegister), bounded.
  std::mutex reg_mu;
  std::condition_variable reg_cv;
  std::size_t reg_in_flight = 0;
  std::size_t reg_max = 0;

  // The arena is allocated while the readers make their first reads; each
  // waits for it before its first copy (wait_arena).
  std::mutex arena_mu;
  std::condition_variable arena_cv;
  std::atomic<bool> arena_ready{false};

  std::atomic<bool> failed{false};
  std::mutex err_mu;
  std::optional<Error> error;

  Clock::time_point start;
  std::atomic<std::int64_t> first_ready_ns{-1};
  std::atomic<std::int64_t> first_copy_ns{-1};
  std::atomic<std::uint64_t> pageable_chunks{0};

  // Records "now" (ns since start) in `t` the first time only.
  void mark_first(std::atomic<std::int64_t>& t) const {
    if (t.load(std::memory_order_relaxed) >= 0) return;
    std::int64_t unset = -1;
    t.compare_exchange_strong(unset,
                              std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  }
  // Whether storage `s`'s bytes are hashed and compared (safetensors have no CRC).
  bool checks_crc(const StorageSource& s) const { return verify && s.expected_crc32 != 0; }

  void fail(Error e) {
    {
      std::lock_guard<std::mutex> lock(err_mu);
      if (!error) error = std::move(e);
    }
    failed.store(true);
    eng->ring_cv.notify_all();
    reg_cv.notify_all();
    q_cv.notify_all();
    { std::lock_guard<std::mutex> lock(arena_mu); }  // a waiter is either blocked or will see `failed`
    arena_cv.notify_all();
  }
  void publish_arena() {
    {
      std::lock_guard<std::mutex> lock(arena_mu);
      arena_ready.store(true, std::memory_order_release);
    }
    arena_cv.notify_all();
  }
  // True once `arena` is set; false if the load failed first.
  bool wait_arena() {
    if (arena_ready.load(std::memory_order_acquire)) return true;
    std::unique_lock<std::mutex> lock(arena_mu);
    arena_cv.wait(lock, [&] { return arena_ready.load(std::memory_order_acquire) || failed.load(); });
    return arena_ready.load(std::memory_order_acquire) && !failed.load();
  }
};

// Reads [off, off+len) of the file into dst with buffered pread, computing
// the CRC on each piece right after it lands (still in L2).
Status pread_full(int fd, std::uint8_t* dst, std::uint64_t off, std::uint64_t len, bool crc, std::uint32_t* crc_out) {
  std::uint32_t c = 0;
  std::uint64_t done = 0;
  const std::uint64_t piece = crc ? kCrcPiece : len;
  while (done < len) {
    const std::uint64_t want = std::min(piece, len - done);
    std::uint64_t got = 0;
    while (got < want) {
      const ssize_t n = ::pread(fd, dst + done + got, want - got, static_cast<off_t>(off + done + got));
      if (n < 0) {
        if (errno == EINTR) continue;
        return make_error(ErrorCode::kIo, "pread of " + std::to_string(want - got) + " bytes at file offset " +
                                              std::to_string(off + done + got) + " failed: " + errno_text(errno));
      }
      if (n == 0)
        return make_error(ErrorCode::kIo, "unexpected end of file at offset " + std::to_string(off + done + got) +
                                              " (the file shrank while loading?)");
      got += static_cast<std::uint64_t>(n);
    }
    if (crc) c = crc32_update(c, dst + done, want);
    done += want;
  }
  if (crc_out) *crc_out = c;
  return {};
}

// O_DIRECT: reads the 4096-aligned superset of [off, off+len) into dst (a
// pinned slot: page-aligned, chunk + 8 KiB long); returns the offset of the
// wanted bytes inside dst.
Result<std::uint64_t> pread_direct(int fd, std::uint8_t* dst, std::uint64_t off, std::uint64_t len) {
  const std::uint64_t begin = align_down(off, kDirectAlign);
  const std::uint64_t head = off - begin;
  const std::uint64_t need = head + len;
  const std::uint64_t span = align_up(need, kDirectAlign);
  std::uint64_t got = 0;
  while (got < need) {
    const ssize_t n = ::pread(fd, dst + got, span - got, static_cast<off_t>(begin + got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(ErrorCode::kIo, "O_DIRECT pread of " + std::to_string(span - got) + " bytes at file offset " +
                                            std::to_string(begin + got) + " failed: " + errno_text(errno));
    }
    if (n == 0)
      return make_error(ErrorCode::kIo, "unexpected end of file at offset " + std::to_string(begin + got) +
                                            " (the file shrank while loading?)");
    got += static_cast<std::uint64_t>(n);
    // A short O_DIRECT read that is not block-aligned only happens at EOF.
    if (got < need && got % kDirectAlign != 0)
      return make_error(ErrorCode::kIo, "short O_DIRECT read at file offset " + std::to_string(begin + got));
  }
  return head;
}

// Enqueues the copy (and swap) of `len` host bytes at `src` to chunk c's place.
Status issue_copy(LoadState& st, const Chunk& c, const std::uint8_t* src, cudaStream_t stream) {
  const auto& s = st.sources[c.storage];
  std::uint8_t* dst = st.arena + st.layout[2 * c.storage] + c.offset;
  if (cudaError_t e = cudaMemcpyAsync(dst, src, c.len, cudaMemcpyHostToDevice, stream); e != cudaSuccess)
    return device_error("cudaMemcpyAsync of storage " + std::to_string(c.storage), e);
  st.mark_first(st.first_copy_ns);
  if (s.swap_unit > 1) {
    if (cudaError_t e = detail::launch_byteswap(dst, c.len, s.swap_unit, stream); e != cudaSuccess)
      return device_error("byte-swap kernel launch for storage " + std::to_string(c.storage), e);
  }
  return {};
}

void push_inflight(LoadState& st, InFlight f) {
  {
    std::lock_guard<std::mutex> lock(st.q_mu);
    st.queue.push_back(f);
  }
  st.q_cv.notify_one();
}

// A reader's own pageable staging buffer (pageable_staging), page-aligned for
// O_DIRECT, allocated on first use and freed when the reader exits.
struct PageableBuffer {
  std::uint8_t* p = nullptr;
  ~PageableBuffer() { std::free(p); }
};

Status run_staged_item(LoadState& st, std::uint32_t item_index, cudaStream_t stream, PageableBuffer& pageable) {
  detail::EngineState& eng = *st.eng;
  const Item& item = st.items[item_index];
  const std::uint32_t ci = st.item_chunks[item.first];
  const Chunk& c = st.chunks[ci];
  const StorageSource& src = st.sources[c.storage];
  const bool want_crc = st.checks_crc(src);

  Slot* slot = nullptr;
  std::uint8_t* buf = nullptr;
  if (!eng.opt.pageable_staging) {
    SAFECKPT_TRY(slot, eng.acquire_slot(st.failed));
    if (slot == nullptr) return {};  // stopping
    buf = slot->host;
  } else {
    if (pageable.p == nullptr) {
      pageable.p = static_cast<std::uint8_t*>(std::aligned_alloc(kDirectAlign, eng.slot_bytes));
      if (pageable.p == nullptr)
        return make_error(ErrorCode::kIo, "out of host memory for a " + std::to_string(eng.slot_bytes) +
                                              "-byte pageable staging buffer");
    }
    buf = pageable.p;
    st.pageable_chunks.fetch_add(1, std::memory_order_relaxed);
  }
  auto release = [&] {
    if (slot != nullptr) eng.release_slot(slot);
  };
  const std::uint8_t* data = buf;
  std::uint32_t crc = 0;
  Status read_status;
  if (src.host_bytes != nullptr) {
    std::memcpy(buf, src.host_bytes + c.offset, c.len);
    if (want_crc) crc = crc32_update(0, buf, c.len);
  } else if (st.mode == IoMode::kODirect) {
    auto head = pread_direct(st.fd_direct, buf, src.file_offset + c.offset, c.len);
    if (!head) {
      read_status = std::move(head).error();
    } else {
      data = buf + *head;
      if (want_crc) crc = crc32_update(0, data, c.len);
    }
  } else {
    read_status = pread_full(st.fd, buf, src.file_offset + c.offset, c.len, want_crc, &crc);
  }
  if (!read_status) {
    release();
    Error e = std::move(read_status).error();
    e.at_offset(src.file_offset + c.offset);
    return unexpected(Error(e.code(), "storage " + std::to_string(c.storage) + ": " + e.message(), e.where()));
  }
  st.chunk_crc[ci] = crc;
  if (!st.wait_arena()) {  // the arena allocation failed: stop
    release();
    return {};
  }

  auto ev = eng.acquire_event();
  if (!ev) {
    release();
    return unexpected(std::move(ev).error());
  }
  Status issued = issue_copy(st, c, data, stream);
  if (cudaError_t e = cudaEventRecord(*ev, stream); e != cudaSuccess && issued)
    issued = device_error("cudaEventRecord", e);
  // A pageable source may still be read after cudaMemcpyAsync returns (the
  // API only says the call "might be synchronous"): wait for the copy before
  // the reader reuses its buffer.
  if (slot == nullptr && issued) {
    if (cudaError_t e = cudaEventSynchronize(*ev); e != cudaSuccess) issued = device_error("cudaEventSynchronize", e);
  }
  // Even after an error the event is queued: the completion thread waits on
  // it before the slot is reused. (If recording failed, the final stream
  // synchronization covers the copy.)
  push_inflight(st, InFlight{*ev, slot, nullptr, item_index});
  return issued;
}

Status run_registered_item(LoadState& st, std::uint32_t item_index, cudaStream_t stream) {
  detail::EngineState& eng = *st.eng;
  const Item& item = st.items[item_index];
  if (!st.wait_arena()) return {};
  {
    std::unique_lock<std::mutex> lock(st.reg_mu);
    st.reg_cv.wait(lock, [&] { return st.reg_in_flight < st.reg_max || st.failed.load(); });
    if (st.failed.load()) return {};
    ++st.reg_in_flight;
  }
  auto release_reg = [&] {
    {
      std::lock_guard<std::mutex> lock(st.reg_mu);
      --st.reg_in_flight;
    }
    st.reg_cv.notify_one();
  };
  void* block = const_cast<std::uint8_t*>(st.map->data()) + item.block_begin;
  if (cudaError_t e = cudaHostRegister(block, item.block_len, cudaHostRegisterReadOnly); e != cudaSuccess) {
    release_reg();
    return device_error("cudaHostRegister of file bytes [" + std::to_string(item.block_begin) + ", +" +
                            std::to_string(item.block_len) + ")",
                        e);
  }
  Status issued;
  for (std::uint32_t k = 0; k < item.count && issued; ++k) {
    const std::uint32_t ci = st.item_chunks[item.first + k];
    const Chunk& c = st.chunks[ci];
    const std::uint8_t* src = st.map->data() + st.sources[c.storage].file_offset + c.offset;
    if (st.checks_crc(st.sources[c.storage])) st.chunk_crc[ci] = crc32_update(0, src, c.len);
    issued = issue_copy(st, c, src, stream);
  }
  auto ev = eng.acquire_event();
  if (!ev) {
    (void)cudaStreamSynchronize(stream);
    (void)cudaHostUnregister(block);
    release_reg();
    return unexpected(std::move(ev).error());
  }
  if (cudaError_t e = cudaEventRecord(*ev, stream); e != cudaSuccess && issued)
    issued = device_error("cudaEventRecord", e);
  push_inflight(st, InFlight{*ev, nullptr, block, item_index});
  return issued;
}

void reader_main(LoadState& st, unsigned reader_index) {
  detail::EngineState& eng = *st.eng;
  PageableBuffer pageable;
  const cudaStream_t stream = eng.streams[reader_index % eng.streams.size()];
  if (cudaError_t e = cudaSetDevice(eng.opt.device); e != cudaSuccess) {
    st.fail(device_error("cudaSetDevice", e).error);
  } else {
    while (!st.failed.load(std::memory_order_relaxed)) {
      const std::size_t i = st.next_item.fetch_add(1, std::memory_order_relaxed);
      if (i >= st.items.size()) break;
      const auto idx = static_cast<std::uint32_t>(i);
      Status s =
          st.items[i].registered ? run_registered_item(st, idx, stream) : run_staged_item(st, idx, stream, pageable);
      if (!s) {
        st.fail(std::move(s).error());
        break;
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(st.q_mu);
    --st.readers_running;
  }
  st.q_cv.notify_all();
}

// Storage s has all its chunks on the device: check its CRC, report it.
// Empty storages are complete at the start and do not count as "first".
void storage_complete(LoadState& st, std::uint32_t s) {
  const StorageSource& src = st.sources[s];
  if (st.checks_crc(src)) {
    std::uint32_t crc = 0;
    bool first = true;
    for (std::uint32_t ci = st.storage_first_chunk[s]; ci < st.storage_first_chunk[s + 1]; ++ci) {
      const Chunk& c = st.chunks[ci];
      crc = first ? st.chunk_crc[ci]
                  : static_cast<std::uint32_t>(crc32_combine(crc, st.chunk_crc[ci], static_cast<z_off_t>(c.len)));
      first = false;
    }
    if (crc != src.expected_crc32) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "storage %u: CRC-32 mismatch: expected %08x, computed %08x over %llu bytes", s,
                    src.expected_crc32, crc, static_cast<unsigned long long>(src.nbytes));
      Error e(ErrorCode::kMalformed, buf);
      if (src.host_bytes == nullptr) e.at_offset(src.file_offset);
      st.fail(std::move(e));
      return;
    }
  }
  if (src.nbytes > 0) st.mark_first(st.first_ready_ns);
  if (st.eng->opt.on_storage_ready && !st.failed.load()) st.eng->opt.on_storage_ready(s);
}

void completion_main(LoadState& st) {
  detail::EngineState& eng = *st.eng;
  const bool device_ok = cudaSetDevice(eng.opt.device) == cudaSuccess;
  for (;;) {
    InFlight f;
    {
      std::unique_lock<std::mutex> lock(st.q_mu);
      st.q_cv.wait(lock, [&] { return !st.queue.empty() || st.readers_running == 0; });
      if (st.queue.empty()) break;  // readers done and nothing left
      f = st.queue.front();
      st.queue.pop_front();
    }
    cudaError_t err = device_ok ? cudaEventSynchronize(f.event) : cudaErrorInvalidDevice;
    if (err != cudaSuccess) st.fail(device_error("waiting for a copy (cudaEventSynchronize)", err).error);
    if (f.registered != nullptr) {
      if (cudaError_t e = cudaHostUnregister(f.registered); e != cudaSuccess)
        st.fail(device_error("cudaHostUnregister", e).error);
      {
        std::lock_guard<std::mutex> lock(st.reg_mu);
        --st.reg_in_flight;
      }
      st.reg_cv.notify_one();
    }
    eng.release_event(f.event);
    if (f.slot != nullptr) eng.release_slot(f.slot);
    if (err != cudaSuccess) continue;
    const Item& item = st.items[f.item];
    for (std::uint32_t k = 0; k < item.count; ++k) {
      const Chunk& c = st.chunks[st.item_chunks[item.first + k]];
      if (st.remaining[c.storage].fetch_sub(1, std::memory_order_acq_rel) == 1 && !st.failed.load())
        storage_complete(st, c.storage);
    }
  }
}

Status validate_options(const TransferOptions& o) {
  auto bad = [](std::string m) { return make_error(ErrorCode::kInvalidArgument, std::move(m)); };
  if (o.chunk_bytes < kMinChunk || o.chunk_bytes > kMaxChunk || o.chunk_bytes % kDirectAlign != 0)
    return bad("chunk_bytes must be a multiple of 4096 in [64 KiB, 1 GiB], got " + std::to_string(o.chunk_bytes));
  if (o.ring_bytes < o.chunk_bytes || o.ring_bytes > kMaxRing)
    return bad("ring_bytes must be in [chunk_bytes, 16 GiB], got " + std::to_string(o.ring_bytes));
  if (o.reader_threads > 256) return bad("reader_threads must be at most 256");
  if (o.streams < 1 || o.streams > 64) return bad("streams must be in [1, 64]");
  if (o.device < 0) return bad("device must be >= 0");
  switch (o.io_mode) {
    case IoMode::kAuto:
    case IoMode::kPread:
    case IoMode::kODirect:
    case IoMode::kMmapRegister: break;
    default: return bad("unknown io_mode");
  }
  return {};
}

}  // namespace

// ---------------------------------------------------------------------------
// Devices

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the non-sticky error
    return 0;
  }
  return n;
}

Result<std::string> device_description(int device) {
  cudaDeviceProp p{};
  if (cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess)
    return device_error("cudaGetDeviceProperties(" + std::to_string(device) + ")", e);
  int drv = 0, rt = 0;
  (void)cudaDriverGetVersion(&drv);
  (void)cudaRuntimeGetVersion(&rt);
  char buf[512];
  std::snprintf(buf, sizeof buf, "%s, sm_%d%d, %.1f GiB, driver %d.%d, runtime %d.%d", p.name, p.major, p.minor,
                static_cast<double>(p.totalGlobalMem) / (1ull << 30), drv / 1000, (drv % 1000) / 10, rt / 1000,
                (rt % 1000) / 10);
  return std::string(buf);
}

Result<DeviceMemory> device_memory(int device) {
  DeviceGuard guard;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return device_error("cudaSetDevice", e);
  std::size_t free_b = 0, total_b = 0;
  if (cudaError_t e = cudaMemGetInfo(&free_b, &total_b); e != cudaSuccess) return device_error("cudaMemGetInfo", e);
  return DeviceMemory{free_b, total_b};
}

std::string_view io_mode_name(IoMode mode) noexcept {
  switch (mode) {
    case IoMode::kAuto: return "auto";
    case IoMode::kPread: return "pread";
    case IoMode::kODirect: return "odirect";
    case IoMode::kMmapRegister: return "mmap_register";
  }
  return "invalid";
}

// ---------------------------------------------------------------------------
// DeviceArena

DeviceArena::DeviceArena(DeviceArena&& o) noexcept
    : device_(o.device_),
      base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      count_(std::exchange(o.count_, 0)),
      layout_(std::move(o.layout_)) {}

DeviceArena& DeviceArena::operator=(DeviceArena&& o) noexcept {
  if (this != &o) {
    reset();
    device_ = o.device_;
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    count_ = std::exchange(o.count_, 0);
    layout_ = std::move(o.layout_);
  }
  return *this;
}

DeviceArena::~DeviceArena() {
  reset();
}

void DeviceArena::reset() noexcept {
  if (base_ != nullptr) {
    DeviceGuard guard;
    if (cudaSetDevice(device_) == cudaSuccess) (void)cudaFree(base_);
    base_ = nullptr;
  }
  size_ = 0;
  count_ = 0;
  layout_.reset();
}

void* DeviceArena::storage_data(std::size_t i) const noexcept {
  if (i >= count_ || base_ == nullptr || layout_[2 * i + 1] == 0) return nullptr;
  return static_cast<std::uint8_t*>(base_) + layout_[2 * i];
}

std::uint64_t DeviceArena::storage_nbytes(std::size_t i) const noexcept {
  return i < count_ ? layout_[2 * i + 1] : 0;
}

Status DeviceArena::copy_to_host(std::size_t i, std::span<std::uint8_t> out) const {
  if (i >= count_)
    return make_error(ErrorCode::kInvalidArgument,
                      "storage index " + std::to_string(i) + " out of range (" + std::to_string(count_) + " storages)");
  if (out.size() != storage_nbytes(i))
    return make_error(ErrorCode::kInvalidArgument, "copy_to_host: buffer is " + std::to_string(out.size()) +
                                                       " bytes, storage " + std::to_string(i) + " has " +
                                                       std::to_string(storage_nbytes(i)));
  if (out.empty()) return {};
  DeviceGuard guard;
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) return device_error("cudaSetDevice", e);
  if (cudaError_t e = cudaMemcpy(out.data(), storage_data(i), out.size(), cudaMemcpyDeviceToHost); e != cudaSuccess)
    return device_error("cudaMemcpy device to host", e);
  return {};
}

// ---------------------------------------------------------------------------
// TransferEngine

TransferEngine::TransferEngine(std::unique_ptr<detail::EngineState> impl) : impl_(std::move(impl)) {}
TransferEngine::TransferEngine(TransferEngine&&) noexcept = default;
TransferEngine& TransferEngine::operator=(TransferEngine&&) noexcept = default;
TransferEngine::~TransferEngine() = default;

const TransferOptions& TransferEngine::options() const noexcept {
  return impl_->opt;
}
std::uint64_t TransferEngine::pinned_bytes() const noexcept {
  return impl_->pinned.load();
}

Result<TransferEngine> TransferEngine::create(const TransferOptions& options) {
  SAFECKPT_CHECK(validate_options(options));
  auto impl = std::make_unique<detail::EngineState>();
  impl->opt = options;
  unsigned hw = std::thread::hardware_concurrency();
  if (hw == 0) hw = 4;
  impl->readers = options.reader_threads ? options.reader_threads : std::min(16u, hw);
  // Room for O_DIRECT's aligned superset: up to 4095 bytes before and after.
  impl->slot_bytes = options.chunk_bytes + 2 * kDirectAlign;
  impl->max_slots = static_cast<std::size_t>(std::max<std::uint64_t>(1, options.ring_bytes / impl->slot_bytes));

  const int ndev = device_count();
  if (options.device >= ndev)
    return make_error(ErrorCode::kDevice, "CUDA device " + std::to_string(options.device) + " not present (" +
                                              std::to_string(ndev) + " device(s) visible)");
  DeviceGuard guard;
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) return device_error("cudaSetDevice", e);
  int ro = 0;
  if (cudaDeviceGetAttribute(&ro, cudaDevAttrHostRegisterReadOnlySupported, options.device) == cudaSuccess)
    impl->can_register_read_only = ro != 0;
  impl->streams.resize(options.streams, nullptr);
  for (auto& s : impl->streams) {
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      s = nullptr;
      impl->streams.erase(std::remove(impl->streams.begin(), impl->streams.end(), nullptr), impl->streams.end());
      return device_error("cudaStreamCreateWithFlags", e);
    }
  }
  if (!options.pageable_staging) {
    impl->preparing = true;
    try {
      impl->prep = std::thread([p = impl.get()] { p->prepare_ring(); });
    } catch (const std::system_error&) {
      impl->preparing = false;  // readers pin lazily instead
    }
  }
  return TransferEngine(std::move(impl));
}

// One load(). The file is `given_fd` when >= 0 (borrowed: the
// descriptor the host loader validated, MappedFile::fd()), else `file` opened
// here once. Either way every read of this load uses that one open file:
// buffered pread on it, its own MAP_SHARED mapping of it, and for O_DIRECT a
// reopen of /proc/self/fd/N, which yields a new open file description of the
// SAME inode (not a lookup of the path name, which may have been replaced).
Result<DeviceArena> TransferEngine::load_from(const std::filesystem::path& file, int given_fd,
                                              std::span<const StorageSource> sources, LoadStats* stats) {
  detail::EngineState& eng = *impl_;
  std::lock_guard<std::mutex> load_lock(eng.load_mu);
  DeviceGuard guard;  // the caller's current device is restored on return
  LoadState st;
  st.start = Clock::now();
  st.eng = &eng;
  st.sources = sources;
  st.verify = eng.opt.verify_crc;

  // 1. Validate the request (no device work yet).
  if (sources.size() >= (std::size_t{1} << 32) - 1)
    return make_error(ErrorCode::kInvalidArgument, "too many storages: " + std::to_string(sources.size()));
  bool need_file = false;
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto& s = sources[i];
    if (s.swap_unit != 1 && s.swap_unit != 2 && s.swap_unit != 4 && s.swap_unit != 8)
      return make_error(
          ErrorCode::kInvalidArgument,
          "storage " + std::to_string(i) + ": swap_unit must be 1, 2, 4 or 8, got " + std::to_string(s.swap_unit));
    if (s.nbytes % s.swap_unit != 0)
      return make_error(ErrorCode::kInvalidArgument, "storage " + std::to_string(i) + ": " + std::to_string(s.nbytes) +
                                                         " bytes is not a multiple of swap_unit " +
                                                         std::to_string(s.swap_unit));
    if (s.host_bytes == nullptr && s.nbytes > 0) {
      need_file = true;
      if (s.file_offset > UINT64_MAX - s.nbytes)
        return make_error(ErrorCode::kInvalidArgument,
                          "storage " + std::to_string(i) + ": file_offset + nbytes overflows");
    }
  }

  // 2. Open the file; pick the I/O mode.
  Fd fd, fd_direct;
  Mapping map;
  st.mode = eng.opt.io_mode;
  if (need_file) {
    int the_fd = given_fd;
    if (the_fd < 0) {
      if (file.empty())
        return make_error(ErrorCode::kInvalidArgument, "a storage is a file range but no file was given");
      fd = Fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
      if (fd.get() < 0)
        return make_error(ErrorCode::kIo, "open " + file.string() + ": " + errno_text(errno), Location{file.string()});
      the_fd = fd.get();
    }
    struct stat sb {};
    if (::fstat(the_fd, &sb) != 0)
      return make_error(ErrorCode::kIo, "fstat " + file.string() + ": " + errno_text(errno), Location{file.string()});
    if (!S_ISREG(sb.st_mode))
      return make_error(ErrorCode::kIo, file.string() + " is not a regular file", Location{file.string()});
    st.file_size = static_cast<std::uint64_t>(sb.st_size);
    for (std::size_t i = 0; i < sources.size(); ++i) {
      const auto& s = sources[i];
      if (s.host_bytes != nullptr || s.nbytes == 0) continue;
      if (s.file_offset > st.file_size || s.nbytes > st.file_size - s.file_offset)
        return make_error(ErrorCode::kMalformed,
                          "storage " + std::to_string(i) + ": bytes [" + std::to_string(s.file_offset) + ", " +
                              std::to_string(s.file_offset + s.nbytes) + ") end past the end of the file (" +
                              std::to_string(st.file_size) + " bytes)",
                          Location{file.string(), s.file_offset, {}});
    }
    const bool want_map = st.mode == IoMode::kAuto || st.mode == IoMode::kMmapRegister;
    if (want_map && !map.map(the_fd, st.file_size) && st.mode == IoMode::kMmapRegister) st.mode = IoMode::kPread;
    if (st.mode == IoMode::kMmapRegister && !eng.can_register_read_only) st.mode = IoMode::kPread;
    if (st.mode == IoMode::kMmapRegister) {
      // Some kernels / file systems refuse to pin file pages; find out with
      // one page rather than failing midway.
      (void)cudaSetDevice(eng.opt.device);
      void* probe = const_cast<std::uint8_t*>(map.data());
      if (cudaHostRegister(probe, std::min<std::uint64_t>(map.size(), kDirectAlign), cudaHostRegisterReadOnly) ==
          cudaSuccess) {
        (void)cudaHostUnregister(probe);
      } else {
        (void)cudaGetLastError();
        st.mode = IoMode::kPread;
      }
    }
    if (st.mode == IoMode::kAuto)
      st.mode = (map.size() > 0 && page_cache_residency(map, sources) < 0.5) ? IoMode::kODirect : IoMode::kPread;
    if (st.mode == IoMode::kODirect) {
      // Same inode as the_fd (see above); never the path name again.
      const std::string self = "/proc/self/fd/" + std::to_string(the_fd);
      fd_direct = Fd(::open(self.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT));
      if (fd_direct.get() >= 0) {
        struct stat db {};
        if (::fstat(fd_direct.get(), &db) != 0 || db.st_dev != sb.st_dev || db.st_ino != sb.st_ino) fd_direct.reset();
      }
      if (fd_direct.get() < 0) st.mode = IoMode::kPread;  // e.g. tmpfs: EINVAL; no /proc
    }
    st.fd = the_fd;
    st.fd_direct = fd_direct.get();
    st.map = &map;
  } else if (st.mode == IoMode::kAuto) {
    st.mode = IoMode::kPread;
  }

  // 3. Plan: arena layout, chunks, items.
  const std::size_t n = sources.size();
  auto layout = std::make_unique<std::uint64_t[]>(2 * n + 1);
  std::uint64_t total = 0, bytes = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t nb = sources[i].nbytes;
    const std::uint64_t off = align_up(total, kArenaAlignment);
    if (off < total || off > UINT64_MAX - nb)
      return make_error(ErrorCode::kInvalidArgument, "total storage bytes overflow");
    layout[2 * i] = off;
    layout[2 * i + 1] = nb;
    total = off + nb;
    bytes += nb;
  }
  const std::uint64_t chunk = eng.opt.chunk_bytes;
  st.storage_first_chunk.resize(n + 1);
  st.remaining = std::make_unique<std::atomic<std::uint32_t>[]>(n);
  for (std::size_t i = 0; i < n; ++i) {
    st.storage_first_chunk[i] = static_cast<std::uint32_t>(st.chunks.size());
    const auto& s = sources[i];
    const bool registered =
        st.mode == IoMode::kMmapRegister && s.host_bytes == nullptr && s.file_offset % s.swap_unit == 0;
    // Registered storages are cut at block boundaries (file offsets), staged
    // ones every `chunk` bytes from their start.
    const std::uint64_t block = 4 * chunk;
    std::uint64_t off = 0;
    std::uint32_t count = 0;
    while (off < s.nbytes) {
      std::uint64_t len = std::min(chunk, s.nbytes - off);
      if (registered) {
        const std::uint64_t pos = s.file_offset + off;
        len = std::min(s.nbytes - off, align_down(pos, block) + block - pos);
      }
      if (st.chunks.size() >= UINT32_MAX - 1)
        return make_error(ErrorCode::kInvalidArgument, "too many chunks; raise chunk_bytes");
      st.chunks.push_back(Chunk{static_cast<std::uint32_t>(i), off, len});
      off += len;
      ++count;
    }
    st.remaining[i].store(count);
  }
  st.storage_first_chunk[n] = static_cast<std::uint32_t>(st.chunks.size());
  st.chunk_crc.assign(st.chunks.size(), 0);
  st.item_chunks.reserve(st.chunks.size());
  if (st.mode == IoMode::kMmapRegister) {
    // Group registered pieces by file block, staged ones one per item; items
    // sorted by the position of their first byte in storage order.
    const std::uint64_t block = 4 * chunk;
    struct Key {
      std::uint64_t block;  // UINT64_MAX for staged
      std::uint32_t chunk;
    };
    std::vector<Key> keys;
    keys.reserve(st.chunks.size());
    for (std::uint32_t ci = 0; ci < st.chunks.size(); ++ci) {
      const Chunk& c = st.chunks[ci];
      const auto& s = sources[c.storage];
      const bool registered = s.host_bytes == nullptr && s.file_offset % s.swap_unit == 0;
      keys.push_back(Key{registered ? (s.file_offset + c.offset) / block : UINT64_MAX, ci});
    }
    // First appearance order of each block keeps storage order.
    std::vector<std::uint32_t> order;
    std::vector<std::pair<std::uint64_t, std::uint32_t>> by_block;  // block -> item
    for (const Key& k : keys) {
      if (k.block == UINT64_MAX) {
        st.items.push_back(Item{static_cast<std::uint32_t>(st.item_chunks.size()), 1, false, 0, 0});
        st.item_chunks.push_back(k.chunk);
        continue;
      }
      by_block.emplace_back(k.block, k.chunk);
    }
    std::stable_sort(by_block.begin(), by_block.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    const std::uint64_t mapped_end = align_up(st.file_size, kDirectAlign);
    for (std::size_t j = 0; j < by_block.size();) {
      std::size_t k = j;
      Item item{static_cast<std::uint32_t>(st.item_chunks.size()), 0, true, by_block[j].first * block, 0};
      item.block_len = std::min(block, mapped_end - item.block_begin);
      while (k < by_block.size() && by_block[k].first == by_block[j].first) {
        st.item_chunks.push_back(by_block[k].second);
        ++item.count;
        ++k;
      }
      st.items.push_back(item);
      j = k;
    }
    st.reg_max = 2 * static_cast<std::size_t>(eng.readers);
  } else {
    for (std::uint32_t ci = 0; ci < st.chunks.size(); ++ci) {
      st.items.push_back(Item{ci, 1, false, 0, 0});
      st.item_chunks.push_back(ci);
    }
  }

  // 4. The arena object (allocated in step 5, while the first reads run).
  if (cudaError_t e = cudaSetDevice(eng.opt.device); e != cudaSuccess) return device_error("cudaSetDevice", e);
  DeviceArena arena;
  arena.device_ = eng.opt.device;
  arena.count_ = n;
  arena.layout_ = std::move(layout);
  st.layout = arena.layout_.get();
  {
    std::lock_guard<std::mutex> lock(eng.ring_mu);
    eng.peak_in_use = eng.in_use;
    eng.slots_pinned_now = 0;
    eng.pin_seconds_now = 0;
  }
  // cudaMalloc of the arena, on this thread once the readers have started:
  // 0.5-3 ms for 6 GiB on the H200 machine, hidden behind the first reads
  // (~1.5 ms for 16 x 4 MiB). Readers wait for it before their first copy.
  double alloc_seconds = 0;
  auto allocate_arena = [&] {
    const auto alloc_start = Clock::now();
    if (total > 0 && !st.failed.load()) {
      void* base = nullptr;
      if (cudaError_t e = cudaMalloc(&base, total); e != cudaSuccess) {
        (void)cudaGetLastError();
        st.fail(
            device_error("cudaMalloc of " + std::to_string(total) + " bytes for " + std::to_string(n) + " storages", e)
                .error);
      } else {
        arena.base_ = base;
        arena.size_ = total;
        st.arena = static_cast<std::uint8_t*>(base);
      }
    }
    alloc_seconds = std::chrono::duration<double>(Clock::now() - alloc_start).count();
    if (!st.failed.load()) st.publish_arena();
  };

  // Empty storages are complete at once.
  for (std::size_t i = 0; i < n; ++i)
    if (sources[i].nbytes == 0) storage_complete(st, static_cast<std::uint32_t>(i));

  // 5. Run: readers + completion thread.
  const unsigned nreaders =
      static_cast<unsigned>(std::min<std::size_t>(eng.readers, std::max<std::size_t>(1, st.items.size())));
  if (!st.items.empty() && !st.failed.load()) {
    st.readers_running = nreaders;
    std::vector<std::thread> threads;
    threads.reserve(nreaders);
    std::thread completion;
    try {
      completion = std::thread([&st] { completion_main(st); });
      for (unsigned r = 0; r < nreaders; ++r) threads.emplace_back([&st, r] { reader_main(st, r); });
    } catch (const std::system_error& e) {
      // Could not start a thread: stop, and account for readers never started.
      {
        std::lock_guard<std::mutex> lock(st.q_mu);
        st.readers_running -= nreaders - static_cast<unsigned>(threads.size());
      }
      st.fail(Error(ErrorCode::kIo, std::string("could not start a loader thread: ") + e.what()));
    }
    allocate_arena();
    for (auto& t : threads) t.join();
    if (completion.joinable()) {
      completion.join();
    } else {
      completion_main(st);  // drain on this thread
    }
  } else {
    allocate_arena();  // nothing to read (every storage empty) or already failed
  }
  // Everything issued has been waited for by the completion thread; make sure
  // of it (and of copies whose event could not be recorded) before the arena
  // can be freed or the slots reused.
  for (auto s : eng.streams) {
    if (cudaError_t e = cudaStreamSynchronize(s); e != cudaSuccess && !st.failed.load())
      st.fail(device_error("cudaStreamSynchronize", e).error);
  }

  const auto end = Clock::now();
  if (stats) {
    *stats = LoadStats{};
    stats->bytes = bytes;
    stats->arena_bytes = total;
    stats->seconds = std::chrono::duration<double>(end - st.start).count();
    const std::int64_t first = st.first_ready_ns.load();
    stats->seconds_to_first_storage = first >= 0 ? static_cast<double>(first) * 1e-9 : stats->seconds;
    const std::int64_t first_copy = st.first_copy_ns.load();
    stats->seconds_to_first_copy = first_copy >= 0 ? static_cast<double>(first_copy) * 1e-9 : 0;
    {
      std::lock_guard<std::mutex> lock(eng.ring_mu);
      stats->peak_ring_bytes = eng.peak_in_use * eng.slot_bytes;
      stats->slots_pinned = eng.slots_pinned_now;
      stats->seconds_pinning = eng.pin_seconds_now;
      stats->seconds_ring_ready = eng.preparing ? 0 : eng.ring_ready_seconds;
    }
    stats->seconds_device_alloc = alloc_seconds;
    stats->pageable_chunks = st.pageable_chunks.load();
    stats->ring_bytes_pinned = eng.pinned.load();
    stats->io_mode = need_file ? st.mode : IoMode::kPread;
    stats->reader_threads = nreaders;
    stats->streams = static_cast<unsigned>(eng.streams.size());
    stats->chunks = st.chunks.size();
  }
  if (st.failed.load()) {
    arena.reset();  // frees the device memory now
    std::lock_guard<std::mutex> lock(st.err_mu);
    Error e = st.error ? std::move(*st.error) : Error(ErrorCode::kInternal, "load failed without an error");
    if (need_file) e.at_record(file.string());
    return unexpected(std::move(e));
  }
  return arena;
}

Result<DeviceArena> TransferEngine::load(const std::filesystem::path& file, std::span<const StorageSource> sources,
                                         LoadStats* stats) {
  return load_from(file, -1, sources, stats);
}

Result<DeviceArena> TransferEngine::load(const MappedFile& file, std::span<const StorageSource> sources,
                                         LoadStats* stats) {
  return load_from(file.path(), file.fd(), sources, stats);
}

Result<DeviceArena> load_storages(const std::filesystem::path& file, std::span<const StorageSource> sources,
                                  const TransferOptions& options, LoadStats* stats) {
  SAFECKPT_TRY(TransferEngine engine, TransferEngine::create(options));
  return engine.load(file, sources, stats);
}

}  // namespace safeckpt::cuda
