// DCP directories: layout checks, chunk reading, resharded loading, consolidation.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "dcp/internal.hpp"
#include "safeckpt/builder.hpp"
#include "safeckpt/safetensors.hpp"
#include "safeckpt/save.hpp"
#include "util/bytes.hpp"

namespace safeckpt {

struct DcpAccess {
  static Status assemble(DcpParsed&& p, DcpCheckpoint& c);
  static Status check_ranges(DcpCheckpoint& c);
  static std::vector<DcpFile>& files(DcpCheckpoint& c) { return c.files_; }
  static std::vector<std::unique_ptr<MappedFile>>& mapped(DcpCheckpoint& c) { return c.mapped_; }
  static DcpOptions& options(DcpCheckpoint& c) { return c.options_; }
  static const std::vector<std::unique_ptr<MappedFile>>& mapped(const DcpCheckpoint& c) { return c.mapped_; }
};

namespace {

Unexpected malformed(std::string msg) {
  return make_error(ErrorCode::kMalformed, "DCP: " + std::move(msg));
}

std::string dims_text(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// numel of a shape with overflow check; false on overflow.
bool numel_of(const std::vector<std::int64_t>& shape, std::uint64_t& n) {
  n = 1;
  for (auto d : shape)
    if (!util::checked_mul(n, static_cast<std::uint64_t>(d), n)) return false;
  return true;
}

std::string storage_key(const std::string& fqn, bool has_offset, const std::vector<std::int64_t>& off) {
  std::string k = fqn;
  k.push_back('\0');
  k.push_back(has_offset ? 'T' : 'B');
  for (auto o : off) k += std::to_string(o) + ",";
  return k;
}

// A plain file name inside the directory (filesystem.py joins it to the path).
bool plain_name(const std::string& n) {
  return !n.empty() && n != "." && n != ".." && n != ".metadata" && n.find('/') == std::string::npos &&
         n.find('\0') == std::string::npos && n.size() <= 255;
}

// Chunks inside the tensor, non-empty ones pairwise disjoint and covering it.
// Exact and bounded: the distinct chunk boundaries of each dimension cut the
// tensor into a grid; every non-empty chunk is a block of grid cells, and the
// chunks tile the tensor exactly when every cell is marked once. `cells_left`
// caps the cells marked over the whole checkpoint (a DTensor layout has one
// cell per chunk; a hostile one cannot make this quadratic).
Status check_tiling(const DcpTensor& t, std::uint64_t& cells_left) {
  const std::size_t nd = t.shape.size();
  std::uint64_t total = 0;
  if (!numel_of(t.shape, total)) return malformed("shape of '" + t.fqn + "' overflows");
  std::uint64_t sum = 0;
  std::vector<const DcpChunk*> nonempty;
  for (const auto& c : t.chunks) {
    if (c.offsets.size() != nd || c.sizes.size() != nd)
      return malformed("chunk of '" + t.fqn + "' has " + std::to_string(c.sizes.size()) + " dims, tensor has " +
                       std::to_string(nd));
    for (std::size_t d = 0; d < nd; ++d)
      if (c.offsets[d] > t.shape[d] || c.sizes[d] > t.shape[d] - c.offsets[d])
        return malformed("chunk at " + dims_text(c.offsets) + " size " + dims_text(c.sizes) + " of '" + t.fqn +
                         "' lies outside its shape " + dims_text(t.shape));
    std::uint64_t n = 0;
    if (!numel_of(c.sizes, n) || !util::checked_add(sum, n, sum))
      return malformed("chunk sizes of '" + t.fqn + "' overflow");
    if (n > 0) nonempty.push_back(&c);
  }
  if (nd == 0) {
    if (nonempty.size() > 1) return malformed("chunks at [] and [] of 0-dim tensor '" + t.fqn + "' overlap");
  } else if (!nonempty.empty()) {
    std::vector<std::vector<std::int64_t>> cuts(nd);
    for (const DcpChunk* c : nonempty)
      for (std::size_t d = 0; d < nd; ++d) {
        cuts[d].push_back(c->offsets[d]);
        cuts[d].push_back(c->offsets[d] + c->sizes[d]);
      }
    std::uint64_t cells = 1;
    std::vector<std::uint64_t> stride(nd, 1);
    for (std::size_t d = nd; d-- > 0;) {
      cuts[d].push_back(0);
      cuts[d].push_back(t.shape[d]);
      std::sort(cuts[d].begin(), cuts[d].end());
      cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
      stride[d] = cells;
      if (!util::checked_mul(cells, cuts[d].size() - 1, cells) || cells > cells_left)
        return make_error(ErrorCode::kLimitExceeded,
                          "DCP: the chunk grid of '" + t.fqn + "' is too fine to check (more cells than the cap)");
    }
    cells_left -= cells;
    std::vector<bool> mark(cells, false);
    std::vector<std::size_t> lo(nd), hi(nd), idx(nd);
    for (const DcpChunk* c : nonempty) {
      for (std::size_t d = 0; d < nd; ++d) {
        lo[d] =
            static_cast<std::size_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), c->offsets[d]) - cuts[d].begin());
        hi[d] = static_cast<std::size_t>(std::lower_bound(cuts[d].begin(), cuts[d].end(), c->offsets[d] + c->sizes[d]) -
                                         cuts[d].begin());
        idx[d] = lo[d];
      }
      while (true) {
        std::uint64_t cell = 0;
        for (std::size_t d = 0; d < nd; ++d) cell += idx[d] * stride[d];
        if (mark[cell])
          return malformed("chunk at " + dims_text(c->offsets) + " of '" + t.fqn + "' overlaps another chunk");
        mark[cell] = true;
        std::size_t d = nd;
        while (d > 0 && ++idx[d - 1] == hi[d - 1]) {
          idx[d - 1] = lo[d - 1];
          --d;
        }
        if (d == 0) break;
      }
    }
    if (std::find(mark.begin(), mark.end(), false) != mark.end() || sum != total)
      return malformed("chunks of '" + t.fqn + "' cover " + std::to_string(sum) + " of its " + std::to_string(total) +
                       " elements (a gap)");
    return {};
  }
  if (sum != total)
    return malformed("chunks of '" + t.fqn + "' cover " + std::to_string(sum) + " of its " + std::to_string(total) +
                     " elements (a gap)");
  return {};
}

