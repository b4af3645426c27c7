// save_dcp: one checkpoint -> a torch.distributed.checkpoint directory as
// DcpWriteOptions::world_size writers would save it, the rules in
// safeckpt/dcp.hpp "Writing a DCP directory".
//
// Sources (PyTorch 2.11): torch/distributed/checkpoint/_traverse.py
// (traverse_state_dict, _is_terminal, _keep_visiting_tensors), _nested_dict.py
// (flatten_state_dict: duplicate keys are an error), default_planner.py
// (create_default_local_save_plan: one WriteItem per tensor / non-tensor),
// filesystem.py (_write_item: torch.save of each tensor, raw bytes of each
// BytesIO item; _StorageInfo; the .metadata pickle), metadata.py (the
// dataclasses and TensorProperties' __getstate__ 5-tuple),
// _dedup_save_plans.py (an item several ranks plan is written by one of them),
// tensor/placement_types.py Shard._local_shard_size_and_offset (torch.chunk
// split of a dimension; empty shards sit at the end of the dimension, as
// tests/data/dcp-2.11/uneven-ws4/metadata_repr.txt shows).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "dcp/internal.hpp"
#include "safeckpt/builder.hpp"
#include "safeckpt/save.hpp"
#include "save/pickler.hpp"
#include "util/bytes.hpp"

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

