// src/engine/pool.cu — the pooling and batch-norm-folding kernels on the
// device (pool_device.cuh: the kernels and their launch geometry).
#include <cuda_runtime.h>

#include "engine/pool_device.cuh"

namespace safeckpt::engine::detail {

int launch_adaptive_avg_pool2d(const void* x, void* y, long long planes, long long h, long long w, long long oh,
                               long long ow, int bf16, long long channels, void* stream) {
  return dispatch_adaptive_avg_pool2d(CudaLaunch{static_cast<cudaStream_t>(stream)}, x, y, planes, h, w, oh, ow, bf16,
                                      channels);
}

int launch_max_pool2d(const MaxPoolArgs& a, void* stream) {
  return dispatch_max_pool2d(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_fold_batch_norm(const FoldBnArgs& a, void* stream) {
  return dispatch_fold_batch_norm(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_bias_add_relu(void* y, const float* scale, const float* bias, const void* z, long long count,
                         long long channels, long long inner, int bf16, void* stream) {
  return dispatch_bias_add_relu(CudaLaunch{static_cast<cudaStream_t>(stream)}, y, scale, bias, z, count, channels,
                                inner, bf16);
}

}  // namespace safeckpt::engine::detail
