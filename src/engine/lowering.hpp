// src/engine/lowering.hpp — the lowering pass of one program at one concrete
// shape (not installed): its state and helpers. The passes are defined by
// section: plan.cpp (values, views, pointwise groups, normalizations,
// reductions, gathers, the pass itself), plan_gemm.cpp (cuBLASLt GEMMs,
// epilogues, sibling linears, misaligned N), plan_attention.cpp (SDPA),
// plan_conv.cpp (convolutions, batch-norm folding, pooling).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/conv.hpp"
#include "engine/graph_plans.hpp"
#include "engine/runtime.hpp"
#include "graph/internal.hpp"

namespace safeckpt::engine::detail {

using graph::Arg;
using graph::Node;
using graph::Program;

inline std::uint32_t esize(DType d) {
  return dtype_size(d);
}

inline bool floating(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16;
}
inline bool supported_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kInt64 || d == DType::kInt32 || d == DType::kBool;
}

// Broadcast strides of `t` against `out` (right-aligned).
inline std::vector<std::int64_t> bstrides(const DevTensor& t, const std::vector<std::int64_t>& out) {
  std::vector<std::int64_t> s(out.size(), 0);
  std::size_t off = out.size() - t.shape.size();
  for (std::size_t d = 0; d < t.shape.size(); ++d)
    s[off + d] = (t.shape[d] == 1 && out[off + d] != 1) ? 0 : t.strides[d];
  return s;
}

// One lowering of program `p` at concrete shapes into `plan` (build_plan,
// runtime.hpp): run() takes the nodes in the program's (topological) order,
// turns each into launch steps over DevTensors (add_step; pointwise nodes
// collect into the open group until flush()), records every arena buffer's
// first write and last read (def / use), and lays the arena out at the end
// (assign_arena). Single-threaded; lives for one build_plan call.
struct Lowering {
  Lowering(const Program& p_, Plan& plan_, EngineImpl& eng_, const std::vector<std::optional<DevTensor>>& weights_,
           bool fuse_, bool fuse_epilogue_)
      : p(p_), plan(plan_), eng(eng_), weights(weights_), fuse(fuse_), fuse_epilogue(fuse_epilogue_) {}
  const Program& p;
  Plan& plan;
  EngineImpl& eng;
  const std::vector<std::optional<DevTensor>>& weights;
  bool fuse;
  bool fuse_epilogue;

  std::vector<std::optional<DevTensor>> vals;
  std::vector<std::optional<std::int64_t>> syms;
  std::unordered_map<std::string, std::int64_t> symbols;
  std::vector<std::vector<std::size_t>> consumers;  // value -> node indices
  std::vector<char> is_output;
  std::vector<char> absorbed;  // node folded into an earlier step
  // GEMM choice key -> its entry in plan.tunes (the steps waiting to be timed together).
  std::map<std::string, std::size_t> pending_tunes;
  // cuDNN's bias of a masked attention (internal.hpp AttnBiasArgs): the
  // bfloat16 [bb, hb, L, S] bias in rows of sdpa_bias_ld(S) and the [bb,
  // hb, L] dead-row flags.
  struct AttnBias {
    DevTensor bias, dead;
    long long bb = 1, hb = 1;
  };
  // (mask value, causal, bb, hb, L, S) -> its cuDNN bias (lower_sdpa,
  // attention_bias).
  std::map<std::tuple<std::int32_t, int, long long, long long, long long, long long>, AttnBias> bias_of_mask;
  const Node* node = nullptr;
  std::size_t node_index = 0;

  // Liveness per buffer: first and last step; whether a step has written it
  // yet (def(): its first write starts it).
  std::vector<std::int64_t> first_step, last_step;
  std::vector<char> def_seen;
  // add_step() appends to plan.prep_steps instead of plan.steps.
  bool prep = false;
  // Weight value id -> its channels-last copy (a kPrepared buffer).
  std::map<std::int32_t, DevTensor> prepared_of;

  // The open pointwise group.
  struct Group {
    bool open = false;
    std::vector<std::int64_t> shape;
    FusedKernel k;
    std::vector<DevTensor> ins;
    std::map<std::int32_t, std::int32_t> in_of_value;   // value id -> input index
    std::map<std::int32_t, std::int32_t> reg_of_value;  // value id -> micro-op
    std::vector<std::int32_t> produced;
    std::set<std::size_t> nodes;
    std::string names;
  } g;

