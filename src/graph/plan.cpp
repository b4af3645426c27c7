// The execution planner (safeckpt/graph_plan.hpp): concrete shapes, a
// schedule of Steps, a static memory plan. Host only.
//
// What it decides, in order:
//  1. Order: every tensor argument is produced earlier (by an input or a
//     node) and every value once — also refuses cycles (validate() checks
//     the same; the planner does not rely on the Program being unchanged).
//  2. Shapes: the interpreter's shape pass at the bound symbols
//     (detail::shape_pass) gives dtypes and sizes; strides are the planner's:
//     contiguous for every kernel output and input, the view ops' formulas
//     (aten TensorShape.cpp) for aliases; a view/flatten whose input strides
//     do not allow one (aten computeStride, TensorUtils.cpp) is a copy.
//  3. Steps (fuse=true), in this order of claims:
//     a. attention: every aten::scaled_dot_product_attention node; and the
//        decomposed core-IR pattern (torch 2.11 decomposition of SDPA, as in
//        tests/data/pt2-2.11/gpt2.core.pt2): bmm(q*s, (k^T)*s) -> [+ mask] ->
//        _softmax(-1) -> [the fully-masked-row fix-up: where(not any(not
//        (x == -inf)), 0, p)] -> bmm(., v), through the view/expand/clone
//        reshapes between them, every interior value used only inside;
//     b. GEMM epilogues: linear/addmm/mm/bmm followed (through contiguous
//        single-use views) by a single-use bias add (a [N] vector on the last
//        dim, alpha 1) and/or GELU/ReLU;
//     c. elementwise chains: an elementwise node joins the kFused step of
//        each elementwise producer whose value it alone reads, when shapes
//        are equal and the step stays within max_fused_ops;
//     d. everything else: one step per node.
//     A step runs at the position of its last node, which keeps the schedule
//     topological (values inside a step are read only inside it).
//  4. Memory: one slot per materialized value that is not a weight or input;
//     liveness from the writing step to the last step reading it or a view of
//     it (program outputs: to the end); offsets by greedy-by-size with the
//     best-fitting gap among the slots alive at the same time.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "graph/internal.hpp"
#include "graph/view_strides.hpp"
#include "safeckpt/graph_plan.hpp"
#include "safeckpt/hash.hpp"

namespace safeckpt::graph {

// ------------------------------------------------------------- names

Result<Stance> parse_stance(std::string_view text) {
  if (text == "default") return Stance::kDefault;
  if (text == "force_eager") return Stance::kForceEager;
  if (text == "eager_then_compile") return Stance::kEagerThenCompile;
  if (text == "fail_on_recompile") return Stance::kFailOnRecompile;
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown stance '" + std::string(text) +
                        "': expected default, force_eager, eager_then_compile or fail_on_recompile");
}

std::string_view stance_name(Stance s) noexcept {
  switch (s) {
    case Stance::kDefault: return "default";
    case Stance::kForceEager: return "force_eager";
    case Stance::kEagerThenCompile: return "eager_then_compile";
    case Stance::kFailOnRecompile: return "fail_on_recompile";
  }
  return "?";
}

std::string_view step_kind_name(StepKind k) noexcept {
  switch (k) {
    case StepKind::kGemm: return "gemm";
    case StepKind::kAttention: return "attention";
    case StepKind::kConv: return "conv";
    case StepKind::kNorm: return "norm";
    case StepKind::kSoftmax: return "softmax";
    case StepKind::kReduction: return "reduction";
    case StepKind::kFused: return "fused";
    case StepKind::kGather: return "gather";
    case StepKind::kView: return "view";
    case StepKind::kCopy: return "copy";
    case StepKind::kOther: return "other";
  }
  return "?";
}

std::string_view ew_op_name(EwOp op) noexcept {
  switch (op) {
    case EwOp::kAdd: return "add";
    case EwOp::kSub: return "sub";
    case EwOp::kMulScalar: return "mul_scalar";
    case EwOp::kRelu: return "relu";
    case EwOp::kGelu: return "gelu";
    case EwOp::kGeluTanh: return "gelu_tanh";
    case EwOp::kEqScalar: return "eq_scalar";
    case EwOp::kLeScalar: return "le_scalar";
    case EwOp::kLogicalAnd: return "logical_and";
    case EwOp::kLogicalNot: return "logical_not";
    case EwOp::kWhere: return "where";
  }
  return "?";
}

std::string SymbolBinding::to_string() const {
  std::string s;
  for (const auto& [k, v] : values) s += k + "=" + std::to_string(v) + ";";
  return s;
}

std::string PlanOptions::to_string() const {
  return "fuse=" + std::to_string(fuse ? 1 : 0) + ";alignment=" + std::to_string(alignment) +
         ";max_fused_ops=" + std::to_string(max_fused_ops) + ";";
}

std::uint64_t ConcreteShape::numel() const noexcept {
  std::uint64_t n = 1;
  for (auto s : sizes) n *= static_cast<std::uint64_t>(s);
  return n;
}

std::uint64_t ConcreteShape::nbytes() const noexcept {
  return numel() * dtype_size(dtype);
}

bool ConcreteShape::is_contiguous() const noexcept {
  std::int64_t expect = 1;
  for (std::size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expect) return false;
    expect *= sizes[d];
  }
  return true;
}

