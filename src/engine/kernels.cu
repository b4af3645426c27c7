// src/engine/kernels.cu — the engine's fixed kernels: flash-style attention,
// layer norm, softmax over the last dimension, reductions, embedding with
// device-side bounds checks. Every kernel computes in fp32 and stores the
// value's dtype (float32 or bfloat16, round to nearest even).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "engine/internal.hpp"

namespace safeckpt::engine::detail {
namespace {

__device__ __forceinline__ float ld(const void* p, long long i, int bf16) {
  if (bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  return static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void st(void* p, long long i, float v, int bf16) {
  if (bf16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}
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
// Grid (ceil(L / 16), B * H), 128 threads: each of the 4 warps owns 4 query
// rows; key/value tiles of 32 rows are staged in shared memory (padded rows:
// lane j reads key j without bank conflicts), one lane per key for the
// scores, online softmax (running max and sum), each lane accumulating
// Dv / 32 output columns.
constexpr int kTile = 32;
constexpr int kRowsPerWarp = 4;
constexpr int kWarps = 4;
constexpr int kMaxHead = 128;

__global__ void __launch_bounds__(128) attention_kernel(AttnArgs a) {
  __shared__ float ks[kTile][kMaxHead + 1];
  __shared__ float vs[kTile][kMaxHead + 1];
  __shared__ float qs[kWarps * kRowsPerWarp][kMaxHead];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const long long bh = blockIdx.y;
  const long long b = bh / a.H, h = bh % a.H;
  const long long row0 = static_cast<long long>(blockIdx.x) * kWarps * kRowsPerWarp;
  const char* qb = static_cast<const char*>(a.q);
  const int es = a.bf16 ? 2 : 4;
  const long long D = a.D, Dv = a.Dv;
  // Stage the block's query rows (pre-scaled).
  for (long long i = threadIdx.x; i < kWarps * kRowsPerWarp * D; i += blockDim.x) {
    long long r = i / D, d = i % D, row = row0 + r;
    float v = 0.f;
    if (row < a.L) v = ld(qb, (b * a.q_s[0] + h * a.q_s[1] + row * a.q_s[2] + d), a.bf16) * a.scale;
    qs[r][d] = v;
  }
  (void)es;
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kMaxHead / 32];
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.f;
    for (int c = 0; c < kMaxHead / 32; ++c) acc[r][c] = 0.f;
  }
  long long last_row = row0 + kWarps * kRowsPerWarp - 1;
  if (last_row >= a.L) last_row = a.L - 1;
  // Causal (PyTorch: tril, diagonal 0, top-left aligned): key j <= row i.
  long long s_end = a.S;
  if (a.causal && last_row + 1 < s_end) s_end = last_row + 1;
  for (long long t0 = 0; t0 < s_end; t0 += kTile) {
    __syncthreads();
    for (long long i = threadIdx.x; i < kTile * D; i += blockDim.x) {
      long long j = i / D, d = i % D, key = t0 + j;
      ks[j][d] = key < a.S ? ld(a.k, b * a.k_s[0] + h * a.k_s[1] + key * a.k_s[2] + d, a.bf16) : 0.f;
    }
    for (long long i = threadIdx.x; i < kTile * Dv; i += blockDim.x) {
      long long j = i / Dv, d = i % Dv, key = t0 + j;
      vs[j][d] = key < a.S ? ld(a.v, b * a.v_s[0] + h * a.v_s[1] + key * a.v_s[2] + d, a.bf16) : 0.f;
    }
    __syncthreads();
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int qr = warp * kRowsPerWarp + r;
      const long long row = row0 + qr;
      if (row >= a.L) break;  // uniform across the warp
      const long long key = t0 + lane;
      float s = -INFINITY;
      if (key < a.S && !(a.causal && key > row)) {
        float dot = 0.f;
        for (long long d = 0; d < D; ++d) dot += qs[qr][d] * ks[lane][d];
        s = dot;
        if (a.mask_kind != 0) {
          long long mi = b * a.m_s[0] + h * a.m_s[1] + row * a.m_s[2] + key * a.m_s[3];
          if (a.mask_kind == 1) {
            if (!static_cast<const unsigned char*>(a.mask)[mi]) s = -INFINITY;
          } else {
            s += ld(a.mask, mi, a.bf16);
          }
        }
      }
      float tmax = warp_max(s);
      float mnew = fmaxf(m[r], tmax);
      float p = (s == -INFINITY) ? 0.f : expf(s - mnew);
      float corr = (m[r] == -INFINITY) ? 0.f : expf(m[r] - mnew);
      l[r] = l[r] * corr + warp_sum(p);
      for (int c = 0; c < kMaxHead / 32; ++c) acc[r][c] *= corr;
      for (int jj = 0; jj < kTile; ++jj) {
        float pj = __shfl_sync(0xffffffffu, p, jj);
        if (pj != 0.f)
          for (int c = 0; c < kMaxHead / 32; ++c) {
            long long d = lane + 32 * c;
            if (d < Dv) acc[r][c] += pj * vs[jj][d];
          }
      }
      m[r] = (mnew == -INFINITY) ? m[r] : mnew;
    }
  }
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const long long row = row0 + warp * kRowsPerWarp + r;
    if (row >= a.L) break;
    for (int c = 0; c < kMaxHead / 32; ++c) {
      long long d = lane + 32 * c;
      // Every key masked: zeros, as the CPU reference (and math SDPA's _safe_softmax).
      if (d < Dv) st(a.out, ((b * a.H + h) * a.L + row) * Dv + d, l[r] > 0.f ? acc[r][c] / l[r] : 0.f, a.bf16);
    }
  }
}

// --------------------------------------- attention, materialized scores
// One block per score row (scale already applied by the Q K^T GEMM): mask,
// max, sum of exp, probabilities. Each thread touches the same columns in
// every pass, so the in-place float32 case needs no extra barrier.
__global__ void attention_softmax_kernel(AttnSoftmaxArgs a) {
  __shared__ float scratch[32];
  const long long r = blockIdx.x;
  const long long l = r % a.L, bh = r / a.L;
  const long long b = a.b0 + bh / a.H, h = bh % a.H;
  float* row = a.scores + r * a.S;
  const long long last = a.causal ? (l < a.S - 1 ? l : a.S - 1) : a.S - 1;  // keys after it are masked
  const auto* mb = static_cast<const unsigned char*>(a.mask);
  const long long mrow = b * a.m_s[0] + h * a.m_s[1] + l * a.m_s[2];
  float mx = -INFINITY;
  for (long long s = threadIdx.x; s < a.S; s += blockDim.x) {
    float x = s > last ? -INFINITY : row[s];
    if (a.mask_kind == 1 && !mb[mrow + s * a.m_s[3]]) x = -INFINITY;
    if (a.mask_kind == 2) x += ld(a.mask, mrow + s * a.m_s[3], a.mask_bf16);
    row[s] = x;
    mx = fmaxf(mx, x);
  }
  mx = block_max(mx, scratch);
  float sum = 0.f;
  if (mx != -INFINITY)
    for (long long s = threadIdx.x; s < a.S; s += blockDim.x) sum += expf(row[s] - mx);
  sum = block_sum(sum, scratch);
  const float inv = mx == -INFINITY ? 0.f : 1.f / sum;
  for (long long s = threadIdx.x; s < a.S; s += blockDim.x) {
    const float p = mx == -INFINITY ? 0.f : expf(row[s] - mx) * inv;
    if (a.probs_bf16)
      static_cast<__nv_bfloat16*>(a.probs)[r * a.S + s] = __float2bfloat16_rn(p);
    else
      static_cast<float*>(a.probs)[r * a.S + s] = p;
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

unsigned blocks_for(long long n, unsigned threads) {
  return static_cast<unsigned>((n + threads - 1) / threads);
}

}  // namespace

int launch_attention(const AttnArgs& a, void* stream) {
  if (a.D > kMaxHead || a.Dv > kMaxHead || a.L <= 0 || a.B * a.H <= 0) return cudaErrorInvalidValue;
  dim3 grid(static_cast<unsigned>((a.L + kWarps * kRowsPerWarp - 1) / (kWarps * kRowsPerWarp)),
            static_cast<unsigned>(a.B * a.H));
  attention_kernel<<<grid, 32 * kWarps, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return cudaGetLastError();
}

int launch_attention_softmax(const AttnSoftmaxArgs& a, void* stream) {
  if (a.rows <= 0 || a.S <= 0) return cudaSuccess;
  if (a.rows > 0x7fffffffLL) return cudaErrorInvalidValue;
  unsigned threads = a.S >= 2048 ? 512 : (a.S >= 512 ? 256 : 128);
  attention_softmax_kernel<<<static_cast<unsigned>(a.rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return cudaGetLastError();
}

int launch_layer_norm(const void* x, const void* w, const void* b, void* y, void* mean, void* rstd, long long rows,
                      long long n, float eps, int bf16, int stats_bf16, void* stream) {
  if (rows == 0) return cudaSuccess;
  unsigned threads = n >= 1024 ? 1024 : (n >= 256 ? 256 : 128);
  layer_norm_kernel<<<static_cast<unsigned>(rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      x, w, b, y, mean, rstd, n, eps, bf16, stats_bf16);
  return cudaGetLastError();
}

int launch_softmax(const void* x, void* y, long long rows, long long n, int in_bf16, int out_bf16, void* stream) {
  if (rows == 0) return cudaSuccess;
  unsigned threads = n >= 1024 ? 512 : 128;
  softmax_kernel<<<static_cast<unsigned>(rows), threads, 0, static_cast<cudaStream_t>(stream)>>>(x, y, n, in_bf16,
                                                                                                 out_bf16);
  return cudaGetLastError();
}

int launch_reduce(const ReduceArgs& a, void* stream) {
  if (a.n_outer == 0) return cudaSuccess;
  reduce_kernel<<<blocks_for(a.n_outer, 128), 128, 0, static_cast<cudaStream_t>(stream)>>>(a);
  return cudaGetLastError();
}

int launch_embedding(const void* weight, long long rows, long long dim, long long row_stride, int bf16,
                     const long long* idx, long long n, void* out, int* error_flag, void* stream) {
  if (n * dim == 0) return cudaSuccess;
  embedding_kernel<<<blocks_for(n * dim, 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      weight, rows, dim, row_stride, bf16, idx, n, out, error_flag);
  return cudaGetLastError();
}

}  // namespace safeckpt::engine::detail