  Unexpected fail(ErrorCode c, const std::string& what) const {
    return make_error(c, "node '" + node->name + "' (" + node->target + "): " + what);
  }

  // ------------------------------------------------------------ helpers
  // Node `n`'s argument `name` (by schema position), nullptr when it has none.
  static const Arg* arg_of(const Node& n, std::string_view name) {
    for (std::size_t k = 0; k < n.schema->args.size(); ++k)
      if (n.schema->args[k].name == name) return &n.args[k];
    return nullptr;
  }
  const Arg& arg(std::string_view name) const {
    static const Arg none;
    const Arg* a = arg_of(*node, name);
    return a != nullptr ? *a : none;
  }
  Result<std::int64_t> sym(const graph::SymInt& s);
  Result<std::int64_t> integer(std::string_view name) {
    const Arg& a = arg(name);
    if (a.ints.size() != 1) return fail(ErrorCode::kMalformed, "argument '" + std::string(name) + "' is not an int");
    return sym(a.ints[0]);
  }
  Result<std::vector<std::int64_t>> ints(std::string_view name);
  Result<double> scalar(std::string_view name);
  Result<std::vector<std::int64_t>> shape_of(std::int32_t v);
  Result<std::int64_t> norm_dim(std::int64_t d, std::size_t rank) const {
    auto r = static_cast<std::int64_t>(rank == 0 ? 1 : rank);
    if (d < -r || d >= r) return fail(ErrorCode::kMalformed, "dimension out of range");
    return d < 0 ? d + r : d;
  }

  std::int32_t new_buf(std::uint64_t bytes);
  DevTensor new_tensor(DType d, std::vector<std::int64_t> shape, bool channels_last = false);
  // Marks a read of `t` by the step about to be added.
  void use(const DevTensor& t) {
    if (t.buf >= 0)
      last_step[static_cast<std::size_t>(t.buf)] =
          std::max(last_step[static_cast<std::size_t>(t.buf)], static_cast<std::int64_t>(plan.steps.size()));
    // A weight (read in place): the next step reads it.
    if (t.buf < 0 && t.direct != nullptr && t.numel() > 0) step_weights.push_back(plan.ptr(t));
  }
  // Marks a write of `t` by the step about to be added. A buffer lives from
  // its first write: later writes (the pieces of a cat, a split GEMM's
  // tail, row classes) leave its start where it is.
  void def(const DevTensor& t) {
    if (t.buf < 0) return;
    const auto b = static_cast<std::size_t>(t.buf);
    if (def_seen[b] == 0) first_step[b] = static_cast<std::int64_t>(plan.steps.size());
    def_seen[b] = 1;
  }
  // `kind` / `shapes` empty: from the current node (its op, its tensor operands).
  void add_step(std::string name, std::function<int(cudaStream_t)> fn, std::string kind = {}, std::string shapes = {}) {
    if (kind.empty()) kind = node_kind();
    if (shapes.empty()) shapes = node_shapes();
    (prep ? plan.prep_steps : plan.steps)
        .push_back(Step{std::move(name), std::move(fn), std::move(kind), std::move(shapes), std::move(step_weights)});
    step_weights.clear();
  }
  static std::string shape_text(const std::vector<std::int64_t>& s) {
    std::string r = "[";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
    return r + "]";
  }
  std::string node_kind() const;
  std::string node_shapes() const;
  std::vector<const void*> step_weights;  // use()d since the last add_step

  Result<DevTensor> value(std::int32_t id);
  Result<DevTensor> tensor(std::string_view name) {
    const Arg& a = arg(name);
    if (a.kind != Arg::Kind::kTensor)
      return fail(ErrorCode::kMalformed, "argument '" + std::string(name) + "' is not a tensor");
    return value(a.tensor);
  }
  Result<std::optional<DevTensor>> opt_tensor(std::string_view name) {
    const Arg& a = arg(name);
    if (a.kind != Arg::Kind::kTensor) return std::optional<DevTensor>{};
    SAFECKPT_TRY(DevTensor t, value(a.tensor));
    return std::optional<DevTensor>{t};
  }
  void set_out(std::size_t k, const DevTensor& t) {
    std::int32_t id = node->outputs.size() > k ? node->outputs[k] : -1;
    if (id >= 0) vals[static_cast<std::size_t>(id)] = t;
  }
  Result<DType> out_dtype(std::size_t k = 0) {
    if (node->outputs.size() <= k || node->outputs[k] < 0) return fail(ErrorCode::kMalformed, "no output");
    DType d = p.values[static_cast<std::size_t>(node->outputs[k])].dtype;
    if (!supported_dtype(d))
      return fail(ErrorCode::kUnsupported, "dtype " + std::string(dtype_name(d)) + " has no GPU kernel");
    return d;
  }

