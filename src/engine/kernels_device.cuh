// src/engine/kernels_device.cuh — the device code of kernels.cu: the fixed
// kernels (flash-style attention, the materialized attention's softmax, layer
// norm, softmax over the last dimension, reductions, embedding, gather /
// index.Tensor with device-side bounds checks, cuBLASLt's pointer arrays) and, per kernel family, the
// host-side choice of kernel and launch geometry (`dispatch_*`), written over
// a launch policy: kernels.cu passes CudaLaunch (device_io.cuh), and
// tests/engine/test_kernels_host.cpp compiles this file as host C++ behind
// its SIMT emulator (tests/engine/cuda_host_sim.hpp) and passes the
// emulator's launcher, so CI (no GPU) runs the same kernels with the same
// grids. Every kernel computes in fp32 and stores the value's dtype (float32
// or bfloat16, round to nearest even).
//
// A launch policy is a callable
//   int launch(dim3 grid, dim3 block, unsigned dynamic_smem_bytes,
//              void (*kernel)(P...), A... args)
// returning a cudaError_t value (0 = success).
// Included once per translation unit (internal linkage).
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/device_io.cuh"
#include "engine/internal.hpp"

namespace safeckpt::engine::detail {
namespace {

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Block-wide sum over blockDim.x threads (a multiple of 32, <= 1024).
__device__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) scratch[w] = v;
  __syncthreads();
  int nw = blockDim.x / 32;
  float t = l < nw ? scratch[l] : 0.f;
  return warp_sum(t);
}
__device__ float block_max(float v, float* scratch) {
  v = warp_max(v);
  int w = threadIdx.x / 32, l = threadIdx.x % 32;
  __syncthreads();
  if (l == 0) scratch[w] = v;
  __syncthreads();
  int nw = blockDim.x / 32;
  float t = l < nw ? scratch[l] : -INFINITY;
  return warp_max(t);
}

// ------------------------------------------------------------- attention
// Flash-style (online softmax, no score workspace), fp32 arithmetic on the
// CUDA cores for both dtypes. Grid (ceil(L / 64), B * H), 256 threads as a
// 16 x 16 grid (tx = threadIdx.x % 16, ty = threadIdx.x / 16): a block owns
// 64 query rows, thread (ty, tx) the rows ty*4 .. ty*4+3 of it. Per tile of
// 64 keys, staged in shared memory (K transposed, V as is): each thread
// computes a 4 x 4 block of scores (keys tx*4 .. tx*4+3) from float4 reads,
// the row max / sum go over the 16 threads of a row (shuffles within 16
// lanes), the probabilities go through shared memory (in the K tile's place)
// and each thread accumulates 4 rows x (4 or 8) output columns
// (tx*4 + 64*c). Shared memory: Q^T, K^T and V tiles of kHeadCap x 64 floats
// (kHeadCap = 64 or 128, the smallest >= D and Dv; the K tile's region at
// least 64 x kPStride): 49 or 96 KiB, so 4 or 2 blocks per SM on an H200.
constexpr int kBlockRows = 64;
constexpr int kBlockKeys = 64;
constexpr int kMaxHead = 128;
constexpr int kPStride = kBlockKeys + 4;  // probability rows: float4-aligned, two rows of a warp in other banks
// Floats of the k^T tile's region, which holds the probabilities after the scores.
__host__ __device__ constexpr int ks_floats(int head_cap) {
  return head_cap * kBlockKeys > kBlockKeys * kPStride ? head_cap * kBlockKeys : kBlockKeys * kPStride;
}
constexpr int attention_smem_bytes(int head_cap) {
  return (head_cap * kBlockRows + ks_floats(head_cap) + kBlockKeys * head_cap) * static_cast<int>(sizeof(float));
}

