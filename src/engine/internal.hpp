// Internal types of the engine (src/engine/*; not installed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "safeckpt/dtype.hpp"
#include "safeckpt/error.hpp"

namespace safeckpt::engine::detail {

inline constexpr int kMaxRank = 8;

// Where a tensor's bytes are: a buffer of the plan (resolved to a device
// pointer when the plan is bound) plus an element offset and strides.
// kPrepared: a copy of weights the plan made for its kernels (channels-last
// filters), written by Plan::prep_steps once and read by every run.
enum class BufKind : std::uint8_t { kArena, kWeight, kInput, kOutput, kPrepared };
struct Buf {
  BufKind kind = BufKind::kArena;
  std::uint64_t bytes = 0;
  std::uint64_t offset = 0;  // kArena: byte offset in the arena
  void* ptr = nullptr;       // resolved device pointer
};
struct DevTensor {
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> shape;
  std::vector<std::int64_t> strides;  // elements
  std::int32_t buf = -1;              // index into Plan::bufs; -1: `direct`
  void* direct = nullptr;             // weights: device pointer of element 0 of the storage view
  std::int64_t offset = 0;            // elements
  std::uint64_t numel() const noexcept {
    std::uint64_t n = 1;
    for (auto s : shape) n *= static_cast<std::uint64_t>(s);
    return n;
  }
  // Whether the memory is N,H,W,C (rank 4, offset aside): channels-last
  // strides, or a shape where both orders are the same bytes (C == 1, or
  // H == W == 1 as in a 1x1 filter's K,C,1,1).
  bool nhwc_memory() const noexcept {
    if (shape.size() != 4) return false;
    const std::int64_t c = shape[1], h = shape[2], w = shape[3];
    auto ok = [&](std::size_t d, std::int64_t want) { return shape[d] == 1 || strides[d] == want; };
    return ok(1, 1) && ok(3, c) && ok(2, c * w) && ok(0, c * w * h);
  }
  // Channels-last (torch.channels_last): N,H,W,C in memory and not also
  // contiguous.
  bool channels_last() const noexcept { return nhwc_memory() && !contiguous(); }
  bool contiguous() const noexcept {
    std::int64_t want = 1;
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (shape[d] != 1 && strides[d] != want) return false;
      want *= shape[d];
    }
    return true;
  }
};
std::vector<std::int64_t> contiguous_strides(const std::vector<std::int64_t>& shape);
// The channels-last strides of a rank-4 shape (N,H,W,C in memory).
std::vector<std::int64_t> channels_last_strides(const std::vector<std::int64_t>& shape);

// ------------------------------------------------------------ fused kernels

