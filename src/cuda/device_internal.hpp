// src/cuda/device_internal.hpp — what load_to_device and its background
// variant (PendingDeviceCheckpoint) share (not installed).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "safeckpt/device_checkpoint.hpp"

namespace safeckpt::cuda::detail {

struct DeviceCheckpointMaker {
  static DeviceCheckpoint make(std::shared_ptr<Checkpoint> host, std::shared_ptr<DeviceArena> arena) {
    DeviceCheckpoint d;
    d.host_ = std::move(host);
    d.arena_ = std::move(arena);
    return d;
  }
};

// The device map_location names; kInvalidArgument when it does not parse or
// is not `engine`'s device.
Result<int> engine_device(const DeviceLoadOptions& options, TransferEngine* engine);
// One source per Checkpoint::storages() entry: a file range of host.file()
// when the bytes lie there as stored (CRC expected when verify_crc), else
// the host bytes (inflated, decoded, other files of a sharded index).
std::vector<StorageSource> storage_sources(const Checkpoint& host, bool verify_crc);
// An engine of options.transfer on `device` when the caller gave none.
std::optional<Result<TransferEngine>> one_shot_engine(const DeviceLoadOptions& options, TransferEngine* engine,
                                                      int device);

}  // namespace safeckpt::cuda::detail