int open_in_dir(int dirfd, const std::string& name) {
  return ::openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
}

Result<MappedFile> map_in_dir(int dirfd, const std::filesystem::path& dir, const std::string& name,
                              const std::string& why) {
  int fd = open_in_dir(dirfd, name);
  if (fd < 0) {
    const int e = errno;
    if (e == ELOOP) return make_error(ErrorCode::kMalformed, "DCP: " + name + " (" + why + ") is a symlink; refused");
    return make_error(ErrorCode::kIo,
                      "DCP: cannot open " + (dir / name).string() + " (" + why + "): " + std::strerror(e));
  }
  return MappedFile::adopt(fd, dir / name);
}

}  // namespace

DcpCheckpoint::DcpCheckpoint() = default;
DcpCheckpoint::~DcpCheckpoint() = default;
DcpCheckpoint::DcpCheckpoint(DcpCheckpoint&&) noexcept = default;
DcpCheckpoint& DcpCheckpoint::operator=(DcpCheckpoint&&) noexcept = default;

namespace {

// No two non-empty byte ranges of one file overlap (dcp.hpp): a range read
// by several chunks would multiply what a consumer assembles from the bytes
// the directory stores.
Status check_disjoint(const DcpParsed& p, const std::vector<DcpFile>& files) {
  struct Range {
    std::uint32_t file;
    std::uint64_t offset, length;
    const std::string* fqn;
  };
  std::vector<Range> ranges;
  for (const auto& t : p.tensors)
    for (const auto& ch : t.chunks)
      if (ch.length > 0) ranges.push_back({ch.file, ch.offset, ch.length, &t.fqn});
  for (const auto& b : p.bytes_items)
    if (b.length > 0) ranges.push_back({b.file, b.offset, b.length, &b.fqn});
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.file != b.file ? a.file < b.file : a.offset < b.offset; });
  for (std::size_t i = 1; i < ranges.size(); ++i) {
    const Range& a = ranges[i - 1];
    const Range& b = ranges[i];
    // a.offset <= b.offset; they overlap when b starts before a ends.
    if (a.file == b.file && b.offset - a.offset < a.length)
      return malformed("'" + *b.fqn + "' and '" + *a.fqn + "' are stored in overlapping bytes of " +
                       files[a.file].name + " ([" + std::to_string(b.offset) + ", +" + std::to_string(b.length) +
                       ") and [" + std::to_string(a.offset) + ", +" + std::to_string(a.length) +
                       ")); PyTorch writes every item once, in a range of its own");
  }
  return {};
}

}  // namespace

bool is_dcp_directory(const std::filesystem::path& path) noexcept {
  struct stat d {
  }, m{};
  return ::stat(path.c_str(), &d) == 0 && S_ISDIR(d.st_mode) && ::stat((path / ".metadata").c_str(), &m) == 0 &&
         S_ISREG(m.st_mode);
}

