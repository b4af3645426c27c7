// Rebuild functions of torch._utils (and torch.device, sets). Rules:
// src/torch/object_model.hpp. Argument shapes: torch/_utils.py, torch/_tensor.py,
// torch/nn/parameter.py.
#include <algorithm>
#include <string>

#include "pickle/key.hpp"
#include "torch/hook_args.hpp"
#include "torch/object_model.hpp"

namespace safeckpt {

using hook_args::Args;
using hook_args::bad_args;
using hook_args::is_ordered_or_dict;

// _rebuild_tensor(storage, offset, size, stride)
// _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, backward_hooks[, metadata])
// _rebuild_tensor_v3(storage, offset, size, stride, requires_grad, backward_hooks, dtype[, metadata])
Result<NodeId> TorchHooks::rebuild_strided(const std::vector<NodeId>& v, Builtin which) {
  std::string_view fn = which == Builtin::kRebuildTensor     ? "_rebuild_tensor"
                        : which == Builtin::kRebuildTensorV2 ? "_rebuild_tensor_v2"
                                                             : "_rebuild_tensor_v3";
  Args a{arena_, v, fn};
  std::size_t min_n = which == Builtin::kRebuildTensor ? 4 : which == Builtin::kRebuildTensorV2 ? 6 : 7;
  std::size_t max_n = which == Builtin::kRebuildTensor ? 4 : min_n + 1;
  if (v.size() < min_n || v.size() > max_n)
    return bad_args(fn, "expected " + std::to_string(min_n) + (max_n > min_n ? "-" + std::to_string(max_n) : "") +
                            " arguments, got " + std::to_string(v.size()));
  const Node& st = a.at(0);
  if (st.kind != Kind::kStorage) return bad_args(fn, "first argument must be a storage (persistent id)");
  const StorageInfo& s = t_.storages[static_cast<std::size_t>(st.i)];
  TensorInfo t;
  t.storage = static_cast<std::uint32_t>(st.i);
  t.dtype = s.dtype;
  t.device = "";
  SAFECKPT_TRY(t.storage_offset, a.integer(1, "storage_offset"));
  SAFECKPT_TRY(t.shape, a.int_tuple(2, "size", lim_.max_tensor_rank));
  SAFECKPT_TRY(t.stride, a.int_tuple(3, "stride", lim_.max_tensor_rank));
  if (which != Builtin::kRebuildTensor) {
    SAFECKPT_TRY(t.requires_grad, a.boolean(4, "requires_grad"));
    const Node& hooks = a.at(5);
    if (!is_ordered_or_dict(hooks.kind) && hooks.kind != Kind::kNone)
      return bad_args(fn, "backward_hooks must be an OrderedDict");
    if (!hooks.items.empty()) return bad_args(fn, "backward_hooks must be empty (hooks are never serialized)");
  }
  std::size_t meta_index = 6;
  if (which == Builtin::kRebuildTensorV3) {
    const Node& d = a.at(6);
    if (d.kind != Kind::kDtype) return bad_args(fn, "dtype argument must be a torch dtype");
    if (s.dtype != DType::kUInt8) return bad_args(fn, "_rebuild_tensor_v3 needs an UntypedStorage");
    t.dtype = static_cast<DType>(d.i);
    meta_index = 7;
  } else if (dtype_is_quantized(s.dtype)) {
    return bad_args(fn, "quantized storage used for a plain tensor");
  }
  if (dtype_size(t.dtype) == 0) return make_error(ErrorCode::kUnsupported, "dtype without a byte layout");
  if (v.size() > meta_index) {
    const Node& m = a.at(meta_index);
    if (m.kind != Kind::kDict && m.kind != Kind::kNone) return bad_args(fn, "metadata must be a dict");
    for (std::size_t i = 0; i + 1 < m.items.size(); i += 2) {
      const Node& k = arena_[m.items[i]];
      const Node& val = arena_[m.items[i + 1]];
      if (k.kind != Kind::kStr || val.kind != Kind::kBool) return bad_args(fn, "metadata entries must be str -> bool");
      if (k.text == "conj")
        t.conj = val.flag;
      else if (k.text == "neg")
        t.neg = val.flag;
      else
        return make_error(ErrorCode::kUnsupported, std::string(fn) + ": unknown tensor metadata '" + k.text + "'");
    }
  }
  SAFECKPT_CHECK(check_view(t, s.nbytes));
  return add_tensor(std::move(t));
}

// _rebuild_parameter(data, requires_grad, backward_hooks)
// _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state)
Result<NodeId> TorchHooks::rebuild_parameter(const std::vector<NodeId>& v, bool with_state) {
  std::string_view fn = with_state ? "_rebuild_parameter_with_state" : "_rebuild_parameter";
  Args a{arena_, v, fn};
  if (v.size() != (with_state ? 4u : 3u)) return bad_args(fn, "wrong number of arguments");
  if (a.at(0).kind != Kind::kTensor) return bad_args(fn, "data must be a tensor");
  TensorInfo t = t_.tensors[static_cast<std::size_t>(a.at(0).i)];
  SAFECKPT_TRY(t.requires_grad, a.boolean(1, "requires_grad"));
  const Node& hooks = a.at(2);
  if (!is_ordered_or_dict(hooks.kind) || !hooks.items.empty()) return bad_args(fn, "backward_hooks must be empty");
  t.is_parameter = true;
  if (with_state) t.python_state = v[3];
  // A Parameter is a new tensor object sharing the data tensor's storage.
  return add_tensor(std::move(t));
}

// _rebuild_qtensor(storage, offset, size, stride, quantizer_params, requires_grad, backward_hooks)
Result<NodeId> TorchHooks::rebuild_qtensor(const std::vector<NodeId>& v) {
  std::string_view fn = "_rebuild_qtensor";
  Args a{arena_, v, fn};
  if (v.size() != 7) return bad_args(fn, "expected 7 arguments");
  if (a.at(0).kind != Kind::kStorage) return bad_args(fn, "first argument must be a storage");
  const StorageInfo& s = t_.storages[static_cast<std::size_t>(a.at(0).i)];
  if (!dtype_is_quantized(s.dtype)) return bad_args(fn, "storage is not a quantized storage");
  TensorInfo t;
  t.storage = static_cast<std::uint32_t>(a.at(0).i);
  t.dtype = s.dtype;
  SAFECKPT_TRY(t.storage_offset, a.integer(1, "storage_offset"));
  SAFECKPT_TRY(t.shape, a.int_tuple(2, "size", lim_.max_tensor_rank));
  SAFECKPT_TRY(t.stride, a.int_tuple(3, "stride", lim_.max_tensor_rank));
  SAFECKPT_TRY(t.requires_grad, a.boolean(5, "requires_grad"));
  const Node& q = a.at(4);
  if (q.kind != Kind::kTuple || q.items.empty()) return bad_args(fn, "quantizer_params must be a tuple");
  const Node& scheme = arena_[q.items[0]];
  if (scheme.kind != Kind::kQScheme) return bad_args(fn, "quantizer_params[0] must be a qscheme");
  Args qa{arena_, q.items, fn};
  if (scheme.text == "per_tensor_affine") {
    if (q.items.size() != 3) return bad_args(fn, "per_tensor_affine takes (qscheme, scale, zero_point)");
    t.qscheme = QScheme::kPerTensorAffine;
    SAFECKPT_TRY(t.q_scale, qa.number(1, "scale"));
    SAFECKPT_TRY(t.q_zero_point, qa.integer(2, "zero_point"));
  } else if (scheme.text == "per_channel_affine" || scheme.text == "per_channel_affine_float_qparams") {
    if (q.items.size() != 4) return bad_args(fn, "per-channel takes (qscheme, scales, zero_points, axis)");
    t.qscheme =
        scheme.text == "per_channel_affine" ? QScheme::kPerChannelAffine : QScheme::kPerChannelAffineFloatQParams;
    const Node& sc = arena_[q.items[1]];
    const Node& zp = arena_[q.items[2]];
    if (sc.kind != Kind::kTensor || zp.kind != Kind::kTensor) return bad_args(fn, "scales/zero_points must be tensors");
    t.q_scales = static_cast<std::uint32_t>(sc.i);
    t.q_zero_points = static_cast<std::uint32_t>(zp.i);
    SAFECKPT_TRY(t.q_axis, qa.integer(3, "axis"));
    if (t.q_axis < 0 || static_cast<std::size_t>(t.q_axis) >= std::max<std::size_t>(t.shape.size(), 1))
      return bad_args(fn, "axis out of range");
  } else {
    return make_error(ErrorCode::kUnsupported, std::string(fn) + ": unsupported qscheme " + scheme.text);
  }
  SAFECKPT_CHECK(check_view(t, s.nbytes));
  return add_tensor(std::move(t));
}

// _rebuild_sparse_tensor(layout, data): COO (indices, values, size[, is_coalesced]);
// CSR/CSC/BSR/BSC (compressed_indices, plain_indices, values, size).
// Invariants checked like torch._utils._validate_loaded_sparse_tensors.
Result<NodeId> TorchHooks::rebuild_sparse(const std::vector<NodeId>& v) {
  std::string_view fn = "_rebuild_sparse_tensor";
  if (v.size() != 2) return bad_args(fn, "expected (layout, data)");
  const Node& lay = arena_[v[0]];
  const Node& data = arena_[v[1]];
  if (lay.kind != Kind::kLayout) return bad_args(fn, "first argument must be a layout");
  if (data.kind != Kind::kTuple) return bad_args(fn, "data must be a tuple");
  Args a{arena_, data.items, fn};
  TensorInfo t;
  auto tensor_at = [&](std::size_t i) -> const TensorInfo* {
    const Node& n = a.at(i);
    return n.kind == Kind::kTensor ? &t_.tensors[static_cast<std::size_t>(n.i)] : nullptr;
  };
  if (lay.text == "sparse_coo") {
    if (data.items.size() != 3 && data.items.size() != 4)
      return bad_args(fn, "COO data is (indices, values, size[, coalesced])");
    const TensorInfo* idx = tensor_at(0);
    const TensorInfo* val = tensor_at(1);
    if (!idx || !val) return bad_args(fn, "indices and values must be tensors");
    SAFECKPT_TRY(t.shape, a.int_tuple(2, "size", lim_.max_tensor_rank));
    if (data.items.size() == 4) {
      SAFECKPT_TRY(t.coalesced, a.boolean(3, "is_coalesced"));
    }
    if (idx->dtype != DType::kInt64 || idx->shape.size() != 2)
      return bad_args(fn, "indices must be a 2-D int64 tensor");
    if (val->shape.empty() || val->shape[0] != idx->shape[1]) return bad_args(fn, "values and indices disagree on nnz");
    std::size_t sparse_dim = static_cast<std::size_t>(idx->shape[0]);
    if (sparse_dim + val->shape.size() - 1 != t.shape.size())
      return bad_args(fn, "sparse_dim + dense_dim != len(size)");
    for (std::size_t d = 0; d + 1 < val->shape.size(); ++d)
      if (val->shape[d + 1] != t.shape[sparse_dim + d]) return bad_args(fn, "values' dense shape does not match size");
    t.layout = Layout::kSparseCoo;
    t.dtype = val->dtype;
    t.sparse_parts = {static_cast<std::uint32_t>(a.at(0).i), static_cast<std::uint32_t>(a.at(1).i)};
  } else if (lay.text == "sparse_csr" || lay.text == "sparse_csc" || lay.text == "sparse_bsr" ||
             lay.text == "sparse_bsc") {
    if (data.items.size() != 4)
      return bad_args(fn, "compressed data is (compressed_indices, plain_indices, values, size)");
    const TensorInfo* ci = tensor_at(0);
    const TensorInfo* pi = tensor_at(1);
    const TensorInfo* val = tensor_at(2);
    if (!ci || !pi || !val) return bad_args(fn, "indices and values must be tensors");
    SAFECKPT_TRY(t.shape, a.int_tuple(3, "size", lim_.max_tensor_rank));
    if ((ci->dtype != DType::kInt64 && ci->dtype != DType::kInt32) || ci->dtype != pi->dtype)
      return bad_args(fn, "index tensors must both be int32 or int64");
    if (ci->shape.size() != 1 || pi->shape.size() != 1 || t.shape.size() < 2)
      return make_error(ErrorCode::kUnsupported,
                        std::string(fn) + ": batched compressed sparse tensors are not supported");
    t.layout = lay.text == "sparse_csr"   ? Layout::kSparseCsr
               : lay.text == "sparse_csc" ? Layout::kSparseCsc
               : lay.text == "sparse_bsr" ? Layout::kSparseBsr
                                          : Layout::kSparseBsc;
    t.dtype = val->dtype;
    t.sparse_parts = {static_cast<std::uint32_t>(a.at(0).i), static_cast<std::uint32_t>(a.at(1).i),
                      static_cast<std::uint32_t>(a.at(2).i)};
  } else {
    return make_error(ErrorCode::kUnsupported, std::string(fn) + ": layout " + lay.text);
  }
  for (auto s : t.shape)
    if (s < 0) return bad_args(fn, "negative size");
  return add_tensor(std::move(t));
}

// _rebuild_meta_tensor_no_storage(dtype, size, stride, requires_grad)
Result<NodeId> TorchHooks::rebuild_meta(const std::vector<NodeId>& v) {
  std::string_view fn = "_rebuild_meta_tensor_no_storage";
  Args a{arena_, v, fn};
  if (v.size() != 4) return bad_args(fn, "expected 4 arguments");
  if (a.at(0).kind != Kind::kDtype) return bad_args(fn, "dtype must be a torch dtype");
  TensorInfo t;
  t.dtype = static_cast<DType>(a.at(0).i);
  t.is_meta = true;
  t.device = "meta";
  SAFECKPT_TRY(t.shape, a.int_tuple(1, "size", lim_.max_tensor_rank));
  SAFECKPT_TRY(t.stride, a.int_tuple(2, "stride", lim_.max_tensor_rank));
  SAFECKPT_TRY(t.requires_grad, a.boolean(3, "requires_grad"));
  if (t.shape.size() != t.stride.size()) return bad_args(fn, "size and stride lengths differ");
  for (std::size_t i = 0; i < t.shape.size(); ++i)
    if (t.shape[i] < 0 || t.stride[i] < 0) return bad_args(fn, "negative size or stride");
  return add_tensor(std::move(t));
}

// _rebuild_device_tensor_from_cpu_tensor(cpu_tensor, dtype, device, requires_grad)
Result<NodeId> TorchHooks::rebuild_device_from_cpu(const std::vector<NodeId>& v) {
  std::string_view fn = "_rebuild_device_tensor_from_cpu_tensor";
  Args a{arena_, v, fn};
  if (v.size() != 4) return bad_args(fn, "expected 4 arguments");
  if (a.at(0).kind != Kind::kTensor || a.at(1).kind != Kind::kDtype || a.at(2).kind != Kind::kStr)
    return bad_args(fn, "expected (tensor, dtype, device str, requires_grad)");
  TensorInfo t = t_.tensors[static_cast<std::size_t>(a.at(0).i)];
  if (static_cast<DType>(a.at(1).i) != t.dtype) return bad_args(fn, "dtype differs from the CPU tensor's");
  t.device = a.at(2).text;
  SAFECKPT_TRY(t.requires_grad, a.boolean(3, "requires_grad"));
  return add_tensor(std::move(t));
}

// _rebuild_from_type_v2(func, new_type, args, state): func(*args), then
// as_subclass(new_type) and attribute state. torch.Tensor and nn.Parameter
// are modelled; any other new_type must be a user-allowlisted class (torch's
// add_safe_globals([MyTensor]) case): the tensor keeps its data, the
// subclass's name (TensorInfo::subclass) and its state (python_state);
// nothing of the class is run.
Result<NodeId> TorchHooks::rebuild_from_type_v2(const std::vector<NodeId>& v, const OpContext& ctx) {
  std::string_view fn = "_rebuild_from_type_v2";
  if (v.size() != 4) return bad_args(fn, "expected (func, new_type, args, state)");
  const AllowEntry* type = entry_of(v[1]);
  if (arena_[v[0]].kind != Kind::kGlobal) return bad_args(fn, "func must be a global");
  if (arena_[v[2]].kind != Kind::kTuple) return bad_args(fn, "args must be a tuple");
  if (type != nullptr && type->builtin == Builtin::kDTensor) return rebuild_dtensor(v);
  const bool subclass = type != nullptr && type->user && type->builtin == Builtin::kGeneric;
  if (type == nullptr || (!subclass && type->builtin != Builtin::kTensorClass && type->builtin != Builtin::kParameter))
    return make_error(ErrorCode::kUnsupported, std::string(fn) + ": tensor subclass " + arena_[v[1]].text +
                                                   " is not modelled (allowlist it with --allow FILE / "
                                                   "Allowlist::add to load it as a tensor with its class name)");
  // func must be a rebuild function that makes the tensor itself: nesting
  // _rebuild_from_type_v2 inside its own args would recurse as deep as the
  // file nests tuples (found by fuzz/regressions/load).
  const AllowEntry* func = entry_of(v[0]);
  if (func == nullptr || func->builtin == Builtin::kRebuildFromTypeV2)
    return bad_args(fn, "func must be a tensor rebuild function");
  SAFECKPT_TRY(NodeId inner, call(v[0], v[2], ctx));
  if (arena_[inner].kind != Kind::kTensor) return bad_args(fn, "func did not build a tensor");
  const Node& state = arena_[v[3]];
  bool empty_state = (state.kind == Kind::kDict || state.kind == Kind::kOrderedDict) && state.items.empty();
  bool to_param = type->builtin == Builtin::kParameter;
  if (empty_state && !to_param && !subclass) return inner;
  TensorInfo t = t_.tensors[static_cast<std::size_t>(arena_[inner].i)];
  if (state.kind != Kind::kNone && !empty_state) t.python_state = v[3];
  if (to_param) t.is_parameter = true;
  if (subclass) t.subclass = type->name;
  return add_tensor(std::move(t));
}

Result<NodeId> TorchHooks::make_set(Kind kind, const std::vector<NodeId>& v) {
  Node n;
  n.kind = kind;
  if (v.size() > 1) return bad_args(kind == Kind::kSet ? "set" : "frozenset", "expected at most one iterable");
  if (v.size() == 1) {
    const Node& src = arena_[v[0]];
    if (src.kind != Kind::kList && src.kind != Kind::kTuple && src.kind != Kind::kSet && src.kind != Kind::kFrozenSet)
      return bad_args(kind == Kind::kSet ? "set" : "frozenset", "argument must be a list, tuple or set");
    SAFECKPT_CHECK(charge_items(src.items.size()));
    KeyIndex keys;
    for (NodeId id : src.items) {
      SAFECKPT_TRY(std::string k, keys.key_of(arena_, id, lim_));
      if (keys.find_or_insert(0, k, n.items.size()).inserted) n.items.push_back(id);
    }
  }
  return add(std::move(n));
}

Result<NodeId> TorchHooks::make_device(const std::vector<NodeId>& v) {
  // torch.device(type[, index]) or torch.device("type:index"); torch/csrc/Device.cpp
  static constexpr std::string_view kTypes[] = {
      "cpu",    "cuda", "mps",  "meta", "xpu", "hpu",    "mtia",   "xla",    "ipu",   "privateuseone", "lazy",
      "vulkan", "ve",   "fpga", "maia", "ort", "mkldnn", "opengl", "opencl", "ideep", "hip",           "msnpu"};
  if (v.empty() || v.size() > 2 || arena_[v[0]].kind != Kind::kStr)
    return bad_args("torch.device", "expected (type[, index])");
  std::string s = arena_[v[0]].text;
  std::string type = s, index;
  if (auto c = s.find(':'); c != std::string::npos) {
    type = s.substr(0, c);
    index = s.substr(c + 1);
    if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos)
      return bad_args("torch.device", "invalid device string '" + s + "'");
    if (v.size() == 2) return bad_args("torch.device", "index given twice");
  }
  bool known = false;
  for (auto t : kTypes) known = known || t == type;
  if (!known) return bad_args("torch.device", "unknown device type '" + type + "'");
  if (v.size() == 2) {
    const Node& i = arena_[v[1]];
    if (i.kind == Kind::kInt) {
      if (i.i < 0) return bad_args("torch.device", "negative device index");
      index = std::to_string(i.i);
    } else if (i.kind != Kind::kNone) {
      return bad_args("torch.device", "index must be an int");
    }
  }
  Node n;
  n.kind = Kind::kDevice;
  n.text = index.empty() ? type : type + ":" + index;
  return add(std::move(n));
}

}  // namespace safeckpt