template <int kHeadCap>
__global__ void __launch_bounds__(256) attention_kernel(AttnArgs a) {
  SAFECKPT_DYNAMIC_SHARED(float4, smem4);
  float* smem = reinterpret_cast<float*>(smem4);
  float* qs = smem;                        // [kHeadCap][64]: q^T, pre-scaled
  float* ks = qs + kHeadCap * kBlockRows;  // [kHeadCap][64]: k^T; then the probabilities [64][kPStride]
  float* vs = ks + ks_floats(kHeadCap);    // [64][kHeadCap]
  constexpr int kCols = kHeadCap / 16;     // output columns per thread
  const int tx = static_cast<int>(threadIdx.x % 16), ty = static_cast<int>(threadIdx.x / 16);
  const long long bh = blockIdx.y;
  const long long b = bh / a.H, h = bh % a.H;
  const long long row0 = static_cast<long long>(blockIdx.x) * kBlockRows;
  const long long D = a.D, Dv = a.Dv;
  const long long qbase = b * a.q_s[0] + h * a.q_s[1], kbase = b * a.k_s[0] + h * a.k_s[1],
                  vbase = b * a.v_s[0] + h * a.v_s[1];
  // q^T: consecutive threads take consecutive rows of one column (conflict-free stores).
  for (int i = static_cast<int>(threadIdx.x); i < kHeadCap * kBlockRows; i += 256) {
    const int d = i / kBlockRows, r = i % kBlockRows;
    const long long row = row0 + r;
    qs[i] = (row < a.L && d < D) ? ld(a.q, qbase + row * a.q_s[2] + d, a.bf16) * a.scale : 0.f;
  }
  float m[4], l[4], acc[4][kCols];
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.f;
    for (int c = 0; c < kCols; ++c) acc[i][c] = 0.f;
  }
  long long s_end = a.S;
  if (a.causal) {  // PyTorch's tril (diagonal 0, top-left aligned): key j <= query row i
    const long long last_row = (row0 + kBlockRows < a.L ? row0 + kBlockRows : a.L) - 1;
    if (last_row + 1 < s_end) s_end = last_row + 1;
  }
  const auto* mb = static_cast<const unsigned char*>(a.mask);
  for (long long t0 = 0; t0 < s_end; t0 += kBlockKeys) {
    __syncthreads();  // the previous tile's probabilities and V are consumed
    for (int i = static_cast<int>(threadIdx.x); i < kHeadCap * kBlockKeys; i += 256) {
      const int d = i / kBlockKeys, j = i % kBlockKeys;
      const long long key = t0 + j;
      ks[i] = (key < a.S && d < D) ? ld(a.k, kbase + key * a.k_s[2] + d, a.bf16) : 0.f;
    }
    for (int i = static_cast<int>(threadIdx.x); i < kBlockKeys * kHeadCap; i += 256) {
      const int j = i / kHeadCap, d = i % kHeadCap;
      const long long key = t0 + j;
      vs[i] = (key < a.S && d < Dv) ? ld(a.v, vbase + key * a.v_s[2] + d, a.bf16) : 0.f;
    }
    __syncthreads();
    float sc[4][4];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) sc[i][j] = 0.f;
    for (long long d = 0; d < D; ++d) {
      const float4 qv = *reinterpret_cast<const float4*>(qs + d * kBlockRows + ty * 4);
      const float4 kv = *reinterpret_cast<const float4*>(ks + d * kBlockKeys + tx * 4);
      const float qa[4] = {qv.x, qv.y, qv.z, qv.w}, ka[4] = {kv.x, kv.y, kv.z, kv.w};
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) sc[i][j] += qa[i] * ka[j];
    }
    // The tile's mask values first, as one run of independent loads from
    // indices clamped into the mask (attention_flash_common.cuh
    // flash_softmax_tile: a load per branch waits for the one before it).
    float mv[4][4];  // bool: 1 kept, 0 dropped; additive: the value
    if (a.mask_kind != 0) {
      long long mrow[4], mkey[4];
      for (int i = 0; i < 4; ++i) {
        const long long row = row0 + ty * 4 + i, key = t0 + tx * 4 + i;
        mrow[i] = b * a.m_s[0] + h * a.m_s[1] + (row < a.L ? row : a.L - 1) * a.m_s[2];
        mkey[i] = (key < a.S ? key : a.S - 1) * a.m_s[3];
      }
      if (a.mask_kind == 1) {
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) mv[i][j] = mb[mrow[i] + mkey[j]] != 0 ? 1.f : 0.f;
      } else {
        for (int i = 0; i < 4; ++i)
          for (int j = 0; j < 4; ++j) mv[i][j] = ld(a.mask, mrow[i] + mkey[j], a.bf16);
      }
    }
    float p[4][4];
    for (int i = 0; i < 4; ++i) {
      const long long row = row0 + ty * 4 + i;
      float tmax = -INFINITY;
      for (int j = 0; j < 4; ++j) {
        const long long key = t0 + tx * 4 + j;
        float s = sc[i][j];
        if (a.mask_kind == 1) {
          s = mv[i][j] != 0.f ? s : -INFINITY;
        } else if (a.mask_kind == 2) {
          s += mv[i][j];
        }
        if (row >= a.L || key >= a.S || (a.causal && key > row)) s = -INFINITY;
        sc[i][j] = s;
        tmax = fmaxf(tmax, s);
      }
      for (int o = 8; o > 0; o >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, o));
      const float mnew = fmaxf(m[i], tmax);
      float rs = 0.f;
      for (int j = 0; j < 4; ++j) {
        p[i][j] = sc[i][j] == -INFINITY ? 0.f : expf(sc[i][j] - mnew);
        rs += p[i][j];
      }
      for (int o = 8; o > 0; o >>= 1) rs += __shfl_xor_sync(0xffffffffu, rs, o);
      const float corr = m[i] == -INFINITY ? 0.f : expf(m[i] - mnew);
      l[i] = l[i] * corr + rs;
      for (int c = 0; c < kCols; ++c) acc[i][c] *= corr;
      m[i] = mnew;
    }
    __syncthreads();  // every thread is done reading k^T: the probabilities go there
    float* ps = ks;
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<float4*>(ps + (ty * 4 + i) * kPStride + tx * 4) =
          make_float4(p[i][0], p[i][1], p[i][2], p[i][3]);
    __syncthreads();
    const long long n_keys = (s_end - t0 < kBlockKeys) ? s_end - t0 : kBlockKeys;
    for (int k4 = 0; k4 * 4 < n_keys; ++k4) {
      float pr[4][4];
      for (int i = 0; i < 4; ++i) {
        const float4 x = *reinterpret_cast<const float4*>(ps + (ty * 4 + i) * kPStride + k4 * 4);
        pr[i][0] = x.x;
        pr[i][1] = x.y;
        pr[i][2] = x.z;
        pr[i][3] = x.w;
      }
      for (int kk = 0; kk < 4; ++kk) {
        const float* vrow = vs + (k4 * 4 + kk) * kHeadCap + tx * 4;
        for (int cg = 0; cg < kCols / 4; ++cg) {
          const float4 vv = *reinterpret_cast<const float4*>(vrow + cg * 64);
          for (int i = 0; i < 4; ++i) {
            acc[i][cg * 4 + 0] += pr[i][kk] * vv.x;
            acc[i][cg * 4 + 1] += pr[i][kk] * vv.y;
            acc[i][cg * 4 + 2] += pr[i][kk] * vv.z;
            acc[i][cg * 4 + 3] += pr[i][kk] * vv.w;
          }
        }
      }
    }
  }
  for (int i = 0; i < 4; ++i) {
    const long long row = row0 + ty * 4 + i;
    if (row >= a.L) continue;
    // Every key masked (l = 0): zeros, as the CPU reference (and math SDPA's _safe_softmax).
    const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
    for (int cg = 0; cg < kCols / 4; ++cg)
      for (int j = 0; j < 4; ++j) {
        const long long d = cg * 64 + tx * 4 + j;
        if (d < Dv) st(a.out, b * a.o_s[0] + h * a.o_s[1] + row * a.o_s[2] + d, acc[i][cg * 4 + j] * inv, a.bf16);
      }
  }
}

