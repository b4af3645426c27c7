// Internal: how the loaders assemble a Checkpoint over a mapped file or
// borrowed bytes. (Programs building checkpoints from scratch use the public
// safeckpt/builder.hpp.)
#pragma once

#include <memory>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "torch/object_model.hpp"

namespace safeckpt {

class LoadBuilder {
 public:
  explicit LoadBuilder(MappedFile file) { *ckpt_.file_ = std::move(file); }
  explicit LoadBuilder(Bytes bytes) : borrowed_(bytes) {}

  ValueArena& arena() noexcept { return ckpt_.arena_; }
  Bytes file_bytes() const noexcept { return borrowed_.data() ? borrowed_ : ckpt_.file_->bytes(); }
  // Keeps `buf` alive as long as the Checkpoint.
  void keep(std::shared_ptr<std::vector<std::uint8_t>> buf) { ckpt_.owned_.push_back(std::move(buf)); }
  // An owned copy of `in` with every `unit`-byte group reversed (byte order).
  Bytes swapped_copy(Bytes in, std::uint32_t unit);
  // Errors: kLimitExceeded when a tensor's state_dict name would exceed
  // kMaxTensorNameBytes (named_tensors()).
  Result<Checkpoint> finish(FileFormat format, NodeId root, TorchTables&& tables);

 private:
  Checkpoint ckpt_;
  Bytes borrowed_;
};

// Legacy sequential-pickle format (src/checkpoint/legacy.cpp).
Result<Checkpoint> load_legacy(LoadBuilder& b, Bytes file, const LoadOptions& opt, const Allowlist& allow);

}  // namespace safeckpt
