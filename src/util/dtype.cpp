#include "safeckpt/dtype.hpp"

#include <array>

namespace safeckpt {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::uint32_t size;
  std::uint32_t swap_unit;
  std::string_view storage_class;  // legacy typed storage, "" if none
};

// torch/storage.py _dtype_to_storage_type_map + _new_dtypes; sizes from
// torch/_utils.py _element_size.
constexpr std::array<DTypeInfo, static_cast<std::size_t>(DType::kCount_)> kInfo{{
    {DType::kFloat64, "float64", 8, 8, "DoubleStorage"},
    {DType::kFloat32, "float32", 4, 4, "FloatStorage"},
    {DType::kFloat16, "float16", 2, 2, "HalfStorage"},
    {DType::kBFloat16, "bfloat16", 2, 2, "BFloat16Storage"},
    {DType::kInt64, "int64", 8, 8, "LongStorage"},
    {DType::kInt32, "int32", 4, 4, "IntStorage"},
    {DType::kInt16, "int16", 2, 2, "ShortStorage"},
    {DType::kInt8, "int8", 1, 1, "CharStorage"},
    {DType::kUInt8, "uint8", 1, 1, "ByteStorage"},
    {DType::kBool, "bool", 1, 1, "BoolStorage"},
    {DType::kComplex128, "complex128", 16, 8, "ComplexDoubleStorage"},
    {DType::kComplex64, "complex64", 8, 4, "ComplexFloatStorage"},
    {DType::kComplex32, "complex32", 4, 2, ""},
    {DType::kQInt8, "qint8", 1, 1, "QInt8Storage"},
    {DType::kQUInt8, "quint8", 1, 1, "QUInt8Storage"},
    {DType::kQInt32, "qint32", 4, 4, "QInt32Storage"},
    {DType::kQUInt4x2, "quint4x2", 1, 1, "QUInt4x2Storage"},
    {DType::kQUInt2x4, "quint2x4", 1, 1, "QUInt2x4Storage"},
    {DType::kUInt16, "uint16", 2, 2, ""},
    {DType::kUInt32, "uint32", 4, 4, ""},
    {DType::kUInt64, "uint64", 8, 8, ""},
    {DType::kFloat8_e5m2, "float8_e5m2", 1, 1, ""},
    {DType::kFloat8_e4m3fn, "float8_e4m3fn", 1, 1, ""},
    {DType::kFloat8_e5m2fnuz, "float8_e5m2fnuz", 1, 1, ""},
    {DType::kFloat8_e4m3fnuz, "float8_e4m3fnuz", 1, 1, ""},
    {DType::kFloat8_e8m0fnu, "float8_e8m0fnu", 1, 1, ""},
    {DType::kFloat4_e2m1fn_x2, "float4_e2m1fn_x2", 1, 1, ""},
    {DType::kBits8, "bits8", 1, 1, ""},
    {DType::kBits16, "bits16", 2, 2, ""},
    {DType::kBits1x8, "bits1x8", 1, 1, ""},
    {DType::kBits2x4, "bits2x4", 1, 1, ""},
    {DType::kBits4x2, "bits4x2", 1, 1, ""},
}};

const DTypeInfo& info(DType d) {
  return kInfo[static_cast<std::size_t>(d)];
}

}  // namespace

std::string_view dtype_name(DType d) noexcept {
  return d < DType::kCount_ ? info(d).name : std::string_view("invalid");
}

std::optional<DType> dtype_from_name(std::string_view name) noexcept {
  for (const auto& i : kInfo)
    if (i.name == name) return i.dtype;
  return std::nullopt;
}

std::uint32_t dtype_size(DType d) noexcept {
  return d < DType::kCount_ ? info(d).size : 0;
}
std::uint32_t dtype_swap_unit(DType d) noexcept {
  return d < DType::kCount_ ? info(d).swap_unit : 1;
}

bool dtype_is_quantized(DType d) noexcept {
  return d == DType::kQInt8 || d == DType::kQUInt8 || d == DType::kQInt32 || d == DType::kQUInt4x2 ||
         d == DType::kQUInt2x4;
}

std::optional<DType> dtype_from_storage_class(std::string_view class_name) noexcept {
  if (class_name.empty()) return std::nullopt;
  for (const auto& i : kInfo)
    if (i.storage_class == class_name) return i.dtype;
  return std::nullopt;
}

std::string_view storage_class_for(DType d) noexcept {
  return d < DType::kCount_ ? info(d).storage_class : "";
}

}  // namespace safeckpt
