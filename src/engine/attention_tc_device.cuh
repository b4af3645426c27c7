// src/engine/attention_tc_device.cuh — flash-style attention on the tensor
// cores for bfloat16 (sm_80 and later; safeckpt/engine.hpp "Attention"): the
// kernel and its dispatcher (dispatch_attention_tc, over a launch policy as
// in kernels_device.cuh). attention_tc.cu launches it on the device;
// tests/engine/test_kernels_host.cpp runs it under the host emulator, which
// models ldmatrix, mma.sync, cp.async and bar.sync (cuda_host_sim.hpp).
//
// Grid (B * H, ceil(L / 64)), 256 threads = two warp groups of 4 warps; a
// block owns 64 query rows (the last row blocks of every head first: under a
// causal mask they have the most keys), warp w of each group the rows 16w ..
// 16w+15. Group 0 takes the key tiles 0, 2, 4, ..., group 1 the tiles 1, 3,
// ... (half the sequential work of a block); at the end group 1 hands its
// (m, l, O) to group 0 through shared memory, which merges them (O and l
// rescaled by exp(m_i - max m)) and writes the rows. Per tile of 64 keys,
// staged in shared memory as bfloat16 (K and V rows as stored, zero beyond S
// and beyond D / Dv; double-buffered with cp.async, the next tile loading
// while this one is computed, when every row is 16-byte aligned), each warp
// keeps everything in registers, in the fragment layouts of PTX's
// mma.sync.m16n8k16 (bf16 inputs, fp32 accumulators; PTX ISA "Matrix
// Fragments for mma.m16n8k16"): lane l holds rows g = l / 4 and g + 8 of its
// 16, columns 2 (l % 4) and 2 (l % 4) + 1 of every 8-column tile.
//  1. scores S = Q K^T, 16 x 64 fp32 (Q's fragments loaded once; K's with
//     ldmatrix);
//  2. online softmax in fp32 (scale, causal / bool / additive mask and the
//     bounds applied here; the row max and sum over the 4 lanes that share a
//     row): the running max m and sum l, the output rescaled by
//     exp(m_old - m_new), the probabilities rounded to bfloat16 (as the
//     second GEMM of the materialized path and PyTorch's flash kernels use
//     them) — the accumulator layout of S is the A-operand layout of P V, so
//     P never leaves the registers;
//  3. O += P V (V's fragments with ldmatrix.trans).
// At the end each row is divided by l (a row whose keys are all masked: l = 0,
// zeros, as the CPU reference and math SDPA's _safe_softmax), to the output
// with its strides (AttnArgs::o_s).
//
// Shared memory (kD = 64 or 128, the smallest >= D and Dv; rows padded by 16
// bytes so that ldmatrix's eight row addresses fall in different banks): a Q
// tile, and per group two K and two V tiles, of 64 x (kD + 8) bf16: 81 KiB
// (kD 64, two blocks per SM) or 153 KiB (128).
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/attention_flash_common.cuh"
#include "engine/device_io.cuh"
#include "engine/internal.hpp"

