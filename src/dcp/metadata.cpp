// DCP .metadata: the pickle hooks (exactly the classes of safeckpt/dcp.hpp)
// and the typed reading of the value tree they build.
#include <algorithm>
#include <array>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dcp/internal.hpp"
#include "safeckpt/dtype.hpp"
#include "safeckpt/pickle.hpp"
#include "safeckpt/value.hpp"

namespace safeckpt {
namespace {

constexpr std::string_view kMetadata = "torch.distributed.checkpoint.metadata.Metadata";
constexpr std::string_view kTensorMd = "torch.distributed.checkpoint.metadata.TensorStorageMetadata";
constexpr std::string_view kBytesMd = "torch.distributed.checkpoint.metadata.BytesStorageMetadata";
constexpr std::string_view kChunkMd = "torch.distributed.checkpoint.metadata.ChunkStorageMetadata";
constexpr std::string_view kProps = "torch.distributed.checkpoint.metadata.TensorProperties";
constexpr std::string_view kIndex = "torch.distributed.checkpoint.metadata.MetadataIndex";
constexpr std::string_view kStorageMeta = "torch.distributed.checkpoint.metadata.StorageMeta";
constexpr std::string_view kMemFormat = "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING";
constexpr std::string_view kStorageInfo = "torch.distributed.checkpoint.filesystem._StorageInfo";
constexpr std::string_view kSize = "torch.Size";
constexpr std::string_view kGetLayout = "torch.serialization._get_layout";
constexpr std::string_view kPosixPath = "pathlib.PosixPath";
constexpr std::string_view kPurePosixPath = "pathlib.PurePosixPath";

// The dataclasses: made by NEWOBJ with no arguments, then one BUILD.
constexpr std::array<std::string_view, 7> kDataclasses = {kMetadata, kTensorMd, kBytesMd,    kChunkMd,
                                                          kProps,    kIndex,    kStorageMeta};
// Globals only called (REDUCE).
constexpr std::array<std::string_view, 5> kCallables = {kSize, kGetLayout, kMemFormat, kPosixPath, kPurePosixPath};

bool is_dataclass(std::string_view n) {
  return std::find(kDataclasses.begin(), kDataclasses.end(), n) != kDataclasses.end();
}
bool is_storage_info(std::string_view n) {
  return n == kStorageInfo;
}

Unexpected policy(ErrorCode code, std::string msg, const OpContext& ctx) {
  return make_error(code, std::move(msg), Location{std::string(ctx.record), ctx.offset, std::string(ctx.opcode)});
}

class DcpHooks final : public PickleHooks {
 public:
  explicit DcpHooks(ValueArena& arena) : a_(arena) {}

  Result<NodeId> resolve_global(std::string_view q, const OpContext& ctx) override {
    Node n;
    if (is_dataclass(q) || is_storage_info(q) ||
        std::find(kCallables.begin(), kCallables.end(), q) != kCallables.end()) {
      n.kind = Kind::kGlobal;
      n.text = std::string(q);
      return a_.add(std::move(n));
    }
    if (q.substr(0, 6) == "torch.") {
      if (auto d = dtype_from_name(q.substr(6)); d && q.find('.', 6) == std::string_view::npos) {
        n.kind = Kind::kDtype;
        n.i = static_cast<std::int64_t>(*d);
        return a_.add(std::move(n));
      }
    }
    return policy(
        ErrorCode::kDisallowedGlobal,
        "global '" + std::string(q) +
            "' is not allowed in DCP metadata (only the classes of "
            "torch.distributed.checkpoint.metadata/filesystem, torch.Size, dtypes, layouts and pathlib paths)",
        ctx);
  }

