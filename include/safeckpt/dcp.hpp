// safeckpt/dcp.hpp — torch.distributed.checkpoint (DCP) directories without Python [issue 17].
//
// A DCP directory (what `torch.distributed.checkpoint.save` writes with the
// default FileSystemWriter, PyTorch 2.4-2.11) holds:
//  - `.metadata`: a pickle of torch.distributed.checkpoint.metadata.Metadata
//    (PyTorch itself reads it with plain pickle, i.e. weights_only=False);
//  - `__<rank>_<n>.distcp`: the writers' data files. Every item is a byte
//    range (_StorageInfo: relative_path, offset, length). A tensor chunk's
//    range is a complete `torch.save(tensor)` zip (filesystem.py _write_item,
//    SerializationFormat.TORCH_SAVE); a non-tensor item's range is the
//    `torch.save(obj)` bytes the planner made (default_planner.py).
//
// The metadata is read by the restricted pickle machine with hooks of its
// own (not the weights-only allowlist, not extendable): exactly these globals
// are accepted, each modelled as the struct below with its fields checked —
//   torch.distributed.checkpoint.metadata.{Metadata, TensorStorageMetadata,
//     BytesStorageMetadata, ChunkStorageMetadata, TensorProperties,
//     MetadataIndex, StorageMeta, _MEM_FORMAT_ENCODING},
//   torch.distributed.checkpoint.filesystem._StorageInfo,
//   torch.Size, torch.<dtype>, torch.serialization._get_layout,
//   pathlib.PosixPath / pathlib.PurePosixPath (StorageMeta.checkpoint_id, kept as text).
// Anything else is kDisallowedGlobal; a call or BUILD the classes do not
// make (a dataclass built twice, NEWOBJ with arguments, a dtype called) is
// kDisallowedOperation; an unknown or missing field, or a field of the wrong
// type, is kMalformed naming the class and field. Source:
// torch/distributed/checkpoint/metadata.py (dataclasses; TensorProperties'
// __getstate__ tuple), filesystem.py (_StorageInfo, whose __getstate__ drops
// None fields), 2.11.
//
// The layout is then checked exactly (errors name the FQN and the file):
//  - every tensor's chunks lie inside the global shape, non-empty chunks do
//    not overlap and cover it (checked exactly on the grid the chunk
//    boundaries make); empty chunks (uneven Shard over many ranks) are allowed;
//  - every chunk and byte item has exactly one storage entry (MetadataIndex
//    fqn + offset; duplicates are kMalformed) and no entry is left over;
//  - no two non-empty byte ranges of one data file overlap: FileSystemWriter
//    writes every item once, back to back (filesystem.py _write_files_from_queue),
//    so a shared or partly shared range is never PyTorch's own output, and a
//    directory whose N chunks all name one large range made every consumer
//    assemble N times the bytes it stores (review 2026-12-06); and the ranges
//    cover every byte of the file: bytes no item names are bytes no reader
//    of the directory examines (a pickle ahead of the chunks ran under
//    torch.load of the data file while the directory scanned clean);
//  - relative_path is a plain file name (no '/', no "..", not ".metadata")
//    of a regular file in the directory (symlinks refused: opened with
//    O_NOFOLLOW), and offset + length <= its size;
//  - limits: DcpLimits below.
// The bytes of a chunk are checked when read: the range must load with
// safeckpt::load_bytes (the weights-only loader) as one tensor whose dtype
// is the metadata's and whose shape is the chunk's sizes (kMalformed otherwise).
// Not supported (kUnsupported): transform_descriptors (compression
// extensions), SerializationFormat.SAFETENSORS data files.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/checkpoint.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/limits.hpp"
#include "safeckpt/mapped_file.hpp"

