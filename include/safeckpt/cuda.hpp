// safeckpt/cuda.hpp — storage bytes straight into GPU memory, and DLPack export.
//
// The CUDA layer sits at the edge (STYLE.md): it knows byte ranges, not pickle
// or zip. The host loader validates a checkpoint, then hands this layer one
// StorageSource per storage (a file range, or bytes it already holds, e.g. an
// inflated deflate record) and gets back a DeviceArena: one device allocation
// with each storage at 256-byte alignment. Tensors are then exported as DLPack
// views of the arena whose deleters keep the arena alive.
//
// This header includes no CUDA header: device pointers are `void*`, streams
// are not exposed. Link safeckpt::cuda (built only when the CUDA toolkit is
// found; it defines SAFECKPT_HAVE_CUDA for its consumers).
//
// Pipeline (docs/gpu-loading.md): N reader threads take fixed-size chunks in
// storage order, read each into a slot of a pinned staging ring (pread, or
// O_DIRECT when the file is not in the page cache), compute the chunk's CRC-32
// on the bytes just read (combined per storage with crc32_combine), and queue
// cudaMemcpyAsync on one of S streams; a byte swap, when asked, is a small
// in-place kernel on the same stream after the copy. One completion thread
// waits on per-chunk events, recycles slots and marks storages ready. Host
// memory is bounded by the ring; device memory beyond the tensors is the
// 256-byte alignment padding plus CUDA's own stream/event/module state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "safeckpt/dlpack.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/mapped_file.hpp"

#if DLPACK_MAJOR_VERSION != 1
#error "safeckpt/cuda.hpp needs DLPack 1.x (DLManagedTensorVersioned); another dlpack.h came first"
#endif

