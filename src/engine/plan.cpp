// src/engine/plan.cpp — lowering a validated program at one concrete shape
// into launch steps, the activation arena, and running / capturing them.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

#include "engine/conv.hpp"
#include "engine/runtime.hpp"
#include "graph/internal.hpp"
#include "graph/view_strides.hpp"
#include "safeckpt/graph_plan.hpp"

namespace safeckpt::engine::detail {

using graph::Arg;
using graph::Node;
using graph::Program;

std::vector<GemmRowClass> gemm_row_classes(std::int64_t M, std::int64_t N, std::int64_t esz) {
  std::vector<GemmRowClass> r;
  if (M <= 0 || N <= 0 || (esz != 2 && esz != 4)) return r;
  const std::int64_t per16 = 16 / esz, P = 16 / std::gcd(N * esz, std::int64_t{16});
  for (std::int64_t j = 0; j < P && j < M; ++j) {
    const std::int64_t c0 = ((-(j * N)) % per16 + per16) % per16;
    r.push_back({j, (M - j + P - 1) / P, c0, (N - c0) / per16 * per16});
  }
  return r;
}

namespace {

std::uint32_t esize(DType d) {
  return dtype_size(d);
}

bool floating(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16;
}
bool supported_dtype(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kInt64 || d == DType::kInt32 || d == DType::kBool;
}

// Broadcast strides of `t` against `out` (right-aligned).
std::vector<std::int64_t> bstrides(const DevTensor& t, const std::vector<std::int64_t>& out) {
  std::vector<std::int64_t> s(out.size(), 0);
  std::size_t off = out.size() - t.shape.size();
  for (std::size_t d = 0; d < t.shape.size(); ++d)
    s[off + d] = (t.shape[d] == 1 && out[off + d] != 1) ? 0 : t.strides[d];
  return s;
}

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
  Result<std::int64_t> sym(const graph::SymInt& s) {
    if (!s.is_symbolic()) return s.value;
    auto& slot = syms[static_cast<std::size_t>(s.sym)];
    if (slot) return *slot;
    const auto& sv = p.sym_values[static_cast<std::size_t>(s.sym)];
    if (sv.expr.empty()) return fail(ErrorCode::kMalformed, "SymInt '" + sv.name + "' has no value");
    SAFECKPT_TRY(std::int64_t v, graph::detail::eval_srepr(sv.expr, symbols, graph::GraphLimits{}));
    slot = v;
    return v;
  }
  Result<std::int64_t> integer(std::string_view name) {
    const Arg& a = arg(name);
    if (a.ints.size() != 1) return fail(ErrorCode::kMalformed, "argument '" + std::string(name) + "' is not an int");
    return sym(a.ints[0]);
  }
  Result<std::vector<std::int64_t>> ints(std::string_view name) {
    std::vector<std::int64_t> out;
    for (const auto& s : arg(name).ints) {
      SAFECKPT_TRY(std::int64_t v, sym(s));
      out.push_back(v);
    }
    return out;
  }
  Result<double> scalar(std::string_view name) {
    const Arg& a = arg(name);
    if (a.kind == Arg::Kind::kFloat) return a.f;
    if (a.kind == Arg::Kind::kBool) return a.b ? 1.0 : 0.0;
    if (a.kind == Arg::Kind::kInt && a.ints.size() == 1) {
      SAFECKPT_TRY(std::int64_t v, sym(a.ints[0]));
      return static_cast<double>(v);
    }
    return fail(ErrorCode::kMalformed, "argument '" + std::string(name) + "' is not a number");
  }
  Result<std::vector<std::int64_t>> shape_of(std::int32_t v) {
    std::vector<std::int64_t> s;
    for (const auto& d : p.values[static_cast<std::size_t>(v)].sizes) {
      SAFECKPT_TRY(std::int64_t x, sym(d));
      s.push_back(x);
    }
    return s;
  }
  Result<std::int64_t> norm_dim(std::int64_t d, std::size_t rank) const {
    auto r = static_cast<std::int64_t>(rank == 0 ? 1 : rank);
    if (d < -r || d >= r) return fail(ErrorCode::kMalformed, "dimension out of range");
    return d < 0 ? d + r : d;
  }

  std::int32_t new_buf(std::uint64_t bytes) {
    Buf b;
    b.bytes = std::max<std::uint64_t>(bytes, 1);
    plan.bufs.push_back(b);
    first_step.push_back(static_cast<std::int64_t>(plan.steps.size()));
    last_step.push_back(static_cast<std::int64_t>(plan.steps.size()));
    def_seen.push_back(0);
    return static_cast<std::int32_t>(plan.bufs.size() - 1);
  }
  DevTensor new_tensor(DType d, std::vector<std::int64_t> shape, bool channels_last = false) {
    DevTensor t;
    t.dtype = d;
    t.strides = channels_last && shape.size() == 4 ? channels_last_strides(shape) : contiguous_strides(shape);
    t.shape = std::move(shape);
    t.buf = new_buf(t.numel() * esize(d));
    return t;
  }
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
  std::string node_kind() const {
    if (node == nullptr) return "other";
    std::string op = node->schema->name;
    if (op.rfind("aten::", 0) == 0) op = op.substr(6);
    op = op.substr(0, op.find('.'));
    if (op == "linear" || op == "addmm" || op == "mm" || op == "bmm") return "gemm";
    if (op == "native_layer_norm") return "layer_norm";
    if (op == "_softmax") return "softmax";
    if (op == "any" || op == "mean") return "reduce";
    if (op.find("scaled_dot_product") != std::string::npos) return "attention";
    return op;
  }
  std::string node_shapes() const {
    std::string r;
    if (node == nullptr) return r;
    for (const auto& a : node->args)
      if (a.kind == Arg::Kind::kTensor && a.tensor >= 0 && vals[static_cast<std::size_t>(a.tensor)])
        r += (r.empty() ? "" : " ") + shape_text(vals[static_cast<std::size_t>(a.tensor)]->shape);
    return r;
  }
  std::vector<const void*> step_weights;  // use()d since the last add_step

  Result<DevTensor> value(std::int32_t id) {
    if (id < 0) return fail(ErrorCode::kMalformed, "missing tensor argument");
    if (g.open && g.reg_of_value.count(id) != 0) {
      SAFECKPT_CHECK(flush());
    }
    auto& v = vals[static_cast<std::size_t>(id)];
    if (!v)
      return fail(ErrorCode::kInternal, "value '" + p.value_names[static_cast<std::size_t>(id)] + "' has no plan");
    return *v;
  }
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
                 std::string kind) {
    FusedKernel k;
    k.rank = static_cast<int>(shape.size());
    k.in_dtypes = {in.dtype};
    k.out_dtypes = {out.dtype};
    MicroOp ld;
    ld.kind = MicroKind::kLoad;
    ld.dtype = in.dtype;
    ld.a = 0;
    MicroOp cp;
    cp.kind = MicroKind::kCast;
    cp.dtype = out.dtype;
    cp.a = 0;
    cp.store = 0;
    k.ops = {ld, cp};
    emit_fused(std::move(k), {in}, {out}, std::move(shape), std::move(name), std::move(kind));
  }

  // A contiguous copy of `t`, or `t` itself.
  Result<DevTensor> contiguous(const DevTensor& t) {
    if (t.contiguous()) return t;
    DevTensor out = new_tensor(t.dtype, t.shape);
    emit_copy(t, out, t.shape, "copy(" + node->name + ")", "copy");
    return out;
  }