// One operation of a generated pointwise kernel; operands are earlier
// micro-op indices. Result dtype `dtype`.
enum class MicroKind : std::uint8_t {
  kLoad,        // input tensor `a` of the group
  kConst,       // s0
  kArange,      // s0 + linear_index * s1
  kAdd,         // a + s0 * b
  kSub,         // a - s0 * b
  kMulScalar,   // a * s0
  kEqScalar,    // a == s0
  kLeScalar,    // a <= s0
  kLogicalAnd,  // a && b
  kLogicalNot,  // !a
  kWhere,       // a ? b : c
  kGeluErf,
  kGeluTanh,
  kRelu,
  kCast,       // a converted to dtype (clone, copies)
  kMul,        // a * b (mul.Tensor; bool: a && b; integers wrap like ATen's)
  kInvSqrt,    // 1 / sqrt(a + s0) (floating; batch_norm's 1/sqrt(running_var + eps))
  kNeg,        // -a (integers wrap)
  kPowScalar,  // a ** s0 (floating; ATen's pow_tensor_scalar special cases 2, 3, 0.5, -0.5, -1, -2)
  kRsqrt,      // rsqrt(a) (floating)
  kSilu,       // a / (1 + exp(-a)) (floating)
  kSigmoid,    // 1 / (1 + exp(-a)) (floating)
  kTanh,       // tanh(a) (floating)
  kGeScalar,   // a >= s0
  kBitAnd,     // a & b (integers), a && b (bool)
};
struct MicroOp {
  MicroKind kind = MicroKind::kLoad;
  DType dtype = DType::kFloat32;
  std::int32_t a = -1, b = -1, c = -1;
  double s0 = 0, s1 = 0;
  std::int32_t store = -1;  // >= 0: written to output `store` of the group
};
struct FusedKernel {
  std::string name;          // kernel symbol in the module
  std::vector<MicroOp> ops;  // in order
  std::vector<DType> in_dtypes;
  std::vector<DType> out_dtypes;
  int rank = 0;
  bool index32 = false;  // fewer than 2^31 elements: 32-bit index decomposition
};
// Whether a and b generate the same code (everything but the name): the
// planner launches one kernel for every group of the same ops, dtypes, rank
// and index width (the layers of a transformer), so NVRTC compiles it once.
bool same_code(const FusedKernel& a, const FusedKernel& b);
// The iteration space of a fused kernel made smaller without changing what
// it reads or writes: size-1 dimensions dropped, then neighbours d, d+1
// merged where every tensor has strides[d] == strides[d+1] * shape[d+1]
// (contiguous runs, and broadcast runs of stride 0). `strides` holds one
// vector per tensor, of shape's rank. A shape with a 0 stays as it is.
void collapse_dims(std::vector<std::int64_t>& shape, std::vector<std::vector<std::int64_t>>& strides);
// The iteration space's dimensions reordered so that tensor `ref`'s strides
// do not increase (ATen's TensorIterator::reorder_dimensions): the thread
// index then walks `ref` — the first output — in memory order, coalesced for
// a channels-last output too. Only for kernels whose ops do not depend on the
// linear index (no kArange). Size-1 dimensions may land anywhere.
void order_dims(std::vector<std::int64_t>& shape, std::vector<std::vector<std::int64_t>>& strides, std::size_t ref);
// Elements per thread and loop trip of a generated kernel (fused_source,
// launch_fused's grid). Eight: one 16-byte access of a bfloat16 row per
// trip (fused_source's fast path).
inline constexpr int kFusedUnroll = 8;
// The CUDA C++ source of `kernels` (one module). Only op codes, dtypes and
// numbers reach the text.
std::string fused_source(const std::vector<FusedKernel>& kernels);
// Parameters block of one fused launch (matches the generated struct).
inline constexpr int kMaxFusedTensors = 24;
struct FusedTensorArg {
  void* ptr;
  long long strides[kMaxRank];
};
struct FusedParams {
  long long n;
  long long shape[kMaxRank];
  FusedTensorArg t[kMaxFusedTensors];  // inputs first, then outputs
  // Bit t: tensor t (float32 or bfloat16) is read or written kFusedUnroll
  // elements at a time with 16-byte vector accesses in the fast path — its
  // innermost stride is 1, every other stride a multiple of 16 bytes and its
  // pointer 16-byte aligned (fused_vector_mask).
  unsigned vec;
};
// Launch geometry of a generated kernel over `n` elements (launch_fused;
// the host tests run the kernels with the same grid): blocks of
// kFusedBlockThreads threads.
inline constexpr int kFusedBlockThreads = 256;
unsigned fused_grid_blocks(long long n);
// FusedParams::vec for tensors of `dtypes` at `ptrs` with `strides` over a
// collapsed iteration space whose innermost extent is `inner`.
unsigned fused_vector_mask(const std::vector<DType>& dtypes, const std::vector<const void*>& ptrs,
                           const std::vector<std::vector<std::int64_t>>& strides, std::int64_t inner);

