// safeckpt/tensor.hpp — tensors and storages as a checkpoint describes them.
// Shapes and strides are in elements, sizes in bytes. Indices refer to the
// owning Checkpoint's tables.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/dtype.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/mapped_file.hpp"
#include "safeckpt/value.hpp"

namespace safeckpt {

inline constexpr std::uint32_t kNoStorage = 0xFFFFFFFFu;

struct StorageInfo {
  std::string key;       // persistent-id key ("0", "1", ... or legacy pointer text)
  std::string location;  // saved device tag: "cpu", "cuda:0", ...
  DType dtype;           // storage dtype (uint8 for UntypedStorage)
  std::uint64_t nbytes;  // = numel x dtype_size(dtype); equals the record size
  std::string record;    // "archive/data/0", or "legacy storage <key>"
  // Absolute file offset of the bytes when the record is stored
  // uncompressed in the file (for direct-to-GPU reads); kNoOffset otherwise.
  std::uint64_t file_offset = Location::kNoOffset;
  // Unit to byte-swap when reading file_offset directly (1 = none): set for
  // big-endian files; `bytes` below is already little-endian.
  std::uint32_t swap_unit = 1;
  std::uint32_t crc32 = 0;  // expected CRC-32 of the record (0 = unknown)
  Bytes bytes;              // little-endian host bytes; valid while the Checkpoint lives
};

enum class Layout : std::uint8_t { kStrided, kSparseCoo, kSparseCsr, kSparseCsc, kSparseBsr, kSparseBsc };
std::string_view layout_name(Layout l) noexcept;  // "strided", "sparse_coo", ...

enum class QScheme : std::uint8_t {
  kNone,
  kPerTensorAffine,
  kPerTensorSymmetric,
  kPerChannelAffine,
  kPerChannelSymmetric,
  kPerChannelAffineFloatQParams
};
std::string_view qscheme_name(QScheme q) noexcept;  // "per_tensor_affine", ...

struct TensorInfo {
  Layout layout = Layout::kStrided;
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> stride;    // in elements (strided only)
  std::int64_t storage_offset = 0;     // in elements
  std::uint32_t storage = kNoStorage;  // index into Checkpoint::storages(); kNoStorage for meta/sparse
  bool requires_grad = false;
  bool is_parameter = false;       // nn.Parameter
  bool is_meta = false;            // _rebuild_meta_tensor_no_storage
  bool conj = false, neg = false;  // _rebuild_tensor_v2 metadata flags
  std::string device;              // device override (_rebuild_device_tensor_from_cpu_tensor), else ""
  // Quantized (dtype_is_quantized): per-tensor scale/zero point, or
  // per-channel scales/zero points tensors (indices) and axis.
  QScheme qscheme = QScheme::kNone;
  double q_scale = 0;
  std::int64_t q_zero_point = 0;
  std::uint32_t q_scales = kNoStorage, q_zero_points = kNoStorage;  // tensor indices
  std::int64_t q_axis = 0;
  // Sparse: component tensors (tensor indices). COO: indices, values.
  // Compressed (CSR/CSC/BSR/BSC): compressed indices, plain indices, values.
  std::vector<std::uint32_t> sparse_parts;
  bool coalesced = false;
  // Python attributes (Parameter state / _rebuild_from_type_v2 state), or kNoNode.
  NodeId python_state = kNoNode;
  // A user-allowlisted torch.Tensor subclass ("module.Class", from
  // _rebuild_from_type_v2's new_type), "" for torch.Tensor / nn.Parameter.
  std::string subclass;
  std::uint64_t numel() const noexcept;  // product of shape (validated not to overflow)
};

}  // namespace safeckpt
