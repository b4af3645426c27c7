// src/engine/attention_flash_common.cuh — what the two tensor-core flash
// attention kernels share (attention_tc_device.cuh: bfloat16;
// attention_tf32_device.cuh: float32 in 3xTF32): cp.async, and one key
// tile's online softmax in the layout of mma.sync's accumulators.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/device_io.cuh"
#include "engine/internal.hpp"

namespace safeckpt::engine::detail {
namespace {

constexpr float kLog2e = 1.4426950408889634f;                // the kernels' softmax runs in log2 units
constexpr float kLowestFloat = -3.40282346638528859812e38f;  // -FLT_MAX

// cp.async (PTX ISA "cp.async", sm_80+): 16 bytes global -> shared without
// passing through registers, zero-filled when !valid (src-size 0), in
// groups a thread commits and waits for. Inline PTX on sm_80+; the host
// emulator's model under cuda_host_sim.hpp (SAFECKPT_HOST_SIM), which can
// land each copy at its issue or only at the wait.
#if defined(SAFECKPT_HOST_SIM)
#define SAFECKPT_CP_ASYNC 1
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  cuda_host_sim::cp_async_16(dst, src, valid);
}
__device__ __forceinline__ void cp_async_commit() {
  cuda_host_sim::cp_async_commit();
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  cuda_host_sim::cp_async_wait(kPending);
}
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SAFECKPT_CP_ASYNC 1
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const auto to = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most kPending cp.async groups of this thread are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}
#endif

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
//
// kMask is a.mask_kind (0 none, 1 bool, 2 additive), a template argument:
// each kernel is instantiated per kind (its dispatcher picks one), so a
// plan without a mask carries no mask code and no registers for it. The tile's mask
// values are loaded first, all of them, from indices clamped into the mask
// (the bounds decide afterwards), as one run of independent loads: a branch
// per element around each load made every load wait for the one before it
// (kNT * 4 round trips to memory per tile instead of about one). A bool
// mask's values are kept as one bit each.
template <int kNT, int kMask, class M>
__device__ __forceinline__ void flash_softmax_tile(float (&sc)[kNT][4], const AttnArgs& a, const M* madd, long long b,
                                                   long long h, long long t0, long long row_g, int t, float scale2,
                                                   float (&m)[2], float (&l)[2], float (&corr)[2]) {
  static_assert(kNT * 4 <= 32, "a bool mask's tile fits one 32-bit word per lane");
  long long lim[2];  // keys t0 + c with c < lim are in range (causal: not above the row)
  for (int i = 0; i < 2; ++i) {
    const long long row = row_g + 8 * i;
    lim[i] = row >= a.L ? 0 : ((a.causal && row + 1 < a.S) ? row + 1 : a.S) - t0;
  }
  std::uint32_t keep = 0;             // bool: bit n * 4 + e set where the mask keeps element (n, e)
  float mv[kMask == 2 ? kNT : 1][4];  // additive: the value (not yet in log2 units)
  if constexpr (kMask != 0) {
    long long base[2];
    for (int i = 0; i < 2; ++i) {
      const long long row = row_g + 8 * i < a.L ? row_g + 8 * i : a.L - 1;
      base[i] = b * a.m_s[0] + h * a.m_s[1] + row * a.m_s[2];
    }
    const long long k0 = t0 + 2 * t, last = a.S - 1;
    for (int n = 0; n < kNT; ++n)
      for (int e = 0; e < 4; ++e) {
        const long long key = k0 + n * 8 + (e % 2);
        const long long mi = base[e / 2] + (key < last ? key : last) * a.m_s[3];
        if constexpr (kMask == 1) {
          keep |= (static_cast<const unsigned char*>(a.mask)[mi] != 0 ? 1u : 0u) << (n * 4 + e);
        } else {
          mv[n][e] = mask_value(madd, mi);
        }
      }
  }
  float mx[2] = {-INFINITY, -INFINITY};
  for (int n = 0; n < kNT; ++n)
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const int c = n * 8 + 2 * t + (e % 2);
      float x = sc[n][e] * scale2;
      if constexpr (kMask == 1) {
        x = (keep >> (n * 4 + e)) & 1u ? x : -INFINITY;
      } else if constexpr (kMask == 2) {
        // A finite mask value stays finite: finfo.min (HF's additive
        // padding masks) times log2(e) would overflow to -inf and make a
        // row whose every key has it a row of zeros, where PyTorch (math
        // SDPA, adding in the scores' own units; its flash and
        // memory-efficient kernels subtract the row max first) gives every
        // key the same weight: the mean of V. Only -inf masks a key out.
        const float y = x + mv[n][e] * kLog2e;
        x = y == -INFINITY && mv[n][e] != -INFINITY ? kLowestFloat : y;
      }
      x = c >= lim[i] ? -INFINITY : x;
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
