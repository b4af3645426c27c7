// safeckpt/graph_plan.hpp — the execution planner of the engine (issue 14):
// concrete shapes for concrete symbol values, a schedule of kernel-sized
// Steps (GEMMs with their epilogues, attention, fused elementwise chains,
// views as aliases, ...), and a static memory plan for activations. Host
// only, CUDA-free: the GPU engine (safeckpt::cuda and above) turns an
// ExecutionPlan into kernels; nothing here launches anything.
//
// Pipeline: Pt2Archive::program -> validate() (safeckpt/graph.hpp) ->
// bind_symbols (user input shapes -> symbol values) -> infer_shapes /
// make_plan. The planner trusts the validated IR (STYLE.md "verify the
// program once, then plan"), but re-checks what it relies on cheaply: the
// graph order (every value produced once, before its uses) and the shapes
// (the interpreter's shape pass, at the bound sizes).
//
// Sources: the step kinds follow what torch/_inductor groups into one kernel
// (scheduler.py: "fusion" of pointwise nodes, mm templates with epilogues,
// fx_passes/fuse_attention.py for the decomposed attention patterns); the
// memory plan is the classic greedy-by-size offset assignment (TFLite
// arena planner, "Efficient Memory Management for Deep Neural Net
// Inference", Pisarchyk & Lee 2020); view rules follow aten's computeStride
// (aten/src/ATen/TensorUtils.cpp) and the view ops' stride formulas
// (aten/src/ATen/native/TensorShape.cpp); stances are torch.compiler.set_stance
// (PyTorch 2.6, torch/compiler/__init__.py).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "safeckpt/dtype.hpp"
#include "safeckpt/error.hpp"
#include "safeckpt/graph.hpp"