namespace safeckpt::engine::detail {
namespace {

constexpr int kRows = 64;  // query rows per block
constexpr int kKeys = 64;  // keys per tile
constexpr int kWarps = kRows / 16;
constexpr int kGroupThreads = kWarps * 32;  // one warp group: 4 warps, the block's 64 rows
constexpr int kGroups = 2;                  // warp groups per block, each on every other key tile
constexpr int kThreads = kGroups * kGroupThreads;

template <int kD>
struct Layout {
  static constexpr int kLd = kD + 8;  // Q/K/V rows, bf16 elements (16-byte multiple)
  static constexpr int kQBytes = kRows * kLd * 2;
  static constexpr int kKBytes = kKeys * kLd * 2;
  static constexpr int kBytes = kQBytes + kGroups * 4 * kKBytes;  // Q, then per group K0 K1 V0 V1
  static_assert(kQBytes % 16 == 0 && kKBytes % 16 == 0, "16-byte aligned tiles");
};

// rows x kD bf16 tile from `src` (row r at src + r * row_stride, n_rows
// valid rows, n_cols valid columns), zeros elsewhere. 16-byte loads when
// `vec` (pointer, stride and n_cols multiples of 8 elements).
template <int kD>
__device__ __forceinline__ void load_tile(__nv_bfloat16* dst, const __nv_bfloat16* src, long long row_stride,
                                          long long n_rows, long long n_cols, bool vec, int tid, int nthreads) {
  constexpr int kLd = Layout<kD>::kLd;
  if (vec) {
    constexpr int kChunks = kD / 8;  // 8 bf16 per 16 bytes
    for (int i = tid; i < kRows * kChunks; i += nthreads) {
      const int r = i / kChunks, c = (i % kChunks) * 8;
      uint4 x = make_uint4(0u, 0u, 0u, 0u);
      if (r < n_rows && c < n_cols) x = *reinterpret_cast<const uint4*>(src + r * row_stride + c);
      *reinterpret_cast<uint4*>(dst + r * kLd + c) = x;
    }
    return;
  }
  for (int i = tid; i < kRows * kD; i += nthreads) {
    const int r = i / kD, c = i % kD;
    dst[r * kLd + c] = (r < n_rows && c < n_cols) ? src[r * row_stride + c] : __float2bfloat16_rn(0.f);
  }
}

// PTX's warp-level operations the kernel uses (cp.async:
// attention_flash_common.cuh): inline PTX on sm_80+, the host emulator's
// models under cuda_host_sim.hpp (SAFECKPT_HOST_SIM;
// tests/engine/test_kernels_host.cpp).
#if defined(SAFECKPT_HOST_SIM)
#define SAFECKPT_TC_BODY 1
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  cuda_host_sim::ldmatrix_x4(r, p, false);
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  cuda_host_sim::ldmatrix_x4(r, p, true);
}
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  cuda_host_sim::mma_m16n8k16_bf16(d, a, b0, b1);
}
__device__ __forceinline__ void named_barrier(unsigned id, unsigned count) {
  cuda_host_sim::named_barrier(id, count);
}
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SAFECKPT_TC_BODY 1
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  const auto a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  const auto a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
// d += a b: a 16x16 (row), b 16x8 (col), d 16x8 fp32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// bar.sync id, count (a barrier of `count` threads of the block).
__device__ __forceinline__ void named_barrier(unsigned id, unsigned count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count));
}
#endif

