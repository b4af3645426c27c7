// safeckpt/device_checkpoint.hpp — a checkpoint loaded into GPU memory.
//
// load_to_device() runs the same verified host loader as safeckpt::load
// (value tree, allowlist, view checks — no shortcuts), then streams every
// storage's bytes from the file to the device through the transfer engine
// (safeckpt/cuda.hpp): reader threads -> fixed pinned ring -> cudaMemcpyAsync,
// CRC-32 of stored records checked on the reader threads (when enabled;
// deflated records are checked by the host loader as they are inflated),
// big-endian storages swapped on the device. Nothing is handed out on
// failure: the device arena is freed and the error returned.
//
// Tensors keep their host metadata (Checkpoint::tensors()); their bytes live
// in one device arena. Views share their device storage, as on the host.
// Only in safeckpt::cuda (link safeckpt::cuda); the core never includes CUDA.
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/cuda.hpp"

namespace safeckpt::cuda {

struct DeviceLoadOptions {
  // Host parsing rules (allowlist, limits; limits also apply to safetensors
  // files). Its CRC flag is ignored: stored records are checked on the reader
  // threads (transfer.verify_crc), deflated ones when inflated (always).
  LoadOptions load;
  // Target like torch's map_location: "cuda" (the calling thread's current
  // CUDA device, as torch.cuda.current_device()) or "cuda:N". Every storage
  // goes there whatever location it was saved with.
  std::string map_location = "cuda:0";
  // Engine settings for a one-shot load (no engine passed); .device is set
  // from map_location. Ignored when an engine is passed: its own options
  // apply, and map_location must name its device.
  TransferOptions transfer;
};

namespace detail {
struct DeviceCheckpointMaker;
}

// A strided tensor on the device, ready to bind by name.
struct DeviceTensor {
  std::string name;      // state_dict name ("" for a top-level tensor)
  std::uint32_t tensor;  // index into checkpoint().tensors()
  DType dtype;
  std::vector<std::int64_t> shape;   // elements
  std::vector<std::int64_t> stride;  // elements
  void* data;                        // device pointer of the first element (null if numel == 0)
  std::uint64_t nbytes;              // numel x element size
  int device;
};

// Made by load_to_device. Copies share the host checkpoint and the device
// arena (both freed with the last copy and the last DLPack capsule). A
// default-constructed or moved-from DeviceCheckpoint holds nothing: only
// assign to it or destroy it.
class DeviceCheckpoint {
 public:
  const Checkpoint& checkpoint() const noexcept { return *host_; }
  const DeviceArena& arena() const noexcept { return *arena_; }
  int device() const noexcept { return arena_->device(); }
  // Device pointer of storage i (Checkpoint::storages() order).
  void* storage_data(std::uint32_t storage) const noexcept { return arena_->storage_data(storage); }

  // Named strided tensors (Checkpoint::state_dict() order). Sparse, meta and
  // quantized tensors are skipped (their parts are tensors of their own).
  std::vector<DeviceTensor> tensors() const;

  // DLPack export of tensor `index` (Checkpoint::tensors() order); the
  // capsule keeps the device arena alive. Errors: kInvalidArgument (not a
  // strided tensor with storage), kUnsupported (dtype without a DLPack code).
  Result<DLManagedTensorVersioned*> to_dlpack(std::uint32_t index, bool read_only = true) const;
  Result<DLManagedTensor*> to_dlpack_legacy(std::uint32_t index) const;

 private:
  friend struct detail::DeviceCheckpointMaker;  // load_to_device (src/cuda/device_checkpoint.cpp)
  Result<TensorView> view(std::uint32_t index) const;
  std::shared_ptr<Checkpoint> host_;
  std::shared_ptr<DeviceArena> arena_;
};

// Loads `path` onto the GPU: every format safeckpt::open reads (torch.save
// zip, legacy, bare pickle, safetensors file, sharded safetensors index; by
// content, safeckpt/open.hpp). The file is opened and mapped ONCE: the host
// parse and the transfer engine read the same descriptor (the engine never
// reopens the path), so a file renamed over `path` mid-load cannot put
// unvalidated bytes on the device; in-place writes to the opened file are
// another matter (safeckpt/mapped_file.hpp). `engine`:
// reuse one per process to keep the pinned ring (nullptr = one-shot: an
// engine is created before the host parse, so its ring is pinned in the
// background while the file is parsed, and dropped on return). `stats`, if
// given, describes the engine's part (TransferEngine::load): it excludes the
// host parse and the one-shot engine's creation.
// Errors: everything safeckpt::open returns, plus
// kInvalidArgument (bad map_location, or one naming another device than the
// engine's) and the transfer engine's (kDevice, kIo, kMalformed on CRC).
Result<DeviceCheckpoint> load_to_device(const std::filesystem::path& path, const DeviceLoadOptions& options = {},
                                        TransferEngine* engine = nullptr, LoadStats* stats = nullptr);
// Same for a checkpoint the caller already parsed (safeckpt::open, load,
// load_safetensors ...), which it hands over: its storages are read from
// host.file()'s descriptor (stored records, legacy storages, safetensors
// tensors) or its host memory (inflated, byte-decoded, sharded, buffers).
// options.load is not used (the parse is done; its CRC setting was the
// caller's); transfer.verify_crc / the engine's verify_crc still apply.
Result<DeviceCheckpoint> load_to_device(Checkpoint host, const DeviceLoadOptions& options = {},
                                        TransferEngine* engine = nullptr, LoadStats* stats = nullptr);

}  // namespace safeckpt::cuda
