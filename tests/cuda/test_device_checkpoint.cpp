// Device loading proof (issue 5): every corpus checkpoint loaded to the GPU
// gives, storage by storage, the same bytes as the host load; DLPack views
// point into the arena. Skips where there is no CUDA device.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cuda/cuda_test_support.hpp"
#include "safeckpt/device_checkpoint.hpp"
#include "safeckpt/safetensors.hpp"

namespace fs = std::filesystem;

using safeckpt::cuda_test::data_dir;
using safeckpt::cuda_test::have_device;

TEST_CASE("device checkpoint: corpus storages on the GPU equal the host load") {
  if (!have_device()) return;
  int files = 0;
  const fs::path data = data_dir();
  for (const char* which : {"torch-2.11", "torch-1.13"}) {
    for (const auto& e : fs::directory_iterator(data / "corpus" / which)) {
      if (e.path().extension() != ".pt") continue;
      auto host = safeckpt::load(e.path());
      if (!host) continue;  // refused files are the host tests' business
      auto dev = safeckpt::cuda::load_to_device(e.path());
      REQUIRE_MESSAGE(dev.has_value(), e.path().string() << ": " << (dev ? "" : dev.error().to_string()));
      ++files;
      const auto& ss = host->storages();
      REQUIRE(dev->arena().storage_count() == ss.size());
      for (std::size_t i = 0; i < ss.size(); ++i) {
        std::vector<std::uint8_t> back(ss[i].nbytes);
        auto st = dev->arena().copy_to_host(i, back);
        REQUIRE(st.has_value());
        CHECK_MESSAGE(std::equal(back.begin(), back.end(), ss[i].bytes.begin()),
                      e.path().filename().string() << " storage " << i << " differs on the device");
      }
      for (const auto& t : dev->tensors()) {
        if (t.nbytes == 0) continue;
        const auto& info = dev->checkpoint().tensors()[t.tensor];
        auto* expect = static_cast<std::uint8_t*>(dev->storage_data(info.storage)) +
                       static_cast<std::uint64_t>(info.storage_offset) * safeckpt::dtype_size(info.dtype);
        CHECK(t.data == expect);
        auto dl = dev->to_dlpack(t.tensor);
        if (!dl) continue;  // dtypes without a DLPack code (quantized) are reported, not exported
        CHECK((*dl)->dl_tensor.data == t.data);
        CHECK(((*dl)->flags & DLPACK_FLAG_BITMASK_READ_ONLY) != 0);
        (*dl)->deleter(*dl);
      }
    }
  }
  CHECK(files >= 30);
}

TEST_CASE("device checkpoint: safetensors files land on the GPU byte for byte") {
  if (!have_device()) return;
  const fs::path data = data_dir();
  int files = 0;
  for (const auto& e : fs::directory_iterator(data / "safetensors-ref")) {
    if (e.path().extension() != ".safetensors") continue;
    auto host = safeckpt::load_safetensors(e.path());
    if (!host) continue;
    auto dev = safeckpt::cuda::load_to_device(e.path());
    REQUIRE_MESSAGE(dev.has_value(), e.path().string() << ": " << (dev ? "" : dev.error().to_string()));
    ++files;
    for (std::size_t i = 0; i < host->storages().size(); ++i) {
      const auto& s = host->storages()[i];
      std::vector<std::uint8_t> back(s.nbytes);
      REQUIRE(dev->arena().copy_to_host(i, back).has_value());
      CHECK(std::equal(back.begin(), back.end(), s.bytes.begin()));
    }
  }
  CHECK(files >= 3);
}

TEST_CASE("device checkpoint: map_location and a caller's engine must agree") {
  if (!have_device()) return;
  const fs::path data = data_dir();
  const fs::path file = data / "corpus" / "torch-2.11" / "mlp_state_dict.pt";
  auto engine = safeckpt::cuda::TransferEngine::create({});  // device 0
  REQUIRE(engine.has_value());
  safeckpt::cuda::DeviceLoadOptions o;
  o.map_location = "cuda:1";  // another device than the engine's: refused before any work
  auto bad = safeckpt::cuda::load_to_device(file, o, &*engine);
  REQUIRE_FALSE(bad.has_value());
  CHECK(bad.error().code() == safeckpt::ErrorCode::kInvalidArgument);
  CHECK(bad.error().message().find("engine was created for device 0") != std::string::npos);
  // "cuda" is the current device (0 here), as in torch.
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  o.map_location = "cuda";
  auto ok = safeckpt::cuda::load_to_device(file, o, &*engine);
  REQUIRE_MESSAGE(ok.has_value(), (ok ? "" : ok.error().to_string()));
  CHECK(ok->arena().device() == 0);
}