#ifdef SAFECKPT_TC_BODY
// The 16-byte cp.async loads of a tile (load_tile's `vec` case), committed as
// one group; completed by cp_async_wait.
template <int kD>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16* dst, const __nv_bfloat16* src, long long row_stride,
                                                long long n_rows, long long n_cols, int tid) {
  constexpr int kLd = Layout<kD>::kLd;
  constexpr int kChunks = kD / 8;
  for (int i = tid; i < kRows * kChunks; i += kGroupThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    const bool valid = r < n_rows && c < n_cols;
    cp_async_16(dst + r * kLd + c, valid ? src + r * row_stride + c : src, valid);
  }
  cp_async_commit();
}
// Two floats as a bfloat16 pair (lo in the low half), as mma.sync reads them.
__device__ __forceinline__ std::uint32_t pack_bf16(float lo, float hi) {
  return static_cast<std::uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         static_cast<std::uint32_t>(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}
#endif

// kMask: a.mask_kind (flash_softmax_tile).
template <int kD, int kMask>
__global__ void __launch_bounds__(kThreads, kD <= 64 ? 2 : 1) attention_tc_kernel(AttnArgs a) {
#ifdef SAFECKPT_TC_BODY
  using L = Layout<kD>;
  constexpr int kDT = kD / 16;                                // 16-wide k-steps of Q K^T, 16-wide column pairs of P V
  constexpr int kNT = kKeys / 8;                              // 8-key tiles of a score row block
  SAFECKPT_DYNAMIC_SHARED_ALIGNED(unsigned char, smem, 128);  // uint4, ldmatrix and cp.async need 16
  const int grp = static_cast<int>(threadIdx.x) / kGroupThreads, tid = static_cast<int>(threadIdx.x) % kGroupThreads;
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem);
  unsigned char* gsmem = smem + L::kQBytes + grp * 4 * L::kKBytes;
  auto* kbuf0 = reinterpret_cast<__nv_bfloat16*>(gsmem);
  auto* vbuf0 = reinterpret_cast<__nv_bfloat16*>(gsmem + 2 * L::kKBytes);
  constexpr int kTileElems = L::kKBytes / 2;
  const int warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  // This group's barrier (groups run different numbers of tiles).
  auto group_sync = [grp]() { named_barrier(static_cast<unsigned>(grp + 1), kGroupThreads); };

  const long long bh = blockIdx.x;
  const long long b = bh / a.H, h = bh % a.H;
  const long long row0 = static_cast<long long>(gridDim.y - 1 - blockIdx.y) * kRows;
  const auto* q = static_cast<const __nv_bfloat16*>(a.q);
  const auto* k = static_cast<const __nv_bfloat16*>(a.k);
  const auto* v = static_cast<const __nv_bfloat16*>(a.v);
  const __nv_bfloat16* qb = q + b * a.q_s[0] + h * a.q_s[1] + row0 * a.q_s[2];
  const __nv_bfloat16* kb = k + b * a.k_s[0] + h * a.k_s[1];
  const __nv_bfloat16* vb = v + b * a.v_s[0] + h * a.v_s[1];
  auto aligned = [](const void* p, long long s0, long long s1, long long s2, long long n) {
    return (reinterpret_cast<std::uintptr_t>(p) % 16 == 0) && s0 % 8 == 0 && s1 % 8 == 0 && s2 % 8 == 0 && n % 8 == 0;
  };
  const bool vq = aligned(q, a.q_s[0], a.q_s[1], a.q_s[2], a.D);
  const bool async = aligned(k, a.k_s[0], a.k_s[1], a.k_s[2], a.D) && aligned(v, a.v_s[0], a.v_s[1], a.v_s[2], a.Dv);

  long long s_end = a.S;
  if (a.causal) {  // PyTorch's tril (diagonal 0, top-left aligned): key j <= query row i
    const long long last_row = (row0 + kRows < a.L ? row0 + kRows : a.L) - 1;
    if (last_row + 1 < s_end) s_end = last_row + 1;
  }
  // Group grp takes the key tiles grp, grp + kGroups, ...
  const long long first = static_cast<long long>(grp) * kKeys;
  if (async && first < s_end) {
    load_tile_async<kD>(kbuf0, kb + first * a.k_s[2], a.k_s[2], a.S - first, a.D, tid);
    load_tile_async<kD>(vbuf0, vb + first * a.v_s[2], a.v_s[2], a.S - first, a.Dv, tid);
  }
  load_tile<kD>(qs, qb, a.q_s[2], a.L - row0, a.D, vq, static_cast<int>(threadIdx.x), kThreads);
  __syncthreads();
  const int d_steps = static_cast<int>((a.D + 15) / 16), dv_pairs = static_cast<int>((a.Dv + 15) / 16);
  // Q's A fragments: ldmatrix rows l % 16 of the warp's 16, columns 16 kk + 8 (l / 16).
  std::uint32_t qf[kDT][4];
  for (int kk = 0; kk < kDT; ++kk)
    ldmatrix_x4(qf[kk], qs + (warp * 16 + lane % 16) * L::kLd + kk * 16 + (lane / 16) * 8);

  const long long row_g = row0 + warp * 16 + g;  // this lane's rows: row_g and row_g + 8
  float o[kDT * 2][4];
  for (int n = 0; n < kDT * 2; ++n)
    for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const auto* madd = static_cast<const __nv_bfloat16*>(a.mask);
  const float scale2 = a.scale * kLog2e;
  int cur = 0;
  constexpr long long kStride = static_cast<long long>(kGroups) * kKeys;
  for (long long t0 = first; t0 < s_end; t0 += kStride, cur ^= 1) {
    const __nv_bfloat16* ks = kbuf0 + cur * kTileElems;
    const __nv_bfloat16* vs = vbuf0 + cur * kTileElems;
    const long long next = t0 + kStride;
    if (async) {
      if (next < s_end) {  // the next tile into the other buffer (its last readers passed the barrier below)
        load_tile_async<kD>(kbuf0 + (cur ^ 1) * kTileElems, kb + next * a.k_s[2], a.k_s[2], a.S - next, a.D, tid);
        load_tile_async<kD>(vbuf0 + (cur ^ 1) * kTileElems, vb + next * a.v_s[2], a.v_s[2], a.S - next, a.Dv, tid);
        cp_async_wait<2>();  // this tile's two groups are done, the next tile's two may be in flight
      } else {
        cp_async_wait<0>();
      }
    } else {
      load_tile<kD>(kbuf0 + cur * kTileElems, kb + t0 * a.k_s[2], a.k_s[2], a.S - t0, a.D, false, tid, kGroupThreads);
      load_tile<kD>(vbuf0 + cur * kTileElems, vb + t0 * a.v_s[2], a.v_s[2], a.S - t0, a.Dv, false, tid, kGroupThreads);
    }
    group_sync();
    // 1. S = Q K^T. ldmatrix x4 on K rows (keys) gives the B fragments of
    //    two 8-key tiles: lanes 0-7 / 8-15 / 16-23 / 24-31 address keys
    //    +0..7 / +0..7 / +8..15 / +8..15 at columns +0 / +8 / +0 / +8.
    float sc[kNT][4];
    for (int n = 0; n < kNT; ++n)
      for (int e = 0; e < 4; ++e) sc[n][e] = 0.f;
    for (int kk = 0; kk < kDT; ++kk) {
      if (kk >= d_steps) break;
      for (int np = 0; np < kNT / 2; ++np) {
        std::uint32_t bf[4];
        ldmatrix_x4(bf, ks + (np * 16 + lane % 8 + (lane / 16) * 8) * L::kLd + kk * 16 + ((lane / 8) % 2) * 8);
        mma_bf16(sc[2 * np], qf[kk], bf[0], bf[1]);
        mma_bf16(sc[2 * np + 1], qf[kk], bf[2], bf[3]);
      }
    }
    // 2. online softmax (sc becomes P in fp32; l sums it before rounding),
    //    P rounded to bfloat16 as the A fragments of P V, 16 keys per k-step.
    float corr[2];
    flash_softmax_tile<kNT, kMask>(sc, a, madd, b, h, t0, row_g, t, scale2, m, l, corr);
    std::uint32_t pa[kNT / 2][4];
    for (int n = 0; n < kNT; ++n) {
      pa[n / 2][(n % 2) * 2 + 0] = pack_bf16(sc[n][0], sc[n][1]);  // row g
      pa[n / 2][(n % 2) * 2 + 1] = pack_bf16(sc[n][2], sc[n][3]);  // row g + 8
    }
    for (int n = 0; n < kDT * 2; ++n)
      for (int e = 0; e < 4; ++e) o[n][e] *= corr[e / 2];
    // 3. O += P V. ldmatrix x4.trans on V rows (keys) gives the B fragments of
    //    two 8-column tiles: lanes 0-7 / 8-15 / 16-23 / 24-31 address keys
    //    +0..7 / +8..15 / +0..7 / +8..15 at columns +0 / +0 / +8 / +8.
    for (int j = 0; j < kNT / 2; ++j) {
      for (int np = 0; np < kDT; ++np) {
        if (np >= dv_pairs) break;
        std::uint32_t bf[4];
        ldmatrix_x4_trans(bf, vs + (j * 16 + lane % 8 + ((lane / 8) % 2) * 8) * L::kLd + np * 16 + (lane / 16) * 8);
        mma_bf16(o[2 * np], pa[j], bf[0], bf[1]);
        mma_bf16(o[2 * np + 1], pa[j], bf[2], bf[3]);
      }
    }
    group_sync();  // every warp of the group is done with this tile's K and V before the buffer is loaded again
  }
  // Group 1 hands its (m, l, O) to group 0 through its own tile buffers;
  // group 0 merges: m = max, O and l rescaled by exp2(m_i - m).
  constexpr int kVals = kDT * 8 + 4;  // o, then m[2], l[2]
  static_assert(kVals * kGroupThreads * 4 <= 4 * L::kKBytes, "the merge fits a group's buffers");
  static_assert(kGroups == 2, "the merge below is for two groups");
  __syncthreads();  // both groups are done with their buffers
  float* xfer = reinterpret_cast<float*>(smem + L::kQBytes + 4 * L::kKBytes);
  if (grp == 1) {
    for (int n = 0; n < kDT * 2; ++n)
      for (int e = 0; e < 4; ++e) xfer[(n * 4 + e) * kGroupThreads + tid] = o[n][e];
    for (int i = 0; i < 2; ++i) {
      xfer[(kDT * 8 + i) * kGroupThreads + tid] = m[i];
      xfer[(kDT * 8 + 2 + i) * kGroupThreads + tid] = l[i];
    }
  }
  __syncthreads();
  if (grp == 1) return;
  float f0[2], f1[2];
  for (int i = 0; i < 2; ++i) {
    const float m1 = xfer[(kDT * 8 + i) * kGroupThreads + tid], l1 = xfer[(kDT * 8 + 2 + i) * kGroupThreads + tid];
    const float mm = fmaxf(m[i], m1);
    f0[i] = m[i] == -INFINITY ? 0.f : exp2f(m[i] - mm);
    f1[i] = m1 == -INFINITY ? 0.f : exp2f(m1 - mm);
    l[i] = l[i] * f0[i] + l1 * f1[i];
  }
  for (int n = 0; n < kDT * 2; ++n)
    for (int e = 0; e < 4; ++e) o[n][e] = o[n][e] * f0[e / 2] + xfer[(n * 4 + e) * kGroupThreads + tid] * f1[e / 2];
  auto* out = static_cast<__nv_bfloat16*>(a.out);
  for (int i = 0; i < 2; ++i) {
    const long long row = row_g + 8 * i;
    if (row >= a.L) continue;
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    __nv_bfloat16* orow = out + b * a.o_s[0] + h * a.o_s[1] + row * a.o_s[2];
    for (int n = 0; n < kDT * 2; ++n)
      for (int e = 0; e < 2; ++e) {
        const long long d = n * 8 + 2 * t + e;
        if (d < a.Dv) orow[d] = __float2bfloat16_rn(o[n][i * 2 + e] * inv);
      }
  }
#else
  (void)a;
  __trap();  // never launched below sm_80 (the engine uses it on sm_80+ only)
#endif
}

