// src/cuda/engine.cpp — devices, engine options and creation, DeviceArena.
#include "cuda/transfer_internal.hpp"

namespace safeckpt::cuda {
namespace detail {

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

}  // namespace detail

using namespace detail;  // the engine internals (transfer_internal.hpp)

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

Result<DeviceArena> DeviceArena::allocate(int device, std::span<const std::uint64_t> sizes) {
  DeviceArena a;
  a.device_ = device;
  a.count_ = sizes.size();
  a.layout_ = std::make_unique<std::uint64_t[]>(2 * sizes.size() + 1);
  std::uint64_t off = 0;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    a.layout_[2 * i] = off;
    a.layout_[2 * i + 1] = sizes[i];
    if (sizes[i] > (std::uint64_t{1} << 62) - off)
      return make_error(ErrorCode::kLimitExceeded, "DeviceArena::allocate: sizes overflow");
    off += (sizes[i] + 255) / 256 * 256;
  }
  a.size_ = off;
  if (off == 0) return a;
  DeviceGuard guard;
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
    return make_error(ErrorCode::kDevice, std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  if (cudaError_t e = cudaMalloc(&a.base_, off); e != cudaSuccess) {
    a.base_ = nullptr;
    return make_error(ErrorCode::kDevice,
                      "cudaMalloc of " + std::to_string(off) + " bytes: " + std::string(cudaGetErrorString(e)));
  }
  return a;
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

}  // namespace safeckpt::cuda
