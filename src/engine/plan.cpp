// src/engine/plan.cpp — lowering a validated program at one concrete shape
// into launch steps and the activation arena: values, views, pointwise
// groups, normalizations, reductions, gathers, and the pass itself
// (lowering.hpp says where the other sections are).

#include <algorithm>

#include "engine/lowering.hpp"
#include "graph/view_strides.hpp"
#include "safeckpt/graph_plan.hpp"

namespace safeckpt::engine::detail {

Result<std::int64_t> Lowering::sym(const graph::SymInt& s) {
  if (!s.is_symbolic()) return s.value;
  auto& slot = syms[static_cast<std::size_t>(s.sym)];
  if (slot) return *slot;
  const auto& sv = p.sym_values[static_cast<std::size_t>(s.sym)];
  if (sv.expr.empty()) return fail(ErrorCode::kMalformed, "SymInt '" + sv.name + "' has no value");
  SAFECKPT_TRY(std::int64_t v, graph::detail::eval_srepr(sv.expr, symbols, graph::GraphLimits{}));
  slot = v;
  return v;
}

Result<std::vector<std::int64_t>> Lowering::ints(std::string_view name) {
  std::vector<std::int64_t> out;
  for (const auto& s : arg(name).ints) {
    SAFECKPT_TRY(std::int64_t v, sym(s));
    out.push_back(v);
  }
  return out;
}

Result<double> Lowering::scalar(std::string_view name) {
  const Arg& a = arg(name);
  if (a.kind == Arg::Kind::kFloat) return a.f;
  if (a.kind == Arg::Kind::kBool) return a.b ? 1.0 : 0.0;
  if (a.kind == Arg::Kind::kInt && a.ints.size() == 1) {
    SAFECKPT_TRY(std::int64_t v, sym(a.ints[0]));
    return static_cast<double>(v);
  }
  return fail(ErrorCode::kMalformed, "argument '" + std::string(name) + "' is not a number");
}

Result<std::vector<std::int64_t>> Lowering::shape_of(std::int32_t v) {
  std::vector<std::int64_t> s;
  for (const auto& d : p.values[static_cast<std::size_t>(v)].sizes) {
    SAFECKPT_TRY(std::int64_t x, sym(d));
    s.push_back(x);
  }
  return s;
}

std::int32_t Lowering::new_buf(std::uint64_t bytes) {
  Buf b;
  b.bytes = std::max<std::uint64_t>(bytes, 1);
  plan.bufs.push_back(b);
  first_step.push_back(static_cast<std::int64_t>(plan.steps.size()));
  last_step.push_back(static_cast<std::int64_t>(plan.steps.size()));
  def_seen.push_back(0);
  return static_cast<std::int32_t>(plan.bufs.size() - 1);
}

DevTensor Lowering::new_tensor(DType d, std::vector<std::int64_t> shape, bool channels_last) {
  DevTensor t;
  t.dtype = d;
  t.strides = channels_last && shape.size() == 4 ? channels_last_strides(shape) : contiguous_strides(shape);
  t.shape = std::move(shape);
  t.buf = new_buf(t.numel() * esize(d));
  return t;
}

std::string Lowering::node_kind() const {
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

std::string Lowering::node_shapes() const {
  std::string r;
  if (node == nullptr) return r;
  for (const auto& a : node->args)
    if (a.kind == Arg::Kind::kTensor && a.tensor >= 0 && vals[static_cast<std::size_t>(a.tensor)])
      r += (r.empty() ? "" : " ") + shape_text(vals[static_cast<std::size_t>(a.tensor)]->shape);
  return r;
}

Result<DevTensor> Lowering::value(std::int32_t id) {
  if (id < 0) return fail(ErrorCode::kMalformed, "missing tensor argument");
  if (g.open && g.reg_of_value.count(id) != 0) {
    SAFECKPT_CHECK(flush());
  }
  auto& v = vals[static_cast<std::size_t>(id)];
  if (!v) return fail(ErrorCode::kInternal, "value '" + p.value_names[static_cast<std::size_t>(id)] + "' has no plan");
  return *v;
}

void Lowering::emit_copy(const DevTensor& in, const DevTensor& out, std::vector<std::int64_t> shape, std::string name,
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

void Lowering::emit_fused(FusedKernel k, std::vector<DevTensor> ins, std::vector<DevTensor> outs,
                          std::vector<std::int64_t> shape, std::string name, std::string kind) {
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

Status Lowering::flush() {
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

Status Lowering::pointwise(const std::vector<std::string_view>& tensor_args,
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

Status Lowering::lower_pointwise(const std::string& op) {
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
    return pointwise({"self", "other"}, [&](const auto& r) -> Result<MicroOp> { return mk(k, r[0], r[1], -1, alpha); });
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
    return pointwise({}, [&](const auto&) -> Result<MicroOp> { return mk(MicroKind::kArange, -1, -1, -1, 0.0, 1.0); });
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

Status Lowering::lower_view(const std::string& op) {
  SAFECKPT_TRY(DevTensor x, tensor("self"));
  if (op == "aten::split.Tensor" || op == "aten::split_with_sizes") {
    if (x.shape.empty()) return fail(ErrorCode::kMalformed, "split of a 0-d tensor");
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
    if (!x.shape.empty()) {  // a 0-d tensor (dims 0 / -1) is returned as it is, as in PyTorch
      std::swap(t.shape[static_cast<std::size_t>(a)], t.shape[static_cast<std::size_t>(b)]);
      std::swap(t.strides[static_cast<std::size_t>(a)], t.strides[static_cast<std::size_t>(b)]);
    }
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

Status Lowering::lower_layer_norm(bool native) {
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

Status Lowering::lower_softmax() {
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

Status Lowering::lower_reduce(bool any) {
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
  auto code = [](DType d) { return d == DType::kFloat32 ? 0 : d == DType::kBFloat16 ? 1 : d == DType::kInt64 ? 2 : 3; };
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

Status Lowering::lower_embedding() {
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

Status Lowering::lower_cat() {
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

Status Lowering::lower_index(bool is_gather) {
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

Status Lowering::lower_assert_metadata() {
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

Status Lowering::lower_sym() {
  const std::string& op = node->schema->name;
  std::int64_t v = 0;
  if (op == "aten::sym_size.int") {
    SAFECKPT_TRY(DevTensor x, tensor("self"));
    SAFECKPT_TRY(std::int64_t d0, integer("dim"));
    if (x.shape.empty()) return fail(ErrorCode::kMalformed, "sym_size of a 0-d tensor");
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

Status Lowering::lower_node() {
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
  if (op == "aten::view" || op == "aten::flatten.using_ints" || op == "aten::permute" || op == "aten::transpose.int" ||
      op == "aten::unsqueeze" || op == "aten::expand" || op == "aten::split.Tensor" || op == "aten::split_with_sizes" ||
      op == "aten::reshape" || op == "aten::slice.Tensor" || op == "aten::select.int")
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

Status Lowering::run(const std::vector<std::pair<std::int32_t, DevTensor>>& inputs) {
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

void Lowering::assign_arena() {
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
