// safeckpt/safetensors_reader.hpp — read the safetensors format (single
// files and sharded *.safetensors.index.json checkpoints) as Checkpoints.
// It depends on the checkpoint layer only, never on the save layer
// (cmake/check_layers.cmake enforces it); writing and conversion are in
// safeckpt/safetensors_writer.hpp.
//
// Accepted grammar (reader; anything else is refused with kMalformed unless
// noted):
//  1. u64 little-endian header length N, 2 <= N <= max_header_bytes
//     (kLimitExceeded above the cap; the reference's cap is 100 MB), and
//     8 + N <= file size.
//  2. The N header bytes are UTF-8 (checked) holding one JSON object,
//     optionally followed by spaces (the reference pads to 8 bytes). Nothing
//     else: no BOM, no second value. Duplicate keys anywhere are refused
//     (serde_json would keep the last one silently).
//  3. "__metadata__", if present, is an object of string -> string.
//  4. Every other key is a tensor name (non-empty): an object with exactly
//     "dtype" (a known safetensors dtype, below), "shape" (array of
//     non-negative integers, rank <= limits.max_tensor_rank) and
//     "data_offsets" ([begin, end] integers); unknown fields are refused.
//  5. Byte sizes are computed with overflow checks: bits = numel x dtype
//     bits, which must be a multiple of 8 (sub-byte dtypes F4/F6); end -
//     begin must equal bits / 8.
//  6. Sorted by offset, the tensors tile the data section exactly: the first
//     begins at 0, each begins where the previous ended, the last ends at the
//     end of the file (no gaps, no overlaps, no trailing bytes).
//  7. At most limits.max_tensors tensors.
// Views are zero-copy: SafetensorsTensor::data points into the mapped file.
//
// dtypes (safetensors Dtype, huggingface/safetensors tensor.rs) and their
// PyTorch mapping: BOOL bool, U8 uint8, I8 int8, I16 int16, U16 uint16,
// F16 float16, BF16 bfloat16, I32 int32, U32 uint32, F32 float32, F64
// float64, I64 int64, U64 uint64, C64 complex64, F8_E5M2 float8_e5m2,
// F8_E4M3 float8_e4m3fn, F8_E8M0 float8_e8m0fnu, F8_E4M3FNUZ
// float8_e4m3fnuz, F8_E5M2FNUZ float8_e5m2fnuz, F4 float4_e2m1fn_x2 (two
// 4-bit values a byte: the PyTorch shape's last dimension is half the
// safetensors one, like safetensors.torch does); F6_E2M3 and F6_E3M2 have no
// PyTorch dtype (readable here, not convertible).
//
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "safeckpt/checkpoint.hpp"

namespace safeckpt {

// PyTorch dtype -> safetensors name ("F32"), or "" when safetensors has none
// (complex128/complex32, quantized, bits*).
std::string_view safetensors_dtype_name(DType d) noexcept;
// safetensors name -> PyTorch dtype; nullopt for unknown names and for
// F6_E2M3/F6_E3M2 (no PyTorch dtype).
std::optional<DType> dtype_from_safetensors(std::string_view name) noexcept;
// Bits per element of a safetensors dtype name, 0 if unknown.
std::uint32_t safetensors_dtype_bits(std::string_view name) noexcept;

struct SafetensorsOptions {
  Limits limits;
  // Cap on the JSON header (bytes); the reference refuses above 100 MB.
  // The parsed tree is also charged to limits.max_memory_bytes before it is
  // built (MemoryBudget::kJsonBytesPerByte per header byte, plus kTensorBytes
  // per tensor): under the default budget a header above ~16 MiB is
  // kLimitExceeded ("memory budget exceeded: safetensors header JSON ...").
  std::uint64_t max_header_bytes = 100'000'000;
  // Cap on the distinct shard files a sharded index may name (each stays
  // open and mapped for the Checkpoint's lifetime: one descriptor each).
  std::uint64_t max_shards = 4096;
};

struct SafetensorsTensor {
  std::string name;
  std::string dtype;                 // safetensors name, e.g. "BF16"
  std::vector<std::uint64_t> shape;  // as in the file
  std::uint64_t begin = 0, end = 0;  // data_offsets (relative to the data section)
  std::uint64_t file_offset = 0;     // absolute offset of the first byte
  Bytes data;                        // view of the bytes; valid while the file lives
};

class SafetensorsFile {
 public:
  SafetensorsFile() = default;
  SafetensorsFile(SafetensorsFile&&) noexcept = default;
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  // Maps and validates `path`. Errors: kIo, kMalformed, kLimitExceeded.
  static Result<SafetensorsFile> open(const std::filesystem::path& path, const SafetensorsOptions& options = {});
  // Validates an already opened file, taking it over (no second open).
  static Result<SafetensorsFile> from_file(MappedFile file, const SafetensorsOptions& options = {});
  // Validates bytes in memory. BORROWS `data`: keep it alive and unchanged.
  static Result<SafetensorsFile> parse(Bytes data, const SafetensorsOptions& options = {});
  // Same, taking ownership of a buffer.
  static Result<SafetensorsFile> parse_buffer(std::vector<std::uint8_t> data, const SafetensorsOptions& options = {});