  void emit_fused(FusedKernel k, std::vector<DevTensor> ins, std::vector<DevTensor> outs,
                  std::vector<std::int64_t> shape, std::string name, std::string kind = "fused") {
    for (const auto& t : ins) use(t);
    for (const auto& t : outs) def(t);
    // Each tensor's strides over the iteration space (inputs broadcast), then
    // the space collapsed (collapse_dims): fewer index divisions per element.
    std::vector<std::vector<std::int64_t>> strides;
    strides.reserve(ins.size() + outs.size());
    for (const auto& x : ins) strides.push_back(bstrides(x, shape));
    for (const auto& x : outs) strides.push_back(x.strides);
    const std::string shapes_text =
        shape_text(shape) + " " + std::to_string(ins.size()) + " in " + std::to_string(outs.size()) + " out";
    // Threads walk the first output in memory order (a channels-last output
    // too), unless an op reads the linear index.
    bool by_index = false;
    for (const auto& op : k.ops) by_index = by_index || op.kind == MicroKind::kArange;
    if (!by_index && !outs.empty()) order_dims(shape, strides, ins.size());
    collapse_dims(shape, strides);
    std::uint64_t n = 1;
    for (auto d : shape) n *= static_cast<std::uint64_t>(d);
    k.rank = static_cast<int>(shape.size());
    k.index32 = n <= static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max());
    // The same code as an earlier group (the next layer's): launch that kernel.
    std::size_t index = 0;
    while (index < plan.fused.size() && !same_code(plan.fused[index], k)) ++index;
    if (index == plan.fused.size()) {
      k.name = "k" + std::to_string(index);
      plan.fused.push_back(std::move(k));
    }
    ++plan.fused_launches;
    Plan* pl = &plan;
    add_step(
        std::move(name),
        [pl, index, ins, outs, shape, strides](cudaStream_t s) {
          FusedParams prm{};
          prm.n = 1;
          for (std::size_t d = 0; d < shape.size(); ++d) {
            prm.shape[d] = shape[d];
            prm.n *= shape[d];
          }
          std::size_t t = 0;
          std::vector<DType> dtypes;
          std::vector<const void*> ptrs;
          for (const auto* list : {&ins, &outs})
            for (const auto& x : *list) {
              prm.t[t].ptr = pl->ptr(x);
              dtypes.push_back(x.dtype);
              ptrs.push_back(prm.t[t].ptr);
              for (std::size_t d = 0; d < strides[t].size(); ++d) prm.t[t].strides[d] = strides[t][d];
              ++t;
            }
          if (prm.n == 0) return 0;
          prm.vec = shape.empty() ? 0u : fused_vector_mask(dtypes, ptrs, strides, shape.back());
          return launch_fused(pl->fns[index], prm, s);
        },
        std::move(kind), shapes_text);
  }

  // --------------------------------------------------------- pointwise
  Status flush() {
    if (!g.open) return {};
    Group grp = std::move(g);
    g = Group{};
    // Outputs take the layout of the first input of the group's full shape
    // (ATen's TensorIterator keeps a channels-last operand's memory format).
    bool channels_last = false;
    for (const auto& t : grp.ins)
      if (t.shape == grp.shape) {
        channels_last = t.channels_last();
        break;
      }
    std::vector<DevTensor> outs;
    for (std::int32_t v : grp.produced) {
      bool needed = is_output[static_cast<std::size_t>(v)] != 0;
      for (std::size_t c : consumers[static_cast<std::size_t>(v)]) needed = needed || grp.nodes.count(c) == 0;
      if (!needed) continue;
      auto& op = grp.k.ops[static_cast<std::size_t>(grp.reg_of_value[v])];
      DevTensor t = new_tensor(p.values[static_cast<std::size_t>(v)].dtype, grp.shape, channels_last);
      op.store = static_cast<std::int32_t>(outs.size());
      grp.k.out_dtypes.push_back(t.dtype);
      outs.push_back(t);
      vals[static_cast<std::size_t>(v)] = t;
    }
    if (outs.empty()) return {};
    grp.k.rank = static_cast<int>(grp.shape.size());
    emit_fused(std::move(grp.k), std::move(grp.ins), std::move(outs), grp.shape, grp.names);
    return {};
  }

  // Adds the current node (pointwise) to the group; `build` appends its
  // micro-ops given operand registers.
  Status pointwise(const std::vector<std::string_view>& tensor_args,
                   const std::function<Result<MicroOp>(const std::vector<std::int32_t>&)>& build) {
    SAFECKPT_TRY(DType od, out_dtype());
    std::int32_t out_id = node->outputs[0];
    SAFECKPT_TRY(auto shape, shape_of(out_id));
    if (shape.size() > static_cast<std::size_t>(kMaxRank)) return fail(ErrorCode::kUnsupported, "rank above 8");
    std::size_t new_inputs = 0;
    for (auto n : tensor_args) {
      const Arg& a = arg(n);
      if (a.kind == Arg::Kind::kTensor && g.reg_of_value.count(a.tensor) == 0 && g.in_of_value.count(a.tensor) == 0)
        ++new_inputs;
    }
    if (g.open && (g.shape != shape || !fuse || g.ins.size() + new_inputs + g.produced.size() + 1 > kMaxFusedTensors)) {
      SAFECKPT_CHECK(flush());
    }
    if (!g.open) {
      g.open = true;
      g.shape = shape;
    }
    std::vector<std::int32_t> regs;
    for (auto n : tensor_args) {
      const Arg& a = arg(n);
      if (a.kind == Arg::Kind::kFloat || a.kind == Arg::Kind::kInt || a.kind == Arg::Kind::kBool) {
        // A Python number operand (add.Tensor(x, 1e-6), mul.Tensor(x, 0.5)):
        // a constant, kept in float for floating results (ATen's opmath: a
        // bfloat16 op computes with the scalar as float, unrounded).
        SAFECKPT_TRY(double sv, scalar(n));
        MicroOp c;
        c.kind = MicroKind::kConst;
        c.dtype = floating(od) ? DType::kFloat32 : od;
        c.s0 = sv;
        g.k.ops.push_back(c);
        regs.push_back(static_cast<std::int32_t>(g.k.ops.size() - 1));
        continue;
      }
      if (a.kind != Arg::Kind::kTensor)
        return fail(ErrorCode::kMalformed, "argument '" + std::string(n) + "' is not a tensor");
      auto r = g.reg_of_value.find(a.tensor);
      if (r != g.reg_of_value.end()) {
        regs.push_back(r->second);
        continue;
      }
      auto& v = vals[static_cast<std::size_t>(a.tensor)];
      if (!v) return fail(ErrorCode::kInternal, "input value has no plan");
      if (!supported_dtype(v->dtype))
        return fail(ErrorCode::kUnsupported, "dtype " + std::string(dtype_name(v->dtype)) + " has no GPU kernel");
      auto in = g.in_of_value.find(a.tensor);
      std::int32_t idx;
      if (in == g.in_of_value.end()) {
        idx = static_cast<std::int32_t>(g.ins.size());
        g.ins.push_back(*v);
        g.k.in_dtypes.push_back(v->dtype);
        g.in_of_value[a.tensor] = idx;
      } else {
        idx = in->second;
      }
      MicroOp ld;
      ld.kind = MicroKind::kLoad;
      ld.dtype = v->dtype;
      ld.a = idx;
      g.k.ops.push_back(ld);
      regs.push_back(static_cast<std::int32_t>(g.k.ops.size() - 1));
    }
    SAFECKPT_TRY(MicroOp op, build(regs));
    op.dtype = od;
    g.k.ops.push_back(op);
    g.reg_of_value[out_id] = static_cast<std::int32_t>(g.k.ops.size() - 1);
    g.produced.push_back(out_id);
    g.nodes.insert(node_index);
    g.names += (g.names.empty() ? "" : "+") + node->name;
    if (!fuse) SAFECKPT_CHECK(flush());
    return {};
  }

  Status lower_pointwise(const std::string& op) {
    auto mk = [](MicroKind k, std::int32_t a = -1, std::int32_t b = -1, std::int32_t c = -1, double s0 = 0,
                 double s1 = 0) {
      MicroOp o;
      o.kind = k;
      o.a = a;
      o.b = b;
      o.c = c;
      o.s0 = s0;
      o.s1 = s1;
      return o;
    };
    if (op == "aten::add.Tensor" || op == "aten::add_.Tensor" || op == "aten::sub.Tensor") {
      SAFECKPT_TRY(double alpha, scalar("alpha"));
      MicroKind k = op == "aten::sub.Tensor" ? MicroKind::kSub : MicroKind::kAdd;
      return pointwise({"self", "other"},
                       [&](const auto& r) -> Result<MicroOp> { return mk(k, r[0], r[1], -1, alpha); });
    }
    if (op == "aten::mul.Scalar" || op == "aten::eq.Scalar" || op == "aten::le.Scalar") {
      SAFECKPT_TRY(double s, scalar("other"));
      MicroKind k = op == "aten::mul.Scalar"  ? MicroKind::kMulScalar
                    : op == "aten::eq.Scalar" ? MicroKind::kEqScalar
                                              : MicroKind::kLeScalar;
      return pointwise({"self"}, [&](const auto& r) -> Result<MicroOp> { return mk(k, r[0], -1, -1, s); });
    }
    if (op == "aten::mul.Tensor")
      return pointwise({"self", "other"},
                       [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kMul, r[0], r[1]); });
    if (op == "aten::bitwise_and.Tensor" || op == "aten::__and__.Tensor") {
      SAFECKPT_TRY(DType od, out_dtype());
      if (floating(od)) return fail(ErrorCode::kMalformed, "bitwise_and of floating tensors");
      return pointwise({"self", "other"},
                       [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kBitAnd, r[0], r[1]); });
    }
    if (op == "aten::ge.Scalar") {
      SAFECKPT_TRY(double s, scalar("other"));
      return pointwise({"self"},
                       [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kGeScalar, r[0], -1, -1, s); });
    }
    if (op == "aten::neg")
      return pointwise({"self"}, [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kNeg, r[0]); });
    if (op == "aten::pow.Tensor_Scalar" || op == "aten::rsqrt" || op == "aten::silu" || op == "aten::sigmoid" ||
        op == "aten::tanh") {
      SAFECKPT_TRY(DType od, out_dtype());
      if (!floating(od)) return fail(ErrorCode::kUnsupported, "a float-only op on a non-float tensor");
      double e = 0;
      MicroKind k = MicroKind::kRsqrt;
      if (op == "aten::pow.Tensor_Scalar") {
        SAFECKPT_TRY(e, scalar("exponent"));
        k = MicroKind::kPowScalar;
      } else if (op == "aten::silu") {
        k = MicroKind::kSilu;
      } else if (op == "aten::sigmoid") {
        k = MicroKind::kSigmoid;
      } else if (op == "aten::tanh") {
        k = MicroKind::kTanh;
      }
      return pointwise({"self"}, [&](const auto& r) -> Result<MicroOp> { return mk(k, r[0], -1, -1, e); });
    }
    // Copies and dtype conversions: _to_copy / to.dtype_layout / to.device
    // (device, pin_memory, non_blocking and memory_format change no value:
    // outputs are dense) and dropout (validate() admits train=False only:
    // the identity).
    if (op == "aten::_to_copy" || op == "aten::to.dtype_layout" || op == "aten::to.device" || op == "aten::dropout") {
      if (const Arg& lay = arg("layout"); lay.kind == Arg::Kind::kLayout && lay.code != 7)
        return fail(ErrorCode::kUnsupported, "a layout other than strided");
      return pointwise({op == "aten::dropout" ? "input" : "self"},
                       [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kCast, r[0]); });
    }
    if (op == "aten::new_ones") {
      if (const Arg& lay = arg("layout"); lay.kind == Arg::Kind::kLayout && lay.code != 7)
        return fail(ErrorCode::kUnsupported, "a layout other than strided");
      return pointwise({}, [&](const auto&) -> Result<MicroOp> { return mk(MicroKind::kConst, -1, -1, -1, 1.0); });
    }
    if (op == "aten::arange")
      return pointwise({},
                       [&](const auto&) -> Result<MicroOp> { return mk(MicroKind::kArange, -1, -1, -1, 0.0, 1.0); });
    if (op == "aten::logical_and")
      return pointwise({"self", "other"},
                       [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kLogicalAnd, r[0], r[1]); });
    if (op == "aten::logical_not")
      return pointwise({"self"}, [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kLogicalNot, r[0]); });
    if (op == "aten::where.self")
      return pointwise({"condition", "self", "other"},
                       [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kWhere, r[0], r[1], r[2]); });
    if (op == "aten::relu" || op == "aten::relu_")
      return pointwise({"self"}, [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kRelu, r[0]); });
    if (op == "aten::clone")
      return pointwise({"self"}, [&](const auto& r) -> Result<MicroOp> { return mk(MicroKind::kCast, r[0]); });
    if (op == "aten::gelu") {
      bool tanh = arg("approximate").s == "tanh";
      return pointwise({"self"}, [&](const auto& r) -> Result<MicroOp> {
        return mk(tanh ? MicroKind::kGeluTanh : MicroKind::kGeluErf, r[0]);
      });
    }
    if (op == "aten::arange.start" || op == "aten::arange.start_step") {
      SAFECKPT_TRY(double start, scalar("start"));
      double step = 1;
      if (op == "aten::arange.start_step") {
        SAFECKPT_TRY(step, scalar("step"));
      }
      return pointwise({},
                       [&](const auto&) -> Result<MicroOp> { return mk(MicroKind::kArange, -1, -1, -1, start, step); });
    }
    if (op == "aten::full" || op == "aten::full_like") {
      SAFECKPT_TRY(double v, scalar("fill_value"));
      return pointwise({}, [&](const auto&) -> Result<MicroOp> { return mk(MicroKind::kConst, -1, -1, -1, v); });
    }
    if (op == "aten::scalar_tensor") {
      SAFECKPT_TRY(double v, scalar("s"));
      return pointwise({}, [&](const auto&) -> Result<MicroOp> { return mk(MicroKind::kConst, -1, -1, -1, v); });
    }
    return fail(ErrorCode::kUnsupported, "no GPU kernel");
  }

  // --------------------------------------------------------------- views
  Status lower_view(const std::string& op) {
    SAFECKPT_TRY(DevTensor x, tensor("self"));
    if (op == "aten::split.Tensor" || op == "aten::split_with_sizes") {
      SAFECKPT_TRY(std::int64_t d0, integer("dim"));
      SAFECKPT_TRY(std::int64_t d, norm_dim(d0, x.shape.size()));
      std::vector<std::int64_t> sizes;
      std::int64_t total = x.shape[static_cast<std::size_t>(d)];
      if (op == "aten::split.Tensor") {
        SAFECKPT_TRY(std::int64_t ss, integer("split_size"));
        if (ss <= 0) return fail(ErrorCode::kMalformed, "split_size must be positive");
        for (std::int64_t s = 0; s < total; s += ss) sizes.push_back(std::min(ss, total - s));
        if (total == 0) sizes.push_back(0);
      } else {
        SAFECKPT_TRY(sizes, ints("split_sizes"));
      }
      std::int64_t start = 0;
      for (std::size_t i = 0; i < sizes.size(); ++i) {
        DevTensor t = x;
        t.shape[static_cast<std::size_t>(d)] = sizes[i];
        t.offset = x.offset + start * x.strides[static_cast<std::size_t>(d)];
        start += sizes[i];
        set_out(i, t);
      }
      return {};
    }
    DevTensor t = x;
    std::int32_t out_id = node->outputs[0];
    SAFECKPT_TRY(auto shape, shape_of(out_id));
    if (op == "aten::slice.Tensor" || op == "aten::select.int") {
      // PyTorch's clamping (aten/src/ATen/native/TensorShape.cpp slice /
      // select), as the CPU interpreter: slice's negative start/end count
      // from the end and clamp to [0, size], step > 0; select's index in
      // [-size, size).
      if (x.shape.empty()) return fail(ErrorCode::kMalformed, "slice/select of a 0-d tensor");
      SAFECKPT_TRY(std::int64_t d0, integer("dim"));
      SAFECKPT_TRY(std::int64_t dd, norm_dim(d0, x.shape.size()));
      const auto d = static_cast<std::size_t>(dd);
      const std::int64_t size = x.shape[d];
      if (op == "aten::select.int") {
        SAFECKPT_TRY(std::int64_t k, integer("index"));
        if (k < -size || k >= size) return fail(ErrorCode::kMalformed, "select index out of range");
        if (k < 0) k += size;
        t.offset = x.offset + k * x.strides[d];
        t.shape.erase(t.shape.begin() + dd);
        t.strides.erase(t.strides.begin() + dd);
      } else {
        std::int64_t start = 0, end = size;
        if (arg("start").kind == Arg::Kind::kInt) {
          SAFECKPT_TRY(start, integer("start"));
        }
        if (arg("end").kind == Arg::Kind::kInt) {
          SAFECKPT_TRY(end, integer("end"));
        }
        SAFECKPT_TRY(std::int64_t step, integer("step"));
        if (step <= 0) return fail(ErrorCode::kMalformed, "slice step must be positive");
        if (start < 0) start = start < -size ? 0 : start + size;
        if (end < 0) end = end < -size ? 0 : end + size;
        start = std::min(start, size);
        end = std::min(end, size);
        end = std::max(end, start);
        t.shape[d] = end == start ? 0 : (end - start - 1) / step + 1;  // no overflow for any step > 0
        t.offset = x.offset + start * x.strides[d];
        t.strides[d] = x.strides[d] * step;
      }
    } else if (op == "aten::view" || op == "aten::reshape" || op == "aten::flatten.using_ints") {
      // A view where the memory allows one (q/k/v heads split from a fused
      // projection), else a contiguous copy.
      auto vs = graph::detail::view_strides(x.shape, x.strides, shape);
      if (vs) {
        t.strides = std::move(*vs);
      } else {
        SAFECKPT_TRY(t, contiguous(x));
        t.strides = contiguous_strides(shape);
      }
      t.shape = shape;
    } else if (op == "aten::permute") {
      SAFECKPT_TRY(auto dims, ints("dims"));
      if (dims.size() != x.shape.size()) return fail(ErrorCode::kMalformed, "permute rank");
      for (std::size_t i = 0; i < dims.size(); ++i) {
        SAFECKPT_TRY(std::int64_t dd, norm_dim(dims[i], x.shape.size()));
        t.shape[i] = x.shape[static_cast<std::size_t>(dd)];
        t.strides[i] = x.strides[static_cast<std::size_t>(dd)];
      }
    } else if (op == "aten::transpose.int") {
      SAFECKPT_TRY(std::int64_t a0, integer("dim0"));
      SAFECKPT_TRY(std::int64_t b0, integer("dim1"));
      SAFECKPT_TRY(std::int64_t a, norm_dim(a0, x.shape.size()));
      SAFECKPT_TRY(std::int64_t b, norm_dim(b0, x.shape.size()));
      std::swap(t.shape[static_cast<std::size_t>(a)], t.shape[static_cast<std::size_t>(b)]);
      std::swap(t.strides[static_cast<std::size_t>(a)], t.strides[static_cast<std::size_t>(b)]);
    } else if (op == "aten::unsqueeze") {
      SAFECKPT_TRY(std::int64_t d0, integer("dim"));
      SAFECKPT_TRY(std::int64_t d, norm_dim(d0, x.shape.size() + 1));
      auto du = static_cast<std::size_t>(d);
      std::int64_t st = du < x.shape.size() ? x.shape[du] * x.strides[du] : 1;
      t.shape.insert(t.shape.begin() + d, 1);
      t.strides.insert(t.strides.begin() + d, st);
    } else if (op == "aten::expand") {
      t.shape = shape;
      t.strides = bstrides(x, shape);
    } else {
      return fail(ErrorCode::kUnsupported, "no GPU kernel");
    }
    if (t.shape != shape) return fail(ErrorCode::kInternal, "view shape disagrees with tensor_meta");
    set_out(0, t);
    return {};
  }

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
              float alpha, float beta, std::uint32_t align = 256, const std::optional<DevTensor>& c_in = std::nullopt) {
    const bool batched = a.shape.size() == 3;
    const std::size_t r = a.shape.size();
    std::int64_t M = a.shape[r - 2], K = a.shape[r - 1], N = b.shape[r - 1];
    std::int64_t batch = batched ? a.shape[0] : 1;
    auto la = layout(M, K, a.strides[r - 2], a.strides[r - 1]);
    if (!la) {
      SAFECKPT_TRY(a, contiguous(a));
      la = layout(M, K, a.strides[r - 2], a.strides[r - 1]);
    }
    auto lb = layout(K, N, b.strides[r - 2], b.strides[r - 1]);
    if (!lb) {
      SAFECKPT_TRY(b, contiguous(b));
      lb = layout(K, N, b.strides[r - 2], b.strides[r - 1]);
    }
    if (a.dtype != b.dtype || a.dtype != out.dtype || !floating(a.dtype))
      return fail(ErrorCode::kUnsupported, "GEMM operands must share float32 or bfloat16");
    auto g2 = std::make_shared<GemmDesc>();
    cudaDataType_t ty = a.dtype == DType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t ct =
        (a.dtype == DType::kFloat32 && eng.opt.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    auto lt_fail = [&](const char* what, cublasStatus_t st) {
      return fail(ErrorCode::kDevice, std::string("cuBLASLt ") + what + ": " + cublasLtGetStatusString(st));
    };
    cublasStatus_t st = cublasLtMatmulDescCreate(&g2->op, ct, CUDA_R_32F);
    if (st != CUBLAS_STATUS_SUCCESS) return lt_fail("MatmulDescCreate", st);
    // Column-major view: D^T[N,M] = B^T[N,K] @ A^T[K,M]. "Lt A" is B^T.
    cublasOperation_t opa = lb->trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasOperation_t opb = la->trans ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasLtMatmulDescSetAttribute(g2->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
    cublasLtMatmulDescSetAttribute(g2->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (bias)
      epi = act == 1 ? CUBLASLT_EPILOGUE_RELU_BIAS : act == 2 ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_BIAS;
    else if (act == 1)
      epi = CUBLASLT_EPILOGUE_RELU;
    else if (act == 2)
      epi = CUBLASLT_EPILOGUE_GELU;
    cublasLtMatmulDescSetAttribute(g2->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    // Layouts (rows, cols, ld) as stored, column-major.
    auto mk_layout = [&](cublasLtMatrixLayout_t* l, std::uint64_t rows, std::uint64_t cols, std::int64_t ld,
                         std::int64_t bstride) -> Status {
      cublasStatus_t s2 = cublasLtMatrixLayoutCreate(l, ty, rows, cols, ld);
      if (s2 != CUBLAS_STATUS_SUCCESS) return lt_fail("MatrixLayoutCreate", s2);
      if (batched) {
        auto bc = static_cast<std::int32_t>(batch);
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc);
        cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &bstride, sizeof bstride);
      }
      return {};
    };
    auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
    // B^T: not trans -> stored [N,K] col-major with ld; trans -> stored [K,N].
    SAFECKPT_CHECK(
        mk_layout(&g2->la, lb->trans ? u(K) : u(N), lb->trans ? u(N) : u(K), lb->ld, batched ? b.strides[0] : 0));
    SAFECKPT_CHECK(
        mk_layout(&g2->lb, la->trans ? u(M) : u(K), la->trans ? u(K) : u(M), la->ld, batched ? a.strides[0] : 0));
    const std::int64_t ldc = out.strides.size() == r && out.strides[r - 1] == 1 ? out.strides[r - 2] : N;
    SAFECKPT_CHECK(mk_layout(&g2->lc, u(N), u(M), ldc, batched ? M * ldc : 0));
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulPreferenceCreate(&pref);
    std::uint64_t ws = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    if (align < 256)
      for (auto at : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        cublasLtMatmulPreferenceSetAttribute(pref, at, &align, sizeof align);
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    // Compiled plans time cuBLASLt's candidates before their first run
    // (EngineOptions::autotune_gemm, tune_gemms); their choice has a key of
    // its own, so an eager plan's untimed choice is never taken for it.
    const bool tune = fuse && eng.opt.autotune_gemm && eng.lt != nullptr;
    std::vector<cublasLtMatmulAlgo_t> candidates;
    // A C input other than D (a residual in the epilogue) needs an algorithm
    // that supports results out of place (CUBLASLT_ALGO_CAP_OUT_OF_PLACE_
    // RESULT_SUPPORT); the heuristic is not told (it sees no pointers), so
    // its answers and remembered choices are filtered.
    const bool out_of_place = c_in.has_value();
    auto usable = [&](const cublasLtMatmulAlgo_t& algo) {
      if (!out_of_place) return true;
      std::int32_t cap = 0;
      std::size_t written = 0;
      return cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_OUT_OF_PLACE_RESULT_SUPPORT, &cap, sizeof cap,
                                               &written) == CUBLAS_STATUS_SUCCESS &&
             cap != 0;
    };
    // Everything the heuristic sees (pointers aside: cuBLASLt assumes
    // 256-byte alignment by default, which every buffer here has), whether C
    // is D, and beta. The choice is keyed by all of that and cuBLASLt's
    // version; one found in this engine or the persistent cache is
    // re-checked by cuBLASLt (cublasLtMatmulAlgoCheck) before it is used.
    std::string key = std::string(tune ? "gemm cublasLt tuned " : "gemm cublasLt ") +
                      std::to_string(eng.lt != nullptr ? cublasLtGetVersion() : 0) + ":";
    for (std::int64_t x : {std::int64_t{ty}, std::int64_t{ct}, std::int64_t{opa}, std::int64_t{opb}, std::int64_t{epi},
                           M, N, K, std::int64_t{lb->ld}, std::int64_t{la->ld}, ldc, std::int64_t{align}, batch,
                           batched ? a.strides[0] : 0, batched ? b.strides[0] : 0, static_cast<std::int64_t>(ws)})
      key += std::to_string(x) + ",";
    if (out_of_place) key += "c!=d,";
    if (beta != 0) key += "beta,";
    std::optional<cublasLtMatmulAlgo_t> known;
    // The same GEMM earlier in this plan still waiting to be timed (the
    // previous layer's): this step joins its tuning, no heuristic query.
    auto pending = pending_tunes.find(key);
    if (pending != pending_tunes.end()) {
      known = plan.tunes[pending->second].candidates.front();
    } else if (eng.lt != nullptr) {
      bool from_cache = false;
      if (auto bytes = eng.find_choice(key, &from_cache); bytes && bytes->size() == sizeof(cublasLtMatmulAlgo_t)) {
        cublasLtMatmulAlgo_t algo{};
        std::memcpy(&algo, bytes->data(), sizeof algo);
        cublasLtMatmulHeuristicResult_t check{};
        if (cublasLtMatmulAlgoCheck(eng.lt, g2->op, g2->la, g2->lb, g2->lc, g2->lc, &algo, &check) ==
                CUBLAS_STATUS_SUCCESS &&
            check.workspaceSize <= ws && usable(algo))
          known = algo;
      }
    }
    if (known) {
      found = 1;
      res.algo = *known;
      ++plan.gemm_heuristics_reused;
    } else if (eng.lt != nullptr) {
      const auto h0 = std::chrono::steady_clock::now();
      cublasLtMatmulHeuristicResult_t results[kGemmTuneCandidates] = {};
      st = cublasLtMatmulAlgoGetHeuristic(eng.lt, g2->op, g2->la, g2->lb, g2->lc, g2->lc, pref,
                                          tune || out_of_place ? kGemmTuneCandidates : 1, results, &found);
      plan.heuristic_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - h0).count();
      ++plan.gemm_heuristics;
      if (st == CUBLAS_STATUS_SUCCESS) {
        for (int i = 0; i < found && i < kGemmTuneCandidates; ++i)
          if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= ws && usable(results[i].algo))
            candidates.push_back(results[i].algo);
        found = static_cast<int>(candidates.size());
        if (found > 0) res.algo = candidates.front();
        if (!tune || candidates.size() < 2) {  // nothing to choose between: keep the first answer
          candidates.clear();
          if (found > 0) {
            std::vector<std::uint8_t> bytes(sizeof(cublasLtMatmulAlgo_t));
            std::memcpy(bytes.data(), &res.algo, sizeof res.algo);
            eng.store_choice(key, std::move(bytes));
          }
        }
      }
    } else {
      found = 1;  // dry plan (no device): no algorithm is chosen, nothing runs
    }
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0)
      return fail(ErrorCode::kDevice, std::string("cuBLASLt found no algorithm (") + cublasLtGetStatusString(st) +
                                          (out_of_place ? ", results out of place" : "") + ")");
    g2->algo = res.algo;
    use(a);
    use(b);
    if (bias) use(*bias);
    if (c_in) use(*c_in);
    if (beta != 0 && !c_in) use(out);
    def(out);
    Plan* pl = &plan;
    cublasLtHandle_t lt = eng.lt;
    add_step(node->name, [pl, g2, a, b, out, bias_t = bias, c_in, alpha, beta, lt](cudaStream_t s) {
      if (bias_t) {
        const void* bp = pl->ptr(*bias_t);
        cublasLtMatmulDescSetAttribute(g2->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp);
      }
      void* d = pl->ptr(out);
      const void* c = c_in ? pl->ptr(*c_in) : d;
      cublasStatus_t s2 = cublasLtMatmul(lt, g2->op, &alpha, pl->ptr(b), g2->la, pl->ptr(a), g2->lb, &beta, c, g2->lc,
                                         d, g2->lc, &g2->algo, pl->workspace, kWorkspaceBytes, s);
      return s2 == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + static_cast<int>(s2);
    });
    if (pending != pending_tunes.end()) {
      GemmTune& t = plan.tunes[pending->second];
      t.steps.push_back(plan.steps.size() - 1);
      t.descs.push_back(g2);
    } else if (!candidates.empty()) {
      GemmTune t;
      t.steps.push_back(plan.steps.size() - 1);
      t.descs.push_back(g2);
      t.key = key;
      t.candidates = std::move(candidates);
      t.fallback = res.algo;
      pending_tunes[key] = plan.tunes.size();
      plan.tunes.push_back(std::move(t));
    }
    plan.steps.back().kind = "gemm";
    plan.steps.back().shapes = (batched ? "batch=" + std::to_string(batch) + " " : std::string()) +
                               "M=" + std::to_string(M) + " N=" + std::to_string(N) + " K=" + std::to_string(K) + " " +
                               std::string(dtype_name(a.dtype));
    return {};
  }

  // The activation that may be fused into the GEMM producing value `v`
  // (its node absorbed).
  int epilogue_for(std::int32_t v) {
    const int act = epilogue_act(v);
    if (act != 0) absorbed[consumers[static_cast<std::size_t>(v)][0]] = 1;
    return act;
  }
  // ... the same, nothing absorbed: 0 none, 1 relu, 2 tanh gelu.
  int epilogue_act(std::int32_t v) const {
    if (!fuse || !fuse_epilogue || v < 0 || is_output[static_cast<std::size_t>(v)]) return 0;
    const auto& cs = consumers[static_cast<std::size_t>(v)];
    if (cs.size() != 1) return 0;
    const Node& c = p.nodes[cs[0]];
    const std::string& op = c.schema->name;
    int act = 0;
    if (op == "aten::relu" || op == "aten::relu_") act = 1;
    if (op == "aten::gelu") {
      const Arg* approximate = arg_of(c, "approximate");
      if (approximate != nullptr && approximate->s == "tanh") act = 2;
    }
    if (act == 0 || c.outputs.empty() || c.outputs[0] < 0) return 0;
    return act;
  }

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
  std::optional<Residual> residual_for(std::int32_t v, const DevTensor& g_out) {
    if (!fuse_epilogue || v < 0) return std::nullopt;
    Residual res;
    for (int hops = 0; hops < 8; ++hops) {
      if (is_output[static_cast<std::size_t>(v)]) return std::nullopt;
      const auto& cs = consumers[static_cast<std::size_t>(v)];
      if (cs.size() != 1) return std::nullopt;
      const Node& c = p.nodes[cs[0]];
      const std::string& op = c.schema->name;
      if (c.outputs.empty() || c.outputs[0] < 0 || absorbed[cs[0]]) return std::nullopt;
      if (op == "aten::dropout" || op == "aten::view" || op == "aten::reshape") {
        if (p.values[static_cast<std::size_t>(c.outputs[0])].dtype != g_out.dtype) return std::nullopt;
        res.chain.push_back(cs[0]);
        v = c.outputs[0];
        continue;
      }
      if (op != "aten::add.Tensor") return std::nullopt;
      const Arg* self = arg_of(c, "self");
      const Arg* other = arg_of(c, "other");
      const Arg* alpha = arg_of(c, "alpha");
      if (self == nullptr || other == nullptr || self->kind != Arg::Kind::kTensor ||
          other->kind != Arg::Kind::kTensor || self->tensor == other->tensor)
        return std::nullopt;
      if (alpha != nullptr && alpha->kind != Arg::Kind::kNone) {
        const bool one = (alpha->kind == Arg::Kind::kFloat && alpha->f == 1.0) ||
                         (alpha->kind == Arg::Kind::kInt && alpha->ints.size() == 1 && !alpha->ints[0].is_symbolic() &&
                          alpha->ints[0].value == 1);
        if (!one) return std::nullopt;
      }
      const std::int32_t r = self->tensor == v ? other->tensor : self->tensor;
      if (r < 0 || !vals[static_cast<std::size_t>(r)]) return std::nullopt;
      const DevTensor& rt = *vals[static_cast<std::size_t>(r)];
      auto shape = shape_of(c.outputs[0]);
      if (!shape || p.values[static_cast<std::size_t>(c.outputs[0])].dtype != g_out.dtype) return std::nullopt;
      if (rt.dtype != g_out.dtype || rt.shape != *shape || !rt.contiguous() || rt.buf < 0 || rt.offset != 0 ||
          rt.numel() != g_out.numel())
        return std::nullopt;
      res.c = rt;
      res.c.shape = g_out.shape;
      res.c.strides = g_out.strides;
      res.add_node = cs[0];
      res.shape = std::move(*shape);
      return res;
    }
    return std::nullopt;
  }

  // Columns [from, from + n) of `t` (its last dim), a view.
  static DevTensor cols(DevTensor t, std::int64_t from, std::int64_t n) {
    t.offset += from * t.strides.back();
    t.shape.back() = n;
    return t;
  }

  // A linear's input [..., K] as the GEMM's rows [M, K]: a view where the
  // leading dims collapse into one stride, else a contiguous copy.
  Result<DevTensor> linear_rows(DevTensor a) {
    const std::int64_t K = a.shape.back();
    bool ok = a.strides.back() == 1 || K == 1;
    for (std::size_t d = 0; d + 2 < a.shape.size(); ++d)
      ok = ok && (a.shape[d] == 1 || a.strides[d] == a.strides[d + 1] * a.shape[d + 1]);
    if (!ok) {
      SAFECKPT_TRY(a, contiguous(a));
    }
    const std::int64_t M = static_cast<std::int64_t>(a.numel()) / std::max<std::int64_t>(K, 1);
    std::int64_t row_stride = a.shape.size() >= 2 ? a.strides[a.shape.size() - 2] : K;
    if (M == 1) row_stride = K;
    a.shape = {M, K};
    a.strides = {row_stride, 1};
    return a;
  }

  // Horizontal GEMM fusion (EngineOptions::fuse_sibling_gemms): the
  // aten::linear nodes, this one first, that read this node's input and
  // whose weight (and bias, all or none) are checkpoint tensors of the
  // input's dtype with K columns, as HF BERT's query / key / value or
  // LLaMA's gate / up projections. A member's N is a multiple of 16 bytes'
  // worth of elements (each output block starts 16-byte aligned, as the
  // attention kernels and cuDNN want it), and no activation or residual
  // add would join its epilogue (those keep their own GEMM). Fewer than two:
  // none (the node lowers alone).
  std::vector<std::size_t> sibling_linears() {
    std::vector<std::size_t> group;
    const Arg* in = arg_of(*node, "input");
    if (in == nullptr || in->kind != Arg::Kind::kTensor || in->tensor < 0) return group;
    const auto& x = vals[static_cast<std::size_t>(in->tensor)];
    if (!x || x->shape.empty() || !floating(x->dtype)) return group;
    const std::int64_t K = x->shape.back();
    const std::int64_t M = static_cast<std::int64_t>(x->numel()) / std::max<std::int64_t>(K, 1);
    const auto per16 = static_cast<std::int64_t>(16 / esize(x->dtype));
    auto checkpoint = [&](const Arg* a) -> const DevTensor* {
      if (a == nullptr || a->kind != Arg::Kind::kTensor || a->tensor < 0) return nullptr;
      const auto id = static_cast<std::size_t>(a->tensor);
      return weights.size() > id && weights[id] ? &*weights[id] : nullptr;
    };
    int with_bias = -1;  // of the first member
    for (std::size_t c : consumers[static_cast<std::size_t>(in->tensor)]) {
      if (c < node_index || absorbed[c] || (!group.empty() && group.back() == c)) continue;
      const Node& n = p.nodes[c];
      if (n.schema->name != "aten::linear" || n.outputs.empty() || n.outputs[0] < 0) continue;
      const Arg* ni = arg_of(n, "input");
      const Arg* nb = arg_of(n, "bias");
      if (ni == nullptr || ni->tensor != in->tensor) continue;
      const DevTensor* w = checkpoint(arg_of(n, "weight"));
      if (w == nullptr || w->shape.size() != 2 || w->shape[1] != K || w->dtype != x->dtype) continue;
      const std::int64_t N = w->shape[0];
      if (N <= 0 || N % per16 != 0) continue;
      const bool has_bias = nb != nullptr && nb->kind == Arg::Kind::kTensor;
      const DevTensor* b = has_bias ? checkpoint(nb) : nullptr;
      if (has_bias && (b == nullptr || b->shape != std::vector<std::int64_t>{N} || b->dtype != x->dtype)) continue;
      if (with_bias >= 0 && with_bias != (has_bias ? 1 : 0)) continue;
      const std::int32_t out = n.outputs[0];
      if (p.values[static_cast<std::size_t>(out)].dtype != x->dtype || epilogue_act(out) != 0) continue;
      DevTensor dense;
      dense.dtype = x->dtype;
      dense.shape = {M, N};
      dense.strides = {N, 1};
      if (residual_for(out, dense)) continue;
      if (group.empty() && c != node_index) return group;  // this node itself does not qualify
      with_bias = has_bias ? 1 : 0;
      group.push_back(c);
    }
    return group;
  }

  // One GEMM for the sibling linears `group` (sibling_linears; this node
  // first): a prep step copies their weights (and biases) into one
  // [sum N, K] kPrepared tensor, the GEMM writes [M, sum N], and each
  // member's output is its columns, a view with rows sum N apart (the
  // views and attention read such strides; a reader that needs dense rows
  // copies). The other members are absorbed. Costs the weights' size again
  // in device memory (Plan::prepared_bytes).
  Status lower_sibling_linears(const std::vector<std::size_t>& group) {
    SAFECKPT_TRY(DevTensor x, tensor("input"));
    SAFECKPT_TRY(DevTensor a, linear_rows(x));
    const DType dt = a.dtype;
    const std::int64_t M = a.shape[0], K = a.shape[1];
    std::vector<DevTensor> ws;
    std::vector<std::optional<DevTensor>> bs;
    std::vector<std::int64_t> offs;
    std::int64_t total = 0;
    std::string name;
    for (std::size_t i : group) {
      const Node& n = p.nodes[i];
      ws.push_back(*weights[static_cast<std::size_t>(arg_of(n, "weight")->tensor)]);
      const Arg* nb = arg_of(n, "bias");
      bs.emplace_back();
      if (nb != nullptr && nb->kind == Arg::Kind::kTensor) bs.back() = *weights[static_cast<std::size_t>(nb->tensor)];
      offs.push_back(total);
      total += ws.back().shape[0];
      name += (name.empty() ? "" : ",") + n.name;
    }
    const DevTensor wcat = prepared_tensor(dt, {total, K}, {K, 1});
    std::optional<DevTensor> bcat;
    if (bs[0]) bcat = prepared_tensor(dt, {total}, {1});
    prep = true;
    for (std::size_t k = 0; k < group.size(); ++k) {
      const std::int64_t N = ws[k].shape[0];
      DevTensor rows = wcat;
      rows.offset = offs[k] * K;
      rows.shape = {N, K};
      emit_copy(ws[k], rows, rows.shape, "concatenate weight (" + p.nodes[group[k]].name + ")", "prepare");
      if (bcat)
        emit_copy(*bs[k], cols(*bcat, offs[k], N), {N}, "concatenate bias (" + p.nodes[group[k]].name + ")", "prepare");
    }
    prep = false;
    const DevTensor out = new_tensor(dt, {M, total});
    DevTensor b = wcat;  // [K, sum N], column-major
    b.shape = {K, total};
    b.strides = {1, K};
    SAFECKPT_CHECK(gemm(a, b, out, bcat, 0, 1.0f, 0.0f));
    plan.steps.back().name = name;
    for (std::size_t k = 0; k < group.size(); ++k) {
      const std::int32_t id = p.nodes[group[k]].outputs[0];
      SAFECKPT_TRY(auto shape, shape_of(id));
      std::int64_t rows = 1;
      for (std::size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
      if (shape.empty() || shape.back() != ws[k].shape[0] || rows != M)
        return fail(ErrorCode::kInternal, "linear output shape disagrees with tensor_meta");
      DevTensor v = out;
      v.offset = offs[k];
      v.shape = shape;
      v.strides.assign(shape.size(), 1);
      for (std::size_t d = shape.size() - 1; d-- > 0;)
        v.strides[d] = d + 2 == shape.size() ? total : v.strides[d + 1] * shape[d + 1];
      vals[static_cast<std::size_t>(id)] = v;
      absorbed[group[k]] = 1;
    }
    return {};
  }

  // Whether `a` (rows [M, K], unit column stride), `b` ([K, N], a
  // weight's rows as its columns: unit row stride) and the dense output
  // `g_out` ([M, N], rows N apart) allow the row classes: A's rows and B's
  // columns 16-byte aligned, N at least two edges wide, at least as many
  // rows as classes.
  bool row_classes_apply(const DevTensor& a, const DevTensor& b, const DevTensor& g_out) const {
    const auto esz = static_cast<std::int64_t>(esize(g_out.dtype));
    const std::int64_t per16 = 16 / esz, M = g_out.shape[0], N = g_out.shape[1];
    return a.strides[1] == 1 && (a.strides[0] * esz) % 16 == 0 && (a.offset * esz) % 16 == 0 && b.strides[0] == 1 &&
           (b.strides[1] * esz) % 16 == 0 && (b.offset * esz) % 16 == 0 &&
           g_out.strides == std::vector<std::int64_t>{N, 1} && (g_out.offset * esz) % 16 == 0 && N >= 2 * per16 &&
           M >= 16 / std::gcd(N * esz, std::int64_t{16});
  }
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
                             const std::optional<DevTensor>& bias, int act, float alpha) {
    const auto esz = static_cast<std::int64_t>(esize(d.dtype));
    const std::int64_t per16 = 16 / esz, M = d.shape[0], N = d.shape[1];
    const auto classes = gemm_row_classes(M, N, esz);
    const std::int64_t P = 16 / std::gcd(N * esz, std::int64_t{16});  // classes.size(): M >= P
    const std::string base = node->name;
    // The bias segments: each class's columns, then the first and the last
    // edge's, each from a 16-byte aligned start of one kPrepared tensor.
    std::vector<std::int64_t> seg;
    std::optional<DevTensor> pb;
    if (bias) {
      std::int64_t total = 0;
      for (const GemmRowClass& c : classes) {
        seg.push_back(total);
        total += (c.n + per16 - 1) / per16 * per16;
      }
      for (int side = 0; side < 2; ++side) {
        seg.push_back(total);
        total += per16;
      }
      pb = prepared_tensor(d.dtype, {total}, {1});
      prep = true;
      auto put = [&](std::int64_t from, std::int64_t n, std::int64_t at, const std::string& what) {
        DevTensor src = *bias, dst = *pb;
        src.offset += from * bias->strides.back();
        src.shape = {n};
        src.strides = {bias->strides.back()};
        dst.offset = at;
        dst.shape = {n};
        emit_copy(src, dst, {n}, "bias of " + base + what, "prepare");
      };
      for (std::size_t k = 0; k < classes.size(); ++k)
        put(classes[k].c0, classes[k].n, seg[k], ".rows" + std::to_string(classes[k].j));
      put(0, per16, seg[classes.size()], ".first");
      put(N - per16, per16, seg[classes.size() + 1], ".last");
      prep = false;
    }
    auto bias_at = [&](std::size_t k, std::int64_t n) -> std::optional<DevTensor> {
      if (!pb) return std::nullopt;
      return cols(*pb, seg[k], n);
    };
    for (std::size_t k = 0; k < classes.size(); ++k) {
      const GemmRowClass& c = classes[k];
      DevTensor ac = a, dc = cols(d, c.c0, c.n);
      ac.offset += c.j * a.strides[0];
      ac.shape = {c.rows, a.shape[1]};
      ac.strides = {a.strides[0] * P, 1};
      dc.offset += c.j * N;
      dc.shape[0] = c.rows;
      dc.strides = {N * P, 1};
      SAFECKPT_CHECK(gemm(ac, cols(b, c.c0, c.n), dc, bias_at(k, c.n), act, alpha, 0.0f, 16));
      plan.steps.back().name = base + ".rows" + std::to_string(c.j);
      plan.steps.back().shapes +=
          " (rows " + std::to_string(c.j) + " mod " + std::to_string(P) + ", from column " + std::to_string(c.c0) + ")";
    }
    // The edges: D's first and last per16 columns of every row.
    const DevTensor edges = new_tensor(d.dtype, {M, 2 * per16});
    for (int side = 0; side < 2; ++side) {
      const std::int64_t from = side == 0 ? 0 : N - per16;
      const DevTensor ec = cols(edges, side * per16, per16), dc = cols(d, from, per16);
      SAFECKPT_CHECK(gemm(a, cols(b, from, per16), ec, bias_at(classes.size() + static_cast<std::size_t>(side), per16),
                          act, alpha, 0.0f, 16));
      const std::string what = side == 0 ? ".first" : ".last";
      plan.steps.back().name = base + what;
      emit_copy(ec, dc, dc.shape, base + what + ".copy", "copy");
    }
    return {};
  }

  // The least multiply-adds (M * N * K) for which lower_gemm splits a GEMM
  // with a misaligned N: below it the two extra launches cost more than the
  // slower kernel saves.
  static constexpr double kSplitGemmMinMacs = 1u << 27;

  Status lower_gemm(const std::string& op) {
    SAFECKPT_TRY(DType od, out_dtype());
    std::int32_t out_id = node->outputs[0];
    SAFECKPT_TRY(auto oshape, shape_of(out_id));
    std::optional<DevTensor> bias;
    DevTensor a, b;
    float alpha = 1, beta = 0;
    std::optional<DevTensor> preset;  // written into out before a beta=1 GEMM
    if (op == "aten::linear") {
      if (fuse && eng.opt.fuse_sibling_gemms) {
        SAFECKPT_CHECK(tensor("input"));  // flushes a generated kernel still writing it
        const auto group = sibling_linears();
        if (group.size() >= 2) return lower_sibling_linears(group);
      }
      SAFECKPT_TRY(a, tensor("input"));
      SAFECKPT_TRY(DevTensor w, tensor("weight"));
      SAFECKPT_TRY(bias, opt_tensor("bias"));
      if (a.shape.empty() || w.shape.size() != 2)
        return fail(ErrorCode::kUnsupported, "linear needs input rank >= 1 and a 2-d weight");
      SAFECKPT_TRY(a, linear_rows(a));
      b = w;
      b.shape = {w.shape[1], w.shape[0]};
      b.strides = {w.strides[1], w.strides[0]};
    } else if (op == "aten::addmm") {
      SAFECKPT_TRY(DevTensor self, tensor("self"));
      SAFECKPT_TRY(a, tensor("mat1"));
      SAFECKPT_TRY(b, tensor("mat2"));
      SAFECKPT_TRY(double al, scalar("alpha"));
      SAFECKPT_TRY(double be, scalar("beta"));
      alpha = static_cast<float>(al);
      std::int64_t N = b.shape[1];
      bool vec = (self.shape.size() == 1 && self.shape[0] == N && self.strides[0] == 1) ||
                 (self.shape.size() == 2 && self.shape[0] == 1 && self.shape[1] == N && self.strides[1] == 1);
      if (vec && be == 1.0) {
        bias = self;
      } else if (be != 0.0) {
        preset = self;
        beta = static_cast<float>(be);
      }
    } else if (op == "aten::mm" || op == "aten::bmm") {
      SAFECKPT_TRY(a, tensor("self"));
      SAFECKPT_TRY(b, tensor("mat2"));
    } else {
      return fail(ErrorCode::kUnsupported, "no GPU kernel");
    }
    if (bias && (!bias->contiguous() || bias->dtype != od)) {
      SAFECKPT_TRY(bias, contiguous(*bias));
    }
    DevTensor out = new_tensor(od, oshape);
    if (preset) {
      // out = beta-scaled later: copy self broadcast into out first.
      emit_copy(*preset, out, oshape, node->name + ".beta", "copy");
    }
    DevTensor g_out = out;
    if (op == "aten::linear") {
      g_out.shape = {a.shape[0], b.shape[1]};
      g_out.strides = contiguous_strides(g_out.shape);
    }
    int act = epilogue_for(out_id);
    std::size_t gemm_step = 0;
    // An N that is not a multiple of 16 bytes' worth of elements (GPT-2's
    // lm_head: N = 50257) keeps cuBLASLt's tensor-core GEMMs 7x slower
    // (measured on the H200, bench/RESULTS.md: 0.84 ms against 0.12 ms for
    // N = 50264; a padded output row alone does not help). A tensor-core GEMM
    // of at least kSplitGemmMinMacs is split: the first N rounded down to that
    // multiple, then the remaining columns (16-byte aligned operands), both
    // into an output whose rows are padded to the multiple, made dense by one
    // copy (inductor pads such strides too: torch/_inductor/config.py
    // comprehensive_padding). EngineOptions::split_misaligned_gemm off: never
    // (on the H100 at M = 32768: aligned GEMM 3.64 ms + copy 2.41, where
    // PyTorch's one misaligned cuBLAS GEMM took 3.78 and cuBLASLt's far
    // longer: RESULTS.md 2026-12-05).
    const auto per16 = static_cast<std::int64_t>(16 / esize(od));
    const bool tensor_cores = od == DType::kBFloat16 || eng.opt.allow_tf32;
    const std::int64_t gn = g_out.shape.size() == 2 ? g_out.shape[1] : 0;  // 0: batched, never split
    const bool split =
        eng.opt.split_misaligned_gemm && tensor_cores && a.shape.size() == 2 && b.shape.size() == 2 && beta == 0 &&
        gn % per16 != 0 && gn > per16 &&
        static_cast<double>(g_out.shape[0]) * static_cast<double>(gn) * static_cast<double>(a.shape[1]) >=
            kSplitGemmMinMacs;
    if (split && eng.opt.gemm_row_classes && (!bias || (bias->buf < 0 && bias->shape.back() == gn)) &&
        row_classes_apply(a, b, g_out)) {
      gemm_step = plan.steps.size();
      SAFECKPT_CHECK(gemm_by_row_classes(a, b, g_out, bias, act, alpha));
    } else if (split) {
      const std::int64_t M = g_out.shape[0], head = gn / per16 * per16, ld = head + per16;
      DevTensor padded;
      padded.dtype = od;
      padded.shape = {M, gn};
      padded.strides = {ld, 1};
      padded.buf = new_buf(static_cast<std::uint64_t>(M * ld) * esize(od));
      std::optional<DevTensor> bias_head, bias_tail;
      if (bias) bias_head = cols(*bias, 0, head), bias_tail = cols(*bias, head, gn - head);
      SAFECKPT_CHECK(gemm(a, cols(b, 0, head), cols(padded, 0, head), bias_head, act, alpha, beta));
      gemm_step = plan.steps.size() - 1;
      plan.steps[gemm_step].shapes += " (of N=" + std::to_string(gn) + ", ldc " + std::to_string(ld) + ")";
      SAFECKPT_CHECK(gemm(a, cols(b, head, gn - head), cols(padded, head, gn - head), bias_tail, act, alpha, beta, 16));
      plan.steps.back().name += ".tail";
      if (g_out.strides == std::vector<std::int64_t>{gn, 1} && (esize(od) == 2 || esize(od) == 4)) {
        // The fixed row copy (16-byte stores; launch_unpad_rows): the
        // generated elementwise copy moved these rows at about half the
        // memory bandwidth (4.29 ms at 32768 x 50257 bf16 on an H100).
        use(padded);
        def(g_out);
        Plan* pl = &plan;
        const int es = static_cast<int>(esize(od));
        add_step(
            node->name + ".unpad",
            [pl, padded, g_out, M, gn, ld, es](cudaStream_t s) {
              return launch_unpad_rows(UnpadArgs{pl->ptr(padded), pl->ptr(g_out), M, gn, ld, es}, s);
            },
            "copy", shape_text({M, gn}) + " from ld " + std::to_string(ld));
      } else {
        emit_copy(padded, g_out, g_out.shape, node->name + ".unpad", "copy");
      }
    } else {
      std::optional<Residual> res;
      if (act == 0 && beta == 0 && !preset && g_out.contiguous()) res = residual_for(out_id, g_out);
      if (res) {
        SAFECKPT_CHECK(gemm(a, b, g_out, bias, act, alpha, 1.0f, 256, res->c));
        const Node& add = p.nodes[res->add_node];
        for (std::size_t n : res->chain) absorbed[n] = 1;
        absorbed[res->add_node] = 1;
        DevTensor sum = out;
        sum.strides = contiguous_strides(res->shape);
        sum.shape = res->shape;
        vals[static_cast<std::size_t>(add.outputs[0])] = sum;
        plan.steps.back().name += "+" + add.name;
      } else {
        SAFECKPT_CHECK(gemm(a, b, g_out, bias, act, alpha, beta));
      }
      gemm_step = plan.steps.size() - 1;
    }
    set_out(0, out);
    if (act != 0) {
      const Node& c = p.nodes[consumers[static_cast<std::size_t>(out_id)][0]];
      vals[static_cast<std::size_t>(c.outputs[0])] = out;
      plan.steps[gemm_step].name += "+" + c.name;
    }
    return {};
  }

  // ------------------------------------------------------- fixed kernels
  Status lower_layer_norm(bool native) {
    SAFECKPT_TRY(DevTensor x, tensor("input"));
    SAFECKPT_TRY(auto ns, ints("normalized_shape"));
    SAFECKPT_TRY(auto w, opt_tensor("weight"));
    SAFECKPT_TRY(auto b, opt_tensor("bias"));
    SAFECKPT_TRY(double eps, scalar("eps"));
    if (!floating(x.dtype)) return fail(ErrorCode::kUnsupported, "layer_norm of a non-float tensor");
    // The kernels read weight and bias in the input's dtype.
    if ((w && w->dtype != x.dtype) || (b && b->dtype != x.dtype))
      return fail(ErrorCode::kUnsupported, "layer_norm with a weight or bias of another dtype than its input");
    SAFECKPT_TRY(x, contiguous(x));
    if (w) {
      SAFECKPT_TRY(w, contiguous(*w));
    }
    if (b) {
      SAFECKPT_TRY(b, contiguous(*b));
    }
    std::int64_t n = 1;
    for (auto s : ns) n *= s;
    std::int64_t rows = n == 0 ? 0 : static_cast<std::int64_t>(x.numel()) / n;
    DevTensor y = new_tensor(x.dtype, x.shape);
    std::optional<DevTensor> mean, rstd;
    int stats_bf16 = 0;
    if (native) {
      for (std::size_t k = 1; k < 3; ++k) {
        std::int32_t id = node->outputs.size() > k ? node->outputs[k] : -1;
        if (id < 0) continue;
        SAFECKPT_TRY(auto sh, shape_of(id));
        DType d = p.values[static_cast<std::size_t>(id)].dtype;
        stats_bf16 = d == DType::kBFloat16;
        (k == 1 ? mean : rstd) = new_tensor(d, sh);
      }
    }
    use(x);
    if (w) use(*w);
    if (b) use(*b);
    def(y);
    if (mean) def(*mean);
    if (rstd) def(*rstd);
    Plan* pl = &plan;
    int bf = x.dtype == DType::kBFloat16;
    auto fe = static_cast<float>(eps);
    add_step(node->name, [=](cudaStream_t s) {
      return launch_layer_norm(pl->ptr(x), w ? pl->ptr(*w) : nullptr, b ? pl->ptr(*b) : nullptr, pl->ptr(y),
                               mean ? pl->ptr(*mean) : nullptr, rstd ? pl->ptr(*rstd) : nullptr, rows, n, fe, bf,
                               stats_bf16, s);
    });
    set_out(0, y);
    if (mean) set_out(1, *mean);
    if (rstd) set_out(2, *rstd);
    return {};
  }

  Status lower_softmax() {
    SAFECKPT_TRY(DevTensor x, tensor("self"));
    SAFECKPT_TRY(std::int64_t d0, integer("dim"));
    SAFECKPT_TRY(std::int64_t d, norm_dim(d0, x.shape.size()));
    SAFECKPT_TRY(DType od, out_dtype());
    if (!x.shape.empty() && d != static_cast<std::int64_t>(x.shape.size()) - 1)
      return fail(ErrorCode::kUnsupported, "_softmax over another than the last dimension");
    if (!floating(x.dtype) || !floating(od)) return fail(ErrorCode::kUnsupported, "_softmax of a non-float tensor");
    SAFECKPT_TRY(x, contiguous(x));
    std::int64_t n = x.shape.empty() ? 1 : x.shape.back();
    std::int64_t rows = n == 0 ? 0 : static_cast<std::int64_t>(x.numel()) / n;
    DevTensor y = new_tensor(od, x.shape);
    use(x);
    def(y);
    Plan* pl = &plan;
    int ib = x.dtype == DType::kBFloat16, ob = od == DType::kBFloat16;
    add_step(node->name, [=](cudaStream_t s) { return launch_softmax(pl->ptr(x), pl->ptr(y), rows, n, ib, ob, s); });
    set_out(0, y);
    return {};
  }

  Status lower_reduce(bool any) {
    SAFECKPT_TRY(DevTensor x, tensor("self"));
    SAFECKPT_TRY(DType od, out_dtype());
    std::vector<std::int64_t> dims;
    const Arg& da = arg("dim");
    if (da.kind == Arg::Kind::kNone || da.ints.empty()) {
      for (std::size_t i = 0; i < x.shape.size(); ++i) dims.push_back(static_cast<std::int64_t>(i));
    } else {
      SAFECKPT_TRY(dims, ints("dim"));
    }
    std::vector<char> red(x.shape.size(), 0);
    for (auto d0 : dims) {
      SAFECKPT_TRY(std::int64_t d, norm_dim(d0, x.shape.size()));
      if (!x.shape.empty()) red[static_cast<std::size_t>(d)] = 1;
    }
    ReduceArgs ra{};
    ra.n_outer = 1;
    ra.n_inner = 1;
    for (std::size_t d = 0; d < x.shape.size(); ++d) {
      if (red[d]) {
        ra.inner_shape[ra.rank_inner] = x.shape[d];
        ra.inner_strides[ra.rank_inner++] = x.strides[d];
        ra.n_inner *= x.shape[d];
      } else {
        ra.outer_shape[ra.rank_outer] = x.shape[d];
        ra.outer_strides[ra.rank_outer++] = x.strides[d];
        ra.n_outer *= x.shape[d];
      }
    }
    auto code = [](DType d) {
      return d == DType::kFloat32 ? 0 : d == DType::kBFloat16 ? 1 : d == DType::kInt64 ? 2 : 3;
    };
    if (!(x.dtype == DType::kFloat32 || x.dtype == DType::kBFloat16 || x.dtype == DType::kInt64 ||
          x.dtype == DType::kBool))
      return fail(ErrorCode::kUnsupported, "reduction dtype");
    if (!any && !floating(od)) return fail(ErrorCode::kUnsupported, "mean to a non-float dtype");
    ra.op = any ? 0 : 1;
    ra.in_dtype = code(x.dtype);
    ra.out_dtype = code(od);
    SAFECKPT_TRY(auto oshape, shape_of(node->outputs[0]));
    DevTensor y = new_tensor(od, oshape);
    use(x);
    def(y);
    Plan* pl = &plan;
    add_step(node->name, [=](cudaStream_t s) {
      ReduceArgs r = ra;
      r.x = pl->ptr(x);
      r.y = pl->ptr(y);
      return launch_reduce(r, s);
    });
    set_out(0, y);
    return {};
  }

  Status lower_embedding() {
    SAFECKPT_TRY(DevTensor w, tensor("weight"));
    SAFECKPT_TRY(DevTensor idx, tensor("indices"));
    SAFECKPT_TRY(DType od, out_dtype());
    if (w.shape.size() != 2 || !floating(w.dtype) || idx.dtype != DType::kInt64)
      return fail(ErrorCode::kUnsupported, "embedding needs a 2-d float table and int64 indices");
    if (w.strides[1] != 1) {
      SAFECKPT_TRY(w, contiguous(w));
    }
    SAFECKPT_TRY(idx, contiguous(idx));
    SAFECKPT_TRY(auto oshape, shape_of(node->outputs[0]));
    DevTensor y = new_tensor(od, oshape);
    use(w);
    use(idx);
    def(y);
    Plan* pl = &plan;
    std::int64_t rows = w.shape[0], dim = w.shape[1], rs = w.strides[0];
    auto n = static_cast<std::int64_t>(idx.numel());
    int bf = w.dtype == DType::kBFloat16;
    plan.checked_nodes.push_back(node->name + " (table of " + std::to_string(rows) + " rows)");
    add_step(node->name, [=](cudaStream_t s) {
      return launch_embedding(pl->ptr(w), rows, dim, rs, bf, static_cast<const long long*>(pl->ptr(idx)), n, pl->ptr(y),
                              pl->error_flag, s);
    });
    set_out(0, y);
    return {};
  }

  // cat(tensors, dim): one copy kernel per input into its slice of the
  // output (a strided view). Legacy empty 1-d inputs are skipped as ATen
  // and the CPU interpreter do.
  Status lower_cat() {
    SAFECKPT_TRY(DType od, out_dtype());
    SAFECKPT_TRY(auto oshape, shape_of(node->outputs[0]));
    std::vector<DevTensor> ins;
    for (auto id : arg("tensors").tensors) {
      SAFECKPT_TRY(DevTensor t, value(id));
      if (t.shape.size() == 1 && t.shape[0] == 0) continue;
      ins.push_back(std::move(t));
    }
    if (ins.empty() || oshape.empty()) return fail(ErrorCode::kUnsupported, "cat of no non-empty tensors");
    SAFECKPT_TRY(std::int64_t d0, integer("dim"));
    SAFECKPT_TRY(std::int64_t dd, norm_dim(d0, oshape.size()));
    const auto dim = static_cast<std::size_t>(dd);
    std::int64_t total = 0;
    for (const auto& t : ins) {
      if (t.shape.size() != oshape.size() || t.dtype != od)
        return fail(ErrorCode::kMalformed, "cat input disagrees with the output's tensor_meta");
      for (std::size_t d = 0; d < oshape.size(); ++d)
        if (d != dim && t.shape[d] != oshape[d]) return fail(ErrorCode::kMalformed, "cat: sizes differ off dim");
      total += t.shape[dim];
    }
    if (total != oshape[dim]) return fail(ErrorCode::kMalformed, "cat: sizes do not add up to the output's");
    DevTensor y = new_tensor(od, oshape);
    std::int64_t at = 0;
    for (const auto& t : ins) {
      DevTensor part = y;
      part.shape[dim] = t.shape[dim];
      part.offset = y.offset + at * y.strides[dim];
      at += t.shape[dim];
      if (part.numel() == 0) continue;
      emit_copy(t, part, part.shape, "cat(" + node->name + ")", "cat");
    }
    set_out(0, y);
    return {};
  }

  // gather(self, dim, index) and index.Tensor(self, indices) as one
  // indexed-load kernel (IndexGatherArgs), the bounds the CPU interpreter
  // checks enforced on the device (the run's error flag).
  Status lower_index(bool is_gather) {
    SAFECKPT_TRY(DevTensor x, tensor("self"));
    SAFECKPT_TRY(DType od, out_dtype());
    SAFECKPT_TRY(auto oshape, shape_of(node->outputs[0]));
    if (od != x.dtype || !supported_dtype(x.dtype)) return fail(ErrorCode::kUnsupported, "indexing dtype");
    if (oshape.size() > static_cast<std::size_t>(kMaxRank) || x.shape.size() > static_cast<std::size_t>(kMaxRank))
      return fail(ErrorCode::kUnsupported, "rank above 8");
    IndexGatherArgs ga{};
    ga.elem_bytes = static_cast<int>(esize(x.dtype));
    ga.rank = static_cast<int>(oshape.size());
    std::vector<DevTensor> idx;
    if (is_gather) {
      SAFECKPT_TRY(DevTensor ix, tensor("index"));
      SAFECKPT_TRY(std::int64_t d0, integer("dim"));
      SAFECKPT_TRY(std::int64_t dd, norm_dim(d0, x.shape.size()));
      const auto dim = static_cast<std::size_t>(dd);
      if (ix.dtype != DType::kInt64 || ix.shape.size() != x.shape.size() || ix.shape != oshape)
        return fail(ErrorCode::kMalformed, "gather: index must be int64 of the output's shape and self's rank");
      for (std::size_t d = 0; d < x.shape.size(); ++d) {
        if (d != dim && ix.shape[d] > x.shape[d]) return fail(ErrorCode::kMalformed, "gather: index larger than self");
        ga.x_strides[d] = d == dim ? 0 : x.strides[d];
        ga.idx_strides[0][d] = ix.shape[d] == 1 ? 0 : ix.strides[d];
      }
      ga.idx_x_stride[0] = x.strides[dim];
      ga.idx_size[0] = x.shape[dim];
      ga.negative_wraps = 0;
      idx.push_back(ix);
    } else {
      for (auto id : arg("indices").tensors) {
        if (id < 0) return fail(ErrorCode::kUnsupported, "index.Tensor with None indices");
        SAFECKPT_TRY(DevTensor ix, value(id));
        if (ix.dtype != DType::kInt64 && ix.dtype != DType::kInt32)
          return fail(ErrorCode::kUnsupported, "index.Tensor with a non-integer (mask) index");
        idx.push_back(ix);
      }
      if (idx.empty() || idx.size() > x.shape.size() || idx.size() > static_cast<std::size_t>(kMaxIndexTensors))
        return fail(ErrorCode::kUnsupported, "index.Tensor: no indices, or more than self's rank or 8");
      const std::size_t rest = x.shape.size() - idx.size();
      if (oshape.size() < rest) return fail(ErrorCode::kMalformed, "index.Tensor output rank");
      const std::size_t nb = oshape.size() - rest;  // the broadcast index shape's rank
      std::vector<std::int64_t> bshape(oshape.begin(), oshape.begin() + static_cast<std::ptrdiff_t>(nb));
      for (std::size_t j = 0; j < rest; ++j) {
        if (oshape[nb + j] != x.shape[idx.size() + j]) return fail(ErrorCode::kMalformed, "index.Tensor output shape");
        ga.x_strides[nb + j] = x.strides[idx.size() + j];
      }
      for (std::size_t k = 0; k < idx.size(); ++k) {
        if (idx[k].shape.size() > nb) return fail(ErrorCode::kMalformed, "index.Tensor index rank");
        auto bs = bstrides(idx[k], bshape);
        for (std::size_t d = 0; d < nb; ++d) {
          std::size_t off = nb - idx[k].shape.size();
          if (d >= off && idx[k].shape[d - off] != 1 && idx[k].shape[d - off] != bshape[d])
            return fail(ErrorCode::kMalformed, "index.Tensor indices do not broadcast");
          ga.idx_strides[k][d] = bs[d];
        }
        ga.idx_x_stride[k] = x.strides[k];
        ga.idx_size[k] = x.shape[k];
        ga.idx_int32[k] = idx[k].dtype == DType::kInt32;
      }
      ga.negative_wraps = 1;
    }
    ga.n_index = static_cast<int>(idx.size());
    ga.n = 1;
    for (std::size_t d = 0; d < oshape.size(); ++d) {
      ga.shape[d] = oshape[d];
      ga.n *= oshape[d];
    }
    DevTensor y = new_tensor(od, oshape);
    use(x);
    for (const auto& t : idx) use(t);
    def(y);
    Plan* pl = &plan;
    plan.checked_nodes.push_back(node->name);
    add_step(node->name, [=](cudaStream_t s) {
      IndexGatherArgs a = ga;
      a.x = pl->ptr(x);
      a.out = pl->ptr(y);
      for (std::size_t k = 0; k < idx.size(); ++k) a.idx[k] = pl->ptr(idx[k]);
      a.error_flag = pl->error_flag;
      return launch_index_gather(a, s);
    });
    set_out(0, y);
    return {};
  }

  // _assert_tensor_metadata(a, size?, stride?, dtype?, ...): checked here,
  // once per plan, on what the plan knows (dtype, sizes); no launch.
  Status lower_assert_metadata() {
    SAFECKPT_TRY(DevTensor a, tensor("a"));
    if (const Arg& d = arg("dtype"); d.kind == Arg::Kind::kScalarType && d.dtype != a.dtype)
      return fail(ErrorCode::kMalformed, "_assert_tensor_metadata: the tensor is " + std::string(dtype_name(a.dtype)) +
                                             ", expected " + std::string(dtype_name(d.dtype)));
    if (arg("size").kind != Arg::Kind::kNone) {
      SAFECKPT_TRY(auto sz, ints("size"));
      if (sz != a.shape) return fail(ErrorCode::kMalformed, "_assert_tensor_metadata: sizes differ");
    }
    if (const Arg& l = arg("layout"); l.kind == Arg::Kind::kLayout && l.code != 7)
      return fail(ErrorCode::kMalformed, "_assert_tensor_metadata: the layout is strided");
    return {};
  }

  Status lower_sdpa() {
    SAFECKPT_TRY(DevTensor q, tensor("query"));
    SAFECKPT_TRY(DevTensor k, tensor("key"));
    SAFECKPT_TRY(DevTensor v, tensor("value"));
    // The fused spellings of CUDA exports: the mask is attn_bias (flash: none);
    // validate() refused dropout_p != 0 and programs reading their other
    // outputs (logsumexp, seeds), which get no plan here.
    const std::string& op = node->schema->name;
    const bool fused_spelling = op != "aten::scaled_dot_product_attention";
    std::optional<DevTensor> mask;
    std::int32_t mask_value = -1;
    if (op != "aten::_scaled_dot_product_flash_attention") {
      const char* mask_arg = fused_spelling ? "attn_bias" : "attn_mask";
      SAFECKPT_TRY(mask, opt_tensor(mask_arg));
      if (mask) mask_value = arg(mask_arg).tensor;
    }
    if (fused_spelling && arg("dropout_p").f != 0.0) return fail(ErrorCode::kUnsupported, "attention dropout");
    SAFECKPT_TRY(DType od, out_dtype());
    bool causal = arg("is_causal").b;
    const Arg& sc = arg("scale");
    if (arg("enable_gqa").b) return fail(ErrorCode::kUnsupported, "enable_gqa");
    if (q.shape.size() != 4 || k.shape.size() != 4 || v.shape.size() != 4)
      return fail(ErrorCode::kUnsupported, "attention kernel takes rank-4 query/key/value");
    if (q.dtype != k.dtype || q.dtype != v.dtype || !floating(q.dtype) || od != q.dtype)
      return fail(ErrorCode::kUnsupported, "attention dtypes");
    if (k.shape[0] != q.shape[0] || k.shape[1] != q.shape[1] || v.shape[0] != q.shape[0] || v.shape[1] != q.shape[1] ||
        k.shape[2] != v.shape[2] || k.shape[3] != q.shape[3])
      return fail(ErrorCode::kUnsupported, "attention shapes (broadcast batch/heads)");
    if (q.shape[3] > 128 || v.shape[3] > 128) return fail(ErrorCode::kUnsupported, "head dimension above 128");
    for (DevTensor* t : {&q, &k, &v})
      if (t->strides[3] != 1 && t->shape[3] != 1) {
        SAFECKPT_TRY(*t, contiguous(*t));
      }
    AttnArgs aa{};
    aa.B = q.shape[0];
    aa.H = q.shape[1];
    aa.L = q.shape[2];
    aa.S = k.shape[2];
    aa.D = q.shape[3];
    aa.Dv = v.shape[3];
    for (int i = 0; i < 3; ++i) {
      aa.q_s[i] = q.strides[static_cast<std::size_t>(i)];
      aa.k_s[i] = k.strides[static_cast<std::size_t>(i)];
      aa.v_s[i] = v.strides[static_cast<std::size_t>(i)];
    }
    aa.causal = causal ? 1 : 0;
    aa.bf16 = q.dtype == DType::kBFloat16;
    aa.scale = sc.kind == Arg::Kind::kFloat ? static_cast<float>(sc.f) : 1.0f / std::sqrt(static_cast<float>(aa.D));
    if (mask) {
      if (mask->dtype == DType::kBool) {
        aa.mask_kind = 1;
      } else if (mask->dtype == q.dtype) {
        aa.mask_kind = 2;
      } else {
        return fail(ErrorCode::kUnsupported, "attention mask dtype");
      }
      if (mask->shape.size() > 4) return fail(ErrorCode::kUnsupported, "attention mask rank");
      auto ms = bstrides(*mask, {aa.B, aa.H, aa.L, aa.S});
      for (int i = 0; i < 4; ++i) aa.m_s[i] = ms[static_cast<std::size_t>(i)];
    }
    SAFECKPT_TRY(auto oshape, shape_of(node->outputs[0]));
    if (oshape != std::vector<std::int64_t>{aa.B, aa.H, aa.L, aa.Dv})
      return fail(ErrorCode::kInternal, "attention output shape disagrees with tensor_meta");
    // The materialized path's GEMMs need row strides >= the head dim and
    // non-zero batch strides (expanded operands are copied first).
    AttnShape ash{aa.B,
                  aa.H,
                  aa.L,
                  aa.S,
                  aa.D,
                  aa.Dv,
                  aa.bf16 != 0,
                  false,
                  eng.sm >= 80 && eng.opt.attention_tensor_cores,
                  eng.opt.attention_3xtf32};
    AttnChoice choice = choose_attention(ash, eng.opt.attention_workspace_bytes);
    if (choice.materialized) {
      for (DevTensor* t : {&q, &k, &v}) {
        bool ok = (t->shape[2] == 1 || t->strides[2] >= t->shape[3]) && (t->shape[1] == 1 || t->strides[1] > 0) &&
                  (t->shape[0] == 1 || t->strides[0] > 0);
        if (!ok) {
          SAFECKPT_TRY(*t, contiguous(*t));
        }
      }
      auto collapsible = [&](const DevTensor& t) {
        return aa.B == 1 || aa.H == 1 || t.strides[0] == aa.H * t.strides[1];
      };
      bool coll = true;
      for (const DevTensor* t : {&q, &k, &v}) coll = coll && collapsible(*t);
      DevTensor y = new_tensor(od, oshape);
      // Heads split from a [B, S, H*D] projection (view + transpose) step
      // over b and h with two strides. cuBLASLt's pointer-array batches take
      // them as they are, any number of batch elements per GEMM, and write
      // the output with heads inside rows (EngineOptions::
      // attention_pointer_arrays). Without them: one GEMM batch per batch
      // element, and from 4 batch elements on contiguous copies of the
      // operands (3 passes over B*S*H*D elements) instead, which cost less
      // than that many launches (BERT-base at batch 32: 1317 -> ~240
      // launches).
      if (!coll && eng.opt.attention_pointer_arrays) {
        ash.batch_collapsible = true;
        AttnChoice pc = choose_attention(ash, eng.opt.attention_workspace_bytes);
        DevTensor yr = y;
        yr.strides = {aa.L * aa.H * aa.Dv, aa.Dv, aa.H * aa.Dv, 1};
        Status st = lower_sdpa_materialized(aa, pc, q, k, v, mask, yr, true);
        if (st) {
          set_out(0, yr);
          return {};
        }
        if (st.error().code() != ErrorCode::kDevice) return st;
        // cuBLASLt without pointer-array batches (or no algorithm for them):
        // nothing was added to the plan; the strided GEMMs below.
      }
      if (aa.B >= 4 && !coll) {
        for (DevTensor* t : {&q, &k, &v})
          if (!collapsible(*t)) {
            SAFECKPT_TRY(*t, contiguous(*t));
          }
        coll = true;
      }
      ash.batch_collapsible = coll;
      choice = choose_attention(ash, eng.opt.attention_workspace_bytes);
      SAFECKPT_CHECK(lower_sdpa_materialized(aa, choice, q, k, v, mask, y, false));
      set_out(0, y);
      return {};
    }
    const bool tc = choice.tensor_core_flash;
    // The flash kernels write [B, H, L, Dv] with heads inside rows ([B, L,
    // H, Dv] in memory): the usual transpose(1, 2) + view back to [B, L,
    // H * Dv] is then a view, not a copy.
    DevTensor y = new_tensor(od, oshape);
    y.strides = {aa.L * aa.H * aa.Dv, aa.Dv, aa.H * aa.Dv, 1};
    for (int i = 0; i < 3; ++i) aa.o_s[i] = y.strides[static_cast<std::size_t>(i)];
    // cuDNN's fused attention instead of the tensor-core kernel
    // (EngineOptions::cudnn_attention): its plan is made with the
    // convolution graphs' (prepare_graph_plans); a step without one, or
    // whose first cuDNN call fails, runs the kernel (the same values).
    std::shared_ptr<GraphSlot> sdpa_slot;
    const bool cudnn_sdpa = tc && eng.opt.cudnn_attention && sdpa_candidate(aa, q, k, v, y);
    if (cudnn_sdpa && eng.lt != nullptr && !dnn) {  // a device plan: cuDNN missing is no error here
      auto h = dnn_create();
      if (h)
        dnn = *h;
      else
        eng.warn("cuDNN fused attention off: " + h.error().message(), nullptr);
    }
    // A mask goes to cuDNN as its bias (EngineOptions::cudnn_attention_masks):
    // made once per mask value (and causal flag) by attention_bias, read by
    // every attention on that mask; attention_fixup zeroes the rows that
    // keep no key after each.
    std::optional<AttnBias> bias;
    if (cudnn_sdpa && mask) bias = attention_bias(aa, *mask, mask_value);
    if (cudnn_sdpa && eng.lt != nullptr && dnn) {
      const SdpaGeometry sg = sdpa_geometry(aa, q, k, v, y);
      const std::string key = sdpa_choice_key(sg, kMaxConvWorkspaceBytes);
      auto& slot = graph_plans[key];
      if (!slot) {
        slot = std::make_shared<GraphSlot>();
        slot->sdpa = sg;
        slot->key = key;
      }
      sdpa_slot = slot;
      plan.warmup_before_capture = true;
    }
    use(q);
    use(k);
    use(v);
    if (mask) use(*mask);
    if (bias) use(bias->bias);
    def(y);
    Plan* pl = &plan;
    auto mode = std::make_shared<std::atomic<int>>(0);             // cuDNN: 0 untried, 1 works, 2 refused
    if (sdpa_slot) sdpa_slot->steps.push_back(plan.steps.size());  // named after its engine
    add_step(
        node->name,
        [=](cudaStream_t s) {
          AttnArgs a = aa;
          a.q = pl->ptr(q);
          a.k = pl->ptr(k);
          a.v = pl->ptr(v);
          a.out = pl->ptr(y);
          a.mask = mask ? pl->ptr(*mask) : nullptr;
          if (sdpa_slot && sdpa_slot->plan && mode->load() != 2) {
            const void* bp = bias ? pl->ptr(bias->bias) : nullptr;
            int r = graph_sdpa_forward(*sdpa_slot->plan, a.q, a.k, a.v, bp, a.out, aa.scale, pl->workspace, s);
            if (r == 0 || mode->load() == 1) {
              if (r == 0) mode->store(1);
              return r;
            }
            mode->store(2);
            pl->dnn_refusals.fetch_add(1);
            (void)cudaGetLastError();  // cuDNN's, if any: not the kernel's launch error
          }
          if (!tc) return launch_attention(a, s);
          return a.bf16 ? launch_attention_tc(a, s) : launch_attention_tf32x3(a, s);
        },
        "attention",
        attn_shapes(aa, cudnn_sdpa       ? "cuDNN fused attention, else flash, tensor cores"
                        : tc && !aa.bf16 ? "flash, tensor cores (3xTF32)"
                        : tc             ? "flash, tensor cores"
                                         : "flash"));
    if (bias) {
      // The rows cuDNN gave NaN (the kernel zeroed them already).
      use(bias->dead);
      use(y);
      AttnZeroRowsArgs za{};
      za.B = aa.B, za.H = aa.H, za.L = aa.L, za.Dv = aa.Dv;
      for (int i = 0; i < 3; ++i) za.o_s[i] = aa.o_s[i];
      za.Bb = bias->bb, za.Hb = bias->hb;
      add_step(
          node->name + ".fixup",
          [=](cudaStream_t s) {
            if (!sdpa_slot || !sdpa_slot->plan || mode->load() == 2) return 0;
            AttnZeroRowsArgs a = za;
            a.out = pl->ptr(y);
            a.dead = static_cast<const unsigned char*>(pl->ptr(bias->dead));
            return launch_attention_zero_rows(a, s);
          },
          "attention_fixup", shape_text({aa.B, aa.H, aa.L, aa.Dv}) + " rows without a key");
    }
    set_out(0, y);
    return {};
  }

  // The batch and head extents of `aa`'s mask: 1 where it is broadcast.
  static long long mask_batch(const AttnArgs& aa) { return aa.B == 1 || aa.m_s[0] == 0 ? 1 : aa.B; }
  static long long mask_heads(const AttnArgs& aa) { return aa.H == 1 || aa.m_s[1] == 0 ? 1 : aa.H; }
  // The bias of `mask` (value `mask_value`) for `aa`'s shape and causal
  // flag: the one an earlier attention on the same value made, else a new
  // attention_bias step.
  AttnBias attention_bias(const AttnArgs& aa, const DevTensor& mask, std::int32_t mask_value) {
    AttnBias r;
    r.bb = mask_batch(aa);
    r.hb = mask_heads(aa);
    const auto key = std::make_tuple(mask_value, aa.causal, r.bb, r.hb, aa.L, aa.S);
    if (mask_value >= 0)
      if (auto it = bias_of_mask.find(key); it != bias_of_mask.end()) return it->second;
    r.bias = new_tensor(DType::kBFloat16, {r.bb, r.hb, aa.L, sdpa_bias_ld(aa.S)});  // SdpaGeometry's rows
    r.dead = new_tensor(DType::kBool, {r.bb, r.hb, aa.L});
    AttnBiasArgs ba{};
    ba.mask_kind = aa.mask_kind;
    ba.Bb = r.bb, ba.Hb = r.hb, ba.L = aa.L, ba.S = aa.S, ba.ld = sdpa_bias_ld(aa.S);
    for (int i = 0; i < 4; ++i) ba.m_s[i] = aa.m_s[i];
    ba.causal = aa.causal;
    use(mask);
    def(r.bias);
    def(r.dead);
    Plan* pl = &plan;
    add_step(
        node->name + ".bias",
        [=](cudaStream_t s) {
          AttnBiasArgs a = ba;
          a.mask = pl->ptr(mask);
          a.bias = pl->ptr(r.bias);
          a.dead = static_cast<unsigned char*>(pl->ptr(r.dead));
          return launch_attention_bias(a, s);
        },
        "attention_bias",
        shape_text({r.bb, r.hb, aa.L, aa.S}) + (aa.mask_kind == 1 ? " from a bool mask" : " from an additive mask") +
            (aa.causal ? ", causal" : ""));
    if (mask_value >= 0) bias_of_mask.emplace(key, r);
    return r;
  }

  // cuDNN's fused attention geometry of a flash-path attention (conv.hpp
  // SdpaGeometry): q/k/v as read, y the output with heads inside rows.
  static SdpaGeometry sdpa_geometry(const AttnArgs& aa, const DevTensor& q, const DevTensor& k, const DevTensor& v,
                                    const DevTensor& y) {
    SdpaGeometry g;
    g.b = aa.B, g.h = aa.H, g.l = aa.L, g.s = aa.S, g.d = aa.D, g.dv = aa.Dv;
    g.bf16 = aa.bf16 != 0;
    g.causal = aa.causal != 0;
    if (aa.mask_kind != 0) {  // attention_bias's [bb, hb, L, S]
      g.bias = true;
      g.bias_b = mask_batch(aa);
      g.bias_h = mask_heads(aa);
    }
    auto strides = [](const DevTensor& t, std::int64_t(&out)[4]) {
      for (std::size_t i = 0; i < 4; ++i)
        if (t.shape[i] != 1) out[i] = t.strides[i];
    };
    // A dimension of size 1 takes the dense stride (its stride is never
    // used; cuDNN checks alignment on all of them).
    const std::int64_t qd[4] = {aa.H * aa.L * aa.D, aa.L * aa.D, aa.D, 1},
                       kd[4] = {aa.H * aa.S * aa.D, aa.S * aa.D, aa.D, 1},
                       vd[4] = {aa.H * aa.S * aa.Dv, aa.S * aa.Dv, aa.Dv, 1};
    std::copy(qd, qd + 4, g.q_s);
    std::copy(kd, kd + 4, g.k_s);
    std::copy(vd, vd + 4, g.v_s);
    strides(q, g.q_s);
    strides(k, g.k_s);
    strides(v, g.v_s);
    for (std::size_t i = 0; i < 4; ++i) g.o_s[i] = y.strides[i];
    return g;
  }
  // Whether cuDNN's fused attention can run this step: no mask but the
  // causal one (any with EngineOptions::cudnn_attention_masks),
  // sdpa_graph_applies, q/k/v/y of rank 4 with no zero (broadcast) strides
  // and 16-byte aligned base addresses.
  bool sdpa_candidate(const AttnArgs& aa, const DevTensor& q, const DevTensor& k, const DevTensor& v,
                      const DevTensor& y) const {
    if (aa.mask_kind != 0 && !eng.opt.cudnn_attention_masks) return false;
    for (const DevTensor* t : {&q, &k, &v, &y}) {
      if (t->shape.size() != 4 || base_bytes(*t) % 16 != 0) return false;
      for (std::size_t i = 0; i < 4; ++i)
        if (t->shape[i] != 1 && t->strides[i] <= 0) return false;
    }
    return sdpa_graph_applies(sdpa_geometry(aa, q, k, v, y));
  }

  static std::string attn_shapes(const AttnArgs& aa, const char* path) {
    return shape_text({aa.B, aa.H, aa.L, aa.D}) + " S=" + std::to_string(aa.S) + " Dv=" + std::to_string(aa.Dv) +
           (aa.causal ? " causal" : "") +
           (aa.mask_kind == 1   ? " bool-mask"
            : aa.mask_kind == 2 ? " add-mask"
                                : "") +
           (aa.bf16 ? " bf16 " : " fp32 ") + path;
  }

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
  static std::vector<std::pair<long long, long long>> causal_blocks(long long L, bool causal) {
    std::vector<std::pair<long long, long long>> blocks;
    if (!causal || L < kCausalSplitMinRows) {
      blocks.emplace_back(0, L);
      return blocks;
    }
    const long long nb = std::min(kCausalMaxBlocks, (L + kCausalBlockRows - 1) / kCausalBlockRows);
    const long long rows = ((L + nb - 1) / nb + 63) / 64 * 64;
    for (long long r0 = 0; r0 < L; r0 += rows) blocks.emplace_back(r0, std::min(L, r0 + rows));
    return blocks;
  }

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
                                 bool ptr_batch) {
    const bool bf = aa.bf16 != 0;
    const long long gb = c.group_batches, H = aa.H, L = aa.L, S = aa.S, D = aa.D, Dv = aa.Dv;
    const auto batch = static_cast<std::int32_t>(gb * H);
    const cudaDataType_t ty = bf ? CUDA_R_16BF : CUDA_R_32F;
    const cublasComputeType_t ct = (!bf && eng.opt.allow_tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const std::uint32_t es = esize(q.dtype);
    const std::uint32_t pes = bf ? 2 : 4;  // the probabilities' element size
    // Batch stride over (b, h) pairs of a group: h's, or b's when H == 1
    // (a group of several b with H > 1 is only formed when b's == H * h's).
    auto bstride = [&](const DevTensor& t) { return H == 1 ? t.strides[0] : t.strides[1]; };
    auto ld_of = [](const DevTensor& t) {
      return t.shape[2] == 1 ? std::max<std::int64_t>(t.shape[3], 1) : t.strides[2];
    };
    auto bytes = [](long long x, std::uint32_t e) { return static_cast<std::uint64_t>(x) * e; };
    // `t` as cuBLASLt sees it, its first column `col0` rows (query / key
    // positions) in.
    auto mat = [&](const DevTensor& t, std::uint64_t rows, std::uint64_t cols, long long col0) {
      LtMat m;
      m.type = ty;
      m.rows = rows;
      m.cols = cols;
      m.ld = ld_of(t);
      m.pointer_array = ptr_batch;
      // Every matrix's start (groups, batch entries, row blocks) and row: what the heuristic may assume.
      if (ptr_batch) {
        m.align = alignment(base_bytes(t) | bytes(col0 * m.ld, es) | bytes(t.strides[0], es) | bytes(t.strides[1], es) |
                                bytes(m.ld, es),
                            0);
      } else {
        m.batch_stride = bstride(t);
        m.align = alignment(base_bytes(t) | bytes(col0 * m.ld, es) | bytes(m.batch_stride, es) | bytes(m.ld, es),
                            bytes(gb * t.strides[0], es));
      }
      return m;
    };
    auto u = [](long long x) { return static_cast<std::uint64_t>(x); };
    // The output: row-major [Dv, rows] per (b, h) matrix, column-major
    // [Dv, rows] with ld = its row stride.
    const long long y_ld = y.strides[2];
    struct Block {
      long long r0 = 0, r1 = 0, kn = 0;  // query rows [r0, r1), keys [0, kn)
      std::shared_ptr<GemmDesc> qk, pv;
    };
    std::vector<Block> blocks;
    for (const auto& [r0, r1] : causal_blocks(L, aa.causal != 0)) {
      Block bl;
      bl.r0 = r0;
      bl.r1 = r1;
      bl.kn = aa.causal != 0 ? std::min(S, r1) : S;
      const long long rows = r1 - r0;
      // S^T[kn, rows] = K[kn, D] (stored [D, S], transposed) x Q^T[D, rows],
      // into the scores' columns r0.. (ld S).
      LtMat sc;
      sc.type = CUDA_R_32F;
      sc.rows = u(bl.kn);
      sc.cols = u(rows);
      sc.ld = S;
      sc.batch_stride = L * S;
      sc.pointer_array = ptr_batch;
      sc.align = alignment(bytes(L * S, 4) | bytes(S, 4) | bytes(r0 * S, 4), 0);
      SAFECKPT_TRY(bl.qk, make_batched_gemm(eng, ct, CUBLAS_OP_T, CUBLAS_OP_N, mat(k, u(D), u(bl.kn), 0),
                                            mat(q, u(D), u(rows), r0), sc, batch));
      // O^T[Dv, rows] = V^T[Dv, kn] x P^T[kn, rows].
      LtMat pm = sc;
      pm.type = bf ? CUDA_R_16BF : CUDA_R_32F;
      pm.align = alignment(bytes(L * S, pes) | bytes(S, pes) | bytes(r0 * S, pes), 0);
      LtMat om;
      om.type = ty;
      om.rows = u(Dv);
      om.cols = u(rows);
      om.ld = y_ld;
      om.batch_stride = L * Dv;
      om.pointer_array = ptr_batch;
      om.align = alignment(
          base_bytes(y) | bytes(y.strides[0], es) | bytes(y.strides[1], es) | bytes(y_ld, es) | bytes(r0 * y_ld, es),
          bytes(gb * y.strides[0], es));
      SAFECKPT_TRY(bl.pv,
                   make_batched_gemm(eng, ct, CUBLAS_OP_N, CUBLAS_OP_N, mat(v, u(Dv), u(bl.kn), 0), pm, om, batch));
      blocks.push_back(std::move(bl));
    }
    // Every GEMM has an algorithm: from here on the plan grows.
    DevTensor scores = new_tensor(DType::kFloat32, {gb * H, L, S});
    std::optional<DevTensor> probs;
    if (bf) probs = new_tensor(DType::kBFloat16, {gb * H, L, S});
    // Pointer arrays of one group: K, V, then per block Q, scores,
    // probabilities, output; each starting on a 128-byte boundary.
    const int n_arrays = 2 + 4 * static_cast<int>(blocks.size());
    const long long array_stride = (gb * H + 15) / 16 * 16;
    std::optional<DevTensor> ptrs;
    if (ptr_batch) {
      if (n_arrays > kMaxPtrArrays) return fail(ErrorCode::kInternal, "attention: too many pointer arrays");
      ptrs = new_tensor(DType::kInt64, {n_arrays * array_stride});
    }
    AttnSoftmaxArgs sa{};
    sa.probs_bf16 = bf ? 1 : 0;
    sa.rows = gb * H * L;
    sa.H = H;
    sa.L = L;
    sa.S = S;
    sa.mask_kind = aa.mask_kind;
    sa.mask_bf16 = bf ? 1 : 0;
    for (int i = 0; i < 4; ++i) sa.m_s[i] = aa.m_s[i];
    sa.causal = aa.causal;
    sa.block_rows = blocks.size() > 1 ? blocks[0].r1 - blocks[0].r0 : 0;
    const float alpha = aa.scale;
    const std::string what = attn_shapes(aa, ptr_batch ? "materialized, pointer arrays" : "materialized");
    const std::string group_text = " group of " + std::to_string(gb) + " x " + std::to_string(H) + " heads";
    auto block_text = [&](const Block& bl) {
      if (blocks.size() == 1) return std::string();
      return " rows " + std::to_string(bl.r0) + ".." + std::to_string(bl.r1) + " keys 0.." + std::to_string(bl.kn);
    };
    auto block_name = [&](const Block& bl) {
      if (blocks.size() == 1) return std::string();
      return "[" + std::to_string(bl.r0) + ":" + std::to_string(bl.r1) + "]";
    };
    def(scores);
    if (probs) def(*probs);
    if (ptrs) def(*ptrs);  // written once: every group's steps read it
    def(y);
    Plan* pl = &plan;
    cublasLtHandle_t lt = eng.lt;
    const DevTensor& p_t = probs ? *probs : scores;
    // Operand addresses of batch entry 0 of group b0 (block bl where it
    // applies), in bytes from the tensors' first elements.
    auto q_off = [&](long long b0, const Block& bl) { return bytes(b0 * q.strides[0] + bl.r0 * ld_of(q), es); };
    auto s_off = [&](const Block& bl, std::uint32_t e) { return bytes(bl.r0 * S, e); };
    auto y_off = [&](long long b0, const Block& bl) { return bytes(b0 * y.strides[0] + bl.r0 * y_ld, es); };
    const auto stride_entries = static_cast<std::uint64_t>(array_stride);
    for (long long gi = 0; gi < c.groups; ++gi) {
      const long long b0 = gi * gb;
      const std::string gname = node->name + (c.groups > 1 ? "[" + std::to_string(b0) + "]" : "");
      if (ptr_batch) {
        // Array j: entry i = head i % H of batch element b0 + i / H.
        struct Src {
          DevTensor t;
          std::uint64_t off;
          long long step_b, step_h;  // bytes
        };
        // q/k/v/y step with their b and h strides, scores and probabilities as [gb, H, L, S].
        auto heads = [&](const DevTensor& t, std::uint64_t off) {
          return Src{t, off, t.strides[0] * es, t.strides[1] * es};
        };
        std::vector<Src> srcs = {heads(k, bytes(b0 * k.strides[0], es)), heads(v, bytes(b0 * v.strides[0], es))};
        for (const Block& bl : blocks) {
          srcs.push_back(heads(q, q_off(b0, bl)));
          srcs.push_back({scores, s_off(bl, 4), H * L * S * 4, L * S * 4});
          srcs.push_back({p_t, s_off(bl, pes), H * L * S * pes, L * S * pes});
          srcs.push_back(heads(y, y_off(b0, bl)));
        }
        // Only addresses are computed here: nothing is read (the GEMMs below mark their operands).
        add_step(
            gname + ".pointers",
            [pl, srcs, out = *ptrs, H, n = gb * H, array_stride](cudaStream_t s) {
              PtrArraysArgs a{};
              a.arrays = static_cast<int>(srcs.size());
              a.n = n;
              a.per_b = H;
              a.array_stride = array_stride;
              for (std::size_t j = 0; j < srcs.size(); ++j) {
                a.base[j] = static_cast<const char*>(pl->ptr(srcs[j].t)) + srcs[j].off;
                a.step_b[j] = srcs[j].step_b;
                a.step_h[j] = srcs[j].step_h;
              }
              a.out = static_cast<void**>(pl->ptr(out));
              return launch_ptr_arrays(a, s);
            },
            "attention_pointers", std::to_string(n_arrays) + " pointer arrays of " + std::to_string(gb * H));
      }
      // The address cublasLtMatmul takes for an operand: the matrix (strided
      // batches) or array `j`'s first entry (pointer arrays).
      auto arg = [pl, ptr_batch, ptrs, stride_entries](const DevTensor& t, std::uint64_t off, int j) -> const void* {
        if (ptr_batch)
          return static_cast<const char*>(pl->ptr(*ptrs)) + static_cast<std::uint64_t>(j) * stride_entries * 8;
        return static_cast<const char*>(pl->ptr(t)) + off;
      };
      for (std::size_t bi = 0; bi < blocks.size(); ++bi) {
        const Block& bl = blocks[bi];
        use(q);
        use(k);
        use(scores);
        if (ptrs) use(*ptrs);
        const int jq = 2 + 4 * static_cast<int>(bi);
        add_step(
            gname + ".qk" + block_name(bl),
            [arg, qk = bl.qk, q, k, scores, alpha, qo = q_off(b0, bl), ko = bytes(b0 * k.strides[0], es),
             so = s_off(bl, 4), jq, lt, pl](cudaStream_t s) {
              const float beta = 0;
              const void* qp = arg(q, qo, jq);
              const void* kp = arg(k, ko, 0);
              void* d = const_cast<void*>(arg(scores, so, jq + 1));
              cublasStatus_t st = cublasLtMatmul(lt, qk->op, &alpha, kp, qk->la, qp, qk->lb, &beta, d, qk->lc, d,
                                                 qk->lc, &qk->algo, pl->workspace, kWorkspaceBytes, s);
              return st == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + static_cast<int>(st);
            },
            "attention_gemm", "scores = Q K^T" + group_text + block_text(bl) + ": " + what);
      }
      use(scores);
      if (probs) use(*probs);
      if (mask) use(*mask);
      add_step(
          gname + ".softmax",
          [pl, sa, scores, probs, mask, b0](cudaStream_t s) {
            AttnSoftmaxArgs a = sa;
            a.scores = static_cast<float*>(pl->ptr(scores));
            a.probs = probs ? pl->ptr(*probs) : pl->ptr(scores);
            a.mask = mask ? pl->ptr(*mask) : nullptr;
            a.b0 = b0;
            return launch_attention_softmax(a, s);
          },
          "attention_softmax", "softmax" + group_text + ": " + what);
      for (std::size_t bi = 0; bi < blocks.size(); ++bi) {
        const Block& bl = blocks[bi];
        use(p_t);
        use(v);
        use(y);
        if (ptrs) use(*ptrs);
        const int jq = 2 + 4 * static_cast<int>(bi);
        add_step(
            gname + ".pv" + block_name(bl),
            [arg, pv = bl.pv, p_t, v, y, vo = bytes(b0 * v.strides[0], es), po = s_off(bl, pes), yo = y_off(b0, bl), jq,
             lt, pl](cudaStream_t s) {
              const float one = 1, beta = 0;
              const void* vp = arg(v, vo, 1);
              const void* pp = arg(p_t, po, jq + 2);
              void* d = const_cast<void*>(arg(y, yo, jq + 3));
              cublasStatus_t st = cublasLtMatmul(lt, pv->op, &one, vp, pv->la, pp, pv->lb, &beta, d, pv->lc, d, pv->lc,
                                                 &pv->algo, pl->workspace, kWorkspaceBytes, s);
              return st == CUBLAS_STATUS_SUCCESS ? 0 : 1000 + static_cast<int>(st);
            },
            "attention_gemm", "out = P V" + group_text + block_text(bl) + ": " + what);
      }
    }
    return {};
  }

  Status lower_sym() {
    const std::string& op = node->schema->name;
    std::int64_t v = 0;
    if (op == "aten::sym_size.int") {
      SAFECKPT_TRY(DevTensor x, tensor("self"));
      SAFECKPT_TRY(std::int64_t d0, integer("dim"));
      SAFECKPT_TRY(std::int64_t d, norm_dim(d0, x.shape.size()));
      v = x.shape[static_cast<std::size_t>(d)];
    } else if (op == "_operator.mul") {
      SAFECKPT_TRY(std::int64_t a, integer("a"));
      SAFECKPT_TRY(std::int64_t b, integer("b"));
      v = a * b;
    } else {
      return fail(ErrorCode::kUnsupported, "symbolic op without a kernel");
    }
    syms[static_cast<std::size_t>(node->sym_output)] = v;
    return {};
  }

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
               const std::function<std::int32_t(const std::vector<std::int32_t>&, const Emit&)>& build) {
    if (shape.size() > static_cast<std::size_t>(kMaxRank)) return fail(ErrorCode::kUnsupported, "rank above 8");
    std::int32_t out_id = node->outputs[0];
    std::size_t new_inputs = 0;
    for (const auto& o : operands)
      if (o.value < 0 || (g.reg_of_value.count(o.value) == 0 && g.in_of_value.count(o.value) == 0)) ++new_inputs;
    if (g.open && (g.shape != shape || !fuse || g.ins.size() + new_inputs + g.produced.size() + 1 > kMaxFusedTensors)) {
      SAFECKPT_CHECK(flush());
    }
    if (!g.open) {
      g.open = true;
      g.shape = shape;
    }
    auto load = [&](const DevTensor& t) {
      auto idx = static_cast<std::int32_t>(g.ins.size());
      g.ins.push_back(t);
      g.k.in_dtypes.push_back(t.dtype);
      MicroOp ld;
      ld.kind = MicroKind::kLoad;
      ld.dtype = t.dtype;
      ld.a = idx;
      g.k.ops.push_back(ld);
      return idx;
    };
    std::vector<std::int32_t> regs;
    for (const auto& o : operands) {
      if (o.value < 0) {
        load(o.t);
        regs.push_back(static_cast<std::int32_t>(g.k.ops.size() - 1));
        continue;
      }
      auto r = g.reg_of_value.find(o.value);
      if (r != g.reg_of_value.end()) {
        regs.push_back(r->second);
        continue;
      }
      const auto& v = vals[static_cast<std::size_t>(o.value)];
      if (!v) return fail(ErrorCode::kInternal, "input value has no plan");
      auto in = g.in_of_value.find(o.value);
      if (in == g.in_of_value.end()) {
        g.in_of_value[o.value] = load(*v);
      } else {
        MicroOp ld;
        ld.kind = MicroKind::kLoad;
        ld.dtype = v->dtype;
        ld.a = in->second;
        g.k.ops.push_back(ld);
      }
      regs.push_back(static_cast<std::int32_t>(g.k.ops.size() - 1));
    }
    Emit emit = [this](MicroOp op) {
      g.k.ops.push_back(op);
      return static_cast<std::int32_t>(g.k.ops.size() - 1);
    };
    g.reg_of_value[out_id] = build(regs, emit);
    g.produced.push_back(out_id);
    g.nodes.insert(node_index);
    g.names += (g.names.empty() ? "" : "+") + node->name;
    if (!fuse) SAFECKPT_CHECK(flush());
    return {};
  }

  static MicroOp micro(MicroKind k, DType d, std::int32_t a, std::int32_t b = -1, double s0 = 0) {
    MicroOp o;
    o.kind = k;
    o.dtype = d;
    o.a = a;
    o.b = b;
    o.s0 = s0;
    return o;
  }

  // A per-channel vector [C] as [C, 1, ...] against an N, C, ... tensor of
  // rank `rank` (broadcast strides 0 over the other dimensions).
  Result<DevTensor> per_channel(const DevTensor& t, std::size_t rank, std::int64_t channels) {
    if (t.shape.size() != 1 || t.shape[0] != channels)
      return fail(ErrorCode::kMalformed, "per-channel tensor must have " + std::to_string(channels) + " elements");
    DevTensor v = t;
    v.shape.assign(rank - 1, 1);
    v.strides.assign(rank - 1, 1);
    v.shape[0] = channels;
    v.strides[0] = t.strides[0];
    return v;
  }

  // A kPrepared buffer (written by prep steps, read by every run).
  DevTensor prepared_tensor(DType d, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides) {
    DevTensor c;
    c.dtype = d;
    c.shape = std::move(shape);
    c.strides = std::move(strides);
    Buf b;
    b.kind = BufKind::kPrepared;
    b.bytes = std::max<std::uint64_t>(c.numel() * esize(c.dtype), 1);
    b.offset = plan.prepared_bytes;
    plan.prepared_bytes += (b.bytes + 255) / 256 * 256;
    plan.bufs.push_back(b);
    first_step.push_back(0);
    last_step.push_back(0);
    def_seen.push_back(0);
    c.buf = static_cast<std::int32_t>(plan.bufs.size() - 1);
    return c;
  }

  // Convolution filter `w` (value `id`) in K,R,S,C/groups order: itself when
  // its memory already is; a checkpoint weight's copy in a kPrepared buffer,
  // written once by a prep step (one per weight value, shared by the
  // convolutions that read it); a computed filter's copy in the arena, made
  // by every run.
  Result<DevTensor> channels_last_weight(const DevTensor& w, std::int32_t id) {
    if (w.nhwc_memory()) return w;
    if (w.buf >= 0) {
      DevTensor c = new_tensor(w.dtype, w.shape, true);
      emit_copy(w, c, w.shape, "channels-last(" + node->name + ")", "copy");
      return c;
    }
    auto found = prepared_of.find(id);
    if (found != prepared_of.end()) return found->second;
    DevTensor c = prepared_tensor(w.dtype, w.shape, channels_last_strides(w.shape));
    prep = true;
    emit_copy(w, c, w.shape, "channels-last weight (" + node->name + ")", "prepare");
    prep = false;
    prepared_of.emplace(id, c);
    return c;
  }

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
  std::optional<std::int32_t> fold_operand(const Node& n, std::string_view name, std::int64_t k, bool required) const {
    const Arg* a = arg_of(n, name);
    if (a == nullptr || a->kind != Arg::Kind::kTensor || a->tensor < 0) {
      if (required) return std::nullopt;
      return -1;
    }
    const auto id = static_cast<std::size_t>(a->tensor);
    if (weights.size() <= id || !weights[id]) return std::nullopt;
    const DevTensor& t = *weights[id];
    if (!floating(t.dtype) || t.shape.size() != 1 || t.shape[0] != k) return std::nullopt;
    return a->tensor;
  }
  std::optional<ConvFold> conv_fold_for(std::int32_t y, const std::vector<std::int64_t>& yshape, bool nhwc,
                                        DType dt) const {
    if (!fuse || !eng.opt.fold_batch_norm) return std::nullopt;
    ConvFold f;
    auto bn = only_use(y);
    if (!bn) return std::nullopt;
    const Node& b = p.nodes[*bn];
    const std::string& bop = b.schema->name;
    if (bop != "aten::batch_norm" && bop != "aten::_native_batch_norm_legit_no_training") return std::nullopt;
    const Arg* in = arg_of(b, "input");
    const Arg* eps = arg_of(b, "eps");
    if (in == nullptr || in->tensor != y || eps == nullptr || eps->kind != Arg::Kind::kFloat || b.outputs.empty())
      return std::nullopt;
    // _native_batch_norm_legit_no_training's save_mean / save_invstd unread.
    for (std::size_t k = 1; k < b.outputs.size(); ++k) {
      const std::int32_t o = b.outputs[k];
      if (o >= 0 && (!consumers[static_cast<std::size_t>(o)].empty() || is_output[static_cast<std::size_t>(o)] != 0))
        return std::nullopt;
    }
    const std::int64_t k = yshape[1];
    auto gw = fold_operand(b, "weight", k, false), be = fold_operand(b, "bias", k, false);
    auto m = fold_operand(b, "running_mean", k, true), v = fold_operand(b, "running_var", k, true);
    if (!gw || !be || !m || !v) return std::nullopt;
    f.bn = *bn;
    f.gamma = *gw;
    f.beta = *be;
    f.mean = *m;
    f.var = *v;
    f.eps = static_cast<float>(eps->f);
    auto next = only_use(b.outputs[0]);
    if (!next) return std::nullopt;
    const Node* n = &p.nodes[*next];
    if (n->schema->name == "aten::add.Tensor" ||
        n->schema->name == "aten::add_.Tensor") {  // add_: out of place is exact (validate.cpp)
      const Arg* self = arg_of(*n, "self");
      const Arg* other = arg_of(*n, "other");
      const Arg* alpha = arg_of(*n, "alpha");
      if (self == nullptr || other == nullptr || self->kind != Arg::Kind::kTensor || other->kind != Arg::Kind::kTensor)
        return std::nullopt;
      const bool alpha_one = alpha == nullptr || alpha->kind == Arg::Kind::kNone ||
                             (alpha->kind == Arg::Kind::kFloat && alpha->f == 1.0) ||
                             (alpha->kind == Arg::Kind::kInt && alpha->ints.size() == 1 &&
                              !alpha->ints[0].is_symbolic() && alpha->ints[0].value == 1);
      const std::int32_t z = self->tensor == b.outputs[0] ? other->tensor : self->tensor;
      if (!alpha_one || z < 0 || z == b.outputs[0] || n->outputs.empty() || !vals[static_cast<std::size_t>(z)])
        return std::nullopt;
      const DevTensor& zt = *vals[static_cast<std::size_t>(z)];
      if (zt.dtype != dt || zt.shape != yshape || !(nhwc ? zt.nhwc_memory() : zt.contiguous()) ||
          p.values[static_cast<std::size_t>(n->outputs[0])].dtype != dt)
        return std::nullopt;
      f.add = *next;
      f.z = z;
      next = only_use(n->outputs[0]);
      if (!next) return std::nullopt;
      n = &p.nodes[*next];
    }
    const std::string& rop = n->schema->name;
    if ((rop != "aten::relu" && rop != "aten::relu_") || n->outputs.empty() || n->outputs[0] < 0) return std::nullopt;
    f.relu = *next;
    f.out = n->outputs[0];
    return f;
  }

  Status lower_conv() {
    SAFECKPT_TRY(DevTensor x, tensor("input"));
    SAFECKPT_TRY(DevTensor w, tensor("weight"));
    SAFECKPT_TRY(auto bias, opt_tensor("bias"));
    SAFECKPT_TRY(DType od, out_dtype());
    if (node->schema->name == "aten::convolution" && arg("transposed").b)
      return fail(ErrorCode::kUnsupported, "transposed convolution has no GPU kernel");
    SAFECKPT_TRY(auto stride, ints("stride"));
    SAFECKPT_TRY(auto pad, ints("padding"));
    SAFECKPT_TRY(auto dil, ints("dilation"));
    SAFECKPT_TRY(std::int64_t groups, integer("groups"));
    for (auto* v : {&stride, &pad, &dil})
      if (v->size() == 1) v->push_back((*v)[0]);
    if (x.shape.size() != 4 || w.shape.size() != 4 || stride.size() != 2 || pad.size() != 2 || dil.size() != 2)
      return fail(ErrorCode::kUnsupported, "convolution: only 2-D (NCHW input, 4-D weight) runs on the GPU");
    if (!floating(x.dtype) || w.dtype != x.dtype || od != x.dtype)
      return fail(ErrorCode::kUnsupported, "convolution: input, weight and output must all be float32 or bfloat16");
    SAFECKPT_TRY(auto oshape, shape_of(node->outputs[0]));
    bool ok = oshape.size() == 4 && fits_int(groups) && groups >= 1;
    for (const auto* v : {&x.shape, &w.shape, &oshape, &stride, &pad, &dil})
      for (auto d : *v) ok = ok && fits_int(d);
    if (!ok) return fail(ErrorCode::kUnsupported, "convolution: a size above 2^31 - 1 (cuDNN takes int sizes)");
    // Channels-last where cuDNN uses tensor cores (EngineOptions::conv_layout).
    const bool tensor_cores = x.dtype == DType::kBFloat16 || eng.opt.cudnn_allow_tf32;
    const bool nhwc =
        eng.opt.conv_layout == ConvLayout::kChannelsLast || (eng.opt.conv_layout == ConvLayout::kAuto && tensor_cores);
    // A batch norm (+ add) + relu to fold in (the conv bias, if any, a
    // checkpoint tensor too). float32: cudnnConvolutionBiasActivationForward
    // on a folded filter; bfloat16 (groups 1): the backend graph, when cuDNN
    // has an engine for it.
    std::optional<ConvFold> fold;
    const bool graph = x.dtype == DType::kBFloat16;
    const Arg& bias_arg = arg("bias");
    if ((!graph || (groups == 1 && eng.opt.cudnn_graph_fusion)) &&
        (!bias || (floating(bias->dtype) && bias->shape.size() == 1 && bias->shape[0] == w.shape[0] &&
                   weights.size() > static_cast<std::size_t>(bias_arg.tensor) &&
                   weights[static_cast<std::size_t>(bias_arg.tensor)])))
      fold = conv_fold_for(node->outputs[0], oshape, nhwc, x.dtype);
    if (nhwc) {
      if (!x.nhwc_memory()) {
        DevTensor c = new_tensor(x.dtype, x.shape, true);
        emit_copy(x, c, x.shape, "channels-last(" + node->name + ")", "copy");
        x = c;
      }
      if (!fold || graph) {
        SAFECKPT_TRY(w, channels_last_weight(w, arg("weight").tensor));
      }
    } else {
      SAFECKPT_TRY(x, contiguous(x));
      if (!fold || graph) {
        SAFECKPT_TRY(w, contiguous(w));
      }
    }
    ConvGeometry cg;
    cg.n = x.shape[0];
    cg.c = x.shape[1];
    cg.h = x.shape[2];
    cg.w = x.shape[3];
    cg.k = w.shape[0];
    cg.r = w.shape[2];
    cg.s = w.shape[3];
    cg.oh = oshape[2];
    cg.ow = oshape[3];
    for (int i = 0; i < 2; ++i) {
      cg.pad[i] = static_cast<int>(pad[static_cast<std::size_t>(i)]);
      cg.stride[i] = static_cast<int>(stride[static_cast<std::size_t>(i)]);
      cg.dilation[i] = static_cast<int>(dil[static_cast<std::size_t>(i)]);
    }
    cg.groups = static_cast<int>(groups);
    cg.bf16 = x.dtype == DType::kBFloat16;
    cg.allow_tf32 = eng.opt.cudnn_allow_tf32;
    cg.nhwc = nhwc;
    DevTensor y = new_tensor(od, oshape, nhwc);
    plan.convs.push_back(cg);
    std::shared_ptr<ConvPlan> cp;
    std::shared_ptr<GraphSlot> gp;
    if (eng.lt != nullptr) {  // a device (dry plans choose no algorithm and run nothing)
      if (!dnn) {
        auto h = dnn_create();
        if (!h) return fail(h.error().code(), h.error().message());
        dnn = *h;
      }
      // A choice this engine or the persistent cache remembers (re-checked
      // by cuDNN), else cuDNN's heuristics (then remembered).
      const std::string key = conv_choice_key(cg, kMaxConvWorkspaceBytes);
      bool from_cache = false;
      if (auto bytes = eng.find_choice(key, &from_cache)) {
        auto c = conv_prepare_known(dnn, cg, kMaxConvWorkspaceBytes, *bytes);
        if (!c) return fail(c.error().code(), c.error().message());
        cp = *c;
      }
      if (!cp) {
        auto c = conv_prepare(dnn, cg, kMaxConvWorkspaceBytes);
        if (!c) return fail(c.error().code(), c.error().message());
        cp = *c;
        eng.store_choice(key, conv_choice_bytes(*cp));
      }
      plan.workspace_bytes = std::max(plan.workspace_bytes, conv_workspace_bytes(*cp));
      plan.warmup_before_capture = true;
      if (fold && !graph) {
        Status st = conv_enable_bias_relu(*cp, cg);
        if (!st) return fail(st.error().code(), st.error().message());
      }
      if (fold && graph) {
        // One graph plan per geometry (cuDNN may compile its kernels).
        const std::string gkey = conv_choice_key(cg, kMaxConvWorkspaceBytes) + (fold->z >= 0 ? ",z" : ",-");
        auto& slot = graph_plans[gkey];
        if (!slot) {
          slot = std::make_shared<GraphSlot>();
          slot->cg = cg;
          slot->with_z = fold->z >= 0;
          slot->key = "graph plan " + gkey;
        }
        gp = slot;
      }
    }
    if (fold) return lower_folded_conv(*fold, cg, cp, gp, graph, x, w, bias, y);
    use(x);
    use(w);
    def(y);
    Plan* pl = &plan;
    add_step(node->name, [pl, cp, x, w, y](cudaStream_t s) {
      if (!cp) return static_cast<int>(cudaErrorNotReady);  // a dry plan's step (never run)
      return conv_forward(*cp, pl->ptr(x), pl->ptr(w), pl->ptr(y), pl->workspace, pl->workspace_bytes, s);
    });
    if (!bias) {
      set_out(0, y);
      return {};
    }
    SAFECKPT_TRY(DevTensor b, per_channel(*bias, 4, cg.k));
    return chain({Operand{-1, y}, Operand{-1, b}}, oshape,
                 [od](const auto& r, const Emit& emit) { return emit(micro(MicroKind::kAdd, od, r[0], r[1], 1.0)); });
  }

  // Fills the graph slots of a device plan (graph_plans.hpp): those the
  // engine or the persistent cache keeps are restored now (up to 16 threads:
  // the H100/H200 hosts have 16 cores); those cuDNN must build are built now
  // too, or with EngineOptions::background_graph_plans (compiled plans) on a
  // PendingGraphs whose result the engine installs between runs. Errors:
  // what graph_conv_prepare returns (the first, by geometry order) for a
  // graph built now.
  Status prepare_graph_plans() {
    if (eng.lt == nullptr) return {};
    std::vector<std::shared_ptr<GraphSlot>> now, later;
    const bool background = fuse && eng.opt.background_graph_plans;
    for (auto& [key, slot] : graph_plans) {
      if (!slot || slot->plan) continue;
      bool cached = false;
      (background && !eng.find_choice(slot->key, &cached) ? later : now).push_back(slot);
    }
    if (now.empty() && later.empty()) return {};
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) return make_error(ErrorCode::kDevice, "cudaGetDevice failed");
    GraphFill f;
    f.slots = std::move(now);
    fill_graph_plans(eng, device, dnn, 16, nullptr, f);
    std::vector<std::string> warnings;
    Status st = apply_graph_fill(plan, f, false, warnings);
    {
      std::lock_guard<std::mutex> lock(eng.mu);
      for (auto& w : warnings) eng.warn(std::move(w), nullptr);
    }
    SAFECKPT_CHECK(st);
    if (!later.empty()) {
      plan.dnn_graphs_background = later.size();
      plan.pending_graphs = std::make_shared<PendingGraphs>(eng, device, std::move(later));
    }
    return {};
  }

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
                           const std::optional<DevTensor>& conv_bias, const DevTensor& y) {
    auto weight = [&](std::int32_t id) -> std::optional<DevTensor> {
      if (id < 0) return std::nullopt;
      return weights[static_cast<std::size_t>(id)];
    };
    const std::optional<DevTensor> gamma = weight(f.gamma), beta = weight(f.beta), mean = weight(f.mean),
                                   var = weight(f.var);
    std::optional<DevTensor> wf, sc;
    if (!graph) {
      wf = prepared_tensor(DType::kFloat32, w_in.shape,
                           cg.nhwc ? channels_last_strides(w_in.shape) : contiguous_strides(w_in.shape));
    } else {
      sc = prepared_tensor(DType::kFloat32, {cg.k}, {1});
    }
    const DevTensor w = wf ? *wf : w_in;  // what the convolution reads
    DevTensor bf = prepared_tensor(DType::kFloat32, {cg.k}, {1});
    Plan* pl = &plan;
    prep = true;
    if (wf) use(w_in);
    for (const auto* t : {&gamma, &beta, &mean, &var, &conv_bias})
      if (*t) use(**t);
    const float eps = f.eps;
    add_step(
        "fold " + p.nodes[f.bn].name + " into " + node->name,
        [pl, w_in, wf, sc, bf, gamma, beta, mean, var, conv_bias, eps](cudaStream_t s) {
          FoldBnArgs a{};
          a.k = w_in.shape[0];
          a.c = w_in.shape[1];
          a.r = w_in.shape[2];
          a.s = w_in.shape[3];
          if (wf) {
            a.w = static_cast<const float*>(pl->ptr(w_in));
            a.wf = static_cast<float*>(pl->ptr(*wf));
            for (int d = 0; d < 4; ++d) {
              a.ws[d] = w_in.strides[static_cast<std::size_t>(d)];
              a.wfs[d] = wf->strides[static_cast<std::size_t>(d)];
            }
          }
          const std::optional<DevTensor>* vec[5] = {&gamma, &beta, &mean, &var, &conv_bias};
          const void** dst[5] = {&a.gamma, &a.beta, &a.mean, &a.var, &a.conv_bias};
          for (int i = 0; i < 5; ++i) {
            *dst[i] = *vec[i] ? pl->ptr(**vec[i]) : nullptr;
            a.vs[i] = *vec[i] ? (*vec[i])->strides[0] : 0;
            a.vbf16[i] = *vec[i] && (*vec[i])->dtype == DType::kBFloat16 ? 1 : 0;
          }
          a.eps = eps;
          a.bias = static_cast<float*>(pl->ptr(bf));
          a.scale = sc ? static_cast<float*>(pl->ptr(*sc)) : nullptr;
          return launch_fold_batch_norm(a, s);
        },
        "prepare");
    prep = false;
    std::optional<DevTensor> z;
    if (f.z >= 0) z = vals[static_cast<std::size_t>(f.z)];
    use(x);
    use(w);
    if (z) use(*z);
    def(y);
    // 0: not run yet; 1: the fused call ran; 2: cuDNN refused it.
    auto mode = std::make_shared<std::atomic<int>>(0);
    const long long count = static_cast<long long>(y.numel()), inner = cg.nhwc ? 1 : cg.oh * cg.ow, channels = cg.k;
    const int bf16 = cg.bf16 ? 1 : 0;
    std::string name = node->name + "+" + p.nodes[f.bn].name;
    if (f.add) name += "+" + p.nodes[*f.add].name;
    name += "+" + p.nodes[f.relu].name;
    if (gp) gp->steps.push_back(plan.steps.size());  // named after its engine by prepare_graph_plans
    add_step(name, [pl, cp, gp, graph, x, w, sc, bf, z, y, mode, count, inner, channels, bf16](cudaStream_t s) {
      if (!cp) return static_cast<int>(cudaErrorNotReady);  // a dry plan's step (never run)
      const GraphPlan* gc = gp ? gp->plan.get() : nullptr;
      const void* xp = pl->ptr(x);
      const void* wp = pl->ptr(w);
      void* yp = pl->ptr(y);
      const void* zp = z ? pl->ptr(*z) : nullptr;
      const void* sp = sc ? pl->ptr(*sc) : nullptr;
      const void* bp = pl->ptr(bf);
      auto a16 = [](const void* q) { return (reinterpret_cast<std::uintptr_t>(q) & 15u) == 0; };
      const bool aligned = a16(xp) && a16(wp) && a16(yp) && a16(zp) && a16(sp) && a16(bp);
      if (mode->load() != 2 && (!graph || (aligned && gc != nullptr))) {
        int r = graph ? graph_conv_forward(*gc, xp, wp, sp, bp, zp, yp, pl->workspace, pl->workspace_bytes, s)
                      : conv_bias_relu_forward(*cp, xp, wp, bp, zp, yp, pl->workspace, pl->workspace_bytes, s);
        if (r == 0 || mode->load() == 1) {
          if (r == 0) mode->store(1);
          return r;
        }
        mode->store(2);
        pl->dnn_refusals.fetch_add(1);
        (void)cudaGetLastError();  // cuDNN's, if any: not the fallback's
      }
      int r = conv_forward(*cp, xp, wp, yp, pl->workspace, pl->workspace_bytes, s);
      if (r != 0) return r;
      return launch_bias_add_relu(yp, static_cast<const float*>(sp), static_cast<const float*>(bp), zp, count, channels,
                                  inner, bf16, s);
    });
    absorbed[f.bn] = 1;
    if (f.add) absorbed[*f.add] = 1;
    absorbed[f.relu] = 1;
    vals[static_cast<std::size_t>(f.out)] = y;
    return {};
  }

  // batch_norm(training=False) / _native_batch_norm_legit_no_training, as
  // ATen's batch_norm_transform_input: weight * (x - mean) * invstd + bias,
  // invstd = 1 / sqrt(running_var + eps), in float, rounded once.
  Status lower_batch_norm(bool native) {
    const Arg& xa = arg("input");
    if (xa.kind != Arg::Kind::kTensor || xa.tensor < 0) return fail(ErrorCode::kMalformed, "batch_norm input");
    const DType xd = p.values[static_cast<std::size_t>(xa.tensor)].dtype;
    SAFECKPT_TRY(DType od, out_dtype());
    SAFECKPT_TRY(auto shape, shape_of(xa.tensor));
    SAFECKPT_TRY(auto w, opt_tensor("weight"));
    SAFECKPT_TRY(auto b, opt_tensor("bias"));
    SAFECKPT_TRY(auto rm, opt_tensor("running_mean"));
    SAFECKPT_TRY(auto rv, opt_tensor("running_var"));
    SAFECKPT_TRY(double eps, scalar("eps"));
    if (!rm || !rv) return fail(ErrorCode::kUnsupported, "batch_norm without running statistics");
    if (shape.size() < 2 || !floating(xd) || od != xd)
      return fail(ErrorCode::kUnsupported, "batch_norm needs an N, C, ... float32 or bfloat16 input");
    const std::int64_t channels = shape[1];
    std::vector<Operand> ops{Operand{xa.tensor, {}}};
    for (const auto* t : {&rm, &rv, &w, &b}) {
      if (!*t) continue;
      if (!floating((*t)->dtype)) return fail(ErrorCode::kUnsupported, "batch_norm statistics must be floating");
      SAFECKPT_TRY(DevTensor v, per_channel(**t, shape.size(), channels));
      ops.push_back(Operand{-1, v});
    }
    const bool has_w = w.has_value(), has_b = b.has_value();
    SAFECKPT_CHECK(chain(ops, shape, [=](const std::vector<std::int32_t>& r, const Emit& emit) {
      const DType f = DType::kFloat32;
      std::int32_t t = emit(micro(MicroKind::kSub, f, r[0], r[1], 1.0));
      std::size_t k = 3;
      if (has_w) t = emit(micro(MicroKind::kMul, f, r[k++], t));
      std::int32_t inv = emit(micro(MicroKind::kInvSqrt, f, r[2], -1, eps));
      t = emit(micro(MicroKind::kMul, f, t, inv));
      if (has_b) t = emit(micro(MicroKind::kAdd, f, t, r[k], 1.0));
      return emit(micro(MicroKind::kCast, od, t));
    }));
    if (native)  // save_mean / save_invstd: empty in inference (their recorded tensor_meta)
      for (std::size_t k = 1; k < 3 && k < node->outputs.size(); ++k) {
        std::int32_t id = node->outputs[k];
        if (id < 0) continue;
        SAFECKPT_TRY(auto sh, shape_of(id));
        set_out(k, new_tensor(p.values[static_cast<std::size_t>(id)].dtype, sh));
      }
    return {};
  }

  Status lower_adaptive_avg_pool2d() {
    SAFECKPT_TRY(DevTensor x, tensor("self"));
    SAFECKPT_TRY(DType od, out_dtype());
    SAFECKPT_TRY(auto oshape, shape_of(node->outputs[0]));
    if ((x.shape.size() != 3 && x.shape.size() != 4) || oshape.size() != x.shape.size() || !floating(x.dtype) ||
        od != x.dtype)
      return fail(ErrorCode::kUnsupported, "adaptive_avg_pool2d needs a 3-D/4-D float32 or bfloat16 input");
    const bool cl = x.channels_last();  // channels-last in and out
    if (!cl) {
      SAFECKPT_TRY(x, contiguous(x));
    }
    const std::size_t r = x.shape.size();
    std::int64_t h = x.shape[r - 2], w = x.shape[r - 1], oh = oshape[r - 2], ow = oshape[r - 1];
    std::int64_t planes = h * w == 0 ? 0 : static_cast<std::int64_t>(x.numel()) / (h * w);
    if (h * w == 0 && x.numel() != 0) return fail(ErrorCode::kUnsupported, "adaptive_avg_pool2d of an empty plane");
    DevTensor y = new_tensor(od, oshape, cl);
    use(x);
    def(y);
    Plan* pl = &plan;
    int bf = x.dtype == DType::kBFloat16;
    const long long channels = cl ? x.shape[1] : 0;
    add_step(node->name, [=](cudaStream_t s) {
      return launch_adaptive_avg_pool2d(pl->ptr(x), pl->ptr(y), planes, h, w, oh, ow, bf, channels, s);
    });
    set_out(0, y);
    return {};
  }

  // max_pool2d / max_pool2d_with_indices: values only (a program that reads
  // the indices is refused). Output sizes come from the shape pass
  // (ceil_mode included).
  Status lower_max_pool2d(bool with_indices) {
    if (with_indices && node->outputs.size() > 1 && node->outputs[1] >= 0) {
      auto ix = static_cast<std::size_t>(node->outputs[1]);
      if (!consumers[ix].empty() || is_output[ix] != 0)
        return fail(ErrorCode::kUnsupported, "max_pool2d_with_indices: the indices are read (no GPU kernel)");
    }
    SAFECKPT_TRY(DevTensor x, tensor("self"));
    SAFECKPT_TRY(DType od, out_dtype());
    SAFECKPT_TRY(auto oshape, shape_of(node->outputs[0]));
    SAFECKPT_TRY(auto ks, ints("kernel_size"));
    SAFECKPT_TRY(auto st, ints("stride"));
    SAFECKPT_TRY(auto pd, ints("padding"));
    SAFECKPT_TRY(auto dl, ints("dilation"));
    if (st.empty()) st = ks;
    for (auto* v : {&ks, &st, &pd, &dl})
      if (v->size() == 1) v->push_back((*v)[0]);
    if ((x.shape.size() != 3 && x.shape.size() != 4) || oshape.size() != x.shape.size() || !floating(x.dtype) ||
        od != x.dtype || ks.size() != 2 || st.size() != 2 || pd.size() != 2 || dl.size() != 2)
      return fail(ErrorCode::kUnsupported, "max_pool2d needs a 3-D/4-D float32 or bfloat16 input and 2-D windows");
    bool ok = true;
    for (const auto* v : {&ks, &st, &pd, &dl})
      for (auto d : *v) ok = ok && fits_int(d);
    if (!ok) return fail(ErrorCode::kUnsupported, "max_pool2d: window parameters above 2^31 - 1");
    const bool cl = x.channels_last();  // channels-last in and out
    if (!cl) {
      SAFECKPT_TRY(x, contiguous(x));
    }
    const std::size_t r = x.shape.size();
    MaxPoolArgs a{};
    a.h = x.shape[r - 2];
    a.w = x.shape[r - 1];
    a.oh = oshape[r - 2];
    a.ow = oshape[r - 1];
    a.planes = a.h * a.w == 0 ? 0 : static_cast<std::int64_t>(x.numel()) / (a.h * a.w);
    a.kh = static_cast<int>(ks[0]);
    a.kw = static_cast<int>(ks[1]);
    a.sh = static_cast<int>(st[0]);
    a.sw = static_cast<int>(st[1]);
    a.ph = static_cast<int>(pd[0]);
    a.pw = static_cast<int>(pd[1]);
    a.dh = static_cast<int>(dl[0]);
    a.dw = static_cast<int>(dl[1]);
    a.bf16 = x.dtype == DType::kBFloat16;
    a.channels = cl ? x.shape[1] : 0;
    DevTensor y = new_tensor(od, oshape, cl);
    use(x);
    def(y);
    Plan* pl = &plan;
    add_step(node->name, [=](cudaStream_t s) {
      MaxPoolArgs m = a;
      m.x = pl->ptr(x);
      m.y = pl->ptr(y);
      return launch_max_pool2d(m, s);
    });
    set_out(0, y);
    return {};
  }

  Status lower_node() {
    const std::string& op = node->schema->name;
    if (node->sym_output >= 0) return lower_sym();
    if (op == "aten::linear" || op == "aten::addmm" || op == "aten::mm" || op == "aten::bmm") {
      SAFECKPT_CHECK(flush());
      return lower_gemm(op);
    }
    if (op == "aten::layer_norm" || op == "aten::native_layer_norm") {
      SAFECKPT_CHECK(flush());
      return lower_layer_norm(op == "aten::native_layer_norm");
    }
    if (op == "aten::_softmax") {
      SAFECKPT_CHECK(flush());
      return lower_softmax();
    }
    if (op == "aten::any.dim" || op == "aten::mean.dim") {
      SAFECKPT_CHECK(flush());
      return lower_reduce(op == "aten::any.dim");
    }
    if (op == "aten::embedding") {
      SAFECKPT_CHECK(flush());
      return lower_embedding();
    }
    if (op == "aten::scaled_dot_product_attention" || op == "aten::_scaled_dot_product_efficient_attention" ||
        op == "aten::_scaled_dot_product_cudnn_attention" || op == "aten::_scaled_dot_product_flash_attention") {
      SAFECKPT_CHECK(flush());
      return lower_sdpa();
    }
    if (op == "aten::view" || op == "aten::flatten.using_ints" || op == "aten::permute" ||
        op == "aten::transpose.int" || op == "aten::unsqueeze" || op == "aten::expand" || op == "aten::split.Tensor" ||
        op == "aten::split_with_sizes" || op == "aten::reshape" || op == "aten::slice.Tensor" ||
        op == "aten::select.int")
      return lower_view(op);
    if (op == "aten::cat") {
      SAFECKPT_CHECK(flush());
      return lower_cat();
    }
    if (op == "aten::gather" || op == "aten::index.Tensor") {
      SAFECKPT_CHECK(flush());
      return lower_index(op == "aten::gather");
    }
    if (op == "aten::_assert_tensor_metadata") return lower_assert_metadata();
    if (op == "aten::conv2d" || op == "aten::convolution") {
      SAFECKPT_CHECK(flush());
      return lower_conv();
    }
    if (op == "aten::batch_norm" || op == "aten::_native_batch_norm_legit_no_training")
      return lower_batch_norm(op == "aten::_native_batch_norm_legit_no_training");
    if (op == "aten::adaptive_avg_pool2d") {
      SAFECKPT_CHECK(flush());
      return lower_adaptive_avg_pool2d();
    }
    if (op == "aten::max_pool2d" || op == "aten::max_pool2d_with_indices") {
      SAFECKPT_CHECK(flush());
      return lower_max_pool2d(op == "aten::max_pool2d_with_indices");
    }
    return lower_pointwise(op);
  }

  // ------------------------------------------------------------ the pass
  Status run(const std::vector<std::pair<std::int32_t, DevTensor>>& inputs) {
    const std::size_t nv = p.values.size();
    first_step.assign(plan.bufs.size(), 0);
    last_step.assign(plan.bufs.size(), 0);
    def_seen.assign(plan.bufs.size(), 0);
    vals.assign(nv, std::nullopt);
    syms.assign(p.sym_values.size(), std::nullopt);
    consumers.assign(nv, {});
    is_output.assign(nv, 0);
    absorbed.assign(p.nodes.size(), 0);
    for (std::size_t i = 0; i < p.nodes.size(); ++i)
      for (const auto& a : p.nodes[i].args) {
        if (a.kind == Arg::Kind::kTensor && a.tensor >= 0) consumers[static_cast<std::size_t>(a.tensor)].push_back(i);
        for (auto t : a.tensors)
          if (t >= 0) consumers[static_cast<std::size_t>(t)].push_back(i);
      }
    for (auto o : p.outputs) is_output[static_cast<std::size_t>(o)] = 1;
    for (std::size_t v = 0; v < nv; ++v)
      if (weights.size() > v && weights[v]) vals[v] = weights[v];
    for (const auto& [id, t] : inputs) vals[static_cast<std::size_t>(id)] = t;
    for (std::size_t i = 0; i < p.nodes.size(); ++i) {
      if (absorbed[i]) continue;
      node = &p.nodes[i];
      node_index = i;
      SAFECKPT_CHECK(lower_node());
    }
    SAFECKPT_CHECK(flush());
    // Outputs: into their own buffers (not reused), copied when a view.
    for (auto o : p.outputs) {
      auto& v = vals[static_cast<std::size_t>(o)];
      if (!v) return make_error(ErrorCode::kInternal, "output without a plan");
      DevTensor t = *v;
      bool own =
          t.buf >= 0 && plan.bufs[static_cast<std::size_t>(t.buf)].kind == BufKind::kArena && t.contiguous() &&
          t.offset == 0 &&
          plan.bufs[static_cast<std::size_t>(t.buf)].bytes == std::max<std::uint64_t>(t.numel() * esize(t.dtype), 1);
      if (!own) {
        node = &p.nodes.back();
        SAFECKPT_TRY(t, contiguous_copy(t));
      }
      plan.bufs[static_cast<std::size_t>(t.buf)].kind = BufKind::kOutput;
      plan.outputs.push_back(t);
    }
    assign_arena();
    return {};
  }
  Result<DevTensor> contiguous_copy(const DevTensor& t) {
    DevTensor out = new_tensor(t.dtype, t.shape);
    emit_copy(t, out, t.shape, "output copy", "copy");
    return out;
  }

  // Offsets by liveness over the arena buffers (graph::layout_arena: the
  // planner make_plan uses), each rounded up to 256 bytes (cudaMalloc's
  // alignment, what cuBLASLt and cuDNN want).
  void assign_arena() {
    std::vector<std::size_t> ids;
    std::vector<std::uint64_t> bytes;
    std::vector<std::int64_t> first, last;
    for (std::size_t b = 0; b < plan.bufs.size(); ++b)
      if (plan.bufs[b].kind == BufKind::kArena) {
        ids.push_back(b);
        bytes.push_back((plan.bufs[b].bytes + 255) / 256 * 256);
        first.push_back(first_step[b]);
        last.push_back(last_step[b]);
      }
    const graph::ArenaLayout layout = graph::layout_arena(bytes, first, last);
    for (std::size_t i = 0; i < ids.size(); ++i) plan.bufs[ids[i]].offset = layout.offsets[i];
    plan.arena_bytes = layout.arena_bytes;
    plan.arena_live_bytes = layout.peak_live_bytes;
  }
};

}  // namespace