  // `in` (broadcast to `shape`) copied into `out` (any strides, `out`'s
  // dtype): a one-op generated kernel.
  void emit_copy(const DevTensor& in, const DevTensor& out, std::vector<std::int64_t> shape, std::string name,
                 std::string kind);

  // A contiguous copy of `t`, or `t` itself.
  Result<DevTensor> contiguous(const DevTensor& t) {
    if (t.contiguous()) return t;
    DevTensor out = new_tensor(t.dtype, t.shape);
    emit_copy(t, out, t.shape, "copy(" + node->name + ")", "copy");
    return out;
  }

  void emit_fused(FusedKernel k, std::vector<DevTensor> ins, std::vector<DevTensor> outs,
                  std::vector<std::int64_t> shape, std::string name, std::string kind = "fused");

  // --------------------------------------------------------- pointwise
  Status flush();

  // Adds the current node (pointwise) to the group; `build` appends its
  // micro-ops given operand registers.
  Status pointwise(const std::vector<std::string_view>& tensor_args,
                   const std::function<Result<MicroOp>(const std::vector<std::int32_t>&)>& build);

  Status lower_pointwise(const std::string& op);

  // --------------------------------------------------------------- views
  Status lower_view(const std::string& op);

  // --------------------------------------------------------------- GEMM
  struct Mat {
    bool trans = false;  // column-major storage of the logical [rows, cols]
    std::int64_t ld = 0;
  };
  static std::optional<Mat> layout(std::int64_t rows, std::int64_t cols, std::int64_t sr, std::int64_t sc) {
    if ((sc == 1 || cols == 1) && (rows == 1 || sr >= std::max<std::int64_t>(cols, 1)))
      return Mat{false, rows == 1 ? std::max<std::int64_t>(cols, 1) : sr};
    if ((sr == 1 || rows == 1) && (cols == 1 || sc >= std::max<std::int64_t>(rows, 1)))
      return Mat{true, cols == 1 ? std::max<std::int64_t>(rows, 1) : sc};
    return std::nullopt;
  }

  // D[M,N] (+)= A[M,K] @ B[K,N] (+ bias[N]) with an optional activation.
  // a/b: rank 2 or 3 (batch first) views; `out` row-major with row stride
  // out.strides[r - 2] (N, or more: the padded output of lower_gemm). `align`: the bytes every operand pointer
  // is aligned to (cuBLASLt assumes 256 unless told, CUBLASLT_MATMUL_PREF_
  // MIN_ALIGNMENT_*; lower_gemm's column tail is 16-byte aligned).
  // `c_in`: C read from there instead of `out` (beta != 0; same layout as
  // `out`, 256-byte aligned: a residual added in the epilogue).
  Status gemm(DevTensor a, DevTensor b, const DevTensor& out, const std::optional<DevTensor>& bias, int act,
              float alpha, float beta, std::uint32_t align = 256, const std::optional<DevTensor>& c_in = std::nullopt);

  // The activation that may be fused into the GEMM producing value `v`
  // (its node absorbed).
  int epilogue_for(std::int32_t v) {
    const int act = epilogue_act(v);
    if (act != 0) absorbed[consumers[static_cast<std::size_t>(v)][0]] = 1;
    return act;
  }
  // ... the same, nothing absorbed: 0 none, 1 relu, 2 tanh gelu.
  int epilogue_act(std::int32_t v) const;

