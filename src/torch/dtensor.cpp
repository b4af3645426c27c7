// DTensors inside torch.save files (allowlist/dtensor.allow). What is read
// and why: safeckpt/tensor.hpp DTensorInfo. Layouts from PyTorch 2.11:
// torch/distributed/tensor/_api.py (DTensor.__reduce_ex__ through
// Tensor._reduce_ex_internal: _rebuild_from_type_v2 with
// _rebuild_wrapper_subclass and the __slots__ state (None, {"_local_tensor",
// "_spec"})), _dtensor_spec.py (DTensorSpec, TensorMeta, ShardOrderEntry),
// device_mesh.py (DeviceMesh's pickled attributes), placement_types.py (Shard,
// Replicate, Partial; Shard._local_shard_size_and_offset), _utils.py
// (compute_local_shape_and_global_offset). Nothing of those classes is run:
// the spec objects are kObject data (user-allowlisted generic classes) that
// this file reads and checks field by field.
#include <algorithm>
#include <memory>
#include <string>

#include "torch/hook_args.hpp"
#include "torch/object_model.hpp"

namespace safeckpt {

using hook_args::bad_args;

namespace {

constexpr std::string_view kFn = "DTensor";
constexpr std::string_view kSpec = "torch.distributed.tensor._dtensor_spec.DTensorSpec";
constexpr std::string_view kTensorMeta = "torch.distributed.tensor._dtensor_spec.TensorMeta";
constexpr std::string_view kShardOrderEntry = "torch.distributed.tensor._dtensor_spec.ShardOrderEntry";
constexpr std::string_view kMesh = "torch.distributed.device_mesh.DeviceMesh";
constexpr std::string_view kMeshLayout = "torch.distributed._mesh_layout._MeshLayout";
constexpr std::string_view kShard = "torch.distributed.tensor.placement_types.Shard";
constexpr std::string_view kReplicate = "torch.distributed.tensor.placement_types.Replicate";
constexpr std::string_view kPartial = "torch.distributed.tensor.placement_types.Partial";

// Reads the kObject trees the pickle machine built for the spec classes.
class SpecReader {
 public:
  SpecReader(const ValueArena& a, const Limits& lim) : a_(a), lim_(lim) {}

  // `id` must be an object of class `cls` made by NEWOBJ (then BUILD with a
  // dict state, or none). Returns its state dict (kNoNode if none).
  Result<NodeId> object_state(NodeId id, std::string_view cls, std::string_view what) const {
    const Node& n = a_[id];
    if (n.kind != Kind::kObject || n.text != cls)
      return bad_args(kFn, std::string(what) + " must be a " + std::string(cls) + ", got " + describe(n));
    NodeId state = n.items.size() == 2 ? n.items[1] : kNoNode;
    if (state != kNoNode && !hook_args::is_ordered_or_dict(a_[state].kind))
      return bad_args(kFn, std::string(what) + ": state must be a dict");
    return state;
  }
  // The NEWOBJ arguments of an object (its args tuple's items).
  Result<std::vector<NodeId>> object_args(NodeId id) const {
    const Node& n = a_[id];
    if (n.items.empty() || n.items[0] == kNoNode) return std::vector<NodeId>{};
    const Node& args = a_[n.items[0]];
    if (args.kind != Kind::kTuple) return bad_args(kFn, n.text + ": arguments must be a tuple");
    return args.items;
  }
  // Value of attribute `name` in a dict state; kNoNode when absent. Keys must be str.
  Result<NodeId> attr(NodeId state, std::string_view name) const {
    if (state == kNoNode) return kNoNode;
    const Node& s = a_[state];
    for (std::size_t i = 0; i + 1 < s.items.size(); i += 2) {
      const Node& k = a_[s.items[i]];
      if (k.kind != Kind::kStr) return bad_args(kFn, "attribute names must be str");
      if (k.text == name) return s.items[i + 1];
    }
    return kNoNode;
  }
  // Refuses attributes outside `known` (a class's pickled fields in 2.11).
  Status only(NodeId state, std::initializer_list<std::string_view> known, std::string_view cls) const {
    if (state == kNoNode) return {};
    const Node& s = a_[state];
    for (std::size_t i = 0; i + 1 < s.items.size(); i += 2) {
      const Node& k = a_[s.items[i]];
      if (k.kind != Kind::kStr) return bad_args(kFn, "attribute names must be str");
      if (std::find(known.begin(), known.end(), k.text) == known.end())
        return bad_args(kFn, std::string(cls) + " has an attribute '" + k.text + "' PyTorch 2.11 does not pickle");
    }
    return {};
  }
  Result<std::vector<std::int64_t>> ints(NodeId id, std::string_view what) const {
    if (id == kNoNode) return bad_args(kFn, std::string(what) + " is missing");
    std::vector<NodeId> one{id};
    hook_args::Args args{a_, one, kFn};
    return args.int_tuple(0, what, lim_.max_tensor_rank);
  }
  Result<std::int64_t> integer(NodeId id, std::string_view what) const {
    if (id == kNoNode || a_[id].kind != Kind::kInt) return bad_args(kFn, std::string(what) + " must be an int");
    return a_[id].i;
  }
  static std::string describe(const Node& n) {
    return n.kind == Kind::kObject || n.kind == Kind::kGlobal ? n.text : std::string(kind_name(n.kind));
  }