namespace safeckpt::cuda {

namespace detail {
struct EngineState;  // defined in src/cuda/transfer.cpp
struct LoadInput;    // one file of a load (src/cuda/transfer_internal.hpp)
struct Placement;    // caller-owned destination of load_into()
}  // namespace detail

// Every storage starts at a multiple of this in the arena (cudaMalloc's own
// alignment; DLPack's recommended data alignment).
inline constexpr std::uint64_t kArenaAlignment = 256;

// ---------------------------------------------------------------------------
// Devices

// Number of CUDA devices; 0 when there is no driver or no device (the CUDA
// error is swallowed: callers use this to decide whether to skip).
int device_count() noexcept;

// "<name>, sm_<major><minor>, <memory> GiB, driver <x.y>, runtime <x.y>", or
// an error (kDevice) for a bad index.
Result<std::string> device_description(int device);

// Bytes free and total on `device` (cudaMemGetInfo). Creates the context if
// needed. Errors: kDevice.
struct DeviceMemory {
  std::uint64_t free_bytes = 0;
  std::uint64_t total_bytes = 0;
};
Result<DeviceMemory> device_memory(int device);

// The pinned host->device copy ceiling: copies `bytes` (1e9 per GB in the
// result) from one pinned buffer of min(256 MiB, max(bytes, chunk_bytes)) to device memory in
// `chunk_bytes` cudaMemcpyAsync calls spread round-robin over `streams`
// streams; returns the median GB/s of 3 runs after a warm-up run. What the
// transfer engine is compared against (docs/gpu-loading.md). Errors: kInvalidArgument (zero sizes, streams > 64),
// kDevice (any CUDA call; memory is freed first).
Result<double> measure_pinned_h2d(int device, std::uint64_t bytes, unsigned streams = 4,
                                  std::uint64_t chunk_bytes = 16ull << 20);

// ---------------------------------------------------------------------------
// Transfer engine

// One storage to place on the device, as the host loader found it.
struct StorageSource {
  // Byte range [file_offset, file_offset + nbytes) of the file passed to
  // load(). Ignored when host_bytes is set.
  std::uint64_t file_offset = 0;
  std::uint64_t nbytes = 0;
  // Byte-order conversion: 1 = none; 2, 4 or 8 = reverse the bytes of each
  // unit of that size (dtype_swap_unit(dtype) of a big-endian checkpoint).
  // nbytes must be a multiple of it (else kInvalidArgument).
  std::uint32_t swap_unit = 1;
  // CRC-32 (zlib / zip polynomial) of the nbytes as stored in the file, i.e.
  // before any byte swap; 0 = don't check. Checked only with verify_crc.
  std::uint32_t expected_crc32 = 0;
  // Non-null: the bytes are already in host memory (nbytes of them, owned by
  // the caller and alive until load() returns) instead of a file range.
  const std::uint8_t* host_bytes = nullptr;
};

// One storage of TransferEngine::load_into(): where it comes from and where
// in the caller's device memory it goes.
struct PlacedSource {
  StorageSource source;
  // Index into load_into()'s `files` (ignored when source.host_bytes is set).
  std::uint32_t file = 0;
  // The bytes land at device_base + device_offset; [device_offset,
  // device_offset + nbytes) must lie inside device_bytes, must not overlap any
  // other source's, and device_base + device_offset must be a multiple of
  // source.swap_unit.
  std::uint64_t device_offset = 0;
};

enum class IoMode : std::uint8_t {
  // O_DIRECT when a sample of the file's pages (mincore) shows it is mostly
  // not in the page cache and the file system accepts O_DIRECT; pread
  // otherwise. Never picks kMmapRegister (see gpu_bench for when it wins).
  kAuto = 0,
  // Buffered pread into the pinned ring (fast from the page cache).
  kPread = 1,
  // O_DIRECT pread into the pinned ring: reads 4096-aligned supersets of each
  // chunk, so any offset works; bypasses (and does not fill) the page cache.
  // Falls back to kPread if the file system refuses O_DIRECT.
  kODirect = 2,
  // mmap the file, cudaHostRegister(read-only) disjoint page-aligned blocks
  // of it from the reader threads, copy straight from the mapping, unregister
  // each block when its copies are done. No staging copy; pages fault in from
  // the page cache (or disk) during registration. Falls back to kPread when
  // the device cannot register read-only memory. Registration dominates its
  // cost, which is why kAuto never picks it (bench/RESULTS.md has the runs).
  kMmapRegister = 3,
};
std::string_view io_mode_name(IoMode mode) noexcept;

struct TransferOptions {
  // CUDA device index.
  int device = 0;
  // Pinned staging ring, at most this many bytes, in slots of chunk_bytes +
  // 8 KiB. TransferEngine::create starts pinning all of it on a background
  // thread (one anonymous mapping advised for transparent huge pages, pages
  // first-touched by up to 8 helper threads, then cudaHostRegister slot by
  // slot); a load uses each slot as soon as it is pinned, so a new engine's
  // first load does not wait for the whole ring. If that path fails, the
  // remaining slots are pinned lazily with cudaHostAlloc when every slot is
  // busy. Slots stay pinned until the engine is destroyed. A short pause
  // between slots lets other threads' CUDA calls through.
  // Default 128 MiB (31 slots of 4 MiB + 8 KiB); host memory stays bounded
  // by it. Bigger rings were not faster, smaller ones slower
  // (bench/RESULTS.md, ring sweeps). >= chunk_bytes, <= 16 GiB.
  std::uint64_t ring_bytes = 128ull << 20;
  // Bytes per read / per cudaMemcpyAsync. A multiple of 4096, 64 KiB..1 GiB.
  // Default 4 MiB: the fastest in the chunk sweeps (bench/RESULTS.md).
  std::uint64_t chunk_bytes = 4ull << 20;
  // Reader threads; 0 = min(16, hardware threads). One page-cache pread
  // thread moves far less than the PCIe link, so several are needed to
  // approach it (reader sweeps in bench/RESULTS.md). At most 256.
  unsigned reader_threads = 0;
  // CUDA streams the copies are spread over. 1..64.
  unsigned streams = 4;
  IoMode io_mode = IoMode::kAuto;
  // Stage every chunk in a reader's own pageable buffer instead of the
  // pinned ring: no ring is pinned (kMmapRegister still registers file
  // pages; it does not stage), the copy goes through the driver's own staging
  // memory and the reader waits for it before reusing its buffer. Slower than
  // the ring and no faster to the first tensor (bench/RESULTS.md). For hosts
  // where pinned memory must not be used.
  bool pageable_staging = false;
  // Compare each storage's CRC-32 with StorageSource::expected_crc32 (when
  // nonzero; storages without one, e.g. safetensors, are not hashed). Costs
  // CPU on the reader threads; see bench/RESULTS.md.
  bool verify_crc = true;
  // Called once per storage as soon as its bytes (swapped, CRC checked) are
  // complete on the device, with its index in `sources` (for load_to_device,
  // Checkpoint::storages() order): from the engine's completion thread, or,
  // for empty storages, from the calling thread before any reader starts;
  // calls never overlap. A progress signal: device addresses are known once
  // load() returns the arena. Not called after a failure; storages already
  // reported are freed with the arena when load() then fails. Must not throw
  // and must not call back into the engine. May be empty.
  std::function<void(std::size_t storage_index)> on_storage_ready;
};

// Measurements of one load() call.
struct LoadStats {
  std::uint64_t bytes = 0;              // storage bytes delivered to the device
  std::uint64_t arena_bytes = 0;        // device bytes allocated (incl. padding)
  double seconds = 0;                   // load() wall time, call to return
  double seconds_to_first_storage = 0;  // call until the first storage completes on the device
  std::uint64_t peak_ring_bytes = 0;    // most staging bytes in use at once
  std::uint64_t ring_bytes_pinned = 0;  // staging pinned by the engine after this load
  IoMode io_mode = IoMode::kAuto;       // mode actually used for file ranges
  unsigned reader_threads = 0;
  unsigned streams = 0;
  std::uint64_t chunks = 0;  // reads + copies issued
  // Where the time before the first storage goes (bench "first tensor"):
  double seconds_device_alloc = 0;    // cudaMalloc of the arena (overlaps the first reads)
  double seconds_to_first_copy = 0;   // call until the first cudaMemcpyAsync was issued (0: none)
  std::size_t slots_pinned = 0;       // staging slots pinned during this load (0 once the ring is pinned)
  double seconds_pinning = 0;         // wall time inside cudaHostRegister / cudaHostAlloc for them
  double seconds_ring_ready = 0;      // engine creation until its whole ring was pinned; 0 if not yet
  std::uint64_t pageable_chunks = 0;  // chunks staged in pageable memory (pageable_staging)
  double gb_per_s() const noexcept { return seconds > 0 ? static_cast<double>(bytes) / seconds / 1e9 : 0; }
};

// Owns one device allocation holding every storage of one load. Move-only;
// frees the memory on destruction (on the device it was allocated on). All
// copies and swaps have completed when load() returns it, so any stream may
// read it. Share it (std::shared_ptr) to export DLPack tensors.
class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  DeviceArena(DeviceArena&& o) noexcept;
  DeviceArena& operator=(DeviceArena&& o) noexcept;
  ~DeviceArena();

