// src/engine/plan_conv.cpp — the lowering of convolutions (cuDNN), batch-norm
// folding into them, and pooling.

#include <algorithm>
#include <atomic>

#include "engine/lowering.hpp"

namespace safeckpt::engine::detail {

Status Lowering::chain(const std::vector<Operand>& operands, const std::vector<std::int64_t>& shape,
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

MicroOp Lowering::micro(MicroKind k, DType d, std::int32_t a, std::int32_t b, double s0) {
  MicroOp o;
  o.kind = k;
  o.dtype = d;
  o.a = a;
  o.b = b;
  o.s0 = s0;
  return o;
}

Result<DevTensor> Lowering::per_channel(const DevTensor& t, std::size_t rank, std::int64_t channels) {
  if (t.shape.size() != 1 || t.shape[0] != channels)
    return fail(ErrorCode::kMalformed, "per-channel tensor must have " + std::to_string(channels) + " elements");
  DevTensor v = t;
  v.shape.assign(rank - 1, 1);
  v.strides.assign(rank - 1, 1);
  v.shape[0] = channels;
  v.strides[0] = t.strides[0];
  return v;
}

DevTensor Lowering::prepared_tensor(DType d, std::vector<std::int64_t> shape, std::vector<std::int64_t> strides) {
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

Result<DevTensor> Lowering::channels_last_weight(const DevTensor& w, std::int32_t id) {
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

std::optional<std::int32_t> Lowering::fold_operand(const Node& n, std::string_view name, std::int64_t k,
                                                   bool required) const {
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

std::optional<Lowering::ConvFold> Lowering::conv_fold_for(std::int32_t y, const std::vector<std::int64_t>& yshape,
                                                          bool nhwc, DType dt) const {
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

Status Lowering::lower_conv() {
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

Status Lowering::prepare_graph_plans() {
  if (eng.lt == nullptr) return {};
  std::vector<std::shared_ptr<GraphSlot>> now, later;
  const bool background = fuse && eng.opt.background_graph_plans;
  for (auto& [key, slot] : graph_plans) {
    if (!slot || slot->plan) continue;
    bool cached = false;
    const bool to_background = background && (eng.opt.background_graph_restore || !eng.find_choice(slot->key, &cached));
    (to_background ? later : now).push_back(slot);
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

Status Lowering::lower_folded_conv(const ConvFold& f, const ConvGeometry& cg, const std::shared_ptr<ConvPlan>& cp,
                                   const std::shared_ptr<GraphSlot>& gp, bool graph, const DevTensor& x,
                                   const DevTensor& w_in, const std::optional<DevTensor>& conv_bias,
                                   const DevTensor& y) {
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

Status Lowering::lower_batch_norm(bool native) {
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

Status Lowering::lower_adaptive_avg_pool2d() {
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

Status Lowering::lower_max_pool2d(bool with_indices) {
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

}  // namespace safeckpt::engine::detail
