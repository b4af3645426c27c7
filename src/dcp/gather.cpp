// gather_dtensor_ranks: per-rank torch.save files of DTensors -> full
// tensors (safeckpt/dcp.hpp). The local boxes come from the loader
// (TensorInfo::dtensor, src/torch/dtensor.cpp); this file checks that the
// files together hold every coordinate of each tensor's mesh once, that
// replicas agree, and copies each box into the full tensor.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "dcp/internal.hpp"
#include "safeckpt/builder.hpp"
#include "safeckpt/dcp.hpp"
#include "util/bytes.hpp"

namespace safeckpt {

namespace {

std::string shape_str(const std::vector<std::int64_t>& s) {
  std::string o = "(";
  for (std::size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
  return o + (s.size() == 1 ? ",)" : ")");
}

Unexpected bad(ErrorCode c, const std::string& fqn, const std::string& what) {
  return make_error(c, "gather DTensors: '" + fqn + "': " + what);
}

// FQNs of values that are neither tensors nor containers, in rank 0's tree
// (dicts, lists, tuples walked iteratively; a shared container once).
void non_tensor_leaves(const Checkpoint& ck, std::vector<std::string>& out) {
  const ValueArena& a = ck.values();
  struct Item {
    NodeId id;
    std::string path;
  };
  std::vector<Item> stack{{ck.root(), ""}};
  std::set<NodeId> seen;
  while (!stack.empty() && out.size() < 64) {
    Item it = std::move(stack.back());
    stack.pop_back();
    if (it.id == kNoNode) continue;
    const Node& n = a[it.id];
    const bool dict = n.kind == Kind::kDict || n.kind == Kind::kOrderedDict;
    const bool seq = n.kind == Kind::kList || n.kind == Kind::kTuple;
    if (n.kind == Kind::kTensor) continue;
    if (!dict && !seq) {
      out.push_back(it.path.empty() ? "<root>" : it.path);
      continue;
    }
    if (!seen.insert(it.id).second) continue;
    const std::string prefix = it.path.empty() ? "" : it.path + ".";
    if (dict) {
      for (std::size_t i = 0; i + 1 < n.items.size(); i += 2) {
        const Node& k = a[n.items[i]];
        std::string key = k.kind == Kind::kStr ? k.text : k.kind == Kind::kInt ? std::to_string(k.i) : "<key>";
        stack.push_back({n.items[i + 1], prefix + key});
      }
    } else {
      for (std::size_t i = 0; i < n.items.size(); ++i) stack.push_back({n.items[i], prefix + std::to_string(i)});
    }
  }
}

}  // namespace

Result<Checkpoint> gather_dtensor_ranks(const std::vector<const Checkpoint*>& ranks,
                                        const DTensorGatherOptions& options, std::vector<std::string>* notes) {
  if (ranks.empty()) return make_error(ErrorCode::kInvalidArgument, "gather DTensors: no rank files");
  for (const Checkpoint* c : ranks)
    if (c == nullptr) return make_error(ErrorCode::kInvalidArgument, "gather DTensors: a null checkpoint");
  std::vector<std::string> leaves;
  non_tensor_leaves(*ranks[0], leaves);
  if (!leaves.empty() && !options.drop_non_tensors)
    return make_error(ErrorCode::kUnsupported, "gather DTensors: rank 0's file holds non-tensor values (first: '" +
                                                   leaves[0] + "', " + std::to_string(leaves.size()) +
                                                   (leaves.size() >= 64 ? "+" : "") +
                                                   " in all); only tensors are gathered (drop_non_tensors / "
                                                   "--drop-non-tensors leaves them out)");
  if (notes != nullptr)
    for (const auto& l : leaves) notes->push_back("left out the non-tensor value '" + l + "' of rank 0");

  // name -> tensor index, per rank.
  std::vector<std::map<std::string, std::uint32_t>> by_name(ranks.size());
  std::vector<NamedTensor> order;
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    SAFECKPT_TRY(auto named, ranks[r]->named_tensors());
    for (const auto& nt : named)
      if (!by_name[r].emplace(nt.name, nt.tensor).second)
        return bad(ErrorCode::kMalformed, nt.name, "named twice in rank file " + std::to_string(r));
    if (r == 0) order = std::move(named);
    if (by_name[r].size() != by_name[0].size())
      return make_error(ErrorCode::kInvalidArgument, "gather DTensors: rank file " + std::to_string(r) + " has " +
                                                         std::to_string(by_name[r].size()) + " tensors, rank file 0 " +
                                                         std::to_string(by_name[0].size()));
  }

