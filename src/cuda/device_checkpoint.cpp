// load_to_device: host metadata from safeckpt::load, bytes through the
// transfer engine. See include/safeckpt/device_checkpoint.hpp.
#include "safeckpt/device_checkpoint.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <map>
#include <optional>
#include <span>

#include "cuda/device_internal.hpp"
#include "cuda/transfer_internal.hpp"
#include "safeckpt/open.hpp"

namespace safeckpt::cuda {

namespace {

Result<int> parse_device(const std::string& loc) {
  if (loc == "cuda") {  // torch: the current device
    int d = 0;
    if (cudaGetDevice(&d) != cudaSuccess) {
      (void)cudaGetLastError();
      d = 0;
    }
    return d;
  }
  if (loc.rfind("cuda:", 0) != 0)
    return make_error(ErrorCode::kInvalidArgument, "map_location must be 'cuda' or 'cuda:N', got '" + loc + "'");
  int d = -1;
  auto [p, ec] = std::from_chars(loc.data() + 5, loc.data() + loc.size(), d);
  if (ec != std::errc() || p != loc.data() + loc.size() || d < 0)
    return make_error(ErrorCode::kInvalidArgument, "bad device index in '" + loc + "'");
  return d;
}

}  // namespace

namespace detail {

Result<int> engine_device(const DeviceLoadOptions& options, TransferEngine* engine) {
  SAFECKPT_TRY(int device, parse_device(options.map_location));
  if (engine != nullptr && engine->options().device != device)
    return make_error(ErrorCode::kInvalidArgument,
                      "map_location '" + options.map_location + "' is device " + std::to_string(device) +
                          " but the engine was created for device " + std::to_string(engine->options().device));
  return device;
}

std::vector<StorageSource> storage_sources(const Checkpoint& host, bool verify_crc) {
  const auto& storages = host.storages();
  std::vector<StorageSource> sources(storages.size());
  Bytes file = host.file().bytes();
  const bool have_fd = host.file().fd() >= 0;
  for (std::size_t i = 0; i < storages.size(); ++i) {
    const StorageInfo& s = storages[i];
    StorageSource& src = sources[i];
    src.nbytes = s.nbytes;
    bool in_file = have_fd && s.file_offset != Location::kNoOffset && s.file_offset <= file.size() &&
                   s.nbytes <= file.size() - s.file_offset;
    if (in_file) {
      // Stored record (or legacy raw storage): read straight from the file;
      // big-endian files are swapped on the device.
      src.file_offset = s.file_offset;
      src.swap_unit = s.swap_unit;
      src.expected_crc32 = verify_crc ? s.crc32 : 0;
    } else {
      // Inflated record, bytes decoded from the pickle, a shard of a sharded
      // index, or a checkpoint over a buffer: little-endian in host memory.
      src.host_bytes = s.bytes.data();
      src.swap_unit = 1;
    }
  }
  return sources;
}

std::optional<Result<TransferEngine>> one_shot_engine(const DeviceLoadOptions& options, TransferEngine* engine,
                                                      int device) {
  std::optional<Result<TransferEngine>> own;
  if (engine == nullptr) {
    TransferOptions to = options.transfer;
    to.device = device;
    own.emplace(TransferEngine::create(to));
  }
  return own;
}

}  // namespace detail

namespace {

using detail::engine_device;
using detail::one_shot_engine;

// The upload half: every storage from host.file() (its descriptor, never its
// path) or from host memory, through `engine`, or through `own` when null.
Result<DeviceCheckpoint> upload(Checkpoint host, const DeviceLoadOptions& options, TransferEngine* engine,
                                std::optional<Result<TransferEngine>>& own, LoadStats* stats) {
  const bool verify_crc = engine != nullptr ? engine->options().verify_crc : options.transfer.verify_crc;
  const std::vector<StorageSource> sources = detail::storage_sources(host, verify_crc);
  if (engine == nullptr) {
    if (!*own) return unexpected(std::move(*own).error());
    engine = &own->value();
  }
  Result<DeviceArena> arena = engine->load(host.file(), sources, stats);
  if (!arena) {
    Error e = std::move(arena).error();
    if (!host.file().path().empty()) e.at_record(host.file().path().string());
    return unexpected(std::move(e));
  }
  return detail::DeviceCheckpointMaker::make(std::make_shared<Checkpoint>(std::move(host)),
                                             std::make_shared<DeviceArena>(std::move(arena).value()));
}

}  // namespace

Result<DeviceCheckpoint> load_to_device(const std::filesystem::path& path, const DeviceLoadOptions& options,
                                        TransferEngine* engine, LoadStats* stats) {
  SAFECKPT_TRY(int device, engine_device(options, engine));
  // Without a caller's engine, make one before parsing: it starts pinning its
  // staging ring in the background, overlapping the host parse. An error
  // creating it is reported only if the file itself loads.
  std::optional<Result<TransferEngine>> own = one_shot_engine(options, engine, device);
  LoadOptions lo = options.load;
  lo.verify_storage_crc = false;  // checked on the reader threads instead (no second pass)
  // One open for the whole load: safeckpt::open maps the file, dispatches
  // by content (zip, legacy, pickle, safetensors, sharded index) and the
  // Checkpoint keeps that descriptor, which the engine then reads.
  SAFECKPT_TRY(Checkpoint host, safeckpt::open(path, lo));
  return upload(std::move(host), options, engine, own, stats);
}

Result<DeviceCheckpoint> load_to_device(Checkpoint host, const DeviceLoadOptions& options, TransferEngine* engine,
                                        LoadStats* stats) {
  SAFECKPT_TRY(int device, engine_device(options, engine));
  std::optional<Result<TransferEngine>> own = one_shot_engine(options, engine, device);
  return upload(std::move(host), options, engine, own, stats);
}

Result<TensorView> DeviceCheckpoint::view(std::uint32_t index) const {
  const auto& ts = host_->tensors();
  if (index >= ts.size()) return make_error(ErrorCode::kInvalidArgument, "tensor index out of range");
  const TensorInfo& t = ts[index];
  if (t.layout != Layout::kStrided || t.storage == kNoStorage || t.is_meta)
    return make_error(ErrorCode::kInvalidArgument,
                      "tensor " + std::to_string(index) + " is not a strided tensor with a storage");
  TensorView v = arena_view(*arena_, t.storage);
  v.dtype = t.dtype;
  v.shape = t.shape;
  v.strides = t.stride;
  v.storage_offset = t.storage_offset;
  return v;
}

std::vector<DeviceTensor> DeviceCheckpoint::tensors() const {
  std::vector<DeviceTensor> out;
  for (const auto& n : host_->state_dict()) {
    const TensorInfo& t = host_->tensors()[n.tensor];
    if (t.layout != Layout::kStrided || t.storage == kNoStorage || t.is_meta || t.qscheme != QScheme::kNone) continue;
    DeviceTensor d;
    d.name = n.name;
    d.tensor = n.tensor;
    d.dtype = t.dtype;
    d.shape = t.shape;
    d.stride = t.stride;
    d.nbytes = t.numel() * dtype_size(t.dtype);
    d.device = arena_->device();
    auto* base = static_cast<std::uint8_t*>(arena_->storage_data(t.storage));
    d.data = d.nbytes == 0 || base == nullptr
                 ? nullptr
                 : base + static_cast<std::uint64_t>(t.storage_offset) * dtype_size(t.dtype);
    out.push_back(std::move(d));
  }
  return out;
}

Result<DLManagedTensorVersioned*> DeviceCheckpoint::to_dlpack(std::uint32_t index, bool read_only) const {
  SAFECKPT_TRY(TensorView v, view(index));
  return to_dlpack_versioned(v, arena_, read_only);
}

Result<DLManagedTensor*> DeviceCheckpoint::to_dlpack_legacy(std::uint32_t index) const {
  SAFECKPT_TRY(TensorView v, view(index));
  return safeckpt::cuda::to_dlpack_legacy(v, arena_);
}

// ---- DCP plans on the device (safeckpt/device_checkpoint.hpp) ----

struct detail::DcpDeviceMaker {
  static auto& tensors(DcpDeviceCheckpoint& d) { return d.tensors_; }
  static auto& arenas(DcpDeviceCheckpoint& d) { return d.arenas_; }
  static auto& where(DcpDeviceCheckpoint& d) { return d.where_; }
  static void set(DcpDeviceCheckpoint& d, int device, std::uint64_t direct, std::uint64_t host) {
    d.device_ = device;
    d.direct_bytes_ = direct;
    d.host_bytes_ = host;
  }
};

namespace {

// A box that can go straight from the file: it equals one chunk whose
// payload holds a row-major tensor over a stored, little-endian record.
struct DirectRange {
  std::uint32_t file = 0;
  std::uint64_t file_offset = 0, nbytes = 0;
  std::uint32_t crc32 = 0;  // of the whole record; 0 when the tensor covers only part of it
};

Result<std::optional<DirectRange>> direct_range(const DcpCheckpoint& ckpt, const DcpTensor& t, const DcpBox& box) {
  const DcpChunk* match = nullptr;
  for (const DcpChunk& c : t.chunks)
    if (c.offsets == box.offsets && c.sizes == box.sizes) match = &c;
  if (match == nullptr) return std::optional<DirectRange>{};
  const MappedFile* f = ckpt.data_file(match->file);
  if (f == nullptr || f->fd() < 0) return std::optional<DirectRange>{};
  SAFECKPT_TRY(Checkpoint ck, ckpt.load_chunk(t, *match));  // checks dtype and shape
  const TensorInfo& ti = ck.tensors()[static_cast<std::size_t>(ck.values()[ck.root()].i)];
  const StorageInfo& s = ck.storages()[ti.storage];
  std::int64_t expect = 1;
  for (std::size_t d = ti.shape.size(); d-- > 0;) {
    if (ti.shape[d] != 1 && ti.stride[d] != expect) return std::optional<DirectRange>{};
    expect *= ti.shape[d];
  }
  if (s.file_offset == Location::kNoOffset || s.swap_unit != 1) return std::optional<DirectRange>{};
  const std::uint64_t es = dtype_size(ti.dtype);
  const std::uint64_t nbytes = ti.numel() * es;
  const std::uint64_t skip = static_cast<std::uint64_t>(ti.storage_offset) * es;
  // The record's bytes are a view into the mapped data file: their position
  // there is the file offset (load_bytes ran on a subspan of that mapping).
  const Bytes all = f->bytes();
  if (s.bytes.data() < all.data() || s.bytes.data() > all.data() + all.size() || skip > s.bytes.size() ||
      nbytes > s.bytes.size() - skip)
    return std::optional<DirectRange>{};
  DirectRange r;
  r.file = match->file;
  r.file_offset = static_cast<std::uint64_t>(s.bytes.data() - all.data()) + skip;
  r.nbytes = nbytes;
  r.crc32 = skip == 0 && nbytes == s.bytes.size() ? s.crc32 : 0;
  if (r.file_offset > all.size() || r.nbytes > all.size() - r.file_offset) return std::optional<DirectRange>{};
  return std::optional<DirectRange>{r};
}

// One saved chunk of a box that is tiled by several: read straight from the
// file (a DirectRange of its own), then copied into the box on the device.
// The chunk equals the box in every dimension but (at most) `d`, so it is a
// [height, width] block of the box seen as [outer, B[d] * inner] rows:
// height = prod(B[:d]), width = S[d] * inner * es, at column
// (O[d] - box.offset[d]) * inner * es of rows dpitch = B[d] * inner * es.
struct Piece {
  std::size_t tensor = 0;  // index in the result
  DirectRange range;
  std::uint64_t dst_offset = 0, width = 0, dpitch = 0, height = 0;
};

// The pieces of `box` when every chunk that meets it lies inside it, differs
// from it in one dimension at most, and can be read directly; nullopt otherwise.
Result<std::optional<std::vector<Piece>>> box_pieces(const DcpCheckpoint& ckpt, const DcpTensor& t, const DcpBox& box,
                                                     std::size_t tensor) {
  using None = std::optional<std::vector<Piece>>;
  const std::size_t nd = box.sizes.size();
  const std::uint64_t es = dtype_size(t.dtype);
  std::vector<Piece> out;
  std::uint64_t covered = 0, want = 1;
  for (auto s : box.sizes) want *= static_cast<std::uint64_t>(s);
  for (const DcpChunk& c : t.chunks) {
    bool meets = true, inside = true;
    std::uint64_t n = 1;
    for (std::size_t i = 0; i < nd; ++i) {
      const std::int64_t lo = std::max(c.offsets[i], box.offsets[i]);
      const std::int64_t hi = std::min(c.offsets[i] + c.sizes[i], box.offsets[i] + box.sizes[i]);
      meets = meets && lo < hi;
      inside = inside && c.offsets[i] >= box.offsets[i] && c.offsets[i] + c.sizes[i] <= box.offsets[i] + box.sizes[i];
      n *= static_cast<std::uint64_t>(c.sizes[i]);
    }
    if (!meets || n == 0) continue;
    if (!inside) return None{};
    std::size_t d = nd;
    for (std::size_t i = 0; i < nd; ++i)
      if (c.sizes[i] != box.sizes[i]) {
        if (d != nd) return None{};  // differs in two dimensions
        d = i;
      }
    if (d == nd) return None{};  // equals the box: direct_range's case
    SAFECKPT_TRY(std::optional<DirectRange> r, direct_range(ckpt, t, DcpBox{c.offsets, c.sizes}));
    if (!r) return None{};
    std::uint64_t outer = 1, inner = 1;
    for (std::size_t i = 0; i < d; ++i) outer *= static_cast<std::uint64_t>(box.sizes[i]);
    for (std::size_t i = d + 1; i < nd; ++i) inner *= static_cast<std::uint64_t>(box.sizes[i]);
    Piece p;
    p.tensor = tensor;
    p.range = *r;
    p.height = outer;
    p.width = static_cast<std::uint64_t>(c.sizes[d]) * inner * es;
    p.dpitch = static_cast<std::uint64_t>(box.sizes[d]) * inner * es;
    p.dst_offset = static_cast<std::uint64_t>(c.offsets[d] - box.offsets[d]) * inner * es;
    covered += n;
    out.push_back(p);
  }
  if (covered != want || out.empty()) return None{};
  return std::optional<std::vector<Piece>>{std::move(out)};
}

void add_stats(LoadStats& total, const LoadStats& one, bool first) {
  if (first)
    total = one;
  else {
    total.bytes += one.bytes;
    total.arena_bytes += one.arena_bytes;
    total.chunks += one.chunks;
  }
}

}  // namespace

const DcpDeviceTensor* DcpDeviceCheckpoint::find(std::string_view fqn) const noexcept {
  for (const auto& t : tensors_)
    if (t.fqn == fqn) return &t;
  return nullptr;
}

Status DcpDeviceCheckpoint::copy_to_host(std::size_t i, std::span<std::uint8_t> out) const {
  if (i >= tensors_.size() || out.size() != tensors_[i].nbytes)
    return make_error(ErrorCode::kInvalidArgument, "DcpDeviceCheckpoint::copy_to_host: bad index or size");
  if (out.empty()) return {};
  const auto [a, st] = where_[i];
  return arenas_[a]->copy_to_host(st, out);
}

Result<DLManagedTensorVersioned*> DcpDeviceCheckpoint::to_dlpack(std::size_t i, bool read_only) const {
  if (i >= tensors_.size()) return make_error(ErrorCode::kInvalidArgument, "DcpDeviceCheckpoint: index out of range");
  const DcpDeviceTensor& t = tensors_[i];
  std::vector<std::int64_t> strides(t.box.sizes.size(), 1);
  for (std::size_t d = strides.size(); d-- > 1;)
    strides[d - 1] = strides[d] * std::max<std::int64_t>(t.box.sizes[d], 1);
  TensorView v;
  std::shared_ptr<const void> owner;
  const auto [a, st] = where_[i];
  if (a < arenas_.size()) {
    v = arena_view(*arenas_[a], st);
    owner = arenas_[a];
  } else {
    v.device = device_;
    owner = std::make_shared<int>(0);  // nothing to keep alive: no elements
  }
  v.dtype = t.dtype;
  v.shape = t.box.sizes;
  v.strides = strides;
  return to_dlpack_versioned(v, std::move(owner), read_only);
}

Result<DcpDeviceCheckpoint> load_dcp_to_device(const DcpCheckpoint& ckpt, const DcpPlan& plan,
                                               const DeviceLoadOptions& options, TransferEngine* engine,
                                               LoadStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  SAFECKPT_TRY(int device, engine_device(options, engine));
  if (!ckpt.tensors().empty() && ckpt.data_file(0) == nullptr)
    return make_error(ErrorCode::kInvalidArgument,
                      "load_dcp_to_device: the DCP data files are not opened "
                      "(DcpCheckpoint::parse_metadata)");
  std::optional<Result<TransferEngine>> own = one_shot_engine(options, engine, device);
  const bool verify_crc = engine != nullptr ? engine->options().verify_crc : options.transfer.verify_crc;

  DcpDeviceCheckpoint out;
  std::vector<DcpDeviceTensor>* tensors = &detail::DcpDeviceMaker::tensors(out);
  auto& arenas = detail::DcpDeviceMaker::arenas(out);
  auto& where = detail::DcpDeviceMaker::where(out);
  constexpr std::uint32_t kNone = ~0u;

  // Plan: direct ranges per file, host boxes in batches.
  std::map<std::string, bool> seen;
  std::vector<std::pair<std::size_t, DirectRange>> direct;  // boxes equal to one chunk
  std::vector<std::size_t> host_boxes;
  std::vector<std::size_t> gathered;  // boxes tiled by several direct chunks (pieces), placed on the device
  std::vector<Piece> pieces;
  std::uint64_t direct_bytes = 0, host_bytes = 0;
  for (const DcpPlanItem& item : plan.items) {
    if (!seen.emplace(item.fqn, true).second)
      return make_error(ErrorCode::kInvalidArgument, "load_dcp_to_device: '" + item.fqn + "' twice in the plan");
    const DcpTensor* t = ckpt.find_tensor(item.fqn);
    if (t == nullptr)
      return make_error(ErrorCode::kInvalidArgument, "load_dcp_to_device: no tensor '" + item.fqn + "'");
    if (item.box.offsets.size() != t->shape.size() || item.box.sizes.size() != t->shape.size())
      return make_error(ErrorCode::kInvalidArgument,
                        "load_dcp_to_device: box for '" + item.fqn + "' has the wrong number of dims");
    std::uint64_t n = 1;
    for (std::size_t d = 0; d < t->shape.size(); ++d) {
      if (item.box.offsets[d] < 0 || item.box.sizes[d] < 0 || item.box.offsets[d] > t->shape[d] ||
          item.box.sizes[d] > t->shape[d] - item.box.offsets[d])
        return make_error(ErrorCode::kInvalidArgument,
                          "load_dcp_to_device: box of '" + item.fqn + "' lies outside the tensor");
      n *= static_cast<std::uint64_t>(item.box.sizes[d]);  // <= numel of the checked global shape
    }
    const std::uint64_t bytes = n * dtype_size(t->dtype);
    if (bytes > ckpt.options().dcp.max_box_bytes)
      return make_error(ErrorCode::kLimitExceeded,
                        "load_dcp_to_device: box of '" + item.fqn + "' larger than max_box_bytes");
    DcpDeviceTensor dt;
    dt.fqn = item.fqn;
    dt.dtype = t->dtype;
    dt.box = item.box;
    dt.global_shape = t->shape;
    dt.nbytes = bytes;
    dt.device = device;
    const std::size_t index = tensors->size();
    where.emplace_back(kNone, 0);
    if (bytes > 0) {
      SAFECKPT_TRY(std::optional<DirectRange> r, direct_range(ckpt, *t, item.box));
      std::optional<std::vector<Piece>> ps;
      if (!r) {
        SAFECKPT_TRY(ps, box_pieces(ckpt, *t, item.box, index));
      }
      if (r) {
        direct.emplace_back(index, *r);
        dt.direct = true;
        direct_bytes += bytes;
      } else if (ps) {
        gathered.push_back(index);
        for (auto& p : *ps) pieces.push_back(p);
        dt.direct = true;
        direct_bytes += bytes;
      } else {
        host_boxes.push_back(index);
        host_bytes += bytes;
      }
    }
    tensors->push_back(std::move(dt));
  }
  if (engine == nullptr) {
    if (!*own) return unexpected(std::move(*own).error());
    engine = &own->value();
  }
  LoadStats total;
  bool first = true;
  const auto run = [&](const MappedFile* file, const std::vector<std::pair<std::size_t, StorageSource>>& group,
                       const std::string& what) -> Status {
    std::vector<StorageSource> sources;
    sources.reserve(group.size());
    for (const auto& g : group) sources.push_back(g.second);
    LoadStats one;
    Result<DeviceArena> arena =
        file != nullptr ? engine->load(*file, sources, &one) : engine->load(std::filesystem::path(), sources, &one);
    if (!arena) {
      Error e = std::move(arena).error();
      e.at_record(what);
      return unexpected(std::move(e));
    }
    add_stats(total, one, first);
    first = false;
    const auto a = static_cast<std::uint32_t>(arenas.size());
    arenas.push_back(std::make_shared<DeviceArena>(std::move(arena).value()));
    for (std::size_t k = 0; k < group.size(); ++k) where[group[k].first] = {a, static_cast<std::uint32_t>(k)};
    return {};
  };
  // DIRECT and PLACED boxes: one arena for all of them and ONE engine load
  // over every data file (load_into: the pipeline fills and drains once, not
  // per file), each range written at its place: a direct box's whole range,
  // a piece that is a contiguous run of its box (height 1: Shard(0)) at its
  // offset. Pieces of several rows (Shard(d), d > 0) go per file through a
  // temporary arena and cudaMemcpy2D (device to device), freed before the
  // next file's, so the extra device memory is one file's such pieces at most.
  if (!direct.empty() || !gathered.empty()) {
    std::vector<std::uint64_t> sizes;
    std::map<std::size_t, std::uint32_t> slot;
    for (const auto& [index, r] : direct) {
      slot[index] = static_cast<std::uint32_t>(sizes.size());
      sizes.push_back((*tensors)[index].nbytes);
    }
    for (std::size_t g : gathered) {
      slot[g] = static_cast<std::uint32_t>(sizes.size());
      sizes.push_back((*tensors)[g].nbytes);
    }
    SAFECKPT_TRY(DeviceArena dst, DeviceArena::allocate(device, sizes));
    const auto a = static_cast<std::uint32_t>(arenas.size());
    arenas.push_back(std::make_shared<DeviceArena>(std::move(dst)));
    const DeviceArena& arena = *arenas[a];
    for (const auto& [index, s] : slot) where[index] = {a, s};
    const auto at = [&](std::size_t index) {
      return static_cast<std::uint64_t>(static_cast<std::uint8_t*>(arena.storage_data(slot[index])) -
                                        static_cast<std::uint8_t*>(arena.base()));
    };
    const auto source = [&](const DirectRange& r) {
      StorageSource src;
      src.file_offset = r.file_offset;
      src.nbytes = r.nbytes;
      src.expected_crc32 = verify_crc ? r.crc32 : 0;
      return src;
    };
    std::vector<PlacedSource> placed;
    placed.reserve(direct.size() + pieces.size());
    for (const auto& [index, r] : direct) placed.push_back(PlacedSource{source(r), r.file, at(index)});
    for (const Piece& p : pieces)
      if (p.height == 1) placed.push_back(PlacedSource{source(p.range), p.range.file, at(p.tensor) + p.dst_offset});
    // File by file, in file order: each file is read front to back.
    std::stable_sort(placed.begin(), placed.end(), [](const PlacedSource& x, const PlacedSource& y) {
      return x.file != y.file ? x.file < y.file : x.source.file_offset < y.source.file_offset;
    });
    if (!placed.empty()) {
      std::vector<const MappedFile*> files;
      for (std::uint32_t f = 0; f < ckpt.files().size(); ++f) files.push_back(ckpt.data_file(f));
      LoadStats one;
      SAFECKPT_CHECK(engine->load_into(files, placed, arena.base(), arena.size_bytes(), &one));
      add_stats(total, one, first);
      first = false;
    }
    for (std::uint32_t f = 0; f < ckpt.files().size(); ++f) {
      std::vector<StorageSource> sources;
      std::vector<const Piece*> mine;
      for (const Piece& p : pieces)
        if (p.range.file == f && p.height > 1) {
          sources.push_back(source(p.range));
          mine.push_back(&p);
        }
      if (sources.empty()) continue;
      LoadStats one;
      Result<DeviceArena> tmp = engine->load(*ckpt.data_file(f), sources, &one);
      if (!tmp) {
        Error e = std::move(tmp).error();
        e.at_record(ckpt.files()[f].name);
        return unexpected(std::move(e));
      }
      add_stats(total, one, first);
      first = false;
      detail::DeviceGuard guard;
      if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
        return make_error(ErrorCode::kDevice, std::string("cudaSetDevice: ") + cudaGetErrorString(e));
      for (std::size_t k = 0; k < mine.size(); ++k) {
        const Piece& p = *mine[k];
        auto* to = static_cast<std::uint8_t*>(arena.storage_data(slot[p.tensor])) + p.dst_offset;
        const cudaError_t e =
            cudaMemcpy2D(to, p.dpitch, tmp->storage_data(k), p.width, p.width, p.height, cudaMemcpyDeviceToDevice);
        if (e != cudaSuccess)
          return make_error(ErrorCode::kDevice,
                            std::string("copying a DCP chunk into its box: ") + cudaGetErrorString(e));
      }
    }
  }
  // Host boxes, one batch of at most kDcpHostBatchBytes at a time.
  for (std::size_t k = 0; k < host_boxes.size();) {
    std::vector<std::vector<std::uint8_t>> buffers;
    std::vector<std::pair<std::size_t, StorageSource>> group;
    std::uint64_t batch = 0;
    while (k < host_boxes.size() && (group.empty() || batch + (*tensors)[host_boxes[k]].nbytes <= kDcpHostBatchBytes)) {
      const std::size_t index = host_boxes[k++];
      const DcpDeviceTensor& dt = (*tensors)[index];
      const DcpTensor* t = ckpt.find_tensor(dt.fqn);
      buffers.emplace_back(dt.nbytes);
      SAFECKPT_CHECK(load_dcp_box(ckpt, *t, dt.box, buffers.back().data(), dt.nbytes));
      StorageSource src;
      src.nbytes = dt.nbytes;
      src.host_bytes = buffers.back().data();
      group.emplace_back(index, src);
      batch += dt.nbytes;
    }
    SAFECKPT_CHECK(run(nullptr, group, "DCP boxes assembled on the host"));
  }
  for (std::size_t i = 0; i < tensors->size(); ++i) {
    const auto [a, st] = where[i];
    if (a != kNone) (*tensors)[i].data = arenas[a]->storage_data(st);
  }
  detail::DcpDeviceMaker::set(out, device, direct_bytes, host_bytes);
  if (stats != nullptr) {
    *stats = total;
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  return out;
}

Result<DcpDeviceCheckpoint> load_dcp_to_device(const std::filesystem::path& dir, const DcpPlan& plan,
                                               const DcpOptions& dcp_options, const DeviceLoadOptions& options,
                                               TransferEngine* engine, LoadStats* stats) {
  SAFECKPT_TRY(DcpCheckpoint ckpt, DcpCheckpoint::open(dir, dcp_options));
  return load_dcp_to_device(ckpt, plan, options, engine, stats);
}

}  // namespace safeckpt::cuda
