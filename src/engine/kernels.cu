// src/engine/kernels.cu — the engine's fixed kernels on the device: the
// kernels and their launch geometry are in kernels_device.cuh (also compiled
// on the host by tests/engine/test_kernels_host.cpp); here each entry point
// of internal.hpp runs its dispatcher with CudaLaunch on `stream`.
#include <cuda_runtime.h>

#include "engine/kernels_device.cuh"

namespace safeckpt::engine::detail {

static_assert(kLaunchInvalidValue == cudaErrorInvalidValue, "kernels_device.cuh's error value");

int launch_attention(const AttnArgs& a, void* stream) {
  return dispatch_attention(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_attention_softmax(const AttnSoftmaxArgs& a, void* stream) {
  return dispatch_attention_softmax(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_attention_bias(const AttnBiasArgs& a, void* stream) {
  return dispatch_attention_bias(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_attention_zero_rows(const AttnZeroRowsArgs& a, void* stream) {
  return dispatch_attention_zero_rows(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_ptr_arrays(const PtrArraysArgs& a, void* stream) {
  return dispatch_ptr_arrays(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_unpad_rows(const UnpadArgs& a, void* stream) {
  return dispatch_unpad_rows(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_layer_norm(const void* x, const void* w, const void* b, void* y, void* mean, void* rstd, long long rows,
                      long long n, float eps, int bf16, int stats_bf16, void* stream) {
  return dispatch_layer_norm(CudaLaunch{static_cast<cudaStream_t>(stream)}, x, w, b, y, mean, rstd, rows, n, eps, bf16,
                             stats_bf16);
}

int launch_softmax(const void* x, void* y, long long rows, long long n, int in_bf16, int out_bf16, void* stream) {
  return dispatch_softmax(CudaLaunch{static_cast<cudaStream_t>(stream)}, x, y, rows, n, in_bf16, out_bf16);
}

int launch_reduce(const ReduceArgs& a, void* stream) {
  return dispatch_reduce(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_embedding(const void* weight, long long rows, long long dim, long long row_stride, int bf16,
                     const long long* idx, long long n, void* out, int* error_flag, void* stream) {
  return dispatch_embedding(CudaLaunch{static_cast<cudaStream_t>(stream)}, weight, rows, dim, row_stride, bf16, idx, n,
                            out, error_flag);
}

int launch_index_gather(const IndexGatherArgs& a, void* stream) {
  return dispatch_index_gather(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

}  // namespace safeckpt::engine::detail