  Result<NodeId> call(NodeId callable, NodeId args, const OpContext& ctx) override {
    const Node& c = a_[callable];
    const Node& t = a_[args];
    if (c.kind != Kind::kGlobal || t.kind != Kind::kTuple)
      return policy(ErrorCode::kDisallowedOperation, "call of a non-global in DCP metadata", ctx);
    const std::string name = c.text;
    if (name == kSize) {
      if (t.items.size() != 1 || (a_[t.items[0]].kind != Kind::kTuple && a_[t.items[0]].kind != Kind::kList))
        return policy(ErrorCode::kDisallowedOperation, "torch.Size expects one tuple of ints", ctx);
      std::vector<NodeId> dims = a_[t.items[0]].items;
      for (NodeId d : dims)
        if (a_[d].kind != Kind::kInt) return policy(ErrorCode::kDisallowedOperation, "torch.Size expects ints", ctx);
      Node n;
      n.kind = Kind::kSize;
      n.items = std::move(dims);
      return a_.add(std::move(n));
    }
    if (name == kGetLayout) {
      if (t.items.size() != 1 || a_[t.items[0]].kind != Kind::kStr || a_[t.items[0]].text.rfind("torch.", 0) != 0)
        return policy(ErrorCode::kDisallowedOperation, "_get_layout expects one 'torch.<layout>' str", ctx);
      Node n;
      n.kind = Kind::kLayout;
      n.text = a_[t.items[0]].text.substr(6);
      return a_.add(std::move(n));
    }
    if (name == kMemFormat) {
      if (t.items.size() != 1 || a_[t.items[0]].kind != Kind::kInt || a_[t.items[0]].i < 0 || a_[t.items[0]].i > 2)
        return policy(ErrorCode::kDisallowedOperation, "_MEM_FORMAT_ENCODING expects 0, 1 or 2", ctx);
      Node n;
      n.kind = Kind::kObject;
      n.text = name;
      n.i = a_[t.items[0]].i;
      n.items = {kNoNode, kNoNode};
      return a_.add(std::move(n));
    }
    if (name == kPosixPath || name == kPurePosixPath) {
      std::string joined;
      for (NodeId p : t.items) {
        if (a_[p].kind != Kind::kStr) return policy(ErrorCode::kDisallowedOperation, name + " expects str parts", ctx);
        if (!joined.empty() && joined.back() != '/') joined += '/';
        joined += a_[p].text;
      }
      Node n;
      n.kind = Kind::kStr;
      n.text = std::move(joined);
      return a_.add(std::move(n));
    }
    return policy(ErrorCode::kDisallowedOperation, "'" + name + "' is not called in DCP metadata", ctx);
  }

  Result<NodeId> new_object(NodeId cls, NodeId args, const OpContext& ctx) override {
    const Node& c = a_[cls];
    if (c.kind != Kind::kGlobal || !(is_dataclass(c.text) || is_storage_info(c.text)))
      return policy(ErrorCode::kDisallowedOperation, "NEWOBJ of something other than a DCP metadata class", ctx);
    if (a_[args].kind != Kind::kTuple || !a_[args].items.empty())
      return policy(ErrorCode::kDisallowedOperation, "NEWOBJ of " + c.text + " with arguments", ctx);
    Node n;
    n.kind = Kind::kObject;
    n.text = c.text;
    n.items = {kNoNode, kNoNode};
    return a_.add(std::move(n));
  }

  Status build(NodeId obj, NodeId state, const OpContext& ctx) override {
    Node& o = a_[obj];
    if (o.kind != Kind::kObject || !(is_dataclass(o.text) || is_storage_info(o.text)))
      return policy(ErrorCode::kDisallowedOperation, "BUILD on something other than a DCP metadata class", ctx);
    if (o.items.size() != 2 || o.items[1] != kNoNode)
      return policy(ErrorCode::kDisallowedOperation, "BUILD twice on one " + o.text, ctx);
    o.items[1] = state;
    return {};
  }

  Result<NodeId> persistent_load(NodeId, const OpContext& ctx) override {
    return policy(ErrorCode::kDisallowedOperation, "persistent id in DCP metadata", ctx);
  }
  Status require_builtin(std::string_view q, const OpContext& ctx) override {
    return policy(ErrorCode::kDisallowedGlobal, "'" + std::string(q) + "' is not allowed in DCP metadata", ctx);
  }

 private:
  ValueArena& a_;
};

// ---- typed reading ----

class Reader {
 public:
  Reader(const ValueArena& a, const DcpOptions& o) : a_(a), o_(o) {}

  Unexpected bad(const std::string& msg) const { return make_error(ErrorCode::kMalformed, "DCP metadata: " + msg); }

  // The BUILD state of a dataclass object as field -> node; unknown fields
  // refused. `allowed` lists the fields.
  Result<std::map<std::string, NodeId>> fields(NodeId id, std::string_view cls,
                                               std::initializer_list<std::string_view> allowed) const {
    const Node& n = a_[id];
    if (n.kind != Kind::kObject || n.text != cls)
      return bad("expected " + std::string(cls.substr(cls.rfind('.') + 1)) + ", got " +
                 std::string(n.kind == Kind::kObject ? n.text : std::string(kind_name(n.kind))));
    std::map<std::string, NodeId> out;
    if (n.items.size() != 2 || n.items[1] == kNoNode) return out;
    const Node& st = a_[n.items[1]];
    if (st.kind != Kind::kDict) return bad(std::string(cls) + " state is not a dict");
    for (std::size_t i = 0; i + 1 < st.items.size(); i += 2) {
      const Node& k = a_[st.items[i]];
      if (k.kind != Kind::kStr) return bad(std::string(cls) + " state key is not a str");
      if (std::find(allowed.begin(), allowed.end(), k.text) == allowed.end())
        return bad("unknown field '" + k.text + "' of " + std::string(cls));
      out[k.text] = st.items[i + 1];
    }
    return out;
  }

