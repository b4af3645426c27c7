// Torch object model. Rules: src/torch/object_model.hpp. Argument shapes:
// torch/_utils.py (rebuild functions), torch/_tensor.py, torch/nn/parameter.py,
// torch/serialization.py (persistent ids), torch/_weights_only_unpickler.py.
#include "torch/object_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "pickle/key.hpp"

namespace safeckpt {
namespace {

Unexpected bad_args(std::string_view fn, std::string_view what) {
  return make_error(ErrorCode::kMalformed, std::string(fn) + ": " + std::string(what));
}

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (a != 0 && b > UINT64_MAX / a) return false;
  out = a * b;
  return true;
}
bool checked_add(std::uint64_t a, std::uint64_t b, std::uint64_t& out) {
  if (b > UINT64_MAX - a) return false;
  out = a + b;
  return true;
}

}  // namespace

std::uint64_t TensorInfo::numel() const noexcept {
  std::uint64_t n = 1;
  for (auto s : shape) n *= static_cast<std::uint64_t>(s);
  return n;
}

Result<NodeId> TorchHooks::add(Node n) {
  if (arena_.size() >= lim_.max_nodes) return make_error(ErrorCode::kLimitExceeded, "more than max_nodes values");
  return arena_.add(std::move(n));
}

// The budget's per-tensor charge must stay an upper bound of the real cost.
static_assert(2 * sizeof(TensorInfo) <= MemoryBudget::kTensorBytes);

Status TorchHooks::charge(std::uint64_t bytes, const char* what) {
  if (budget_ == nullptr) return {};
  return budget_->charge(bytes, what);
}

Status TorchHooks::charge_tensor(const TensorInfo& t) {
  return charge(MemoryBudget::kTensorBytes + 2 * sizeof(std::int64_t) * (t.shape.size() + t.stride.size()) +
                    4 * t.sparse_parts.size() + t.device.size(),
                "tensor metadata");
}

Result<NodeId> TorchHooks::add_tensor(TensorInfo t) {
  if (t_.tensors.size() >= lim_.max_tensors)
    return make_error(ErrorCode::kLimitExceeded,
                      "more than max_tensors (" + std::to_string(lim_.max_tensors) + ") tensors");
  SAFECKPT_CHECK(charge_tensor(t));
  t_.tensors.push_back(std::move(t));
  Node n;
  n.kind = Kind::kTensor;
  n.i = static_cast<std::int64_t>(t_.tensors.size() - 1);
  return add(std::move(n));
}

Status TorchHooks::charge_items(std::size_t n) {
  copied_items_ += n;
  if (copied_items_ > lim_.max_nodes)
    return make_error(ErrorCode::kLimitExceeded, "containers copied by constructors exceed max_nodes items");
  return {};
}

const AllowEntry* TorchHooks::entry_of(NodeId g) const {
  const Node& n = arena_[g];
  if (n.kind != Kind::kGlobal || n.i < 0) return nullptr;
  return allow_.find(n.text);
}

Result<NodeId> TorchHooks::resolve_global(std::string_view name, const OpContext&) {
  if (Allowlist::is_blocked(name)) return make_error(ErrorCode::kDisallowedGlobal, allow_hint(name));
  const AllowEntry* e = allow_.find(name);
  if (e == nullptr) return make_error(ErrorCode::kDisallowedGlobal, allow_hint(name));
  Node n;
  if (e->builtin == Builtin::kDtype) {
    n.kind = Kind::kDtype;
    n.i = static_cast<std::int64_t>(e->dtype);
    n.text = std::string(dtype_name(e->dtype));
    return add(std::move(n));
  }
  if (e->builtin == Builtin::kQScheme) {
    n.kind = Kind::kQScheme;
    n.text = std::string(name.substr(name.rfind('.') + 1));
    return add(std::move(n));
  }
  n.kind = Kind::kGlobal;
  n.text = std::string(name);
  n.i = static_cast<std::int64_t>(e->builtin);
  return add(std::move(n));
}

Status TorchHooks::require_builtin(std::string_view name, const OpContext&) {
  if (allow_.find(name) == nullptr) return make_error(ErrorCode::kDisallowedGlobal, allow_hint(name));
  return {};
}

// ---- helpers on argument nodes ------------------------------------------------