Status DcpAccess::assemble(DcpParsed&& p, DcpCheckpoint& c) {
  const DcpOptions& o = c.options_;
  std::map<std::string, std::size_t> index;  // storage key -> entry
  for (std::size_t i = 0; i < p.storage.size(); ++i) {
    const auto& e = p.storage[i];
    if (!index.emplace(storage_key(e.fqn, e.has_offset, e.offsets), i).second)
      return malformed("two storage entries for '" + e.fqn + "' at " + dims_text(e.offsets));
  }
  std::vector<bool> used(p.storage.size(), false);
  std::map<std::string, std::uint32_t> file_of;
  auto file_index = [&](const DcpStorageEntry& e) -> Result<std::uint32_t> {
    if (!plain_name(e.relative_path))
      return malformed("'" + e.fqn + "' is stored in '" + e.relative_path +
                       "', not a plain file name inside the directory");
    auto it = file_of.find(e.relative_path);
    if (it != file_of.end()) return it->second;
    if (c.files_.size() >= o.dcp.max_files)
      return make_error(ErrorCode::kLimitExceeded, "DCP: more data files than max_files");
    const auto idx = static_cast<std::uint32_t>(c.files_.size());
    c.files_.push_back(DcpFile{e.relative_path, 0});
    file_of.emplace(e.relative_path, idx);
    return idx;
  };
  auto take = [&](const std::string& fqn, bool has_offset, const std::vector<std::int64_t>& off,
                  const std::string& what) -> Result<std::size_t> {
    auto it = index.find(storage_key(fqn, has_offset, off));
    if (it == index.end()) return malformed("no storage entry for " + what + " of '" + fqn + "'");
    if (used[it->second]) return malformed("two " + what + "s of '" + fqn + "' at " + dims_text(off));
    used[it->second] = true;
    return it->second;
  };
  std::uint64_t cells_left = o.dcp.max_grid_cells;
  for (auto& t : p.tensors) {
    if (t.shape.size() > o.dcp.max_ndim) return make_error(ErrorCode::kLimitExceeded, "DCP: too many dims");
    SAFECKPT_CHECK(check_tiling(t, cells_left));
    for (auto& ch : t.chunks) {
      SAFECKPT_TRY(std::size_t e, take(t.fqn, true, ch.offsets, "chunk"));
      SAFECKPT_TRY(ch.file, file_index(p.storage[e]));
      ch.offset = p.storage[e].offset;
      ch.length = p.storage[e].length;
      // A chunk's payload is torch.save of the chunk (an uncompressed zip):
      // never fewer bytes than its elements. Checked here, before anything
      // sizes a buffer from the metadata: a 40 KB directory whose metadata
      // declared a 4 GiB chunk on a 1.5 KB payload made `convert` allocate
      // 4 GiB (2^37 elements: std::bad_alloc, SIGABRT; review 2026-12-06).
      std::uint64_t n = 0, need = 0;
      if (!numel_of(ch.sizes, n) || !util::checked_mul(n, dtype_size(t.dtype), need) || ch.length < need)
        return malformed("chunk at " + dims_text(ch.offsets) + " of '" + t.fqn + "' is stored in " +
                         std::to_string(ch.length) + " bytes, fewer than its " + dims_text(ch.sizes) +
                         " elements need");
    }
  }
  for (auto& b : p.bytes_items) {
    SAFECKPT_TRY(std::size_t e, take(b.fqn, false, {}, "byte item"));
    SAFECKPT_TRY(b.file, file_index(p.storage[e]));
    b.offset = p.storage[e].offset;
    b.length = p.storage[e].length;
    if (b.length > o.dcp.max_byte_item_bytes)
      return make_error(ErrorCode::kLimitExceeded, "DCP: byte item '" + b.fqn + "' larger than max_byte_item_bytes");
  }
  for (std::size_t i = 0; i < used.size(); ++i)
    if (!used[i]) return malformed("storage entry for '" + p.storage[i].fqn + "' names no chunk or item");
  SAFECKPT_CHECK(check_disjoint(p, c.files_));
  // Names unique across tensors and byte items (state_dict_metadata is a dict, so they are).
  c.tensors_ = std::move(p.tensors);
  for (std::size_t i = 0; i < c.tensors_.size(); ++i) c.by_fqn_.emplace(c.tensors_[i].fqn, i);
  c.bytes_items_ = std::move(p.bytes_items);
  c.items_ = std::move(p.items);
  c.version_ = std::move(p.version);
  c.checkpoint_id_ = std::move(p.checkpoint_id);
  return {};
}

Status DcpAccess::check_ranges(DcpCheckpoint& c) {
  auto check = [&](const std::string& fqn, std::uint32_t f, std::uint64_t off, std::uint64_t len) -> Status {
    std::uint64_t end = 0;
    if (!util::checked_add(off, len, end) || end > c.files_[f].size)
      return malformed("'" + fqn + "': bytes [" + std::to_string(off) + ", +" + std::to_string(len) +
                       ") lie past the end of " + c.files_[f].name + " (" + std::to_string(c.files_[f].size) +
                       " bytes)");
    return {};
  };
  for (const auto& t : c.tensors_)
    for (const auto& ch : t.chunks) SAFECKPT_CHECK(check(t.fqn, ch.file, ch.offset, ch.length));
  for (const auto& b : c.bytes_items_) SAFECKPT_CHECK(check(b.fqn, b.file, b.offset, b.length));
  // Every byte of a data file belongs to an item (dcp.hpp): FileSystemWriter
  // writes the items back to back and nothing else, and bytes no item names
  // are bytes no reader of the directory examines — a pickle ahead of the
  // chunks ran under torch.load(file) while the directory scanned clean
  // (review 2026-12-06). Ranges are disjoint (assemble), so they tile the
  // file exactly when their lengths add up to its size.
  std::vector<std::uint64_t> named(c.files_.size(), 0);
  for (const auto& t : c.tensors_)
    for (const auto& ch : t.chunks) named[ch.file] += ch.length;
  for (const auto& b : c.bytes_items_) named[b.file] += b.length;
  for (std::size_t f = 0; f < c.files_.size(); ++f)
    if (named[f] != c.files_[f].size)
      return malformed(c.files_[f].name + " holds " + std::to_string(c.files_[f].size) +
                       " bytes, of which the metadata's items cover " + std::to_string(named[f]) +
                       "; PyTorch's writer stores nothing but the items");
  return {};
}

Result<DcpCheckpoint> DcpCheckpoint::parse_metadata(Bytes metadata, const DcpOptions& options) {
  DcpCheckpoint c;
  c.options_ = options;
  DcpParsed p;
  SAFECKPT_CHECK(parse_dcp_metadata(metadata, options, p));
  SAFECKPT_CHECK(DcpAccess::assemble(std::move(p), c));
  return c;
}

Result<DcpCheckpoint> DcpCheckpoint::open(const std::filesystem::path& dir, const DcpOptions& options) {
  std::optional<MappedFile> md;
  return open(dir, options, md);
}