namespace safeckpt {

struct DcpLimits {
  std::uint64_t max_metadata_bytes = 256u << 20;  // .metadata file size
  std::uint64_t max_items = 1u << 20;             // FQNs (tensors + byte items)
  std::uint64_t max_chunks = 1u << 22;            // chunks over all tensors
  std::uint64_t max_files = 1u << 16;             // distinct .distcp files
  std::uint32_t max_ndim = 64;                    // dimensions of a tensor
  std::uint64_t max_byte_item_bytes = 1u << 30;   // one non-tensor item's torch.save bytes
  std::uint64_t max_box_bytes = 1ull << 40;       // one tensor (or plan box) assembled in memory
  // Grid cells the tiling check marks over all tensors (a DTensor layout:
  // one per chunk; see src/dcp/dcp.cpp check_tiling).
  std::uint64_t max_grid_cells = 64ull << 20;
};

struct DcpOptions {
  Limits limits;  // for the pickle machine and every torch.save payload
  DcpLimits dcp;
  bool verify_storage_crc = true;  // passed to load_bytes for each chunk
  // Safe globals for the chunk and non-tensor item payloads (load_bytes's
  // LoadOptions::allowlist; torch: add_safe_globals before dcp.load);
  // nullptr = Allowlist::default_policy(). Borrowed: must outlive the
  // DcpCheckpoint. Never used for `.metadata`, whose globals are the fixed
  // set above.
  const Allowlist* allowlist = nullptr;
};

// True when `path` is a directory holding a regular file `.metadata` (after
// symlinks): what `safeckpt inspect|scan|convert` and the scanner's walk
// treat as one torch.distributed.checkpoint. Whether it IS one is
// DcpCheckpoint::open's to say. Never fails (an unreadable path is false).
bool is_dcp_directory(const std::filesystem::path& path) noexcept;

// The globals `.metadata` may name besides torch.<dtype> (the set above), as
// "module.qualname": what the scanner counts as allowed when it lists the
// metadata pickle's imports (scanner/src/scan_dcp.cpp). Static storage.
const std::vector<std::string_view>& dcp_metadata_globals();

// One piece of a tensor as one writer saved it (ChunkStorageMetadata + _StorageInfo).
struct DcpChunk {
  std::vector<std::int64_t> offsets;  // element offsets in the global tensor, per dim
  std::vector<std::int64_t> sizes;    // element counts per dim
  std::uint32_t file = 0;             // index into DcpCheckpoint::files()
  std::uint64_t offset = 0;           // byte offset of the torch.save payload in the file
  std::uint64_t length = 0;           // its length in bytes
};

// One key of the nested state dict (Metadata.planner_data: the flattening
// path, e.g. ("model", "layers", 0)): a str key or a list index.
struct DcpPathKey {
  bool is_index = false;
  std::string key;
  std::int64_t index = 0;
};

struct DcpTensor {
  std::string fqn;  // DCP's flattened key, e.g. "model.layers.0"
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;  // global shape
  std::vector<DcpChunk> chunks;     // in the metadata's order
  std::vector<DcpPathKey> path;     // nesting (empty when planner_data has none)
};

struct DcpBytesItem {
  std::string fqn;
  std::uint32_t file = 0;
  std::uint64_t offset = 0, length = 0;
  std::vector<DcpPathKey> path;
};

// An entry of state_dict_metadata, in its order: a tensor or a byte item.
struct DcpItemRef {
  bool is_tensor = true;
  std::uint32_t index = 0;  // into tensors() or bytes_items()
};

struct DcpFile {
  std::string name;        // plain file name, e.g. "__0_0.distcp"
  std::uint64_t size = 0;  // bytes
};

class DcpCheckpoint {
 public:
  DcpCheckpoint();
  ~DcpCheckpoint();
  DcpCheckpoint(DcpCheckpoint&&) noexcept;
  DcpCheckpoint& operator=(DcpCheckpoint&&) noexcept;

  // Reads and checks `dir`/.metadata and the layout (not the chunk bytes).
  // Errors: kIo (missing .metadata or data file, unreadable), kMalformed
  // (pickle damage, bad fields, chunks that overlap / leave gaps / lie
  // outside the tensor, range past the end of a file, bad file name,
  // symlink), kDisallowedGlobal / kDisallowedOperation (metadata names
  // anything outside the set above), kLimitExceeded, kUnsupported.
  static Result<DcpCheckpoint> open(const std::filesystem::path& dir, const DcpOptions& options = {});
  // As open(), and hands over the mapped `.metadata` in `metadata` whenever
  // it was read, also when its parse or the layout was refused (the scanner
  // scans those bytes without opening the file again).
  static Result<DcpCheckpoint> open(const std::filesystem::path& dir, const DcpOptions& options,
                                    std::optional<MappedFile>& metadata);
  // The same for a .metadata pickle in memory whose data files are not
  // opened: layout checks except file existence and sizes (fuzzing, tests).
  static Result<DcpCheckpoint> parse_metadata(Bytes metadata, const DcpOptions& options = {});