// --------------------------------------- attention, materialized scores
// A score row's limits (AttnSoftmaxArgs): keys after `last` are masked
// (causal) and never read; P V reads keys [0, kn) of row l: its causal row
// block's keys.
__device__ __forceinline__ long long softmax_last_key(const AttnSoftmaxArgs& a, long long l) {
  return a.causal ? (l < a.S - 1 ? l : a.S - 1) : a.S - 1;
}
__device__ __forceinline__ long long softmax_keys_written(const AttnSoftmaxArgs& a, long long l) {
  if (!a.causal) return a.S;
  const long long br = a.block_rows > 0 ? a.block_rows : a.L;
  long long r1 = (l / br + 1) * br;
  if (r1 > a.L) r1 = a.L;
  return r1 < a.S ? r1 : a.S;
}

// Rows of more than 1024 keys (attention_softmax_warp_kernel below takes the
// others): one block per score row (scale already applied by the Q K^T GEMM): mask,
// max, sum of exp, probabilities. Each thread touches the same columns in
// every pass, so the in-place float32 case needs no extra barrier. A causal
// row reads its scores up to the diagonal only (the masked ones are never
// computed past the row block's keys), and writes probabilities for the
// keys its row block's P V reads: zeros from the diagonal to there.
__global__ void attention_softmax_kernel(AttnSoftmaxArgs a) {
  __shared__ float scratch[32];
  const long long r = blockIdx.x;
  const long long l = r % a.L, bh = r / a.L;
  const long long b = a.b0 + bh / a.H, h = bh % a.H;
  float* row = a.scores + r * a.S;
  const long long last = softmax_last_key(a, l), kn = softmax_keys_written(a, l);
  const auto* mb = static_cast<const unsigned char*>(a.mask);
  const long long mrow = b * a.m_s[0] + h * a.m_s[1] + l * a.m_s[2];
  float mx = -INFINITY;
  for (long long s = threadIdx.x; s <= last; s += blockDim.x) {
    float x = row[s];
    if (a.mask_kind != 0) {
      if (a.mask_kind == 1 && !mb[mrow + s * a.m_s[3]]) x = -INFINITY;
      if (a.mask_kind == 2) x += ld(a.mask, mrow + s * a.m_s[3], a.mask_bf16);
      row[s] = x;
    }
    mx = fmaxf(mx, x);
  }
  mx = block_max(mx, scratch);
  float sum = 0.f;
  if (mx != -INFINITY)
    for (long long s = threadIdx.x; s <= last; s += blockDim.x) sum += expf(row[s] - mx);
  sum = block_sum(sum, scratch);
  const float inv = mx == -INFINITY ? 0.f : 1.f / sum;
  for (long long s = threadIdx.x; s < kn; s += blockDim.x) {
    const float p = (mx == -INFINITY || s > last) ? 0.f : expf(row[s] - mx) * inv;
    if (a.probs_bf16)
      static_cast<__nv_bfloat16*>(a.probs)[r * a.S + s] = __float2bfloat16_rn(p);
    else
      static_cast<float*>(a.probs)[r * a.S + s] = p;
  }
}

// Rows of up to kChunks * 128 keys: one warp per row, the row in registers
// (lane l holds keys c * 128 + 4 l .. + 3 of chunk c), so it is read once
// and written once (the block kernel above reads it three times); the same
// semantics. `vec`: S a multiple of 4 and both buffers 16-byte aligned
// (float4 reads, float4 / 8-byte bfloat16 writes), else element by element.
constexpr int kSoftmaxWarpRows = 8;  // rows (warps) per block
template <int kChunks>
__global__ void __launch_bounds__(32 * kSoftmaxWarpRows) attention_softmax_warp_kernel(AttnSoftmaxArgs a, int vec) {
  const long long r = static_cast<long long>(blockIdx.x) * kSoftmaxWarpRows + threadIdx.x / 32;
  if (r >= a.rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const long long l = r % a.L, bh = r / a.L;
  const long long b = a.b0 + bh / a.H, h = bh % a.H;
  const float* row = a.scores + r * a.S;
  const long long last = softmax_last_key(a, l), kn = softmax_keys_written(a, l);
  const auto* mb = static_cast<const unsigned char*>(a.mask);
  const long long mrow = b * a.m_s[0] + h * a.m_s[1] + l * a.m_s[2];
  float x[kChunks][4];
  float mx = -INFINITY;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const long long s0 = static_cast<long long>(c * 32 + lane) * 4;
    if (vec && s0 <= last) {  // s0 + 3 < S: S is a multiple of 4
      const float4 v = *reinterpret_cast<const float4*>(row + s0);
      x[c][0] = v.x, x[c][1] = v.y, x[c][2] = v.z, x[c][3] = v.w;
    } else {
#pragma unroll
      for (int e = 0; e < 4; ++e) x[c][e] = s0 + e <= last ? row[s0 + e] : -INFINITY;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const long long s = s0 + e;
      if (s > last) {
        x[c][e] = -INFINITY;
      } else if (a.mask_kind == 1) {
        if (!mb[mrow + s * a.m_s[3]]) x[c][e] = -INFINITY;
      } else if (a.mask_kind == 2) {
        x[c][e] += ld(a.mask, mrow + s * a.m_s[3], a.mask_bf16);
      }
      mx = fmaxf(mx, x[c][e]);
    }
  }
  mx = warp_max(mx);
  float sum = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      x[c][e] = (mx == -INFINITY || x[c][e] == -INFINITY) ? 0.f : expf(x[c][e] - mx);
      sum += x[c][e];
    }
  sum = warp_sum(sum);
  const float inv = mx == -INFINITY ? 0.f : 1.f / sum;
  auto* pf = static_cast<float*>(a.probs) + r * a.S;
  auto* pb = static_cast<__nv_bfloat16*>(a.probs) + r * a.S;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const long long s0 = static_cast<long long>(c * 32 + lane) * 4;
    float p[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) p[e] = x[c][e] * inv;  // masked and past `last`: 0
    if (vec && s0 + 3 < kn) {
      if (a.probs_bf16) {
        uint2 u;
        u.x = static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(p[0]))) |
              static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(p[1]))) << 16;
        u.y = static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(p[2]))) |
              static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(p[3]))) << 16;
        *reinterpret_cast<uint2*>(pb + s0) = u;
      } else {
        *reinterpret_cast<float4*>(pf + s0) = make_float4(p[0], p[1], p[2], p[3]);
      }
      continue;
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const long long s = s0 + e;
      if (s >= kn) break;
      if (a.probs_bf16)
        pb[s] = __float2bfloat16_rn(p[e]);
      else
        pf[s] = p[e];
    }
  }
}

