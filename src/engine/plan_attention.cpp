// src/engine/plan_attention.cpp — the lowering of scaled_dot_product_attention
// (every spelling): cuDNN SDPA, the flash kernels, or the materialized path.

#include <algorithm>
#include <atomic>
#include <cmath>

#include "engine/lowering.hpp"

namespace safeckpt::engine::detail {

Status Lowering::lower_sdpa() {
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

Lowering::AttnBias Lowering::attention_bias(const AttnArgs& aa, const DevTensor& mask, std::int32_t mask_value) {
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

SdpaGeometry Lowering::sdpa_geometry(const AttnArgs& aa, const DevTensor& q, const DevTensor& k, const DevTensor& v,
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

bool Lowering::sdpa_candidate(const AttnArgs& aa, const DevTensor& q, const DevTensor& k, const DevTensor& v,
                              const DevTensor& y) const {
  if (aa.mask_kind != 0 && !eng.opt.cudnn_attention_masks) return false;
  for (const DevTensor* t : {&q, &k, &v, &y}) {
    if (t->shape.size() != 4 || base_bytes(*t) % 16 != 0) return false;
    for (std::size_t i = 0; i < 4; ++i)
      if (t->shape[i] != 1 && t->strides[i] <= 0) return false;
  }
  return sdpa_graph_applies(sdpa_geometry(aa, q, k, v, y));
}

std::string Lowering::attn_shapes(const AttnArgs& aa, const char* path) {
  return shape_text({aa.B, aa.H, aa.L, aa.D}) + " S=" + std::to_string(aa.S) + " Dv=" + std::to_string(aa.Dv) +
         (aa.causal ? " causal" : "") +
         (aa.mask_kind == 1   ? " bool-mask"
          : aa.mask_kind == 2 ? " add-mask"
                              : "") +
         (aa.bf16 ? " bf16 " : " fp32 ") + path;
}

std::vector<std::pair<long long, long long>> Lowering::causal_blocks(long long L, bool causal) {
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

Status Lowering::lower_sdpa_materialized(const AttnArgs& aa, const AttnChoice& c, const DevTensor& q,
                                         const DevTensor& k, const DevTensor& v, const std::optional<DevTensor>& mask,
                                         const DevTensor& y, bool ptr_batch) {
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
      m.align = alignment(
          base_bytes(t) | bytes(col0 * m.ld, es) | bytes(t.strides[0], es) | bytes(t.strides[1], es) | bytes(m.ld, es),
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
            cublasStatus_t st = cublasLtMatmul(lt, qk->op, &alpha, kp, qk->la, qp, qk->lb, &beta, d, qk->lc, d, qk->lc,
                                               &qk->algo, pl->workspace, kWorkspaceBytes, s);
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

}  // namespace safeckpt::engine::detail
