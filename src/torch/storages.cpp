// Persistent ids (storages) and the view check. Rules: src/torch/object_model.hpp.
// Argument shapes: torch/serialization.py (persistent_load), torch/_utils.py.
#include <string>

#include "torch/hook_args.hpp"
#include "torch/object_model.hpp"
#include "util/bytes.hpp"

namespace safeckpt {

using util::checked_add;
using util::checked_mul;

Status TorchHooks::check_view(const TensorInfo& t, std::uint64_t storage_nbytes) const {
  // Mirrors at::native::checkSetStorage / computeStorageNbytes (and the
  // CVE-2026-24747 fix): every element the view can address lies inside.
  if (t.storage_offset < 0)
    return make_error(ErrorCode::kMalformed, "invalid storage offset " + std::to_string(t.storage_offset));
  if (t.shape.size() != t.stride.size())
    return make_error(ErrorCode::kMalformed, "size and stride have different lengths (" +
                                                 std::to_string(t.shape.size()) + " vs " +
                                                 std::to_string(t.stride.size()) + ")");
  std::uint64_t numel = 1;
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    if (t.shape[i] < 0) return make_error(ErrorCode::kMalformed, "negative size " + std::to_string(t.shape[i]));
    if (t.stride[i] < 0)
      return make_error(ErrorCode::kMalformed, "negative stride " + std::to_string(t.stride[i]) +
                                                   " (PyTorch refuses: storage size calculation overflowed)");
    if (!checked_mul(numel, static_cast<std::uint64_t>(t.shape[i]), numel))
      return make_error(ErrorCode::kMalformed, "tensor element count overflows");
  }
  if (numel == 0) return {};  // zero-numel views pass with any offset/stride (PyTorch)
  std::uint64_t last = static_cast<std::uint64_t>(t.storage_offset);
  for (std::size_t i = 0; i < t.shape.size(); ++i) {
    std::uint64_t span;
    if (!checked_mul(static_cast<std::uint64_t>(t.shape[i] - 1), static_cast<std::uint64_t>(t.stride[i]), span) ||
        !checked_add(last, span, last))
      return make_error(ErrorCode::kMalformed, "view extent overflows");
  }
  std::uint64_t need;
  if (!checked_add(last, 1, need) || !checked_mul(need, dtype_size(t.dtype), need))
    return make_error(ErrorCode::kMalformed, "view extent overflows");
  if (need > storage_nbytes)
    return make_error(ErrorCode::kMalformed, "tensor view needs " + std::to_string(need) +
                                                 " bytes but its storage has " + std::to_string(storage_nbytes) +
                                                 " (view outside its storage)");
  return {};
}

Result<NodeId> TorchHooks::persistent_load(NodeId pid_id, const OpContext& ctx) {
  budget_ = ctx.budget;
  const Node& pid = arena_[pid_id];
  if (pid.kind != Kind::kTuple)
    return make_error(ErrorCode::kDisallowedOperation,
                      "persistent_load id must be a tuple, but got " + std::string(kind_name(pid.kind)));
  std::size_t want = pid_form_ == PidForm::kZip ? 5 : 6;
  const std::vector<NodeId> f = pid.items;
  auto text_of = [&](NodeId id, std::string& out) {
    const Node& n = arena_[id];
    if (n.kind == Kind::kStr) {
      out = n.text;
      return true;
    }
    if (n.kind == Kind::kBytes) {  // py2 files: bytes decoded as ASCII
      for (char c : n.text)
        if (static_cast<unsigned char>(c) > 0x7F) return false;
      out = n.text;
      return true;
    }
    return false;
  };
  std::string tag;
  if (f.empty() || !text_of(f[0], tag) || tag != "storage")
    return make_error(ErrorCode::kDisallowedOperation, "Only persistent_load of storage is allowed");
  if (f.size() != want)
    return make_error(ErrorCode::kMalformed, "storage persistent id must have " + std::to_string(want) +
                                                 " fields, got " + std::to_string(f.size()));
  const AllowEntry* st = entry_of(f[1]);
  DType dtype;
  if (st != nullptr && st->builtin == Builtin::kStorageClass) {
    dtype = st->dtype;
  } else if (st != nullptr && st->builtin == Builtin::kUntypedStorage) {
    dtype = DType::kUInt8;
  } else {
    return make_error(ErrorCode::kMalformed, "persistent id storage type is not a storage class");
  }
  std::string key, location;
  if (!text_of(f[2], key)) {
    if (arena_[f[2]].kind == Kind::kInt)
      key = std::to_string(arena_[f[2]].i);
    else
      return make_error(ErrorCode::kMalformed, "storage key must be a str");
  }
  if (!text_of(f[3], location)) return make_error(ErrorCode::kMalformed, "storage location must be a str");
  const Node& numel = arena_[f[4]];
  if (numel.kind != Kind::kInt || numel.i < 0)
    return make_error(ErrorCode::kMalformed, "storage numel must be an int >= 0");
  if (pid_form_ == PidForm::kLegacy && arena_[f[5]].kind != Kind::kNone)
    return make_error(ErrorCode::kUnsupported, "legacy storage view_metadata (pre-0.4 storage views) is not supported");
  std::uint64_t nbytes;
  if (!checked_mul(static_cast<std::uint64_t>(numel.i), dtype_size(dtype), nbytes) ||
      nbytes > lim_.max_total_storage_bytes)
    return make_error(ErrorCode::kLimitExceeded,
                      "storage of " + std::to_string(numel.i) + " elements exceeds max_total_storage_bytes");
  if (provider_ == nullptr) return make_error(ErrorCode::kMalformed, "a bare pickle cannot reference storages");
  SAFECKPT_TRY(std::uint32_t idx, provider_->storage(key, dtype, nbytes, location, ctx));
  Node n;
  n.kind = Kind::kStorage;
  n.i = idx;
  return add(std::move(n));
}

}  // namespace safeckpt