  // Tensors in data (offset) order.
  const std::vector<SafetensorsTensor>& tensors() const noexcept { return tensors_; }
  const SafetensorsTensor* find(std::string_view name) const;
  // __metadata__ entries in header order (empty if absent).
  const std::vector<std::pair<std::string, std::string>>& metadata() const noexcept { return metadata_; }
  bool has_metadata() const noexcept { return has_metadata_; }
  std::uint64_t header_bytes() const noexcept { return header_bytes_; }
  Bytes bytes() const noexcept { return bytes_; }
  // The mapped file (empty for parse()).
  const MappedFile& file() const noexcept { return file_; }
  MappedFile take_file() && { return std::move(file_); }

 private:
  static Result<SafetensorsFile> validate(SafetensorsFile f, const SafetensorsOptions& options);
  MappedFile file_;
  Bytes bytes_;
  std::uint64_t header_bytes_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::vector<std::pair<std::string, std::string>> metadata_;
  bool has_metadata_ = false;
};

// A safetensors file as a Checkpoint: the root is an OrderedDict name ->
// tensor (data order), tensors are zero-copy views of the mapped file
// (StorageInfo::file_offset set for direct GPU reads), format kSafetensors.
// __metadata__ is not part of the tree (read it with SafetensorsFile).
// Errors: as SafetensorsFile::open, plus kUnsupported for F6 dtypes and for
// F4 tensors whose last dimension is odd.
Result<Checkpoint> load_safetensors(const std::filesystem::path& path, const SafetensorsOptions& options = {});
Result<Checkpoint> load_safetensors_bytes(Bytes data, const SafetensorsOptions& options = {});
// Same over an already opened file, which the Checkpoint takes over
// (Checkpoint::file() is this file: same descriptor, same mapping).
Result<Checkpoint> load_safetensors_file(MappedFile file, const SafetensorsOptions& options = {});

// Sharded checkpoints: `*.safetensors.index.json` = {"metadata": {...},
// "weight_map": {tensor name: shard file name}} (huggingface_hub
// split_torch_state_dict_into_shards / transformers' save_pretrained).
// Shard names must be plain file names (no '/', '\\' or NUL, not "." or
// ".."), resolved in the index's directory only. A shard that is a symlink
// is followed only when the file it opens lies in that same directory, or,
// when the index's real directory is <repo>/snapshots/<rev> of the Hugging
// Face cache (huggingface_hub file_download.py: every file a symlink to
// ../../blobs/<sha>), directly in <repo>/blobs; checked on the opened
// descriptor (/proc/self/fd). One that leads anywhere else is refused with
// kMalformed.
struct SafetensorsIndex {
  std::vector<std::pair<std::string, std::string>> weight_map;  // in file order
  std::vector<std::string> shards;                              // distinct, first-use order
  std::string metadata_json;                                    // "metadata" as compact JSON, or ""
};
// Errors: kMalformed (not that shape, duplicate keys, bad shard names),
// kLimitExceeded (JSON larger than max_header_bytes, more than max_tensors
// entries or max_shards distinct shards).
Result<SafetensorsIndex> parse_safetensors_index(std::string_view json, const SafetensorsOptions& options = {});
// Loads every shard (each opened once, validated, zero-copy, kept mapped by
// the Checkpoint) into one state_dict ordered like weight_map; every tensor
// name is unique across the shards and the shards hold exactly the
// weight_map (so the storages are host views; Checkpoint::file() is the
// index). Errors: as above, plus kIo (a shard cannot be opened), kMalformed
// when a tensor is missing from its shard, a shard holds a tensor the index
// does not list or lists for another shard, or a shard is a symlink out of
// the directory.
Result<Checkpoint> load_safetensors_index(const std::filesystem::path& index_path,
                                          const SafetensorsOptions& options = {});
// Same over the already opened index file (`index.path()` names the
// directory of the shards); the Checkpoint takes it over.
Result<Checkpoint> load_safetensors_index_file(MappedFile index, const SafetensorsOptions& options = {});

// Opens every distinct shard of `idx` (the index at `index_path`) once, by
// the rules above (plain names in the index's directory; a symlink only into
// that directory or the Hugging Face cache's blobs, checked on the opened
// descriptor; regular files only, O_NONBLOCK), without reading them: what
// load_safetensors_index_file reads, and what the scanner scans when an
// index names shards of another format (pytorch_model.bin.index.json).
// Errors: kIo (the directory or a shard cannot be opened), kMalformed (a
// symlink out of the directory). Each error names the index (record).
struct IndexShard {
  std::string name;  // as the index names it
  MappedFile file;
};
Result<std::vector<IndexShard>> open_index_shards(const std::filesystem::path& index_path, const SafetensorsIndex& idx);
// The second half of load_safetensors_index_file: `opened` = open_index_shards(index.path(), idx)
// (taken over; a caller may read their bytes first, as the scanner does, and
// the verdict is then on those same bytes). Errors: as load_safetensors_index_file.
Result<Checkpoint> load_safetensors_index_shards(MappedFile index, const SafetensorsIndex& idx,
                                                 std::vector<IndexShard> opened,
                                                 const SafetensorsOptions& options = {});

}  // namespace safeckpt