  Result<std::vector<std::int64_t>> size(NodeId id, const std::string& what) const {
    const Node& n = a_[id];
    if (n.kind != Kind::kSize) return bad(what + " is not a torch.Size");
    if (n.items.size() > o_.dcp.max_ndim)
      return make_error(ErrorCode::kLimitExceeded, "DCP metadata: " + what + " has more than max_ndim dimensions");
    std::vector<std::int64_t> v;
    v.reserve(n.items.size());
    for (NodeId d : n.items) {
      if (a_[d].i < 0) return bad(what + " has a negative entry");
      v.push_back(a_[d].i);
    }
    return v;
  }

  Result<std::string> str(NodeId id, const std::string& what) const {
    if (a_[id].kind != Kind::kStr) return bad(what + " is not a str");
    return a_[id].text;
  }
  Result<std::int64_t> integer(NodeId id, const std::string& what) const {
    if (a_[id].kind != Kind::kInt) return bad(what + " is not an int");
    return a_[id].i;
  }
  bool is_none(NodeId id) const { return a_[id].kind == Kind::kNone; }

  Result<std::vector<DcpPathKey>> path(NodeId id, const std::string& fqn) const {
    const Node& n = a_[id];
    if (n.kind != Kind::kTuple && n.kind != Kind::kList) return bad("planner_data of '" + fqn + "' is not a tuple");
    if (n.items.size() > 4096) return make_error(ErrorCode::kLimitExceeded, "DCP metadata: planner_data path too long");
    std::vector<DcpPathKey> out;
    for (NodeId k : n.items) {
      DcpPathKey key;
      if (a_[k].kind == Kind::kStr) {
        key.key = a_[k].text;
      } else if (a_[k].kind == Kind::kInt) {
        key.is_index = true;
        key.index = a_[k].i;
      } else {
        return bad("planner_data of '" + fqn + "' holds a " + std::string(kind_name(a_[k].kind)));
      }
      out.push_back(std::move(key));
    }
    return out;
  }

