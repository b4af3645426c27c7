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
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/cuda.hpp"
#include "safeckpt/dcp.hpp"

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
  friend struct detail::DeviceCheckpointMaker;  // load_to_device (src/cuda/device_internal.hpp)
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

// load_to_device with the bytes still on their way: start() parses the file
// on the calling thread (every check of load_to_device; its errors are
// returned there and nothing is started), allocates the device arena, and
// returns at once while ONE TransferEngine::load_into streams the storages
// on a background thread. Every tensor's device address is known from the
// start (checkpoint()); its bytes are there once its storage is ready().
// For work that needs addresses but not bytes, overlapped with the transfer:
// planning, compiling and CUDA-graph capture of a program over these
// weights, then running its first layers while later layers' weights still
// land (safeckpt/engine.hpp, Engine::compile with a pending checkpoint).
// Thread safety: every member may be called from any thread. Not movable
// (the background thread refers to it); shared, so a CompiledProgram can
// keep it. The destructor waits for the transfer to end, so no copy ever
// targets freed memory.
class PendingDeviceCheckpoint {
 public:
  // `engine`: as load_to_device (one-shot engine when null); a caller's
  // engine must outlive the returned object, and its other loads wait for
  // this one (one load at a time per engine).
  // Errors: as load_to_device's parse, kInvalidArgument (map_location),
  // kDevice (engine creation, the arena's cudaMalloc), kIo (no thread).
  static Result<std::shared_ptr<PendingDeviceCheckpoint>> start(const std::filesystem::path& path,
                                                                const DeviceLoadOptions& options = {},
                                                                TransferEngine* engine = nullptr);
  PendingDeviceCheckpoint(const PendingDeviceCheckpoint&) = delete;
  PendingDeviceCheckpoint& operator=(const PendingDeviceCheckpoint&) = delete;
  ~PendingDeviceCheckpoint();

  // Addresses valid now; a storage's bytes only once it is ready (wait()).
  // Export DLPack tensors or read bytes only after wait_all() succeeded.
  const DeviceCheckpoint& checkpoint() const noexcept;
  std::size_t storage_count() const noexcept;
  // True once storage `storage` is complete on the device (CRC checked);
  // false for an index out of range and after a failure.
  bool ready(std::uint32_t storage) const noexcept;
  // Blocks until `storage` is complete (its bytes are final from then on).
  // Errors: the load's error when it failed before `storage` landed, and
  // for every wait once it has failed; kInvalidArgument (index). Work
  // started on landed storages must still check wait_all() before its
  // results are used (the engine does): a failed load is never partly used.
  Status wait(std::uint32_t storage) const;
  // The storage whose device bytes contain address `p`, if any.
  std::optional<std::uint32_t> storage_at(const void* p) const noexcept;
  // Blocks until the transfer ended; its result (as load_to_device's).
  Status wait_all() const;
  // The transfer's statistics (LoadStats of load_into; seconds from start()
  // to the end of the transfer); zero until wait_all() returned.
  LoadStats stats() const;

