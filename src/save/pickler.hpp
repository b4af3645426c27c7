// The data.pkl writer for save(): a Checkpoint's value tree as the protocol-2
// pickle torch.save would write (see include/safeckpt/save.hpp rules 3-4).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"

namespace safeckpt {

struct PickleWriteOptions {
  bool weights_only_compatible = true;
  std::string force_location;  // empty = keep each storage's location
  // Legacy persistent ids: ("storage", class, key, location, numel, None),
  // typed storages only (torch/serialization.py _legacy_save).
  bool legacy_format = false;
};

struct TorchPickle {
  std::vector<std::uint8_t> bytes;
  // Storage indices (into ckpt.storages()) in key order: key i = storages[i].
  std::vector<std::uint32_t> storages;
  // Per key: the numel written in its persistent id (elements of the class's dtype).
  std::vector<std::uint64_t> numels;
};

// Errors: kUnsupported (values torch cannot load with weights_only=True,
// see save.hpp), kInternal (dangling indices).
Result<TorchPickle> write_torch_pickle(const Checkpoint& ckpt, const PickleWriteOptions& options);

}  // namespace safeckpt