Result<DcpCheckpoint> DcpCheckpoint::open(const std::filesystem::path& dir, const DcpOptions& options,
                                          std::optional<MappedFile>& metadata) {
  metadata.reset();
  int dirfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dirfd < 0)
    return make_error(ErrorCode::kIo, "DCP: cannot open directory " + dir.string() + ": " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{dirfd};
  SAFECKPT_TRY(MappedFile md, map_in_dir(dirfd, dir, ".metadata", "the DCP metadata"));
  const MappedFile& kept = metadata.emplace(std::move(md));
  DcpCheckpoint c;
  c.options_ = options;
  DcpParsed p;
  Status st = parse_dcp_metadata(kept.bytes(), options, p);
  if (!st) return unexpected(std::move(st).error().at_record((dir / ".metadata").string()));
  SAFECKPT_CHECK(DcpAccess::assemble(std::move(p), c));
  // One item stored in each file, for the messages.
  std::vector<std::string> holder(c.files_.size());
  for (const auto& t : c.tensors_)
    for (const auto& ch : t.chunks)
      if (holder[ch.file].empty()) holder[ch.file] = t.fqn;
  for (const auto& b : c.bytes_items_)
    if (holder[b.file].empty()) holder[b.file] = b.fqn;
  for (std::size_t i = 0; i < c.files_.size(); ++i) {
    auto& f = c.files_[i];
    auto m = map_in_dir(dirfd, dir, f.name, "the shard file holding '" + holder[i] + "'");
    if (!m) return unexpected(std::move(m).error());
    f.size = m->size();
    c.mapped_.push_back(std::make_unique<MappedFile>(std::move(*m)));
  }
  SAFECKPT_CHECK(DcpAccess::check_ranges(c));
  return c;
}

const DcpTensor* DcpCheckpoint::find_tensor(std::string_view fqn) const {
  auto it = by_fqn_.find(fqn);
  return it == by_fqn_.end() ? nullptr : &tensors_[it->second];
}

Result<Checkpoint> DcpCheckpoint::load_chunk(const DcpTensor& t, const DcpChunk& c) const {
  if (c.file >= mapped_.size())
    return make_error(ErrorCode::kInvalidArgument, "DCP: data files not opened (parse_metadata)");
  Bytes all = mapped_[c.file]->bytes();
  if (c.offset > all.size() || c.length > all.size() - c.offset)
    return malformed("chunk of '" + t.fqn + "' lies past the end of " + files_[c.file].name);
  LoadOptions lo;
  lo.limits = options_.limits;
  lo.verify_storage_crc = options_.verify_storage_crc;
  lo.allowlist = options_.allowlist;
  const std::string where = files_[c.file].name + " @" + std::to_string(c.offset) + " (chunk " + dims_text(c.offsets) +
                            " of '" + t.fqn + "')";
  auto ck = load_bytes(all.subspan(c.offset, c.length), lo);
  if (!ck) {
    Error e = std::move(ck).error();
    return make_error(e.code(), "DCP: " + where + ": " + e.to_string());
  }
  const ValueArena& a = ck->values();
  if (ck->root() == kNoNode || a[ck->root()].kind != Kind::kTensor)
    return malformed(where + ": the payload is not one tensor");
  const TensorInfo& ti = ck->tensors()[static_cast<std::size_t>(a[ck->root()].i)];
  if (ti.layout != Layout::kStrided || ti.is_meta || !ti.subclass.empty() || dtype_is_quantized(ti.dtype) ||
      ti.storage == kNoStorage || ti.conj || ti.neg)
    return malformed(where + ": the payload is not a plain strided tensor");
  if (ti.dtype != t.dtype)
    return malformed(where + ": payload dtype " + std::string(dtype_name(ti.dtype)) + ", metadata says " +
                     std::string(dtype_name(t.dtype)));
  if (ti.shape != c.sizes)
    return malformed(where + ": payload shape " + dims_text(ti.shape) + ", chunk sizes " + dims_text(c.sizes));
  return ck;
}

Result<Checkpoint> DcpCheckpoint::load_bytes_item(const DcpBytesItem& item) const {
  if (item.file >= mapped_.size())
    return make_error(ErrorCode::kInvalidArgument, "DCP: data files not opened (parse_metadata)");
  Bytes all = mapped_[item.file]->bytes();
  if (item.offset > all.size() || item.length > all.size() - item.offset)
    return malformed("item '" + item.fqn + "' lies past the end of " + files_[item.file].name);
  LoadOptions lo;
  lo.limits = options_.limits;
  lo.verify_storage_crc = options_.verify_storage_crc;
  lo.allowlist = options_.allowlist;
  auto ck = load_bytes(all.subspan(item.offset, item.length), lo);
  if (!ck) {
    Error e = std::move(ck).error();
    return make_error(e.code(), "DCP: " + files_[item.file].name + " @" + std::to_string(item.offset) + " (item '" +
                                    item.fqn + "'): " + e.to_string());
  }
  return ck;
}

// ---- plans ----

Result<DcpBox> dtensor_box(const std::vector<std::int64_t>& global_shape, const std::vector<std::int64_t>& mesh,
                           const std::vector<std::int64_t>& coord, const std::vector<DcpPlacement>& placements) {
  if (mesh.size() != coord.size() || mesh.size() != placements.size())
    return make_error(ErrorCode::kInvalidArgument, "dtensor_box: mesh, coord and placements differ in length");
  // The loader's rule for DTensors in torch.save files (safeckpt/tensor.hpp
  // compute_dtensor_box): one implementation of torch.chunk's split.
  DTensorInfo d;
  d.global_shape = global_shape;
  d.mesh_shape = mesh;
  d.coordinate = coord;
  for (std::size_t m = 0; m < mesh.size(); ++m) {
    if (mesh[m] <= 0) return make_error(ErrorCode::kInvalidArgument, "dtensor_box: coordinate outside the mesh");
    DTensorPlacement p;
    if (placements[m].shard_dim >= 0) {
      p.kind = DTensorPlacement::Kind::kShard;
      p.dim = placements[m].shard_dim;
    }
    d.placements.push_back(p);
  }
  if (auto st = compute_dtensor_box(d); !st)
    return make_error(ErrorCode::kInvalidArgument, "dtensor_box: " + st.error().message());
  return DcpBox{std::move(d.global_offset), std::move(d.local_shape)};
}

DcpPlan DcpPlan::full(const DcpCheckpoint& ckpt) {
  DcpPlan p;
  for (const auto& t : ckpt.tensors())
    p.items.push_back({t.fqn, DcpBox{std::vector<std::int64_t>(t.shape.size(), 0), t.shape}});
  return p;
}

