// src/engine/attention_tf32_device.cuh — flash-style attention for float32
// on the tensor cores with 3xTF32 (sm_80 and later; safeckpt/engine.hpp
// "Attention", EngineOptions::attention_3xtf32): the kernel and its
// dispatcher, over a launch policy as in kernels_device.cuh.
// attention_tc.cu launches it on the device; tests/engine/test_kernels_host.cpp
// runs it under the host emulator (cuda_host_sim.hpp models mma.sync
// m16n8k8 tf32).
//
// 3xTF32 (CUTLASS's OpMultiplyAddFastF32, which PyTorch's memory-efficient
// attention uses for float32 on sm_80+: aten/src/ATen/native/transformers/
// cuda/mem_eff_attention/gemm_kernel_utils.h DefaultGemmType): each float x
// is split into big = x rounded to TF32 (10 mantissa bits) and small =
// x - big truncated to TF32 (split() below), and a * b is a_small b_big +
// a_big b_small + a_big b_big on the tensor cores (a_small b_small, about
// 2^-22 relative, dropped): float32 accuracy within a few ulps, unlike one
// TF32 product (2^-11).
//
// Grid (B * H, ceil(L / 64)), 128 threads = 4 warps; a block owns 64 query
// rows (the last row blocks first: under a causal mask they have the most
// keys), warp w the rows 16w .. 16w+15. Per tile of 32 keys, staged in
// shared memory as float32 (zeros beyond S and beyond D / Dv; for kD = 64
// double-buffered with cp.async, the next tile loading while this one is
// computed, when every row is 16-byte aligned):
//  1. S = Q K^T, 16 x 32 per warp: PTX mma.m16n8k8 tf32 fragments (PTX ISA
//     "Matrix Fragments for mma.m16n8k8"): A a0 = (g, t), a1 = (g + 8, t),
//     a2 = (g, t + 4), a3 = (g + 8, t + 4); B b0 = (t, g), b1 = (t + 4, g);
//     C c0, c1 = (g, 2t), (g, 2t + 1), c2, c3 = the same in row g + 8
//     (g = lane / 4, t = lane % 4), Q's and K's fragments read from shared
//     memory; a Q fragment is split once for the 4 key tiles it meets, a
//     K fragment per use;
//  2. online softmax in fp32 as the bfloat16 kernel (scale, causal / bool /
//     additive mask and the bounds applied here; probabilities kept in fp32);
//  3. O += P V: P's A fragments gathered from the accumulators of step 1
//     with warp shuffles (C's layout is not A's for k8) and split once for
//     every 8-column tile of V, V's B fragments from shared memory.
// Shared memory rows are padded (Q and K: kD + 4 floats, V: kD + 8) so that
// each fragment load's 32 addresses fall in 32 different banks: 52 KiB for
// kD = 64 (two K and V buffers; four blocks fit an SM), 67 KiB for 128 (one).
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/attention_flash_common.cuh"
#include "engine/device_io.cuh"
#include "engine/internal.hpp"

