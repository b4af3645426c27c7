// CheckpointBuilder: a checked front end over the loaders' CheckpointBuilder.
#include <algorithm>
#include <limits>

#include "safeckpt/builder.hpp"
#include "util/bytes.hpp"

namespace safeckpt {

using util::checked_add;
using util::checked_mul;

namespace {

Unexpected invalid(std::string msg) {
  return make_error(ErrorCode::kInvalidArgument, std::move(msg));
}

}  // namespace

std::optional<std::uint64_t> strided_extent_bytes(const std::vector<std::int64_t>& shape,
                                                  const std::vector<std::int64_t>& stride, std::int64_t storage_offset,
                                                  std::uint32_t element_size) {
  if (shape.size() != stride.size() || storage_offset < 0) return std::nullopt;
  bool empty = false;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0 || stride[i] < 0) return std::nullopt;
    if (shape[i] == 0) empty = true;
  }
  if (empty) return std::uint64_t{0};
  std::uint64_t last = static_cast<std::uint64_t>(storage_offset);
  for (std::size_t i = 0; i < shape.size(); ++i) {
    std::uint64_t span = 0;
    if (!checked_mul(static_cast<std::uint64_t>(shape[i] - 1), static_cast<std::uint64_t>(stride[i]), span) ||
        !checked_add(last, span, last))
      return std::nullopt;
  }
  if (last == std::numeric_limits<std::uint64_t>::max()) return std::nullopt;
  std::uint64_t bytes = 0;
  if (!checked_mul(last + 1, element_size, bytes)) return std::nullopt;
  return bytes;
}

std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> s(shape.size(), 1);
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    // Saturate: such shapes are refused by the checks that follow.
    if (shape[i] > 0 && acc <= std::numeric_limits<std::int64_t>::max() / shape[i]) acc *= shape[i];
  }
  return s;
}

bool is_c_contiguous(const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& stride) {
  if (shape.size() != stride.size()) return false;
  std::int64_t expected = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] == 0) return true;
  }
  for (std::size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    expected *= shape[i];
  }
  return true;
}

CheckpointBuilder::CheckpointBuilder(MappedFile file) {
  *ckpt_.file_ = std::move(file);
}

NodeId CheckpointBuilder::none() {
  return add(Node{});
}
NodeId CheckpointBuilder::boolean(bool v) {
  Node n;
  n.kind = Kind::kBool;
  n.flag = v;
  return add(std::move(n));
}
NodeId CheckpointBuilder::integer(std::int64_t v) {
  Node n;
  n.kind = Kind::kInt;
  n.i = v;
  return add(std::move(n));
}
NodeId CheckpointBuilder::floating(double v) {
  Node n;
  n.kind = Kind::kFloat;
  n.re = v;
  return add(std::move(n));
}
NodeId CheckpointBuilder::str(std::string_view utf8) {
  Node n;
  n.kind = Kind::kStr;
  n.text = std::string(utf8);
  return add(std::move(n));
}
NodeId CheckpointBuilder::bytes(Bytes raw) {
  Node n;
  n.kind = Kind::kBytes;
  n.text.assign(reinterpret_cast<const char*>(raw.data()), raw.size());
  return add(std::move(n));
}
NodeId CheckpointBuilder::container(Kind kind, std::vector<NodeId> items) {
  Node n;
  n.kind = kind;
  n.items = std::move(items);
  return add(std::move(n));
}
NodeId CheckpointBuilder::dtype(DType d) {
  Node n;
  n.kind = Kind::kDtype;
  n.i = static_cast<std::int64_t>(d);
  n.text = std::string(dtype_name(d));
  return add(std::move(n));
}
NodeId CheckpointBuilder::device(std::string_view device) {
  Node n;
  n.kind = Kind::kDevice;
  n.text = std::string(device);
  return add(std::move(n));
}

Result<std::uint32_t> CheckpointBuilder::add_storage_impl(DType dtype, Bytes bytes, std::string location,
                                                          std::uint64_t file_offset) {
  if (dtype >= DType::kCount_) return invalid("add_storage: invalid dtype");
  const std::uint32_t es = dtype_size(dtype);
  if (bytes.size() % es != 0)
    return invalid("add_storage: " + std::to_string(bytes.size()) + " bytes is not a multiple of the " +
                   std::string(dtype_name(dtype)) + " element size " + std::to_string(es));
  if (location.empty()) return invalid("add_storage: empty location");
  if (ckpt_.storages_.size() >= 0xFFFFFFFEu) return invalid("add_storage: too many storages");
  StorageInfo s;
  const auto index = static_cast<std::uint32_t>(ckpt_.storages_.size());
  s.key = std::to_string(index);
  s.location = std::move(location);
  s.dtype = dtype;
  s.nbytes = bytes.size();
  s.record = "storage " + s.key;
  s.file_offset = file_offset;
  s.bytes = bytes;
  ckpt_.storages_.push_back(std::move(s));
  return index;
}

