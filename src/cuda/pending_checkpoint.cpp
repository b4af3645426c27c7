// PendingDeviceCheckpoint: load_to_device whose transfer runs on a background
// thread after the arena is allocated, so device addresses are known before
// the bytes land. See include/safeckpt/device_checkpoint.hpp.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <system_error>
#include <thread>

#include "cuda/device_internal.hpp"
#include "safeckpt/open.hpp"

namespace safeckpt::cuda {

struct PendingDeviceCheckpoint::State {
  DeviceCheckpoint ckpt;
  std::optional<Result<TransferEngine>> own;
  TransferEngine* engine = nullptr;
  std::vector<PlacedSource> placed;
  std::size_t count = 0;
  std::unique_ptr<std::atomic<bool>[]> ready;
  std::vector<std::pair<std::uintptr_t, std::uint32_t>> by_address;  // (first byte, storage), ascending
  mutable std::mutex mu;
  mutable std::condition_variable cv;
  bool done = false;           // under mu
  std::optional<Error> error;  // under mu
  LoadStats stats;             // under mu, set when done
  std::chrono::steady_clock::time_point start;
  std::thread thread;

  void run() {
    const MappedFile* files[1] = {&ckpt.checkpoint().file()};
    LoadStats s;
    const std::function<void(std::size_t)> on_ready = [this](std::size_t i) {
      ready[i].store(true, std::memory_order_release);
      { std::lock_guard<std::mutex> lock(mu); }  // a waiter is blocked or will see the flag
      cv.notify_all();
    };
    Status st = engine->load_into(files, placed, ckpt.arena().base(), ckpt.arena().size_bytes(), &s, on_ready);
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!st) {
        Error e = std::move(st).error();
        if (!ckpt.checkpoint().file().path().empty()) e.at_record(ckpt.checkpoint().file().path().string());
        error = std::move(e);
      }
      stats = s;
      done = true;
    }
    cv.notify_all();
  }
};

PendingDeviceCheckpoint::PendingDeviceCheckpoint(std::unique_ptr<State> state) : state_(std::move(state)) {}

PendingDeviceCheckpoint::~PendingDeviceCheckpoint() {
  if (state_ && state_->thread.joinable()) state_->thread.join();
}

Result<std::shared_ptr<PendingDeviceCheckpoint>> PendingDeviceCheckpoint::start(const std::filesystem::path& path,
                                                                                const DeviceLoadOptions& options,
                                                                                TransferEngine* engine) {
  auto state = std::make_unique<State>();
  state->start = std::chrono::steady_clock::now();
  SAFECKPT_TRY(int device, detail::engine_device(options, engine));
  state->own = detail::one_shot_engine(options, engine, device);  // pins its ring while the file is parsed
  LoadOptions lo = options.load;
  lo.verify_storage_crc = false;  // checked on the reader threads, as load_to_device
  SAFECKPT_TRY(Checkpoint host, safeckpt::open(path, lo));
  if (engine == nullptr) {
    if (!*state->own) return unexpected(std::move(*state->own).error());
    engine = &state->own->value();
  }
  state->engine = engine;
  const bool verify_crc = engine->options().verify_crc;
  const std::vector<StorageSource> sources = detail::storage_sources(host, verify_crc);
  std::vector<std::uint64_t> sizes;
  sizes.reserve(sources.size());
  for (const auto& s : sources) sizes.push_back(s.nbytes);
  SAFECKPT_TRY(DeviceArena arena, DeviceArena::allocate(device, sizes));
  auto shared_arena = std::make_shared<DeviceArena>(std::move(arena));
  const auto* base = static_cast<const std::uint8_t*>(shared_arena->base());
  state->placed.reserve(sources.size());
  for (std::size_t i = 0; i < sources.size(); ++i) {
    const auto* at = static_cast<const std::uint8_t*>(shared_arena->storage_data(i));
    state->placed.push_back(PlacedSource{sources[i], 0, at != nullptr ? static_cast<std::uint64_t>(at - base) : 0});
    if (at != nullptr)
      state->by_address.emplace_back(reinterpret_cast<std::uintptr_t>(at), static_cast<std::uint32_t>(i));
  }
  std::sort(state->by_address.begin(), state->by_address.end());
  state->count = sources.size();
  state->ready = std::make_unique<std::atomic<bool>[]>(sources.size());
  state->ckpt =
      detail::DeviceCheckpointMaker::make(std::make_shared<Checkpoint>(std::move(host)), std::move(shared_arena));
  State* raw = state.get();
  std::shared_ptr<PendingDeviceCheckpoint> out(new PendingDeviceCheckpoint(std::move(state)));
  try {
    raw->thread = std::thread([raw] { raw->run(); });
  } catch (const std::system_error& e) {
    return make_error(ErrorCode::kIo, std::string("could not start the loading thread: ") + e.what());
  }
  return out;
}

const DeviceCheckpoint& PendingDeviceCheckpoint::checkpoint() const noexcept {
  return state_->ckpt;
}

std::size_t PendingDeviceCheckpoint::storage_count() const noexcept {
  return state_->count;
}

bool PendingDeviceCheckpoint::ready(std::uint32_t storage) const noexcept {
  if (storage >= state_->count) return false;
  if (!state_->ready[storage].load(std::memory_order_acquire)) return false;
  std::lock_guard<std::mutex> lock(state_->mu);
  return !state_->error.has_value();
}

Status PendingDeviceCheckpoint::wait(std::uint32_t storage) const {
  State& s = *state_;
  if (storage >= s.count)
    return make_error(ErrorCode::kInvalidArgument, "PendingDeviceCheckpoint::wait: storage " + std::to_string(storage) +
                                                       " of " + std::to_string(s.count));
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return s.ready[storage].load(std::memory_order_acquire) || s.done; });
  if (s.error) return unexpected(*s.error);
  if (!s.ready[storage].load(std::memory_order_acquire))
    return make_error(ErrorCode::kInternal, "load ended without storage " + std::to_string(storage));
  return {};
}

std::optional<std::uint32_t> PendingDeviceCheckpoint::storage_at(const void* p) const noexcept {
  const auto& v = state_->by_address;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  auto it = std::upper_bound(v.begin(), v.end(), std::make_pair(a, UINT32_MAX));
  if (it == v.begin()) return std::nullopt;
  --it;
  const std::uint64_t n = state_->ckpt.arena().storage_nbytes(it->second);
  if (a - it->first >= n) return std::nullopt;
  return it->second;
}

Status PendingDeviceCheckpoint::wait_all() const {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.cv.wait(lock, [&] { return s.done; });
  if (s.error) return unexpected(*s.error);
  return {};
}

LoadStats PendingDeviceCheckpoint::stats() const {
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done ? state_->stats : LoadStats{};
}

}  // namespace safeckpt::cuda