namespace safeckpt {
namespace {

constexpr std::size_t kMaxPathKeys = 4096;  // the reader's planner_data cap (metadata.cpp Reader::path)

std::string data_file(std::uint32_t rank) {
  return "__" + std::to_string(rank) + "_0.distcp";
}
constexpr std::string_view kMd = "torch.distributed.checkpoint.metadata.";

Unexpected unsupported(std::string msg) {
  return make_error(ErrorCode::kUnsupported, "DCP write: " + std::move(msg));
}
Unexpected io_error(const std::string& what, const std::filesystem::path& p, int err) {
  return make_error(ErrorCode::kIo, "DCP write: " + what + " " + p.string() + ": " + std::strerror(err));
}

bool is_mapping(Kind k) {
  return k == Kind::kDict || k == Kind::kOrderedDict || k == Kind::kCounter;
}

// One flattened item: a tensor (node of kind kTensor) or a non-tensor value.
struct FlatItem {
  NodeId node = kNoNode;
  bool is_tensor = false;
  std::string fqn;
  std::vector<DcpPathKey> path;
};

// _traverse.py _is_terminal for every list reachable from the root through
// containers, computed without recursion: a list is walked (not terminal)
// when an entry is a mapping or a tensor, or a list that is walked. Lists
// in a cycle count as terminal here (Python recurses forever on them; the
// walk below refuses a container reached twice anyway).
std::vector<bool> walked_lists(const ValueArena& a, NodeId root) {
  std::vector<bool> walked(a.size(), false);
  std::vector<std::uint8_t> state(a.size(), 0);  // 0 new, 1 on stack, 2 done
  std::vector<std::pair<NodeId, std::size_t>> st;
  // Visit every container once (any kind), finishing lists in post-order.
  std::vector<NodeId> roots{root};
  while (!roots.empty()) {
    NodeId r = roots.back();
    roots.pop_back();
    if (r >= a.size() || state[r] != 0) continue;
    state[r] = 1;
    st.push_back({r, 0});
    while (!st.empty()) {
      auto& [id, next] = st.back();
      const Node& n = a[id];
      if (next < n.items.size()) {
        NodeId c = n.items[next++];
        if (c < a.size() && state[c] == 0 && !a[c].items.empty()) {
          state[c] = 1;
          st.push_back({c, 0});
        }
        continue;
      }
      if (n.kind == Kind::kList) {
        bool w = false;
        for (NodeId c : n.items) {
          if (c >= a.size()) continue;
          const Kind k = a[c].kind;
          if (is_mapping(k) || k == Kind::kTensor || (k == Kind::kList && state[c] == 2 && walked[c])) w = true;
        }
        walked[id] = w;
      }
      state[id] = 2;
      st.pop_back();
    }
  }
  return walked;
}

std::string key_text(const DcpPathKey& k) {
  return k.is_index ? std::to_string(k.index) : k.key;
}

// The flattening walk (iterative; each container expanded once).
Result<std::vector<FlatItem>> flatten(const Checkpoint& ckpt, const DcpWriteOptions& o) {
  const ValueArena& a = ckpt.values();
  const NodeId root = ckpt.root();
  if (root == kNoNode || root >= a.size() || (a[root].kind != Kind::kDict && a[root].kind != Kind::kOrderedDict))
    return unsupported("the checkpoint's root is not a dict (DCP saves a state dict: str -> value)");
  const std::vector<bool> walked = walked_lists(a, root);
  std::vector<bool> expanded(a.size(), false);
  std::vector<FlatItem> out;
  std::vector<DcpPathKey> path;
  std::uint64_t metadata_estimate = 0;
  struct Frame {
    NodeId id;
    std::size_t next;  // index into items (dicts: key position)
  };
  std::vector<Frame> st{{root, 0}};
  expanded[root] = true;
  auto leaf = [&](NodeId id) -> Status {
    FlatItem it;
    it.node = id;
    it.is_tensor = a[id].kind == Kind::kTensor;
    for (std::size_t i = 0; i < path.size(); ++i) {
      if (i) it.fqn += '.';
      it.fqn += key_text(path[i]);
      if (it.fqn.size() > kMaxTensorNameBytes)
        return make_error(ErrorCode::kLimitExceeded, "DCP write: an FQN longer than kMaxTensorNameBytes");
    }
    it.path = path;
    // What the .metadata will need for this item, roughly: the FQN in
    // state_dict_metadata, planner_data and storage_data, its path, and a
    // fixed part; refused when DcpCheckpoint::open would refuse the file.
    metadata_estimate += 3 * it.fqn.size() + 64 * path.size() + 256;
    if (out.size() + 1 > o.limits.max_items || metadata_estimate > o.limits.max_metadata_bytes)
      return make_error(ErrorCode::kLimitExceeded,
                        "DCP write: more items or metadata than DcpLimits lets DcpCheckpoint::open read back");
    out.push_back(std::move(it));
    return {};
  };
  while (!st.empty()) {
    Frame& f = st.back();
    const Node& n = a[f.id];
    const bool mapping = is_mapping(n.kind);
    const std::size_t step = mapping ? 2 : 1;
    if (f.next + step > n.items.size()) {
      st.pop_back();
      if (!path.empty()) path.pop_back();
      continue;
    }
    DcpPathKey key;
    NodeId child;
    if (mapping) {
      const Node& k = a[n.items[f.next]];
      child = n.items[f.next + 1];
      if (k.kind == Kind::kStr) {
        key.key = k.text;
      } else if (k.kind == Kind::kInt) {
        key.key = std::to_string(k.i);  // _traverse.py: path + (str(key),)
      } else {
        return unsupported("a dict key of kind " + std::string(kind_name(k.kind)) +
                           " (DCP flattens str and int keys only)");
      }
    } else {
      key.is_index = true;
      key.index = static_cast<std::int64_t>(f.next);
      child = n.items[f.next];
    }
    f.next += step;
    if (child >= a.size()) return make_error(ErrorCode::kInternal, "DCP write: node id out of range");
    if (path.size() + 1 > kMaxPathKeys)
      return make_error(ErrorCode::kLimitExceeded, "DCP write: a value nested deeper than 4096 keys");
    path.push_back(std::move(key));
    const Kind ck = a[child].kind;
    const bool descend = is_mapping(ck) || (ck == Kind::kList && walked[child]);
    if (!descend) {
      SAFECKPT_CHECK(leaf(child));
      path.pop_back();
      continue;
    }
    if (expanded[child]) {
      std::string where;
      for (std::size_t i = 0; i < path.size(); ++i) where += (i ? "." : "") + key_text(path[i]);
      return unsupported("'" + where +
                         "' is a container already reached at another path (shared or cyclic); DCP would "
                         "flatten it twice");
    }
    expanded[child] = true;
    st.push_back({child, 0});
  }
  // flatten_state_dict: "duplicated flatten key".
  std::vector<std::size_t> order(out.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) { return out[x].fqn < out[y].fqn; });
  for (std::size_t i = 1; i < order.size(); ++i)
    if (out[order[i]].fqn == out[order[i - 1]].fqn)
      return make_error(ErrorCode::kInvalidArgument,
                        "DCP write: two values flatten to the FQN '" + out[order[i]].fqn + "'");
  return out;
}

// A temporary directory beside the target, removed unless committed.
class TempDir {
 public:
  TempDir() = default;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() { discard(); }

