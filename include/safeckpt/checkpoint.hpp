// safeckpt/checkpoint.hpp — load a PyTorch checkpoint without running it.
//
// safeckpt::load() gives back what `torch.load(path, weights_only=True)`
// gives back, as a typed value tree (safeckpt/value.hpp) plus tables of
// tensors and storages — or an Error saying what was refused, where, and how
// to allow it if the file is trusted. Nothing from the file is ever executed
// or imported; only the globals in the Allowlist are built.
//
// Formats (detected by content, safeckpt/detect.hpp): torch.save zip files
// (>= 1.6), the legacy sequential-pickle format (< 1.6), and bare pickles
// (no storages). TorchScript and PT2 archives, tar checkpoints and
// compressed wrappers are refused with kUnsupported naming what the file is.
// safetensors files and sharded indexes are read too by safeckpt::open()
// (safeckpt/open.hpp), the one entry point for every format.
//
// Storages and views (torch/_utils.py, torch/serialization.py; CVE-2026-24747):
//  - a storage record must be exactly numel x element_size bytes;
//  - a storage key is loaded once and shared by every tensor that names it;
//  - every tensor view lies inside its storage: storage_offset >= 0,
//    sizes >= 0, strides >= 0 (stride 0 allowed, negative refused) and
//    (storage_offset + sum((size_i - 1) * stride_i) + 1) * element_size
//    <= storage bytes, computed with overflow checks; zero-numel views pass;
//  - storages of a file written big-endian (`byteorder` = "big") are
//    byte-swapped per element (complex per component) into owned memory.
// Zero-copy: storage bytes are views of a read-only private mmap of the file
// (or of the caller's buffer); only deflated and byte-swapped records are
// copied.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/detect.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/pickle.hpp"
#include "safeckpt/tensor.hpp"
#include "safeckpt/value.hpp"

namespace safeckpt {

// Longest tensor name named_tensors() builds by default: 64 KiB, hundreds of
// times a real state_dict key (module paths of a few hundred bytes at most);
// longer names only come from hostile nesting or memo-shared long keys.
inline constexpr std::uint64_t kMaxTensorNameBytes = 64u << 10;

struct NamedTensor {
  std::string name;      // "layer.0.weight": dict keys joined with '.', list indices as numbers
  std::uint32_t tensor;  // index into Checkpoint::tensors()
};

struct LoadOptions {
  Limits limits;
  // Safe globals; nullptr = Allowlist::default_policy(). Must outlive load().
  const Allowlist* allowlist = nullptr;
  // Compare CRC-32 of every storage record with the central directory
  // (when non-zero). Pickle records and deflated storage records (inflated
  // into memory anyway) are always checked. Turning this off makes host
  // loading of stored records independent of tensor bytes (pure mmap).
  bool verify_storage_crc = true;
  // Verify-then-load (issue 15; make one with safeckpt::sign::
  // make_load_verifier, safeckpt/sign.hpp). When set, it is called once per
  // load with the bytes the loader has mapped — the very bytes it then
  // parses, and that load_to_device uploads from the same open file — and
  // the file's path (empty for load_bytes/load_buffer/load_reader), before
  // anything is parsed or built. Its error is the load's error (kIntegrity
  // when the bytes are not the signed ones). safeckpt::open calls it for
  // safetensors files too and refuses a sharded safetensors index with
  // kUnsupported while it is set (the shards are separate files the
  // callable would not see).
  std::function<Status(Bytes bytes, const std::filesystem::path& path)> verify_bytes;
};

class Checkpoint {
 public:
  Checkpoint() = default;
  Checkpoint(Checkpoint&&) noexcept = default;
  Checkpoint& operator=(Checkpoint&&) noexcept = default;
  Checkpoint(const Checkpoint&) = delete;
  Checkpoint& operator=(const Checkpoint&) = delete;

  FileFormat format() const noexcept { return format_; }
  const ValueArena& values() const noexcept { return arena_; }
  NodeId root() const noexcept { return root_; }
  const std::vector<TensorInfo>& tensors() const noexcept { return tensors_; }
  const std::vector<StorageInfo>& storages() const noexcept { return storages_; }
  // The file opened for this load (empty for buffers loaded with
  // load_bytes()): its descriptor and mapping are the only source of the
  // storage bytes for every later stage (views, save/convert, the GPU
  // transfer engine), never a reopen of the path (safeckpt/mapped_file.hpp
  // says what that guarantees). For a sharded safetensors index, the index
  // file (the shards are kept mapped alongside; storages are host views).
  const MappedFile& file() const noexcept { return *file_; }