  const std::vector<DcpTensor>& tensors() const noexcept { return tensors_; }
  const std::vector<DcpBytesItem>& bytes_items() const noexcept { return bytes_items_; }
  const std::vector<DcpFile>& files() const noexcept { return files_; }
  const std::vector<DcpItemRef>& items() const noexcept { return items_; }      // state_dict_metadata order
  const std::string& version() const noexcept { return version_; }              // Metadata.version ("" if None)
  const std::string& checkpoint_id() const noexcept { return checkpoint_id_; }  // StorageMeta, as text
  const DcpTensor* find_tensor(std::string_view fqn) const;                     // nullptr if absent
  const DcpOptions& options() const noexcept { return options_; }
  // The opened data file `file` (index into files()), mapped once by open()
  // and read by every later stage (load_chunk, the GPU loader's file ranges:
  // its fd(), never a reopen of the name); nullptr out of range and after
  // parse_metadata. Valid while *this lives.
  const MappedFile* data_file(std::uint32_t file) const noexcept {
    return file < mapped_.size() ? mapped_[file].get() : nullptr;
  }

  // The chunk's payload, loaded with the weights-only loader and checked
  // against the metadata (one tensor, dtype, shape = chunk sizes). The
  // returned Checkpoint borrows the mapped data file (valid while *this lives).
  // Errors: as load_bytes, plus kMalformed (payload does not match).
  Result<Checkpoint> load_chunk(const DcpTensor& t, const DcpChunk& c) const;
  // A non-tensor item (torch.save bytes) through the weights-only loader.
  Result<Checkpoint> load_bytes_item(const DcpBytesItem& item) const;