  // A residual add that may join the epilogue of the GEMM producing value
  // `v` (written as `g_out`, dense row-major) as cuBLASLt's C input (beta =
  // 1): D = A B + C (+ bias). The pattern of a transformer block's
  // output projections (HF BERT's `dense -> dropout -> + input`, nanoGPT's
  // `x + c_proj(...)`, addmm -> view -> add in core IR): `v` flows through
  // identities (inference dropout, view / reshape of the dense result) to an
  // add.Tensor with alpha 1 whose other operand is already computed, has the
  // same shape, dtype and dense layout, and starts a buffer (256-byte
  // aligned, what cuBLASLt assumes). Every value on the way has that one
  // reader and is no program output. inductor keeps this add a separate
  // kernel; here it costs no pass over the activations. PyTorch rounds the
  // GEMM's output (with its bias) to the dtype before the add, and cuBLASLt
  // adds C before the bias: results can differ in the last bit, float32 too.
  struct Residual {
    DevTensor c;                      // the other operand, viewed as the GEMM's output
    std::size_t add_node = 0;         // the add (absorbed, with `chain`)
    std::vector<std::size_t> chain;   // the identities between
    std::vector<std::int64_t> shape;  // the add's output shape
  };
  std::optional<Residual> residual_for(std::int32_t v, const DevTensor& g_out);

  // Columns [from, from + n) of `t` (its last dim), a view.
  static DevTensor cols(DevTensor t, std::int64_t from, std::int64_t n) {
    t.offset += from * t.strides.back();
    t.shape.back() = n;
    return t;
  }

  // A linear's input [..., K] as the GEMM's rows [M, K]: a view where the
  // leading dims collapse into one stride, else a contiguous copy.
  Result<DevTensor> linear_rows(DevTensor a);

  // Horizontal GEMM fusion (EngineOptions::fuse_sibling_gemms): the
  // aten::linear nodes, this one first, that read this node's input and
  // whose weight (and bias, all or none) are checkpoint tensors of the
  // input's dtype with K columns, as HF BERT's query / key / value or
  // LLaMA's gate / up projections. A member's N is a multiple of 16 bytes'
  // worth of elements (each output block starts 16-byte aligned, as the
  // attention kernels and cuDNN want it), and no activation or residual
  // add would join its epilogue (those keep their own GEMM). Fewer than two:
  // none (the node lowers alone).
  std::vector<std::size_t> sibling_linears();

  // One GEMM for the sibling linears `group` (sibling_linears; this node
  // first): a prep step copies their weights (and biases) into one
  // [sum N, K] kPrepared tensor, the GEMM writes [M, sum N], and each
  // member's output is its columns, a view with rows sum N apart (the
  // views and attention read such strides; a reader that needs dense rows
  // copies). The other members are absorbed. Costs the weights' size again
  // in device memory (Plan::prepared_bytes).
  Status lower_sibling_linears(const std::vector<std::size_t>& group);

  // Whether `a` (rows [M, K], unit column stride), `b` ([K, N], a
  // weight's rows as its columns: unit row stride) and the dense output
  // `g_out` ([M, N], rows N apart) allow the row classes: A's rows and B's
  // columns 16-byte aligned, N at least two edges wide, at least as many
  // rows as classes.
  bool row_classes_apply(const DevTensor& a, const DevTensor& b, const DevTensor& g_out) const;
  // Row classes of a GEMM whose dense output rows are misaligned
  // (EngineOptions::gemm_row_classes): with e-byte elements and N * e not a
  // multiple of 16, row r of D[M, N] starts at r * N * e bytes, so the rows
  // r = j (mod P), P = 16 / gcd(N * e, 16), all start at the same offset
  // modulo 16, and their columns from c0(j) = (-j * N) mod (16 / e) on start
  // 16-byte aligned. Class j's GEMM (A's rows j, j + P, ...; ldc = P * N)
  // writes those columns straight into D, as many as a multiple of 16 / e
  // allows; the at most 16 / e - 1 columns before c0(j) and the fewer than
  // 16 / e after lie in D's first and last 16 / e columns, which two narrow
  // GEMMs over every row compute into an aligned scratch and two copies put
  // in place (after the class GEMMs: where they overlap, the narrow GEMMs'
  // values stay; both are the same dot products, rounded alike up to the
  // summation order). No padded output and no copy of it. The classes:
  // gemm_row_classes (runtime.hpp). A bias (a checkpoint tensor) is read
  // from a kPrepared copy holding each class's columns and both edges'
  // at 16-byte aligned starts (written once by a prep step).
  Status gemm_by_row_classes(const DevTensor& a, const DevTensor& b, const DevTensor& d,
                             const std::optional<DevTensor>& bias, int act, float alpha);