namespace safeckpt::engine::detail {
namespace {
namespace tf32x3 {

constexpr int kRows = 64;  // query rows per block
constexpr int kKeys = 32;  // keys per tile
constexpr int kThreads = (kRows / 16) * 32;

template <int kD>
struct Layout {
  static constexpr int kLdQK = kD + 4;  // = 4 mod 32: (g * ld + t) distinct banks
  static constexpr int kLdV = kD + 8;   // = 8 mod 32: (t * ld + g) distinct banks
  static constexpr int kQ = kRows * kLdQK, kK = kKeys * kLdQK, kV = kKeys * kLdV;
  static constexpr int kBufs = kD <= 64 ? 2 : 1;  // K + V buffers (2: the cp.async pipeline)
  static constexpr int kBytes = (kQ + kBufs * (kK + kV)) * 4;
  static_assert(kQ % 4 == 0 && kK % 4 == 0 && kV % 4 == 0 && kLdQK % 4 == 0 && kLdV % 4 == 0,
                "16-byte aligned tiles and rows for cp.async");
};

// rows x kD floats from `src` (row r at src + r * row_stride, n_rows valid
// rows, n_cols valid columns) into `dst` rows of `ld`, zeros elsewhere.
// 16-byte loads when `vec` (pointer, stride and n_cols multiples of 4).
template <int kD>
__device__ __forceinline__ void load_rows(float* dst, int ld, int rows, const float* src, long long row_stride,
                                          long long n_rows, long long n_cols, bool vec) {
  if (vec) {
    constexpr int kChunks = kD / 4;
    for (int i = static_cast<int>(threadIdx.x); i < rows * kChunks; i += kThreads) {
      const int r = i / kChunks, c = (i % kChunks) * 4;
      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
      if (r < n_rows && c < n_cols) x = *reinterpret_cast<const float4*>(src + r * row_stride + c);
      *reinterpret_cast<float4*>(dst + r * ld + c) = x;
    }
    return;
  }
  for (int i = static_cast<int>(threadIdx.x); i < rows * kD; i += kThreads) {
    const int r = i / kD, c = i % kD;
    dst[r * ld + c] = (r < n_rows && c < n_cols) ? src[r * row_stride + c] : 0.f;
  }
}

#if defined(SAFECKPT_HOST_SIM)
#define SAFECKPT_TF32_BODY 1
__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  cuda_host_sim::mma_m16n8k8_tf32(d, a, b0, b1);
}
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SAFECKPT_TF32_BODY 1
// d += a b: a 16x8 (row), b 8x8 (col), tf32 inputs, d 16x8 fp32.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#endif

#ifdef SAFECKPT_TF32_BODY
// load_rows' `vec` case (kD / 4 16-byte chunks a row) as cp.async copies,
// not committed (the caller commits K's and V's as one group).
template <int kD>
__device__ __forceinline__ void load_rows_async(float* dst, int ld, int rows, const float* src, long long row_stride,
                                                long long n_rows, long long n_cols) {
  constexpr int kChunks = kD / 4;
  for (int i = static_cast<int>(threadIdx.x); i < rows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 4;
    const bool valid = r < n_rows && c < n_cols;
    cp_async_16(dst + r * ld + c, valid ? src + r * row_stride + c : src, valid);
  }
}
// x as big + small TF32 parts, in integer ops (full rate; cvt.rna.tf32 is a
// conversion, issued at a fraction of that): big = x rounded to nearest,
// ties away (cvt.rna's value: half a TF32 ulp added to the bit pattern,
// then the low 13 bits cleared), small = x - big (exact) truncated to TF32,
// as CUTLASS's OpMultiplyAddFastF32 rounds them (round_half_ulp_truncate,
// round_toward_zero): |small| <= 2^-11 |x|, its truncation <= 2^-21 |x|.
// NaN and infinity: big may become an infinity or 0, small = x - big is then
// NaN, and the sum of the three products is NaN, as with cvt.rna.
__device__ __forceinline__ void split(float x, std::uint32_t& big, std::uint32_t& small) {
  big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
  small = __float_as_uint(x - __uint_as_float(big)) & 0xffffe000u;
}
// An A fragment as big and small TF32 parts: split once, used for every
// 8-column tile of B (the split is most of the work of a 3xTF32 product).
struct SplitA {
  std::uint32_t big[4], small[4];
};
__device__ __forceinline__ SplitA split_a(const float (&a)[4]) {
  SplitA s;
  for (int i = 0; i < 4; ++i) split(a[i], s.big[i], s.small[i]);
  return s;
}
// d += a b in 3xTF32 (the small products first).
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const SplitA& a, float b0, float b1) {
  std::uint32_t bb0, bs0, bb1, bs1;
  split(b0, bb0, bs0);
  split(b1, bb1, bs1);
  mma_tf32(d, a.small, bb0, bb1);
  mma_tf32(d, a.big, bs0, bs1);
  mma_tf32(d, a.big, bb0, bb1);
}
#endif

// kMask: a.mask_kind (flash_softmax_tile).
template <int kD, int kMask>
__global__ void __launch_bounds__(kThreads) attention_tf32x3_kernel(AttnArgs a) {
#ifdef SAFECKPT_TF32_BODY
  using L = Layout<kD>;
  constexpr int kDT = kD / 8;     // 8-wide k-steps of Q K^T, 8-column tiles of O
  constexpr int kNT = kKeys / 8;  // 8-key tiles of a score row block
  SAFECKPT_DYNAMIC_SHARED(float4, smem4);
  float* qs = reinterpret_cast<float*>(smem4);
  float* kv0 = qs + L::kQ;  // buffer i: K at kv0 + i * (kK + kV), V kK after it
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int g = lane / 4, t = lane % 4;

  const long long bh = blockIdx.x;
  const long long b = bh / a.H, h = bh % a.H;
  const long long row0 = static_cast<long long>(gridDim.y - 1 - blockIdx.y) * kRows;
  const auto* q = static_cast<const float*>(a.q);
  const auto* k = static_cast<const float*>(a.k);
  const auto* v = static_cast<const float*>(a.v);
  const float* qb = q + b * a.q_s[0] + h * a.q_s[1] + row0 * a.q_s[2];
  const float* kb = k + b * a.k_s[0] + h * a.k_s[1];
  const float* vb = v + b * a.v_s[0] + h * a.v_s[1];
  auto aligned = [](const void* p, long long s0, long long s1, long long s2, long long n) {
    return (reinterpret_cast<std::uintptr_t>(p) % 16 == 0) && s0 % 4 == 0 && s1 % 4 == 0 && s2 % 4 == 0 && n % 4 == 0;
  };
  const bool vq = aligned(q, a.q_s[0], a.q_s[1], a.q_s[2], a.D);
  const bool vk = aligned(k, a.k_s[0], a.k_s[1], a.k_s[2], a.D);
  const bool vv = aligned(v, a.v_s[0], a.v_s[1], a.v_s[2], a.Dv);

  long long s_end = a.S;
  if (a.causal) {  // PyTorch's tril (diagonal 0, top-left aligned): key j <= query row i
    const long long last_row = (row0 + kRows < a.L ? row0 + kRows : a.L) - 1;
    if (last_row + 1 < s_end) s_end = last_row + 1;
  }
  // The cp.async pipeline (two buffers, 16-byte rows): tile 0 now, tile
  // i + 1 at the start of tile i.
  const bool pipelined = L::kBufs == 2 && vk && vv;
  auto issue = [&](float* kdst, long long key0) {
    load_rows_async<kD>(kdst, L::kLdQK, kKeys, kb + key0 * a.k_s[2], a.k_s[2], a.S - key0, a.D);
    load_rows_async<kD>(kdst + L::kK, L::kLdV, kKeys, vb + key0 * a.v_s[2], a.v_s[2], a.S - key0, a.Dv);
    cp_async_commit();
  };
  if (pipelined && s_end > 0) issue(kv0, 0);
  load_rows<kD>(qs, L::kLdQK, kRows, qb, a.q_s[2], a.L - row0, a.D, vq);
  const int d_steps = static_cast<int>((a.D + 7) / 8), dv_tiles = static_cast<int>((a.Dv + 7) / 8);
  const float* qw = qs + warp * 16 * L::kLdQK;  // this warp's 16 rows

  const long long row_g = row0 + warp * 16 + g;  // this lane's rows: row_g and row_g + 8
  float o[kDT][4];
  for (int n = 0; n < kDT; ++n)
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const auto* madd = static_cast<const float*>(a.mask);
  const float scale2 = a.scale * kLog2e;
  int cur = 0;
  for (long long t0 = 0; t0 < s_end; t0 += kKeys) {
    float* ks = kv0 + cur * (L::kK + L::kV);
    float* vs = ks + L::kK;
    if (pipelined) {
      if (t0 + kKeys < s_end) {  // the next tile into the other buffer (its readers passed the barrier below)
        issue(kv0 + (cur ^ 1) * (L::kK + L::kV), t0 + kKeys);
        cp_async_wait<1>();  // this tile's group is done, the next one may be in flight
      } else {
        cp_async_wait<0>();
      }
      __syncthreads();  // every thread's copies of this tile landed (and, first, Q is stored)
    } else {
      __syncthreads();  // every warp is done with the previous tile (and, first, Q is stored)
      load_rows<kD>(ks, L::kLdQK, kKeys, kb + t0 * a.k_s[2], a.k_s[2], a.S - t0, a.D, vk);
      load_rows<kD>(vs, L::kLdV, kKeys, vb + t0 * a.v_s[2], a.v_s[2], a.S - t0, a.Dv, vv);
      __syncthreads();
    }
    // 1. S = Q K^T.
    float sc[kNT][4];
    for (int n = 0; n < kNT; ++n)
      for (int e = 0; e < 4; ++e) sc[n][e] = 0.f;
    for (int kk = 0; kk < kDT; ++kk) {
      if (kk >= d_steps) break;
      const float af[4] = {qw[g * L::kLdQK + kk * 8 + t], qw[(g + 8) * L::kLdQK + kk * 8 + t],
                           qw[g * L::kLdQK + kk * 8 + t + 4], qw[(g + 8) * L::kLdQK + kk * 8 + t + 4]};
      const SplitA as = split_a(af);
      for (int n = 0; n < kNT; ++n) {
        const float* kr = ks + (n * 8 + g) * L::kLdQK + kk * 8;
        mma_3xtf32(sc[n], as, kr[t], kr[t + 4]);
      }
    }
    // 2. online softmax (sc becomes P, in fp32).
    float corr[2];
    flash_softmax_tile<kNT, kMask>(sc, a, madd, b, h, t0, row_g, t, scale2, m, l, corr);
    for (int n = 0; n < kDT; ++n)
      for (int e = 0; e < 4; ++e) o[n][e] *= corr[e / 2];
    // 3. O += P V, 8 keys per k-step. P's A fragment for keys 8j..8j+7:
    //    (row, key t) is element t % 2 of lane (g, t / 2)'s tile j, key t + 4
    //    of lane (g, 2 + t / 2) (rows g + 8: elements 2 and 3).
    const int src_lo = g * 4 + t / 2, src_hi = src_lo + 2;
    const bool odd = (t % 2) != 0;
    for (int j = 0; j < kNT; ++j) {
      float pa[4];
      for (int r = 0; r < 2; ++r) {  // r = 0: row g (a0, a2); 1: row g + 8 (a1, a3)
        const float lo0 = __shfl_sync(0xffffffffu, sc[j][2 * r], src_lo);
        const float lo1 = __shfl_sync(0xffffffffu, sc[j][2 * r + 1], src_lo);
        const float hi0 = __shfl_sync(0xffffffffu, sc[j][2 * r], src_hi);
        const float hi1 = __shfl_sync(0xffffffffu, sc[j][2 * r + 1], src_hi);
        pa[r] = odd ? lo1 : lo0;
        pa[r + 2] = odd ? hi1 : hi0;
      }
      const SplitA ps = split_a(pa);
      const float* v0 = vs + (j * 8 + t) * L::kLdV;
      const float* v1 = vs + (j * 8 + t + 4) * L::kLdV;
      for (int n = 0; n < kDT; ++n) {
        if (n >= dv_tiles) break;
        mma_3xtf32(o[n], ps, v0[n * 8 + g], v1[n * 8 + g]);
      }
    }
    if (pipelined) {
      __syncthreads();  // every warp is done with this buffer before the tile after next loads into it
      cur ^= 1;
    }
  }
  // Each row divided by l (a row whose keys are all masked: l = 0, zeros, as
  // the CPU reference and math SDPA's _safe_softmax), to the output.
  auto* out = static_cast<float*>(a.out);
  for (int i = 0; i < 2; ++i) {
    const long long row = row_g + 8 * i;
    if (row >= a.L) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    float* orow = out + b * a.o_s[0] + h * a.o_s[1] + row * a.o_s[2];
    for (int n = 0; n < kDT; ++n)
      for (int e = 0; e < 2; ++e) {
        const long long d = n * 8 + 2 * t + e;
        if (d < a.Dv) orow[d] = o[n][i * 2 + e] * inv;
      }
  }
#else
  (void)a;
  __trap();  // never launched below sm_80 (the engine uses it on sm_80+ only)
#endif
}

}  // namespace tf32x3