// ------------------------------------- attention mask as cuDNN's bias
// A warp per mask row (kBiasWarpRows rows a block), lanes over the keys:
// bias bits written as read (additive) or 0 / -inf (bool), and whether a
// key the row may see is kept (a warp vote through warp_max). Finite
// additive values below -2^123 are written as -2^123: finfo.min (HF's
// padding masks) plus a score, scaled into log2 units, would overflow to
// -inf, and a row whose every key has it would lose the same-weight answer
// PyTorch gives (the mean of V; attention_flash_common.cuh). -2^123 still
// makes any key beside a real one weigh exp(-1e37): nothing.
constexpr int kBiasWarpRows = 8;
constexpr unsigned short kBf16NegInf = 0xff80;
constexpr unsigned short kBf16BiasFloor = 0xfd00;  // -2^123
__global__ void __launch_bounds__(32 * kBiasWarpRows) attention_bias_kernel(AttnBiasArgs a) {
  const long long rows = a.Bb * a.Hb * a.L;
  const long long r = static_cast<long long>(blockIdx.x) * kBiasWarpRows + threadIdx.x / 32;
  if (r >= rows) return;  // whole warps: the vote below has every lane of a live warp
  const int lane = static_cast<int>(threadIdx.x % 32);
  const long long l = r % a.L, h = (r / a.L) % a.Hb, b = r / (a.L * a.Hb);
  const long long base = b * a.m_s[0] + h * a.m_s[1] + l * a.m_s[2];
  const long long seen = a.causal && l + 1 < a.S ? l + 1 : a.S;  // keys the row may see
  auto* out = static_cast<unsigned short*>(a.bias) + r * a.ld;
  float kept = 0.f;
  for (long long j = lane; j < a.S; j += 32) {
    unsigned short bits;
    bool keep;
    if (a.mask_kind == 1) {
      keep = static_cast<const unsigned char*>(a.mask)[base + j * a.m_s[3]] != 0;
      bits = keep ? 0 : kBf16NegInf;
    } else {
      bits = static_cast<const unsigned short*>(a.mask)[base + j * a.m_s[3]];
      keep = bits != kBf16NegInf;
      if (keep && bits > kBf16BiasFloor && bits < kBf16NegInf) bits = kBf16BiasFloor;  // finite, below -2^123
    }
    out[j] = bits;
    if (keep && j < seen) kept = 1.f;
  }
  kept = warp_max(kept);
  if (lane == 0) a.dead[r] = kept == 0.f ? 1 : 0;
}

// A thread per output row; a dead row gets Dv zeros.
__global__ void __launch_bounds__(256) attention_zero_rows_kernel(AttnZeroRowsArgs a) {
  const long long rows = a.B * a.H * a.L;
  for (long long r = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long l = r % a.L, h = (r / a.L) % a.H, b = r / (a.L * a.H);
    const long long fb = a.Bb == 1 ? 0 : b, fh = a.Hb == 1 ? 0 : h;
    if (!a.dead[(fb * a.Hb + fh) * a.L + l]) continue;
    auto* o = static_cast<unsigned short*>(a.out) + b * a.o_s[0] + h * a.o_s[1] + l * a.o_s[2];
    for (long long d = 0; d < a.Dv; ++d) o[d] = 0;
  }
}

// ---------------------------------------------------------- pointer arrays
__global__ void ptr_arrays_kernel(PtrArraysArgs a) {
  const long long total = a.arrays * a.n;
  for (long long t = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<long long>(gridDim.x) * blockDim.x) {
    const int j = static_cast<int>(t / a.n);
    const long long i = t % a.n;
    a.out[j * a.array_stride + i] =
        const_cast<char*>(a.base[j]) + (i / a.per_b) * a.step_b[j] + (i % a.per_b) * a.step_h[j];
  }
}