DcpPlan DcpPlan::uniform(const DcpCheckpoint& ckpt, DcpPlacement pl, std::int64_t rank, std::int64_t world_size) {
  DcpPlan p;
  for (const auto& t : ckpt.tensors()) {
    DcpPlacement use = pl;
    if (use.shard_dim >= static_cast<int>(t.shape.size())) use.shard_dim = -1;
    auto b = dtensor_box(t.shape, {world_size}, {rank}, {use});
    p.items.push_back({t.fqn, b ? *b : DcpBox{}});
  }
  return p;
}

// ---- loading ----

// Row-major copy of the intersection of `box` and `chunk` from the chunk's
// contiguous bytes `src` into the box's buffer `dst`.
void dcp_copy_intersection(const DcpBox& box, const DcpChunk& chunk, const std::uint8_t* src, std::uint8_t* dst,
                           std::uint32_t es) {
  const std::size_t nd = box.sizes.size();
  if (nd == 0) {
    std::memcpy(dst, src, es);
    return;
  }
  std::vector<std::int64_t> lo(nd), hi(nd), cstride(nd), bstride(nd);
  for (std::size_t d = 0; d < nd; ++d) {
    lo[d] = std::max(box.offsets[d], chunk.offsets[d]);
    hi[d] = std::min(box.offsets[d] + box.sizes[d], chunk.offsets[d] + chunk.sizes[d]);
    if (lo[d] >= hi[d]) return;
  }
  cstride[nd - 1] = bstride[nd - 1] = 1;
  for (std::size_t d = nd - 1; d > 0; --d) {
    cstride[d - 1] = cstride[d] * chunk.sizes[d];
    bstride[d - 1] = bstride[d] * box.sizes[d];
  }
  const std::uint64_t run = static_cast<std::uint64_t>(hi[nd - 1] - lo[nd - 1]) * es;
  std::vector<std::int64_t> idx(lo.begin(), lo.end());
  while (true) {
    std::int64_t so = 0, dof = 0;
    for (std::size_t d = 0; d < nd; ++d) {
      so += (idx[d] - chunk.offsets[d]) * cstride[d];
      dof += (idx[d] - box.offsets[d]) * bstride[d];
    }
    std::memcpy(dst + static_cast<std::uint64_t>(dof) * es, src + static_cast<std::uint64_t>(so) * es, run);
    // Odometer over dims 0..nd-2.
    std::size_t d = nd - 1;
    while (d > 0) {
      --d;
      if (++idx[d] < hi[d]) break;
      idx[d] = lo[d];
      if (d == 0) return;
    }
    if (nd == 1) return;
  }
}

namespace {

bool intersects(const DcpBox& box, const DcpChunk& c) {
  for (std::size_t d = 0; d < box.sizes.size(); ++d)
    if (std::max(box.offsets[d], c.offsets[d]) >= std::min(box.offsets[d] + box.sizes[d], c.offsets[d] + c.sizes[d]))
      return false;
  return true;
}

}  // namespace

Status load_dcp_box(const DcpCheckpoint& ckpt, const DcpTensor& t, const DcpBox& box, std::uint8_t* out,
                    std::uint64_t out_bytes) {
  if (box.offsets.size() != t.shape.size() || box.sizes.size() != t.shape.size())
    return make_error(ErrorCode::kInvalidArgument, "load_dcp: box for '" + t.fqn + "' has the wrong number of dims");
  for (std::size_t d = 0; d < t.shape.size(); ++d)
    if (box.offsets[d] < 0 || box.sizes[d] < 0 || box.offsets[d] > t.shape[d] ||
        box.sizes[d] > t.shape[d] - box.offsets[d])
      return make_error(ErrorCode::kInvalidArgument, "load_dcp: box " + dims_text(box.offsets) + "+" +
                                                         dims_text(box.sizes) + " lies outside '" + t.fqn + "' " +
                                                         dims_text(t.shape));
  const std::uint32_t es = dtype_size(t.dtype);
  std::uint64_t n = 0, bytes = 0;
  if (!numel_of(box.sizes, n) || !util::checked_mul(n, es, bytes) || bytes != out_bytes)
    return make_error(ErrorCode::kInvalidArgument, "load_dcp: output size does not match the box of '" + t.fqn + "'");
  if (n == 0) return {};
  for (const auto& c : t.chunks) {
    std::uint64_t cn = 0;
    if (!numel_of(c.sizes, cn) || cn == 0 || !intersects(box, c)) continue;
    SAFECKPT_TRY(Checkpoint ck, ckpt.load_chunk(t, c));
    const TensorInfo& ti = ck.tensors()[static_cast<std::size_t>(ck.values()[ck.root()].i)];
    // Contiguous view of the chunk: zero-copy when the saved tensor is row-major.
    bool contiguous = true;
    std::int64_t expect = 1;
    for (std::size_t d = ti.shape.size(); d-- > 0;) {
      if (ti.shape[d] != 1 && ti.stride[d] != expect) contiguous = false;
      expect *= ti.shape[d];
    }
    std::vector<std::uint8_t> owned;
    const std::uint8_t* src = nullptr;
    if (contiguous) {
      const StorageInfo& s = ck.storages()[ti.storage];
      src = s.bytes.data() + static_cast<std::uint64_t>(ti.storage_offset) * es;
    } else {
      SAFECKPT_TRY(owned, ck.contiguous_bytes(static_cast<std::uint32_t>(ck.values()[ck.root()].i)));
      src = owned.data();
    }
    dcp_copy_intersection(box, c, src, out, es);
  }
  return {};
}