  Status create(const std::filesystem::path& target) {
    parent_ = target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
    std::random_device rd;
    for (int attempt = 0; attempt < 64; ++attempt) {
      char suffix[32];
      std::snprintf(suffix, sizeof suffix, ".%08x%04x.tmp", rd(), rd() & 0xFFFFu);
      path_ = parent_ / ("." + target.filename().string() + suffix);
      if (::mkdir(path_.c_str(), 0777) == 0) return {};
      if (errno != EEXIST) {
        const int e = errno;
        path_.clear();
        return io_error("cannot create a temporary directory in", parent_, e);
      }
    }
    path_.clear();
    return make_error(ErrorCode::kIo, "DCP write: cannot create a unique temporary directory in " + parent_.string());
  }
  const std::filesystem::path& path() const { return path_; }

  Status commit(const std::filesystem::path& target, bool do_fsync) {
    if (do_fsync) SAFECKPT_CHECK(fsync_dir(path_));
    int rc = ::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP)) {
      // No RENAME_NOREPLACE on this filesystem: rename() would replace an
      // empty directory that appeared meanwhile, so look first (a narrow race).
      struct stat st {};
      if (::lstat(target.c_str(), &st) == 0) {
        errno = EEXIST;
        rc = -1;
      } else {
        rc = ::rename(path_.c_str(), target.c_str());
      }
    }
    if (rc != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY)
        return make_error(ErrorCode::kExists, "DCP write: output exists: " + target.string());
      return io_error("rename to", target, errno);
    }
    path_.clear();
    if (do_fsync) (void)fsync_dir(parent_);  // best effort: the files are durable already
    return {};
  }

  void discard() noexcept {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
    path_.clear();
  }

  static Status fsync_dir(const std::filesystem::path& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return io_error("open", dir, errno);
    const int rc = ::fsync(fd);
    const int e = errno;
    ::close(fd);
    if (rc != 0) return io_error("fsync", dir, e);
    return {};
  }

 private:
  std::filesystem::path parent_, path_;
};

// A new file written sequentially with a small gathering buffer.
class OutFile {
 public:
  OutFile() = default;
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status create(const std::filesystem::path& p) {
    path_ = p;
    fd_ = ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd_ < 0) return io_error("create", p, errno);
    return {};
  }
  Status write(Bytes data) {
    if (data.size() >= kBuf) {
      SAFECKPT_CHECK(flush());
      SAFECKPT_CHECK(write_all(data));
    } else {
      if (buf_.size() + data.size() > kBuf) SAFECKPT_CHECK(flush());
      buf_.insert(buf_.end(), data.begin(), data.end());
    }
    size_ += data.size();
    return {};
  }
  std::uint64_t size() const { return size_; }
  Status close(bool do_fsync) {
    SAFECKPT_CHECK(flush());
    if (do_fsync && ::fsync(fd_) != 0) return io_error("fsync", path_, errno);
    const int rc = ::close(fd_);
    fd_ = -1;
    if (rc != 0) return io_error("close", path_, errno);
    return {};
  }

 private:
  static constexpr std::size_t kBuf = 1u << 20;
  Status flush() {
    if (buf_.empty()) return {};
    Status s = write_all(Bytes(buf_.data(), buf_.size()));
    buf_.clear();
    return s;
  }
  Status write_all(Bytes data) {
    const std::uint8_t* p = data.data();
    std::size_t left = data.size();
    while (left > 0) {
      const ssize_t n = ::write(fd_, p, left < (1u << 30) ? left : (1u << 30));
      if (n < 0) {
        if (errno == EINTR) continue;
        return io_error("write", path_, errno);
      }
      p += n;
      left -= static_cast<std::size_t>(n);
    }
    return {};
  }
  std::filesystem::path path_;
  int fd_ = -1;
  std::vector<std::uint8_t> buf_;
  std::uint64_t size_ = 0;
};

