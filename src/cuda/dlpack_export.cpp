// src/cuda/dlpack_export.cpp — DLPack views of device storages.
//
// Accepted views (anything else is an error, no DLPack struct is made):
//   1. dtype with a DLPack type code (dlpack_dtype); rank <= 64;
//   2. shape.size() == strides.size(); sizes, strides, storage_offset >= 0;
//   3. for a view with elements: (storage_offset + sum((size-1)*stride) + 1)
//      * itemsize <= storage_nbytes, computed with overflow checks (PyTorch's
//      own rule, c10 computeStorageNbytes);
//   4. non-null owner; non-null storage_data when the view has elements.
// Ownership: a heap "holder" owns the DLPack struct, the shape/strides arrays
// and a shared_ptr to the owner; the deleter deletes the holder, which drops
// the reference (and frees the arena when it was the last one).
#include <array>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <type_traits>

#include "safeckpt/cuda.hpp"
#include "util/bytes.hpp"

namespace safeckpt::cuda {
namespace {

constexpr std::size_t kMaxRank = 64;

template <class Managed>
struct Holder {
  Managed managed{};
  std::shared_ptr<const void> owner;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::int64_t, kMaxRank> strides{};
};

template <class Managed>
void delete_holder(Managed* self) noexcept {
  if (self != nullptr) delete static_cast<Holder<Managed>*>(self->manager_ctx);
}

// Checks the view and fills `t`; shape/strides point into the holder.
Status fill_tensor(const TensorView& v, DLTensor& t, std::int64_t* shape, std::int64_t* strides) {
  SAFECKPT_TRY(DLDataType dt, dlpack_dtype(v.dtype));
  if (v.shape.size() > kMaxRank)
    return make_error(ErrorCode::kInvalidArgument, "tensor rank " + std::to_string(v.shape.size()) + " exceeds 64");
  if (v.shape.size() != v.strides.size())
    return make_error(ErrorCode::kInvalidArgument, "shape has " + std::to_string(v.shape.size()) +
                                                       " dims but strides has " + std::to_string(v.strides.size()));
  if (v.storage_offset < 0)
    return make_error(ErrorCode::kInvalidArgument, "negative storage_offset " + std::to_string(v.storage_offset));
  const std::uint64_t itemsize = dtype_size(v.dtype);
  bool empty = false;
  for (std::size_t i = 0; i < v.shape.size(); ++i) {
    if (v.shape[i] < 0 || v.strides[i] < 0)
      return make_error(ErrorCode::kInvalidArgument, "negative size or stride in dim " + std::to_string(i));
    if (v.shape[i] == 0) empty = true;
  }
  std::uint64_t byte_offset_of_first = 0;
  if (!empty) {
    // Highest element index reached, then bytes needed; all checked.
    std::uint64_t last = static_cast<std::uint64_t>(v.storage_offset);
    for (std::size_t i = 0; i < v.shape.size(); ++i) {
      std::uint64_t step = 0;
      if (!util::checked_mul(static_cast<std::uint64_t>(v.shape[i] - 1), static_cast<std::uint64_t>(v.strides[i]),
                             step) ||
          !util::checked_add(last, step, last))
        return make_error(ErrorCode::kMalformed, "view extent overflows 64 bits");
    }
    std::uint64_t need = 0;
    if (!util::checked_add(last, 1, need) || !util::checked_mul(need, itemsize, need))
      return make_error(ErrorCode::kMalformed, "view extent overflows 64 bits");
    if (need > v.storage_nbytes)
      return make_error(ErrorCode::kMalformed, "view needs " + std::to_string(need) +
                                                   " bytes of its storage but it has " +
                                                   std::to_string(v.storage_nbytes));
    if (v.storage_data == nullptr)
      return make_error(ErrorCode::kInvalidArgument, "null storage_data for a view with elements");
    byte_offset_of_first = static_cast<std::uint64_t>(v.storage_offset) * itemsize;  // <= need, no overflow
  }
  for (std::size_t i = 0; i < v.shape.size(); ++i) {
    shape[i] = v.shape[i];
    strides[i] = v.strides[i];
  }
  // DLPack: data NULL for a tensor of size zero; otherwise point at the first
  // element with byte_offset 0 (what PyTorch, CuPy and JAX produce and expect).
  t.data = empty ? nullptr : static_cast<std::uint8_t*>(v.storage_data) + byte_offset_of_first;
  t.device = DLDevice{kDLCUDA, v.device};
  t.ndim = static_cast<std::int32_t>(v.shape.size());
  t.dtype = dt;
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = 0;
  return {};
}

template <class Managed>
Result<Managed*> make_managed(const TensorView& view, std::shared_ptr<const void> owner, std::uint64_t flags) {
  if (!owner) return make_error(ErrorCode::kInvalidArgument, "DLPack export needs an owner keeping the storage alive");
  auto holder = std::unique_ptr<Holder<Managed>>(new (std::nothrow) Holder<Managed>());
  if (!holder) return make_error(ErrorCode::kInternal, "out of host memory for a DLPack tensor");
  SAFECKPT_CHECK(fill_tensor(view, holder->managed.dl_tensor, holder->shape.data(), holder->strides.data()));
  holder->owner = std::move(owner);
  holder->managed.manager_ctx = holder.get();
  holder->managed.deleter = &delete_holder<Managed>;
  if constexpr (std::is_same_v<Managed, DLManagedTensorVersioned>) {
    holder->managed.version = DLPackVersion{DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    holder->managed.flags = flags;
  }
  return &holder.release()->managed;
}

}  // namespace

Result<DLDataType> dlpack_dtype(DType dtype) {
  auto t = [](std::uint8_t code, std::uint8_t bits) { return DLDataType{code, bits, 1}; };
  switch (dtype) {
    case DType::kFloat64: return t(kDLFloat, 64);
    case DType::kFloat32: return t(kDLFloat, 32);
    case DType::kFloat16: return t(kDLFloat, 16);
    case DType::kBFloat16: return t(kDLBfloat, 16);
    case DType::kInt64: return t(kDLInt, 64);
    case DType::kInt32: return t(kDLInt, 32);
    case DType::kInt16: return t(kDLInt, 16);
    case DType::kInt8: return t(kDLInt, 8);
    case DType::kUInt8: return t(kDLUInt, 8);
    case DType::kUInt16: return t(kDLUInt, 16);
    case DType::kUInt32: return t(kDLUInt, 32);
    case DType::kUInt64: return t(kDLUInt, 64);
    case DType::kBool: return t(kDLBool, 8);
    case DType::kComplex128: return t(kDLComplex, 128);
    case DType::kComplex64: return t(kDLComplex, 64);
    case DType::kComplex32: return t(kDLComplex, 32);
    case DType::kFloat8_e5m2: return t(kDLFloat8_e5m2, 8);
    case DType::kFloat8_e4m3fn: return t(kDLFloat8_e4m3fn, 8);
    case DType::kFloat8_e5m2fnuz: return t(kDLFloat8_e5m2fnuz, 8);
    case DType::kFloat8_e4m3fnuz: return t(kDLFloat8_e4m3fnuz, 8);
    case DType::kFloat8_e8m0fnu: return t(kDLFloat8_e8m0fnu, 8);
    default: break;
  }
  std::string why = dtype_is_quantized(dtype) ? "quantized dtypes carry scale/zero point that DLPack cannot describe"
                                              : "no DLPack type code for this (packed sub-byte or untyped bits) dtype";
  return make_error(ErrorCode::kUnsupported,
                    "dtype " + std::string(dtype_name(dtype)) + " cannot be exported to DLPack: " + why);
}

Result<DLManagedTensorVersioned*> to_dlpack_versioned(const TensorView& view, std::shared_ptr<const void> owner,
                                                      bool read_only) {
  return make_managed<DLManagedTensorVersioned>(view, std::move(owner), read_only ? DLPACK_FLAG_BITMASK_READ_ONLY : 0);
}

Result<DLManagedTensor*> to_dlpack_legacy(const TensorView& view, std::shared_ptr<const void> owner) {
  return make_managed<DLManagedTensor>(view, std::move(owner), 0);
}

TensorView arena_view(const DeviceArena& arena, std::size_t storage_index) noexcept {
  TensorView v;
  v.storage_data = arena.storage_data(storage_index);
  v.storage_nbytes = arena.storage_nbytes(storage_index);
  v.device = arena.device();
  return v;
}

}  // namespace safeckpt::cuda
