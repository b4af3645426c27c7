// load_to_device: host metadata from safeckpt::load, bytes through the
// transfer engine. See include/safeckpt/device_checkpoint.hpp.
#include "safeckpt/device_checkpoint.hpp"

#include <cuda_runtime_api.h>

#include <charconv>
#include <optional>

#include "safeckpt/open.hpp"

namespace safeckpt::cuda {

struct detail::DeviceCheckpointMaker {
  static DeviceCheckpoint make(std::shared_ptr<Checkpoint> host, std::shared_ptr<DeviceArena> arena) {
    DeviceCheckpoint d;
    d.host_ = std::move(host);
    d.arena_ = std::move(arena);
    return d;
  }
};

namespace {

Result<int> parse_device(const std::string& loc) {
  if (loc == "cuda") {  // torch: the current device
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) {
      (void)cudaGetLastError();
      d = 0;
    }
    return d;
  }
  if (loc.rfind("cuda:", 0) != 0)
    return make_error(ErrorCode::kInvalidArgument, "map_location must be 'cuda' or 'cuda:N', got '" + loc + "'");
  int d = -1;
  auto [p, ec] = std::from_chars(loc.data() + 5, loc.data() + loc.size(), d);
  if (ec != std::errc() || p != loc.data() + loc.size() || d < 0)
    return make_error(ErrorCode::kInvalidArgument, "bad device index in '" + loc + "'");
  return d;
}

}  // namespace

namespace {

Result<int> engine_device(const DeviceLoadOptions& options, TransferEngine* engine) {
  SAFECKPT_TRY(int device, parse_device(options.map_location));
  if (engine != nullptr && engine->options().device != device)
    return make_error(ErrorCode::kInvalidArgument,
                      "map_location '" + options.map_location + "' is device " + std::to_string(device) +
                          " but the engine was created for device " + std::to_string(engine->options().device));
  return device;
}

// The upload half: every storage from host.file() (its descriptor, never its
// path) or from host memory, through `engine`, or through `own` when null.
Result<DeviceCheckpoint> upload(Checkpoint host, const DeviceLoadOptions& options, TransferEngine* engine,
                                std::optional<Result<TransferEngine>>& own, LoadStats* stats) {
  const bool verify_crc = engine != nullptr ? engine->options().verify_crc : options.transfer.verify_crc;
  const auto& storages = host.storages();
  std::vector<StorageSource> sources(storages.size());
  Bytes file = host.file().bytes();
  const bool have_fd = host.file().fd() >= 0;
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const StorageInfo& s = storages[i];
    StorageSource& src = sources[i];
    src.nbytes = s.nbytes;
    bool in_file = have_fd && s.file_offset != Location::kNoOffset && s.file_offset <= file.size() &&
                   s.nbytes <= file.size() - s.file_offset;
    if (in_file) {
      // Stored record (or legacy raw storage): read straight from the file;
      // big-endian files are swapped on the device.
      src.file_offset = s.file_offset;
      src.swap_unit = s.swap_unit;
      src.expected_crc32 = verify_crc ? s.crc32 : 0;
    } else {
      // Inflated record, bytes decoded from the pickle, a shard of a sharded
      // index, or a checkpoint over a buffer: little-endian in host memory.
      src.host_bytes = s.bytes.data();
      src.swap_unit = 1;
    }
  }
  if (engine == nullptr) {
    if (!*own) return unexpected(std::move(*own).error());
    engine = &own->value();
  }
  Result<DeviceArena> arena = engine->load(host.file(), sources, stats);
  if (!arena) {
    Error e = std::move(arena).error();
    if (!host.file().path().empty()) e.at_record(host.file().path().string());
    return unexpected(std::move(e));
  }
  return detail::DeviceCheckpointMaker::make(std::make_shared<Checkpoint>(std::move(host)),
                                             std::make_shared<DeviceArena>(std::move(arena).value()));
}