 private:
  struct State;  // src/cuda/pending_checkpoint.cpp
  explicit PendingDeviceCheckpoint(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

// ---------------------------------------------------------------------------
// A DCP plan on the device (torch.distributed.checkpoint directories, issue 17)
//
// load_dcp_to_device places every box of a DcpPlan (safeckpt/dcp.hpp) in
// device memory, row-major, reading only the chunks each box intersects:
//  - DIRECT: a box equal to one saved chunk whose torch.save storage record
//    is stored (not deflated), little-endian and whose tensor is row-major
//    goes from the .distcp file straight through the transfer engine (a
//    StorageSource file range of the DcpCheckpoint's own open descriptor,
//    DcpCheckpoint::data_file(), never a reopen of the name). The record's
//    CRC-32 is checked on the reader threads (engine verify_crc) when the
//    tensor covers the whole record. This is the case of a process loading
//    with the plan of the world that saved (DcpPlan::uniform with the saving
//    world size and placement), and of world size 1 directories.
//  - PLACED: a box tiled by several saved chunks (the whole model from a
//    sharded directory: a world size 1 plan), each chunk lying inside the
//    box, differing from it in one dimension at most (Shard(d) over a 1-D
//    mesh, nested Shard(d) on one d) and DIRECT on its own. A chunk that is
//    a contiguous run of the box (Shard(0), or leading dims of size 1) is
//    read straight into its place; a chunk of several rows (Shard(d), d > 0)
//    is read into a temporary arena per file, copied into place (cudaMemcpy2D,
//    device to device) and freed before the next file's, so the extra device
//    memory is one file's such chunks at most. DcpDeviceTensor::direct is
//    true for these too.
//  - HOST: any other box (resharded, chunks cut in two dimensions, a deflated or
//    non-row-major record) is assembled on the host by load_dcp_box
//    (chunk checks as load_chunk: ckpt.options(), CRC per
//    verify_storage_crc) and uploaded as StorageSource::host_bytes, in
//    batches of at most kDcpHostBatchBytes (one box larger than that is a
//    batch of its own), so host memory holds one batch at a time.
// CRC: finding a direct box's record runs load_chunk, which checks the
// record's CRC-32 on the host when ckpt.options().verify_storage_crc (a host
// pass over the bytes); open the DcpCheckpoint with it false to leave the
// check of direct boxes to the reader threads (host-assembled boxes are then
// not checked: their chunks are read without it).
// DIRECT and PLACED boxes share one DeviceArena filled by ONE
// TransferEngine::load_into over every data file (the pipeline fills and
// drains once for the whole directory; bench/RESULTS.md, issue 17), plus
// one engine load per file with several-row chunks and one per host batch
// (its own arena); the result holds them all. Nothing is handed out on
// failure (arenas freed, the error returned).
// Multi-GPU: one process per GPU, each with its own plan (its rank's boxes)
// and its own engine on its own device; collective loading (read once,
// NCCL broadcast / scatter) is issue 18 and not done here.
inline constexpr std::uint64_t kDcpHostBatchBytes = 1ull << 30;

// One box on the device.
struct DcpDeviceTensor {
  std::string fqn;
  DType dtype = DType::kFloat32;
  DcpBox box;  // what the plan asked for
  std::vector<std::int64_t> global_shape;
  void* data = nullptr;      // device pointer, row-major box (null when numel == 0)
  std::uint64_t nbytes = 0;  // numel(box) x element size
  int device = 0;
  bool direct = false;  // read straight from the file (else assembled on the host)
};

namespace detail {
struct DcpDeviceMaker;
}

// Made by load_dcp_to_device. It does not borrow the DcpCheckpoint (every
// byte was read during the call). Copies share the device arenas (freed with
// the last copy and the last DLPack capsule). Tensors in plan order.
class DcpDeviceCheckpoint {
 public:
  const std::vector<DcpDeviceTensor>& tensors() const noexcept { return tensors_; }
  const DcpDeviceTensor* find(std::string_view fqn) const noexcept;  // nullptr if absent
  int device() const noexcept { return device_; }
  std::uint64_t direct_bytes() const noexcept { return direct_bytes_; }  // bytes read from files directly
  std::uint64_t host_bytes() const noexcept { return host_bytes_; }      // bytes assembled on the host
  // Synchronous copy of tensor i (tensors() order) to host memory;
  // out.size() must equal its nbytes. Errors: kInvalidArgument, kDevice.
  Status copy_to_host(std::size_t i, std::span<std::uint8_t> out) const;
  // DLPack export of tensor i (shape = box sizes, contiguous strides); the
  // capsule keeps its arena alive. Errors: kInvalidArgument (index),
  // kUnsupported (dtype without a DLPack code).
  Result<DLManagedTensorVersioned*> to_dlpack(std::size_t i, bool read_only = true) const;

 private:
  friend struct detail::DcpDeviceMaker;
  std::vector<DcpDeviceTensor> tensors_;
  std::vector<std::shared_ptr<DeviceArena>> arenas_;
  std::vector<std::pair<std::uint32_t, std::uint32_t>> where_;  // per tensor: arena, storage (arena ~0u: empty)
  int device_ = 0;
  std::uint64_t direct_bytes_ = 0, host_bytes_ = 0;
};

// Loads `plan` from `ckpt` (DcpCheckpoint::open'ed: data files mapped) onto
// options.map_location's device. options.load is not used (ckpt's
// DcpOptions applied when it was opened and apply to host-assembled
// boxes); options.transfer / `engine` as load_to_device. `stats`, if given:
// bytes, arena_bytes and chunks summed over the engine loads, seconds the
// whole call's wall time, the rest from the first engine load.
// Errors: as load_dcp (kInvalidArgument: unknown FQN, box outside the
// tensor, FQN twice; kLimitExceeded: a box over max_box_bytes; chunk
// errors of load_chunk), kInvalidArgument (map_location, a DcpCheckpoint
// from parse_metadata), and the transfer engine's (kDevice, kIo,
// kMalformed on a CRC mismatch or a range past the end of the file).
Result<DcpDeviceCheckpoint> load_dcp_to_device(const DcpCheckpoint& ckpt, const DcpPlan& plan,
                                               const DeviceLoadOptions& options = {}, TransferEngine* engine = nullptr,
                                               LoadStats* stats = nullptr);
// Same, opening `dir` first with `dcp_options`.
Result<DcpDeviceCheckpoint> load_dcp_to_device(const std::filesystem::path& dir, const DcpPlan& plan,
                                               const DcpOptions& dcp_options, const DeviceLoadOptions& options = {},
                                               TransferEngine* engine = nullptr, LoadStats* stats = nullptr);

}  // namespace safeckpt::cuda
