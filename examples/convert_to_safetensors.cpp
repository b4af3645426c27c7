// PyTorch checkpoint -> safetensors, as `safeckpt convert IN OUT.safetensors`:
// loaded with the weights-only rules, every state_dict tensor written under
// its name; plain non-tensor values go to __metadata__.
//   convert_to_safetensors IN.pt OUT.safetensors
#include <cstdio>
#include <string>
#include <vector>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/safetensors_writer.hpp"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s IN.pt OUT.safetensors\n", argv[0]);
    return 2;
  }
  auto ckpt = safeckpt::load(argv[1]);
  if (!ckpt) {
    std::fprintf(stderr, "%s\n", ckpt.error().to_string().c_str());
    return 1;
  }
  safeckpt::ToSafetensorsOptions to;
  to.drop_non_tensors = true;  // leave out values JSON metadata cannot hold
  safeckpt::SaveOptions so;
  so.overwrite = true;
  std::vector<std::string> notes;  // e.g. shared storages written as separate tensors
  if (auto st = safeckpt::save_checkpoint_as_safetensors(argv[2], *ckpt, to, so, &notes); !st) {
    std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
    return 1;
  }
  for (const auto& n : notes) std::printf("note: %s\n", n.c_str());
  auto back = safeckpt::load_safetensors(argv[2]);  // read it back
  if (!back) {
    std::fprintf(stderr, "%s\n", back.error().to_string().c_str());
    return 1;
  }
  std::printf("wrote %s: %zu tensors\n", argv[2], back->state_dict().size());
  return 0;
}