 private:
  friend struct DcpAccess;
  std::vector<DcpTensor> tensors_;
  std::vector<DcpBytesItem> bytes_items_;
  std::vector<DcpFile> files_;
  std::vector<DcpItemRef> items_;
  std::vector<std::unique_ptr<MappedFile>> mapped_;         // one per file (empty after parse_metadata)
  std::map<std::string, std::size_t, std::less<>> by_fqn_;  // tensors_ index
  std::string version_, checkpoint_id_;
  DcpOptions options_;
};

// ---- Resharded loading ----
//
// A plan says, per tensor FQN, which box (offsets, sizes per dimension) of
// the global tensor this process wants. Helpers build the boxes DTensor's
// placements give (torch.chunk semantics, torch/distributed/tensor/
// placement_types.py Shard._split_tensor: chunk size ceil(n / N), trailing
// ranks may get fewer rows or none). A multi-GPU loader (issue 18) gives each
// process its own plan; replicated tensors are the full box on every rank.
struct DcpBox {
  std::vector<std::int64_t> offsets, sizes;
};
struct DcpPlacement {
  int shard_dim = -1;  // -1 = Replicate; else Shard(shard_dim)
};
// The box rank `rank` of a 1-D or N-D mesh holds: `mesh` = mesh shape,
// `coord` = this rank's coordinate in it, `placements` one per mesh dim.
// Errors: kInvalidArgument (sizes mismatch, dim out of range, coord outside mesh).
Result<DcpBox> dtensor_box(const std::vector<std::int64_t>& global_shape, const std::vector<std::int64_t>& mesh,
                           const std::vector<std::int64_t>& coord, const std::vector<DcpPlacement>& placements);

struct DcpPlanItem {
  std::string fqn;
  DcpBox box;
};
struct DcpPlan {
  std::vector<DcpPlanItem> items;
  // Every tensor of `ckpt`, whole (one process loads the full model).
  static DcpPlan full(const DcpCheckpoint& ckpt);
  // Every tensor as rank `rank` of `world_size` sees it with one placement
  // for all (Replicate for 0-dim tensors and when shard_dim >= ndim).
  static DcpPlan uniform(const DcpCheckpoint& ckpt, DcpPlacement p, std::int64_t rank, std::int64_t world_size);
};

struct DcpLoadedTensor {
  std::string fqn;
  DType dtype = DType::kFloat32;
  DcpBox box;  // what was asked
  std::vector<std::int64_t> global_shape;
  std::vector<std::uint8_t> data;  // row-major little-endian bytes of the box (numel x elem size)
};

// Reads exactly the chunks that intersect each box (others are not
// touched) and assembles each box in host memory. Errors: kInvalidArgument
// (unknown FQN, box outside the tensor, duplicate FQN in the plan), chunk
// errors of load_chunk, kLimitExceeded (a box larger than limits.max_tensor_bytes).
Result<std::vector<DcpLoadedTensor>> load_dcp(const DcpCheckpoint& ckpt, const DcpPlan& plan);
Result<std::vector<DcpLoadedTensor>> load_dcp(const std::filesystem::path& dir, const DcpPlan& plan,
                                              const DcpOptions& options = {});
// One box of one tensor into `out` (exactly numel x elem size bytes).
Status load_dcp_box(const DcpCheckpoint& ckpt, const DcpTensor& t, const DcpBox& box, std::uint8_t* out,
                    std::uint64_t out_bytes);

// ---- Consolidation ----
// Writes every tensor whole, keyed by its FQN, into a safetensors file
// (atomically: temp file + fsync + rename), streaming: one tensor in memory
// at a time. Non-tensor items are not in safetensors; `skipped` (if given)
// receives their FQNs. Errors: as load_dcp, kExists (unless
// options.overwrite), kIo, kUnsupported (a dtype safetensors lacks).
struct DcpConvertOptions {
  bool overwrite = false;
  bool fsync = true;
};
// The consolidated nested state dict as torch.distributed.checkpoint.
// format_utils.dcp_to_torch_save builds it (default_planner.py
// _EmptyStateDictLoadPlanner + _traverse.py set_element: state_dict_metadata
// order, each value set along its planner_data path, str keys make dicts and
// int keys lists padded with None; no path: the FQN as a top-level key),
// with the non-tensor items' values from the weights-only loader (PyTorch
// unpickles them with weights_only=False). Tensor bytes go to an unlinked
// temporary file in `scratch_dir`, mapped by the Checkpoint: memory holds one
// tensor at a time. Errors: as load_dcp, kIo (scratch file), kUnsupported
// (a tensor inside a non-tensor item), kMalformed (paths that collide).
Result<Checkpoint> dcp_to_checkpoint(const DcpCheckpoint& ckpt, const std::filesystem::path& scratch_dir);
// dcp_to_checkpoint, then safeckpt::save to `out` (atomic; scratch file beside `out`).
Status dcp_to_torch_save(const DcpCheckpoint& ckpt, const std::filesystem::path& out,
                         const DcpConvertOptions& options = {});
Status dcp_to_safetensors(const DcpCheckpoint& ckpt, const std::filesystem::path& out,
                          const DcpConvertOptions& options = {}, std::vector<std::string>* skipped = nullptr);

// ---- DTensors in per-rank torch.save files ----
// `torch.save(model.state_dict())` on every rank of an FSDP2 / DTensor job
// writes one file per rank whose tensors are DTensors (each file loaded with
// the bundled allowlist/dtensor.allow: TensorInfo::dtensor, safeckpt/
// tensor.hpp). gather_dtensor_ranks puts the ranks' local shards together
// into the full tensors DTensor.full_tensor() returns: a flat state_dict
// (OrderedDict FQN -> tensor, FQNs as named_tensors() spells them, in rank
// 0's order) that save() / save_checkpoint_as_safetensors write. `ranks`:
// one loaded checkpoint per rank file, any order (each file says its mesh
// coordinate); borrowed for the call. Memory: the gathered tensors are held
// in the result (the whole model), plus one local shard at a time (two while a
// replica is compared with the box already written).
// Rules: every file has the same tensor FQNs; a DTensor has the same dtype,
// global shape, mesh shape and placements in every file; the files hold
// each coordinate of its mesh exactly once (as many files as mesh ranks);
// boxes held by several ranks (Replicate) must be byte-equal; the distinct
// boxes cover the tensor. Plain tensors (not DTensors) are taken from rank
// file 0 (a note says so).
// Errors: kInvalidArgument (no files, an FQN missing from a file, a
// coordinate twice, a mesh of another size than the file count),
// kMalformed (files that disagree: dtype, shape, mesh, placements, replica
// values; shards not covering the tensor), kUnsupported (a Partial placement:
// the full tensor is a reduction, not done; non-tensor values in rank 0's
// file unless drop_non_tensors), kLimitExceeded (CheckpointBuilder limits).
struct DTensorGatherOptions {
  bool drop_non_tensors = false;  // leave non-tensor values out (a note names each) instead of refusing
};
Result<Checkpoint> gather_dtensor_ranks(const std::vector<const Checkpoint*>& ranks,
                                        const DTensorGatherOptions& options = {},
                                        std::vector<std::string>* notes = nullptr);

// ---- Writing a DCP directory (the reverse: one checkpoint -> DCP) ----
//
// save_dcp writes what torch.distributed.checkpoint.save writes from
// `world_size` processes (FileSystemWriter defaults, one thread per rank,
// PyTorch 2.11) holding the state dict as DTensors Shard(0) over a 1-D mesh,
// so that torch.distributed.checkpoint.load / FileSystemReader read it back
// (world size 1 checked on PyTorch 2.11: tests/data/dcp-2.11/README.md,
// "Written by safeckpt"; N > 1: tests/gen/check_to_dcp.py, see that README)
// and DcpCheckpoint::open accepts it:
//  1. The state dict is `ckpt`'s root, a dict (kDict / kOrderedDict), flattened
//     as torch/distributed/checkpoint/_traverse.py traverse_state_dict and
//     _nested_dict.py flatten_state_dict do: dict keys become str (str or int
//     keys only), lists holding a tensor or a dict (directly or through
//     nested lists) are walked by index, every other value (tuples, lists of
//     plain values, scalars, str, bytes, ...) is one non-tensor item; the FQN
//     is the path joined with '.'; empty dicts vanish. OrderedDict
//     `_metadata` is not kept (DCP drops it too).
//  2. `__<rank>_0.distcp` for rank 0 .. world_size - 1 (every file exists,
//     possibly empty, as every FileSystemWriter rank creates its file): each
//     tensor is split along dim 0 as DTensor's Shard(0) does (torch.chunk
//     semantics, placement_types.py Shard._local_shard_size_and_offset: rank
//     r holds rows [r c, min((r + 1) c, n)) with c = ceil(n / world_size);
//     ranks past the end hold an empty shard at offset n). Each chunk is a
//     complete torch.save zip of a C-contiguous copy of its rows
//     (safeckpt::save_to_writer, zip root "archive", storage on "cpu"; like
//     DCP, which clones views), in its rank's file, back to back in
//     flattening order. What several ranks would write identically is
//     written ONCE, by the lowest of them, as dedup_save_plans keeps one
//     writer per MetadataIndex: the empty shards of a tensor (one empty
//     chunk, by the first rank past the end), a 0-dim tensor and a tensor
//     whose dim 0 is 0 (one whole chunk on rank 0: replicated), and every
//     non-tensor item (the torch.save bytes of its value, weights-only
//     compatible, on rank 0). PyTorch's default planner picks the rank whose
//     plan is smallest so far instead of the lowest (DefaultSavePlanner
//     dedup_save_to_lowest_rank=False; uneven-ws4 has them on ranks 1 and 2);
//     readers look each item up in storage_data, so both layouts read alike.
//  3. `.metadata`: the pickle (protocol 2, the save layer's pickler) of
//     Metadata(state_dict_metadata (a tensor's chunks in rank order),
//     planner_data = FQN -> path tuple, storage_data = MetadataIndex(fqn,
//     chunk offsets, chunk position) -> _StorageInfo("__<rank>_0.distcp",
//     offset, length), version = "1.0.0" as 2.11 writes it),
//     the dataclasses made by NEWOBJ + BUILD as Python pickles them.
//  4. Atomic: everything is written into a new temporary directory beside
//     `out_dir`, each file fsync'ed, then the directory is renamed to
//     `out_dir` with RENAME_NOREPLACE and the parent fsync'ed. An existing
//     `out_dir` (file, directory or symlink) is refused; on any error the
//     temporary directory is removed and nothing is left behind.
// Memory: one chunk at a time (a tensor that is not row-major: its whole
// contiguous copy), plus the metadata tree. Files are written one rank after
// the other.
// Errors: kExists (out_dir exists), kIo (parent missing, create / write /
// fsync / rename, errno text), kUnsupported (root not a dict, a dict key
// that is not str/int, a container reached twice or a cycle, a tensor that
// is not a plain strided one — sparse, quantized, meta, conj/neg bits, a
// subclass —, a tensor inside a non-tensor item, a value the weights-only
// save refuses), kInvalidArgument (two items with one FQN, e.g. keys "a.b"
// and "a" -> "b"; world_size 0), kLimitExceeded (a path deeper than 4096
// keys or an FQN longer than kMaxTensorNameBytes, a world size above
// limits.max_files, or more items / chunks / metadata than DcpLimits lets
// DcpCheckpoint::open read back).
struct DcpWriteOptions {
  bool fsync = true;  // fsync files and directories (off: faster, not crash-safe)
  DcpLimits limits;   // refuse what DcpCheckpoint::open would refuse with these
  // Writers to lay the directory out for (rule 2): 1 .. limits.max_files.
  std::uint32_t world_size = 1;
};
// What save_dcp wrote.
struct DcpWriteSummary {
  std::uint64_t tensors = 0, bytes_items = 0;
  std::uint64_t chunks = 0;      // tensor chunks over all ranks (empty ones included)
  std::uint32_t files = 0;       // data files = world_size
  std::uint64_t data_bytes = 0;  // all .distcp files together
};
Result<DcpWriteSummary> save_dcp(const Checkpoint& ckpt, const std::filesystem::path& out_dir,
                                 const DcpWriteOptions& options = {});

}  // namespace safeckpt
