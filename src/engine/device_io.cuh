// src/engine/device_io.cuh — element loads and stores the fixed kernels share
// (kernels.cu, pool.cu): float32 or bfloat16 storage, float32 arithmetic.
#pragma once

#include <cuda_bf16.h>

namespace safeckpt::engine::detail {
namespace {  // internal linkage in each kernel file

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

}  // namespace
}  // namespace safeckpt::engine::detail