 private:
  const ValueArena& a_;
  const DcpOptions& o_;
};

}  // namespace

Status parse_dcp_metadata(Bytes data, const DcpOptions& options, DcpParsed& out) {
  if (data.size() > options.dcp.max_metadata_bytes)
    return make_error(ErrorCode::kLimitExceeded, "DCP metadata larger than max_metadata_bytes");
  ValueArena arena;
  DcpHooks hooks(arena);
  PickleOptions po;
  po.limits = options.limits;
  po.record = ".metadata";
  SAFECKPT_TRY(PickleResult pr, run_pickle(data, arena, hooks, nullptr, po));
  if (pr.end_offset != data.size()) return make_error(ErrorCode::kMalformed, "DCP metadata: bytes after STOP");
  Reader r(arena, options);

  SAFECKPT_TRY(auto md, r.fields(pr.root, kMetadata,
                                 {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"}));
  if (!md.count("state_dict_metadata") || !md.count("storage_data"))
    return r.bad("Metadata without state_dict_metadata or storage_data");
  if (md.count("version") && !r.is_none(md["version"])) {
    SAFECKPT_TRY(out.version, r.str(md["version"], "Metadata.version"));
  }
  if (md.count("storage_meta") && !r.is_none(md["storage_meta"])) {
    SAFECKPT_TRY(auto sm,
                 r.fields(md["storage_meta"], kStorageMeta, {"checkpoint_id", "save_id", "load_id", "modules"}));
    if (sm.count("checkpoint_id") && !r.is_none(sm["checkpoint_id"])) {
      SAFECKPT_TRY(out.checkpoint_id, r.str(sm["checkpoint_id"], "StorageMeta.checkpoint_id"));
    }
    for (const char* f : {"save_id", "load_id"})
      if (sm.count(f) && !r.is_none(sm[f])) {
        SAFECKPT_TRY(auto ignored, r.str(sm[f], std::string("StorageMeta.") + f));
        (void)ignored;
      }
    if (sm.count("modules")) {
      const Node& m = arena[sm["modules"]];
      if (m.kind != Kind::kList) return r.bad("StorageMeta.modules is not a list");
      for (NodeId s : m.items) {
        SAFECKPT_TRY(auto ignored, r.str(s, "StorageMeta.modules item"));
        (void)ignored;
      }
    }
  }

  // planner_data: fqn -> path tuple (or None / absent).
  std::map<std::string, std::vector<DcpPathKey>> paths;
  if (md.count("planner_data") && !r.is_none(md["planner_data"])) {
    const Node& pd = arena[md["planner_data"]];
    if (pd.kind != Kind::kDict) return r.bad("planner_data is not a dict");
    for (std::size_t i = 0; i + 1 < pd.items.size(); i += 2) {
      SAFECKPT_TRY(std::string fqn, r.str(pd.items[i], "planner_data key"));
      SAFECKPT_TRY(paths[fqn], r.path(pd.items[i + 1], fqn));
    }
  }

  // storage_data: (fqn, offsets | None) -> _StorageInfo.
  const Node& sd = arena[md["storage_data"]];
  if (sd.kind != Kind::kDict) return r.bad("storage_data is not a dict");
  for (std::size_t i = 0; i + 1 < sd.items.size(); i += 2) {
    SAFECKPT_TRY(auto mi, r.fields(sd.items[i], kIndex, {"fqn", "offset", "index"}));
    if (!mi.count("fqn")) return r.bad("MetadataIndex without fqn");
    DcpStorageEntry e;
    SAFECKPT_TRY(e.fqn, r.str(mi["fqn"], "MetadataIndex.fqn"));
    if (mi.count("offset") && !r.is_none(mi["offset"])) {
      e.has_offset = true;
      SAFECKPT_TRY(e.offsets, r.size(mi["offset"], "MetadataIndex.offset of '" + e.fqn + "'"));
    }
    if (mi.count("index") && !r.is_none(mi["index"])) {
      SAFECKPT_TRY(auto ignored, r.integer(mi["index"], "MetadataIndex.index of '" + e.fqn + "'"));
      (void)ignored;
    }
    SAFECKPT_TRY(auto si, r.fields(sd.items[i + 1], kStorageInfo,
                                   {"relative_path", "offset", "length", "transform_descriptors"}));
    if (!si.count("relative_path") || !si.count("offset") || !si.count("length"))
      return r.bad("_StorageInfo of '" + e.fqn + "' lacks relative_path, offset or length");
    SAFECKPT_TRY(e.relative_path, r.str(si["relative_path"], "_StorageInfo.relative_path of '" + e.fqn + "'"));
    SAFECKPT_TRY(std::int64_t off, r.integer(si["offset"], "_StorageInfo.offset of '" + e.fqn + "'"));
    SAFECKPT_TRY(std::int64_t len, r.integer(si["length"], "_StorageInfo.length of '" + e.fqn + "'"));
    if (off < 0 || len < 0) return r.bad("_StorageInfo of '" + e.fqn + "' has a negative offset or length");
    e.offset = static_cast<std::uint64_t>(off);
    e.length = static_cast<std::uint64_t>(len);
    if (si.count("transform_descriptors") && !r.is_none(si["transform_descriptors"])) {
      const Node& td = arena[si["transform_descriptors"]];
      if ((td.kind != Kind::kList && td.kind != Kind::kTuple) || !td.items.empty())
        return make_error(ErrorCode::kUnsupported, "DCP: '" + e.fqn +
                                                       "' is stored through transform extensions (compression); "
                                                       "not supported");
    }
    if (out.storage.size() >= options.dcp.max_chunks + options.dcp.max_items)
      return make_error(ErrorCode::kLimitExceeded, "DCP metadata: more storage entries than max_chunks + max_items");
    out.storage.push_back(std::move(e));
  }

  // state_dict_metadata: fqn -> TensorStorageMetadata | BytesStorageMetadata.
  const Node& sdm = arena[md["state_dict_metadata"]];
  if (sdm.kind != Kind::kDict) return r.bad("state_dict_metadata is not a dict");
  if (sdm.items.size() / 2 > options.dcp.max_items)
    return make_error(ErrorCode::kLimitExceeded, "DCP metadata: more items than max_items");
  std::uint64_t total_chunks = 0;
  for (std::size_t i = 0; i + 1 < sdm.items.size(); i += 2) {
    SAFECKPT_TRY(std::string fqn, r.str(sdm.items[i], "state_dict_metadata key"));
    const Node& v = arena[sdm.items[i + 1]];
    std::vector<DcpPathKey> path;
    if (auto it = paths.find(fqn); it != paths.end()) path = it->second;
    if (v.kind == Kind::kObject && v.text == kBytesMd) {
      SAFECKPT_TRY(auto ignored, r.fields(sdm.items[i + 1], kBytesMd, {}));
      (void)ignored;
      DcpBytesItem b;
      b.fqn = fqn;
      b.path = std::move(path);
      out.items.push_back(DcpItemRef{false, static_cast<std::uint32_t>(out.bytes_items.size())});
      out.bytes_items.push_back(std::move(b));
      continue;
    }
    SAFECKPT_TRY(auto tm, r.fields(sdm.items[i + 1], kTensorMd, {"properties", "size", "chunks"}));
    if (!tm.count("properties") || !tm.count("size") || !tm.count("chunks"))
      return r.bad("TensorStorageMetadata of '" + fqn + "' lacks properties, size or chunks");
    DcpTensor t;
    t.fqn = fqn;
    t.path = std::move(path);
    SAFECKPT_TRY(t.shape, r.size(tm["size"], "size of '" + fqn + "'"));
    // TensorProperties: BUILD state is __getstate__'s 5-tuple.
    const Node& p = arena[tm["properties"]];
    if (p.kind != Kind::kObject || p.text != kProps || p.items.size() != 2 || p.items[1] == kNoNode)
      return r.bad("properties of '" + fqn + "' is not a built TensorProperties");
    const Node& ps = arena[p.items[1]];
    if (ps.kind != Kind::kTuple || ps.items.size() != 5)
      return r.bad("TensorProperties state of '" + fqn + "' is not a 5-tuple");
    const Node& dt = arena[ps.items[0]];
    const Node& lay = arena[ps.items[1]];
    const Node& rg = arena[ps.items[2]];
    const Node& mf = arena[ps.items[3]];
    const Node& pin = arena[ps.items[4]];
    if (dt.kind != Kind::kDtype) return r.bad("TensorProperties.dtype of '" + fqn + "' is not a dtype");
    if (lay.kind != Kind::kLayout) return r.bad("TensorProperties.layout of '" + fqn + "' is not a layout");
    if (lay.text != "strided")
      return make_error(ErrorCode::kUnsupported, "DCP: '" + fqn + "' has layout " + lay.text + " (only strided)");
    if (rg.kind != Kind::kBool || pin.kind != Kind::kBool)
      return r.bad("TensorProperties.requires_grad/pin_memory of '" + fqn + "' is not a bool");
    if (mf.kind != Kind::kObject || mf.text != kMemFormat)
      return r.bad("TensorProperties.memory_format of '" + fqn + "' is not a _MEM_FORMAT_ENCODING");
    t.dtype = static_cast<DType>(dt.i);
    const Node& ch = arena[tm["chunks"]];
    if (ch.kind != Kind::kList) return r.bad("chunks of '" + fqn + "' is not a list");
    total_chunks += ch.items.size();
    if (total_chunks > options.dcp.max_chunks)
      return make_error(ErrorCode::kLimitExceeded, "DCP metadata: more chunks than max_chunks");
    for (NodeId cid : ch.items) {
      SAFECKPT_TRY(auto cm, r.fields(cid, kChunkMd, {"offsets", "sizes"}));
      if (!cm.count("offsets") || !cm.count("sizes")) return r.bad("chunk of '" + fqn + "' lacks offsets or sizes");
      DcpChunk c;
      SAFECKPT_TRY(c.offsets, r.size(cm["offsets"], "chunk offsets of '" + fqn + "'"));
      SAFECKPT_TRY(c.sizes, r.size(cm["sizes"], "chunk sizes of '" + fqn + "'"));
      t.chunks.push_back(std::move(c));
    }
    out.items.push_back(DcpItemRef{true, static_cast<std::uint32_t>(out.tensors.size())});
    out.tensors.push_back(std::move(t));
  }
  return {};
}

const std::vector<std::string_view>& dcp_metadata_globals() {
  static const std::vector<std::string_view> kAll = [] {
    std::vector<std::string_view> v(kDataclasses.begin(), kDataclasses.end());
    v.push_back(kStorageInfo);
    v.insert(v.end(), kCallables.begin(), kCallables.end());
    return v;
  }();
  return kAll;
}

}  // namespace safeckpt
