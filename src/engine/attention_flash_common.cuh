// src/engine/attention_flash_common.cuh — what the two tensor-core flash
// attention kernels share (attention_tc_device.cuh: bfloat16;
// attention_tf32_device.cuh: float32 in 3xTF32): one key tile's online
// softmax in the layout of mma.sync's accumulators.
#pragma once

#include <cmath>

#include "engine/device_io.cuh"
#include "engine/internal.hpp"

namespace safeckpt::engine::detail {
namespace {

constexpr float kLog2e = 1.4426950408889634f;  // the kernels' softmax runs in log2 units

__device__ __forceinline__ float mask_value(const __nv_bfloat16* m, long long i) {
  return __bfloat162float(m[i]);
}
__device__ __forceinline__ float mask_value(const float* m, long long i) {
  return m[i];
}

// One tile of kNT x 8 keys from t0, for the lane (g, t) of mma.sync's
// accumulator layout: sc[n][e] is Q K^T of row row_g + 8 (e / 2) and key t0 +
// n * 8 + 2 t + e % 2. In log2 units (exp2 of scale2 = scale * log2(e) times
// the score): the bounds (rows past L, keys past S, causal: keys after the
// row) and the mask (bool, or additive of the input dtype `M`) applied; the
// running row max m and sum l updated (over the 4 lanes sharing a row);
// sc becomes P = exp2(x - m) (0 where masked), in fp32; corr is the factor
// for the rows' accumulated output (0 before the first finite score).
template <int kNT, class M>
__device__ __forceinline__ void flash_softmax_tile(float (&sc)[kNT][4], const AttnArgs& a, const M* madd, long long b,
                                                   long long h, long long t0, long long row_g, int t, float scale2,
                                                   float (&m)[2], float (&l)[2], float (&corr)[2]) {
  const auto* mb = static_cast<const unsigned char*>(a.mask);
  long long lim[2];  // keys t0 + c with c < lim are in range (causal: not above the row)
  for (int i = 0; i < 2; ++i) {
    const long long row = row_g + 8 * i;
    lim[i] = row >= a.L ? 0 : ((a.causal && row + 1 < a.S) ? row + 1 : a.S) - t0;
  }
  float mx[2] = {-INFINITY, -INFINITY};
  for (int n = 0; n < kNT; ++n)
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const int c = n * 8 + 2 * t + (e % 2);
      float x = sc[n][e] * scale2;
      if (c >= lim[i]) {
        x = -INFINITY;
      } else if (a.mask_kind != 0) {
        const long long key = t0 + c, row = row_g + 8 * i;
        const long long mi = b * a.m_s[0] + h * a.m_s[1] + row * a.m_s[2] + key * a.m_s[3];
        if (a.mask_kind == 1) {
          if (!mb[mi]) x = -INFINITY;
        } else {
          x += mask_value(madd, mi) * kLog2e;
        }
      }
      sc[n][e] = x;
      mx[i] = fmaxf(mx[i], x);
    }
  for (int i = 0; i < 2; ++i) {
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
    mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
    const float mnew = fmaxf(m[i], mx[i]);
    corr[i] = m[i] == -INFINITY ? 0.f : exp2f(m[i] - mnew);
    m[i] = mnew;
  }
  float rs[2] = {0.f, 0.f};
  for (int n = 0; n < kNT; ++n)
    for (int e = 0; e < 4; ++e) {
      sc[n][e] = sc[n][e] == -INFINITY ? 0.f : exp2f(sc[n][e] - m[e / 2]);
      rs[e / 2] += sc[n][e];
    }
  for (int i = 0; i < 2; ++i) {
    rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 1);
    rs[i] += __shfl_xor_sync(0xffffffffu, rs[i], 2);
    l[i] = l[i] * corr[i] + rs[i];
  }
}

}  // namespace
}  // namespace safeckpt::engine::detail
