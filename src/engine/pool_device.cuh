// src/engine/pool_device.cuh — pooling kernels of convolutional programs (conv.hpp):
// adaptive_avg_pool2d and max_pool2d over NCHW contiguous planes or
// channels-last (N,H,W,C) tensors; batch norm folding's prep kernel and the
// bias+add+relu fallback of the fused convolution. fp32
// arithmetic, the value's dtype stored (float32 or bfloat16, round to
// nearest even), as kernels_device.cuh.
// The kernels and their dispatchers over a launch policy (kernels_device.cuh
// says what that is): pool.cu launches them on the device,
// tests/engine/test_kernels_host.cpp under the host emulator.
#pragma once

#include <cmath>

#include "engine/conv.hpp"
#include "engine/device_io.cuh"

namespace safeckpt::engine::detail {
namespace {

// One warp per output element: the lanes stride over its window, then a
// warp sum (a 7x7 or 56x56 window alike).
__global__ void adaptive_avg_pool2d_kernel(const void* x, void* y, long long planes, long long h, long long w,
                                           long long oh, long long ow, int bf16) {
  const long long total = planes * oh * ow;
  const int lane = threadIdx.x % 32;
  for (long long o = (static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; o < total;
       o += static_cast<long long>(gridDim.x) * blockDim.x / 32) {
    const long long ox = o % ow, oy = (o / ow) % oh, pl = o / (ow * oh);
    const long long h0 = oy * h / oh, h1 = ((oy + 1) * h + oh - 1) / oh;
    const long long w0 = ox * w / ow, w1 = ((ox + 1) * w + ow - 1) / ow;
    const long long ww = w1 - w0, cnt = (h1 - h0) * ww;
    float s = 0.f;
    for (long long j = lane; j < cnt; j += 32) s += ld(x, (pl * h + h0 + j / ww) * w + w0 + j % ww, bf16);
    for (int d = 16; d > 0; d >>= 1) s += __shfl_xor_sync(0xffffffffu, s, d);
    if (lane == 0) st(y, o, s / static_cast<float>(cnt), bf16);
  }
}

// Channels-last: one thread per output element, the channel fastest (a
// warp reads neighbouring channels of one tap: coalesced), the window summed
// in order.
__global__ void adaptive_avg_pool2d_nhwc_kernel(const void* x, void* y, long long planes, long long c, long long h,
                                                long long w, long long oh, long long ow, int bf16) {
  const long long total = planes * oh * ow;
  for (long long o = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long ch = o % c, ox = (o / c) % ow, oy = (o / (c * ow)) % oh, n = o / (c * ow * oh);
    const long long h0 = oy * h / oh, h1 = ((oy + 1) * h + oh - 1) / oh;
    const long long w0 = ox * w / ow, w1 = ((ox + 1) * w + ow - 1) / ow;
    float s = 0.f;
    for (long long i = h0; i < h1; ++i)
      for (long long j = w0; j < w1; ++j) s += ld(x, ((n * h + i) * w + j) * c + ch, bf16);
    st(y, o, s / static_cast<float>((h1 - h0) * (w1 - w0)), bf16);
  }
}

// One thread per output element. aten/src/ATen/native/cuda/DilatedMaxPool2d.cu:
// the maximum starts at -inf, `val > max || isnan(val)` replaces it, so the
// first maximum wins ties and a NaN in the window gives NaN; padded taps are
// skipped.
// I: the index type of the output decomposition (unsigned when the input
// has fewer than 2^32 elements: 64-bit division is a long software sequence
// on the GPU); offsets are 64-bit.
template <typename I>
__global__ void max_pool2d_kernel(MaxPoolArgs a) {
  const long long total = a.planes * a.oh * a.ow;
  const I c = static_cast<I>(a.channels), oh = static_cast<I>(a.oh), ow = static_cast<I>(a.ow);
  for (long long o = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += static_cast<long long>(gridDim.x) * blockDim.x) {
    // NCHW: o = (plane, oy, ox); channels-last: o = (n, oy, ox, c), c fastest.
    const I oi = static_cast<I>(o);
    const I q = c > 0 ? oi / c : oi;
    const I ch = c > 0 ? oi - q * c : 0;
    const I q2 = q / ow;
    const long long ox = static_cast<long long>(q - q2 * ow), oy = static_cast<long long>(q2 % oh),
                    pl = static_cast<long long>(q2 / oh);
    const long long hs = oy * a.sh - a.ph, ws = ox * a.sw - a.pw;
    float m = -INFINITY;
    for (int i = 0; i < a.kh; ++i) {
      const long long ih = hs + static_cast<long long>(i) * a.dh;
      if (ih < 0 || ih >= a.h) continue;
      for (int j = 0; j < a.kw; ++j) {
        const long long iw = ws + static_cast<long long>(j) * a.dw;
        if (iw < 0 || iw >= a.w) continue;
        const float v = ld(
            a.x,
            c > 0 ? ((pl * a.h + ih) * a.w + iw) * a.channels + static_cast<long long>(ch) : (pl * a.h + ih) * a.w + iw,
            a.bf16);
        if (v > m || isnan(v)) m = v;
      }
    }
    st(a.y, o, m, a.bf16);
  }
}

// One thread per filter element (k, c, r, s), decomposed with s fastest;
// the thread of each k's first element also writes bias[k].
__global__ void fold_batch_norm_kernel(FoldBnArgs a) {
  const long long total = a.k * a.c * a.r * a.s;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long s = i % a.s, r = (i / a.s) % a.r, c = (i / (a.s * a.r)) % a.c, k = i / (a.s * a.r * a.c);
    const float g = a.gamma != nullptr ? ld(a.gamma, k * a.vs[0], a.vbf16[0]) : 1.0f;
    const float invstd = 1.0f / sqrtf(ld(a.var, k * a.vs[3], a.vbf16[3]) + a.eps);
    const float scale = g * invstd;
    if (a.wf != nullptr)
      a.wf[k * a.wfs[0] + c * a.wfs[1] + r * a.wfs[2] + s * a.wfs[3]] =
          a.w[k * a.ws[0] + c * a.ws[1] + r * a.ws[2] + s * a.ws[3]] * scale;
    if (c == 0 && r == 0 && s == 0) {
      const float beta = a.beta != nullptr ? ld(a.beta, k * a.vs[1], a.vbf16[1]) : 0.0f;
      const float cb = a.conv_bias != nullptr ? ld(a.conv_bias, k * a.vs[4], a.vbf16[4]) : 0.0f;
      a.bias[k] = (cb - ld(a.mean, k * a.vs[2], a.vbf16[2])) * scale + beta;
      if (a.scale != nullptr) a.scale[k] = scale;
    }
  }
}

__global__ void bias_add_relu_kernel(void* y, const float* scale, const float* bias, const void* z, long long count,
                                     long long channels, long long inner, int bf16) {
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<long long>(gridDim.x) * blockDim.x) {
    const long long ch = (i / inner) % channels;
    float v = ld(y, i, bf16);
    if (scale != nullptr) v *= scale[ch];
    v += bias[ch];
    if (z != nullptr) v += ld(z, i, bf16);
    st(y, i, v > 0.0f || isnan(v) ? v : 0.0f, bf16);
  }
}

// Blocks of 256 threads for `threads` threads, at most 132 * 32 (grid-stride
// loops cover the rest: 32 blocks per SM of an H100 / H200).
unsigned pool_grid_for(long long threads) {
  long long blocks = (threads + 255) / 256;
  if (blocks > 132 * 32) blocks = 132 * 32;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

template <class Launch>
int dispatch_adaptive_avg_pool2d(Launch&& launch, const void* x, void* y, long long planes, long long h, long long w,
                                 long long oh, long long ow, int bf16, long long channels) {
  const long long total = planes * oh * ow;
  if (total == 0) return 0;
  if (channels > 0)
    return launch(dim3(pool_grid_for(total)), dim3(256), 0, adaptive_avg_pool2d_nhwc_kernel, x, y, planes, channels, h,
                  w, oh, ow, bf16);
  return launch(dim3(pool_grid_for(total * 32)), dim3(256), 0, adaptive_avg_pool2d_kernel, x, y, planes, h, w, oh, ow,
                bf16);
}

template <class Launch>
int dispatch_max_pool2d(Launch&& launch, const MaxPoolArgs& a) {
  const long long total = a.planes * a.oh * a.ow;
  if (total == 0) return 0;
  if (total <= 0xffffffffLL && a.planes * a.h * a.w <= 0xffffffffLL)
    return launch(dim3(pool_grid_for(total)), dim3(256), 0, max_pool2d_kernel<unsigned>, a);
  return launch(dim3(pool_grid_for(total)), dim3(256), 0, max_pool2d_kernel<unsigned long long>, a);
}

template <class Launch>
int dispatch_fold_batch_norm(Launch&& launch, const FoldBnArgs& a) {
  const long long total = a.k * a.c * a.r * a.s;
  if (total == 0) return 0;
  return launch(dim3(pool_grid_for(total)), dim3(256), 0, fold_batch_norm_kernel, a);
}

template <class Launch>
int dispatch_bias_add_relu(Launch&& launch, void* y, const float* scale, const float* bias, const void* z,
                           long long count, long long channels, long long inner, int bf16) {
  if (count == 0) return 0;
  return launch(dim3(pool_grid_for(count)), dim3(256), 0, bias_add_relu_kernel, y, scale, bias, z, count, channels,
                inner, bf16);
}

}  // namespace
}  // namespace safeckpt::engine::detail