// ------------------------------------------------------------ unpad rows
// dst[r, c] = src[r * ld + c] (r < rows, c < n; 2- or 4-byte elements): a
// GEMM's output written into rows padded to 16 bytes, made dense (plan_gemm.cpp,
// the split misaligned GEMM). A block a row (grid-stride over rows). The
// 16-byte chunks of a destination row between its first and last 16-byte
// boundary are stored whole, each assembled from the two aligned source
// chunks it straddles: a source row starts on a 16-byte boundary, so one
// byte offset (`mis`) holds for the whole row. The bytes before the first
// boundary and after the last are copied an element at a time (the
// neighbouring row's block writes the other bytes of those chunks).
__device__ __forceinline__ unsigned funnel_right(unsigned lo, unsigned hi, int bits) {
  return static_cast<unsigned>((static_cast<unsigned long long>(hi) << 32 | lo) >> bits);
}
template <int Q>
__device__ __forceinline__ uint4 shifted_chunk(const unsigned (&w)[8], int bits) {
  return make_uint4(funnel_right(w[Q], w[Q + 1], bits), funnel_right(w[Q + 1], w[Q + 2], bits),
                    funnel_right(w[Q + 2], w[Q + 3], bits), funnel_right(w[Q + 3], w[Q + 4], bits));
}
__device__ __forceinline__ void copy_element(const char* s, char* d, int esize) {
  if (esize == 2)
    *reinterpret_cast<unsigned short*>(d) = *reinterpret_cast<const unsigned short*>(s);
  else
    *reinterpret_cast<unsigned*>(d) = *reinterpret_cast<const unsigned*>(s);
}
__global__ void __launch_bounds__(256) unpad_rows_kernel(UnpadArgs a) {
  const long long es = a.esize, row_bytes = a.n * es;
  for (long long r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const char* s = static_cast<const char*>(a.src) + r * a.ld * es;
    char* d = static_cast<char*>(a.dst) + r * row_bytes;
    long long head = static_cast<long long>((16 - (reinterpret_cast<unsigned long long>(d) & 15)) & 15);
    if (head > row_bytes) head = row_bytes;
    const long long chunks = (row_bytes - head) / 16, tail = head + chunks * 16;
    for (long long b = threadIdx.x * es; b < head; b += blockDim.x * es) copy_element(s + b, d + b, a.esize);
    for (long long b = tail + threadIdx.x * es; b < row_bytes; b += blockDim.x * es)
      copy_element(s + b, d + b, a.esize);
    const int mis = static_cast<int>(head), q = mis >> 2, bits = (mis & 3) * 8;
    const uint4* sv = reinterpret_cast<const uint4*>(s);  // sv[j], sv[j + 1] hold source bytes 16j + mis ...
    uint4* dv = reinterpret_cast<uint4*>(d + head);
    for (long long j = threadIdx.x; j < chunks; j += blockDim.x) {
      const uint4 lo = sv[j];
      if (mis == 0) {
        dv[j] = lo;
        continue;
      }
      // 16j + mis + 16 <= tail <= row_bytes <= ld * es, a multiple of 16: sv[j + 1] lies in the row
      const uint4 hi = sv[j + 1];
      const unsigned w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      switch (q) {
        case 0: dv[j] = shifted_chunk<0>(w, bits); break;
        case 1: dv[j] = shifted_chunk<1>(w, bits); break;
        case 2: dv[j] = shifted_chunk<2>(w, bits); break;
        default: dv[j] = shifted_chunk<3>(w, bits); break;
      }
    }
  }
}

// ------------------------------------------------------------ layer norm
__global__ void layer_norm_kernel(const void* x, const void* w, const void* bias, void* y, void* mean_out,
                                  void* rstd_out, long long n, float eps, int bf16, int stats_bf16) {
  __shared__ float scratch[32];
  const long long row = blockIdx.x;
  const long long base = row * n;
  float s = 0.f;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) s += ld(x, base + i, bf16);
  const float mean = block_sum(s, scratch) / static_cast<float>(n);
  float q = 0.f;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    float d = ld(x, base + i, bf16) - mean;
    q += d * d;
  }
  const float var = block_sum(q, scratch) / static_cast<float>(n);
  const float rstd = rsqrtf(var + eps);
  for (long long i = threadIdx.x; i < n; i += blockDim.x) {
    float v = (ld(x, base + i, bf16) - mean) * rstd;
    if (w) v *= ld(w, i, bf16);
    if (bias) v += ld(bias, i, bf16);
    st(y, base + i, v, bf16);
  }
  if (threadIdx.x == 0) {
    if (mean_out) st(mean_out, row, mean, stats_bf16);
    if (rstd_out) st(rstd_out, row, rstd, stats_bf16);
  }
}

