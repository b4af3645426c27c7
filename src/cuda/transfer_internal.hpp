// src/cuda/transfer_internal.hpp — the transfer engine's internals, shared by
// its files (not installed). The contract is safeckpt/cuda.hpp; the design
// (items, threads, failure) is described at the top of transfer.cpp.
//
//   engine.cpp       devices, options, TransferEngine::create, DeviceArena
//   pinned_ring.cpp  EngineState: the pinned staging ring, events
//   readers.cpp      reader threads: pread / O_DIRECT / registered mmap, copies
//   completion.cpp   completion thread: events, slots back, CRC per storage
//   transfer.cpp     one load(): plan, I/O mode, arena, threads, statistics
#pragma once

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
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "cuda/internal.hpp"
#include "safeckpt/cuda.hpp"

namespace safeckpt::cuda::detail {

using Clock = std::chrono::steady_clock;

constexpr std::uint64_t kDirectAlign = 4096;  // O_DIRECT offset/length/buffer alignment (safe for 512e/4Kn)
constexpr std::uint64_t kMinChunk = 64ull << 10;
constexpr std::uint64_t kMaxChunk = 1ull << 30;
constexpr std::uint64_t kMaxRing = 16ull << 30;
constexpr std::uint64_t kCrcPiece = 1ull << 20;  // pread+CRC granularity: CRC runs on L2-resident bytes

inline std::string cuda_message(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

inline Unexpected device_error(const std::string& what, cudaError_t e) {
  return make_error(ErrorCode::kDevice, what + " failed: " + cuda_message(e));
}

inline std::string errno_text(int err) {
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
double page_cache_residency(const Mapping& map, std::span<const StorageSource> sources);

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
  std::uint32_t file = 0;  // registered: index into LoadState::files
};

// One file a load reads: a path to open, or a borrowed descriptor (>= 0).
struct LoadInput {
  std::filesystem::path path;
  int fd = -1;
};

// load_into(): the caller's device memory and, per source, its offset there.
struct Placement {
  std::uint8_t* base = nullptr;
  std::uint64_t bytes = 0;
  std::span<const std::uint64_t> offsets;                      // one per source
  const std::function<void(std::size_t)>* on_ready = nullptr;  // this load's own callback, if any
};

// A file of one load, open for its duration.
struct LoadFile {
  int fd = -1;         // buffered
  int fd_direct = -1;  // O_DIRECT, when mode == kODirect
  std::uint64_t size = 0;
  const Mapping* map = nullptr;  // kMmapRegister (and the kAuto probe)
  std::string name;              // for errors
};

struct Slot {
  std::uint8_t* host = nullptr;
  bool in_ring_map = false;  // part of EngineState's mapping (cudaHostRegister), else cudaHostAlloc
};

struct InFlight {
  cudaEvent_t event = nullptr;
  Slot* slot = nullptr;
  void* registered = nullptr;  // block to cudaHostUnregister once done
  std::uint32_t item = 0;
};

struct EngineState {
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

  ~EngineState();

  // Pins the ring in the background (started by create()); why this way:
  // pinned_ring.cpp.
  void prepare_ring();

  // Touches slots [0, n) of `base` on helper threads and registers each, in
  // order, on this thread. Returns how many were registered (n unless the
  // engine is being destroyed or a CUDA call failed).
  std::size_t register_slots(std::uint8_t* base, std::size_t n);

  Result<cudaEvent_t> acquire_event();
  void release_event(cudaEvent_t e);

  // Returns a slot, pinning a new one when none is free and the ring has room,
  // or nullptr when `stop` became true while waiting (pinned_ring.cpp).
  Result<Slot*> acquire_slot(const std::atomic<bool>& stop);
  void release_slot(Slot* s);
};

// State of one load() call.
struct LoadState {
  detail::EngineState* eng = nullptr;
  std::span<const StorageSource> sources;
  std::uint8_t* arena = nullptr;
  const std::uint64_t* layout = nullptr;  // offset, nbytes per storage
  IoMode mode = IoMode::kPread;
  std::vector<LoadFile> files;
  std::span<const std::uint32_t> file_of;                      // per source; empty: every source reads files[0]
  const std::function<void(std::size_t)>* on_ready = nullptr;  // load_into's per-load callback
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
  // The file source `s` reads.
  const LoadFile& file_for(std::uint32_t s) const { return files[file_of.empty() ? 0 : file_of[s]]; }
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

// readers.cpp
// Reads [off, off+len) of the file into dst with buffered pread, computing
// the CRC on each piece right after it lands (still in L2).
Status pread_full(int fd, std::uint8_t* dst, std::uint64_t off, std::uint64_t len, bool crc, std::uint32_t* crc_out);
// O_DIRECT: reads the 4096-aligned superset of [off, off+len) into dst (a
// pinned slot: page-aligned, chunk + 8 KiB long); returns the offset of the
// wanted bytes inside dst.
Result<std::uint64_t> pread_direct(int fd, std::uint8_t* dst, std::uint64_t off, std::uint64_t len);
// Enqueues the copy (and swap) of `len` host bytes at `src` to chunk c's place.
Status issue_copy(LoadState& st, const Chunk& c, const std::uint8_t* src, cudaStream_t stream);
void push_inflight(LoadState& st, InFlight f);
void reader_main(LoadState& st, unsigned reader_index);

// completion.cpp
void storage_complete(LoadState& st, std::uint32_t s);
void completion_main(LoadState& st);

// engine.cpp
Status validate_options(const TransferOptions& o);

}  // namespace safeckpt::cuda::detail