namespace {

struct Args {
  const ValueArena& a;
  const std::vector<NodeId>& v;
  std::string_view fn;
  const Node& at(std::size_t i) const { return a[v[i]]; }
  Result<std::int64_t> integer(std::size_t i, std::string_view what) const {
    const Node& n = at(i);
    if (n.kind == Kind::kInt) return n.i;
    if (n.kind == Kind::kBool) return n.flag ? 1 : 0;
    return bad_args(fn, std::string(what) + " must be an int, got " + std::string(kind_name(n.kind)));
  }
  Result<bool> boolean(std::size_t i, std::string_view what) const {
    const Node& n = at(i);
    if (n.kind == Kind::kBool) return n.flag;
    return bad_args(fn, std::string(what) + " must be a bool, got " + std::string(kind_name(n.kind)));
  }
  Result<double> number(std::size_t i, std::string_view what) const {
    const Node& n = at(i);
    if (n.kind == Kind::kFloat) return n.re;
    if (n.kind == Kind::kInt) return static_cast<double>(n.i);
    if (n.kind == Kind::kBool) return n.flag ? 1.0 : 0.0;
    return bad_args(fn, std::string(what) + " must be a number, got " + std::string(kind_name(n.kind)));
  }
  Result<std::vector<std::int64_t>> int_tuple(std::size_t i, std::string_view what, std::uint64_t max_len) const {
    const Node& n = at(i);
    if (n.kind != Kind::kTuple && n.kind != Kind::kSize && n.kind != Kind::kList)
      return bad_args(fn, std::string(what) + " must be a tuple of ints, got " + std::string(kind_name(n.kind)));
    if (n.items.size() > max_len)
      return make_error(ErrorCode::kLimitExceeded, std::string(fn) + ": " + std::string(what) + " has " +
                                                       std::to_string(n.items.size()) +
                                                       " dimensions (max_tensor_rank " + std::to_string(max_len) + ")");
    std::vector<std::int64_t> out;
    out.reserve(n.items.size());
    for (NodeId id : n.items) {
      const Node& e = a[id];
      if (e.kind != Kind::kInt) return bad_args(fn, std::string(what) + " must contain ints");
      out.push_back(e.i);
    }
    return out;
  }
};

bool is_ordered_or_dict(Kind k) {
  return k == Kind::kOrderedDict || k == Kind::kDict;
}

}  // namespace

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