template <class Launch>
int dispatch_attention_tc(Launch&& launch, const AttnArgs& a) {
  if (!a.bf16 || a.D > 128 || a.Dv > 128 || a.D <= 0 || a.Dv <= 0 || a.L <= 0 || a.B * a.H <= 0)
    return kLaunchInvalidValue;
  if (a.B * a.H > 0x7fffffffLL || (a.L + kRows - 1) / kRows > 65535) return kLaunchInvalidValue;  // grid
  static_assert(Layout<128>::kBytes <= 227 * 1024, "fits an sm_80+ block");
  const dim3 grid(static_cast<unsigned>(a.B * a.H), static_cast<unsigned>((a.L + kRows - 1) / kRows));
  const bool small = a.D <= 64 && a.Dv <= 64;
  const unsigned smem = small ? Layout<64>::kBytes : Layout<128>::kBytes;
  switch (a.mask_kind) {
    case 0:
      return launch(grid, dim3(kThreads), smem, small ? attention_tc_kernel<64, 0> : attention_tc_kernel<128, 0>, a);
    case 1:
      return launch(grid, dim3(kThreads), smem, small ? attention_tc_kernel<64, 1> : attention_tc_kernel<128, 1>, a);
    case 2:
      return launch(grid, dim3(kThreads), smem, small ? attention_tc_kernel<64, 2> : attention_tc_kernel<128, 2>, a);
    default: return kLaunchInvalidValue;
  }
}

}  // namespace
}  // namespace safeckpt::engine::detail
