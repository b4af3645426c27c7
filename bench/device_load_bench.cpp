// End-to-end GPU loading benchmark: safeckpt::cuda::load_to_device (verified
// host parse of the zip + data.pkl, then the transfer engine) against the
// pinned host->device ceiling measured in the same run.
//
//   safeckpt_device_load_bench FILE [--device N] [--runs N]
//
// FILE: a torch.save checkpoint (bench/torch_baselines.py make writes a 6 GiB
// bf16 one). Prints one table; warm page cache (the file is read once first).
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "safeckpt/device_checkpoint.hpp"

using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void warm(const char* path) {
  int fd = ::open(path, O_RDONLY);
  if (fd < 0) return;
  std::vector<char> buf(16u << 20);
  while (::read(fd, buf.data(), buf.size()) > 0) {
  }
  ::close(fd);
}

double pinned_ceiling(std::uint64_t bytes, int device) {
  cudaSetDevice(device);
  const std::size_t chunk = 256u << 20;
  void* host = nullptr;
  void* dev = nullptr;
  if (cudaHostAlloc(&host, chunk, cudaHostAllocDefault) != cudaSuccess) return 0;
  if (cudaMalloc(&dev, chunk) != cudaSuccess) return 0;
  cudaStream_t s[4];
  for (auto& st : s) cudaStreamCreate(&st);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    cudaDeviceSynchronize();
    auto t0 = Clock::now();
    std::uint64_t done = 0;
    int k = 0;
    while (done < bytes) {
      std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(16u << 20, bytes - done));
      std::size_t off = static_cast<std::size_t>(done % (chunk - n + 1));
      cudaMemcpyAsync(static_cast<char*>(dev) + off, static_cast<char*>(host) + off, n, cudaMemcpyHostToDevice,
                      s[k++ % 4]);
      done += n;
    }
    cudaDeviceSynchronize();
    best = std::min(best, secs(t0, Clock::now()));
  }
  for (auto& st : s) cudaStreamDestroy(st);
  cudaFree(dev);
  cudaFreeHost(host);
  return static_cast<double>(bytes) / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: safeckpt_device_load_bench FILE [--device N] [--runs N]\n");
    return 2;
  }
  const char* path = argv[1];
  int device = 0, runs = 3;
  for (int i = 2; i + 1 < argc; ++i) {
    std::string a = argv[i];
    if (a == "--device")
      device = std::stoi(argv[++i]);
    else if (a == "--runs")
      runs = std::stoi(argv[++i]);
  }
  cudaSetDevice(device);
  cudaFree(nullptr);  // create the context outside the timed regions
  warm(path);
  safeckpt::cuda::TransferOptions to;
  to.device = device;
  auto engine = safeckpt::cuda::TransferEngine::create(to);
  if (!engine) {
    std::fprintf(stderr, "%s\n", engine.error().to_string().c_str());
    return 1;
  }
  safeckpt::cuda::DeviceLoadOptions o;
  o.map_location = "cuda:" + std::to_string(device);
  std::printf("| %-46s | %8s | %7s | %14s |\n", "what (warm page cache)", "s", "GB/s", "first tensor ms");
  std::printf("|%s|%s|%s|%s|\n", std::string(48, '-').c_str(), std::string(10, '-').c_str(),
              std::string(9, '-').c_str(), std::string(16, '-').c_str());
  std::uint64_t bytes = 0;
  double best = 1e30, first = 0, parse_s = 0;
  for (int r = 0; r < runs + 1; ++r) {  // run 0 pins the engine's ring
    safeckpt::cuda::LoadStats st;
    auto t0 = Clock::now();
    auto d = safeckpt::cuda::load_to_device(path, o, &*engine, &st);
    double s = secs(t0, Clock::now());
    if (!d) {
      std::fprintf(stderr, "%s\n", d.error().to_string().c_str());
      return 1;
    }
    bytes = st.bytes;
    if (r > 0 && s < best) {
      best = s;
      first = st.seconds_to_first_storage * 1e3;
      parse_s = s - st.seconds;
    }
  }
  double ceiling = pinned_ceiling(bytes, device);
  std::printf("| %-46s | %8.3f | %7.1f | %14s |\n", "pinned host->device ceiling (cudaMemcpyAsync)",
              static_cast<double>(bytes) / ceiling / 1e9, ceiling, "-");
  std::printf("| %-46s | %8.3f | %7.1f | %14.1f |\n", "load_to_device (parse + verify + transfer)", best,
              static_cast<double>(bytes) / best / 1e9, first);
  std::printf("| %-46s | %8.3f | %7s | %14s |\n", "  of which host parse/verify (metadata)", parse_s, "-", "-");
  std::printf("\n%.1f GB of storages; load_to_device = %.0f%% of the pinned ceiling\n",
              static_cast<double>(bytes) / 1e9, 100.0 * static_cast<double>(bytes) / best / 1e9 / ceiling);
  return 0;
}
