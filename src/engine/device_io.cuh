// src/engine/device_io.cuh — what the fixed kernels share (kernels_device.cuh,
// pool.cu, attention_tc.cu): element loads and stores (float32 or bfloat16
// storage, float32 arithmetic), dynamic shared memory, and CudaLaunch, the
// launch policy of the kernel dispatchers (kernels_device.cuh).
//
// Compiled by nvcc for the device; tests/engine/cuda_host_sim.hpp, included
// first, provides the same names on the host (__CUDACC__ undefined there).
#pragma once

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <utility>

// The kernel's dynamic shared memory (the launch's third argument) as
// `type name[]`, aligned to `type`, or to `align` bytes.
#define SAFECKPT_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define SAFECKPT_DYNAMIC_SHARED_ALIGNED(type, name, align) \
  extern __shared__ __align__(align)                       \
  type name[]
#endif

namespace safeckpt::engine::detail {
namespace {  // internal linkage in each kernel file

// What a dispatcher returns for arguments no launch can serve:
// cudaErrorInvalidValue's value (the .cu files static_assert it).
constexpr int kLaunchInvalidValue = 1;

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

#ifdef __CUDACC__
// Launches `kernel` on `stream`; above 48 KiB of dynamic shared memory it
// first raises the kernel's limit (cudaFuncAttributeMaxDynamicSharedMemorySize).
// Returns a cudaError_t value.
struct CudaLaunch {
  cudaStream_t stream;
  template <class... P, class... A>
  int operator()(dim3 grid, dim3 block, unsigned smem, void (*kernel)(P...), A&&... args) const {
    if (smem > 48 * 1024) {
      const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (e != cudaSuccess) return e;
    }
    kernel<<<grid, block, smem, stream>>>(std::forward<A>(args)...);
    return cudaGetLastError();
  }
};
#endif

}  // namespace
}  // namespace safeckpt::engine::detail