Result<NodeId> TorchHooks::call(NodeId callable, NodeId args_id, const OpContext& ctx) {
  budget_ = ctx.budget;
  const AllowEntry* e = entry_of(callable);
  if (e == nullptr)
    return make_error(ErrorCode::kDisallowedOperation,
                      "Trying to call reduce for unrecognized function " +
                          (arena_[callable].kind == Kind::kGlobal ? arena_[callable].text
                                                                  : std::string(kind_name(arena_[callable].kind))));
  const std::vector<NodeId> v = arena_[args_id].items;  // copy: arena may grow
  Args a{arena_, v, e->name};
  Node n;
  switch (e->builtin) {
    case Builtin::kOrderedDict:
    case Builtin::kCounter: {
      n.kind = e->builtin == Builtin::kOrderedDict ? Kind::kOrderedDict : Kind::kCounter;
      if (v.size() > 1) return bad_args(e->name, "expected at most one argument");
      if (v.size() == 1) {
        const Node& src = arena_[v[0]];
        KeyIndex keys;
        auto put = [&](NodeId k, NodeId val) -> Status {
          SAFECKPT_TRY(std::string key, keys.key_of(arena_, k, lim_));
          auto slot = keys.find_or_insert(0, key, n.items.size() / 2);
          if (slot.inserted) {
            n.items.push_back(k);
            n.items.push_back(val);
          } else {
            n.items[2 * slot.index + 1] = val;
          }
          return {};
        };
        SAFECKPT_CHECK(charge_items(src.items.size()));
        if (src.kind == Kind::kDict || src.kind == Kind::kOrderedDict || src.kind == Kind::kCounter) {
          for (std::size_t i = 0; i + 1 < src.items.size(); i += 2) SAFECKPT_CHECK(put(src.items[i], src.items[i + 1]));
        } else if (src.kind == Kind::kList || src.kind == Kind::kTuple) {
          for (NodeId p : src.items) {
            const Node& pair = arena_[p];
            if (pair.kind != Kind::kTuple && pair.kind != Kind::kList) return bad_args(e->name, "items must be pairs");
            if (pair.items.size() != 2) return bad_args(e->name, "items must be pairs");
            SAFECKPT_CHECK(put(pair.items[0], pair.items[1]));
          }
        } else {
          return bad_args(e->name, "argument must be a dict or a list of pairs");
        }
      }
      return add(std::move(n));
    }
    case Builtin::kSet: return make_set(Kind::kSet, v);
    case Builtin::kFrozenSet: return make_set(Kind::kFrozenSet, v);
    case Builtin::kByteArray: {
      n.kind = Kind::kByteArray;
      if (v.empty()) return add(std::move(n));
      const Node& src = a.at(0);
      if (v.size() == 1 && src.kind == Kind::kBytes) {
        n.text = src.text;
        return add(std::move(n));
      }
      if (v.size() == 2 && src.kind == Kind::kStr && a.at(1).kind == Kind::kStr &&
          (a.at(1).text == "latin-1" || a.at(1).text == "latin1")) {
        return [&]() -> Result<NodeId> {
          // bytearray(str, 'latin-1') encodes like _codecs.encode
          std::string out;
          const std::string& s = src.text;
          for (std::size_t i = 0; i < s.size();) {
            auto c = static_cast<unsigned char>(s[i]);
            std::uint32_t cp;
            std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
            if (i + len > s.size()) return bad_args(e->name, "invalid UTF-8");
            cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
            for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
            if (cp > 0xFF) return bad_args(e->name, "'latin-1' codec can't encode character");
            out.push_back(static_cast<char>(cp));
            i += len;
          }
          Node r;
          r.kind = Kind::kByteArray;
          r.text = std::move(out);
          return add(std::move(r));
        }();
      }
      return bad_args(e->name, "expected (), (bytes,) or (str, 'latin-1')");
    }
    case Builtin::kCodecsEncode: {
      if (v.size() != 2 || a.at(0).kind != Kind::kStr || a.at(1).kind != Kind::kStr ||
          (a.at(1).text != "latin1" && a.at(1).text != "latin-1"))
        return bad_args(e->name, "expected (str, 'latin1')");
      std::string out;
      const std::string& s = a.at(0).text;
      for (std::size_t i = 0; i < s.size();) {
        auto c = static_cast<unsigned char>(s[i]);
        std::size_t len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
        if (i + len > s.size()) return bad_args(e->name, "invalid UTF-8");
        std::uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1Fu) : len == 3 ? (c & 0x0Fu) : (c & 0x07u);
        for (std::size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3Fu);
        if (cp > 0xFF) return bad_args(e->name, "'latin-1' codec can't encode character");
        out.push_back(static_cast<char>(cp));
        i += len;
      }
      n.kind = Kind::kBytes;
      n.text = std::move(out);
      return add(std::move(n));
    }
    case Builtin::kComplex: {
      if (v.empty() || v.size() > 2) return bad_args(e->name, "expected (real[, imag])");
      n.kind = Kind::kComplex;
      SAFECKPT_TRY(n.re, a.number(0, "real"));
      if (v.size() == 2) {
        SAFECKPT_TRY(n.im, a.number(1, "imag"));
      }
      return add(std::move(n));
    }
    case Builtin::kSlice: {
      if (v.empty() || v.size() > 3) return bad_args(e->name, "expected 1-3 arguments");
      SAFECKPT_TRY(NodeId none, add(Node{}));
      n.kind = Kind::kSlice;
      if (v.size() == 1)
        n.items = {none, v[0], none};
      else if (v.size() == 2)
        n.items = {v[0], v[1], none};
      else
        n.items = v;
      return add(std::move(n));
    }
    case Builtin::kSize: {
      if (v.size() > 1) return bad_args(e->name, "expected one tuple");
      n.kind = Kind::kSize;
      if (v.size() == 1) {
        SAFECKPT_TRY(auto dims, a.int_tuple(0, "size", lim_.max_container_items));
        SAFECKPT_CHECK(charge_items(dims.size()));
        n.items = arena_[v[0]].items;
      }
      return add(std::move(n));
    }
    case Builtin::kDevice: return make_device(v);
    case Builtin::kGetLayout: {
      if (v.size() != 1 || a.at(0).kind != Kind::kStr) return bad_args(e->name, "expected (name,)");
      static constexpr std::string_view kLayouts[] = {"torch.strided",    "torch.sparse_coo", "torch.sparse_csr",
                                                      "torch.sparse_csc", "torch.sparse_bsr", "torch.sparse_bsc",
                                                      "torch._mkldnn",    "torch.jagged"};
      bool ok = false;
      for (auto l : kLayouts) ok = ok || l == a.at(0).text;
      if (!ok) return bad_args(e->name, "unknown layout '" + a.at(0).text + "'");
      n.kind = Kind::kLayout;
      n.text = a.at(0).text.substr(6);
      return add(std::move(n));
    }
    case Builtin::kRebuildTensor:
    case Builtin::kRebuildTensorV2:
    case Builtin::kRebuildTensorV3: return rebuild_strided(v, e->builtin);
    case Builtin::kRebuildParameter: return rebuild_parameter(v, false);
    case Builtin::kRebuildParameterWithState: return rebuild_parameter(v, true);
    case Builtin::kRebuildQTensor: return rebuild_qtensor(v);
    case Builtin::kRebuildSparseTensor: return rebuild_sparse(v);
    case Builtin::kRebuildMetaTensorNoStorage: return rebuild_meta(v);
    case Builtin::kRebuildDeviceTensorFromCpuTensor: return rebuild_device_from_cpu(v);
    case Builtin::kRebuildFromTypeV2: return rebuild_from_type_v2(v, ctx);
    case Builtin::kRebuildWrapperSubclass:
    case Builtin::kRebuildDeviceTensorFromNumpy:
      return make_error(ErrorCode::kUnsupported, e->name + " (tensor without a storage layout we can read)");
    case Builtin::kNumpyReconstruct:
    case Builtin::kNumpyScalar:
    case Builtin::kNumpyDtype:
    case Builtin::kNumpyNdarray:
    case Builtin::kNumpyDTypeClass: return numpy_call(e->builtin, callable, v);
    case Builtin::kGeneric: {
      // Allowlisted but not modelled: keep the call as data, never execute it.
      n.kind = Kind::kObject;
      n.text = e->name;
      n.items = {args_id, kNoNode};
      return add(std::move(n));
    }
    case Builtin::kParameter: {
      // torch.nn.Parameter(data[, requires_grad]) as a REDUCE (old files).
      if (v.empty() || v.size() > 2 || a.at(0).kind != Kind::kTensor)
        return bad_args(e->name, "expected (data[, requires_grad])");
      TensorInfo t = t_.tensors[static_cast<std::size_t>(a.at(0).i)];
      t.is_parameter = true;
      t.requires_grad = true;
      if (v.size() == 2) {
        SAFECKPT_TRY(t.requires_grad, a.boolean(1, "requires_grad"));
      }
      return add_tensor(std::move(t));
    }
    default:
      return make_error(ErrorCode::kDisallowedOperation, "Trying to call reduce for unrecognized function " + e->name);
  }
}

