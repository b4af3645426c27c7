// src/engine/attention_tc.cu — the tensor-core flash attention kernels on the
// device (attention_tc_device.cuh: bfloat16; attention_tf32_device.cuh:
// float32 in 3xTF32; the kernels and their launch geometry).
#include <cuda_runtime.h>

#include "engine/attention_tc_device.cuh"
#include "engine/attention_tf32_device.cuh"

namespace safeckpt::engine::detail {

static_assert(kLaunchInvalidValue == cudaErrorInvalidValue, "attention_tc_device.cuh's error value");

int launch_attention_tc(const AttnArgs& a, void* stream) {
  return dispatch_attention_tc(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

int launch_attention_tf32x3(const AttnArgs& a, void* stream) {
  return dispatch_attention_tf32x3(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

}  // namespace safeckpt::engine::detail
