// src/engine/plan_gemm.cpp — the lowering of GEMMs (linear, addmm, mm, bmm,
// matmul) to cuBLASLt: layouts, fused epilogues, sibling linears, the
// misaligned-N row classes and split, and timing the candidates (tune_gemms).

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "engine/lowering.hpp"

namespace safeckpt::engine::detail {

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

Status Lowering::gemm(DevTensor a, DevTensor b, const DevTensor& out, const std::optional<DevTensor>& bias, int act,
                      float alpha, float beta, std::uint32_t align, const std::optional<DevTensor>& c_in) {
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
  for (std::int64_t x : {std::int64_t{ty}, std::int64_t{ct}, std::int64_t{opa}, std::int64_t{opb}, std::int64_t{epi}, M,
                         N, K, std::int64_t{lb->ld}, std::int64_t{la->ld}, ldc, std::int64_t{align}, batch,
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
    cublasStatus_t s2 = cublasLtMatmul(lt, g2->op, &alpha, pl->ptr(b), g2->la, pl->ptr(a), g2->lb, &beta, c, g2->lc, d,
                                       g2->lc, &g2->algo, pl->workspace, kWorkspaceBytes, s);
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

int Lowering::epilogue_act(std::int32_t v) const {
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

std::optional<Lowering::Residual> Lowering::residual_for(std::int32_t v, const DevTensor& g_out) {
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
    if (self == nullptr || other == nullptr || self->kind != Arg::Kind::kTensor || other->kind != Arg::Kind::kTensor ||
        self->tensor == other->tensor)
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

Result<DevTensor> Lowering::linear_rows(DevTensor a) {
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

std::vector<std::size_t> Lowering::sibling_linears() {
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

Status Lowering::lower_sibling_linears(const std::vector<std::size_t>& group) {
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

bool Lowering::row_classes_apply(const DevTensor& a, const DevTensor& b, const DevTensor& g_out) const {
  const auto esz = static_cast<std::int64_t>(esize(g_out.dtype));
  const std::int64_t per16 = 16 / esz, M = g_out.shape[0], N = g_out.shape[1];
  return a.strides[1] == 1 && (a.strides[0] * esz) % 16 == 0 && (a.offset * esz) % 16 == 0 && b.strides[0] == 1 &&
         (b.strides[1] * esz) % 16 == 0 && (b.offset * esz) % 16 == 0 &&
         g_out.strides == std::vector<std::int64_t>{N, 1} && (g_out.offset * esz) % 16 == 0 && N >= 2 * per16 &&
         M >= 16 / std::gcd(N * esz, std::int64_t{16});
}

Status Lowering::gemm_by_row_classes(const DevTensor& a, const DevTensor& b, const DevTensor& d,
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

Status Lowering::lower_gemm(const std::string& op) {
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
  const bool split = eng.opt.split_misaligned_gemm && tensor_cores && a.shape.size() == 2 && b.shape.size() == 2 &&
                     beta == 0 && gn % per16 != 0 && gn > per16 &&
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

}  // namespace safeckpt::engine::detail
