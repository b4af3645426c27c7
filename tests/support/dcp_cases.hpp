// The PyTorch 2.11 DCP directories of tests/data/dcp-2.11 (gen_dcp.py, README there), for the
// dcp tests.
#pragma once

#include <filesystem>
#include <string>

namespace dcp_test {

inline constexpr const char* kCases[] = {"placements-ws2", "placements-ws3", "placements-ws4",
                                         "uneven-ws4",     "mesh2d-ws4",     "fsdp2-adamw-ws2"};

inline std::filesystem::path case_dir(const std::string& name) {
  return std::filesystem::path(SAFECKPT_TEST_DATA) / "dcp-2.11" / name;
}

}  // namespace dcp_test