// Warp per row, the row held in registers (one read of x): kChunks chunks of
// 4 consecutive elements per lane (elements (c * 32 + lane) * 4 .. + 3), one
// 8- or 16-byte access each. For n a multiple of 4, n <= kChunks * 128, and
// x, y, w, bias aligned to 4 elements (launch_layer_norm checks). 4 rows per
// block of 128 threads: [1024, 768] is 256 blocks, [4096, 768] 1024, where the
// block-per-row kernel above made three passes over global memory with four
// block-wide barriers. Two-pass statistics (mean, then the squared deviations
// from it) in fp32, as the block kernel.
template <bool kBf16>
__device__ __forceinline__ void ld4(const void* p, long long i, float (&v)[4]) {
  if constexpr (kBf16) {
    const uint2 w = *reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(p) + i);
    v[0] = __uint_as_float(w.x << 16);
    v[1] = __uint_as_float(w.x & 0xffff0000u);
    v[2] = __uint_as_float(w.y << 16);
    v[3] = __uint_as_float(w.y & 0xffff0000u);
  } else {
    const float4 w = *reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    v[0] = w.x;
    v[1] = w.y;
    v[2] = w.z;
    v[3] = w.w;
  }
}
template <bool kBf16>
__device__ __forceinline__ void st4(void* p, long long i, const float (&v)[4]) {
  if constexpr (kBf16) {
    auto bits = [](float f) { return static_cast<unsigned>(__bfloat16_as_ushort(__float2bfloat16_rn(f))); };
    uint2 w;
    w.x = bits(v[0]) | bits(v[1]) << 16;
    w.y = bits(v[2]) | bits(v[3]) << 16;
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(p) + i) = w;
  } else {
    *reinterpret_cast<float4*>(static_cast<float*>(p) + i) = make_float4(v[0], v[1], v[2], v[3]);
  }
}
constexpr int kLnWarpRows = 4;
constexpr int kLnWarpMaxN = 8 * 128;  // 8 chunks of 4 elements per lane
template <bool kBf16, int kChunks>
__global__ void __launch_bounds__(32 * kLnWarpRows)
    layer_norm_warp_kernel(const void* x, const void* w, const void* bias, void* y, void* mean_out, void* rstd_out,
                           long long rows, int n, float eps, int stats_bf16) {
  const long long row = static_cast<long long>(blockIdx.x) * kLnWarpRows + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  const long long base = row * n;
  float v[kChunks][4];
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * 32 + lane) * 4;
    if (i < n) {
      ld4<kBf16>(x, base + i, v[c]);
      s += (v[c][0] + v[c][1]) + (v[c][2] + v[c][3]);
    }
  }
  const float mean = warp_sum(s) / static_cast<float>(n);
  float q = 0.f;
#pragma unroll
  for (int c = 0; c < kChunks; ++c)
    if ((c * 32 + lane) * 4 < n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float d = v[c][e] - mean;
        q += d * d;
      }
  const float rstd = rsqrtf(warp_sum(q) / static_cast<float>(n) + eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = (c * 32 + lane) * 4;
    if (i >= n) continue;
    float g[4] = {1.f, 1.f, 1.f, 1.f}, b[4] = {0.f, 0.f, 0.f, 0.f}, o[4];
    if (w) ld4<kBf16>(w, i, g);
    if (bias) ld4<kBf16>(bias, i, b);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float t = (v[c][e] - mean) * rstd;
      if (w) t *= g[e];
      if (bias) t += b[e];
      o[e] = t;
    }
    st4<kBf16>(y, base + i, o);
  }
  if (lane == 0) {
    if (mean_out) st(mean_out, row, mean, stats_bf16);
    if (rstd_out) st(rstd_out, row, rstd, stats_bf16);
  }
}
// --------------------------------------------------------------- softmax
__global__ void softmax_kernel(const void* x, void* y, long long n, int in_bf16, int out_bf16) {
  __shared__ float scratch[32];
  const long long base = static_cast<long long>(blockIdx.x) * n;
  float mx = -INFINITY;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, ld(x, base + i, in_bf16));
  mx = block_max(mx, scratch);
  float s = 0.f;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) s += expf(ld(x, base + i, in_bf16) - mx);
  s = block_sum(s, scratch);
  for (long long i = threadIdx.x; i < n; i += blockDim.x)
    st(y, base + i, expf(ld(x, base + i, in_bf16) - mx) / s, out_bf16);
}

// ------------------------------------------------------------- reductions
__device__ float ld_any(const void* p, long long i, int dt) {
  switch (dt) {
    case 0: return static_cast<const float*>(p)[i];
    case 1: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case 2: return static_cast<float>(static_cast<const long long*>(p)[i]);
    default: return static_cast<const unsigned char*>(p)[i] ? 1.f : 0.f;
  }
}
__global__ void reduce_kernel(ReduceArgs a) {
  long long o = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= a.n_outer) return;
  long long off = 0, rem = o;
  for (int d = a.rank_outer - 1; d >= 0; --d) {
    off += (rem % a.outer_shape[d]) * a.outer_strides[d];
    rem /= a.outer_shape[d];
  }
  float acc = 0.f;
  bool any = false;
  for (long long i = 0; i < a.n_inner; ++i) {
    long long ioff = 0, r = i;
    for (int d = a.rank_inner - 1; d >= 0; --d) {
      ioff += (r % a.inner_shape[d]) * a.inner_strides[d];
      r /= a.inner_shape[d];
    }
    float v = ld_any(a.x, off + ioff, a.in_dtype);
    if (a.op == 0)
      any = any || v != 0.f;
    else
      acc += v;
  }
  if (a.op == 0) {
    static_cast<unsigned char*>(a.y)[o] = any ? 1 : 0;
  } else {
    float v = acc / static_cast<float>(a.n_inner);
    st(a.y, o, v, a.out_dtype == 1);
  }
}

// -------------------------------------------------------------- embedding
__global__ void embedding_kernel(const void* weight, long long rows, long long dim, long long row_stride, int bf16,
                                 const long long* idx, long long n, void* out, int* error_flag) {
  long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * dim) return;
  long long r = i / dim, c = i % dim;
  long long k = idx[r];
  if (k < 0 || k >= rows) {
    if (c == 0) atomicExch(error_flag, 1);
    st(out, i, 0.f, bf16);
    return;
  }
  st(out, i, ld(weight, k * row_stride + c, bf16), bf16);
}

