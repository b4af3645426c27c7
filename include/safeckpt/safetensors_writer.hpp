// safeckpt/safetensors_writer.hpp — write the safetensors format, and convert
// PyTorch checkpoints to it (the save layer's SaveOptions and atomic files).
// The reader and the grammar it accepts: safeckpt/safetensors_reader.hpp.
//
// Writer: the reference layout. Header JSON is serde_json's compact form:
// "__metadata__" first (keys in the caller's order, so the output is
// deterministic and parse -> serialize reproduces a file; the reference
// iterates a hash map), then tensors in data order; tensors
// sorted by dtype alignment, largest first (the order of the Dtype enum,
// descending), then by name (bytewise); header padded with spaces to a
// multiple of 8 bytes.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/safetensors_reader.hpp"
#include "safeckpt/save.hpp"

namespace safeckpt {

// ---- writing ----

struct SafetensorsEntry {
  std::string name;
  std::string dtype;                 // safetensors name
  std::vector<std::uint64_t> shape;  // safetensors shape
  Bytes data;                        // exactly the tensor's bytes (borrowed)
};

// The header (length prefix + padded JSON) for `entries`, which it sorts into
// the reference order. Errors: kInvalidArgument (unknown dtype, size
// mismatch, duplicate or empty or "__metadata__" name).
Result<std::vector<std::uint8_t>> safetensors_header(std::vector<SafetensorsEntry>& entries,
                                                     const std::vector<std::pair<std::string, std::string>>& metadata,
                                                     bool with_metadata);
// Whole file in memory / atomically on disk (SaveOptions: overwrite, fsync).
Result<std::vector<std::uint8_t>> serialize_safetensors(
    std::vector<SafetensorsEntry> entries, const std::vector<std::pair<std::string, std::string>>& metadata = {},
    bool with_metadata = false);
Status save_safetensors(const std::filesystem::path& path, std::vector<SafetensorsEntry> entries,
                        const std::vector<std::pair<std::string, std::string>>& metadata, bool with_metadata,
                        const SaveOptions& options = {});

// ---- PyTorch checkpoint -> safetensors ----

struct ToSafetensorsOptions {
  // Non-tensor values (epoch counters, hyper-parameters, ...) go to
  // __metadata__ as compact JSON under their dotted path, when each is at
  // most max_metadata_value_bytes and all at most max_metadata_bytes;
  // otherwise the conversion is refused, unless drop_non_tensors.
  bool drop_non_tensors = false;
  std::uint64_t max_metadata_value_bytes = 64 << 10;
  std::uint64_t max_metadata_bytes = 1 << 20;
  // Extra __metadata__ entries (e.g. {"format", "pt"} like safetensors.torch).
  std::vector<std::pair<std::string, std::string>> metadata = {{"format", "pt"}};
};

// Writes every tensor of `ckpt` (named as Checkpoint::state_dict() names
// them) to `path`. Tensors sharing a storage become separate tensors, each
// with its own bytes, and a note says which; non-contiguous views are
// written contiguous. `notes` (optional) receives such remarks.
// Errors: kUnsupported (sparse/quantized/meta/conj/neg tensors, dtypes
// safetensors lacks, non-tensor values when not allowed, names that are not
// valid UTF-8 or collide), kExists/kIo from the atomic write.
Status save_checkpoint_as_safetensors(const std::filesystem::path& path, const Checkpoint& ckpt,
                                      const ToSafetensorsOptions& convert = {}, const SaveOptions& options = {},
                                      std::vector<std::string>* notes = nullptr);
// Same, in memory.
Result<std::vector<std::uint8_t>> checkpoint_to_safetensors(const Checkpoint& ckpt,
                                                            const ToSafetensorsOptions& convert = {},
                                                            std::vector<std::string>* notes = nullptr);

}  // namespace safeckpt
