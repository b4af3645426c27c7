// Load a checkpoint with the weights-only rules and walk its state_dict:
// name, dtype, shape and the first bytes of each tensor.
//   iterate_state_dict model.pt
#include <cstdio>

#include "safeckpt/checkpoint.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CHECKPOINT\n", argv[0]);
    return 2;
  }
  auto ckpt = safeckpt::load(argv[1]);  // default policy: PyTorch's weights_only set
  if (!ckpt) {
    std::fprintf(stderr, "%s\n", ckpt.error().to_string().c_str());
    return 1;
  }
  for (const safeckpt::NamedTensor& n : ckpt->state_dict()) {
    const safeckpt::TensorInfo& t = ckpt->tensors()[n.tensor];
    std::printf("%s %s [", n.name.c_str(), std::string(safeckpt::dtype_name(t.dtype)).c_str());
    for (std::size_t i = 0; i < t.shape.size(); ++i) std::printf("%s%lld", i ? ", " : "", (long long)t.shape[i]);
    // contiguous_bytes: the tensor's elements in C order, whatever its strides.
    auto bytes = ckpt->contiguous_bytes(n.tensor);
    std::printf("] %zu bytes\n", bytes ? bytes->size() : 0);
  }
  std::printf("tensors: %zu\n", ckpt->state_dict().size());
  return 0;
}