// ------------------------------------------------- gather / index.Tensor
__device__ __forceinline__ void copy_elem(const char* src, char* dst, int bytes) {
  switch (bytes) {
    case 8: *reinterpret_cast<unsigned long long*>(dst) = *reinterpret_cast<const unsigned long long*>(src); break;
    case 4: *reinterpret_cast<unsigned*>(dst) = *reinterpret_cast<const unsigned*>(src); break;
    case 2: *reinterpret_cast<unsigned short*>(dst) = *reinterpret_cast<const unsigned short*>(src); break;
    default: *dst = *src; break;
  }
}
__device__ __forceinline__ void zero_elem(char* dst, int bytes) {
  for (int b = 0; b < bytes; ++b) dst[b] = 0;
}
__global__ void index_gather_kernel(IndexGatherArgs a) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < a.n;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    long long pos[kMaxRank];
    long long r = i;
    for (int d = a.rank - 1; d >= 0; --d) {
      pos[d] = r % a.shape[d];
      r /= a.shape[d];
    }
    long long off = 0;
    for (int d = 0; d < a.rank; ++d) off += pos[d] * a.x_strides[d];
    bool ok = true;
    for (int k = 0; k < a.n_index; ++k) {
      long long at = 0;
      for (int d = 0; d < a.rank; ++d) at += pos[d] * a.idx_strides[k][d];
      long long v = a.idx_int32[k] ? static_cast<long long>(static_cast<const int*>(a.idx[k])[at])
                                   : static_cast<const long long*>(a.idx[k])[at];
      if (v < 0 && a.negative_wraps) v += a.idx_size[k];
      if (v < 0 || v >= a.idx_size[k]) {
        ok = false;
        break;
      }
      off += v * a.idx_x_stride[k];
    }
    char* dst = static_cast<char*>(a.out) + i * a.elem_bytes;
    if (!ok) {
      atomicExch(a.error_flag, 1);
      zero_elem(dst, a.elem_bytes);
      continue;
    }
    copy_elem(static_cast<const char*>(a.x) + off * a.elem_bytes, dst, a.elem_bytes);
  }
}

unsigned blocks_for(long long n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}
bool aligned_to(const void* p, unsigned bytes) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

// ---------------------------------------------------------- dispatchers
template <class Launch>
int dispatch_attention(Launch&& launch, const AttnArgs& a) {
  if (a.D > kMaxHead || a.Dv > kMaxHead || a.L <= 0 || a.B * a.H <= 0) return kLaunchInvalidValue;
  if (a.B * a.H > 65535) return kLaunchInvalidValue;  // grid.y
  const dim3 grid(static_cast<unsigned>((a.L + kBlockRows - 1) / kBlockRows), static_cast<unsigned>(a.B * a.H));
  static_assert(ks_floats(64) % 4 == 0 && ks_floats(128) % 4 == 0, "V tile float4-aligned");
  if (a.D <= 64 && a.Dv <= 64) return launch(grid, dim3(256), attention_smem_bytes(64), attention_kernel<64>, a);
  return launch(grid, dim3(256), attention_smem_bytes(128), attention_kernel<128>, a);
}

template <class Launch>
int dispatch_attention_softmax(Launch&& launch, const AttnSoftmaxArgs& a) {
  if (a.rows <= 0 || a.S <= 0) return 0;
  if (a.rows > 0x7fffffffLL) return kLaunchInvalidValue;
  if (a.S <= 1024) {  // a warp per row, the row in registers
    const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
    const int vec = a.S % 4 == 0 && aligned(a.scores) && aligned(a.probs) ? 1 : 0;
    const dim3 grid(static_cast<unsigned>((a.rows + kSoftmaxWarpRows - 1) / kSoftmaxWarpRows));
    const dim3 block(32 * kSoftmaxWarpRows);
    const long long chunks = (a.S + 127) / 128;
    if (chunks <= 1) return launch(grid, block, 0, attention_softmax_warp_kernel<1>, a, vec);
    if (chunks <= 2) return launch(grid, block, 0, attention_softmax_warp_kernel<2>, a, vec);
    if (chunks <= 4) return launch(grid, block, 0, attention_softmax_warp_kernel<4>, a, vec);
    return launch(grid, block, 0, attention_softmax_warp_kernel<8>, a, vec);
  }
  const unsigned threads = a.S >= 2048 ? 512 : 256;
  return launch(dim3(static_cast<unsigned>(a.rows)), dim3(threads), 0, attention_softmax_kernel, a);
}

template <class Launch>
int dispatch_attention_bias(Launch&& launch, const AttnBiasArgs& a) {
  if ((a.mask_kind != 1 && a.mask_kind != 2) || a.Bb < 0 || a.Hb < 0 || a.L < 0 || a.S <= 0 || a.ld < a.S)
    return kLaunchInvalidValue;
  const long long rows = a.Bb * a.Hb * a.L;
  if (rows == 0) return 0;
  const long long blocks = (rows + kBiasWarpRows - 1) / kBiasWarpRows;
  if (blocks > 0x7fffffffLL) return kLaunchInvalidValue;
  return launch(dim3(static_cast<unsigned>(blocks)), dim3(32 * kBiasWarpRows), 0, attention_bias_kernel, a);
}

template <class Launch>
int dispatch_attention_zero_rows(Launch&& launch, const AttnZeroRowsArgs& a) {
  if (a.B < 0 || a.H < 0 || a.L < 0 || a.Dv < 0 || (a.Bb != 1 && a.Bb != a.B) || (a.Hb != 1 && a.Hb != a.H))
    return kLaunchInvalidValue;
  const long long rows = a.B * a.H * a.L;
  if (rows == 0 || a.Dv == 0) return 0;
  return launch(dim3(blocks_for(rows < 65536LL * 256 ? rows : 65536LL * 256, 256)), dim3(256), 0,
                attention_zero_rows_kernel, a);
}

// The warp-per-row kernel for rows of `chunks` chunks of 128 elements: the
// instance with the fewest chunks >= that (1, 2, 4, 6 or 8).
using LayerNormWarpKernel = void (*)(const void*, const void*, const void*, void*, void*, void*, long long, int, float,
                                     int);