// ------------------------ fixed kernels (kernels.cu; the code in kernels_device.cuh)
// All asynchronous on `stream` (a cudaStream_t); return a cudaError_t value.
struct AttnArgs {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  const void* mask;  // nullptr = none
  int mask_kind;     // 0 none, 1 bool (true = keep), 2 additive (same dtype as q)
  long long B, H, L, S, D, Dv;
  long long q_s[3], k_s[3], v_s[3];  // strides of b, h, row (the last dim is unit)
  long long o_s[3];                  // output strides of b, h, row (flash kernels; the last dim is unit)
  long long m_s[4];                  // mask strides for b, h, l, s (0 = broadcast)
  float scale;
  int causal;
  int bf16;  // q/k/v/out bfloat16 (else float32)
};
int launch_attention(const AttnArgs& a, void* stream);
// The tensor-core flash kernel (attention_tc_device.cuh): bfloat16 only, sm_80 and
// later, D and Dv <= 128.
int launch_attention_tc(const AttnArgs& a, void* stream);
// The 3xTF32 tensor-core flash kernel (attention_tf32_device.cuh): float32
// only, sm_80 and later, D and Dv <= 128.
int launch_attention_tf32x3(const AttnArgs& a, void* stream);
// Which attention lowering a shape gets (safeckpt/engine.hpp, "Attention"):
// host logic, tested without a device.
struct AttnShape {
  long long B = 0, H = 0, L = 0, S = 0, D = 0, Dv = 0;
  bool bf16 = false;
  // query/key/value (as the GEMMs read them) step over b and h with one
  // stride (B == 1, H == 1 or stride(b) == H * stride(h) for each): a group
  // may hold several batch elements.
  bool batch_collapsible = false;
  bool tensor_cores = false;       // the device has bf16 tensor cores (sm_80 and later)
  bool fp32_tensor_cores = false;  // float32 may take the 3xTF32 kernel (EngineOptions::attention_3xtf32)
};
struct AttnChoice {
  bool materialized = false;       // else a flash-style kernel
  bool tensor_core_flash = false;  // the flash kernel on the tensor cores (bf16, or fp32 in 3xTF32, on sm_80+)
  long long group_batches = 0;     // batch elements per group (a divisor of B)
  long long groups = 0;            // B / group_batches: GEMM, softmax, GEMM per group
  std::uint64_t score_bytes = 0;   // float32 scores of one group
  std::uint64_t prob_bytes = 0;    // bfloat16 probabilities of one group (bf16 only; else in place)
};
// bfloat16 on a device with tensor cores: the tensor-core flash kernel (no
// workspace). Otherwise materialized when H*L*S*(4, bf16: 6) <=
// max_workspace_bytes; then the most
// batch elements per group whose workspace fits (1 if not collapsible), with
// group_batches * H <= kMaxAttnGemmBatch.
inline constexpr long long kMaxAttnGemmBatch = 65535;
AttnChoice choose_attention(const AttnShape& s, std::uint64_t max_workspace_bytes);
// Scale is applied by the first GEMM; this kernel does, per row r of
// `rows` = group_batches * H * L: causal (key > query row masked), the mask
// (batch element b0 + r / (H * L)), max-subtracted softmax in fp32, a row
// with every key masked -> zeros; probabilities to `probs` (float32: may be
// `scores` itself, or bfloat16). Causal: row l reads scores [0, min(l, S-1)]
// only, and writes probabilities for keys [0, kn) only, kn = min(S, the end
// of l's row block), the row blocks being [0, block_rows), [block_rows,
// 2 block_rows), ... (block_rows 0: one block of L rows) — what the P V
// GEMM of that block reads; the columns after kn are left as they were.
struct AttnSoftmaxArgs {
  float* scores;
  void* probs;
  int probs_bf16;
  long long rows, H, L, S, b0;
  long long block_rows;  // causal row blocks of the P V GEMMs (0: one)
  const void* mask;      // nullptr = none
  int mask_kind;         // 0 none, 1 bool (true = keep), 2 additive
  int mask_bf16;         // additive mask dtype
  long long m_s[4];      // mask strides for b, h, l, s (0 = broadcast)
  int causal;
};
int launch_attention_softmax(const AttnSoftmaxArgs& a, void* stream);
// cuDNN's fused attention with a mask (EngineOptions::cudnn_attention_masks)
// takes the mask as an additive bias. This kernel writes, per row r of the
// mask's [Bb, Hb, L] (Bb = 1 or B, Hb = 1 or H: the mask's own broadcast):
// `bias` (bfloat16 bits, [Bb, Hb, L, S] in rows of `ld` >= S elements, the
// rest dense; the padding left as it is): 0 where a bool mask keeps
// the key, -inf where it drops it, an additive mask's value as it is
// (finite values below -2^123, finfo.min, as -2^123: kernels_device.cuh); and
// `dead[r]` = 1 where the row keeps no key it may see (bool false or
// additive -inf on every key; causal: of the keys <= the row), else 0.
// cuDNN gives such a row NaN; attention_zero_rows then writes the zeros
// the flash kernels and the CPU reference give (math SDPA's _safe_softmax).
struct AttnBiasArgs {
  const void* mask;
  int mask_kind;  // 1 bool (true = keep), 2 additive bfloat16
  long long Bb, Hb, L, S, ld;
  long long m_s[4];  // mask element strides over (Bb, Hb, L, S); 0 = broadcast
  int causal;
  void* bias;           // Bb * Hb * L rows of ld bfloat16
  unsigned char* dead;  // Bb * Hb * L
};
int launch_attention_bias(const AttnBiasArgs& a, void* stream);
// Zeroes the bfloat16 rows out[b, h, l, :Dv] (strides o_s over b, h, l; the
// last dim dense) whose dead[(Bb == 1 ? 0 : b), (Hb == 1 ? 0 : h), l] is set
// (attention_bias's flags).
struct AttnZeroRowsArgs {
  void* out;
  long long B, H, L, Dv;
  long long o_s[3];
  const unsigned char* dead;
  long long Bb, Hb;
};
int launch_attention_zero_rows(const AttnZeroRowsArgs& a, void* stream);
// The pointer arrays of cuBLASLt's CUBLASLT_BATCH_MODE_POINTER_ARRAY GEMMs
// (the materialized attention over query/key/value whose heads step over b
// and h with two strides, so no single batch stride exists): array j of
// `arrays`, at out + j * array_stride (entries; >= n), gets for i in [0, n)
// the address base[j] + (i / per_b) * step_b[j] + (i % per_b) * step_h[j]
// (bytes): batch entry i is head i % per_b of batch element i / per_b.
inline constexpr int kMaxPtrArrays = 40;
struct PtrArraysArgs {
  int arrays;
  long long n, per_b, array_stride;
  const char* base[kMaxPtrArrays];
  long long step_b[kMaxPtrArrays], step_h[kMaxPtrArrays];
  void** out;  // arrays * array_stride pointers
};
int launch_ptr_arrays(const PtrArraysArgs& a, void* stream);
// dst[r, c] = src[r * ld + c] for r < rows, c < n, elements of `esize` bytes
// (2 or 4): rows padded to 16 bytes (src 16-byte aligned, ld * esize a
// multiple of 16) made dense (dst any esize-aligned address).
// cudaErrorInvalidValue otherwise.
struct UnpadArgs {
  const void* src;
  void* dst;
  long long rows, n, ld;
  int esize;
};
int launch_unpad_rows(const UnpadArgs& a, void* stream);
int launch_layer_norm(const void* x, const void* w, const void* b, void* y, void* mean, void* rstd, long long rows,
                      long long n, float eps, int bf16, int stats_bf16, void* stream);