Result<std::vector<DcpLoadedTensor>> load_dcp(const DcpCheckpoint& ckpt, const DcpPlan& plan) {
  std::vector<DcpLoadedTensor> out;
  std::map<std::string, bool> seen;
  for (const auto& item : plan.items) {
    if (!seen.emplace(item.fqn, true).second)
      return make_error(ErrorCode::kInvalidArgument, "load_dcp: '" + item.fqn + "' twice in the plan");
    const DcpTensor* t = ckpt.find_tensor(item.fqn);
    if (!t) return make_error(ErrorCode::kInvalidArgument, "load_dcp: no tensor '" + item.fqn + "' in the checkpoint");
    std::uint64_t n = 0, bytes = 0;
    if (!numel_of(item.box.sizes, n) || !util::checked_mul(n, dtype_size(t->dtype), bytes) ||
        bytes > ckpt.options().dcp.max_box_bytes)
      return make_error(ErrorCode::kLimitExceeded, "load_dcp: box of '" + item.fqn + "' larger than max_box_bytes");
    DcpLoadedTensor lt;
    lt.fqn = item.fqn;
    lt.dtype = t->dtype;
    lt.box = item.box;
    lt.global_shape = t->shape;
    lt.data.resize(bytes);
    SAFECKPT_CHECK(load_dcp_box(ckpt, *t, item.box, lt.data.data(), bytes));
    out.push_back(std::move(lt));
  }
  return out;
}

Result<std::vector<DcpLoadedTensor>> load_dcp(const std::filesystem::path& dir, const DcpPlan& plan,
                                              const DcpOptions& options) {
  SAFECKPT_TRY(DcpCheckpoint c, DcpCheckpoint::open(dir, options));
  return load_dcp(c, plan);
}

// ---- consolidation ----

Status dcp_to_safetensors(const DcpCheckpoint& ckpt, const std::filesystem::path& out, const DcpConvertOptions& options,
                          std::vector<std::string>* skipped) {
  std::uint64_t largest = 1;
  std::vector<std::uint64_t> sizes;
  for (const auto& t : ckpt.tensors()) {
    if (safetensors_dtype_name(t.dtype).empty())
      return make_error(ErrorCode::kUnsupported, "dcp_to_safetensors: '" + t.fqn + "' has dtype " +
                                                     std::string(dtype_name(t.dtype)) + ", which safetensors lacks");
    std::uint64_t n = 0, b = 0;
    if (!numel_of(t.shape, n) || !util::checked_mul(n, dtype_size(t.dtype), b) || b > ckpt.options().dcp.max_box_bytes)
      return make_error(ErrorCode::kLimitExceeded, "dcp_to_safetensors: '" + t.fqn + "' larger than max_box_bytes");
    sizes.push_back(b);
    largest = std::max(largest, b);
  }
  if (skipped)
    for (const auto& b : ckpt.bytes_items()) skipped->push_back(b.fqn);
  // One buffer of the largest tensor: the header's entries point into it (only
  // their sizes are read), then each tensor is assembled there in turn.
  std::vector<std::uint8_t> buf(largest);
  std::vector<SafetensorsEntry> entries;
  for (std::size_t i = 0; i < ckpt.tensors().size(); ++i) {
    const auto& t = ckpt.tensors()[i];
    SafetensorsEntry e;
    e.name = t.fqn;
    e.dtype = std::string(safetensors_dtype_name(t.dtype));
    for (auto d : t.shape) e.shape.push_back(static_cast<std::uint64_t>(d));
    e.data = Bytes(buf.data(), sizes[i]);
    entries.push_back(std::move(e));
  }
  SaveOptions so;
  so.overwrite = options.overwrite;
  so.fsync = options.fsync;
  return write_file_atomically_ranges(
      out, so, [&](const std::function<Status(Bytes)>& write, const FileRangeCopy& copy) -> Status {
        auto header = safetensors_header(entries, {}, false);
        if (!header) return make_error(header.error().code(), "dcp_to_safetensors: " + header.error().message());
        SAFECKPT_CHECK(write(Bytes(header->data(), header->size())));
        for (const auto& e : entries) {  // the header's order
          const DcpTensor* t = ckpt.find_tensor(e.name);
          if (e.data.empty()) continue;
          // Chunks of whole rows (Shard(0), world size 1, replicated): the
          // tensor is their bytes in dim-0 order, written straight from the
          // mapped chunks (no copy into buf).
          std::vector<const DcpChunk*> rows;
          for (const auto& c : t->chunks) {
            std::uint64_t cn = 0;
            if (!numel_of(c.sizes, cn) || cn == 0) continue;
            bool whole_rows = true;
            for (std::size_t d = 1; d < c.sizes.size(); ++d)
              if (c.offsets[d] != 0 || c.sizes[d] != t->shape[d]) whole_rows = false;
            if (!whole_rows) {
              rows.clear();
              break;
            }
            rows.push_back(&c);
          }
          if (!rows.empty()) {
            std::sort(rows.begin(), rows.end(), [](const DcpChunk* a, const DcpChunk* b) {
              return !a->offsets.empty() && a->offsets[0] < b->offsets[0];
            });
            for (const DcpChunk* c : rows) {
              SAFECKPT_TRY(Checkpoint ck, ckpt.load_chunk(*t, *c));
              const auto ti_index = static_cast<std::uint32_t>(ck.values()[ck.root()].i);
              const TensorInfo& ti = ck.tensors()[ti_index];
              const std::uint64_t nbytes = ti.numel() * dtype_size(ti.dtype);
              bool row_major = true;
              std::int64_t expect = 1;
              for (std::size_t d = ti.shape.size(); d-- > 0;) {
                if (ti.shape[d] != 1 && ti.stride[d] != expect) row_major = false;
                expect *= ti.shape[d];
              }
              if (row_major) {
                const StorageInfo& st = ck.storages()[ti.storage];
                const std::uint8_t* src =
                    st.bytes.data() + static_cast<std::uint64_t>(ti.storage_offset) * dtype_size(ti.dtype);
                // A stored record is a range of the data file: copied in the
                // kernel from the descriptor the mapping came from (as cp does).
                const MappedFile* f = ckpt.data_file(c->file);
                const Bytes all = f != nullptr ? f->bytes() : Bytes();
                if (f != nullptr && f->fd() >= 0 && st.file_offset != Location::kNoOffset && src >= all.data() &&
                    src <= all.data() + all.size() &&
                    nbytes <= static_cast<std::uint64_t>(all.data() + all.size() - src)) {
                  SAFECKPT_CHECK(copy(f->fd(), static_cast<std::uint64_t>(src - all.data()), nbytes));
                } else {
                  SAFECKPT_CHECK(write(Bytes(src, nbytes)));
                }
              } else {
                SAFECKPT_TRY(std::vector<std::uint8_t> owned, ck.contiguous_bytes(ti_index));
                SAFECKPT_CHECK(write(Bytes(owned.data(), owned.size())));
              }
            }
            continue;
          }
          SAFECKPT_CHECK(load_dcp_box(ckpt, *t, DcpBox{std::vector<std::int64_t>(t->shape.size(), 0), t->shape},
                                      buf.data(), e.data.size()));
          SAFECKPT_CHECK(write(Bytes(buf.data(), e.data.size())));
        }
        return {};
      });
}