  // The least multiply-adds (M * N * K) for which lower_gemm splits a GEMM
  // with a misaligned N: below it the two extra launches cost more than the
  // slower kernel saves.
  static constexpr double kSplitGemmMinMacs = 1u << 27;

  Status lower_gemm(const std::string& op);

  // ------------------------------------------------------- fixed kernels
  Status lower_layer_norm(bool native);

  Status lower_softmax();

  Status lower_reduce(bool any);

  Status lower_embedding();

  // cat(tensors, dim): one copy kernel per input into its slice of the
  // output (a strided view). Legacy empty 1-d inputs are skipped as ATen
  // and the CPU interpreter do.
  Status lower_cat();

  // gather(self, dim, index) and index.Tensor(self, indices) as one
  // indexed-load kernel (IndexGatherArgs), the bounds the CPU interpreter
  // checks enforced on the device (the run's error flag).
  Status lower_index(bool is_gather);

  // _assert_tensor_metadata(a, size?, stride?, dtype?, ...): checked here,
  // once per plan, on what the plan knows (dtype, sizes); no launch.
  Status lower_assert_metadata();

  Status lower_sdpa();

  // The batch and head extents of `aa`'s mask: 1 where it is broadcast.
  static long long mask_batch(const AttnArgs& aa) { return aa.B == 1 || aa.m_s[0] == 0 ? 1 : aa.B; }
  static long long mask_heads(const AttnArgs& aa) { return aa.H == 1 || aa.m_s[1] == 0 ? 1 : aa.H; }
  // The bias of `mask` (value `mask_value`) for `aa`'s shape and causal
  // flag: the one an earlier attention on the same value made, else a new
  // attention_bias step.
  AttnBias attention_bias(const AttnArgs& aa, const DevTensor& mask, std::int32_t mask_value);

  // cuDNN's fused attention geometry of a flash-path attention (conv.hpp
  // SdpaGeometry): q/k/v as read, y the output with heads inside rows.
  static SdpaGeometry sdpa_geometry(const AttnArgs& aa, const DevTensor& q, const DevTensor& k, const DevTensor& v,
                                    const DevTensor& y);
  // Whether cuDNN's fused attention can run this step: no mask but the
  // causal one (any with EngineOptions::cudnn_attention_masks),
  // sdpa_graph_applies, q/k/v/y of rank 4 with no zero (broadcast) strides
  // and 16-byte aligned base addresses.
  bool sdpa_candidate(const AttnArgs& aa, const DevTensor& q, const DevTensor& k, const DevTensor& v,
                      const DevTensor& y) const;

  static std::string attn_shapes(const AttnArgs& aa, const char* path);

  // Byte alignment (<= 256) of every address base + i * step.
  static std::uint32_t alignment(std::uint64_t base, std::uint64_t step) {
    std::uint64_t x = base | step | 256;
    return static_cast<std::uint32_t>(x & (~x + 1));
  }
  std::uint64_t base_bytes(const DevTensor& t) const {
    auto off = static_cast<std::uint64_t>(t.offset) * esize(t.dtype);
    return t.buf >= 0 ? off : reinterpret_cast<std::uintptr_t>(t.direct) + off;  // arena buffers: 256-aligned
  }

  // Causal attention's row blocks on the materialized path: from
  // kCausalSplitMinRows query rows on, the score and P V GEMMs run per block
  // of rows [r0, r1) over the keys [0, min(S, r1)) only (top-left causal, as
  // is_causal: row r keeps keys 0..r), skipping the scores the mask would
  // discard: with 4 blocks 62.5 % of the products of one full GEMM each
  // (inductor's SDPA kernels skip those tiles too). The softmax kernel never
  // reads a score above the diagonal, and writes probabilities (zeros past
  // the diagonal) only up to the keys its row's block reads
  // (AttnSoftmaxArgs::block_rows).
  static constexpr long long kCausalSplitMinRows = 512;
  static constexpr long long kCausalBlockRows = 256;
  static constexpr long long kCausalMaxBlocks = 8;
  static std::vector<std::pair<long long, long long>> causal_blocks(long long L, bool causal);