Result<std::uint32_t> CheckpointBuilder::add_storage(DType dtype, std::vector<std::uint8_t> bytes,
                                                     std::string location) {
  auto buf = std::make_shared<std::vector<std::uint8_t>>(std::move(bytes));
  Bytes view(buf->data(), buf->size());
  SAFECKPT_TRY(std::uint32_t idx, add_storage_impl(dtype, view, std::move(location), Location::kNoOffset));
  ckpt_.owned_.push_back(std::move(buf));
  return idx;
}

Result<std::uint32_t> CheckpointBuilder::add_storage_borrowed(DType dtype, Bytes bytes, std::string location,
                                                              std::uint64_t file_offset) {
  return add_storage_impl(dtype, bytes, std::move(location), file_offset);
}

StorageInfo& CheckpointBuilder::storage(std::uint32_t index) {
  return ckpt_.storages_.at(index);
}

void CheckpointBuilder::keep_alive(std::shared_ptr<const void> owner) {
  // Checkpoint keeps owners as shared_ptr<vector<uint8_t>>; the aliasing
  // constructor shares `owner`'s control block with a null stored pointer.
  ckpt_.owned_.push_back(std::shared_ptr<std::vector<std::uint8_t>>(std::move(owner), nullptr));
}

Result<NodeId> CheckpointBuilder::add_tensor(TensorInfo t) {
  if (t.dtype >= DType::kCount_) return invalid("add_tensor: invalid dtype");
  if (t.shape.size() > limits_.max_tensor_rank)
    return invalid("add_tensor: rank " + std::to_string(t.shape.size()) + " exceeds max_tensor_rank " +
                   std::to_string(limits_.max_tensor_rank));
  for (auto d : t.shape)
    if (d < 0) return invalid("add_tensor: negative size " + std::to_string(d));
  if (ckpt_.tensors_.size() >= limits_.max_tensors) return invalid("add_tensor: max_tensors reached");
  const auto ntensors = ckpt_.tensors_.size();
  auto tensor_ok = [&](std::uint32_t i) { return i < ntensors; };
  if (t.layout == Layout::kStrided) {
    if (t.stride.empty() && !t.shape.empty()) t.stride = contiguous_strides(t.shape);
    if (t.stride.size() != t.shape.size()) return invalid("add_tensor: stride rank != shape rank");
    if (t.is_meta) {
      if (t.storage != kNoStorage) return invalid("add_tensor: a meta tensor has no storage");
    } else {
      if (t.storage >= ckpt_.storages_.size()) return invalid("add_tensor: storage index out of range");
      const StorageInfo& s = ckpt_.storages_[t.storage];
      auto need = strided_extent_bytes(t.shape, t.stride, t.storage_offset, dtype_size(t.dtype));
      if (!need) return invalid("add_tensor: negative or overflowing size/stride/offset");
      if (*need > s.nbytes)
        return invalid("add_tensor: view needs " + std::to_string(*need) + " bytes but storage " + s.key + " has " +
                       std::to_string(s.nbytes));
    }
    if (dtype_is_quantized(t.dtype)) {
      if (t.qscheme == QScheme::kNone) return invalid("add_tensor: quantized dtype without qscheme");
      bool per_channel = t.qscheme == QScheme::kPerChannelAffine || t.qscheme == QScheme::kPerChannelSymmetric ||
                         t.qscheme == QScheme::kPerChannelAffineFloatQParams;
      if (per_channel && (!tensor_ok(t.q_scales) || !tensor_ok(t.q_zero_points)))
        return invalid("add_tensor: per-channel scales/zero points must be earlier tensors");
    }
  } else {
    const std::size_t want = t.layout == Layout::kSparseCoo ? 2 : 3;
    if (t.sparse_parts.size() != want) return invalid("add_tensor: wrong number of sparse components");
    for (auto p : t.sparse_parts)
      if (!tensor_ok(p)) return invalid("add_tensor: sparse component must be an earlier tensor");
  }
  if (t.python_state != kNoNode && t.python_state >= values().size())
    return invalid("add_tensor: python_state node out of range");
  ckpt_.tensors_.push_back(std::move(t));
  Node n;
  n.kind = Kind::kTensor;
  n.i = static_cast<std::int64_t>(ntensors);
  return add(std::move(n));
}

Result<NodeId> CheckpointBuilder::add_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint32_t storage,
                                             std::int64_t storage_offset, std::vector<std::int64_t> stride) {
  TensorInfo t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.stride = std::move(stride);
  t.storage = storage;
  t.storage_offset = storage_offset;
  if (dtype_is_quantized(dtype)) t.qscheme = QScheme::kPerTensorAffine, t.q_scale = 1.0;
  return add_tensor(std::move(t));
}