inline LayerNormWarpKernel layer_norm_warp_kernel_for(bool bf16, int chunks) {
  if (bf16) {
    if (chunks <= 1) return layer_norm_warp_kernel<true, 1>;
    if (chunks <= 2) return layer_norm_warp_kernel<true, 2>;
    if (chunks <= 4) return layer_norm_warp_kernel<true, 4>;
    if (chunks <= 6) return layer_norm_warp_kernel<true, 6>;
    return layer_norm_warp_kernel<true, 8>;
  }
  if (chunks <= 1) return layer_norm_warp_kernel<false, 1>;
  if (chunks <= 2) return layer_norm_warp_kernel<false, 2>;
  if (chunks <= 4) return layer_norm_warp_kernel<false, 4>;
  if (chunks <= 6) return layer_norm_warp_kernel<false, 6>;
  return layer_norm_warp_kernel<false, 8>;
}

// The warp-per-row kernel when n is a multiple of 4, n <= kLnWarpMaxN and
// every pointer is aligned to 4 elements; else a block per row.
template <class Launch>
int dispatch_layer_norm(Launch&& launch, const void* x, const void* w, const void* b, void* y, void* mean, void* rstd,
                        long long rows, long long n, float eps, int bf16, int stats_bf16) {
  if (rows == 0) return 0;
  const unsigned vec_bytes = bf16 ? 8 : 16;
  if (n % 4 == 0 && n <= kLnWarpMaxN && rows <= 0x7fffffffLL * kLnWarpRows && aligned_to(x, vec_bytes) &&
      aligned_to(y, vec_bytes) && aligned_to(w, vec_bytes) && aligned_to(b, vec_bytes)) {
    const dim3 grid(static_cast<unsigned>((rows + kLnWarpRows - 1) / kLnWarpRows)), block(32 * kLnWarpRows);
    return launch(grid, block, 0, layer_norm_warp_kernel_for(bf16 != 0, static_cast<int>((n + 127) / 128)), x, w, b, y,
                  mean, rstd, rows, static_cast<int>(n), eps, stats_bf16);
  }
  if (rows > 0x7fffffffLL) return kLaunchInvalidValue;
  const unsigned threads = n >= 1024 ? 1024 : (n >= 256 ? 256 : 128);
  return launch(dim3(static_cast<unsigned>(rows)), dim3(threads), 0, layer_norm_kernel, x, w, b, y, mean, rstd, n, eps,
                bf16, stats_bf16);
}

template <class Launch>
int dispatch_softmax(Launch&& launch, const void* x, void* y, long long rows, long long n, int in_bf16, int out_bf16) {
  if (rows == 0) return 0;
  if (rows > 0x7fffffffLL) return kLaunchInvalidValue;
  const unsigned threads = n >= 1024 ? 512 : 128;
  return launch(dim3(static_cast<unsigned>(rows)), dim3(threads), 0, softmax_kernel, x, y, n, in_bf16, out_bf16);
}

template <class Launch>
int dispatch_ptr_arrays(Launch&& launch, const PtrArraysArgs& a) {
  if (a.arrays < 0 || a.arrays > kMaxPtrArrays || a.n < 0 || a.per_b <= 0 || a.array_stride < a.n)
    return kLaunchInvalidValue;
  const long long total = a.arrays * a.n;
  if (total == 0) return 0;
  const long long blocks = (total + 255) / 256 < 1024 ? (total + 255) / 256 : 1024;
  return launch(dim3(static_cast<unsigned>(blocks)), dim3(256), 0, ptr_arrays_kernel, a);
}

template <class Launch>
int dispatch_unpad_rows(Launch&& launch, const UnpadArgs& a) {
  if ((a.esize != 2 && a.esize != 4) || a.rows < 0 || a.n < 0 || a.ld < a.n || (a.ld * a.esize) % 16 != 0 ||
      reinterpret_cast<unsigned long long>(a.src) % 16 != 0 ||
      reinterpret_cast<unsigned long long>(a.dst) % static_cast<unsigned long long>(a.esize) != 0)
    return kLaunchInvalidValue;
  if (a.rows == 0 || a.n == 0) return 0;
  const long long blocks = a.rows < 65536 ? a.rows : 65536;
  return launch(dim3(static_cast<unsigned>(blocks)), dim3(256), 0, unpad_rows_kernel, a);
}

template <class Launch>
int dispatch_reduce(Launch&& launch, const ReduceArgs& a) {
  if (a.n_outer == 0) return 0;
  return launch(dim3(blocks_for(a.n_outer, 128)), dim3(128), 0, reduce_kernel, a);
}

template <class Launch>
int dispatch_embedding(Launch&& launch, const void* weight, long long rows, long long dim, long long row_stride,
                       int bf16, const long long* idx, long long n, void* out, int* error_flag) {
  if (n * dim == 0) return 0;
  return launch(dim3(blocks_for(n * dim, 256)), dim3(256), 0, embedding_kernel, weight, rows, dim, row_stride, bf16,
                idx, n, out, error_flag);
}

template <class Launch>
int dispatch_index_gather(Launch&& launch, const IndexGatherArgs& a) {
  if (a.n == 0) return 0;
  if (a.rank > kMaxRank || a.n_index > kMaxIndexTensors) return kLaunchInvalidValue;
  const long long blocks = (a.n + 255) / 256 < 65535LL * 8 ? (a.n + 255) / 256 : 65535LL * 8;
  return launch(dim3(static_cast<unsigned>(blocks)), dim3(256), 0, index_gather_kernel, a);
}

}  // namespace
}  // namespace safeckpt::engine::detail
