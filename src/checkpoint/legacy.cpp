// Legacy sequential-pickle checkpoints (torch.save with
// _use_new_zipfile_serialization=False, the default before 1.6).
// torch/serialization.py `_legacy_load`; docs/torch-format.md §3.1.
//
// Accepted grammar, five pickles then raw data, nothing after:
//  1. the magic number 0x1950A86A20F9469CFC6C as an int literal (a value
//     produced by a call is refused by the policy like any other call);
//  2. the protocol version, the int 1001;
//  3. sys_info (any plain value; ignored, as PyTorch ignores it);
//  4. the object, whose storages are 6-tuple persistent ids
//     ("storage", class, key, location, numel, None);
//  5. the list of storage keys (str), each naming a storage of (4) exactly
//     once, every storage of (4) listed;
//  6. per key, in that order: u64 little-endian element count equal to the
//     persistent id's numel, then count x element_size bytes (little-endian).
#include <algorithm>
#include <map>
#include <string>

#include "checkpoint/builder.hpp"
#include "torch/object_model.hpp"
#include "util/bytes.hpp"

namespace safeckpt {
namespace {

constexpr std::string_view kMagic = "119547037146038801333356";  // 0x1950A86A20F9469CFC6C

class LegacyStorages final : public StorageProvider {
 public:
  LegacyStorages(TorchTables& t, const Limits& l) : t_(t), lim_(l) {}
  Result<std::uint32_t> storage(std::string_view key, DType dtype, std::uint64_t nbytes, std::string_view location,
                                const OpContext& ctx) override {
    if (auto it = index_.find(key); it != index_.end()) {
      const StorageInfo& s = t_.storages[it->second];
      if (s.dtype != dtype || s.nbytes != nbytes)
        return make_error(ErrorCode::kMalformed, "storage '" + std::string(key) + "' referenced with different types");
      return it->second;
    }
    if (t_.storages.size() >= lim_.max_legacy_storages)
      return make_error(ErrorCode::kLimitExceeded, "more than max_legacy_storages storages");
    if (ctx.budget != nullptr)
      SAFECKPT_CHECK(ctx.budget->charge(MemoryBudget::kStorageBytes + 3 * key.size(), "storage metadata"));
    if (nbytes > lim_.max_total_storage_bytes - total_)
      return make_error(ErrorCode::kLimitExceeded, "storages exceed max_total_storage_bytes");
    total_ += nbytes;
    StorageInfo s;
    s.key = std::string(key);
    s.location = std::string(location);
    s.dtype = dtype;
    s.nbytes = nbytes;
    s.record = "legacy storage " + std::string(key);
    t_.storages.push_back(std::move(s));
    const auto idx = static_cast<std::uint32_t>(t_.storages.size() - 1);
    index_.emplace(t_.storages.back().key, idx);
    return idx;
  }

  // Storage index by key (the storage-keys pickle is matched against it too).
  std::uint32_t find(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? kNoStorage : it->second;
  }

 private:
  TorchTables& t_;
  const Limits& lim_;
  std::uint64_t total_ = 0;
  // key -> storage: an ordered map, O(log n) whatever the keys (a linear
  // search was quadratic; a hash map with a fixed seed can be flooded with
  // colliding keys from the file).
  std::map<std::string, std::uint32_t, std::less<>> index_;
};

}  // namespace

Result<Checkpoint> load_legacy(LoadBuilder& b, Bytes file, const LoadOptions& opt, const Allowlist& allow) {
  TorchTables tables;
  LegacyStorages storages(tables, opt.limits);
  TorchHooks hooks(b.arena(), tables, allow, &storages, opt.limits, PidForm::kLegacy);
  // One budget for the five streams (they share the arena). Storage data
  // stays in the mapped file: nothing to charge for it.
  MemoryBudget budget(opt.limits.max_memory_bytes);
  std::uint64_t pos = 0;
  auto next = [&](const char* name) -> Result<NodeId> {
    PickleOptions po;
    po.limits = opt.limits;
    po.budget = &budget;
    po.record = std::string("legacy ") + name + " pickle";
    // Each stream is parsed from here to its STOP; storage data follows the
    // last ones, so cap the span rather than the file (a multi-GiB legacy
    // checkpoint has small pickles).
    Bytes rest = file.subspan(pos);
    auto r = run_pickle(rest.first(std::min<std::size_t>(rest.size(), opt.limits.max_pickle_bytes)), b.arena(), hooks,
                        nullptr, po);
    if (!r) {
      Error e = std::move(r).error();
      if (e.where().offset != Location::kNoOffset) e.where().offset += pos;  // report file offsets
      return unexpected(std::move(e));
    }
    pos += r->end_offset;
    return r->root;
  };
  const ValueArena& a = b.arena();
  SAFECKPT_TRY(NodeId magic, next("magic"));
  if (a[magic].kind != Kind::kBigInt || a[magic].text != kMagic)
    return make_error(ErrorCode::kMalformed, "Invalid magic number; corrupt file?", Location{"legacy magic pickle", 0});
  SAFECKPT_TRY(NodeId proto, next("protocol"));
  if (a[proto].kind != Kind::kInt || a[proto].i != 1001)
    return make_error(ErrorCode::kMalformed, "Invalid protocol version (expected 1001)");
  SAFECKPT_TRY(NodeId sys_info, next("sys_info"));
  (void)sys_info;
  SAFECKPT_TRY(NodeId root, next("object"));
  SAFECKPT_TRY(NodeId keys, next("storage keys"));
  if (a[keys].kind != Kind::kList) return make_error(ErrorCode::kMalformed, "storage keys pickle is not a list");
  std::vector<bool> done(tables.storages.size(), false);
  for (NodeId k : a[keys].items) {
    if (a[k].kind != Kind::kStr) return make_error(ErrorCode::kMalformed, "storage key is not a str");
    const std::uint32_t idx = storages.find(a[k].text);
    if (idx == kNoStorage)
      return make_error(ErrorCode::kMalformed, "storage key '" + a[k].text + "' is not used by the object");
    if (done[idx]) return make_error(ErrorCode::kMalformed, "storage key '" + a[k].text + "' listed twice");
    done[idx] = true;
    StorageInfo& s = tables.storages[idx];
    if (file.size() - pos < 8)
      return make_error(ErrorCode::kMalformed, "truncated storage data for key '" + s.key + "'",
                        Location{s.record, pos});
    const std::uint64_t count = util::load_le<std::uint64_t>(file.data() + pos);
    std::uint64_t es = dtype_size(s.dtype);
    if (count != s.nbytes / es)
      return make_error(ErrorCode::kMalformed,
                        "storage has wrong size: expected " + std::to_string(s.nbytes / es) + " elements, file says " +
                            std::to_string(count),
                        Location{s.record, pos});
    pos += 8;
    if (s.nbytes > file.size() - pos)
      return make_error(ErrorCode::kMalformed, "storage data runs past the end of the file", Location{s.record, pos});
    s.file_offset = pos;
    s.bytes = file.subspan(pos, s.nbytes);
    pos += s.nbytes;
  }
  for (std::size_t i = 0; i < done.size(); ++i)
    if (!done[i])
      return make_error(ErrorCode::kMalformed,
                        "storage '" + tables.storages[i].key + "' is missing from the storage keys");
  if (pos != file.size())
    return make_error(ErrorCode::kMalformed, std::to_string(file.size() - pos) + " bytes after the last storage",
                      Location{"legacy file", pos});
  return b.finish(FileFormat::kLegacyPickle, root, std::move(tables));
}

}  // namespace safeckpt