  // Attention with the scores in the arena (safeckpt/engine.hpp,
  // "Attention"): per group of `c.group_batches` batch elements, S = scale
  // * Q K^T (fp32), mask + softmax in place (bf16: probabilities to a bf16
  // buffer), O = P V; causal rows in blocks (causal_blocks). Column-major
  // for cuBLASLt: a row-major [r, c] matrix with row stride ld is a
  // column-major [c, r] one with the same ld.
  // `ptr_batch`: q/k/v step over b and h with two strides (heads split from
  // a [B, S, H*D] projection), so the GEMMs take CUBLASLT_BATCH_MODE_POINTER_ARRAY
  // operands: per group one launch fills the arrays (launch_ptr_arrays, an
  // arena buffer), and the output `y` is written with heads inside rows
  // ([B, L, H, Dv] in memory, as the flash kernels), so the usual transpose
  // + view back is a view. Errors before any step or buffer is made
  // (cuBLASLt refusing a layout: kDevice) leave the plan as it was.
  Status lower_sdpa_materialized(const AttnArgs& aa, const AttnChoice& c, const DevTensor& q, const DevTensor& k,
                                 const DevTensor& v, const std::optional<DevTensor>& mask, const DevTensor& y,
                                 bool ptr_batch);

  Status lower_sym();

  // ------------------------------------------------- convolutional programs
  // Convolutions through cuDNN (conv.hpp); the conv bias and inference
  // batch_norm as micro-ops of the open pointwise group (so a relu or a
  // residual add after them joins the same kernel); pooling as fixed kernels.
  std::shared_ptr<DnnHandle> dnn;  // made on the first convolution of a device plan
  // Batch norm folding's bfloat16 graph plans and fused attention's cuDNN
  // plans (EngineOptions::cudnn_attention), one slot per geometry
  // (graph_plans.hpp), filled by prepare_graph_plans after lowering: cuDNN's
  // engines for these graphs compile their kernels at run time, so the
  // geometries are compiled together on several threads (in the background
  // with EngineOptions::background_graph_plans) instead of one by one as the
  // lowering meets them. A slot left empty (cuDNN has no engine, or it is
  // still being built) makes its steps take their fallback at run time.
  std::map<std::string, std::shared_ptr<GraphSlot>> graph_plans;

  // An operand of chain(): a program value (a register when the open group
  // produced it), or a tensor loaded with broadcasting against the output.
  struct Operand {
    std::int32_t value = -1;
    DevTensor t;
  };
  // Emits a micro-op into the open group and returns its register.
  using Emit = std::function<std::int32_t(MicroOp)>;
  // Adds the current node, computing output 0 of `shape` from `operands`, to
  // the pointwise group (as pointwise() does for single ops): `build` gets
  // the operands' registers and returns the register of the result.
  Status chain(const std::vector<Operand>& operands, const std::vector<std::int64_t>& shape,
               const std::function<std::int32_t(const std::vector<std::int32_t>&, const Emit&)>& build);

  static MicroOp micro(MicroKind k, DType d, std::int32_t a, std::int32_t b = -1, double s0 = 0);

  // A per-channel vector [C] as [C, 1, ...] against an N, C, ... tensor of
  // rank `rank` (broadcast strides 0 over the other dimensions).
  Result<DevTensor> per_channel(const DevTensor& t, std::size_t rank, std::int64_t channels);

  // A kPrepared buffer (written by prep steps, read by every run).
  DevTensor prepared_tensor(DType d, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides);

  // Convolution filter `w` (value `id`) in K,R,S,C/groups order: itself when
  // its memory already is; a checkpoint weight's copy in a kPrepared buffer,
  // written once by a prep step (one per weight value, shared by the
  // convolutions that read it); a computed filter's copy in the arena, made
  // by every run.
  Result<DevTensor> channels_last_weight(const DevTensor& w, std::int32_t id);

