// Allow more globals than PyTorch's weights-only default, as
// torch.serialization.add_safe_globals does: one name in code, or a whole
// allowlist file (allowlist/*.allow syntax).
//   extend_allowlist CHECKPOINT [ALLOWFILE]
#include <cstdio>

#include "safeckpt/allowlist.hpp"
#include "safeckpt/checkpoint.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s CHECKPOINT [ALLOWFILE]\n", argv[0]);
    return 2;
  }
  safeckpt::Allowlist allow = safeckpt::Allowlist::default_policy();  // a copy we may extend
  if (auto st = allow.add("argparse.Namespace"); !st) {               // one global, like add_safe_globals([Namespace])
    std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
    return 2;
  }
  if (argc == 3) {
    if (auto st = allow.add_file(argv[2]); !st) {
      std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
      return 2;
    }
  }
  safeckpt::LoadOptions opt;
  opt.allowlist = &allow;  // must outlive load()
  auto ckpt = safeckpt::load(argv[1], opt);
  if (!ckpt) {
    // A refused global names itself; allow_hint says how to allow it.
    std::fprintf(stderr, "%s\n", ckpt.error().to_string().c_str());
    return 1;
  }
  std::printf("loaded with %zu allowlist entries: %zu tensors\n", allow.entries().size(), ckpt->tensors().size());
  return 0;
}
