// safeckpt/tensor.hpp — tensors and storages as a checkpoint describes them.
// Shapes and strides are in elements, sizes in bytes. Indices refer to the
// owning Checkpoint's tables.
#pragma once

#include <cstdint>
#include <memory>
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

// One placement of a DTensor on one mesh dimension
// (torch/distributed/tensor/placement_types.py, PyTorch 2.11).
struct DTensorPlacement {
  enum class Kind : std::uint8_t {
    kShard,      // Shard(dim): the tensor dimension `dim` split over the mesh dimension, torch.chunk's rule
    kReplicate,  // Replicate(): every rank of the mesh dimension holds the same values
    kPartial,    // Partial(reduce_op): the global tensor is the reduction of the ranks' values
  };
  Kind kind = Kind::kReplicate;
  std::int64_t dim = 0;   // kShard: the tensor dimension, 0 <= dim < rank of the global tensor
  std::string reduce_op;  // kPartial: "sum", "avg", ... as saved
};

// A DTensor as torch.save stores one (torch.distributed.tensor.DTensor:
// _rebuild_from_type_v2(_rebuild_wrapper_subclass, DTensor, (DTensor, dtype,
// size, stride, offset, layout, device, requires_grad), (None, {"_local_tensor":
// T, "_spec": DTensorSpec})); torch/distributed/tensor/_api.py,
// _dtensor_spec.py, device_mesh.py in 2.11). The TensorInfo that holds it IS
// the local shard (its data, dtype, shape); these fields say where the shard
// sits in the global tensor. Loaded only with the opt-in allowlist
// allowlist/dtensor.allow (`--allow dtensor`), PyTorch's
// `import torch.distributed.tensor`. No process group, no mesh is built.
struct DTensorInfo {
  std::vector<std::int64_t> global_shape;    // DTensor.shape (the wrapper's size; = spec.tensor_meta.shape)
  std::vector<std::int64_t> global_stride;   // the wrapper's stride (= spec.tensor_meta.stride)
  std::vector<std::int64_t> mesh_shape;      // DeviceMesh shape (its _MeshLayout), one entry per mesh dimension
  std::vector<std::string> mesh_dim_names;   // empty when the mesh has none
  std::string mesh_device_type;              // "cpu", "cuda", ...
  std::int64_t rank = 0;                     // global rank of the writer (DeviceMesh._rank)
  std::vector<std::int64_t> coordinate;      // the writer's coordinate on each mesh dimension
  std::vector<DTensorPlacement> placements;  // one per mesh dimension
  // The local shard's box in the global tensor, computed from the fields above
  // as PyTorch's compute_local_shape_and_global_offset does (mesh dimensions
  // in order; Shard(d): ceil(n / size) rows per coordinate, the last ones
  // short or empty). The loader checks that the local tensor has local_shape.
  std::vector<std::int64_t> local_shape;
  std::vector<std::int64_t> global_offset;
};

// Fills info.local_shape / info.global_offset from the other fields. Errors:
// kMalformed (a placement dim out of range, coordinate outside mesh_shape,
// sizes disagreeing).
Status compute_dtensor_box(DTensorInfo& info);

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
  // A DTensor's distribution (this tensor is its local shard), or null.
  std::shared_ptr<const DTensorInfo> dtensor;
  std::uint64_t numel() const noexcept;  // product of shape (validated not to overflow)
};

}  // namespace safeckpt
