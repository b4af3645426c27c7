// measure_pinned_h2d: the pinned host->device copy ceiling that benchmarks
// compare the transfer engine against (safeckpt/cuda.hpp).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "safeckpt/cuda.hpp"

namespace safeckpt::cuda {
namespace {

Unexpected cuda_failed(const std::string& what, cudaError_t e) {
  (void)cudaGetLastError();  // leave no non-sticky error behind for the caller's next call
  return make_error(ErrorCode::kDevice, what + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Frees whatever was allocated, on every path.
struct Buffers {
  void* host = nullptr;
  void* dev = nullptr;
  std::vector<cudaStream_t> streams;
  ~Buffers() {
    for (auto s : streams) {
      if (s == nullptr) continue;
      (void)cudaStreamSynchronize(s);
      (void)cudaStreamDestroy(s);
    }
    if (dev) (void)cudaFree(dev);
    if (host) (void)cudaFreeHost(host);
  }
};

}  // namespace

Result<double> measure_pinned_h2d(int device, std::uint64_t bytes, unsigned streams, std::uint64_t chunk_bytes) {
  if (bytes == 0 || streams == 0 || streams > 64 || chunk_bytes == 0)
    return make_error(ErrorCode::kInvalidArgument, "measure_pinned_h2d: bytes, streams (1..64) and chunk must be > 0");
  int prev = 0;
  (void)cudaGetDevice(&prev);
  struct Restore {
    int d;
    ~Restore() { (void)cudaSetDevice(d); }
  } restore{prev};
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return cuda_failed("cudaSetDevice", e);
  const std::uint64_t buf = std::min<std::uint64_t>(256ull << 20, std::max(bytes, chunk_bytes));
  chunk_bytes = std::min(chunk_bytes, buf);
  Buffers b;
  if (cudaError_t e = cudaHostAlloc(&b.host, buf, cudaHostAllocDefault); e != cudaSuccess)
    return cuda_failed("cudaHostAlloc", e);
  std::memset(b.host, 0x5a, buf);
  if (cudaError_t e = cudaMalloc(&b.dev, buf); e != cudaSuccess) return cuda_failed("cudaMalloc", e);
  b.streams.resize(streams, nullptr);
  for (auto& s : b.streams)
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess)
      return cuda_failed("cudaStreamCreateWithFlags", e);
  std::vector<double> runs;
  for (int r = 0; r < 4; ++r) {  // run 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    std::uint64_t done = 0;
    for (std::uint64_t i = 0; done < bytes; ++i) {
      const std::uint64_t off = (i * chunk_bytes) % buf;
      const std::uint64_t len = std::min({chunk_bytes, bytes - done, buf - off});
      if (cudaError_t e = cudaMemcpyAsync(static_cast<char*>(b.dev) + off, static_cast<char*>(b.host) + off, len,
                                          cudaMemcpyHostToDevice, b.streams[i % streams]);
          e != cudaSuccess)
        return cuda_failed("cudaMemcpyAsync", e);
      done += len;
    }
    for (auto s : b.streams)
      if (cudaError_t e = cudaStreamSynchronize(s); e != cudaSuccess) return cuda_failed("cudaStreamSynchronize", e);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) runs.push_back(static_cast<double>(bytes) / secs / 1e9);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

}  // namespace safeckpt::cuda
