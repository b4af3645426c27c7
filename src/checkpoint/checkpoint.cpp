// Checkpoint accessors and CheckpointBuilder.
#include "safeckpt/checkpoint.hpp"

#include <algorithm>
#include <cstring>

#include "checkpoint/builder.hpp"
#include "checkpoint/paths.hpp"
#include "torch/object_model.hpp"

namespace safeckpt {

std::string_view layout_name(Layout l) noexcept {
  switch (l) {
    case Layout::kStrided: return "strided";
    case Layout::kSparseCoo: return "sparse_coo";
    case Layout::kSparseCsr: return "sparse_csr";
    case Layout::kSparseCsc: return "sparse_csc";
    case Layout::kSparseBsr: return "sparse_bsr";
    case Layout::kSparseBsc: return "sparse_bsc";
  }
  return "unknown";
}

std::string_view qscheme_name(QScheme q) noexcept {
  switch (q) {
    case QScheme::kNone: return "";
    case QScheme::kPerTensorAffine: return "per_tensor_affine";
    case QScheme::kPerTensorSymmetric: return "per_tensor_symmetric";
    case QScheme::kPerChannelAffine: return "per_channel_affine";
    case QScheme::kPerChannelSymmetric: return "per_channel_symmetric";
    case QScheme::kPerChannelAffineFloatQParams: return "per_channel_affine_float_qparams";
  }
  return "";
}

// ---- loader's builder ------------------------------------------------------------

Bytes LoadBuilder::swapped_copy(Bytes in, std::uint32_t unit) {
  auto buf = std::make_shared<std::vector<std::uint8_t>>(in.begin(), in.end());
  std::uint8_t* p = buf->data();
  for (std::size_t i = 0; i + unit <= buf->size(); i += unit) std::reverse(p + i, p + i + unit);
  Bytes out(buf->data(), buf->size());
  keep(std::move(buf));
  return out;
}

Result<Checkpoint> LoadBuilder::finish(FileFormat format, NodeId root, TorchTables&& tables) {
  ckpt_.format_ = format;
  ckpt_.root_ = root;
  ckpt_.tensors_ = std::move(tables.tensors);
  ckpt_.storages_ = std::move(tables.storages);
  for (auto& o : tables.owned) keep(std::move(o));
  // Verify once, then view: a file whose state_dict cannot be named under the
  // default cap (a tensor a million lists deep, memo-shared long keys) is
  // refused here, so state_dict() on a loaded checkpoint never comes back
  // short.
  if (auto names = ckpt_.named_tensors(); !names) return unexpected(std::move(names).error());
  return std::move(ckpt_);
}

// ---- accessors ---------------------------------------------------------------------

Result<std::vector<NamedTensor>> Checkpoint::named_tensors(std::uint64_t max_name_bytes) const {
  std::vector<NamedTensor> out;
  std::vector<bool> seen(tensors_.size(), false);
  Status failed;
  detail::walk_paths(arena_, root_, max_name_bytes, [&](const detail::PathVisit& v) {
    const Node& n = arena_[v.id];
    if (n.kind != Kind::kTensor) return detail::WalkStep::kDescend;
    const auto t = static_cast<std::uint32_t>(n.i);
    if (t >= seen.size() || seen[t]) return detail::WalkStep::kSkip;
    seen[t] = true;
    if (!v.path_complete) {
      failed = make_error(ErrorCode::kLimitExceeded, "tensor " + std::to_string(t) + " at nesting depth " +
                                                         std::to_string(v.depth) + " would be named by a path of " +
                                                         std::to_string(v.path_bytes) + " bytes; the cap is " +
                                                         std::to_string(max_name_bytes) + " bytes (named \"" +
                                                         std::string(v.path.substr(0, 64)) + "...\")");
      return detail::WalkStep::kStop;
    }
    out.push_back({std::string(v.path), t});
    return detail::WalkStep::kSkip;
  });
  if (!failed) return unexpected(std::move(failed).error());
  return out;
}

std::vector<NamedTensor> Checkpoint::state_dict() const {
  auto r = named_tensors();
  if (!r) return {};  // only for checkpoints built by CheckpointBuilder: the loaders refuse such a file
  return std::move(*r);
}

Result<std::vector<std::uint8_t>> Checkpoint::contiguous_bytes(std::uint32_t index) const {
  if (index >= tensors_.size()) return make_error(ErrorCode::kInvalidArgument, "tensor index out of range");
  const TensorInfo& t = tensors_[index];
  if (t.layout != Layout::kStrided || t.is_meta || t.storage == kNoStorage)
    return make_error(ErrorCode::kInvalidArgument, "not a strided tensor with storage");
  const StorageInfo& s = storages_[t.storage];
  const std::size_t es = dtype_size(t.dtype);
  const std::uint64_t n = t.numel();
  std::vector<std::uint8_t> out;
  if (n == 0) return out;
  try {
    out.resize(n * es);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "tensor too large to copy");
  }
  const std::size_t rank = t.shape.size();
  std::vector<std::int64_t> idx(rank, 0);
  // Views were validated at load: every element index is inside the storage.
  std::uint64_t off = static_cast<std::uint64_t>(t.storage_offset);
  for (std::uint64_t e = 0; e < n; ++e) {
    std::memcpy(out.data() + e * es, s.bytes.data() + off * es, es);
    for (std::size_t d = rank; d-- > 0;) {
      if (++idx[d] < t.shape[d]) {
        off += static_cast<std::uint64_t>(t.stride[d]);
        break;
      }
      off -= static_cast<std::uint64_t>(t.stride[d]) * static_cast<std::uint64_t>(t.shape[d] - 1);
      idx[d] = 0;
    }
  }
  return out;
}