Status tune_gemms(Plan& plan, EngineImpl& eng, cudaStream_t stream) {
  if (plan.tunes.empty()) return {};
  const auto t0 = std::chrono::steady_clock::now();
  struct Timing {
    Timing() = default;
    Timing(const Timing&) = delete;
    Timing& operator=(const Timing&) = delete;
    ~Timing() {
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (a != nullptr) cudaEventDestroy(a);
      if (b != nullptr) cudaEventDestroy(b);
    }
    cudaEvent_t a = nullptr, b = nullptr;
    cudaGraphExec_t exec = nullptr;
  } tm;
  auto device_error = [](const std::string& what, cudaError_t e) {
    return make_error(ErrorCode::kDevice, "GEMM autotuning: " + what + ": " + cudaGetErrorString(e));
  };
  cudaError_t e = cudaEventCreate(&tm.a);
  if (e == cudaSuccess) e = cudaEventCreate(&tm.b);
  if (e != cudaSuccess) return device_error("cudaEventCreate", e);
  // GPU milliseconds of `reps` runs of `s`, captured into one CUDA graph (so
  // that host launch costs do not hide the kernels' differences); nullopt
  // when cuBLASLt refuses the algorithm or the capture fails.
  auto graph_ms = [&](const Step& s, int reps) -> std::optional<double> {
    if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return std::nullopt;
    bool ok = true;
    for (int r = 0; r < reps; ++r) ok = ok && s.fn(stream) == 0;
    cudaGraph_t graph = nullptr;
    ok = cudaStreamEndCapture(stream, &graph) == cudaSuccess && ok;
    ok = ok && cudaGraphInstantiate(&tm.exec, graph, 0) == cudaSuccess;
    if (graph != nullptr) cudaGraphDestroy(graph);
    float ms = 0;
    ok = ok && cudaEventRecord(tm.a, stream) == cudaSuccess && cudaGraphLaunch(tm.exec, stream) == cudaSuccess &&
         cudaEventRecord(tm.b, stream) == cudaSuccess && cudaEventSynchronize(tm.b) == cudaSuccess &&
         cudaEventElapsedTime(&ms, tm.a, tm.b) == cudaSuccess;
    if (tm.exec != nullptr) cudaGraphExecDestroy(tm.exec);
    tm.exec = nullptr;
    if (!ok) return std::nullopt;
    return static_cast<double>(ms) / reps;
  };
  for (auto& t : plan.tunes) {
    const Step& s = plan.steps[t.steps.front()];
    GemmDesc& d = *t.descs.front();
    std::vector<double> ms_of(t.candidates.size(), -1.0);  // -1: refused
    std::optional<std::size_t> best;
    double spent_ms = 0;  // GPU time spent timing this GEMM (kGemmTuneBudgetMs)
    for (std::size_t i = 0; i < t.candidates.size() && spent_ms < kGemmTuneBudgetMs; ++i) {
      d.algo = t.candidates[i];
      // One run, timed roughly (also its warm-up): how many repetitions make
      // about kGemmTuneGraphMs. A refusal is no candidate; a launch error it
      // may have left (cuBLASLt reports refusals as its own status) is cleared.
      float first_ms = 0;
      const bool ran = cudaEventRecord(tm.a, stream) == cudaSuccess && s.fn(stream) == 0 &&
                       cudaEventRecord(tm.b, stream) == cudaSuccess && cudaEventSynchronize(tm.b) == cudaSuccess &&
                       cudaEventElapsedTime(&first_ms, tm.a, tm.b) == cudaSuccess;
      if (!ran) {
        (void)cudaGetLastError();
        continue;
      }
      spent_ms += first_ms;
      const int reps = static_cast<int>(std::clamp(kGemmTuneGraphMs / std::max(1e-3, static_cast<double>(first_ms)),
                                                   1.0, static_cast<double>(kGemmTuneMaxReps)));
      const auto ms = graph_ms(s, reps);
      if (!ms) {
        (void)cudaGetLastError();
        continue;
      }
      spent_ms += *ms * reps;
      ms_of[i] = *ms;
      if (!best || ms_of[i] < ms_of[*best]) best = i;
    }
    // Only a broken context leaves an error behind now: stop there.
    e = cudaStreamSynchronize(stream);
    const cublasLtMatmulAlgo_t chosen = best ? t.candidates[*best] : t.fallback;
    for (auto& desc : t.descs) desc->algo = chosen;
    if (e != cudaSuccess) {
      plan.tunes.clear();
      return device_error("step '" + s.name + "'", e);
    }
    if (best) {
      std::vector<std::uint8_t> bytes(sizeof(cublasLtMatmulAlgo_t));
      std::memcpy(bytes.data(), &chosen, sizeof chosen);
      eng.store_choice(t.key, std::move(bytes));
    }
    ++plan.gemms_tuned;
  }
  plan.tunes.clear();
  plan.tune_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  plan.compile_seconds += plan.tune_seconds;
  return {};
}

Status build_plan(const Program& program, EngineImpl& eng, const std::vector<std::optional<DevTensor>>& weights,
                  const std::vector<std::pair<std::int32_t, DevTensor>>& inputs,
                  const std::unordered_map<std::string, std::int64_t>& symbols, bool fuse, Plan& plan) {
  Lowering lw(program, plan, eng, weights, fuse, fuse && eng.opt.fuse_gemm_epilogue);
  lw.symbols = symbols;
  SAFECKPT_CHECK(lw.run(inputs));
  SAFECKPT_CHECK(lw.prepare_graph_plans());
  return {};
}

}  // namespace safeckpt::engine::detail