namespace safeckpt::graph {

// ------------------------------------------------------------- stances

// How an engine compiles (torch.compiler.set_stance, PyTorch 2.6+, spelled
// as there):
//  - kDefault: compile a plan on the first call for each concrete shape;
//  - kForceEager: never compile; run one op at a time (PlanOptions::fuse =
//    false: the differential baseline);
//  - kEagerThenCompile: the first call for a new shape runs eagerly, later
//    calls with that shape compile;
//  - kFailOnRecompile: after the first plan, a call that would need a new
//    plan (another shape) is an error naming the dimension that changed.
// The engine implements them; the enum and its parser live here so that the
// engine, the cache key and the CLI (`--stance`) share one spelling.
enum class Stance : std::uint8_t { kDefault = 0, kForceEager = 1, kEagerThenCompile = 2, kFailOnRecompile = 3 };

// "default", "force_eager", "eager_then_compile", "fail_on_recompile"
// (exactly, as set_stance spells them). Errors: kInvalidArgument naming the
// text and the four accepted spellings.
Result<Stance> parse_stance(std::string_view text);
// The set_stance spelling of `s`.
std::string_view stance_name(Stance s) noexcept;

// ---------------------------------------------------------- symbols, shapes

// Concrete values of a program's symbols (the names of its
// range_constraints, e.g. "s95" -> 4).
struct SymbolBinding {
  std::map<std::string, std::int64_t, std::less<>> values;
  // "s75=16;s95=4;" (sorted by name): the canonical text used in plan
  // fingerprints and cache keys.
  std::string to_string() const;
};

// Binds the program's symbols from the shapes of its user inputs
// (input name -> sizes), with the checks run_cpu() makes on its inputs:
// every user input present and no other name, rank, static dims equal, a
// dynamic dim `Symbol('s')` binds s (one value per symbol, within the
// symbol's range_constraints, inclusive), and dims that are expressions of
// symbols (e.g. 2*s) must equal their value. `program` must be validated.
// Errors: kInvalidArgument naming the input, the dim, its value and the
// range or the expected value (e.g. "input 'idx' dim 0 is 65, outside the
// range of s95 [1, 64]"); kInvalidArgument for a program not validated.
Result<SymbolBinding> bind_symbols(const Program& program,
                                   const std::map<std::string, std::vector<std::int64_t>>& input_shapes,
                                   const GraphLimits& limits = {});

// The concrete layout of one tensor value. Units: elements (strides,
// storage_offset) and bytes (nbytes).
struct ConcreteShape {
  bool defined = false;  // false: no node produces the value (an unnamed/unused output) and it is no input
  DType dtype = DType::kFloat32;
  std::vector<std::int64_t> sizes;
  // Strides of the value as the planned program lays it out: inputs and
  // weights: contiguous (what the engine is given; a strided weight view is
  // made contiguous when bound); every kernel output: contiguous row-major;
  // a view (kView step): the strides the view op gives over its base
  // (aten's formulas), storage_offset counted from the base's first element.
  std::vector<std::int64_t> strides;
  std::int64_t storage_offset = 0;
  std::uint64_t numel() const noexcept;
  std::uint64_t nbytes() const noexcept;  // numel * element size (the view's extent, not its base's)
  bool is_contiguous() const noexcept;    // row-major dense (size-1 dims ignored)
};

// dtype and sizes of every tensor value (indexed by tensor value id, as
// Program::values) at the concrete symbol values in `binding`, computed by
// the CPU interpreter's shape pass (the same kernels' shape logic as
// check_shapes/run_cpu: each result is compared with the recorded
// tensor_meta), plus strides/storage_offset as described above.
// Errors: kInvalidArgument (program not validated; a symbol of the program
// missing from `binding`, a name that is not one of its symbols, a value
// outside range_constraints — naming the symbol); kMalformed (the program
// disagrees with itself at these sizes, naming node and value);
// kLimitExceeded (GraphLimits::max_tensor_elements / max_run_bytes).
Result<std::vector<ConcreteShape>> infer_shapes(const Program& program, const SymbolBinding& binding,
                                                const GraphLimits& limits = {});

// ------------------------------------------------------------- the plan

enum class StepKind : std::uint8_t {
  kGemm,       // linear / addmm / mm / bmm (+ epilogue ops, below)
  kAttention,  // scaled_dot_product_attention, or the decomposed core-IR pattern
  kConv,       // conv2d / convolution
  kNorm,       // layer_norm / native_layer_norm / batch_norm (eval) / _native_batch_norm_legit_no_training
               // (an RMSNorm pattern is not matched: allowlist/ops.schema has no pow/rsqrt to spell one)
  kSoftmax,    // _softmax
  kReduction,  // any.dim / mean.dim / adaptive_avg_pool2d / max_pool2d(_with_indices)
  kFused,      // a chain of elementwise ops: `ops` below
  kGather,     // embedding (the only gather op in allowlist/ops.schema)
  kView,       // view / permute / transpose / unsqueeze / expand / flatten / split: an alias, no kernel
  kCopy,       // clone (always a copy: no alias elision yet), or a view/flatten whose input strides
               // do not allow an alias (materialized contiguous)
  kOther,      // creation ops (arange, full, full_like, scalar_tensor) and anything else
};
std::string_view step_kind_name(StepKind k) noexcept;

// Elementwise ops a code generator emits from a template (no strings from
// the file reach it). Semantics as the ATen op named (ATen type promotion
// is already resolved: FusedOp::dtype is the result dtype, from infer_shapes).
enum class EwOp : std::uint8_t {
  kAdd,         // add.Tensor / add_.Tensor: a + alpha * b
  kSub,         // sub.Tensor: a - alpha * b
  kMulScalar,   // mul.Scalar: a * scalar
  kRelu,        // relu / relu_
  kGelu,        // gelu approximate="none" (erf)
  kGeluTanh,    // gelu approximate="tanh"
  kEqScalar,    // eq.Scalar: a == scalar (bool)
  kLeScalar,    // le.Scalar: a <= scalar (bool)
  kLogicalAnd,  // logical_and
  kLogicalNot,  // logical_not
  kWhere,       // where.self: a ? b : c
};
std::string_view ew_op_name(EwOp op) noexcept;

// Where a fused op reads an operand.
struct FusedOperand {
  enum class Kind : std::uint8_t {
    kNone,         // no operand in this position
    kInput,        // Step::inputs[index], read with its ConcreteShape (broadcast to the op's shape)
    kTemp,         // the result of Step::ops[index] (index < this op's position)
    kAccumulator,  // kGemm epilogues: the GEMM result (alpha/beta/bias of addmm/linear applied)
  };
  Kind kind = Kind::kNone;
  std::int32_t index = -1;
};

struct FusedOp {
  EwOp op = EwOp::kAdd;
  std::array<FusedOperand, 3> in{};  // a, b, c (kWhere: condition, then, else)
  double scalar = 0;                 // kMulScalar / kEqScalar / kLeScalar: the Scalar (may be +-inf)
  double alpha = 1;                  // kAdd / kSub
  DType dtype = DType::kFloat32;     // result dtype
  std::int32_t node = -1;            // Program::nodes index it comes from
  std::int32_t value = -1;           // tensor value id it produces
};

// kAttention: what the kernel needs. Tensors are value ids (ConcreteShape
// gives their layout); q/k/v are [B, H, S, D]-shaped values (for the
// decomposed pattern: the values before the scale multiplications and the
// key's transpose).
struct AttentionInfo {
  std::int32_t query = -1, key = -1, value = -1;
  std::int32_t mask = -1;     // additive float mask or boolean mask, broadcast to [B, H, Sq, Sk]; -1: none
  bool mask_is_bool = false;  // SDPA: a bool mask keeps `true`
  bool is_causal = false;
  // Softmax scale applied to q·k^T. SDPA with scale=None: 1/sqrt(D) is
  // filled in; the decomposed pattern: the product of its scale constants.
  double scale = 0;
  // The decomposed pattern includes the 2.11 decomposition's fix-up (rows with
  // no allowed key give 0, not NaN): the fused kernel must do the same.
  bool zero_fully_masked_rows = false;
};

struct Step {
  StepKind kind = StepKind::kOther;
  std::vector<std::int32_t> nodes;    // Program::nodes indices, in program order; nodes.front()/back() anchor it
  std::vector<std::int32_t> inputs;   // tensor value ids read from outside the step (first-use order)
  std::vector<std::int32_t> outputs;  // tensor value ids the step materializes (read later, program outputs, or
                                      // named outputs nobody reads); for kView: the alias values
  std::vector<FusedOp> ops;           // kFused: the chain; kGemm: the epilogue (may be empty)
  AttentionInfo attention;            // kAttention only
};

struct PlanOptions {
  bool fuse = true;  // false: one step per node (stance force_eager)
  // Byte alignment of every arena slot (power of two, >= 16). 256 is what
  // cudaMalloc guarantees and what cuBLASLt/cuDNN prefer.
  std::uint64_t alignment = 256;
  std::uint32_t max_fused_ops = 16;  // ops in one kFused step / one epilogue (>= 1)
  // Caps (kLimitExceeded): slots the memory planner places (its cost is
  // quadratic in the slots alive at once) and the arena size.
  std::uint64_t max_slots = 1u << 16;
  std::uint64_t max_arena_bytes = 1ull << 40;
  // "fuse=1;alignment=256;max_fused_ops=16;" — the canonical text in plan
  // fingerprints and cache keys.
  std::string to_string() const;
};

// One activation buffer: a value's bytes in the arena. Views have no slot;
// they alias the slot of their base (ExecutionPlan::alias_of).
struct MemorySlot {
  std::int32_t value = -1;      // tensor value id
  std::uint64_t offset = 0;     // bytes from the arena start, a multiple of PlanOptions::alignment
  std::uint64_t bytes = 0;      // the value's nbytes rounded up to the alignment
  std::int32_t first_step = 0;  // step that writes it
  std::int32_t last_step = 0;   // last step that reads it or any view of it (the last step for program outputs)
};

// Offsets for buffers that live over ranges of steps, the memory plan of
// make_plan and of the GPU engine's plans (src/engine/plan.cpp): greedy by
// size, largest first (ties: the earlier first step), each buffer at the
// best-fitting gap - the smallest that holds it, else the end - among the
// placed buffers whose step ranges [first, last] (inclusive) meet its own
// (TFLite's greedy-by-size planner; Pisarchyk & Lee 2020, above). Buffers
// whose ranges meet never share a byte; a size-0 buffer gets offset 0; a
// range with last < first lives at its first step only. Sizes should be
// multiples of the caller's alignment: offsets are sums of sizes. An arena
// past 2^64 bytes comes back as arena_bytes = UINT64_MAX (offsets then
// incomplete: callers refuse it by their size limit). Cost: quadratic in
// the buffers (make_plan caps them by PlanOptions::max_slots; the GPU
// engine has one per value of a program within GraphLimits). The three
// vectors should be the same length (extra elements are ignored).
struct ArenaLayout {
  std::vector<std::uint64_t> offsets;  // per buffer, bytes from the arena start
  std::uint64_t arena_bytes = 0;       // max offset + size
  std::uint64_t peak_live_bytes = 0;   // max over steps of the bytes live at once: no layout is smaller
};
ArenaLayout layout_arena(const std::vector<std::uint64_t>& bytes, const std::vector<std::int64_t>& first,
                         const std::vector<std::int64_t>& last);

// The plan: plain data, serializable (the compile cache stores it), no
// pointers into the Program. Value ids and node indices refer to the Program
// it was made from; keep the two together.
struct ExecutionPlan {
  std::vector<ConcreteShape> shapes;       // infer_shapes() at the binding
  std::vector<Step> steps;                 // a topological schedule
  std::vector<std::int32_t> step_of_node;  // node index -> step index
  // Memory: every value a step materializes and that is no weight or input
  // (including program outputs) has a slot; values internal to a step
  // (fused temporaries, attention scores) have none.
  std::vector<MemorySlot> slots;
  std::vector<std::int32_t> slot_of_value;  // value id -> slots index, -1 if none
  // value id -> the value whose memory it aliases (itself for a slot or an
  // input/weight; its root for a view, through chains of views); -1 for
  // values that are not materialized (step-internal).
  std::vector<std::int32_t> alias_of;
  std::uint64_t arena_bytes = 0;      // size of the arena (max offset + bytes over slots)
  std::uint64_t naive_bytes = 0;      // sum of slot bytes (no reuse)
  std::uint64_t peak_live_bytes = 0;  // max over steps of the bytes of slots live at once (a lower bound)
  SymbolBinding binding;
  PlanOptions options;
  // SHA-256 hex of the canonical plan inputs (plan_fingerprint): the
  // compile cache's key part for the plan.
  std::string fingerprint;
};

// Version of the planner's decisions; part of every fingerprint, bumped when
// a plan for the same inputs would change.
inline constexpr std::uint32_t kPlanVersion = 1;

// SHA-256 hex of "safeckpt-plan v<kPlanVersion>\nprogram=<program_hash>\n
// symbols=<binding.to_string()>\noptions=<options.to_string()>\n".
// `program_hash` is the caller's hash of the program (Program::json_sha256,
// or one that also covers the weights).
std::string plan_fingerprint(std::string_view program_hash, const SymbolBinding& binding, const PlanOptions& options);

// Plans a validated program at `binding`: checks the order (every tensor
// argument produced earlier by a node or an input, every value produced
// once: also refuses cycles), runs infer_shapes, groups nodes into Steps
// (fuse=false: one step per node), assigns arena slots, and sets
// `fingerprint` from Program::json_sha256.
// Errors: kMalformed (use before definition / a value produced twice, naming
// node and value; shape disagreement), kInvalidArgument (not validated, bad
// binding, bad options: alignment not a power of two >= 16, max_fused_ops 0),
// kLimitExceeded (max_slots, max_arena_bytes, GraphLimits caps).
Result<ExecutionPlan> make_plan(const Program& program, const SymbolBinding& binding, const PlanOptions& options = {},
                                const GraphLimits& limits = {});

}  // namespace safeckpt::graph
