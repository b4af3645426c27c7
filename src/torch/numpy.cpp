// numpy values in checkpoints. Rules: src/torch/object_model.hpp; allowlist/numpy.allow.
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "torch/hook_args.hpp"
#include "torch/object_model.hpp"
#include "util/bytes.hpp"

namespace safeckpt {

using hook_args::Args;
using hook_args::bad_args;
using util::checked_mul;

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

}  // namespace safeckpt