Unexpected bad_tensor(const std::string& fqn) {
  return unsupported("'" + fqn +
                     "' is not a plain strided tensor (sparse, quantized, meta, conj/neg bit or a subclass)");
}

// Where a tensor's chunks go: Shard(0) over the world as DTensor splits dim 0
// (torch.chunk: ceil(n / N) rows per rank, the last non-empty rank fewer,
// ranks past the end an empty shard at offset n). Identical chunks of
// several ranks (every empty shard; a 0-dim tensor or one whose dim 0 is 0,
// which every rank would hold whole) are planned once, by the lowest such
// rank: dedup_save_plans keeps one writer per MetadataIndex.
struct ChunkPlan {
  std::uint32_t rank = 0;
  std::int64_t row0 = 0, rows = 0;      // along dim 0 (0-dim: row0 0, rows 1)
  std::uint64_t begin = 0, length = 0;  // in the rank's file, once written
};

std::vector<ChunkPlan> shard_rows(const std::vector<std::int64_t>& shape, std::uint32_t world) {
  if (shape.empty()) return {ChunkPlan{0, 0, 1, 0, 0}};
  const std::int64_t n = shape[0];
  if (n == 0 || world == 1) return {ChunkPlan{0, 0, n, 0, 0}};
  const std::int64_t per = n / world + (n % world != 0 ? 1 : 0);
  std::vector<ChunkPlan> out;
  for (std::uint32_t r = 0; r < world; ++r) {
    const std::int64_t off = static_cast<std::int64_t>(r) * per;
    if (off >= n) {
      out.push_back(ChunkPlan{r, n, 0, 0, 0});  // the one empty shard
      break;
    }
    out.push_back(ChunkPlan{r, off, std::min(per, n - off), 0, 0});
  }
  return out;
}

// Rows [row0, row0 + rows) of a plain strided tensor, C-contiguous: sliced
// straight from the storage when the tensor is row-major (size-1 dims'
// strides ignored, as is_contiguous does), else from a contiguous copy of
// the whole tensor (once per chunk: non-row-major tensors are rare in state
// dicts; DCP itself clones views).
Result<std::vector<std::uint8_t>> row_slice(const Checkpoint& ckpt, std::uint32_t index, std::int64_t row0,
                                            std::int64_t rows) {
  const TensorInfo& t = ckpt.tensors()[index];
  const std::uint64_t esize = dtype_size(t.dtype);
  std::uint64_t row_elems = 1;
  for (std::size_t d = 1; d < t.shape.size(); ++d) row_elems *= static_cast<std::uint64_t>(t.shape[d]);
  const std::uint64_t row_bytes = row_elems * esize;  // numel() was validated not to overflow
  const std::uint64_t first = static_cast<std::uint64_t>(row0) * row_bytes;
  const std::uint64_t len = static_cast<std::uint64_t>(rows) * row_bytes;
  if (len == 0) return std::vector<std::uint8_t>{};
  bool row_major = true;
  std::int64_t expect = 1;
  for (std::size_t d = t.shape.size(); d-- > 0;) {
    if (t.shape[d] != 1 && t.stride[d] != expect) row_major = false;
    expect *= t.shape[d];
  }
  if (row_major && t.storage < ckpt.storages().size()) {
    const Bytes s = ckpt.storages()[t.storage].bytes;
    const std::uint64_t start = static_cast<std::uint64_t>(t.storage_offset) * esize + first;
    if (t.storage_offset >= 0 && start <= s.size() && len <= s.size() - start)
      return std::vector<std::uint8_t>(s.begin() + static_cast<std::ptrdiff_t>(start),
                                       s.begin() + static_cast<std::ptrdiff_t>(start + len));
  }
  SAFECKPT_TRY(std::vector<std::uint8_t> all, ckpt.contiguous_bytes(index));
  if (first > all.size() || len > all.size() - first)
    return make_error(ErrorCode::kInternal, "DCP write: chunk outside the tensor's contiguous copy");
  return std::vector<std::uint8_t>(all.begin() + static_cast<std::ptrdiff_t>(first),
                                   all.begin() + static_cast<std::ptrdiff_t>(first + len));
}

