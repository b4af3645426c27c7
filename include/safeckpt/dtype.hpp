// safeckpt/dtype.hpp — tensor element types, as PyTorch names them.
//
// Source: torch/storage.py (_dtype_to_storage_type_map, _new_dtypes),
// torch/_utils.py (_element_size), c10/core/ScalarType.h. Names are
// PyTorch's `str(dtype)` without the "torch." prefix.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace safeckpt {

enum class DType : std::uint8_t {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  kComplex128,
  kComplex64,
  kComplex32,
  kQInt8,
  kQUInt8,
  kQInt32,
  kQUInt4x2,
  kQUInt2x4,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat8_e5m2,
  kFloat8_e4m3fn,
  kFloat8_e5m2fnuz,
  kFloat8_e4m3fnuz,
  kFloat8_e8m0fnu,
  kFloat4_e2m1fn_x2,
  kBits8,
  kBits16,
  kBits1x8,
  kBits2x4,
  kBits4x2,
  kCount_  // number of dtypes; not a dtype
};

// PyTorch name, e.g. "bfloat16", "float8_e4m3fn", "qint8".
std::string_view dtype_name(DType d) noexcept;
// Inverse of dtype_name; nullopt for unknown names.
std::optional<DType> dtype_from_name(std::string_view name) noexcept;

// Bytes per element (torch._utils._element_size): complex -> 2 parts,
// quint4x2/quint2x4/float4_e2m1fn_x2/bits*x* pack several values in 1 byte.
std::uint32_t dtype_size(DType d) noexcept;

// Size in bytes of one swapped unit for byte-order conversion: the component
// size for complex types (each half swapped separately, torch/storage.py
// `byteswap`), the element size otherwise.
std::uint32_t dtype_swap_unit(DType d) noexcept;

// Quantized dtypes (their elements are the integer representation).
bool dtype_is_quantized(DType d) noexcept;

// Legacy typed storage class (`torch.FloatStorage` ...) -> dtype. Accepts the
// bare class name ("FloatStorage"); nullopt if not a known storage class.
std::optional<DType> dtype_from_storage_class(std::string_view class_name) noexcept;
// dtype -> legacy storage class name, or empty view when the dtype has none
// (then PyTorch pickles `torch.storage.UntypedStorage` + _rebuild_tensor_v3).
std::string_view storage_class_for(DType d) noexcept;

}  // namespace safeckpt
