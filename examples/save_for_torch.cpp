// Write tensors that torch.load(path, weights_only=True) reads: a state_dict
// {"weight": float32[2, 3], "bias": float32[3]} in the torch.save zip layout.
//   save_for_torch OUT.pt
#include <cstdio>
#include <cstring>
#include <vector>

#include "safeckpt/builder.hpp"
#include "safeckpt/save.hpp"

namespace {

std::vector<std::uint8_t> floats(std::vector<float> v) {
  std::vector<std::uint8_t> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());  // little-endian host bytes
  return out;
}

safeckpt::Status write(const char* path) {
  safeckpt::CheckpointBuilder b;
  SAFECKPT_CHECK(b.add_state_dict_tensor("weight", safeckpt::DType::kFloat32, {2, 3}, floats({1, 2, 3, 4, 5, 6}),
                                         /*parameter=*/true));
  SAFECKPT_CHECK(b.add_state_dict_tensor("bias", safeckpt::DType::kFloat32, {3}, floats({0.5f, 0.25f, 0})));
  SAFECKPT_TRY(safeckpt::Checkpoint ckpt, std::move(b).finish());
  safeckpt::SaveOptions opt;
  opt.overwrite = true;
  return safeckpt::save(path, ckpt, opt);  // atomic: a temporary file renamed into place
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.pt\n", argv[0]);
    return 2;
  }
  if (auto st = write(argv[1]); !st) {
    std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
    return 1;
  }
  std::printf("wrote %s\n", argv[1]);
  return 0;
}