// One chunk as DCP stores it: a torch.save of a C-contiguous tensor.
Result<Checkpoint> chunk_checkpoint(const Checkpoint& ckpt, std::uint32_t index, const ChunkPlan& c) {
  const TensorInfo& t = ckpt.tensors()[index];
  SAFECKPT_TRY(std::vector<std::uint8_t> bytes, row_slice(ckpt, index, c.row0, c.rows));
  std::vector<std::int64_t> sizes = t.shape;
  if (!sizes.empty()) sizes[0] = c.rows;
  CheckpointBuilder b;
  SAFECKPT_TRY(std::uint32_t s, b.add_storage(t.dtype, std::move(bytes), "cpu"));
  SAFECKPT_TRY(NodeId n, b.add_tensor(t.dtype, sizes, s));
  b.set_root(n);
  b.set_format(FileFormat::kTorchZip);
  return std::move(b).finish();
}

// The .metadata value tree, built with the checkpoint builder and written
// by the save layer's pickler (NEWOBJ objects: Node::flag).
class MetadataTree {
 public:
  NodeId object(std::string_view cls, NodeId state) {
    Node n;
    n.kind = Kind::kObject;
    n.text = std::string(kMd) + std::string(cls);
    n.flag = true;
    n.items = {kNoNode, state};
    return b_.add(std::move(n));
  }
  NodeId size(const std::vector<std::int64_t>& dims) {
    std::vector<NodeId> items;
    items.reserve(dims.size());
    for (std::int64_t d : dims) items.push_back(b_.integer(d));
    return b_.container(Kind::kSize, std::move(items));
  }
  NodeId dict(std::vector<NodeId> kv) { return b_.container(Kind::kDict, std::move(kv)); }
  NodeId str(std::string_view s) { return b_.str(s); }
  CheckpointBuilder& builder() { return b_; }

  // TensorProperties(dtype, torch.strided, False, torch.contiguous_format,
  // False): __getstate__'s tuple; the memory format is
  // _MEM_FORMAT_ENCODING(0) = TORCH_CONTIGUOUS_FORMAT.
  NodeId properties(DType d) {
    Node layout;
    layout.kind = Kind::kLayout;
    layout.text = "strided";
    Node mf;
    mf.kind = Kind::kObject;
    mf.text = std::string(kMd) + "_MEM_FORMAT_ENCODING";
    mf.items = {b_.container(Kind::kTuple, {b_.integer(0)}), kNoNode};
    const NodeId state = b_.container(Kind::kTuple, {b_.dtype(d), b_.add(std::move(layout)), b_.boolean(false),
                                                     b_.add(std::move(mf)), b_.boolean(false)});
    return object("TensorProperties", state);
  }

 private:
  CheckpointBuilder b_;
};

}  // namespace