  int device() const noexcept { return device_; }
  // Base device pointer; null when nothing was allocated (all storages empty).
  void* base() const noexcept { return base_; }
  std::uint64_t size_bytes() const noexcept { return size_; }
  std::size_t storage_count() const noexcept { return count_; }
  // Device pointer of storage i (256-byte aligned); null for an empty storage.
  // i < storage_count(), else null.
  void* storage_data(std::size_t i) const noexcept;
  std::uint64_t storage_nbytes(std::size_t i) const noexcept;

  // Synchronous copy of storage i back to host memory (tests, debugging).
  // out.size() must equal storage_nbytes(i). Errors: kInvalidArgument, kDevice.
  Status copy_to_host(std::size_t i, std::span<std::uint8_t> out) const;

  // Frees now. Errors from cudaFree are ignored (the memory is gone either way).
  void reset() noexcept;

  // An arena of uninitialized storages of `sizes` bytes (256-byte aligned,
  // one cudaMalloc) on `device`, for callers that fill it themselves
  // (load_dcp_to_device places DCP chunks into whole tensors with it).
  // Errors: kLimitExceeded (sizes overflow), kDevice (cudaSetDevice/cudaMalloc).
  static Result<DeviceArena> allocate(int device, std::span<const std::uint64_t> sizes);

 private:
  friend class TransferEngine;
  int device_ = 0;
  void* base_ = nullptr;
  std::uint64_t size_ = 0;
  std::size_t count_ = 0;
  // Per storage: offset in the arena and size (2 * count_ entries).
  std::unique_ptr<std::uint64_t[]> layout_;
};