// ---- the nested state dict (dcp_to_torch_save's layout) ----

namespace {

// The nested containers set_element builds, before they become value nodes.
struct Nest {
  enum class Kind : std::uint8_t { kDict, kList, kLeaf, kNone } kind = Kind::kNone;
  std::vector<std::pair<DcpPathKey, std::size_t>> dict;  // key -> nest index (insertion order)
  std::vector<std::size_t> list;                         // nest indices
  NodeId leaf = kNoNode;
};

bool same_key(const DcpPathKey& a, const DcpPathKey& b) {
  return a.is_index == b.is_index && (a.is_index ? a.index == b.index : a.key == b.key);
}

class Nester {
 public:
  Nester() { nests_.push_back(Nest{Nest::Kind::kDict, {}, {}, kNoNode}); }

  // _traverse.py set_element(root, path, value).
  Status set(const std::vector<DcpPathKey>& path, NodeId value, const std::string& fqn) {
    std::size_t cur = 0;
    for (std::size_t i = 1; i < path.size(); ++i) {
      const DcpPathKey& prev = path[i - 1];
      const Nest::Kind def = path[i].is_index ? Nest::Kind::kList : Nest::Kind::kDict;
      SAFECKPT_TRY(std::size_t slot, child(cur, prev, fqn));
      if (nests_[slot].kind == Nest::Kind::kNone) nests_[slot].kind = def;
      if (nests_[slot].kind == Nest::Kind::kLeaf)
        return malformed("'" + fqn + "': its path runs through another item's value");
      cur = slot;
    }
    SAFECKPT_TRY(std::size_t slot, child(cur, path.back(), fqn));
    nests_[slot] = Nest{Nest::Kind::kLeaf, {}, {}, value};
    return {};
  }

  // Value nodes, children before parents (iterative post-order).
  Result<NodeId> emit(CheckpointBuilder& b) const {
    std::vector<NodeId> node(nests_.size(), kNoNode);
    std::vector<std::pair<std::size_t, bool>> stack{{0, false}};
    while (!stack.empty()) {
      auto [i, expanded] = stack.back();
      stack.pop_back();
      const Nest& n = nests_[i];
      if (!expanded) {
        stack.push_back({i, true});
        for (const auto& kv : n.dict) stack.push_back({kv.second, false});
        for (auto c : n.list) stack.push_back({c, false});
        continue;
      }
      switch (n.kind) {
        case Nest::Kind::kLeaf: node[i] = n.leaf; break;
        case Nest::Kind::kNone: node[i] = b.none(); break;
        case Nest::Kind::kList: {
          std::vector<NodeId> items;
          for (auto c : n.list) items.push_back(node[c]);
          node[i] = b.container(safeckpt::Kind::kList, std::move(items));
          break;
        }
        case Nest::Kind::kDict: {
          std::vector<NodeId> items;
          for (const auto& [k, c] : n.dict) {
            items.push_back(k.is_index ? b.integer(k.index) : b.str(k.key));
            items.push_back(node[c]);
          }
          node[i] = b.container(safeckpt::Kind::kDict, std::move(items));
          break;
        }
      }
    }
    return node[0];
  }

 private:
  // The slot for `key` in container `cur` (dict: setdefault; list: padded with None).
  Result<std::size_t> child(std::size_t cur, const DcpPathKey& key, const std::string& fqn) {
    if (nests_[cur].kind == Nest::Kind::kDict) {
      for (const auto& kv : nests_[cur].dict)
        if (same_key(kv.first, key)) return kv.second;
      nests_.push_back(Nest{});
      nests_[cur].dict.push_back({key, nests_.size() - 1});
      return nests_.size() - 1;
    }
    if (!key.is_index || key.index < 0 || key.index > (1 << 24))
      return malformed("'" + fqn + "': a list index in its path is not a small non-negative int");
    while (nests_[cur].list.size() <= static_cast<std::size_t>(key.index)) {
      nests_.push_back(Nest{});
      nests_[cur].list.push_back(nests_.size() - 1);
    }
    return nests_[cur].list[static_cast<std::size_t>(key.index)];
  }
  std::vector<Nest> nests_;
};

}  // namespace