Result<DcpWriteSummary> save_dcp(const Checkpoint& ckpt, const std::filesystem::path& out_dir,
                                 const DcpWriteOptions& options) {
  if (out_dir.empty()) return make_error(ErrorCode::kInvalidArgument, "DCP write: empty output path");
  const std::uint32_t world = options.world_size;
  if (world == 0) return make_error(ErrorCode::kInvalidArgument, "DCP write: world size 0 (at least one writer)");
  if (world > options.limits.max_files)
    return make_error(ErrorCode::kLimitExceeded, "DCP write: world size " + std::to_string(world) +
                                                     " is more data files than DcpLimits::max_files (" +
                                                     std::to_string(options.limits.max_files) + ")");
  std::filesystem::path target = out_dir;
  if (!target.has_filename()) target = target.parent_path();  // "out/" -> "out"
  struct stat st {};
  if (::lstat(target.c_str(), &st) == 0)
    return make_error(ErrorCode::kExists, "DCP write: output exists: " + target.string());
  SAFECKPT_TRY(std::vector<FlatItem> items, flatten(ckpt, options));

  // Plan every item before writing: tensors' chunks (checked here, so a
  // refusal comes before any file), byte items on rank 0.
  std::vector<std::uint32_t> tensor_index(items.size(), 0);
  std::vector<std::vector<ChunkPlan>> chunks(items.size());
  std::vector<std::uint64_t> item_begin(items.size(), 0), item_length(items.size(), 0);  // byte items
  std::uint64_t n_chunks = 0, metadata_estimate = 0;
  for (std::size_t k = 0; k < items.size(); ++k) {
    const FlatItem& it = items[k];
    if (!it.is_tensor) continue;
    const Node& n = ckpt.values()[it.node];
    if (n.i < 0 || static_cast<std::size_t>(n.i) >= ckpt.tensors().size())
      return make_error(ErrorCode::kInternal, "DCP write: tensor node out of range");
    tensor_index[k] = static_cast<std::uint32_t>(n.i);
    const TensorInfo& t = ckpt.tensors()[tensor_index[k]];
    if (t.layout != Layout::kStrided || t.is_meta || dtype_is_quantized(t.dtype) || t.conj || t.neg ||
        !t.subclass.empty() || t.storage == kNoStorage || t.stride.size() != t.shape.size())
      return bad_tensor(it.fqn);
    chunks[k] = shard_rows(t.shape, world);
    n_chunks += chunks[k].size();
    // Per chunk: ChunkStorageMetadata, MetadataIndex and _StorageInfo with the FQN again.
    metadata_estimate += chunks[k].size() * (it.fqn.size() + 160 + 24 * t.shape.size());
    if (n_chunks > options.limits.max_chunks || metadata_estimate > options.limits.max_metadata_bytes)
      return make_error(ErrorCode::kLimitExceeded, "DCP write: world size " + std::to_string(world) +
                                                       " makes more chunks or metadata than DcpLimits lets "
                                                       "DcpCheckpoint::open read back");
  }

  TempDir tmp;
  SAFECKPT_CHECK(tmp.create(target));
  DcpWriteSummary sum;
  sum.files = world;
  // Rank by rank, as each writer would: its chunks in flattening order, and
  // on rank 0 the byte items between them (one file open at a time).
  for (std::uint32_t rank = 0; rank < world; ++rank) {
    OutFile data;
    SAFECKPT_CHECK(data.create(tmp.path() / data_file(rank)));
    const auto writer = [&data](Bytes b) { return data.write(b); };
    for (std::size_t k = 0; k < items.size(); ++k) {
      const FlatItem& it = items[k];
      if (!it.is_tensor) {
        if (rank != 0) continue;
        const std::uint64_t begin = data.size();
        CheckpointBuilder vb;
        SAFECKPT_TRY(NodeId root, dcp_copy_value(ckpt.values(), it.node, vb, it.fqn));
        vb.set_root(root);
        SAFECKPT_TRY(Checkpoint one, std::move(vb).finish());
        SAFECKPT_CHECK(save_to_writer(writer, one));
        item_begin[k] = begin;
        item_length[k] = data.size() - begin;
        continue;
      }
      for (ChunkPlan& c : chunks[k]) {
        if (c.rank != rank) continue;
        const std::uint64_t begin = data.size();
        SAFECKPT_TRY(Checkpoint one, chunk_checkpoint(ckpt, tensor_index[k], c));
        SAFECKPT_CHECK(save_to_writer(writer, one));
        c.begin = begin;
        c.length = data.size() - begin;
      }
    }
    sum.data_bytes += data.size();
    SAFECKPT_CHECK(data.close(options.fsync));
  }

  MetadataTree md;
  std::vector<NodeId> sdm, planner, storage;
  const auto storage_entry = [&](const std::string& fqn, NodeId offset, NodeId index, std::uint32_t rank,
                                 std::uint64_t begin, std::uint64_t length) {
    // MetadataIndex(fqn, offset, index): tensors (fqn, chunk offsets, chunk
    // position), a non-tensor item (fqn, None, None), as
    // create_default_global_save_plan leaves them.
    storage.push_back(md.object(
        "MetadataIndex", md.dict({md.str("fqn"), md.str(fqn), md.str("offset"), offset, md.str("index"), index})));
    Node info;
    info.kind = Kind::kObject;
    info.text = "torch.distributed.checkpoint.filesystem._StorageInfo";
    info.flag = true;
    info.items = {kNoNode, md.dict({md.str("relative_path"), md.str(data_file(rank)), md.str("offset"),
                                    md.builder().integer(static_cast<std::int64_t>(begin)), md.str("length"),
                                    md.builder().integer(static_cast<std::int64_t>(length))})};
    storage.push_back(md.builder().add(std::move(info)));
  };
  for (std::size_t k = 0; k < items.size(); ++k) {
    const FlatItem& it = items[k];
    NodeId value_md;
    if (it.is_tensor) {
      const TensorInfo& t = ckpt.tensors()[tensor_index[k]];
      std::vector<NodeId> chunk_md;
      for (std::size_t ci = 0; ci < chunks[k].size(); ++ci) {
        const ChunkPlan& c = chunks[k][ci];
        std::vector<std::int64_t> offsets(t.shape.size(), 0), sizes = t.shape;
        if (!t.shape.empty()) {
          offsets[0] = c.row0;
          sizes[0] = c.rows;
        }
        chunk_md.push_back(md.object("ChunkStorageMetadata",
                                     md.dict({md.str("offsets"), md.size(offsets), md.str("sizes"), md.size(sizes)})));
        storage_entry(it.fqn, md.size(offsets), md.builder().integer(static_cast<std::int64_t>(ci)), c.rank, c.begin,
                      c.length);
      }
      value_md = md.object("TensorStorageMetadata",
                           md.dict({md.str("properties"), md.properties(t.dtype), md.str("size"), md.size(t.shape),
                                    md.str("chunks"), md.builder().container(Kind::kList, std::move(chunk_md))}));
      ++sum.tensors;
      sum.chunks += chunks[k].size();
    } else {
      value_md = md.object("BytesStorageMetadata", kNoNode);
      storage_entry(it.fqn, md.builder().none(), md.builder().none(), 0, item_begin[k], item_length[k]);
      ++sum.bytes_items;
    }
    sdm.push_back(md.str(it.fqn));
    sdm.push_back(value_md);
    std::vector<NodeId> keys;
    keys.reserve(it.path.size());
    for (const DcpPathKey& key : it.path)
      keys.push_back(key.is_index ? md.builder().integer(key.index) : md.str(key.key));
    planner.push_back(md.str(it.fqn));
    planner.push_back(md.builder().container(Kind::kTuple, std::move(keys)));
  }

  // Metadata.version: "1.0.0" is what PyTorch 2.11 wrote (tests/data/dcp-2.11/*/metadata_repr.txt).
  const NodeId root =
      md.object("Metadata", md.dict({md.str("state_dict_metadata"), md.dict(std::move(sdm)), md.str("planner_data"),
                                     md.dict(std::move(planner)), md.str("storage_data"), md.dict(std::move(storage)),
                                     md.str("version"), md.str("1.0.0")}));
  md.builder().set_root(root);
  SAFECKPT_TRY(Checkpoint mdc, std::move(md.builder()).finish());
  PickleWriteOptions po;
  po.weights_only_compatible = false;  // DCP's own classes; read back by DcpCheckpoint's hooks
  SAFECKPT_TRY(TorchPickle pk, write_torch_pickle(mdc, po));
  OutFile mf;
  SAFECKPT_CHECK(mf.create(tmp.path() / ".metadata"));
  SAFECKPT_CHECK(mf.write(Bytes(pk.bytes.data(), pk.bytes.size())));
  SAFECKPT_CHECK(mf.close(options.fsync));
  SAFECKPT_CHECK(tmp.commit(target, options.fsync));
  return sum;
}

}  // namespace safeckpt
