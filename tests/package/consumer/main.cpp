// Installed-package consumer (tests/package/run.cmake): loads and scans one
// file (loaded or refused) and prints what the test compares with the
// installed CLI's output.
#include <cstdio>
#include <filesystem>
#include <string>

#include "safeckpt/checkpoint.hpp"
#include "safeckpt/scan.hpp"
#include "safeckpt/version.hpp"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  static_assert(SAFECKPT_VERSION_NUMBER ==
                SAFECKPT_VERSION_MAJOR * 10000 + SAFECKPT_VERSION_MINOR * 100 + SAFECKPT_VERSION_PATCH);
  std::printf("version=%s\n", SAFECKPT_VERSION_STRING);
  std::printf("allowlist_numpy=%d\n", std::filesystem::exists(std::string(ALLOWLIST_DIR) + "/numpy.allow") ? 1 : 0);
  auto ckpt = safeckpt::load(argv[1]);
  if (ckpt)
    std::printf("tensors=%zu\n", ckpt->state_dict().size());
  else
    std::printf("refused=%s\n", std::string(safeckpt::error_code_name(ckpt.error().code())).c_str());
  safeckpt::scan::FileReport r = safeckpt::scan::scan_file(argv[1]);
  std::printf("verdict=%s\n", std::string(safeckpt::scan::verdict_name(r.verdict)).c_str());
  std::printf("findings=%zu\n", r.findings.size());
  return 0;
}
