// load_to_device: host metadata from safeckpt::load, bytes through the
// transfer engine. See include/safeckpt/device_checkpoint.hpp.
#include "safeckpt/device_checkpoint.hpp"

#include <cuda_runtime_api.h>

#include <charconv>
#include <optional>

#include "safeckpt/safetensors.hpp"

namespace safeckpt::cuda {
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

Result<DeviceCheckpoint> load_to_device(const std::filesystem::path& path, const DeviceLoadOptions& options,
                                        TransferEngine* engine, LoadStats* stats) {
  SAFECKPT_TRY(int device, parse_device(options.map_location));
  if (engine != nullptr && engine->options().device != device)
    return make_error(ErrorCode::kInvalidArgument,
                      "map_location '" + options.map_location + "' is device " + std::to_string(device) +
                          " but the engine was created for device " + std::to_string(engine->options().device));
  // Without a caller's engine, make one before parsing: it starts pinning its
  // staging ring in the background, overlapping the host parse. An error
  // creating it is reported only if the file itself loads.
  std::optional<Result<TransferEngine>> own;
  if (engine == nullptr) {
    TransferOptions to = options.transfer;
    to.device = device;
    own.emplace(TransferEngine::create(to));
  }
  LoadOptions lo = options.load;
  lo.verify_storage_crc = false;  // checked on the reader threads instead (no second pass)
  // safetensors files go through the safetensors reader (same storages, file
  // offsets into the same file); everything else through the checkpoint loader.
  auto host_r = [&]() -> Result<Checkpoint> {
    auto mf = MappedFile::open(path);
    if (mf && sniff_format(mf->bytes()) == FileFormat::kSafetensors) {
      SafetensorsOptions so;
      so.limits = lo.limits;
      return load_safetensors(path, so);
    }
    return safeckpt::load(path, lo);
  }();
  if (!host_r) return unexpected(std::move(host_r).error());
  Checkpoint host = std::move(host_r).value();
  const bool verify_crc = engine != nullptr ? engine->options().verify_crc : options.transfer.verify_crc;
  const auto& storages = host.storages();
  std::vector<StorageSource> sources(storages.size());
  Bytes file = host.file().bytes();
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const StorageInfo& s = storages[i];
    StorageSource& src = sources[i];
    src.nbytes = s.nbytes;
    bool in_file =
        s.file_offset != Location::kNoOffset && s.file_offset <= file.size() && s.nbytes <= file.size() - s.file_offset;
    if (in_file) {
      // Stored record (or legacy raw storage): read straight from the file;
      // big-endian files are swapped on the device.
      src.file_offset = s.file_offset;
      src.swap_unit = s.swap_unit;
      src.expected_crc32 = verify_crc ? s.crc32 : 0;
    } else {
      // Inflated record or bytes decoded from the pickle: already little-endian in host memory.
      src.host_bytes = s.bytes.data();
      src.swap_unit = 1;
    }
  }
  if (engine == nullptr) {
    if (!*own) return unexpected(std::move(*own).error());
    engine = &own->value();
  }
  Result<DeviceArena> arena = engine->load(path, sources, stats);
  if (!arena) {
    Error e = std::move(arena).error();
    e.at_record(path.string());
    return unexpected(std::move(e));
  }
  DeviceCheckpoint d;
  d.host_ = std::make_shared<Checkpoint>(std::move(host));
  d.arena_ = std::make_shared<DeviceArena>(std::move(arena).value());
  return d;
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