 private:
  const ValueArena& a_;
  const Limits& lim_;
};

Status read_mesh(const SpecReader& r, const ValueArena& a, NodeId mesh, DTensorInfo& d) {
  SAFECKPT_TRY(NodeId ms, r.object_state(mesh, kMesh, "DTensorSpec.mesh"));
  SAFECKPT_CHECK(r.only(ms,
                        {"_device_type", "_layout", "_rank_map", "_mesh_dim_names", "_root_mesh", "_flatten_rank_map",
                         "_thread_id", "_flatten_mapping", "_dim_group_names", "_rank", "_coordinate_on_dim", "_hash"},
                        kMesh));
  SAFECKPT_TRY(NodeId type, r.attr(ms, "_device_type"));
  if (type == kNoNode || a[type].kind != Kind::kStr) return bad_args(kFn, "DeviceMesh._device_type must be a str");
  d.mesh_device_type = a[type].text;
  SAFECKPT_TRY(NodeId layout, r.attr(ms, "_layout"));
  if (layout == kNoNode)
    return make_error(ErrorCode::kUnsupported,
                      "DTensor: a DeviceMesh without _layout (written by a PyTorch before 2.10?) is not modelled");
  SAFECKPT_TRY(NodeId ls, r.object_state(layout, kMeshLayout, "DeviceMesh._layout"));
  SAFECKPT_CHECK(r.only(ls, {"shape", "stride"}, kMeshLayout));
  SAFECKPT_TRY(NodeId shape, r.attr(ls, "shape"));
  SAFECKPT_TRY(d.mesh_shape, r.ints(shape, "_MeshLayout.shape"));
  if (d.mesh_shape.empty()) return bad_args(kFn, "the device mesh has no dimensions");
  for (auto s : d.mesh_shape)
    if (s <= 0) return bad_args(kFn, "mesh dimension of size " + std::to_string(s));
  SAFECKPT_TRY(NodeId names, r.attr(ms, "_mesh_dim_names"));
  if (names != kNoNode && a[names].kind != Kind::kNone) {
    if (a[names].kind != Kind::kTuple || a[names].items.size() != d.mesh_shape.size())
      return bad_args(kFn, "DeviceMesh._mesh_dim_names must be None or one str per mesh dimension");
    for (NodeId n : a[names].items) {
      if (a[n].kind != Kind::kStr) return bad_args(kFn, "DeviceMesh._mesh_dim_names must hold str");
      d.mesh_dim_names.push_back(a[n].text);
    }
  }
  SAFECKPT_TRY(NodeId rank, r.attr(ms, "_rank"));
  SAFECKPT_TRY(d.rank, r.integer(rank, "DeviceMesh._rank"));
  if (d.rank < 0) return bad_args(kFn, "negative DeviceMesh._rank");
  SAFECKPT_TRY(NodeId coord, r.attr(ms, "_coordinate_on_dim"));
  if (coord == kNoNode || a[coord].kind == Kind::kNone)
    return bad_args(kFn, "the writer's rank is not in the device mesh (_coordinate_on_dim is None): no local shard");
  SAFECKPT_TRY(d.coordinate, r.ints(coord, "DeviceMesh._coordinate_on_dim"));
  return {};
}

Status read_placements(const SpecReader& r, const ValueArena& a, NodeId pl, DTensorInfo& d) {
  if (pl == kNoNode || a[pl].kind != Kind::kTuple) return bad_args(kFn, "DTensorSpec.placements must be a tuple");
  for (NodeId p : a[pl].items) {
    const Node& n = a[p];
    DTensorPlacement out;
    if (n.kind == Kind::kObject && n.text == kShard) {
      SAFECKPT_TRY(NodeId st, r.object_state(p, kShard, "placement"));
      SAFECKPT_CHECK(r.only(st, {"dim"}, kShard));
      SAFECKPT_TRY(NodeId dim, r.attr(st, "dim"));
      out.kind = DTensorPlacement::Kind::kShard;
      SAFECKPT_TRY(out.dim, r.integer(dim, "Shard.dim"));
    } else if (n.kind == Kind::kObject && n.text == kReplicate) {
      SAFECKPT_TRY(NodeId st, r.object_state(p, kReplicate, "placement"));
      SAFECKPT_CHECK(r.only(st, {}, kReplicate));
      out.kind = DTensorPlacement::Kind::kReplicate;
    } else if (n.kind == Kind::kObject && n.text == kPartial) {
      SAFECKPT_TRY(NodeId st, r.object_state(p, kPartial, "placement"));
      SAFECKPT_CHECK(r.only(st, {"reduce_op"}, kPartial));
      SAFECKPT_TRY(NodeId op, r.attr(st, "reduce_op"));
      if (op == kNoNode || a[op].kind != Kind::kStr) return bad_args(kFn, "Partial.reduce_op must be a str");
      out.kind = DTensorPlacement::Kind::kPartial;
      out.reduce_op = a[op].text;
    } else {
      return bad_args(kFn, "a placement must be Shard, Replicate or Partial, got " + SpecReader::describe(n));
    }
    d.placements.push_back(std::move(out));
  }
  if (d.placements.size() != d.mesh_shape.size())
    return bad_args(kFn, std::to_string(d.placements.size()) + " placements for a mesh of " +
                             std::to_string(d.mesh_shape.size()) + " dimensions");
  return {};
}

// shard_order (2.10+): which mesh dimensions shard each tensor dimension, in
// order. Only the default order (ascending mesh dimensions, what
// compute_local_shape_and_global_offset assumes without it) is modelled.
Status read_shard_order(const SpecReader& r, const ValueArena& a, NodeId so, NodeId strided_flag,
                        const DTensorInfo& d) {
  if (strided_flag != kNoNode && !(a[strided_flag].kind == Kind::kBool && !a[strided_flag].flag))
    return make_error(ErrorCode::kUnsupported,
                      "DTensor: use_strided_shard_as_shard_order is set (_StridedShard layouts are not modelled)");
  if (so == kNoNode || a[so].kind == Kind::kNone) return {};
  if (a[so].kind != Kind::kTuple) return bad_args(kFn, "DTensorSpec.shard_order must be a tuple");
  for (NodeId e : a[so].items) {
    SAFECKPT_TRY(NodeId st, r.object_state(e, kShardOrderEntry, "shard_order entry"));
    if (st != kNoNode) return bad_args(kFn, "ShardOrderEntry has a BUILD state");
    SAFECKPT_TRY(auto args, r.object_args(e));
    if (args.size() != 2) return bad_args(kFn, "ShardOrderEntry must be (tensor_dim, mesh_dims)");
    SAFECKPT_TRY(std::int64_t tdim, r.integer(args[0], "ShardOrderEntry.tensor_dim"));
    SAFECKPT_TRY(auto mdims, r.ints(args[1], "ShardOrderEntry.mesh_dims"));
    for (std::size_t i = 0; i < mdims.size(); ++i) {
      auto m = mdims[i];
      if (m < 0 || static_cast<std::size_t>(m) >= d.placements.size() ||
          d.placements[static_cast<std::size_t>(m)].kind != DTensorPlacement::Kind::kShard ||
          d.placements[static_cast<std::size_t>(m)].dim != tdim)
        return bad_args(kFn, "shard_order names mesh dimension " + std::to_string(m) +
                                 ", which does not shard tensor dimension " + std::to_string(tdim));
      if (i > 0 && mdims[i - 1] >= m)
        return make_error(ErrorCode::kUnsupported,
                          "DTensor: a shard_order other than ascending mesh dimensions "
                          "(tensor dimension " +
                              std::to_string(tdim) + ") is not modelled");
    }
  }
  return {};
}

}  // namespace

Status compute_dtensor_box(DTensorInfo& d) {
  const std::size_t rank = d.global_shape.size();
  if (d.coordinate.size() != d.mesh_shape.size() || d.placements.size() != d.mesh_shape.size())
    return bad_args(kFn, "coordinate, placements and mesh shape have different lengths");
  d.local_shape = d.global_shape;
  d.global_offset.assign(rank, 0);
  for (std::size_t m = 0; m < d.mesh_shape.size(); ++m) {
    const std::int64_t n = d.mesh_shape[m], c = d.coordinate[m];
    if (c < 0 || c >= n)
      return bad_args(kFn, "coordinate " + std::to_string(c) + " outside mesh dimension " + std::to_string(m) +
                               " of size " + std::to_string(n));
    const DTensorPlacement& p = d.placements[m];
    if (p.kind != DTensorPlacement::Kind::kShard) continue;
    if (p.dim < 0 || static_cast<std::size_t>(p.dim) >= rank)
      return bad_args(kFn, "Shard(dim=" + std::to_string(p.dim) + ") of a " + std::to_string(rank) + "-d tensor");
    const auto dim = static_cast<std::size_t>(p.dim);
    // Shard._local_shard_size_and_offset: torch.chunk's ceil(size / n) per
    // coordinate; coordinates past the end get 0 rows at offset `size`.
    const std::int64_t size = d.local_shape[dim];
    const std::int64_t chunk = size / n + (size % n != 0 ? 1 : 0);
    // min(chunk * c, size) without overflowing (sizes come from the file).
    const std::int64_t start = chunk == 0 || c > size / chunk ? size : std::min(chunk * c, size);
    d.local_shape[dim] = std::min(chunk, size - start);
    d.global_offset[dim] += start;
  }
  return {};
}

// _rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, args, state).
Result<NodeId> TorchHooks::rebuild_dtensor(const std::vector<NodeId>& v) {
  const AllowEntry* func = entry_of(v[0]);
  if (func == nullptr || func->builtin != Builtin::kRebuildWrapperSubclass)
    return bad_args(kFn, "func must be torch._utils._rebuild_wrapper_subclass");
  // (cls, dtype, size, stride, storage_offset, layout, device, requires_grad)
  const std::vector<NodeId>& w = arena_[v[2]].items;
  hook_args::Args a{arena_, w, "_rebuild_wrapper_subclass"};
  if (w.size() != 8)
    return bad_args(kFn,
                    "wrapper arguments must be (cls, dtype, size, stride, offset, layout, "
                    "device, requires_grad)");
  const AllowEntry* cls = entry_of(w[0]);
  if (cls == nullptr || cls->builtin != Builtin::kDTensor) return bad_args(kFn, "wrapper class must be DTensor");
  if (a.at(1).kind != Kind::kDtype) return bad_args(kFn, "wrapper dtype must be a torch dtype");
  const auto dtype = static_cast<DType>(a.at(1).i);
  auto d = std::make_shared<DTensorInfo>();
  SAFECKPT_TRY(d->global_shape, a.int_tuple(2, "size", lim_.max_tensor_rank));
  SAFECKPT_TRY(d->global_stride, a.int_tuple(3, "stride", lim_.max_tensor_rank));
  if (d->global_stride.size() != d->global_shape.size()) return bad_args(kFn, "size and stride lengths differ");
  for (auto s : d->global_shape)
    if (s < 0) return bad_args(kFn, "negative global size");
  SAFECKPT_TRY(std::int64_t offset, a.integer(4, "storage_offset"));
  if (offset != 0) return bad_args(kFn, "a DTensor wrapper has storage_offset 0");
  if (a.at(5).kind != Kind::kLayout || a.at(5).text != "strided")
    return make_error(ErrorCode::kUnsupported, "DTensor: only strided DTensors are modelled");
  if (a.at(6).kind != Kind::kDevice) return bad_args(kFn, "wrapper device must be a torch.device");
  SAFECKPT_TRY(bool requires_grad, a.boolean(7, "requires_grad"));

  // State: DTensor's __slots__, as (None, {slots}) or a dict.
  const SpecReader r(arena_, lim_);
  NodeId slots = v[3];
  if (arena_[slots].kind == Kind::kTuple) {
    const auto& t = arena_[slots].items;
    if (t.size() != 2 || !(arena_[t[0]].kind == Kind::kNone ||
                           (hook_args::is_ordered_or_dict(arena_[t[0]].kind) && arena_[t[0]].items.empty())))
      return bad_args(kFn, "state must be (None, {slots})");
    slots = t[1];
  }
  if (!hook_args::is_ordered_or_dict(arena_[slots].kind)) return bad_args(kFn, "state slots must be a dict");
  SAFECKPT_CHECK(r.only(slots, {"_local_tensor", "_spec"}, "DTensor"));
  SAFECKPT_TRY(NodeId local, r.attr(slots, "_local_tensor"));
  SAFECKPT_TRY(NodeId spec, r.attr(slots, "_spec"));
  if (local == kNoNode || arena_[local].kind != Kind::kTensor) return bad_args(kFn, "_local_tensor must be a tensor");
  if (spec == kNoNode) return bad_args(kFn, "_spec is missing");
  SAFECKPT_TRY(NodeId ss, r.object_state(spec, kSpec, "_spec"));
  SAFECKPT_CHECK(r.only(
      ss, {"mesh", "placements", "tensor_meta", "shard_order", "use_strided_shard_as_shard_order", "_hash"}, kSpec));
  SAFECKPT_TRY(NodeId mesh, r.attr(ss, "mesh"));
  if (mesh == kNoNode) return bad_args(kFn, "DTensorSpec.mesh is missing");
  SAFECKPT_CHECK(read_mesh(r, arena_, mesh, *d));
  SAFECKPT_TRY(NodeId pl, r.attr(ss, "placements"));
  SAFECKPT_CHECK(read_placements(r, arena_, pl, *d));
  SAFECKPT_TRY(NodeId so, r.attr(ss, "shard_order"));
  SAFECKPT_TRY(NodeId strided, r.attr(ss, "use_strided_shard_as_shard_order"));
  SAFECKPT_CHECK(read_shard_order(r, arena_, so, strided, *d));
  // tensor_meta (a NamedTuple NEWOBJ'd with (shape, stride, dtype)) must agree with the wrapper.
  SAFECKPT_TRY(NodeId meta, r.attr(ss, "tensor_meta"));
  if (meta != kNoNode && arena_[meta].kind != Kind::kNone) {
    SAFECKPT_TRY(NodeId ms, r.object_state(meta, kTensorMeta, "DTensorSpec.tensor_meta"));
    if (ms != kNoNode) return bad_args(kFn, "TensorMeta has a BUILD state");
    SAFECKPT_TRY(auto margs, r.object_args(meta));
    if (margs.size() != 3) return bad_args(kFn, "TensorMeta must be (shape, stride, dtype)");
    SAFECKPT_TRY(auto mshape, r.ints(margs[0], "TensorMeta.shape"));
    SAFECKPT_TRY(auto mstride, r.ints(margs[1], "TensorMeta.stride"));
    if (mshape != d->global_shape || mstride != d->global_stride || arena_[margs[2]].kind != Kind::kDtype ||
        static_cast<DType>(arena_[margs[2]].i) != dtype)
      return bad_args(kFn, "TensorMeta differs from the wrapper's size, stride or dtype");
  }
  SAFECKPT_CHECK(compute_dtensor_box(*d));
  TensorInfo t = t_.tensors[static_cast<std::size_t>(arena_[local].i)];
  if (t.dtensor) return bad_args(kFn, "_local_tensor is itself a DTensor");
  if (t.dtype != dtype) return bad_args(kFn, "the local tensor's dtype differs from the DTensor's");
  if (t.shape != d->local_shape) {
    auto str = [](const std::vector<std::int64_t>& s) {
      std::string o = "[";
      for (std::size_t i = 0; i < s.size(); ++i) o += (i ? ", " : "") + std::to_string(s[i]);
      return o + "]";
    };
    return bad_args(kFn, "the local tensor has shape " + str(t.shape) + ", the placements give " + str(d->local_shape) +
                             " at mesh coordinate " + str(d->coordinate));
  }
  t.requires_grad = requires_grad;
  t.dtensor = std::move(d);
  return add_tensor(std::move(t));
}

}  // namespace safeckpt