// Streams, events and the pinned ring for one device, reused across loads
// (pinning is costly even the fast way, see ring_bytes).
// Move-only; a moved-from engine may only be destroyed or assigned to. One
// load() at a time per engine (calls are serialized internally). While the
// ring is being pinned, other threads' CUDA calls may wait for each slot's
// cudaHostRegister (it holds the driver's lock), longer on the cudaHostAlloc
// fallback (bench/RESULTS.md).
class TransferEngine {
 public:
  // Validates options, creates the device's CUDA context if there is none
  // yet (the slow part of create) and the streams, and starts pinning
  // the staging ring on a background thread (not with pageable_staging; it
  // uses up to 8 short-lived helper threads); returns without waiting for
  // it. The caller's current device is left as it was. The destructor stops
  // and joins that thread. Errors: kInvalidArgument (options), kDevice; a
  // failure while pinning in the background is not an error here (load()
  // pins lazily instead and reports cudaHostAlloc failures).
  static Result<TransferEngine> create(const TransferOptions& options);

  TransferEngine(TransferEngine&&) noexcept;
  TransferEngine& operator=(TransferEngine&&) noexcept;
  ~TransferEngine();

  // Places every source on the device. `file` may be empty when every source
  // has host_bytes. On any failure the arena and all in-flight work are
  // released before returning; the engine stays usable.
  // Errors:
  //   kInvalidArgument  bad swap_unit, nbytes not a multiple of swap_unit,
  //                     offset + nbytes overflows, no file for a file range;
  //   kMalformed        a range ends past the end of the file (names the
  //                     storage index, range and file size); CRC mismatch
  //                     (names the storage index, expected and computed CRC);
  //   kIo               open/read failed or the file shrank (errno text);
  //   kDevice           a CUDA call failed (cudaGetErrorString), including
  //                     out of device memory for the arena.
  //
  // The file is opened once per load and every read of the load (buffered
  // pread, the mmap of kMmapRegister, O_DIRECT: a reopen of /proc/self/fd/N,
  // the same inode; kPread when that fails) goes to that one open file.
  // This overload opens `file` by path at the call: bytes validated by an
  // earlier parse of the same path may differ if the path was replaced in
  // between. Loading a checkpoint that was parsed, use the next overload.
  Result<DeviceArena> load(const std::filesystem::path& file, std::span<const StorageSource> sources,
                           LoadStats* stats = nullptr);
  // Same, reading the file the host loader validated: `file.fd()` (borrowed;
  // `file` must stay open until load() returns), never its path. A path
  // replaced since it was opened does not change what reaches the device
  // (issue 11 item 3); an in-place write to the same inode does
  // (safeckpt/mapped_file.hpp): zip records are caught by verify_crc, formats
  // without a checksum are not. A file without a descriptor (a buffer) is
  // like an empty path: every source must have host_bytes.
  Result<DeviceArena> load(const MappedFile& file, std::span<const StorageSource> sources, LoadStats* stats = nullptr);

  // Several files in one pipeline, into device memory the caller owns: no
  // arena is allocated, sources[i] lands at device_base +
  // sources[i].device_offset. One load over many files keeps the readers and
  // the copy streams busy across file boundaries (the fill and drain of a
  // pipeline is paid once, not per file) and places pieces of a tensor at
  // their final offsets (sharded checkpoints: load_dcp_to_device puts the
  // Shard(0) chunks of every rank's file into whole tensors with it, no
  // device-to-device copy). `files` are borrowed and read through their
  // descriptors like load(const MappedFile&); they must stay open until
  // return. The I/O mode is chosen once for the whole load (kAuto: O_DIRECT
  // when the sampled pages of all files are mostly not cached; a file that
  // cannot be opened O_DIRECT or mapped makes the whole load kPread).
  // `device_base` must be device memory of options().device (cudaMalloc'd or
  // an arena's) of at least `device_bytes`; nothing else may use the
  // destination ranges during the call. on_storage_ready indices are indices
  // into `sources`. LoadStats::arena_bytes and seconds_device_alloc are 0.
  // On failure every copy issued has completed or been waited for before
  // return, and the destination bytes are unspecified (some sources may be
  // written, none is reported whole): the caller discards them.
  // Errors: as load(), plus kInvalidArgument for a file index past `files`,
  // a file without a descriptor for a file range, a destination outside
  // device_bytes, overlapping destinations, a misaligned swapped
  // destination, or a null device_base with non-empty sources.
  // `on_storage_ready`, if set, is called like TransferOptions::
  // on_storage_ready (after it, same thread and rules) for this load only.
  Status load_into(std::span<const MappedFile* const> files, std::span<const PlacedSource> sources, void* device_base,
                   std::uint64_t device_bytes, LoadStats* stats = nullptr,
                   const std::function<void(std::size_t)>& on_storage_ready = {});