  // name -> tensor for every tensor reachable through dicts (str/int keys),
  // lists and tuples, depth-first in order, each tensor object once (the first
  // path wins for tensors reachable twice). A top-level tensor is named "".
  // Iterative and linear in the value tree: each container is walked once,
  // at the first path that reaches it (a memo-shared sub-graph is not
  // re-expanded; a cycle ends there), and the path is one buffer, so a deep
  // tree costs O(depth) memory. Errors: kLimitExceeded when a tensor's name
  // would be longer than `max_name_bytes` (a hostile file nests a tensor a
  // million lists deep, or under one memo-shared long key at every level).
  Result<std::vector<NamedTensor>> named_tensors(std::uint64_t max_name_bytes = kMaxTensorNameBytes) const;
  // named_tensors() with the default cap. The loaders refuse a file whose
  // names exceed it (kLimitExceeded from load/open), so on a loaded
  // checkpoint this is every tensor; only a checkpoint assembled with
  // CheckpointBuilder can make it fail, and then it is EMPTY (callers that
  // must tell "no tensors" from "refused" use named_tensors()).
  std::vector<NamedTensor> state_dict() const;

  // Row-major (C-contiguous) little-endian copy of a strided tensor's
  // elements (quantized: integer representation; bool: 1 byte each).
  // Errors: kInvalidArgument (not strided, meta), kLimitExceeded.
  Result<std::vector<std::uint8_t>> contiguous_bytes(std::uint32_t tensor) const;
  // Dense row-major bytes of a sparse tensor (as Tensor.to_dense()).
  Result<std::vector<std::uint8_t>> dense_bytes(std::uint32_t tensor) const;

 private:
  friend class CheckpointBuilder;
  friend class LoadBuilder;  // src/checkpoint/builder.hpp (the loaders)
  FileFormat format_ = FileFormat::kUnknown;
  std::unique_ptr<MappedFile> file_ = std::make_unique<MappedFile>();
  std::vector<std::shared_ptr<std::vector<std::uint8_t>>> owned_;  // inflated / swapped records
  ValueArena arena_;
  NodeId root_ = kNoNode;
  std::vector<TensorInfo> tensors_;
  std::vector<StorageInfo> storages_;
};

// Loads a checkpoint file (memory-mapped; storages are zero-copy views).
// Errors: kIo (open/mmap), kMalformed (container or pickle damage, storage
// record size != numel x element size, view outside its storage, bad
// rebuild arguments), kUnsupported (TorchScript, PT2, tar, compressed
// wrappers, protocol-5 buffers, unmodelled tensor subclasses),
// kDisallowedGlobal / kDisallowedOperation (the safe-globals policy; the
// message names the global, its offset, and how to allow it),
// kLimitExceeded (a Limits cap).
Result<Checkpoint> load(const std::filesystem::path& path, const LoadOptions& options = {});
// Same over an already opened file, which the Checkpoint takes over (no
// second open: Checkpoint::file() is `file`). Errors: as load().
Result<Checkpoint> load_file(MappedFile file, const LoadOptions& options = {});
// Same for bytes in memory. The Checkpoint BORROWS `data`: the caller keeps
// it alive and unchanged for the Checkpoint's lifetime.
Result<Checkpoint> load_bytes(Bytes data, const LoadOptions& options = {});
// Same, taking ownership of a buffer.
Result<Checkpoint> load_buffer(std::vector<std::uint8_t> data, const LoadOptions& options = {});
// Same, reading everything from a callback first (pipes, sockets, archives
// inside archives). `read(buf, n)` returns bytes read, 0 at the end, -1 on
// error. At most `max_bytes` are accepted. Errors: as load(), plus kIo
// (callback failed) and kLimitExceeded (input larger than max_bytes).
Result<Checkpoint> load_reader(const std::function<std::int64_t(std::uint8_t*, std::size_t)>& read,
                               std::uint64_t max_bytes, const LoadOptions& options = {});

// allow_hint(global_name): declared in safeckpt/allowlist.hpp (included above).

}  // namespace safeckpt