int launch_softmax(const void* x, void* y, long long rows, long long n, int in_bf16, int out_bf16, void* stream);
// Reduction over the trailing `inner` elements after a permutation into
// [outer, inner] described by shape/strides (outer dims first).
struct ReduceArgs {
  const void* x;
  void* y;
  int rank_outer, rank_inner;
  long long outer_shape[kMaxRank], outer_strides[kMaxRank];
  long long inner_shape[kMaxRank], inner_strides[kMaxRank];
  long long n_outer, n_inner;
  int op;        // 0 any, 1 mean
  int in_dtype;  // 0 f32, 1 bf16, 2 i64, 3 bool
  int out_dtype;
};
int launch_reduce(const ReduceArgs& a, void* stream);
// Gathers of whole elements (raw bits, `elem_bytes` 1/2/4/8) with indices
// read from int64/int32 tensors: gather(self, dim, index) and
// index.Tensor(self, indices). For output element at position pos (rank
// `rank`, contiguous output of shape `shape`): source offset =
// sum_d pos[d] * x_strides[d] + sum_k idx_k(pos) * idx_x_stride[k], where
// idx_k(pos) = index tensor k at sum_d pos[d] * idx_strides[k][d]; an index
// outside [0, size_k) (negative ones first wrapped by + size_k when
// `negative_wraps`) sets *error_flag and stores zero bits.
inline constexpr int kMaxIndexTensors = 8;
struct IndexGatherArgs {
  const void* x;
  void* out;
  int elem_bytes;
  int rank;
  long long n;  // output elements
  long long shape[kMaxRank];
  long long x_strides[kMaxRank];
  int n_index;
  const void* idx[kMaxIndexTensors];
  int idx_int32[kMaxIndexTensors];
  long long idx_strides[kMaxIndexTensors][kMaxRank];
  long long idx_x_stride[kMaxIndexTensors];
  long long idx_size[kMaxIndexTensors];
  int negative_wraps;
  int* error_flag;
};
int launch_index_gather(const IndexGatherArgs& a, void* stream);
int launch_embedding(const void* weight, long long rows, long long dim, long long row_stride, int bf16,
                     const long long* idx, long long n, void* out, int* error_flag, void* stream);
int launch_fused(void* function, const FusedParams& p, void* stream);

}  // namespace safeckpt::engine::detail
