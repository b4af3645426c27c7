// src/engine/attention_tc.cu — the tensor-core flash attention kernel on the
// device (attention_tc_device.cuh: the kernel and its launch geometry).
#include <cuda_runtime.h>

#include "engine/attention_tc_device.cuh"

namespace safeckpt::engine::detail {

static_assert(kLaunchInvalidValue == cudaErrorInvalidValue, "attention_tc_device.cuh's error value");

int launch_attention_tc(const AttnArgs& a, void* stream) {
  return dispatch_attention_tc(CudaLaunch{static_cast<cudaStream_t>(stream)}, a);
}

}  // namespace safeckpt::engine::detail