namespace {

// Reads element i of an int32/int64 strided tensor as int64.
std::int64_t index_value(const std::vector<std::uint8_t>& bytes, DType dt, std::size_t i) {
  if (dt == DType::kInt32) {
    std::int32_t v;
    std::memcpy(&v, bytes.data() + i * 4, 4);
    return v;
  }
  std::int64_t v;
  std::memcpy(&v, bytes.data() + i * 8, 8);
  return v;
}

void add_element(std::uint8_t* dst, const std::uint8_t* src, DType dt) {
  switch (dt) {
    case DType::kFloat32: {
      float a, b;
      std::memcpy(&a, dst, 4);
      std::memcpy(&b, src, 4);
      a += b;
      std::memcpy(dst, &a, 4);
      break;
    }
    case DType::kFloat64: {
      double a, b;
      std::memcpy(&a, dst, 8);
      std::memcpy(&b, src, 8);
      a += b;
      std::memcpy(dst, &a, 8);
      break;
    }
    case DType::kInt64: {
      std::int64_t a, b;
      std::memcpy(&a, dst, 8);
      std::memcpy(&b, src, 8);
      a += b;
      std::memcpy(dst, &a, 8);
      break;
    }
    case DType::kInt32: {
      std::int32_t a, b;
      std::memcpy(&a, dst, 4);
      std::memcpy(&b, src, 4);
      a += b;
      std::memcpy(dst, &a, 4);
      break;
    }
    default: std::memcpy(dst, src, dtype_size(dt));  // coalesced input: no duplicates to sum
  }
}

}  // namespace

