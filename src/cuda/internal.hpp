// src/cuda/internal.hpp — pieces shared inside the CUDA layer (not installed).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace safeckpt::cuda::detail {

// Reverses the bytes of every `unit`-byte unit (2, 4 or 8) of the `nbytes`
// device bytes at `data`, in place, on `stream`. `data` must be aligned to
// `unit` and nbytes a multiple of it (the engine guarantees both: storages
// are 256-aligned in the arena and chunks start at multiples of 4096 inside a
// storage). Returns the launch error (cudaSuccess when nbytes == 0).
cudaError_t launch_byteswap(void* data, std::uint64_t nbytes, std::uint32_t unit, cudaStream_t stream);

}  // namespace safeckpt::cuda::detail