// Copies the value tree at `root` of `src` into `b` (iteratively; shared
// nodes stay shared). Tensors and storages are refused.
Result<NodeId> dcp_copy_value(const ValueArena& src, NodeId root, CheckpointBuilder& b, const std::string& fqn) {
  std::map<NodeId, NodeId> map;
  std::vector<NodeId> order, stack{root};
  while (!stack.empty()) {
    NodeId id = stack.back();
    stack.pop_back();
    if (id == kNoNode || map.count(id)) continue;
    const Node& n = src[id];
    if (n.kind == safeckpt::Kind::kTensor || n.kind == safeckpt::Kind::kStorage)
      return make_error(ErrorCode::kUnsupported, "DCP: non-tensor item '" + fqn + "' holds a tensor");
    Node copy = n;
    map[id] = b.add(std::move(copy));
    order.push_back(id);
    for (NodeId c : n.items) stack.push_back(c);
    if (n.attrs != kNoNode) stack.push_back(n.attrs);
  }
  for (NodeId id : order) {
    Node& n = b.values()[map[id]];
    for (NodeId& c : n.items)
      if (c != kNoNode) c = map[c];
    if (n.attrs != kNoNode) n.attrs = map[n.attrs];
  }
  return map[root];
}

Result<Checkpoint> dcp_to_checkpoint(const DcpCheckpoint& ckpt, const std::filesystem::path& scratch_dir) {
  // 1. Tensor bytes into an unlinked scratch file, one tensor in memory at a time.
  int fd = ::open(scratch_dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(ErrorCode::kIo,
                      "DCP: cannot create a scratch file in " + scratch_dir.string() + ": " + std::strerror(errno));
  std::vector<std::uint64_t> offset(ckpt.tensors().size(), 0), bytes(ckpt.tensors().size(), 0);
  std::uint64_t cursor = 0;
  {
    std::vector<std::uint8_t> buf;
    for (std::size_t i = 0; i < ckpt.tensors().size(); ++i) {
      const DcpTensor& t = ckpt.tensors()[i];
      std::uint64_t n = 0, nb = 0;
      if (!numel_of(t.shape, n) || !util::checked_mul(n, dtype_size(t.dtype), nb) ||
          nb > ckpt.options().dcp.max_box_bytes) {
        ::close(fd);
        return make_error(ErrorCode::kLimitExceeded, "DCP: '" + t.fqn + "' larger than max_box_bytes");
      }
      if (nb == 0) continue;  // offset 0, no bytes
      buf.assign(nb, 0);
      Status st = load_dcp_box(ckpt, t, DcpBox{std::vector<std::int64_t>(t.shape.size(), 0), t.shape}, buf.data(), nb);
      if (!st) {
        ::close(fd);
        return unexpected(std::move(st).error());
      }
      cursor = (cursor + 63) / 64 * 64;
      offset[i] = cursor;
      bytes[i] = nb;
      for (std::uint64_t done = 0; done < nb;) {
        const ssize_t w = ::pwrite(fd, buf.data() + done, nb - done, static_cast<off_t>(cursor + done));
        if (w <= 0) {
          const int e = errno;
          ::close(fd);
          return make_error(ErrorCode::kIo, std::string("DCP: writing the scratch file: ") + std::strerror(e));
        }
        done += static_cast<std::uint64_t>(w);
      }
      cursor += nb;
    }
  }
  SAFECKPT_TRY(MappedFile scratch, MappedFile::adopt(fd, scratch_dir / "<scratch>"));
  CheckpointBuilder b(std::move(scratch));
  const Bytes file = b.file_bytes();
  // 2. The nested tree in state_dict_metadata order.
  Nester nest;
  for (const DcpItemRef& ref : ckpt.items()) {
    NodeId value = kNoNode;
    const std::string* fqn = nullptr;
    const std::vector<DcpPathKey>* path = nullptr;
    if (ref.is_tensor) {
      const DcpTensor& t = ckpt.tensors()[ref.index];
      fqn = &t.fqn;
      path = &t.path;
      SAFECKPT_TRY(std::uint32_t s, b.add_storage_borrowed(t.dtype, file.subspan(offset[ref.index], bytes[ref.index]),
                                                           "cpu", offset[ref.index]));
      SAFECKPT_TRY(value, b.add_tensor(t.dtype, t.shape, s));
    } else {
      const DcpBytesItem& item = ckpt.bytes_items()[ref.index];
      fqn = &item.fqn;
      path = &item.path;
      SAFECKPT_TRY(Checkpoint v, ckpt.load_bytes_item(item));
      SAFECKPT_TRY(value, dcp_copy_value(v.values(), v.root(), b, item.fqn));
    }
    const std::vector<DcpPathKey> top{DcpPathKey{false, *fqn, 0}};
    SAFECKPT_CHECK(nest.set(path->empty() ? top : *path, value, *fqn));
  }
  SAFECKPT_TRY(NodeId root, nest.emit(b));
  b.set_root(root);
  b.set_format(FileFormat::kTorchZip);
  return std::move(b).finish();
}

Status dcp_to_torch_save(const DcpCheckpoint& ckpt, const std::filesystem::path& out,
                         const DcpConvertOptions& options) {
  const std::filesystem::path dir = out.has_parent_path() ? out.parent_path() : std::filesystem::path(".");
  SAFECKPT_TRY(Checkpoint c, dcp_to_checkpoint(ckpt, dir));
  SaveOptions so;
  so.overwrite = options.overwrite;
  so.fsync = options.fsync;
  return save(out, c, so);
}

}  // namespace safeckpt