  CheckpointBuilder b;
  for (const NamedTensor& nt : order) {
    const std::string& fqn = nt.name;
    std::vector<const TensorInfo*> parts(ranks.size());
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      auto it = by_name[r].find(fqn);
      if (it == by_name[r].end())
        return bad(ErrorCode::kInvalidArgument, fqn, "missing from rank file " + std::to_string(r));
      parts[r] = &ranks[r]->tensors()[it->second];
    }
    const TensorInfo& t0 = *parts[0];
    if (!t0.dtensor) {
      for (std::size_t r = 1; r < ranks.size(); ++r)
        if (parts[r]->dtensor) return bad(ErrorCode::kMalformed, fqn, "a DTensor in some rank files, not in others");
      SAFECKPT_TRY(auto bytes, ranks[0]->contiguous_bytes(by_name[0].at(fqn)));
      SAFECKPT_CHECK(b.add_state_dict_tensor(fqn, t0.dtype, t0.shape, std::move(bytes), t0.is_parameter));
      if (notes != nullptr) notes->push_back("'" + fqn + "' is a plain tensor: taken from rank file 0");
      continue;
    }
    const DTensorInfo& d0 = *t0.dtensor;
    for (const auto& p : d0.placements)
      if (p.kind == DTensorPlacement::Kind::kPartial)
        return bad(ErrorCode::kUnsupported, fqn,
                   "a Partial(" + p.reduce_op +
                       ") placement: the full tensor is a reduction of the ranks' values, "
                       "not a gather (not done)");
    std::uint64_t mesh_size = 1;
    for (auto m : d0.mesh_shape)
      if (!util::checked_mul(mesh_size, static_cast<std::uint64_t>(m), mesh_size))
        return bad(ErrorCode::kMalformed, fqn, "the device mesh's rank count overflows");
    if (mesh_size != ranks.size())
      return bad(ErrorCode::kInvalidArgument, fqn,
                 "its device mesh " + shape_str(d0.mesh_shape) + " has " + std::to_string(mesh_size) + " ranks, " +
                     std::to_string(ranks.size()) + " rank files given");
    const std::uint32_t es = dtype_size(t0.dtype);
    std::uint64_t numel = 1;
    for (auto s : d0.global_shape)
      if (!util::checked_mul(numel, static_cast<std::uint64_t>(s), numel))
        return bad(ErrorCode::kMalformed, fqn, "global element count overflows");
    std::uint64_t total = 0;
    if (!util::checked_mul(numel, es, total)) return bad(ErrorCode::kMalformed, fqn, "global byte count overflows");
    std::vector<std::uint8_t> full(total, 0);
    const DcpBox whole_box{std::vector<std::int64_t>(d0.global_shape.size(), 0), d0.global_shape};
    DcpChunk whole_chunk;
    whole_chunk.offsets = whole_box.offsets;
    whole_chunk.sizes = whole_box.sizes;
    std::set<std::vector<std::int64_t>> coords;
    std::set<std::vector<std::int64_t>> boxes;  // offsets + sizes of the boxes written so far
    std::uint64_t covered = 0;
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      const TensorInfo& t = *parts[r];
      if (!t.dtensor) return bad(ErrorCode::kMalformed, fqn, "a DTensor in some rank files, not in others");
      const DTensorInfo& d = *t.dtensor;
      if (t.dtype != t0.dtype || d.global_shape != d0.global_shape || d.mesh_shape != d0.mesh_shape)
        return bad(ErrorCode::kMalformed, fqn, "rank file " + std::to_string(r) + " has another dtype, shape or mesh");
      if (d.placements.size() != d0.placements.size())
        return bad(ErrorCode::kMalformed, fqn, "rank file " + std::to_string(r) + " has other placements");
      for (std::size_t m = 0; m < d.placements.size(); ++m)
        if (d.placements[m].kind != d0.placements[m].kind || d.placements[m].dim != d0.placements[m].dim)
          return bad(ErrorCode::kMalformed, fqn, "rank file " + std::to_string(r) + " has other placements");
      if (!coords.insert(d.coordinate).second)
        return bad(ErrorCode::kInvalidArgument, fqn,
                   "two rank files hold mesh coordinate " + shape_str(d.coordinate) + " (the same rank twice?)");
      SAFECKPT_TRY(auto local, ranks[r]->contiguous_bytes(by_name[r].at(fqn)));
      std::vector<std::int64_t> key = d.global_offset;
      key.insert(key.end(), d.local_shape.begin(), d.local_shape.end());
      std::uint64_t n = 1;
      for (auto s : d.local_shape) n *= static_cast<std::uint64_t>(s);
      const DcpBox box{d.global_offset, d.local_shape};
      if (!boxes.insert(key).second) {
        // A replica of a box already written: its values must be the same.
        if (n > 0 && total > 0) {
          std::vector<std::uint8_t> first(local.size());
          dcp_copy_intersection(box, whole_chunk, full.data(), first.data(), es);
          if (first != local)
            return bad(ErrorCode::kMalformed, fqn,
                       "replicas disagree: rank files hold different values for the box at " +
                           shape_str(d.global_offset) + " (mesh coordinate " + shape_str(d.coordinate) + ")");
        }
        continue;
      }
      covered += n;
      if (n > 0 && total > 0) {
        DcpChunk piece;
        piece.offsets = box.offsets;
        piece.sizes = box.sizes;
        dcp_copy_intersection(whole_box, piece, local.data(), full.data(), es);
      }
    }
    if (covered != numel)
      return bad(
          ErrorCode::kMalformed, fqn,
          "the rank files' shards cover " + std::to_string(covered) + " of " + std::to_string(numel) + " elements");
    SAFECKPT_CHECK(b.add_state_dict_tensor(fqn, t0.dtype, d0.global_shape, std::move(full), t0.is_parameter));
  }
  if (order.empty()) b.set_root(b.container(Kind::kOrderedDict, {}));
  return std::move(b).finish();
}

}  // namespace safeckpt