template <class Launch>
int dispatch_attention_tf32x3(Launch&& launch, const AttnArgs& a) {
  using tf32x3::kRows;
  if (a.bf16 || a.D > 128 || a.Dv > 128 || a.D <= 0 || a.Dv <= 0 || a.L <= 0 || a.B * a.H <= 0)
    return kLaunchInvalidValue;
  if (a.B * a.H > 0x7fffffffLL || (a.L + kRows - 1) / kRows > 65535) return kLaunchInvalidValue;  // grid
  const dim3 grid(static_cast<unsigned>(a.B * a.H), static_cast<unsigned>((a.L + kRows - 1) / kRows));
  const dim3 block(tf32x3::kThreads);
  using tf32x3::attention_tf32x3_kernel;
  const bool small = a.D <= 64 && a.Dv <= 64;
  const unsigned smem = small ? tf32x3::Layout<64>::kBytes : tf32x3::Layout<128>::kBytes;
  switch (a.mask_kind) {
    case 0:
      return launch(grid, block, smem, small ? attention_tf32x3_kernel<64, 0> : attention_tf32x3_kernel<128, 0>, a);
    case 1:
      return launch(grid, block, smem, small ? attention_tf32x3_kernel<64, 1> : attention_tf32x3_kernel<128, 1>, a);
    case 2:
      return launch(grid, block, smem, small ? attention_tf32x3_kernel<64, 2> : attention_tf32x3_kernel<128, 2>, a);
    default: return kLaunchInvalidValue;
  }
}

}  // namespace
}  // namespace safeckpt::engine::detail