Status CheckpointBuilder::state_dict_root() {
  if (root_ == kNoNode) {
    root_ = container(Kind::kOrderedDict, {});
    return {};
  }
  if (values()[root_].kind != Kind::kOrderedDict && values()[root_].kind != Kind::kDict)
    return invalid("state_dict entry: the root is already set to a " + std::string(kind_name(values()[root_].kind)));
  return {};
}

Status CheckpointBuilder::check_name(std::string_view name) {
  auto it = std::lower_bound(state_dict_names_.begin(), state_dict_names_.end(), name);
  if (it != state_dict_names_.end() && *it == name)
    return invalid("state_dict entry: duplicate name '" + std::string(name) + "'");
  state_dict_names_.insert(it, std::string(name));
  return {};
}

Status CheckpointBuilder::add_state_dict_value(std::string_view name, NodeId value) {
  if (value >= values().size()) return invalid("add_state_dict_value: node out of range");
  SAFECKPT_CHECK(state_dict_root());
  SAFECKPT_CHECK(check_name(name));
  NodeId key = str(name);
  auto& items = values()[root_].items;
  items.push_back(key);
  items.push_back(value);
  return {};
}

namespace {
Result<std::uint64_t> state_dict_nbytes(DType dtype, const std::vector<std::int64_t>& shape, std::uint64_t have) {
  std::uint64_t n = 1;
  for (auto d : shape) {
    if (d < 0) return invalid("state_dict tensor: negative size");
    if (!checked_mul(n, static_cast<std::uint64_t>(d), n)) return invalid("state_dict tensor: numel overflows");
  }
  std::uint64_t bytes = 0;
  if (dtype >= DType::kCount_ || !checked_mul(n, dtype_size(dtype), bytes))
    return invalid("state_dict tensor: bad dtype or size overflow");
  if (bytes != have)
    return invalid("state_dict tensor: " + std::to_string(have) + " bytes given, shape and dtype need " +
                   std::to_string(bytes));
  return bytes;
}
}  // namespace

Status CheckpointBuilder::add_state_dict_tensor(std::string_view name, DType dtype, std::vector<std::int64_t> shape,
                                                std::vector<std::uint8_t> bytes, bool parameter) {
  SAFECKPT_CHECK(state_dict_nbytes(dtype, shape, bytes.size()));
  SAFECKPT_TRY(std::uint32_t s, add_storage(dtype, std::move(bytes)));
  TensorInfo t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.storage = s;
  t.is_parameter = parameter;
  SAFECKPT_TRY(NodeId node, add_tensor(std::move(t)));
  return add_state_dict_value(name, node);
}

Status CheckpointBuilder::add_state_dict_tensor_borrowed(std::string_view name, DType dtype,
                                                         std::vector<std::int64_t> shape, Bytes bytes, bool parameter) {
  SAFECKPT_CHECK(state_dict_nbytes(dtype, shape, bytes.size()));
  SAFECKPT_TRY(std::uint32_t s, add_storage_borrowed(dtype, bytes));
  TensorInfo t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.storage = s;
  t.is_parameter = parameter;
  SAFECKPT_TRY(NodeId node, add_tensor(std::move(t)));
  return add_state_dict_value(name, node);
}

Result<Checkpoint> CheckpointBuilder::finish() && {
  if (root_ == kNoNode) return invalid("CheckpointBuilder::finish: no root value");
  const ValueArena& a = values();
  const std::size_t nn = a.size();
  for (std::size_t id = 0; id < nn; ++id) {
    const Node& n = a[static_cast<NodeId>(id)];
    for (NodeId c : n.items)
      if (c != kNoNode && c >= nn)
        return invalid("CheckpointBuilder::finish: node " + std::to_string(id) + " refers to a missing node");
    if (n.attrs != kNoNode && n.attrs >= nn) return invalid("CheckpointBuilder::finish: bad attrs node");
    if (n.kind == Kind::kTensor && (n.i < 0 || static_cast<std::uint64_t>(n.i) >= ckpt_.tensors_.size()))
      return invalid("CheckpointBuilder::finish: tensor node with no tensor");
    if (n.kind == Kind::kStorage && (n.i < 0 || static_cast<std::uint64_t>(n.i) >= ckpt_.storages_.size()))
      return invalid("CheckpointBuilder::finish: storage node with no storage");
    if (n.kind == Kind::kDtype && (n.i < 0 || n.i >= static_cast<std::int64_t>(DType::kCount_)))
      return invalid("CheckpointBuilder::finish: bad dtype node");
  }
  if (root_ >= nn) return invalid("CheckpointBuilder::finish: root out of range");
  ckpt_.format_ = format_;
  ckpt_.root_ = root_;
  return std::move(ckpt_);
}

}  // namespace safeckpt