  const TransferOptions& options() const noexcept;
  // Pinned staging currently held (grows to about options().ring_bytes).
  std::uint64_t pinned_bytes() const noexcept;

 private:
  explicit TransferEngine(std::unique_ptr<detail::EngineState> impl);
  // Both load()s: `given_fd` >= 0 is read (borrowed), else `file` is opened.
  Result<DeviceArena> load_from(const std::filesystem::path& file, int given_fd, std::span<const StorageSource> sources,
                                LoadStats* stats);
  // Every load: `file_of[i]` indexes `files` for source i (empty: all file 0);
  // `placed` null = allocate an arena (returned), else write into the
  // caller's memory (the returned arena is empty).
  Result<DeviceArena> load_impl(std::span<const detail::LoadInput> files, std::span<const StorageSource> sources,
                                std::span<const std::uint32_t> file_of, const detail::Placement* placed,
                                LoadStats* stats);
  std::unique_ptr<detail::EngineState> impl_;
};

// One-shot: create an engine, load, drop the engine (the ring is unpinned).
Result<DeviceArena> load_storages(const std::filesystem::path& file, std::span<const StorageSource> sources,
                                  const TransferOptions& options = {}, LoadStats* stats = nullptr);

// CRC-32 (zip/zlib polynomial) as the engine computes it: carry-less multiply
// folding when the CPU has PCLMULQDQ, zlib's crc32 otherwise. `crc` is the
// running value (0 to start), like zlib's crc32().
std::uint32_t crc32_update(std::uint32_t crc, const std::uint8_t* data, std::size_t n) noexcept;

// ---------------------------------------------------------------------------
// DLPack export

// DType -> DLDataType (lanes 1). bool -> kDLBool/8, bfloat16 -> kDLBfloat/16,
// complex32/64/128 -> kDLComplex/32/64/128, float8_e5m2 / e4m3fn / e5m2fnuz /
// e4m3fnuz / e8m0fnu -> the kDLFloat8_* codes, uint16/32/64 -> kDLUInt.
// Errors: kUnsupported for quantized types (qint8, quint8, qint32, quint4x2,
// quint2x4: their scale/zero point has no DLPack field), packed sub-byte
// types (float4_e2m1fn_x2) and the untyped bits* types.
Result<DLDataType> dlpack_dtype(DType dtype);

// One strided view into a device storage, in PyTorch's terms.
struct TensorView {
  void* storage_data = nullptr;      // device pointer of the storage's byte 0
  std::uint64_t storage_nbytes = 0;  // for bounds checking
  int device = 0;                    // CUDA device index
  DType dtype = DType::kFloat32;
  std::span<const std::int64_t> shape;    // sizes, each >= 0
  std::span<const std::int64_t> strides;  // elements, same length as shape, each >= 0
  std::int64_t storage_offset = 0;        // elements, >= 0
};

// Builds a DLPack tensor viewing `view`: data points at the first element
// (storage_data + storage_offset * itemsize, byte_offset 0, as PyTorch and
// CuPy produce; NULL for a tensor with no elements), shape and strides copied.
// The deleter destroys the struct and releases `owner`, which must keep the
// storage alive (the std::shared_ptr<DeviceArena>). The versioned form sets
// version {1, 1} and, when read_only, DLPACK_FLAG_BITMASK_READ_ONLY.
// Errors: kUnsupported (dtype, see dlpack_dtype), kInvalidArgument (rank >
// 64, shape/strides length mismatch, negative size/stride/offset, null
// owner, or null data for a tensor with elements), kMalformed (the view
// reaches past storage_nbytes; checked without overflow).
Result<DLManagedTensorVersioned*> to_dlpack_versioned(const TensorView& view, std::shared_ptr<const void> owner,
                                                      bool read_only = true);
Result<DLManagedTensor*> to_dlpack_legacy(const TensorView& view, std::shared_ptr<const void> owner);

// The view of storage i of a shared arena (fills storage_data, storage_nbytes
// and device); the caller sets dtype, shape, strides and storage_offset.
TensorView arena_view(const DeviceArena& arena, std::size_t storage_index) noexcept;

}  // namespace safeckpt::cuda
