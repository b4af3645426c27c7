// src/engine/attention.cpp — the attention lowering's decision (flash-style
// kernel or materialized scores, safeckpt/engine.hpp "Attention") and the
// strided-batched cuBLASLt GEMMs of the materialized path.
#include <cublasLt.h>

#include <algorithm>
#include <string>

#include "engine/runtime.hpp"
#include "util/bytes.hpp"

namespace safeckpt::engine::detail {

AttnChoice choose_attention(const AttnShape& s, std::uint64_t max_workspace_bytes) {
  AttnChoice c;
  if ((s.bf16 || s.fp32_tensor_cores) && s.tensor_cores && s.D > 0 && s.Dv > 0 && s.D <= 128 && s.Dv <= 128) {
    c.tensor_core_flash = true;
    return c;
  }
  if (max_workspace_bytes == 0 || s.B <= 0 || s.H <= 0 || s.L <= 0 || s.S <= 0 || s.H > kMaxAttnGemmBatch) return c;
  const std::uint64_t per_score = s.bf16 ? 6 : 4;  // fp32 score (+ bf16 probability)
  std::uint64_t one = 0;                           // workspace of one batch element
  if (!util::checked_mul(static_cast<std::uint64_t>(s.H), static_cast<std::uint64_t>(s.L), one) ||
      !util::checked_mul(one, static_cast<std::uint64_t>(s.S), one) || !util::checked_mul(one, per_score, one) ||
      one > max_workspace_bytes)
    return c;
  long long g = 1;
  if (s.batch_collapsible) {
    const auto fit = static_cast<long long>(std::min<std::uint64_t>(max_workspace_bytes / one, 1ull << 40));
    g = std::min({s.B, fit, kMaxAttnGemmBatch / s.H});
    while (g > 1 && s.B % g != 0) --g;
  }
  const std::uint64_t scores = one / per_score * static_cast<std::uint64_t>(g);  // elements of one group
  c.materialized = true;
  c.group_batches = g;
  c.groups = s.B / g;
  c.score_bytes = scores * 4;
  c.prob_bytes = s.bf16 ? scores * 2 : 0;
  return c;
}

Result<std::shared_ptr<GemmDesc>> make_batched_gemm(const EngineImpl& eng, cublasComputeType_t ct,
                                                    cublasOperation_t opa, cublasOperation_t opb, const LtMat& a,
                                                    const LtMat& b, const LtMat& d, std::int32_t batch) {
  auto lt_fail = [](const char* what, cublasStatus_t st) {
    return make_error(ErrorCode::kDevice,
                      std::string("cuBLASLt (attention) ") + what + ": " + cublasLtGetStatusString(st));
  };
  auto g = std::make_shared<GemmDesc>();
  cublasStatus_t st = cublasLtMatmulDescCreate(&g->op, ct, CUDA_R_32F);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_fail("MatmulDescCreate", st);
  cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof opa);
  cublasLtMatmulDescSetAttribute(g->op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof opb);
  auto layout = [&](cublasLtMatrixLayout_t* l, const LtMat& m) -> Status {
    cublasStatus_t s2 = cublasLtMatrixLayoutCreate(l, m.type, m.rows, m.cols, m.ld);
    if (s2 != CUBLAS_STATUS_SUCCESS) return lt_fail("MatrixLayoutCreate", s2);
    cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
    if (!m.pointer_array) {
      cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.batch_stride,
                                       sizeof m.batch_stride);
      return {};
    }
#if CUBLAS_VER_MAJOR >= 13
    const auto mode = static_cast<std::uint32_t>(CUBLASLT_BATCH_MODE_POINTER_ARRAY);
    s2 = cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode);
    if (s2 != CUBLAS_STATUS_SUCCESS) return lt_fail("pointer-array batch mode", s2);
    return {};
#else
    return lt_fail("pointer-array batch mode (built against cuBLASLt < 13)", CUBLAS_STATUS_NOT_SUPPORTED);
#endif
  };
  SAFECKPT_CHECK(layout(&g->la, a));
  SAFECKPT_CHECK(layout(&g->lb, b));
  SAFECKPT_CHECK(layout(&g->lc, d));
  if (eng.lt == nullptr) return g;  // dry plan: no algorithm is chosen, nothing runs
  cublasLtMatmulPreference_t pref = nullptr;
  st = cublasLtMatmulPreferenceCreate(&pref);
  if (st != CUBLAS_STATUS_SUCCESS) return lt_fail("MatmulPreferenceCreate", st);
  std::uint64_t ws = kWorkspaceBytes;
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
  // Pointers of later groups and head views need not be 256-byte aligned.
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &a.align, sizeof a.align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &b.align, sizeof b.align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &d.align, sizeof d.align);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &d.align, sizeof d.align);
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  st = cublasLtMatmulAlgoGetHeuristic(eng.lt, g->op, g->la, g->lb, g->lc, g->lc, pref, 1, &res, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0)
    return make_error(ErrorCode::kDevice,
                      std::string("cuBLASLt found no algorithm for attention (") + cublasLtGetStatusString(st) + ")");
  g->algo = res.algo;
  return g;
}

}  // namespace safeckpt::engine::detail
