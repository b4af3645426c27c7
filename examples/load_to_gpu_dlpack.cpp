// Load a checkpoint straight into GPU memory and hand one tensor to another
// framework through DLPack (torch.from_dlpack / cupy.from_dlpack take the
// capsule; here the consumer is this program, which releases it).
//   load_to_gpu_dlpack CHECKPOINT [cuda:N]
// Built only with the CUDA loader (target safeckpt::cuda).
#include <cstdio>

#include "safeckpt/device_checkpoint.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT [cuda:N]\n", argv[0]);
    return 2;
  }
  safeckpt::cuda::DeviceLoadOptions opt;
  if (argc == 3) opt.map_location = argv[2];
  auto dev = safeckpt::cuda::load_to_device(argv[1], opt);  // verified host parse, then streamed to the GPU
  if (!dev) {
    std::fprintf(stderr, "%s\n", dev.error().to_string().c_str());
    return 1;
  }
  auto tensors = dev->tensors();
  std::printf("%zu tensors on cuda:%d\n", tensors.size(), dev->device());
  if (tensors.empty()) return 0;
  auto t = dev->to_dlpack(0);  // read-only capsule; keeps the device memory alive until its deleter runs
  if (!t) {
    std::fprintf(stderr, "%s\n", t.error().to_string().c_str());
    return 1;
  }
  std::printf("%s: ndim %d on device %d\n", tensors[0].name.c_str(), (*t)->dl_tensor.ndim,
              (*t)->dl_tensor.device.device_id);
  (*t)->deleter(*t);  // the consumer's job once it is done with the tensor
  return 0;
}