std::optional<Result<TransferEngine>> one_shot_engine(const DeviceLoadOptions& options, TransferEngine* engine,
                                                      int device) {
  std::optional<Result<TransferEngine>> own;
  if (engine == nullptr) {
    TransferOptions to = options.transfer;
    to.device = device;
    own.emplace(TransferEngine::create(to));
  }
  return own;
}

}  // namespace

Result<DeviceCheckpoint> load_to_device(const std::filesystem::path& path, const DeviceLoadOptions& options,
                                        TransferEngine* engine, LoadStats* stats) {
  SAFECKPT_TRY(int device, engine_device(options, engine));
  // Without a caller's engine, make one before parsing: it starts pinning its
  // staging ring in the background, overlapping the host parse. An error
  // creating it is reported only if the file itself loads.
  std::optional<Result<TransferEngine>> own = one_shot_engine(options, engine, device);
  LoadOptions lo = options.load;
  lo.verify_storage_crc = false;  // checked on the reader threads instead (no second pass)
  // One open for the whole load: safeckpt::open maps the file, dispatches
  // by content (zip, legacy, pickle, safetensors, sharded index) and the
  // Checkpoint keeps that descriptor, which the engine then reads.
  SAFECKPT_TRY(Checkpoint host, safeckpt::open(path, lo));
  return upload(std::move(host), options, engine, own, stats);
}

Result<DeviceCheckpoint> load_to_device(Checkpoint host, const DeviceLoadOptions& options, TransferEngine* engine,
                                        LoadStats* stats) {
  SAFECKPT_TRY(int device, engine_device(options, engine));
  std::optional<Result<TransferEngine>> own = one_shot_engine(options, engine, device);
  return upload(std::move(host), options, engine, own, stats);
}

Result<TensorView> DeviceCheckpoint::view(std::uint32_t index) const {
  const auto& ts = host_->tensors();
  if (index >= ts.size()) return make_error(ErrorCode::kInvalidArgument, "tensor index out of range");
  const TensorInfo& t = ts[index];
  if (t.layout != Layout::kStrided || t.storage == kNoStorage || t.is_meta)
    return make_error(ErrorCode::kInvalidArgument,
                      "tensor " + std::to_string(index) + " is not a strided tensor with a storage");
  TensorView v = arena_view(*arena_, t.storage);
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.strides = t.stride;
  v.storage_offset = t.storage_offset;
  return v;
}

std::vector<DeviceTensor> DeviceCheckpoint::tensors() const {
  std::vector<DeviceTensor> out;
  for (const auto& n : host_->state_dict()) {
    const TensorInfo& t = host_->tensors()[n.tensor];
    if (t.layout != Layout::kStrided || t.storage == kNoStorage || t.is_meta || t.qscheme != QScheme::kNone) continue;
    DeviceTensor d;
    d.name = n.name;
    d.tensor = n.tensor;
    d.dtype = t.dtype;
    d.shape = t.shape;
    d.stride = t.stride;
    d.nbytes = t.numel() * dtype_size(t.dtype);
    d.device = arena_->device();
    auto* base = static_cast<std::uint8_t*>(arena_->storage_data(t.storage));
    d.data = d.nbytes == 0 || base == nullptr
                 ? nullptr
                 : base + static_cast<std::uint64_t>(t.storage_offset) * dtype_size(t.dtype);
    out.push_back(std::move(d));
  }
  return out;
}

Result<DLManagedTensorVersioned*> DeviceCheckpoint::to_dlpack(std::uint32_t index, bool read_only) const {
  SAFECKPT_TRY(TensorView v, view(index));
  return to_dlpack_versioned(v, arena_, read_only);
}

Result<DLManagedTensor*> DeviceCheckpoint::to_dlpack_legacy(std::uint32_t index) const {
  SAFECKPT_TRY(TensorView v, view(index));
  return safeckpt::cuda::to_dlpack_legacy(v, arena_);
}

}  // namespace safeckpt::cuda