Result<std::vector<std::uint8_t>> Checkpoint::dense_bytes(std::uint32_t index) const {
  if (index >= tensors_.size()) return make_error(ErrorCode::kInvalidArgument, "tensor index out of range");
  const TensorInfo& t = tensors_[index];
  if (t.layout == Layout::kStrided) return contiguous_bytes(index);
  const std::size_t es = dtype_size(t.dtype);
  std::uint64_t numel = t.numel();
  std::vector<std::uint8_t> out;
  try {
    out.assign(numel * es, 0);
  } catch (const std::bad_alloc&) {
    return make_error(ErrorCode::kLimitExceeded, "dense tensor too large");
  }
  // Row-major strides of the dense result.
  std::vector<std::uint64_t> dstride(t.shape.size(), 1);
  for (std::size_t d = t.shape.size(); d-- > 1;) dstride[d - 1] = dstride[d] * static_cast<std::uint64_t>(t.shape[d]);
  if (t.layout == Layout::kSparseCoo) {
    const TensorInfo& it = tensors_[t.sparse_parts[0]];
    const TensorInfo& vt = tensors_[t.sparse_parts[1]];
    SAFECKPT_TRY(auto ib, contiguous_bytes(t.sparse_parts[0]));
    SAFECKPT_TRY(auto vb, contiguous_bytes(t.sparse_parts[1]));
    std::size_t sdim = static_cast<std::size_t>(it.shape[0]);
    std::size_t nnz = static_cast<std::size_t>(it.shape[1]);
    std::uint64_t block = 1;
    for (std::size_t d = 1; d < vt.shape.size(); ++d) block *= static_cast<std::uint64_t>(vt.shape[d]);
    for (std::size_t k = 0; k < nnz; ++k) {
      std::uint64_t off = 0;
      for (std::size_t d = 0; d < sdim; ++d) {
        std::int64_t x = index_value(ib, DType::kInt64, d * nnz + k);
        if (x < 0 || x >= t.shape[d]) return make_error(ErrorCode::kMalformed, "sparse index out of bounds");
        off += static_cast<std::uint64_t>(x) * dstride[d];
      }
      for (std::uint64_t b = 0; b < block; ++b)
        add_element(out.data() + (off + b) * es, vb.data() + (k * block + b) * es, t.dtype);
    }
    return out;
  }
  if (t.layout == Layout::kSparseCsr || t.layout == Layout::kSparseCsc) {
    const TensorInfo& ct = tensors_[t.sparse_parts[0]];
    SAFECKPT_TRY(auto cb, contiguous_bytes(t.sparse_parts[0]));
    SAFECKPT_TRY(auto pb, contiguous_bytes(t.sparse_parts[1]));
    SAFECKPT_TRY(auto vb, contiguous_bytes(t.sparse_parts[2]));
    bool csr = t.layout == Layout::kSparseCsr;
    std::int64_t outer = csr ? t.shape[0] : t.shape[1], inner = csr ? t.shape[1] : t.shape[0];
    if (t.shape.size() != 2 || ct.shape[0] != outer + 1)
      return make_error(ErrorCode::kMalformed, "compressed indices do not match the shape");
    std::size_t nplain = pb.size() / dtype_size(tensors_[t.sparse_parts[1]].dtype);
    for (std::int64_t r = 0; r < outer; ++r) {
      std::int64_t b = index_value(cb, ct.dtype, static_cast<std::size_t>(r));
      std::int64_t e = index_value(cb, ct.dtype, static_cast<std::size_t>(r + 1));
      if (b < 0 || e < b || static_cast<std::size_t>(e) > nplain || static_cast<std::size_t>(e) * es > vb.size())
        return make_error(ErrorCode::kMalformed, "compressed indices are not monotonic / in range");
      for (std::int64_t k = b; k < e; ++k) {
        std::int64_t c = index_value(pb, ct.dtype, static_cast<std::size_t>(k));
        if (c < 0 || c >= inner) return make_error(ErrorCode::kMalformed, "plain index out of bounds");
        std::uint64_t off = csr ? static_cast<std::uint64_t>(r * inner + c) : static_cast<std::uint64_t>(c * outer + r);
        add_element(out.data() + off * es, vb.data() + static_cast<std::size_t>(k) * es, t.dtype);
      }
    }
    return out;
  }
  return make_error(ErrorCode::kUnsupported, "densifying block-sparse tensors is not supported");
}

}  // namespace safeckpt