  // cuDNN takes int sizes.
  static bool fits_int(std::int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

  // ------------------------------------------------- batch norm folding
  // (EngineOptions::fold_batch_norm; safeckpt/engine.hpp "Batch norm
  // folding"). What folds into the convolution producing value `y`: an
  // inference batch_norm as y's only use, its running statistics (weight and
  // bias too, when present) checkpoint tensors of K floats, then relu as
  // its result's only use — or add (alpha 1) with a value computed before the
  // convolution, in the convolution output's layout (the residual of a ResNet
  // block), then relu. nullopt: nothing folds (the ops run as before).
  struct ConvFold {
    std::size_t bn = 0, relu = 0;
    std::optional<std::size_t> add;
    std::int32_t z = -1;    // the residual value (with `add`)
    std::int32_t out = -1;  // relu's output: the fused step's result
    std::int32_t gamma = -1, beta = -1, mean = -1, var = -1;
    float eps = 0;
  };
  // The node reading value `v`, when it is the only read (once) and `v` is
  // not a program output.
  std::optional<std::size_t> only_use(std::int32_t v) const {
    if (v < 0 || is_output[static_cast<std::size_t>(v)] != 0) return std::nullopt;
    const auto& cs = consumers[static_cast<std::size_t>(v)];
    if (cs.size() != 1) return std::nullopt;
    return cs[0];
  }
  // A per-channel checkpoint tensor of `k` float32s (value id), or -1 when
  // `name` is absent; nullopt when it does not qualify.
  std::optional<std::int32_t> fold_operand(const Node& n, std::string_view name, std::int64_t k, bool required) const;
  std::optional<ConvFold> conv_fold_for(std::int32_t y, const std::vector<std::int64_t>& yshape, bool nhwc,
                                        DType dt) const;

  Status lower_conv();

  // Fills the graph slots of a device plan (graph_plans.hpp): those the
  // engine or the persistent cache keeps are restored now (up to 16 threads:
  // the H100/H200 hosts have 16 cores); those cuDNN must build are built now
  // too, or with EngineOptions::background_graph_plans (compiled plans) on a
  // PendingGraphs whose result the engine installs between runs. Errors:
  // what graph_conv_prepare returns (the first, by geometry order) for a
  // graph built now.
  Status prepare_graph_plans();

  // The convolution with `f` folded in. A prep step computes the batch
  // norm's per-channel scale and bias from the checkpoint's tensors (float32
  // kPrepared buffers). Without a graph plan (float32): the prep step also
  // writes the filter times the scale (in the convolution's layout) and the
  // step runs cudnnConvolutionBiasActivationForward. With `gp` (bfloat16):
  // the filter stays, the step runs the operation graph with the scale in
  // its epilogue (`gp`'s plan is set by prepare_graph_plans; none: the
  // unfused path below). Should cuDNN refuse the fused call on its first run, or a
  // pointer not be 16-byte aligned, the step runs the plain convolution and
  // launch_bias_add_relu instead: the same values either way.
  Status lower_folded_conv(const ConvFold& f, const ConvGeometry& cg, const std::shared_ptr<ConvPlan>& cp,
                           const std::shared_ptr<GraphSlot>& gp, bool graph, const DevTensor& x, const DevTensor& w_in,
                           const std::optional<DevTensor>& conv_bias, const DevTensor& y);

  // batch_norm(training=False) / _native_batch_norm_legit_no_training, as
  // ATen's batch_norm_transform_input: weight * (x - mean) * invstd + bias,
  // invstd = 1 / sqrt(running_var + eps), in float, rounded once.
  Status lower_batch_norm(bool native);

  Status lower_adaptive_avg_pool2d();

  // max_pool2d / max_pool2d_with_indices: values only (a program that reads
  // the indices is refused). Output sizes come from the shape pass
  // (ceil_mode included).
  Status lower_max_pool2d(bool with_indices);

  Status lower_node();

  // ------------------------------------------------------------ the pass
  Status run(const std::vector<std::pair<std::int32_t, DevTensor>>& inputs);
  Result<DevTensor> contiguous_copy(const DevTensor& t) {
    DevTensor out = new_tensor(t.dtype, t.shape);
    emit_copy(t, out, t.shape, "output copy", "copy");
    return out;
  }

  // Offsets by liveness over the arena buffers (graph::layout_arena: the
  // planner make_plan uses), each rounded up to 256 bytes (cudaMalloc's
  // alignment, what cuBLASLt and cuDNN want).
  void assign_arena();
};

}  // namespace safeckpt::engine::detail
