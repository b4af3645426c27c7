// safeckpt/save.hpp — write checkpoints that torch.load(weights_only=True) reads.
//
// save() writes the value tree of a Checkpoint (what load() returned, or what
// a CheckpointBuilder made, safeckpt/builder.hpp) as a torch.save zip (docs/torch-format.md §2.3, §7),
// or with SaveOptions::legacy_format in the pre-1.6 layout:
//  1. Records, in PyTorch 2.7+'s order: data.pkl, .format_version ("1"),
//     .storage_alignment ("64"), byteorder ("little"), data/0 .. data/N-1,
//     version ("3\n"). No .data/serialization_id (PyTorch's is not
//     reproducible across machines and nothing reads it).
//  2. Zip encoding exactly as PyTorchStreamWriter/miniz: stored records,
//     root folder from the file name (torch's basename rule; "archive" for
//     non-ASCII names and buffers), local headers with zero CRC/sizes, flags
//     0x0808 (0x0800 for empty records), an "FB" extra field padding every
//     record's data to a multiple of storage_alignment, data descriptors
//     (24 bytes with 64-bit sizes when the record or its header offset
//     reaches 0xFFFFFFFF, with a zip64 extra in front of FB then), zip64
//     end-of-central-directory record + locator always. Because the layout is
//     miniz's, .format_version is written and torch >= 2.7's
//     calculate_storage_offsets finds the records without reading headers.
//  3. data.pkl: pickle protocol 2 using only globals in PyTorch 2.6+'s default
//     weights-only allowlist: collections.OrderedDict (+ BUILD of
//     `_metadata`), torch._utils._rebuild_tensor_v2 (dtypes with a legacy
//     storage class) / _rebuild_tensor_v3 (uint16/32/64, float8, ...),
//     _rebuild_parameter(_with_state), _rebuild_qtensor, _rebuild_sparse_tensor,
//     _rebuild_meta_tensor_no_storage, torch.Size, torch.device, torch dtypes
//     and qschemes, torch.serialization._get_layout, __builtin__.set /
//     complex / bytearray, _codecs.encode for bytes (also for b"", where
//     Python would call the non-allowlisted bytes()).
//  4. Storages: keys "0".."N-1" in first-use order of the pickle; a storage
//     viewed by tensors of several dtypes is written untyped (v3 for all its
//     tensors) rather than refused; views keep their storage, offset and
//     strides; the whole storage is written (like torch.save).
//  5. Deterministic: the same tree saved under the same file name gives the
//     same bytes (no timestamps; memo and key numbering by traversal order).
// Values torch's default allowlist refuses (frozenset, slice, generic
// objects, globals outside the list) are refused with kUnsupported unless
// SaveOptions::weights_only_compatible is false; so are cycles through
// tuples (they need POP, which the weights-only unpickler lacks).
//
// Nothing is lost on failure: the file is written to a temporary file in the
// target's directory, fsync'ed and renamed over the target; on any error the
// temporary file is removed and an existing target is untouched. Without
// `overwrite`, an existing target is refused with kExists (also when it
// appears while writing: the final rename does not replace).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/error.hpp"

namespace safeckpt {

struct SaveOptions {
  // Replace an existing file at the target path.
  bool overwrite = false;
  // fsync the file before the rename and its directory after it.
  bool fsync = true;
  // Compute CRC-32 of every record (torch's default); off writes 0 like
  // torch.serialization.set_crc32_options(False).
  bool compute_crc32 = true;
  // Refuse values torch.load(weights_only=True) would refuse by default.
  bool weights_only_compatible = true;
  // Data alignment of records (torch.utils.serialization.config.save.
  // storage_alignment): a power of two in [1, 65536]; default 64.
  std::uint32_t storage_alignment = 64;
  // Zip root folder; empty = torch's rule for the target file name.
  std::string root_name;
  // Write the legacy sequential-pickle format instead of the zip
  // (torch.save(..., _use_new_zipfile_serialization=False); torch/
  // serialization.py _legacy_save, docs/torch-format.md §3.1): header
  // pickles (magic, 1001, sys_info) byte-identical to Python's, the object
  // pickle with 6-tuple persistent ids, the string-sorted storage keys, then
  // per key an int64 element count and the storage bytes. storage_alignment,
  // root_name and compute_crc32 have no effect (no zip; the first two are
  // still validated). Like torch, refuses (kUnsupported) a storage viewed as
  // several dtypes or as a dtype without a legacy storage class (uint16/32/
  // 64, float8, bits...), and one whose bytes are not a whole number of
  // elements of its dtype. Read back by
  // PyTorch 1.13 and 2.11 with weights_only=True (tests/save/test_save_legacy.cpp,
  // tests/interop/README.md).
  bool legacy_format = false;
  // Saved device of every storage; empty keeps each storage's own location
  // ("cuda:0" files then need map_location to load on a CPU-only machine).
  std::string force_location;
};

// Writes `ckpt` to `path` (see the top of this file).
// Errors: kExists (target exists, overwrite off), kIo (create/write/fsync/
// rename, errno text), kUnsupported (a value torch cannot load with
// weights_only=True, a quantized tensor over a mixed-dtype storage, an int
// wider than LONG1, a cycle through a tuple; legacy_format: a storage
// without a single legacy storage class), kInvalidArgument (bad options),
// kInternal (a tensor refers to a missing storage/node).
Status save(const std::filesystem::path& path, const Checkpoint& ckpt, const SaveOptions& options = {});

// The same file as bytes in memory (root "archive" unless options say).
Result<std::vector<std::uint8_t>> save_to_bytes(const Checkpoint& ckpt, const SaveOptions& options = {});

// Streams the file to `write` (called with consecutive pieces; a failed
// Status aborts the save and is returned). Root "archive" unless options say.
Status save_to_writer(const std::function<Status(Bytes)>& write, const Checkpoint& ckpt,
                      const SaveOptions& options = {});

// torch.save's zip root folder for a path: the file name without its last
// extension ("model.pt" -> "model"); "archive" when that is empty or not ASCII.
std::string torch_archive_root(const std::filesystem::path& path);

// Where torch's offset pre-computation (serialization.py _get_offset, 2.7+)
// expects the data of a record written after a local header at `cursor`:
// cursor + 30 + name + [zip64 extra] + FB extra. Exposed for tests.
std::uint64_t zip_record_data_offset(std::uint64_t cursor, std::uint64_t full_name_bytes, std::uint64_t size,
                                     std::uint32_t alignment);

// Writes a file atomically with the rules above (used by the safetensors
// writer too): `produce` streams the content to the given writer.
Status write_file_atomically(const std::filesystem::path& path, const SaveOptions& options,
                             const std::function<Status(const std::function<Status(Bytes)>& write)>& produce);
// The same, with a second writer for bytes already in an open file:
// `copy(fd, offset, length)` appends [offset, offset + length) of `fd`
// (borrowed) to the output with copy_file_range (the copy stays in the
// kernel), or pread + write where the kernel refuses that (EXDEV, EINVAL,
// ENOSYS, EOPNOTSUPP). Errors of copy: kIo (errno text; the source ended early).
using FileRangeCopy = std::function<Status(int fd, std::uint64_t offset, std::uint64_t length)>;
Status write_file_atomically_ranges(
    const std::filesystem::path& path, const SaveOptions& options,
    const std::function<Status(const std::function<Status(Bytes)>& write, const FileRangeCopy& copy)>& produce);

}  // namespace safeckpt
