// tests/cuda/cuda_test_support.hpp — helpers of the GPU test files (the
// safeckpt_cuda_tests binary): the skip check, the test data folder, and a
// scratch directory removed at scope exit.
#pragma once

#include <cuda_runtime_api.h>
#include <doctest/doctest.h>
#include <stdlib.h>  // mkdtemp

#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace safeckpt::cuda_test {

// True when a CUDA device is there; else prints the skip line every GPU
// test case shows without one.
inline bool have_device() {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return true;
  MESSAGE("SKIP: no CUDA device");
  return false;
}

// tests/data; the GPU machine runs binaries built elsewhere, so
// SAFECKPT_TEST_DATA_DIR may point at its copy.
inline std::filesystem::path data_dir() {
  const char* env = std::getenv("SAFECKPT_TEST_DATA_DIR");
  return env ? std::filesystem::path(env) : std::filesystem::path(SAFECKPT_TEST_DATA);
}

// A new directory `<parent>/<prefix>-XXXXXX` (mkdtemp), removed with
// everything in it at scope exit. Tests that need O_DIRECT pass the working
// directory's file system as `parent` (/tmp is often tmpfs, which refuses it).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& prefix,
                      const std::filesystem::path& parent = std::filesystem::temp_directory_path()) {
    std::string t = (parent / (prefix + "-XXXXXX")).string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  std::filesystem::path path;
};

}  // namespace safeckpt::cuda_test