Result<NodeId> TorchHooks::new_object(NodeId cls, NodeId args, const OpContext& ctx) {
  budget_ = ctx.budget;
  const AllowEntry* e = entry_of(cls);
  if (e != nullptr && e->builtin == Builtin::kParameter) return call(cls, args, ctx);
  if (e != nullptr && e->user) {
    if (e->builtin == Builtin::kGeneric) {
      Node n;
      n.kind = Kind::kObject;
      n.text = e->name;
      n.items = {args, kNoNode};
      return add(std::move(n));
    }
    return call(cls, args, ctx);
  }
  return make_error(
      ErrorCode::kDisallowedOperation,
      "Can only create new object for nn.Parameter or classes allowlisted via add_safe_globals "
      "(--allow FILE), but got " +
          (arena_[cls].kind == Kind::kGlobal ? arena_[cls].text : std::string(kind_name(arena_[cls].kind))));
}

Status TorchHooks::build(NodeId obj, NodeId state, const OpContext& ctx) {
  budget_ = ctx.budget;
  Node& o = arena_[obj];
  if (o.kind == Kind::kOrderedDict) {
    // OrderedDict.__dict__.update(state): attributes such as `_metadata`.
    const Node& s = arena_[state];
    if (s.kind != Kind::kDict)
      return make_error(ErrorCode::kDisallowedOperation, "OrderedDict BUILD state must be a dict");
    for (std::size_t i = 0; i < s.items.size(); i += 2)
      if (arena_[s.items[i]].kind != Kind::kStr)
        return make_error(ErrorCode::kDisallowedOperation, "attribute names must be str");
    arena_[obj].attrs = state;
    return {};
  }
  if (numpy_objects_.count(obj)) return numpy_build(obj, state);
  if (o.kind == Kind::kObject && o.items.size() == 2) {
    const AllowEntry* e = allow_.find(o.text);
    if (e != nullptr && e->user) {
      arena_[obj].items[1] = state;
      return {};
    }
  }
  return make_error(
      ErrorCode::kDisallowedOperation,
      "Can only build Tensor, Parameter, OrderedDict or types allowlisted via add_safe_globals, but got " +
          (o.kind == Kind::kObject ? o.text : std::string(kind_name(o.kind))));
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

// numpy values (allowlist/numpy.allow), as numpy's own __reduce__ writes them:
//   numpy.dtype(code, False, True) + BUILD (3, order, None, None, None, -1, -1, 0)
//   numpy._core.multiarray.scalar(dtype, bytes)           -> Python number
//   numpy._core.multiarray._reconstruct(ndarray, (0,), b'b') + BUILD
//     (1, shape, dtype, is_fortran, bytes)                  -> tensor
// Object arrays (data is a list of Python objects) are refused.
namespace {

std::optional<DType> numpy_code_dtype(std::string_view code) {
  static constexpr std::pair<std::string_view, DType> kCodes[] = {
      {"f8", DType::kFloat64},   {"f4", DType::kFloat32},    {"f2", DType::kFloat16}, {"i8", DType::kInt64},
      {"i4", DType::kInt32},     {"i2", DType::kInt16},      {"i1", DType::kInt8},    {"u1", DType::kUInt8},
      {"u2", DType::kUInt16},    {"u4", DType::kUInt32},     {"u8", DType::kUInt64},  {"b1", DType::kBool},
      {"c8", DType::kComplex64}, {"c16", DType::kComplex128}};
  for (auto& [c, d] : kCodes)
    if (c == code) return d;
  return std::nullopt;
}

double half_to_double(std::uint16_t h) {
  int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(m + 1024, e - 25);
  return (h & 0x8000) ? -v : v;
}

}  // namespace

Result<NodeId> TorchHooks::numpy_call(Builtin b, NodeId callable, const std::vector<NodeId>& v) {
  const std::string& name = arena_[callable].text;
  if (b == Builtin::kNumpyDtype) {
    if (v.empty() || arena_[v[0]].kind != Kind::kStr) return bad_args(name, "expected (code, align, copy)");
    std::string code = arena_[v[0]].text;
    if (!code.empty() && (code[0] == '<' || code[0] == '>' || code[0] == '|' || code[0] == '=')) code.erase(0, 1);
    if (code == "O")
      return make_error(ErrorCode::kUnsupported, "numpy object dtype (its values are arbitrary pickles)");
    if (!numpy_code_dtype(code))
      return make_error(ErrorCode::kUnsupported, "numpy dtype '" + code + "' is not supported");
    Node n;
    n.kind = Kind::kObject;
    n.text = "numpy.dtype";
    n.items = {kNoNode, kNoNode};
    SAFECKPT_TRY(NodeId id, add(std::move(n)));
    numpy_objects_[id] = NumpyState{false, code, '='};
    return id;
  }
  if (b == Builtin::kNumpyScalar) {
    if (v.size() != 2 || !numpy_objects_.count(v[0]) || numpy_objects_[v[0]].is_array ||
        arena_[v[1]].kind != Kind::kBytes)
      return bad_args(name, "expected (numpy.dtype, bytes)");
    NumpyState st = numpy_objects_[v[0]];
    DType dt = *numpy_code_dtype(st.code);
    std::string raw = arena_[v[1]].text;
    if (raw.size() != dtype_size(dt)) return bad_args(name, "scalar bytes do not match the dtype size");
    if (st.order == '>') std::reverse(raw.begin(), raw.end());
    Node n;
    auto rd = [&](auto& x) { std::memcpy(&x, raw.data(), sizeof x); };
    // The scalar's bytes as a T, stored as a Python float / int.
    auto as_float = [&](auto x) {
      rd(x);
      n.kind = Kind::kFloat;
      n.re = static_cast<double>(x);
    };
    auto as_int = [&](auto x) {
      rd(x);
      n.kind = Kind::kInt;
      n.i = static_cast<std::int64_t>(x);
    };
    switch (dt) {
      case DType::kFloat64: as_float(double{}); break;
      case DType::kFloat32: as_float(float{}); break;
      case DType::kFloat16: {
        std::uint16_t x;
        rd(x);
        n.kind = Kind::kFloat;
        n.re = half_to_double(x);
        break;
      }
      case DType::kInt64: as_int(std::int64_t{}); break;
      case DType::kInt32: as_int(std::int32_t{}); break;
      case DType::kInt16: as_int(std::int16_t{}); break;
      case DType::kInt8: as_int(std::int8_t{}); break;
      case DType::kUInt8: as_int(std::uint8_t{}); break;
      case DType::kUInt16: as_int(std::uint16_t{}); break;
      case DType::kUInt32: as_int(std::uint32_t{}); break;
      case DType::kUInt64: {
        std::uint64_t x;
        rd(x);
        if (x > static_cast<std::uint64_t>(INT64_MAX)) {
          n.kind = Kind::kBigInt;
          n.text = std::to_string(x);
        } else {
          n.kind = Kind::kInt;
          n.i = static_cast<std::int64_t>(x);
        }
        break;
      }
      case DType::kBool:
        n.kind = Kind::kBool;
        n.flag = raw[0] != 0;
        break;
      case DType::kComplex64: {
        float x[2];
        std::memcpy(x, raw.data(), 8);
        n.kind = Kind::kComplex;
        n.re = x[0];
        n.im = x[1];
        break;
      }
      case DType::kComplex128: {
        double x[2];
        std::memcpy(x, raw.data(), 16);
        n.kind = Kind::kComplex;
        n.re = x[0];
        n.im = x[1];
        break;
      }
      default: return make_error(ErrorCode::kUnsupported, "numpy scalar dtype");
    }
    return add(std::move(n));
  }
  if (b == Builtin::kNumpyReconstruct) {
    const AllowEntry* cls = v.empty() ? nullptr : entry_of(v[0]);
    if (v.size() != 3 || cls == nullptr || cls->builtin != Builtin::kNumpyNdarray)
      return bad_args(name, "expected (numpy.ndarray, shape, typecode)");
    Node n;
    n.kind = Kind::kObject;
    n.text = "numpy.ndarray";
    n.items = {kNoNode, kNoNode};
    SAFECKPT_TRY(NodeId id, add(std::move(n)));
    numpy_objects_[id] = NumpyState{true, "", '='};
    return id;
  }
  return make_error(ErrorCode::kDisallowedOperation, "Trying to call reduce for unrecognized function " + name);
}

Status TorchHooks::numpy_build(NodeId obj, NodeId state_id) {
  NumpyState& st = numpy_objects_[obj];
  const Node& state = arena_[state_id];
  if (state.kind != Kind::kTuple) return bad_args("numpy BUILD", "state must be a tuple");
  if (!st.is_array) {
    // dtype state: (version, byteorder, subdescr, names, fields, elsize, alignment, flags)
    if (state.items.size() < 2 || arena_[state.items[1]].kind != Kind::kStr || arena_[state.items[1]].text.size() != 1)
      return bad_args("numpy.dtype BUILD", "expected (version, byteorder, ...)");
    for (std::size_t i = 2; i < std::min<std::size_t>(5, state.items.size()); ++i)
      if (arena_[state.items[i]].kind != Kind::kNone)
        return make_error(ErrorCode::kUnsupported, "structured numpy dtypes are not supported");
    st.order = arena_[state.items[1]].text[0];
    return {};
  }
  // array state: (version, shape, dtype, is_fortran, data)
  if (state.items.size() != 5)
    return bad_args("numpy.ndarray BUILD", "expected (version, shape, dtype, is_fortran, data)");
  std::vector<NodeId> it = state.items;
  Args a{arena_, it, "numpy.ndarray BUILD"};
  TensorInfo t;
  SAFECKPT_TRY(t.shape, a.int_tuple(1, "shape", lim_.max_tensor_rank));
  if (!numpy_objects_.count(it[2]) || numpy_objects_[it[2]].is_array)
    return bad_args("numpy.ndarray BUILD", "dtype expected");
  NumpyState dst = numpy_objects_[it[2]];
  SAFECKPT_TRY(bool fortran, a.boolean(3, "is_fortran"));
  const Node& data = arena_[it[4]];
  if (data.kind != Kind::kBytes)
    return make_error(ErrorCode::kUnsupported, "numpy array data is not raw bytes (object array)");
  t.dtype = *numpy_code_dtype(dst.code);
  std::uint64_t numel = 1;
  for (auto s : t.shape) {
    if (s < 0 || !checked_mul(numel, static_cast<std::uint64_t>(s), numel))
      return bad_args("numpy.ndarray BUILD", "bad shape");
  }
  std::uint64_t nbytes;
  if (!checked_mul(numel, dtype_size(t.dtype), nbytes) || nbytes != data.text.size())
    return bad_args("numpy.ndarray BUILD", "data size does not match shape x itemsize");
  SAFECKPT_CHECK(charge(data.text.size() + MemoryBudget::kStringBytes, "numpy array data"));
  auto buf = std::make_shared<std::vector<std::uint8_t>>(data.text.begin(), data.text.end());
  std::uint32_t unit = dtype_swap_unit(t.dtype);
  if (dst.order == '>' && unit > 1)
    for (std::size_t i = 0; i + unit <= buf->size(); i += unit) std::reverse(buf->begin() + i, buf->begin() + i + unit);
  t.stride.assign(t.shape.size(), 1);
  if (fortran) {
    for (std::size_t d = 1; d < t.shape.size(); ++d)
      t.stride[d] = t.stride[d - 1] * std::max<std::int64_t>(t.shape[d - 1], 1);
  } else {
    for (std::size_t d = t.shape.size(); d-- > 1;)
      t.stride[d - 1] = t.stride[d] * std::max<std::int64_t>(t.shape[d], 1);
  }
  StorageInfo s;
  s.key = "numpy:" + std::to_string(obj);
  s.location = "cpu";
  s.dtype = t.dtype;
  s.nbytes = nbytes;
  s.record = "numpy array in the pickle";
  s.bytes = Bytes(buf->data(), buf->size());
  t_.owned.push_back(std::move(buf));
  t_.storages.push_back(std::move(s));
  t.storage = static_cast<std::uint32_t>(t_.storages.size() - 1);
  if (t_.tensors.size() >= lim_.max_tensors)
    return make_error(ErrorCode::kLimitExceeded, "more than max_tensors tensors");
  SAFECKPT_CHECK(charge_tensor(t));
  t_.tensors.push_back(std::move(t));
  Node& n = arena_[obj];  // the ndarray becomes a tensor node in place (shared refs see it)
  n.kind = Kind::kTensor;
  n.text.clear();
  n.items.clear();
  n.i = static_cast<std::int64_t>(t_.tensors.size() - 1);
  numpy_objects_.erase(obj);
  return {};
}

std::string allow_hint(std::string_view g) {
  std::string name(g);
  if (Allowlist::is_blocked(g))
    return "Unsupported global: GLOBAL " + name + " is " + Allowlist::blocked_reason(g) +
           ". This file tries to run code when unpickled; safeckpt refuses it always (it cannot be allowlisted). "
           "Do not load this file with torch.load(weights_only=False).";
  if (const DangerousGlobal* d = find_dangerous_global(g); d != nullptr && is_known_dangerous(g))
    return "Unsupported global: GLOBAL " + name + " is a known-dangerous callable (" + std::string(d->category) + ": " +
           std::string(d->why) +
           "). This file tries to run code (or build objects the weights-only rules forbid) when unpickled; do "
           "not allowlist it and do not load it with torch.load(weights_only=False).";
  // numpy values: the shipped numpy.allow rebuilds arrays as tensors; a plain
  // line would turn them into opaque objects.
  bool numpy_value = g.rfind("numpy.dtypes.", 0) == 0;
  for (std::string_view n :
       {"numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy._core.multiarray.scalar",
        "numpy.core.multiarray.scalar", "numpy.ndarray", "numpy.dtype"})
    numpy_value = numpy_value || g == n;
  if (numpy_value)
    return "Unsupported global: GLOBAL " + name +
           " was not an allowed global by default (PyTorch's weights-only set). The file holds numpy arrays "
           "or scalars: if you trust it, load it with `--allow allowlist/numpy.allow` (the shipped list, "
           "which rebuilds arrays as tensors and scalars as numbers) or Allowlist::add_file(\"allowlist/"
           "numpy.allow\").";
  return "Unsupported global: GLOBAL " + name +
         " was not an allowed global by default (PyTorch's weights-only set). If you trust this file, "
         "allow it with `--allow FILE` (a line `" +
         name + "`) or Allowlist::add(\"" + name + "\") — the equivalent of torch.serialization.add_safe_globals([" +
         name + "]).";
}

}  // namespace safeckpt