std::string plan_fingerprint(std::string_view program_hash, const SymbolBinding& binding, const PlanOptions& options) {
  std::string text = "safeckpt-plan v" + std::to_string(kPlanVersion) + "\nprogram=" + std::string(program_hash) +
                     "\nsymbols=" + binding.to_string() + "\noptions=" + options.to_string() + "\n";
  return sha256_hex({reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
}

// ------------------------------------------------------------- symbols

Result<SymbolBinding> bind_symbols(const Program& program,
                                   const std::map<std::string, std::vector<std::int64_t>>& input_shapes,
                                   const GraphLimits& limits) {
  SAFECKPT_TRY(auto symbols, detail::bind_user_shapes(program, input_shapes, limits));
  SymbolBinding b;
  for (const auto& [k, v] : symbols) b.values.emplace(k, v);
  return b;
}

namespace {

std::vector<std::int64_t> contiguous(const std::vector<std::int64_t>& sizes) {
  std::vector<std::int64_t> st(sizes.size(), 1);
  for (std::size_t d = sizes.size(); d-- > 1;) st[d - 1] = st[d] * std::max<std::int64_t>(sizes[d], 1);
  return st;
}

const Arg* arg_of(const Node& n, std::string_view name) {
  if (n.schema == nullptr) return nullptr;
  for (std::size_t k = 0; k < n.schema->args.size() && k < n.args.size(); ++k)
    if (n.schema->args[k].name == name) return &n.args[k];
  return nullptr;
}

// A static int argument (nullopt when absent or symbolic).
std::optional<std::int64_t> static_int(const Node& n, std::string_view name) {
  const Arg* a = arg_of(n, name);
  if (a == nullptr || a->ints.size() != 1 || a->ints[0].is_symbolic()) return std::nullopt;
  return a->ints[0].value;
}

// A Scalar argument as a double (nullopt when absent or symbolic).
std::optional<double> scalar_arg(const Node& n, std::string_view name) {
  const Arg* a = arg_of(n, name);
  if (a == nullptr) return std::nullopt;
  if (a->kind == Arg::Kind::kFloat) return a->f;
  if (a->kind == Arg::Kind::kBool) return a->b ? 1.0 : 0.0;
  if (a->kind == Arg::Kind::kInt && a->ints.size() == 1 && !a->ints[0].is_symbolic())
    return static_cast<double>(a->ints[0].value);
  return std::nullopt;
}

std::int32_t tensor_arg(const Node& n, std::string_view name) {
  const Arg* a = arg_of(n, name);
  return a != nullptr && a->kind == Arg::Kind::kTensor ? a->tensor : -1;
}

std::int64_t norm_dim(std::int64_t d, std::size_t rank) {
  auto r = static_cast<std::int64_t>(rank == 0 ? 1 : rank);
  return d < 0 ? d + r : d;
}

bool is_view_name(const std::string& op) {
  return op == "aten::view" || op == "aten::flatten.using_ints" || op == "aten::permute" ||
         op == "aten::transpose.int" || op == "aten::unsqueeze" || op == "aten::expand" || op == "aten::split.Tensor" ||
         op == "aten::split_with_sizes";
}

// Strides (and offsets) of the outputs of a view node, over its input; false
// when they cannot alias (then the node is a copy and the outputs contiguous).
bool view_layout(const Node& n, const std::vector<ConcreteShape>& shapes, std::vector<ConcreteShape>& out) {
  const std::int32_t in_id = tensor_arg(n, "self");
  if (in_id < 0) return false;
  const ConcreteShape& in = shapes[static_cast<std::size_t>(in_id)];
  const std::string& op = n.schema->name;
  const std::size_t rank = in.sizes.size();
  if (op == "aten::view" || op == "aten::flatten.using_ints") {
    ConcreteShape& o = out.at(0);
    auto st = detail::view_strides(in.sizes, in.strides, o.sizes);
    if (!st) return false;
    o.strides = *st;
    o.storage_offset = in.storage_offset;
    return true;
  }
  if (op == "aten::permute") {
    const Arg* dims = arg_of(n, "dims");
    ConcreteShape& o = out.at(0);
    if (dims == nullptr || dims->ints.size() != rank) return false;
    o.strides.assign(rank, 0);
    for (std::size_t i = 0; i < rank; ++i) {
      if (dims->ints[i].is_symbolic()) return false;
      auto d = norm_dim(dims->ints[i].value, rank);
      if (d < 0 || static_cast<std::size_t>(d) >= rank) return false;
      o.strides[i] = in.strides[static_cast<std::size_t>(d)];
    }
    o.storage_offset = in.storage_offset;
    return true;
  }
  if (op == "aten::transpose.int") {
    auto d0 = static_int(n, "dim0"), d1 = static_int(n, "dim1");
    ConcreteShape& o = out.at(0);
    if (!d0 || !d1) return false;
    o.strides = in.strides;
    if (rank > 0) {
      auto a = static_cast<std::size_t>(norm_dim(*d0, rank)), b = static_cast<std::size_t>(norm_dim(*d1, rank));
      if (a >= rank || b >= rank) return false;
      std::swap(o.strides[a], o.strides[b]);
    }
    o.storage_offset = in.storage_offset;
    return true;
  }
  if (op == "aten::unsqueeze") {
    auto d = static_int(n, "dim");
    ConcreteShape& o = out.at(0);
    if (!d) return false;
    auto at = static_cast<std::size_t>(norm_dim(*d, rank + 1));
    if (at > rank) return false;
    o.strides = in.strides;
    std::int64_t st = at < rank ? in.sizes[at] * in.strides[at] : 1;
    o.strides.insert(o.strides.begin() + static_cast<std::ptrdiff_t>(at), st);
    o.storage_offset = in.storage_offset;
    return true;
  }
  if (op == "aten::expand") {
    ConcreteShape& o = out.at(0);
    if (o.sizes.size() < rank) return false;
    std::size_t lead = o.sizes.size() - rank;
    o.strides.assign(o.sizes.size(), 0);
    for (std::size_t i = 0; i < rank; ++i) o.strides[lead + i] = in.sizes[i] == o.sizes[lead + i] ? in.strides[i] : 0;
    o.storage_offset = in.storage_offset;
    return true;
  }
  if (op == "aten::split.Tensor" || op == "aten::split_with_sizes") {
    auto d = static_int(n, "dim");
    if (!d || rank == 0) return false;
    auto dim = static_cast<std::size_t>(norm_dim(*d, rank));
    if (dim >= rank) return false;
    // Piece k starts at the sum of the sizes before it, from the arguments
    // (an unnamed piece has no recorded size).
    std::vector<std::int64_t> pieces;
    if (op == "aten::split.Tensor") {
      auto each = static_int(n, "split_size");
      if (!each || *each <= 0) return false;
      for (std::size_t k = 0; k < out.size(); ++k) pieces.push_back(*each);
    } else {
      const Arg* sizes = arg_of(n, "split_sizes");
      if (sizes == nullptr || sizes->ints.size() != out.size()) return false;
      for (const auto& x : sizes->ints) {
        if (x.is_symbolic()) return false;
        pieces.push_back(x.value);
      }
    }
    std::int64_t start = 0;
    for (std::size_t k = 0; k < out.size(); ++k) {
      ConcreteShape& o = out[k];
      if (o.defined) {
        if (o.sizes.size() != rank) return false;
        o.strides = in.strides;
        o.storage_offset = in.storage_offset + start * in.strides[dim];
      }
      start += pieces[k];
    }
    return true;
  }
  return false;
}

enum class OpClass : std::uint8_t {
  kGemm,
  kSdpa,
  kConv,
  kNorm,
  kSoftmax,
  kReduction,
  kElementwise,
  kGather,
  kView,
  kCopy,
  kOther,
};

OpClass classify(const std::string& op) {
  if (op == "aten::linear" || op == "aten::addmm" || op == "aten::mm" || op == "aten::bmm" || op == "aten::matmul")
    return OpClass::kGemm;
  // Every SDPA spelling the allowlist may name (the backend variants of CUDA
  // exports are not allowlisted yet: graph.hpp).
  if (op == "aten::scaled_dot_product_attention" || op == "aten::_scaled_dot_product_flash_attention" ||
      op == "aten::_scaled_dot_product_efficient_attention" || op == "aten::_scaled_dot_product_cudnn_attention" ||
      op == "aten::_scaled_dot_product_flash_attention_for_cpu")
    return OpClass::kSdpa;
  if (op == "aten::conv2d" || op == "aten::convolution") return OpClass::kConv;
  if (op == "aten::layer_norm" || op == "aten::native_layer_norm" || op == "aten::batch_norm" ||
      op == "aten::_native_batch_norm_legit_no_training" || op == "aten::rms_norm")
    return OpClass::kNorm;
  if (op == "aten::_softmax") return OpClass::kSoftmax;
  if (op == "aten::any.dim" || op == "aten::mean.dim" || op == "aten::adaptive_avg_pool2d" ||
      op == "aten::max_pool2d" || op == "aten::max_pool2d_with_indices")
    return OpClass::kReduction;
  if (op == "aten::add.Tensor" || op == "aten::add_.Tensor" || op == "aten::sub.Tensor" || op == "aten::mul.Scalar" ||
      op == "aten::relu" || op == "aten::relu_" || op == "aten::gelu" || op == "aten::eq.Scalar" ||
      op == "aten::le.Scalar" || op == "aten::logical_and" || op == "aten::logical_not" || op == "aten::where.self")
    return OpClass::kElementwise;
  if (op == "aten::embedding") return OpClass::kGather;
  if (is_view_name(op)) return OpClass::kView;
  if (op == "aten::clone") return OpClass::kCopy;
  return OpClass::kOther;
}

// The elementwise op of a node with its scalars, or nullopt (then it is not
// fusable: an argument that is symbolic or of an unexpected kind).
struct EwDesc {
  EwOp op;
  std::array<std::int32_t, 3> in{-1, -1, -1};
  double scalar = 0, alpha = 1;
};
std::optional<EwDesc> ew_desc(const Node& n) {
  const std::string& op = n.schema->name;
  EwDesc d{EwOp::kAdd};
  if (op == "aten::add.Tensor" || op == "aten::add_.Tensor" || op == "aten::sub.Tensor") {
    d.op = op == "aten::sub.Tensor" ? EwOp::kSub : EwOp::kAdd;
    d.in = {tensor_arg(n, "self"), tensor_arg(n, "other"), -1};
    auto a = scalar_arg(n, "alpha");
    if (!a) return std::nullopt;
    d.alpha = *a;
  } else if (op == "aten::mul.Scalar" || op == "aten::eq.Scalar" || op == "aten::le.Scalar") {
    d.op = op == "aten::mul.Scalar" ? EwOp::kMulScalar : op == "aten::eq.Scalar" ? EwOp::kEqScalar : EwOp::kLeScalar;
    d.in = {tensor_arg(n, "self"), -1, -1};
    auto s = scalar_arg(n, "other");
    if (!s) return std::nullopt;
    d.scalar = *s;
  } else if (op == "aten::relu" || op == "aten::relu_") {
    d.op = EwOp::kRelu;
    d.in = {tensor_arg(n, "self"), -1, -1};
  } else if (op == "aten::gelu") {
    const Arg* a = arg_of(n, "approximate");
    d.op = a != nullptr && a->kind == Arg::Kind::kString && a->s == "tanh" ? EwOp::kGeluTanh : EwOp::kGelu;
    d.in = {tensor_arg(n, "self"), -1, -1};
  } else if (op == "aten::logical_and") {
    d.op = EwOp::kLogicalAnd;
    d.in = {tensor_arg(n, "self"), tensor_arg(n, "other"), -1};
  } else if (op == "aten::logical_not") {
    d.op = EwOp::kLogicalNot;
    d.in = {tensor_arg(n, "self"), -1, -1};
  } else if (op == "aten::where.self") {
    d.op = EwOp::kWhere;
    d.in = {tensor_arg(n, "condition"), tensor_arg(n, "self"), tensor_arg(n, "other")};
  } else {
    return std::nullopt;
  }
  for (std::size_t k = 0; k < 3; ++k)
    if (d.in[k] < 0 &&
        (k == 0 ||
         (k == 1 && (d.op == EwOp::kAdd || d.op == EwOp::kSub || d.op == EwOp::kLogicalAnd || d.op == EwOp::kWhere)) ||
         (k == 2 && d.op == EwOp::kWhere)))
      return std::nullopt;
  return d;
}

// Graph facts the grouping needs.
struct Graph {
  const Program& p;
  const std::vector<ConcreteShape>& shapes;
  std::vector<std::int32_t> producer;           // value -> node, -1 for inputs
  std::vector<std::vector<std::int32_t>> uses;  // value -> consuming nodes (one entry per node)
  std::vector<char> is_output;                  // program outputs
  std::vector<OpClass> cls;                     // node -> class
  std::vector<char> view_alias;                 // node -> view node that aliases (else copy)

  std::int32_t out0(std::int32_t node) const {
    const Node& n = p.nodes[static_cast<std::size_t>(node)];
    return n.outputs.empty() ? -1 : n.outputs[0];
  }
  // v is read by exactly one node and is no program output.
  bool single_use(std::int32_t v) const {
    return v >= 0 && uses[static_cast<std::size_t>(v)].size() == 1 && !is_output[static_cast<std::size_t>(v)];
  }
  const Node* prod(std::int32_t v) const {
    if (v < 0) return nullptr;
    std::int32_t i = producer[static_cast<std::size_t>(v)];
    return i < 0 ? nullptr : &p.nodes[static_cast<std::size_t>(i)];
  }
  std::int32_t prod_index(std::int32_t v) const { return v < 0 ? -1 : producer[static_cast<std::size_t>(v)]; }
  const ConcreteShape& shape(std::int32_t v) const { return shapes[static_cast<std::size_t>(v)]; }
};

std::vector<std::int32_t> tensor_args(const Node& n) {
  std::vector<std::int32_t> out;
  for (const auto& a : n.args) {
    if (a.kind == Arg::Kind::kTensor && a.tensor >= 0) out.push_back(a.tensor);
    for (auto t : a.tensors)
      if (t >= 0) out.push_back(t);
  }
  return out;
}

// Walks back from v through single-use reshapes that keep the element order
// (view/flatten, clone, expand that broadcasts nothing), appending their nodes.
std::int32_t skip_layout(const Graph& g, std::int32_t v, std::vector<std::int32_t>& nodes) {
  for (int hops = 0; hops < 64; ++hops) {
    const std::int32_t pi = g.prod_index(v);
    if (pi < 0 || !g.single_use(v)) return v;
    const Node& n = g.p.nodes[static_cast<std::size_t>(pi)];
    const std::string& op = n.schema->name;
    std::int32_t src = tensor_arg(n, "self");
    if (src < 0) return v;
    bool ok = op == "aten::view" || op == "aten::flatten.using_ints" || op == "aten::clone" ||
              (op == "aten::expand" && g.shape(src).numel() == g.shape(v).numel());
    if (!ok) return v;
    nodes.push_back(pi);
    v = src;
  }
  return v;
}

// Matches the decomposed attention ending at bmm node `b2`. On success fills
// `nodes` (unsorted) and `info`.
bool match_decomposed_attention(const Graph& g, std::int32_t b2, std::vector<std::int32_t>& nodes,
                                AttentionInfo& info) {
  const Node& n2 = g.p.nodes[static_cast<std::size_t>(b2)];
  if (n2.schema->name != "aten::bmm") return false;
  std::vector<std::int32_t> set{b2};
  double scale = 1;
  // Output: bmm [B*H, Sq, D] -> view [B, H, Sq, D].
  std::int32_t out = g.out0(b2);
  if (!g.single_use(out)) return false;
  const std::int32_t vi = g.uses[static_cast<std::size_t>(out)][0];
  const Node& vn = g.p.nodes[static_cast<std::size_t>(vi)];
  if (vn.schema->name != "aten::view" || g.out0(vi) < 0 || g.shape(g.out0(vi)).sizes.size() != 4) return false;
  set.push_back(vi);
  const std::int32_t result = g.out0(vi);
  // Value side.
  const std::int32_t v = skip_layout(g, tensor_arg(n2, "mat2"), set);
  // Probabilities side: [fix-up where] <- _softmax.
  std::int32_t p = skip_layout(g, tensor_arg(n2, "self"), set);
  const Node* pn = g.prod(p);
  if (pn == nullptr || !g.single_use(p)) return false;
  bool fixup = false;
  std::int32_t sm_out = p;
  if (pn->schema->name == "aten::where.self") {
    // where(logical_not(any(logical_not(eq(s, -inf)), -1, True)), full_like(sm, 0), sm)
    const std::int32_t cond = tensor_arg(*pn, "condition"), zero = tensor_arg(*pn, "self");
    sm_out = tensor_arg(*pn, "other");
    const Node* zn = g.prod(zero);
    const Node* c1 = g.prod(cond);
    const Node* c2 = c1 != nullptr ? g.prod(tensor_arg(*c1, "self")) : nullptr;
    const Node* c3 = c2 != nullptr ? g.prod(tensor_arg(*c2, "self")) : nullptr;
    const Node* c4 = c3 != nullptr ? g.prod(tensor_arg(*c3, "self")) : nullptr;
    if (zn == nullptr || c4 == nullptr || zn->schema->name != "aten::full_like" || tensor_arg(*zn, "self") != sm_out ||
        scalar_arg(*zn, "fill_value").value_or(1) != 0 || c1->schema->name != "aten::logical_not" ||
        c2->schema->name != "aten::any.dim" || c3->schema->name != "aten::logical_not" ||
        c4->schema->name != "aten::eq.Scalar" || !std::isinf(scalar_arg(*c4, "other").value_or(0)) ||
        scalar_arg(*c4, "other").value_or(0) > 0)
      return false;
    set.push_back(g.prod_index(p));
    for (std::int32_t x : {zero, cond, tensor_arg(*c1, "self"), tensor_arg(*c2, "self"), tensor_arg(*c3, "self")})
      set.push_back(g.prod_index(x));
    fixup = true;
    // The eq reads the softmax input: checked below.
    const Node* sm = g.prod(sm_out);
    if (sm == nullptr || tensor_arg(*c4, "self") != tensor_arg(*sm, "self")) return false;
  }
  const Node* sm = g.prod(sm_out);
  if (sm == nullptr || sm->schema->name != "aten::_softmax") return false;
  {
    auto dim = static_int(*sm, "dim");
    const Arg* h2f = arg_of(*sm, "half_to_float");
    if (!dim ||
        norm_dim(*dim, g.shape(sm_out).sizes.size()) + 1 != static_cast<std::int64_t>(g.shape(sm_out).sizes.size()) ||
        (h2f != nullptr && h2f->b))
      return false;
  }
  set.push_back(g.prod_index(sm_out));
  // Scores: [add mask] <- [mul scale] <- bmm(q', k').
  std::int32_t s = tensor_arg(*sm, "self");
  std::int32_t mask = -1;
  const Node* sn = g.prod(s);
  if (sn != nullptr && sn->schema->name == "aten::add.Tensor" && scalar_arg(*sn, "alpha").value_or(0) == 1) {
    const std::int32_t a = tensor_arg(*sn, "self"), b = tensor_arg(*sn, "other");
    // The scores operand is the one that leads to a bmm.
    for (auto [x, m] : {std::pair{a, b}, std::pair{b, a}}) {
      std::vector<std::int32_t> probe;
      std::int32_t y = skip_layout(g, x, probe);
      const Node* yn = g.prod(y);
      if (yn != nullptr && (yn->schema->name == "aten::bmm" || yn->schema->name == "aten::mul.Scalar")) {
        set.push_back(g.prod_index(s));
        mask = m;
        s = x;
        break;
      }
    }
    if (mask < 0) return false;
  }
  s = skip_layout(g, s, set);
  const Node* mn = g.prod(s);
  if (mn != nullptr && mn->schema->name == "aten::mul.Scalar" && g.single_use(s)) {
    set.push_back(g.prod_index(s));
    scale *= scalar_arg(*mn, "other").value_or(1);
    s = skip_layout(g, tensor_arg(*mn, "self"), set);
  }
  const Node* b1 = g.prod(s);
  if (b1 == nullptr || b1->schema->name != "aten::bmm" || !g.single_use(s)) return false;
  set.push_back(g.prod_index(s));
  // Query: [mul scale] <- q. Key: [mul scale] <- permute(k, [0, 1, 3, 2]).
  std::int32_t q = skip_layout(g, tensor_arg(*b1, "self"), set);
  if (const Node* qm = g.prod(q); qm != nullptr && qm->schema->name == "aten::mul.Scalar" && g.single_use(q)) {
    set.push_back(g.prod_index(q));
    scale *= scalar_arg(*qm, "other").value_or(1);
    q = tensor_arg(*qm, "self");
  }
  std::int32_t kt = skip_layout(g, tensor_arg(*b1, "mat2"), set);
  if (const Node* km = g.prod(kt); km != nullptr && km->schema->name == "aten::mul.Scalar" && g.single_use(kt)) {
    set.push_back(g.prod_index(kt));
    scale *= scalar_arg(*km, "other").value_or(1);
    kt = tensor_arg(*km, "self");
  }
  const Node* kp = g.prod(kt);
  if (kp == nullptr || kp->schema->name != "aten::permute" || !g.single_use(kt)) return false;
  {
    const Arg* dims = arg_of(*kp, "dims");
    if (dims == nullptr || dims->ints.size() != 4) return false;
    const std::int64_t want[4] = {0, 1, 3, 2};
    for (std::size_t i = 0; i < 4; ++i)
      if (dims->ints[i].is_symbolic() || norm_dim(dims->ints[i].value, 4) != want[i]) return false;
  }
  set.push_back(g.prod_index(kt));
  const std::int32_t k = tensor_arg(*kp, "self");
  // Shapes: q [B,H,Sq,D], k [B,H,Sk,D], v [B,H,Sk,Dv], result [B,H,Sq,Dv].
  if (q < 0 || k < 0 || v < 0) return false;
  const auto &qs = g.shape(q).sizes, &ks = g.shape(k).sizes, &vs = g.shape(v).sizes, &rs = g.shape(result).sizes;
  if (qs.size() != 4 || ks.size() != 4 || vs.size() != 4 || qs[3] != ks[3] || ks[2] != vs[2] || rs[2] != qs[2] ||
      rs[3] != vs[3] || qs[0] != rs[0] || qs[1] != rs[1])
    return false;
  // Interior values: read only inside the set.
  std::sort(set.begin(), set.end());
  set.erase(std::unique(set.begin(), set.end()), set.end());
  for (auto i : set) {
    if (i < 0) return false;
    for (auto o : g.p.nodes[static_cast<std::size_t>(i)].outputs) {
      if (o < 0 || o == result) continue;
      if (g.is_output[static_cast<std::size_t>(o)]) return false;
      for (auto u : g.uses[static_cast<std::size_t>(o)])
        if (!std::binary_search(set.begin(), set.end(), u)) return false;
    }
  }
  nodes = std::move(set);
  info.query = q;
  info.key = k;
  info.value = v;
  info.mask = mask;
  info.mask_is_bool = mask >= 0 && g.shape(mask).dtype == DType::kBool;
  info.is_causal = false;
  info.scale = scale;
  info.zero_fully_masked_rows = fixup;
  return true;
}

AttentionInfo sdpa_info(const Graph& g, const Node& n) {
  AttentionInfo a;
  a.query = tensor_arg(n, "query");
  a.key = tensor_arg(n, "key");
  a.value = tensor_arg(n, "value");
  a.mask = tensor_arg(n, "attn_mask");
  a.mask_is_bool = a.mask >= 0 && g.shape(a.mask).dtype == DType::kBool;
  const Arg* c = arg_of(n, "is_causal");
  a.is_causal = c != nullptr && c->kind == Arg::Kind::kBool && c->b;
  auto s = scalar_arg(n, "scale");
  const auto& qs = g.shape(a.query).sizes;
  a.scale = s ? *s : (qs.empty() ? 1.0 : 1.0 / std::sqrt(static_cast<double>(qs.back())));
  // SDPA's own math (aten attention.cpp) gives NaN rows for fully masked
  // rows on CPU eager; the 2.11 export decomposition gives 0 (pt2-format.md §3.1).
  a.zero_fully_masked_rows = true;
  return a;
}

StepKind kind_of(OpClass c, bool view_alias) {
  switch (c) {
    case OpClass::kGemm: return StepKind::kGemm;
    case OpClass::kSdpa: return StepKind::kAttention;
    case OpClass::kConv: return StepKind::kConv;
    case OpClass::kNorm: return StepKind::kNorm;
    case OpClass::kSoftmax: return StepKind::kSoftmax;
    case OpClass::kReduction: return StepKind::kReduction;
    case OpClass::kElementwise: return StepKind::kFused;
    case OpClass::kGather: return StepKind::kGather;
    case OpClass::kView: return view_alias ? StepKind::kView : StepKind::kCopy;
    case OpClass::kCopy: return StepKind::kCopy;
    case OpClass::kOther: return StepKind::kOther;
  }
  return StepKind::kOther;
}

std::uint64_t align_up(std::uint64_t x, std::uint64_t a) {
  return (x + a - 1) / a * a;
}

}  // namespace

namespace detail {

std::optional<std::vector<std::int64_t>> view_strides(const std::vector<std::int64_t>& sizes,
                                                      const std::vector<std::int64_t>& strides,
                                                      const std::vector<std::int64_t>& new_sizes) {
  std::uint64_t numel = 1;
  for (auto s : sizes) numel *= static_cast<std::uint64_t>(s);
  if (numel == 0 || sizes.empty()) return contiguous(new_sizes);
  std::vector<std::int64_t> out(new_sizes.size(), 0);
  auto view_d = static_cast<std::int64_t>(new_sizes.size()) - 1;
  std::int64_t chunk_base = strides.back();
  std::int64_t tensor_numel = 1, view_numel = 1;
  for (auto d = static_cast<std::int64_t>(sizes.size()) - 1; d >= 0; --d) {
    auto ud = static_cast<std::size_t>(d);
    tensor_numel *= sizes[ud];
    // A chunk ends at dim 0 or where the next-outer dim is not contiguous with this run.
    if (d == 0 || (sizes[ud - 1] != 1 && strides[ud - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[static_cast<std::size_t>(view_d)] == 1)) {
        out[static_cast<std::size_t>(view_d)] = view_numel * chunk_base;
        view_numel *= new_sizes[static_cast<std::size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base = strides[ud - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}

}  // namespace detail

// ------------------------------------------------------------- shapes

namespace {

// The order check of make_plan (and infer_shapes): kMalformed naming the
// node and value.
Status check_order(const Program& p) {
  std::vector<char> produced(p.values.size(), 0);
  auto valid = [&](std::int32_t v) { return v >= 0 && static_cast<std::size_t>(v) < p.values.size(); };
  for (const auto& in : p.inputs) {
    if (!valid(in.value)) return make_error(ErrorCode::kMalformed, "input '" + in.fqn + "' names no tensor value");
    produced[static_cast<std::size_t>(in.value)] = 1;
  }
  for (const auto& n : p.nodes) {
    for (auto t : tensor_args(n)) {
      if (!valid(t)) return make_error(ErrorCode::kMalformed, "node '" + n.name + "' reads an unknown tensor value");
      if (!produced[static_cast<std::size_t>(t)])
        return make_error(ErrorCode::kMalformed, "node '" + n.name + "' (" + n.target + ") uses '" +
                                                     p.value_names[static_cast<std::size_t>(t)] +
                                                     "' before any node produces it (graph not in order, or cyclic)");
    }
    for (auto o : n.outputs) {
      if (o < 0) continue;
      if (!valid(o)) return make_error(ErrorCode::kMalformed, "node '" + n.name + "' writes an unknown tensor value");
      if (produced[static_cast<std::size_t>(o)])
        return make_error(ErrorCode::kMalformed, "node '" + n.name + "' (" + n.target + ") produces '" +
                                                     p.value_names[static_cast<std::size_t>(o)] + "' a second time");
      produced[static_cast<std::size_t>(o)] = 1;
    }
  }
  for (auto o : p.outputs)
    if (!valid(o) || !produced[static_cast<std::size_t>(o)])
      return make_error(ErrorCode::kMalformed, "a user output is never produced");
  return {};
}

// The program's symbols: range_constraints names and the symbols of user
// input dims.
std::map<std::string, std::pair<std::optional<std::int64_t>, std::optional<std::int64_t>>> program_symbols(
    const Program& p) {
  auto out = p.range_constraints;
  for (const auto& in : p.inputs) {
    if (in.kind != InputKind::kUserInput) continue;
    for (const auto& s : p.values[static_cast<std::size_t>(in.value)].sizes) {
      if (!s.is_symbolic()) continue;
      std::string name = detail::single_symbol(p.sym_values[static_cast<std::size_t>(s.sym)].expr);
      if (!name.empty()) out.try_emplace(name);
    }
  }
  return out;
}

}  // namespace

Result<std::vector<ConcreteShape>> infer_shapes(const Program& program, const SymbolBinding& binding,
                                                const GraphLimits& limits) {
  SAFECKPT_CHECK(check_order(program));
  const auto syms = program_symbols(program);
  std::unordered_map<std::string, std::int64_t> symbols;
  for (const auto& [name, value] : binding.values) {
    auto it = syms.find(name);
    if (it == syms.end())
      return make_error(ErrorCode::kInvalidArgument, "symbol '" + name + "' is not a symbol of the program");
    auto [lo, hi] = it->second;
    if ((lo && value < *lo) || (hi && value > *hi))
      return make_error(ErrorCode::kInvalidArgument,
                        "symbol " + name + " = " + std::to_string(value) + " is outside its range [" +
                            (lo ? std::to_string(*lo) : "-inf") + ", " + (hi ? std::to_string(*hi) : "inf") + "]");
    symbols.emplace(name, value);
  }
  for (const auto& [name, range] : syms)
    if (symbols.count(name) == 0)
      return make_error(ErrorCode::kInvalidArgument, "symbol '" + name + "' has no value in the binding");
  SAFECKPT_TRY(auto vs, detail::shape_pass(program, symbols, limits));
  std::vector<ConcreteShape> shapes(vs.size());
  for (std::size_t v = 0; v < vs.size(); ++v) {
    shapes[v].defined = vs[v].defined;
    shapes[v].dtype = vs[v].dtype;
    shapes[v].sizes = std::move(vs[v].sizes);
    shapes[v].strides = contiguous(shapes[v].sizes);
  }
  // Views: strides over their base, in node order (bases first).
  for (const auto& n : program.nodes) {
    if (classify(n.schema->name) != OpClass::kView) continue;
    std::vector<ConcreteShape> outs;
    for (auto o : n.outputs) outs.push_back(o >= 0 ? shapes[static_cast<std::size_t>(o)] : ConcreteShape{});
    if (!view_layout(n, shapes, outs)) continue;  // a copy: contiguous
    for (std::size_t k = 0; k < n.outputs.size(); ++k)
      if (n.outputs[k] >= 0) shapes[static_cast<std::size_t>(n.outputs[k])] = std::move(outs[k]);
  }
  return shapes;
}

// ------------------------------------------------------------- planning

ArenaLayout layout_arena(const std::vector<std::uint64_t>& bytes, const std::vector<std::int64_t>& first,
                         const std::vector<std::int64_t>& last) {
  const std::size_t n = std::min({bytes.size(), first.size(), last.size()});
  ArenaLayout out;
  out.offsets.assign(n, 0);
  // A range that ends before it starts lives at its first step.
  auto end_of = [&](std::size_t i) { return std::max(first[i], last[i]); };
  std::vector<std::size_t> by_size(n);
  std::iota(by_size.begin(), by_size.end(), 0);
  std::stable_sort(by_size.begin(), by_size.end(), [&](std::size_t a, std::size_t b) {
    return bytes[a] != bytes[b] ? bytes[a] > bytes[b] : first[a] < first[b];
  });
  std::vector<std::size_t> placed;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> busy;
  for (std::size_t k : by_size) {
    if (bytes[k] == 0) continue;
    busy.clear();
    for (std::size_t j : placed)
      if (first[j] <= end_of(k) && first[k] <= end_of(j)) busy.emplace_back(out.offsets[j], out.offsets[j] + bytes[j]);
    std::sort(busy.begin(), busy.end());
    std::uint64_t best = ~std::uint64_t{0}, best_gap = ~std::uint64_t{0}, cursor = 0;
    for (const auto& [lo, hi] : busy) {
      if (lo > cursor && lo - cursor >= bytes[k] && lo - cursor < best_gap) {
        best_gap = lo - cursor;
        best = cursor;
      }
      cursor = std::max(cursor, hi);
    }
    out.offsets[k] = best != ~std::uint64_t{0} ? best : cursor;
    if (bytes[k] > ~std::uint64_t{0} - out.offsets[k]) {  // past 2^64: no layout (callers' limits refuse it)
      out.arena_bytes = ~std::uint64_t{0};
      return out;
    }
    out.arena_bytes = std::max(out.arena_bytes, out.offsets[k] + bytes[k]);
    placed.push_back(k);
  }
  // The most bytes live at one step: starts in step order, each after the
  // ranges that ended before its step are let go.
  std::vector<std::pair<std::int64_t, std::uint64_t>> starts, ends;
  for (std::size_t i = 0; i < n; ++i) {
    starts.emplace_back(first[i], bytes[i]);
    ends.emplace_back(end_of(i), bytes[i]);
  }
  std::sort(starts.begin(), starts.end());
  std::sort(ends.begin(), ends.end());
  std::uint64_t live = 0;
  std::size_t e = 0;
  for (const auto& [step, size] : starts) {
    for (; e < ends.size() && ends[e].first < step; ++e) live -= ends[e].second;
    live += size;
    out.peak_live_bytes = std::max(out.peak_live_bytes, live);
  }
  return out;
}

Result<ExecutionPlan> make_plan(const Program& program, const SymbolBinding& binding, const PlanOptions& options,
                                const GraphLimits& limits) {
  if (options.alignment < 16 || (options.alignment & (options.alignment - 1)) != 0)
    return make_error(ErrorCode::kInvalidArgument,
                      "PlanOptions::alignment must be a power of two >= 16, not " + std::to_string(options.alignment));
  if (options.max_fused_ops == 0)
    return make_error(ErrorCode::kInvalidArgument, "PlanOptions::max_fused_ops must be at least 1");
  for (const auto& n : program.nodes)
    if (n.schema == nullptr)
      return make_error(ErrorCode::kInvalidArgument,
                        "program not validated (node '" + n.name + "'): call validate() first");
  SAFECKPT_CHECK(check_order(program));
  ExecutionPlan plan;
  SAFECKPT_TRY(plan.shapes, infer_shapes(program, binding, limits));
  plan.binding = binding;
  plan.options = options;
  const std::size_t nv = program.values.size(), nn = program.nodes.size();

  Graph g{program,
          plan.shapes,
          std::vector<std::int32_t>(nv, -1),
          std::vector<std::vector<std::int32_t>>(nv),
          std::vector<char>(nv, 0),
          std::vector<OpClass>(nn),
          std::vector<char>(nn, 0)};
  for (std::size_t i = 0; i < nn; ++i) {
    const Node& n = program.nodes[i];
    for (auto o : n.outputs)
      if (o >= 0) g.producer[static_cast<std::size_t>(o)] = static_cast<std::int32_t>(i);
    auto args = tensor_args(n);
    std::sort(args.begin(), args.end());
    args.erase(std::unique(args.begin(), args.end()), args.end());
    for (auto t : args) g.uses[static_cast<std::size_t>(t)].push_back(static_cast<std::int32_t>(i));
    g.cls[i] = classify(n.schema->name);
    if (g.cls[i] == OpClass::kElementwise && !ew_desc(n)) g.cls[i] = OpClass::kOther;
    if (g.cls[i] == OpClass::kView) {
      std::vector<ConcreteShape> outs;
      for (auto o : n.outputs) outs.push_back(o >= 0 ? plan.shapes[static_cast<std::size_t>(o)] : ConcreteShape{});
      g.view_alias[i] = view_layout(n, plan.shapes, outs) ? 1 : 0;
    }
  }
  for (auto o : program.outputs) g.is_output[static_cast<std::size_t>(o)] = 1;

  // Groups: node -> group id; groups hold node lists (+ attention info).
  std::vector<std::int32_t> group(nn, -1);
  struct Group {
    StepKind kind;
    std::vector<std::int32_t> nodes;
    AttentionInfo attention;
    std::int32_t gemm = -1;  // kGemm: the GEMM node (epilogue values read it as kAccumulator)
    bool alive = true;
  };
  std::vector<Group> groups;
  auto new_group = [&](StepKind k, std::vector<std::int32_t> nodes) {
    auto id = static_cast<std::int32_t>(groups.size());
    for (auto i : nodes) group[static_cast<std::size_t>(i)] = id;
    groups.push_back(Group{k, std::move(nodes), {}, -1, true});
    return id;
  };
  if (options.fuse) {
    // a. attention.
    for (std::size_t i = 0; i < nn; ++i) {
      if (group[i] >= 0) continue;
      if (g.cls[i] == OpClass::kSdpa) {
        auto id = new_group(StepKind::kAttention, {static_cast<std::int32_t>(i)});
        groups[static_cast<std::size_t>(id)].attention = sdpa_info(g, program.nodes[i]);
        continue;
      }
      if (program.nodes[i].schema->name != "aten::bmm") continue;
      std::vector<std::int32_t> nodes;
      AttentionInfo info;
      if (!match_decomposed_attention(g, static_cast<std::int32_t>(i), nodes, info)) continue;
      bool free = true;
      for (auto k : nodes) free = free && group[static_cast<std::size_t>(k)] < 0;
      if (!free) continue;
      auto id = new_group(StepKind::kAttention, nodes);
      groups[static_cast<std::size_t>(id)].attention = info;
    }
    // b. GEMM epilogues.
    for (std::size_t i = 0; i < nn; ++i) {
      if (group[i] >= 0 || g.cls[i] != OpClass::kGemm) continue;
      std::vector<std::int32_t> nodes{static_cast<std::int32_t>(i)}, pending;
      std::int32_t v = g.out0(static_cast<std::int32_t>(i));
      bool bias = false, act = false;
      const std::int64_t n_cols = v >= 0 && !g.shape(v).sizes.empty() ? g.shape(v).sizes.back() : -1;
      for (int hops = 0; hops < 64 && v >= 0 && g.single_use(v) && !act; ++hops) {
        const std::int32_t u = g.uses[static_cast<std::size_t>(v)][0];
        const Node& un = program.nodes[static_cast<std::size_t>(u)];
        if (group[static_cast<std::size_t>(u)] >= 0) break;
        const std::int32_t uo = g.out0(u);
        if (uo < 0) break;
        if ((un.schema->name == "aten::view" || un.schema->name == "aten::flatten.using_ints") &&
            g.view_alias[static_cast<std::size_t>(u)] && g.shape(uo).is_contiguous() && g.shape(v).is_contiguous() &&
            !g.shape(uo).sizes.empty() && g.shape(uo).sizes.back() == n_cols) {
          pending.push_back(u);
          v = uo;
          continue;
        }
        if (g.cls[static_cast<std::size_t>(u)] != OpClass::kElementwise) break;
        auto d = ew_desc(un);
        if (!d) break;
        bool ok = false;
        if (!bias && !act && (d->op == EwOp::kAdd) && d->alpha == 1 && (d->in[0] == v || d->in[1] == v) &&
            d->in[0] != d->in[1]) {
          const std::int32_t other = d->in[0] == v ? d->in[1] : d->in[0];
          const auto& os = g.shape(other).sizes;
          ok = os.size() == 1 && os[0] == n_cols && g.shape(uo).sizes == g.shape(v).sizes &&
               g.shape(other).dtype == g.shape(v).dtype;
          bias = ok;
        } else if (!act && (d->op == EwOp::kGelu || d->op == EwOp::kGeluTanh || d->op == EwOp::kRelu)) {
          ok = true;
          act = true;
        }
        if (!ok) break;
        nodes.insert(nodes.end(), pending.begin(), pending.end());
        pending.clear();
        nodes.push_back(u);
        v = uo;
        if (nodes.size() >= options.max_fused_ops + 1u) break;
      }
      auto id = new_group(StepKind::kGemm, nodes);
      groups[static_cast<std::size_t>(id)].gemm = static_cast<std::int32_t>(i);
    }
    // c. elementwise chains.
    for (std::size_t i = 0; i < nn; ++i) {
      if (group[i] >= 0 || g.cls[i] != OpClass::kElementwise) continue;
      const Node& n = program.nodes[i];
      const std::int32_t out = g.out0(static_cast<std::int32_t>(i));
      std::vector<std::int32_t> nodes{static_cast<std::int32_t>(i)};
      std::vector<std::int32_t> merged;
      auto args = tensor_args(n);
      std::sort(args.begin(), args.end());
      args.erase(std::unique(args.begin(), args.end()), args.end());
      for (auto a : args) {
        const std::int32_t pi = g.prod_index(a);
        if (pi < 0 || !g.single_use(a) || out < 0 || g.shape(a).sizes != g.shape(out).sizes) continue;
        const std::int32_t pg = group[static_cast<std::size_t>(pi)];
        if (pg < 0 || groups[static_cast<std::size_t>(pg)].kind != StepKind::kFused) continue;
        const auto& gn = groups[static_cast<std::size_t>(pg)].nodes;
        if (gn.back() != pi) continue;  // only a group's last node's value leaves it
        if (nodes.size() + gn.size() > options.max_fused_ops) continue;
        nodes.insert(nodes.end(), gn.begin(), gn.end());
        merged.push_back(pg);
      }
      for (auto m : merged) {
        groups[static_cast<std::size_t>(m)].alive = false;
        groups[static_cast<std::size_t>(m)].nodes.clear();
      }
      std::sort(nodes.begin(), nodes.end());
      new_group(StepKind::kFused, nodes);
    }
  }
  // d. the rest: one step per node.
  for (std::size_t i = 0; i < nn; ++i) {
    if (group[i] >= 0) continue;
    auto id = new_group(kind_of(g.cls[i], g.view_alias[i] != 0), {static_cast<std::int32_t>(i)});
    if (g.cls[i] == OpClass::kSdpa) groups[static_cast<std::size_t>(id)].attention = sdpa_info(g, program.nodes[i]);
    if (g.cls[i] == OpClass::kGemm) groups[static_cast<std::size_t>(id)].gemm = static_cast<std::int32_t>(i);
  }
  // Order steps by their last node.
  std::vector<std::int32_t> order;
  for (std::size_t k = 0; k < groups.size(); ++k)
    if (groups[k].alive && !groups[k].nodes.empty()) {
      std::sort(groups[k].nodes.begin(), groups[k].nodes.end());
      order.push_back(static_cast<std::int32_t>(k));
    }
  std::sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return groups[static_cast<std::size_t>(a)].nodes.back() < groups[static_cast<std::size_t>(b)].nodes.back();
  });
  plan.step_of_node.assign(nn, -1);
  std::vector<std::int32_t> step_of_value(nv, -1);
  for (auto gid : order) {
    Group& gr = groups[static_cast<std::size_t>(gid)];
    Step st;
    st.kind = gr.kind;
    st.nodes = gr.nodes;
    st.attention = gr.attention;
    const auto sidx = static_cast<std::int32_t>(plan.steps.size());
    auto in_step = [&](std::int32_t node) { return std::binary_search(st.nodes.begin(), st.nodes.end(), node); };
    for (auto i : st.nodes) plan.step_of_node[static_cast<std::size_t>(i)] = sidx;
    // Inputs: values read from outside, first-use order.
    for (auto i : st.nodes)
      for (auto t : tensor_args(program.nodes[static_cast<std::size_t>(i)])) {
        const std::int32_t pi = g.prod_index(t);
        if (pi >= 0 && in_step(pi)) continue;
        if (std::find(st.inputs.begin(), st.inputs.end(), t) == st.inputs.end()) st.inputs.push_back(t);
      }
    // Outputs: read outside, program outputs, or read by nobody.
    for (auto i : st.nodes)
      for (auto o : program.nodes[static_cast<std::size_t>(i)].outputs) {
        if (o < 0) continue;
        const auto& us = g.uses[static_cast<std::size_t>(o)];
        bool outside = g.is_output[static_cast<std::size_t>(o)] || us.empty();
        for (auto u : us) outside = outside || !in_step(u);
        if (outside) st.outputs.push_back(o);
        step_of_value[static_cast<std::size_t>(o)] = sidx;
      }
    // Elementwise ops as data (kFused; kGemm epilogue).
    if (st.kind == StepKind::kFused || st.kind == StepKind::kGemm) {
      std::vector<std::int32_t> acc;  // values that are the GEMM result (or contiguous views of it)
      if (gr.gemm >= 0) acc.push_back(g.out0(gr.gemm));
      std::unordered_map<std::int32_t, std::int32_t> temp;  // value -> op index
      for (auto i : st.nodes) {
        const Node& n = program.nodes[static_cast<std::size_t>(i)];
        if (i == gr.gemm) continue;
        if (g.cls[static_cast<std::size_t>(i)] == OpClass::kView) {  // epilogue reshape
          if (std::find(acc.begin(), acc.end(), tensor_arg(n, "self")) != acc.end()) acc.push_back(g.out0(i));
          continue;
        }
        auto d = ew_desc(n);
        if (!d) return make_error(ErrorCode::kInternal, "node '" + n.name + "' in a fused step is not elementwise");
        FusedOp f;
        f.op = d->op;
        f.scalar = d->scalar;
        f.alpha = d->alpha;
        f.node = i;
        f.value = g.out0(i);
        f.dtype = f.value >= 0 ? plan.shapes[static_cast<std::size_t>(f.value)].dtype : DType::kFloat32;
        for (std::size_t k = 0; k < 3; ++k) {
          const std::int32_t v = d->in[k];
          if (v < 0) continue;
          if (std::find(acc.begin(), acc.end(), v) != acc.end()) {
            f.in[k] = {FusedOperand::Kind::kAccumulator, 0};
          } else if (auto it = temp.find(v); it != temp.end()) {
            f.in[k] = {FusedOperand::Kind::kTemp, it->second};
          } else {
            auto at = std::find(st.inputs.begin(), st.inputs.end(), v);
            f.in[k] = {FusedOperand::Kind::kInput, static_cast<std::int32_t>(at - st.inputs.begin())};
          }
        }
        temp[f.value] = static_cast<std::int32_t>(st.ops.size());
        st.ops.push_back(f);
      }
    }
    plan.steps.push_back(std::move(st));
  }

  // ---------------------------------------------------------- memory
  const auto last_step = static_cast<std::int32_t>(plan.steps.size()) - 1;
  plan.alias_of.assign(nv, -1);
  plan.slot_of_value.assign(nv, -1);
  for (const auto& in : program.inputs) plan.alias_of[static_cast<std::size_t>(in.value)] = in.value;
  for (std::size_t s = 0; s < plan.steps.size(); ++s) {
    const Step& st = plan.steps[s];
    for (auto o : st.outputs) {
      if (st.kind == StepKind::kView) {
        const Node& n = program.nodes[static_cast<std::size_t>(st.nodes[0])];
        const std::int32_t base = tensor_arg(n, "self");
        plan.alias_of[static_cast<std::size_t>(o)] = base >= 0 ? plan.alias_of[static_cast<std::size_t>(base)] : -1;
        if (plan.alias_of[static_cast<std::size_t>(o)] < 0)
          return make_error(ErrorCode::kInternal, "view '" + program.value_names[static_cast<std::size_t>(o)] +
                                                      "' of a value that is not materialized");
        continue;
      }
      plan.alias_of[static_cast<std::size_t>(o)] = o;
      if (plan.slots.size() >= options.max_slots)
        return make_error(ErrorCode::kLimitExceeded, "more activation buffers than PlanOptions::max_slots (" +
                                                         std::to_string(options.max_slots) + ")");
      MemorySlot slot;
      slot.value = o;
      slot.bytes = align_up(plan.shapes[static_cast<std::size_t>(o)].nbytes(), options.alignment);
      slot.first_step = slot.last_step = static_cast<std::int32_t>(s);
      plan.slot_of_value[static_cast<std::size_t>(o)] = static_cast<std::int32_t>(plan.slots.size());
      plan.slots.push_back(slot);
    }
  }
  auto extend = [&](std::int32_t v, std::int32_t s) {
    const std::int32_t root = plan.alias_of[static_cast<std::size_t>(v)];
    if (root < 0) return;
    const std::int32_t si = plan.slot_of_value[static_cast<std::size_t>(root)];
    if (si >= 0)
      plan.slots[static_cast<std::size_t>(si)].last_step =
          std::max(plan.slots[static_cast<std::size_t>(si)].last_step, s);
  };
  for (std::size_t s = 0; s < plan.steps.size(); ++s)
    for (auto v : plan.steps[s].inputs) extend(v, static_cast<std::int32_t>(s));
  for (auto o : program.outputs) extend(o, last_step);
  std::vector<std::uint64_t> bytes;
  std::vector<std::int64_t> first, last;
  for (const auto& sl : plan.slots) {
    bytes.push_back(sl.bytes);
    first.push_back(sl.first_step);
    last.push_back(sl.last_step);
    plan.naive_bytes += sl.bytes;
  }
  const ArenaLayout layout = layout_arena(bytes, first, last);
  if (layout.arena_bytes > options.max_arena_bytes)
    return make_error(ErrorCode::kLimitExceeded, "activation arena above PlanOptions::max_arena_bytes (" +
                                                     std::to_string(options.max_arena_bytes) + ")");
  for (std::size_t k = 0; k < plan.slots.size(); ++k) plan.slots[k].offset = layout.offsets[k];
  plan.arena_bytes = layout.arena_bytes;
  plan.peak_live_bytes = layout.peak_live_bytes;
  plan.fingerprint = plan_fingerprint(program.json_sha256, binding, options);
  return plan;
}

}  // namespace safeckpt::graph
