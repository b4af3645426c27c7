// safeckpt/builder.hpp — make a Checkpoint from parts, without a file.
//
// For C++ users who want to write a checkpoint from scratch (then
// safeckpt::save() it) and for format converters (safetensors -> Checkpoint).
// The result is an ordinary Checkpoint: the same value tree, tensor and
// storage tables the loader produces, so save(), to_json() and the GPU
// loader treat both alike.
//
// Ownership:
//  - add_storage(..., std::vector bytes) moves the bytes into the Checkpoint.
//  - add_storage_borrowed(..., Bytes) only records a view: the caller keeps
//    the memory alive and unchanged for the Checkpoint's lifetime, unless it
//    hands an owner to keep_alive() (any shared_ptr: a mapped file, a buffer).
//  - CheckpointBuilder(MappedFile) moves the file into the Checkpoint; views of
//    its bytes (file_bytes()) stay valid (the mapping does not move).
// Storage bytes are little-endian host bytes, as Checkpoint::storages() has them.
//
// Example — a state_dict {"w": float32[2,3], "b": float32[3]}:
//     CheckpointBuilder b;
//     SAFECKPT_CHECK(b.add_state_dict_tensor("w", DType::kFloat32, {2, 3}, w_bytes));
//     SAFECKPT_CHECK(b.add_state_dict_tensor("b", DType::kFloat32, {3}, b_bytes));
//     SAFECKPT_TRY(Checkpoint ckpt, std::move(b).finish());
//     SAFECKPT_CHECK(save("model.pt", ckpt));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/checkpoint.hpp"

namespace safeckpt {

class CheckpointBuilder {
 public:
  // Storages are added by the calls below (no backing file).
  CheckpointBuilder() = default;
  // Storages may be views of `file`, which moves into the Checkpoint
  // (Checkpoint::file() then returns it, e.g. for direct GPU reads).
  explicit CheckpointBuilder(MappedFile file);
  CheckpointBuilder(CheckpointBuilder&&) noexcept = default;
  CheckpointBuilder& operator=(CheckpointBuilder&&) noexcept = default;
  CheckpointBuilder(const CheckpointBuilder&) = delete;
  CheckpointBuilder& operator=(const CheckpointBuilder&) = delete;

  // ---- values (see value.hpp for the node shapes) ----
  ValueArena& values() noexcept { return ckpt_.arena_; }
  NodeId add(Node n) { return ckpt_.arena_.add(std::move(n)); }
  NodeId none();
  NodeId boolean(bool v);
  NodeId integer(std::int64_t v);
  NodeId floating(double v);
  NodeId str(std::string_view utf8);
  NodeId bytes(Bytes raw);
  // kList / kTuple / kSet / kFrozenSet / kDict / kOrderedDict / kCounter /
  // kSize; dicts take keys and values interleaved (k0, v0, k1, v1, ...).
  NodeId container(Kind kind, std::vector<NodeId> items);
  NodeId dtype(DType d);
  NodeId device(std::string_view device);  // "cpu", "cuda:1"

  // ---- storages ----
  // Returns the storage index. `dtype` is the storage element type (uint8
  // for an untyped storage); location is the saved device tag.
  // Errors: kInvalidArgument (bytes not a multiple of the element size).
  Result<std::uint32_t> add_storage(DType dtype, std::vector<std::uint8_t> bytes, std::string location = "cpu");
  // `file_offset`: absolute offset of the bytes in file_bytes() when they
  // lie there (lets the GPU loader read them directly), else kNoOffset.
  Result<std::uint32_t> add_storage_borrowed(DType dtype, Bytes bytes, std::string location = "cpu",
                                             std::uint64_t file_offset = Location::kNoOffset);
  // Mutable access to a storage added above (e.g. to set `record`, `key`).
  StorageInfo& storage(std::uint32_t index);
  // Keeps `owner` alive as long as the Checkpoint (for borrowed storages).
  void keep_alive(std::shared_ptr<const void> owner);

  // ---- tensors ----
  // Adds a tensor and returns its kTensor node. Checked like the loader
  // checks a file: dtype/storage agreement, sizes/strides >= 0, rank <=
  // limits.max_tensor_rank, the view inside its storage (overflow-checked),
  // quantized/sparse component indices valid. Errors: kInvalidArgument.
  Result<NodeId> add_tensor(TensorInfo info);
  // A C-contiguous (or given-stride) strided tensor over `storage`.
  Result<NodeId> add_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint32_t storage,
                            std::int64_t storage_offset = 0, std::vector<std::int64_t> stride = {});

  // ---- state_dict convenience ----
  // The root becomes a collections.OrderedDict (name -> tensor), entries in
  // call order. Each call adds one storage holding exactly the tensor.
  // Errors: kInvalidArgument (duplicate name, bytes != numel x element size,
  // root already set to something else).
  Status add_state_dict_tensor(std::string_view name, DType dtype, std::vector<std::int64_t> shape,
                               std::vector<std::uint8_t> bytes, bool parameter = false);
  Status add_state_dict_tensor_borrowed(std::string_view name, DType dtype, std::vector<std::int64_t> shape,
                                        Bytes bytes, bool parameter = false);
  // Any other value (a node made above) under `name`.
  Status add_state_dict_value(std::string_view name, NodeId value);

  void set_root(NodeId root) { root_ = root; }
  NodeId root() const noexcept { return root_; }
  void set_format(FileFormat f) { format_ = f; }
  void set_limits(const Limits& limits) { limits_ = limits; }

  const std::vector<TensorInfo>& tensors() const noexcept { return ckpt_.tensors_; }
  const std::vector<StorageInfo>& storages() const noexcept { return ckpt_.storages_; }
  // The bytes of the file given to the constructor (empty otherwise).
  Bytes file_bytes() const noexcept { return ckpt_.file_->bytes(); }

  // Hands the parts over. Errors: kInvalidArgument (no root; a node refers
  // to a node/tensor/storage index out of range).
  Result<Checkpoint> finish() &&;

 private:
  Status state_dict_root();
  Status check_name(std::string_view name);
  Result<std::uint32_t> add_storage_impl(DType dtype, Bytes bytes, std::string location, std::uint64_t file_offset);

  Limits limits_;
  FileFormat format_ = FileFormat::kUnknown;
  Checkpoint ckpt_;
  NodeId root_ = kNoNode;
  std::vector<std::string> state_dict_names_;  // sorted, for duplicate checks
};

// Checked view arithmetic shared by the builder and the writers: the number
// of storage bytes a strided view needs, (offset + sum((size_i - 1) *
// stride_i) + 1) x element_size, or 0 for a zero-numel view; nullopt on
// overflow or a negative size/stride/offset.
std::optional<std::uint64_t> strided_extent_bytes(const std::vector<std::int64_t>& shape,
                                                  const std::vector<std::int64_t>& stride, std::int64_t storage_offset,
                                                  std::uint32_t element_size);
// C-contiguous strides of `shape`.
std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape);
// True when `stride` is the C-contiguous stride of `shape` (dimensions of
// size 1 may have any stride, as torch's is_contiguous()).
bool is_c_contiguous(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& stride);

}  // namespace safeckpt
